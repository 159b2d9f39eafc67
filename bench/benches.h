/* The benchmarks of `longtune bench <name>`, one line each: LT_BENCH(name, handler, summary).
 * Each handler lives in bench/bench_<name>.c and takes argv with argv[0] = the bench name. */
LT_BENCH(sgemm, lt_bench_sgemm, "OpenBLAS sgemm rate of this machine (the CPU ceiling)")
LT_BENCH(pack, lt_bench_pack, "sequence packing: plan 1M sequences (first-fit, bfd, unpacked) and batch fill rate")
