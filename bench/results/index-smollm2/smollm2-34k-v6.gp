# index-bench plot: mean over heads of recall vs % of indexed keys scanned.
set terminal pngcairo size 1800,560 font ',10' noenhanced
set output 'smollm2-34k-v6.png'
set multiplot layout 1,3 title 'smollm2-34k-v6 (mean over 9 heads)'
set logscale x
set xlabel '% of indexed keys scanned'
set ylabel 'recall'
set yrange [0:1.02]
set grid
set key bottom right
set title 'Q->K recall@100'
plot 'smollm2-34k-v6-q2k_at100.dat' index 0 using 2:3 with linespoints title 'ivf', 'smollm2-34k-v6-q2k_at100.dat' index 1 using 2:3 with linespoints title 'roar', 'smollm2-34k-v6-q2k_at100.dat' index 2 using 2:3 with linespoints title 'roar-ins'
set title 'Q->K recall@2000'
plot 'smollm2-34k-v6-q2k_at2000.dat' index 0 using 2:3 with linespoints title 'ivf', 'smollm2-34k-v6-q2k_at2000.dat' index 1 using 2:3 with linespoints title 'roar', 'smollm2-34k-v6-q2k_at2000.dat' index 2 using 2:3 with linespoints title 'roar-ins'
set title 'K->K recall@100 (keys as queries)'
plot 'smollm2-34k-v6-k2k_at100.dat' index 0 using 2:3 with linespoints title 'ivf', 'smollm2-34k-v6-k2k_at100.dat' index 1 using 2:3 with linespoints title 'roar', 'smollm2-34k-v6-k2k_at100.dat' index 2 using 2:3 with linespoints title 'roar-ins'
unset multiplot
