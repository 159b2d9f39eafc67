/* The benchmarks of `longtune bench <name>`, one line each: LT_BENCH(name, handler, summary).
 * Each handler lives in bench/bench_<name>.c and takes argv with argv[0] = the bench name. */
LT_BENCH(sgemm, lt_bench_sgemm, "OpenBLAS sgemm rate of this machine (the CPU ceiling)")
LT_BENCH(pack, lt_bench_pack, "sequence packing: plan 1M sequences (first-fit, bfd, unpacked) and batch fill rate")
LT_BENCH(tokenizer, lt_bench_tokenizer, "tokenizer encoding MB/s on one thread vs HF tokenizers on the same text")
LT_BENCH(attention, lt_bench_attention, "naive vs flash attention fwd/bwd (CPU): time, extra memory, packed rows")
LT_BENCH(lce, lt_bench_lce, "linear cross-entropy: naive / chunked / fused, time, memory, vs sgemm")
LT_BENCH(train, lt_bench_train,
         "LoRA training steps (SmolLM2-135M / Qwen3-8B shapes, cpu|cuda): tokens/s, peak vs plan, MFU, vs torch+PEFT")
LT_BENCH(context, lt_bench_context,
         "longest trainable context: planner, allocation and real steps under the guard, vs torch+PEFT")
LT_BENCH(packed, lt_bench_packed,
         "real tokens/s on Alpaca-shaped data: packed rows vs unpacked batch 1 vs padded batch 8")
LT_BENCH(suite, lt_bench_suite,
         "the community benchmark: longtune bench --tier quick|full|smoke (machine, plan, estimate, one JSON)")
LT_BENCH(matmul, lt_bench_matmul,
         "weight matmul (any W dtype) at 8B layer shapes vs the GEMM ceiling (cuBLASLt bf16 / sgemm)")
LT_BENCH(scaling, lt_bench_scaling,
         "data-parallel training tokens/s at world 1 and under mpirun -np K (one host: the DP overhead)")
LT_BENCH(generate, lt_bench_generate,
         "KV-cache prefill and decode tokens/s (CPU) vs llama-bench pp/tg on the same GGUF and threads")
LT_BENCH(moe, lt_bench_moe,
         "mixture-of-experts LoRA steps (Qwen3-30B-A3B shape, 4 layers): chunked vs unchunked dispatch, vs torch+PEFT")
LT_BENCH(grouped, lt_bench_grouped,
         "MoE grouped expert products (Qwen3-30B-A3B layer, cuda): one launch vs per-expert cuBLASLt bf16 GEMMs")
LT_BENCH(grouped_lora, lt_bench_grouped_lora,
         "expert-LoRA products of an MoE layer (Qwen3-30B-A3B, rank r, cuda): thin grouped products, weight gradients")
LT_BENCH(lora, lt_bench_lora,
         "LoRA projection ops of one layer (q,k,v; gate,up; o; down) with and without adapters: what LoRA adds")
