/* The CUDA arms of `longtune bench attention|lce --backend cuda` (bench/bench_*_cuda.c): the
 * library's CUDA entry points timed on the 8B-class shapes, with the PyTorch peers of bench/peers/
 * run in the same invocation (when python3 with PyTorch is there) and reported as ratios. */
#ifndef LT_BENCH_CUDA_H
#define LT_BENCH_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "bench.h"
#include "longtune/status.h"

/* The choices the CUDA attention arm forces on every arm (src/backend/cuda/attention/tuning.h):
 * kernels and the dQ route by their short names ("default": the heuristics), the backward's keys
 * per CTA (0 or 128) and the CTAs sharing a kv head's query heads (0: the heuristic's). */
typedef struct lt_bench_attn_force {
    const char *fwd, *bwd, *dq;
    int bwd_bn, split;
} lt_bench_attn_force;

/* Ts: sequence lengths of the causal arms (B=1, H=32, Hkv=8, D=128); packed_offs/packed_S: one
 * packed row of length packed_T (NULL skips it); force: the forced choices.
 * Returns 0, or 1 when an arm failed, 2 when a name is unknown. */
int lt_bench_attention_cuda(const lt_bench_common *c, const int64_t *Ts, int nT, int64_t packed_T,
                            const int32_t *packed_offs, int64_t packed_S, int peers, const lt_bench_attn_force *force);

/* Loss layer at N tokens, V vocabulary, C width, bf16, forward + grad of h; tile_n/tile_v: the
 * options' tiles (0 = the library's). */
/* arm_mask: bit 2 the two calls (chunked), bit 8 the one call (fused-fb: bf16 and fp32 logit tiles, graph). */
int lt_bench_lce_cuda(const lt_bench_common *c, int64_t N, int64_t V, int64_t C, int peers, int tile_n, int tile_v,
                      int arm_mask);

/* Runs `python3 <script> <args>` from the source tree and returns its stdout JSON lines as an
 * array (empty when python3 or PyTorch is missing). */
cJSON *lt_bench_run_peers(const char *script, const char *args);

#if LT_HAVE_CUDA
/* A fresh device buffer (accounted as `what`) of n bf16 values amp·(2u − 1), u uniform in [0, 1)
 * from the xorshift64 state *s (advanced); NULL with the context's error when allocation fails.
 * Timing inputs only: the distribution keeps scores and logits in range, nothing checks values. */
void *lt_bench_cuda_uniform_bf16(lt_ctx *ctx, size_t n, float amp, uint64_t *s, const char *what);

/* The same values written into n bf16 elements at dev, which the caller owns: the first
 * min(n, period) are drawn and repeated to fill the rest (a bounded host buffer for operands of
 * GBs). 0 when host memory or the copy fails. */
int lt_bench_cuda_fill_uniform_bf16(void *dev, size_t n, size_t period, float amp, uint64_t *s);
#endif

#endif
