/* The CPU backend's compute ops (src/backend/cpu/ops_*.c), gathered into lt_backend_cpu's table in
 * cpu_backend.c. Semantics are documented once, on the table in backend/backend.h; these are the
 * CPU implementations and nothing else calls them directly. */
#ifndef LT_BACKEND_CPU_OPS_H
#define LT_BACKEND_CPU_OPS_H

#include "backend/backend.h"

/* Hot loops of a portable build (LT_NATIVE=OFF: plain x86-64, SSE2) get AVX-512 and AVX2+FMA
 * clones, picked once at load time by the CPU (GCC target_clones through an ifunc), so one binary
 * runs on any x86-64 and still vectorises wide where it can. A -march=native build (AVX2 or more
 * known at compile time) and other compilers or targets compile the loops once, as written. Each
 * clone is deterministic on its own; machines that pick different clones may round differently. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__) && defined(__ELF__)
#define LT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LT_CPU_CLONES
#endif

void lt_cpu_gemm(lt_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void lt_cpu_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                   float *y, void *ws);
size_t lt_cpu_matmul_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads);
size_t lt_cpu_lora_workspace_bytes(int G, int64_t r, int64_t in, int64_t out_max, int threads);
void lt_cpu_lora_fwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                     float beta, void *ws);
void lt_cpu_lora_bwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                     float *dx, float beta, float *dlu, void *ws);
void lt_cpu_rmsnorm_fwd(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y,
                        float *rstd);
void lt_cpu_rmsnorm_bwd(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                        int64_t C, float *dx, float *dw);
void lt_cpu_rope(lt_ctx *ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D,
                 int inverse);
void lt_cpu_swiglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a);
void lt_cpu_swiglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du);
void lt_cpu_geglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a);
void lt_cpu_geglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du);
void lt_cpu_embedding(lt_ctx *ctx, const lt_tensor *table, const int32_t *ids, int64_t N, float *out);
void lt_cpu_add(lt_ctx *ctx, float *y, const float *x, float alpha, int64_t n);
void lt_cpu_add_bias(lt_ctx *ctx, float *y, const float *b, int64_t N, int64_t C);
void lt_cpu_dropout(lt_ctx *ctx, const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset);
void lt_cpu_adamw(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, const lt_adamw_params *hp);
void lt_cpu_zero(lt_ctx *ctx, void *p, size_t bytes);
void lt_cpu_scale(lt_ctx *ctx, float *x, float a, int64_t n);
float lt_cpu_sumsq(lt_ctx *ctx, const float *x, int64_t n);
void lt_cpu_to_bf16(lt_ctx *ctx, const float *x, uint16_t *y, int64_t n);
/* lt_cpu_to_bf16 on the calling thread (inside a parallel region). */
void lt_cpu_to_bf16_serial(const float *x, uint16_t *y, int64_t n);
void lt_cpu_from_bf16(lt_ctx *ctx, const uint16_t *x, float *y, int64_t n);
void lt_cpu_moe_route(lt_ctx *ctx, const float *logits, int64_t n, int64_t E, int64_t k, int norm_topk, int32_t *idx,
                      float *w, float *stats);
void lt_cpu_moe_route_bwd(lt_ctx *ctx, const float *logits, const int32_t *idx, const float *dw, int64_t n, int64_t E,
                          int64_t k, int norm_topk, const float *stats, const float *scale, float *dlogits);
void lt_cpu_moe_sort(lt_ctx *ctx, const int32_t *idx, int64_t n, int64_t k, int64_t E, int32_t *off, int32_t *rows,
                     int32_t *slot);
void lt_cpu_moe_gather(lt_ctx *ctx, const float *x, const int32_t *rows, int64_t nk, int64_t k, int64_t C, float *xg);
void lt_cpu_moe_gather_bwd(lt_ctx *ctx, const float *dxg, const int32_t *slot, int64_t n, int64_t k, int64_t C,
                           float beta, float *dx);
void lt_cpu_moe_combine(lt_ctx *ctx, const float *yg, const float *w, const int32_t *slot, int64_t n, int64_t k,
                        int64_t C, float beta, float *y);
void lt_cpu_moe_combine_bwd(lt_ctx *ctx, const float *dy, const float *yg, const float *w, const int32_t *slot,
                            int64_t n, int64_t k, int64_t C, float *dyg, float *dw);
void lt_cpu_grouped_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, int64_t E, const int32_t *off,
                           const float *x, int64_t nk, float beta, float *y, void *ws);
size_t lt_cpu_grouped_matmul_workspace_bytes(lt_dtype wdtype, int64_t E, int64_t out, int64_t in, int64_t nk_max,
                                             int threads);
void lt_cpu_grouped_matmul_wgrad(lt_ctx *ctx, int64_t E, const int32_t *off, const float *dy, int64_t out,
                                 const float *x, int64_t in, int64_t nk, float beta, float *dw);

/* The few-row NT path of lt_cpu_matmul (ops_matvec.c): 1 when it served the call (non-f32 W,
 * N <= LT_MATVEC_MAX_N), 0 to fall through to the tiled path. ws: the matmul workspace. */
int lt_cpu_matvec(lt_ctx *ctx, const lt_tensor *w, const float *x, int64_t N, float beta, float *y, void *ws);
size_t lt_cpu_decode_attention_workspace_bytes(const lt_decode_attention_params *p, int threads);
lt_status lt_cpu_decode_attention(lt_ctx *ctx, const lt_decode_attention_params *p);

#endif
