/* Shared pieces of the CPU attention kernels (attention_naive.c, attention_flash.c): the tile
 * sizes, row loads and stores that convert bf16, the visible key
 * range of a query under the causal / window / packed masks, and a dynamic work scheduler over
 * lt_parallel_for. Private to src/backend/cpu; nothing here validates its inputs. */
#ifndef LT_CPU_ATTENTION_CPU_H
#define LT_CPU_ATTENTION_CPU_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <string.h>

#include "backend/attention_impl.h"
#include "core/fastmath.h"

/* Tile sizes (queries x keys). 64 x 64: a tile's S, dP and the f32 Q/K/V/dO copies of D <= 128
 * stay in L2, the tile GEMMs are large enough for OpenBLAS, and a packed row of ~84-token
 * sequences wastes little masked work (tiles cut at a sequence start are partial, and their waste
 * grows with the tile). Also tried on the shared 2-core VM: 64x128, 128x64, 128x128, 32x128; the
 * machine's load swung timings 2-3x between rounds, so only one ranking held: 128x128 was slowest
 * on the packed row in every round. */
#define LT_ATTN_BR 64
#define LT_ATTN_BC 64

/* Per-thread workspace slots start on 64-byte boundaries (16 floats). */
#define LT_ATTN_ALIGN_FLOATS 16
static inline size_t lt_attn_round(size_t floats) {
    return (floats + LT_ATTN_ALIGN_FLOATS - 1) / LT_ATTN_ALIGN_FLOATS * LT_ATTN_ALIGN_FLOATS;
}

/* Max and sum of x[0..n) for the softmax rows. GCC turns `omp simd reduction` over a 64-wide row
 * into a vector loop followed by 16 dependent scalar steps through the stack, which cost as much as
 * the loop; with AVX-512 these are 16-lane accumulators folded by shuffles. The sum's order is fixed
 * by n alone for a given build (deterministic); the max is exact in any order. */
#if defined(__AVX512F__)
static inline float lt_attn_max(const float *x, int64_t n) {
    __m512 acc = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_loadu_ps(x + i));
    if (i < n)
        acc = _mm512_mask_max_ps(acc, (__mmask16)((1u << (n - i)) - 1u), acc,
                                 _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1u), x + i));
    return _mm512_reduce_max_ps(acc);
}

static inline float lt_attn_sum(const float *x, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + i));
    if (i < n) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1u), x + i));
    return _mm512_reduce_add_ps(acc);
}
#else
/* Without AVX-512 at compile time (a portable build, whose AVX-512 / AVX2 clones of the callers
 * vectorise these): 16 lane accumulators folded by halving, the same shape as the AVX-512 code. */
static inline float lt_attn_max(const float *x, int64_t n) {
    float acc[16];
    for (int l = 0; l < 16; l++) acc[l] = -INFINITY;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
    for (int l = 0; i < n; i++, l++) acc[l] = x[i] > acc[l] ? x[i] : acc[l];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
    return acc[0];
}

static inline float lt_attn_sum(const float *x, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += x[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}
#endif

static inline float lt_attn_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element offset of (b, t, head) in a layout. */
static inline int64_t lt_attn_off(const lt_attention_layout *l, int64_t b, int64_t t, int64_t h) {
    return b * l->batch + t * l->token + h * l->head;
}

/* rows x D elements of dtype dt at src (row stride ld elements) into dst (f32, row stride D). */
void lt_attn_load(float *dst, const void *src, lt_dtype dt, int64_t ld, int64_t rows, int64_t D);
/* rows x D floats of src (row stride D) times mul into dst (dtype dt, row stride ld); bf16 rounds
 * to nearest even. */
void lt_attn_store(void *dst, lt_dtype dt, int64_t ld, const float *src, int64_t rows, int64_t D, float mul);
/* Pointer to element `off` of a dtype dt array. */
static inline const void *lt_attn_at(const void *base, lt_dtype dt, int64_t off) {
    return (const char *)base + off * (dt == LT_DTYPE_F32 ? 4 : 2);
}

/* Packed sequence boundaries: the sequence of row b holding token x spans [*start, *end). One
 * sequence per row (no offsets) is [0, T). Binary search over the row's S+1 offsets; empty
 * sequences (repeated offsets) are stepped over. */
void lt_attn_seq(const lt_attention_params *p, int64_t b, int64_t x, int64_t *start, int64_t *end);

/* First key query q sees inside its sequence starting at seq_start (it sees keys lo..q). */
static inline int64_t lt_attn_lo(int64_t q, int64_t seq_start, int64_t window) {
    int64_t lo = q - window + 1;
    return window > 0 && lo > seq_start ? lo : seq_start;
}

/* Runs item(ctx, i, slot) for i in [0, n) on up to `slots` threads; each thread takes the next
 * item from a shared counter (so uneven causal tiles balance) and passes its slot index < slots.
 * Every item writes outputs no other item writes, so results do not depend on the schedule. */
typedef void (*lt_attn_item_fn)(void *ctx, int64_t i, int slot);
void lt_attn_schedule(int slots, int64_t n, lt_attn_item_fn item, void *ctx);

/* Threads the kernels run with for `threads` requested (0 = default), capped by the work items. */
int lt_attn_slots(int threads, int64_t items);

/* The two CPU implementations; the workspace functions give exactly what the kernels carve up. */
size_t lt_attention_naive_workspace_bytes(const lt_attention_params *p, int backward, int threads);
lt_status lt_attention_naive_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
lt_status lt_attention_naive_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
size_t lt_attention_flash_workspace_bytes(const lt_attention_params *p, int backward, int threads);
lt_status lt_attention_flash_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
lt_status lt_attention_flash_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);

#endif
