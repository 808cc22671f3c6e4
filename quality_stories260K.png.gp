set terminal pngcairo size 1400,1000 font 'Sans,11'
set output 'quality_stories260K.png'
names = "lazy+"
set multiplot layout 2,2 title "KV eviction quality vs FullKV: stories260K, 16 sampled 512-token texts, W=32, alpha=0.03"
set grid
set key bottom right
set xlabel 'peak KV held (% of FullKV)'
set ylabel 'top-1 agreement with FullKV (%)'
plot for [i=0:0] 'quality_stories260K.png.dat' index i using 6:2 with linespoints lw 2 title word(names, i+1)
set logscale y
set key top right
set ylabel 'mean KL(full || evicted) (nats; FullKV = 0 not drawn)'
plot for [i=0:0] 'quality_stories260K.png.dat' index i using 6:3 with linespoints lw 2 title word(names, i+1)
unset logscale y
set key top left
set ylabel 'greedy tokens until first divergence'
plot for [i=0:0] 'quality_stories260K.png.dat' index i using 6:4 with linespoints lw 2 title word(names, i+1)
set key bottom right
set ylabel 'recall probe: p(evicted) / p(full)'
plot for [i=0:0] 'quality_stories260K.png.dat' index i using 6:5 with linespoints lw 2 title word(names, i+1)
unset multiplot
