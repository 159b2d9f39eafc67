/* The benchmarks of `longtune bench <name>`, one line each: LT_BENCH(name, handler, summary).
 * Each handler lives in bench/bench_<name>.c and takes argv with argv[0] = the bench name. */
LT_BENCH(sgemm, lt_bench_sgemm, "OpenBLAS sgemm rate of this machine (the CPU ceiling)")
LT_BENCH(pack, lt_bench_pack, "sequence packing: plan 1M sequences (first-fit, bfd, unpacked) and batch fill rate")
LT_BENCH(tokenizer, lt_bench_tokenizer, "tokenizer encoding MB/s on one thread vs HF tokenizers on the same text")
LT_BENCH(attention, lt_bench_attention, "naive vs flash attention fwd/bwd (CPU): time, extra memory, packed rows")
LT_BENCH(lce, lt_bench_lce, "linear cross-entropy: naive / chunked / fused, time, memory, vs sgemm")
LT_BENCH(train, lt_bench_train, "SmolLM2-135M LoRA steps at T=512/2048: tokens/s, peak bytes, MFU vs sgemm, vs torch+PEFT")
LT_BENCH(matmul, lt_bench_matmul, "weight matmul (any W dtype) at 8B layer shapes vs the GEMM ceiling (cuBLASLt bf16 / sgemm)")
