/* The CUDA half of `longtune bench scaling` (bench_scaling_cuda.c), entered from bench_scaling.c
 * when --backend cuda is given; the CPU half stays in bench_scaling.c. */
#ifndef LT_BENCH_SCALING_H
#define LT_BENCH_SCALING_H

/* Same arguments as `longtune bench scaling`; returns the exit status. */
int lt_bench_scaling_cuda(int argc, char **argv);

#endif
