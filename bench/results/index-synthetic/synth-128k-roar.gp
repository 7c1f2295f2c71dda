# index-bench plot: mean over heads of recall vs % of indexed keys scanned.
set terminal pngcairo size 1800,560 font ',10' noenhanced
set output 'bench/results/index-synthetic/synth-128k-roar.png'
set multiplot layout 1,3 title 'synth-128k-roar (mean over 1 heads)'
set logscale x
set xlabel '% of indexed keys scanned'
set ylabel 'recall'
set yrange [0:1.02]
set grid
set key bottom right
set title 'Q->K recall@100'
plot 'bench/results/index-synthetic/synth-128k-roar-q2k_at100.dat' index 0 using 2:3 with linespoints title 'roar'
set title 'Q->K recall@2000'
plot 'bench/results/index-synthetic/synth-128k-roar-q2k_at2000.dat' index 0 using 2:3 with linespoints title 'roar'
set title 'K->K recall@100 (keys as queries)'
plot 'bench/results/index-synthetic/synth-128k-roar-k2k_at100.dat' index 0 using 2:3 with linespoints title 'roar'
unset multiplot
