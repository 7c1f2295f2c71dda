set terminal pngcairo size 720,480
set output 'bench/results/accuracy-h200/main/heatmap_roar.png'
set title 'roar: exact match %, counted needle tasks (> 8192 tokens: extrapolation)'
set xlabel 'context length (tokens)'
set ylabel 'needle depth'
set cbrange [0:100]
set palette defined (0 '#b2182b', 50 '#fee08b', 100 '#1a9850')
set xtics ("1024" 0, "2048" 1, "4096" 2, "8192" 3)
set ytics ("0.25" 0, "0.50" 1, "0.75" 2)
set xrange [-0.5:3.5]
set yrange [-0.5:2.5]
unset key
plot 'bench/results/accuracy-h200/main/heatmap_roar.dat' matrix using 1:2:($1-0.5):($1+0.5):($2-0.5):($2+0.5):3 with boxxy fc palette fs solid 1.0 noborder, '' matrix using 1:2:($3 == $3 ? sprintf('%.0f', $3) : '-') with labels
