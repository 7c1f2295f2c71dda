# index-bench plot: mean over heads of recall vs % of indexed keys scanned.
set terminal pngcairo size 1800,560 font ',10' noenhanced
set output '/tmp/smollm2-8k-v3.png'
set multiplot layout 1,3 title 'smollm2-8k-v3 (mean over 27 heads)'
set logscale x
set xlabel '% of indexed keys scanned'
set ylabel 'recall'
set yrange [0:1.02]
set grid
set key bottom right
set title 'Q->K recall@100'
plot '/tmp/smollm2-8k-v3-q2k_at100.dat' index 0 using 2:3 with linespoints title 'ivf', '/tmp/smollm2-8k-v3-q2k_at100.dat' index 1 using 2:3 with linespoints title 'kgraph', '/tmp/smollm2-8k-v3-q2k_at100.dat' index 2 using 2:3 with linespoints title 'roar', '/tmp/smollm2-8k-v3-q2k_at100.dat' index 3 using 2:3 with linespoints title 'roar-kv', '/tmp/smollm2-8k-v3-q2k_at100.dat' index 4 using 2:3 with linespoints title 'roar-ins'
set title 'Q->K recall@2000'
plot '/tmp/smollm2-8k-v3-q2k_at2000.dat' index 0 using 2:3 with linespoints title 'ivf', '/tmp/smollm2-8k-v3-q2k_at2000.dat' index 1 using 2:3 with linespoints title 'kgraph', '/tmp/smollm2-8k-v3-q2k_at2000.dat' index 2 using 2:3 with linespoints title 'roar', '/tmp/smollm2-8k-v3-q2k_at2000.dat' index 3 using 2:3 with linespoints title 'roar-kv', '/tmp/smollm2-8k-v3-q2k_at2000.dat' index 4 using 2:3 with linespoints title 'roar-ins'
set title 'K->K recall@100 (keys as queries)'
plot '/tmp/smollm2-8k-v3-k2k_at100.dat' index 0 using 2:3 with linespoints title 'ivf', '/tmp/smollm2-8k-v3-k2k_at100.dat' index 1 using 2:3 with linespoints title 'kgraph', '/tmp/smollm2-8k-v3-k2k_at100.dat' index 2 using 2:3 with linespoints title 'roar', '/tmp/smollm2-8k-v3-k2k_at100.dat' index 3 using 2:3 with linespoints title 'roar-kv', '/tmp/smollm2-8k-v3-k2k_at100.dat' index 4 using 2:3 with linespoints title 'roar-ins'
unset multiplot
