# Decode ms/token by attention mode and context length (H200 host); data: decode-by-mode.dat
# (written by extract.py from the run files its README names). Run: gnuplot decode-by-mode.gp
set terminal pngcairo size 900,560 font "sans,11"
set output "decode-by-mode.png"
set title "Decode time per token by attention mode (1x H200 + 2 kv-stores on its 16 cores)"
set xlabel "context (tokens)"
set ylabel "ms / token (median step)"
set logscale xy
set xrange [5000:1600000]
set yrange [2:700]
set xtics ("8K" 8192, "32K" 32768, "128K" 131072, "1M" 1048576)
set ytics ("5" 5, "10" 10, "20" 20, "50" 50, "100" 100, "200" 200, "500" 500)
set grid xtics ytics
set key bottom right box opaque font "sans,9"
plot "decode-by-mode.dat" index 0 using 1:2 with linespoints lw 2 pt 7 ps 1.3 title "full, all KV on the GPU (Llama-3-8B geometry, 32 layers)", \
     "" index 1 using 1:2 with points pt 5 ps 1.8 title "flat, exact top-100 at the stores (same model)", \
     "" index 2 using 1:2 with points pt 9 ps 2.0 title "ivf, nprobe 48 (same model)", \
     "" index 3 using 1:2 with points pt 13 ps 2.0 title "roar, ef 400 (same model)", \
     "" index 4 using 1:2 with linespoints lw 2 dt 2 pt 11 ps 1.8 lc rgb "#8b4513" title "roar, Yi-6B geometry, first 8 layers, generated KV", \
     "" using 1:2:(sprintf("%.1f", $2)) with labels offset 3.2,0.6 notitle
