/* Flash attention on the CPU: tiles of LT_ATTN_BR query tokens x LT_ATTN_BC keys, QK^T and PV as
 * small in-cache GEMMs (tile_gemm.h), online softmax, saved per-row log-sum-exp, and a backward
 * that recomputes each tile once (one pass over key tiles giving dK, dV and dQ; dQ is summed in a fixed
 * number of buckets so the result does not depend on the thread count). The query heads that share
 * a kv head are stacked into one tile (rows ordered token-major, head-minor), so each K/V tile is
 * multiplied once per group, not once per head. Tiles are cut at packed-sequence boundaries and
 * only the keys inside the causal / window band of the tile's own sequence are visited, so a
 * packed row costs sum(len^2), not T^2. No (T, T) buffer exists. */
/* The clamps and selects of the branch-free exp (lt_fast_exp) and of the masks become vector
 * selects only when GCC may assume no floating-point traps: with its default -ftrapping-math each
 * stays a branch and these loops run one lane at a time. No arithmetic is reordered or contracted,
 * so the results are the same, lane by lane, as the scalar code. Before every include, so inlined
 * helpers carry the same options. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <math.h>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/tile_gemm.h"
#include "core/parallel.h"

#define BR LT_ATTN_BR
/* Tile shapes beyond attention_cpu.h's: the forward's query tiles hold FBR tokens (G·FBR stacked
 * rows) against key blocks of FBC keys; the backward's query tiles hold BBR tokens against key tiles
 * of BC. Measured on one core at G = 3, T = 2048 (interleaved, loaded VM): FBR 16 / 32 / 64 equal
 * (32 keeps the S and O tiles of larger groups in L2); BBR 128 or 256 ~30% slower than 64 in the
 * backward. On the 2-core Xeon VM with the AVX-512 softmax rows (`bench attention`, G = 4, 2
 * threads, three alternated runs each):
 *   - FBC: the forward took 14.3-14.6 ms at T = 2048 with 128 keys, 15.2-15.5 with 64 and 15.4-16.0
 *     with 256, and 1.04-1.06 against 1.11-1.14 ms (64) at T = 512; at G = 3 (SmolLM2's heads,
 *     inside the training step) 128 and 64 were equal.
 *   - BBR 32: no faster than 64.
 *   - The backward's diagonal queries in pieces of 16 or 32 tokens against only the keys they see
 *     (5/8 of a 64 x 64 tile's products): within the noise at T = 2048 and on the packed row. */
#define FBR 32
#define FBC 128
#define BBR BR
#define BC LT_ATTN_BC

/* One thread's scratch. A tile holds G = H/Hkv query heads of t tokens (t <= FBR forward, BBR
 * backward): G·t rows, row x = i·G + g for token i of the tile and head g of the group (the order
 * of a (T, H, D) tensor, so the rows of one token are adjacent and share the mask). Stacking the
 * group makes the QK^T and PV products G times taller and the dK/dV products G times deeper: at
 * SmolLM2's heads (G = 3, T = 2048, one core) the backward took 131-134 ms against 149-154 ms for
 * one head per tile. Products with Kᵀ and Vᵀ read transposed copies (kt, vt here; all of Kᵀ in the
 * forward's shared workspace): OpenBLAS ran these 64-wide tiles as NN about 1.7x faster than as
 * NT (measured 156 against 86-92 GFLOP/s on one core), and tile_gemm reads B's rows in place. On
 * one core of the 2-core AMD EPYC (Zen 3) VM, tile_gemm ran the tile shapes at 60-75 GFLOP/s
 * against OpenBLAS 0.3.21's 45-70, and with the AVX2 softmax rows the forward at T = 2048 (H = 8,
 * Hkv = 2, 2 threads) took 46-53 ms against 91 ms, the backward 129-137 ms against 217 ms. */
typedef struct {
    float *q;          /* forward: the stacked queries (G·FBR, D), as f32 */
    uint16_t *qpk;     /* forward, packed path: those queries as bf16 rows of up32(D) */
    float *k, *v;      /* bf16 -> f32 tiles: backward K (BC, D); forward V (BC, D) */
    float *kt, *vt;    /* backward: Kᵀ, Vᵀ of the key tile, (D, BC) */
    float *s, *dp;     /* (G·FBR, FBC) / (G·BBR, BC): scores then P; dP then dS (backward) */
    float *acc, *acc2; /* forward: O (G·FBR, D); backward: dK, dV (BC, D) */
    float *m, *l;      /* forward: running max and sum per stacked row */
    /* Backward, not carved: the running item's kv head's stacked Q, dO (T·G, D), lse, D_i (T·G)
     * and its dQ bucket (T·G, D). */
    const float *qs, *dos, *lse, *dvec;
    float *dq;
    /* Backward: the bucket's stacked rows below this one are past (written, zeroed or skipped);
     * the rest are written as key tiles reach them, so the bucket is never cleared as a whole.
     * cov: the bucket's flag per token, 1 where its rows hold values; rows a key tile jumps over
     * (other sequences of a packed row, keys outside a window) are left unwritten and unread. */
    int64_t dq_hw;
    uint8_t *cov;
    void *pack; /* bf16 products: tile_gemm_bf16's scratch */
    /* Backward, packed path: Kᵀ, Vᵀ (B of S and dP) and K (B of dQ) of the key tile, bf16 panels;
     * the running item's kv head's packed Q and dO (head_block) */
    uint16_t *pkt, *pvt, *pk;
    const uint16_t *qa, *da, *qt, *dt;
} flash_slot;

static int64_t group_of(const lt_attention_params *p) { return p->H / p->Hkv; }

/* The packed path: bf16 products on a CPU that runs them on AMX tiles or AVX512-BF16 (tile_gemm.h's
 * paths other than the rounded one), each operand rounded and packed
 * once for all the products that read it. Forward: Kᵀ and V of each (row, kv head) once, the
 * stacked queries once per query tile, P per key block. Backward: Q and dO once per kv head in
 * flight, as rows (for S = Q·Kᵀ and dP = dO·Vᵀ) and transposed (for dVᵀ += dOᵀ·P and
 * dKᵀ += Qᵀ·dS, which read them at any row offset, where Pᵀ·dO and dSᵀ·Q would transpose P and dS
 * at every tile pair); Kᵀ, Vᵀ and K once per key tile; P and dS per tile pair. */
static int packed_tiles(const lt_attention_params *p) {
    return p->bf16_products && lt_cpu_tile_gemm_bf16_path() != LT_TILE_BF16_ROUNDED;
}

static int64_t up32(int64_t n) { return (n + 31) / 32 * 32; }

/* The packed rows of Q or dO: T·G rows and 32 more (a product reads whole 32-row blocks), up32(D)
 * columns; the transposed ones: up32(D) rows of up32(T·G) + 32 columns (a product at row offset
 * x0 reads up32(R) columns from there). In bf16 elements. */
static int64_t packed_rows_ld(const lt_attention_params *p) { return up32(p->D); }
static int64_t packed_cols_ld(const lt_attention_params *p) { return up32(p->T * (p->H / p->Hkv)) + 32; }
static size_t packed_rows_elems(const lt_attention_params *p) {
    return (size_t)(p->T * (p->H / p->Hkv) + 32) * (size_t)packed_rows_ld(p);
}
static size_t packed_cols_elems(const lt_attention_params *p) { return (size_t)up32(p->D) * (size_t)packed_cols_ld(p); }
static size_t packed_elems(const lt_attention_params *p) {
    return 2 * (packed_rows_elems(p) + packed_cols_elems(p)); /* Q and dO, each both ways */
}

/* Floats of tile_gemm_bf16 scratch for the largest product of one direction (0 without bf16
 * products): forward (R, FBC, D) and (R, D, FBC); backward (R, BC, D), (BC, D, R), (R, D, BC). */
static size_t pack_floats(const lt_attention_params *p, int backward, size_t R) {
    if (!p->bf16_products) return 0;
    const int64_t D = p->D, r = (int64_t)R, c = backward ? BC : FBC;
    size_t m = lt_cpu_tile_gemm_bf16_pack_bytes(r, c, D), t = lt_cpu_tile_gemm_bf16_pack_bytes(r, D, c);
    if (t > m) m = t;
    if (backward && (t = lt_cpu_tile_gemm_bf16_pack_bytes(c, D, r)) > m) m = t;
    return (m + sizeof(float) - 1) / sizeof(float);
}

/* Lays one slot out from `base` (or only counts when base is NULL); returns its size in floats.
 * The workspace size and the kernels both come from here, so they cannot disagree. */
static size_t flash_carve(const lt_attention_params *p, int backward, float *base, flash_slot *sl) {
    const size_t D = (size_t)p->D, conv = p->dtype != LT_DTYPE_F32, R = (size_t)group_of(p) * (backward ? BBR : FBR);
    const size_t fwd = (size_t)!backward, bwd = (size_t)backward;
    size_t off = 0;
#define TAKE(field, count)                                            \
    do {                                                              \
        size_t n_ = (count);                                          \
        if (sl) sl->field = n_ && base ? (void *)(base + off) : NULL; \
        off += lt_attn_round(n_);                                     \
    } while (0)
    TAKE(q, fwd * R * D);
    TAKE(k, conv * bwd * BC * D);
    TAKE(v, conv * fwd * FBC * D);
    TAKE(kt, bwd * D * BC);
    TAKE(vt, bwd * D * BC);
    TAKE(s, R * (backward ? BC : FBC));
    TAKE(dp, bwd * R * BC);
    TAKE(acc, (fwd ? R : BC) * D);
    TAKE(acc2, bwd * BC * D);
    TAKE(m, fwd * R);
    TAKE(l, fwd * R);
    TAKE(pack, pack_floats(p, backward, R));
    TAKE(qpk, packed_tiles(p) && fwd ? ((size_t)up32((int64_t)R) * (size_t)up32((int64_t)D) + 1) / 2 : 0);
    const size_t panels = packed_tiles(p) && backward ? (lt_cpu_bf16_pack_b_elems(BC, (int64_t)D) + 1) / 2 : 0;
    TAKE(pkt, panels);
    TAKE(pvt, panels);
    TAKE(pk, panels);
#undef TAKE
    return off;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Forward work items: (B, Hkv, query tiles). */
static int64_t flash_items(const lt_attention_params *p) { return p->B * p->Hkv * cdiv(p->T, FBR); }

/* The backward's key tiles of one kv head are dealt round-robin into dq_buckets(p) buckets; a
 * bucket is one work item (its tiles run in ascending order on one thread) with its own dQ
 * accumulator, and the buckets are summed in index order. So dQ is bit-identical for any thread
 * count (the count depends on T alone), at the cost of buckets·T·G·D floats of workspace per kv
 * head in flight. 4 balanced the causal tiles on 2-4 threads; on 16 threads SmolLM2's 3 kv heads
 * gave 12 items, so 4 threads idled and the heaviest bucket (key tile 0 sees every query) set the
 * pace: one bucket per key tile up to 8 spreads them (at T <= 256 there are fewer tiles than 8). */
#define DQ_BUCKETS_MIN 4
#define DQ_BUCKETS_MAX 8

static int64_t dq_buckets(const lt_attention_params *p) {
    const int64_t tiles = (p->T + BC - 1) / BC;
    return tiles < DQ_BUCKETS_MIN ? DQ_BUCKETS_MIN : tiles > DQ_BUCKETS_MAX ? DQ_BUCKETS_MAX : tiles;
}

/* Kv heads of one row whose backward runs at once (KV_BATCH·buckets items in one parallel
 * region, so more threads find work and there are fewer barriers); fixed, so the result does not
 * depend on it either. Each costs (2 + buckets)·T·G·D floats of workspace. */
#define KV_BATCH 4

static int64_t kv_batch(const lt_attention_params *p) { return p->Hkv < KV_BATCH ? p->Hkv : KV_BATCH; }

/* One kv head's stacked rows: (T·G) rows of D floats. */
static size_t stacked_floats(const lt_attention_params *p) { return (size_t)(p->T * group_of(p) * p->D); }
static size_t stacked_rows(const lt_attention_params *p) { return (size_t)(p->T * group_of(p)); }

/* Forward: Kᵀ of every (row, kv head), (B, Hkv, D, ld) with ld = T rounded up to 16 floats plus 16
 * more, so that the rows of a tile do not all fall into the same L1 sets when T is a power of two. */
static int64_t kt_ld(const lt_attention_params *p) { return (p->T + 15) / 16 * 16 + 16; }
static size_t kt_floats(const lt_attention_params *p) { return (size_t)(p->B * p->Hkv * p->D * kt_ld(p)); }

/* Forward, packed path: Kᵀ of every (row, kv head) as bf16 VNNI pair rows (up32(D)/2 of them, of
 * kt_keys(p) keys), and for f32 inputs V the same way (kt_keys(p)/2 pair rows of up32(D)): a key
 * block's products read them at any key (Kᵀ) or any even key (V), up32 of the block's keys. In
 * bf16 elements per (row, kv head). */
static int64_t kt_keys(const lt_attention_params *p) { return up32(p->T) + 32; }
static size_t packed_kv_elems(const lt_attention_params *p) {
    if (!packed_tiles(p)) return 0;
    return (size_t)(up32(p->D) * kt_keys(p)) * (p->dtype == LT_DTYPE_F32 ? 2 : 1);
}

/* Backward, per kv head in flight: Q and dO stacked (T·G, D), lse and D_i = rowsum(dO·O) stacked
 * (T·G), the dq_buckets(p) dQ buckets (T·G, D), then the buckets' coverage flags (buckets·T bytes). */
static size_t cov_floats(const lt_attention_params *p) {
    return lt_attn_round(((size_t)(dq_buckets(p) * p->T) + sizeof(float) - 1) / sizeof(float));
}

static size_t head_block_floats(const lt_attention_params *p) {
    return (size_t)(2 + dq_buckets(p)) * lt_attn_round(stacked_floats(p)) + 2 * lt_attn_round(stacked_rows(p)) +
        cov_floats(p) + (packed_tiles(p) ? lt_attn_round((packed_elems(p) + 1) / 2) : 0);
}

static size_t flash_shared_floats(const lt_attention_params *p, int backward) {
    if (!backward) return lt_attn_round(kt_floats(p)) + lt_attn_round((size_t)(p->B * p->Hkv) * packed_kv_elems(p) / 2);
    return (size_t)kv_batch(p) * head_block_floats(p);
}

static int flash_slots(const lt_attention_params *p, int backward, int threads) {
    return lt_attn_slots(threads, backward ? kv_batch(p) * dq_buckets(p) : flash_items(p));
}

size_t lt_attention_flash_workspace_bytes(const lt_attention_params *p, int backward, int threads) {
    size_t slots = (size_t)flash_slots(p, backward, threads);
    size_t per = flash_carve(p, backward, NULL, NULL), total;
    if (__builtin_mul_overflow(slots, per, &total) ||
        __builtin_add_overflow(total, flash_shared_floats(p, backward), &total) ||
        __builtin_mul_overflow(total, sizeof(float), &total))
        return SIZE_MAX;
    return total;
}

typedef struct {
    const lt_attention_params *p;
    const lt_attention_args *a;
    float *slots; /* slot i at slots + i * slot_floats */
    size_t slot_floats;
    float *kt;          /* forward: Kᵀ, (B, Hkv, D, T) */
    uint16_t *ktb, *vb; /* forward, packed path: Kᵀ and V of each (row, kv head) (packed_kv_elems) */
    float *heads;       /* backward: kv_batch() head blocks (see head_block_floats) */
    int64_t b, kv0, nk; /* backward: row b's kv heads [kv0, kv0 + nk) running */
    int64_t group;      /* G = H / Hkv */
    int backward;
} flash_job;

static flash_slot slot_of(const flash_job *j, int slot) {
    flash_slot s;
    memset(&s, 0, sizeof s);
    flash_carve(j->p, j->backward, j->slots + (size_t)slot * j->slot_floats, &s);
    return s;
}

/* Backward: the pieces of head block k (the kv head kv0 + k in flight). */
typedef struct {
    float *qs, *dos, *lse, *dvec, *dq;
    uint8_t *cov; /* (buckets, T) */
    /* packed path: Q and dO as bf16 rows (ld packed_rows_ld) and transposed (ld packed_cols_ld) */
    uint16_t *qa, *da, *qt, *dt;
} head_block;

static head_block head_block_of(const flash_job *j, int64_t k) {
    const lt_attention_params *p = j->p;
    const size_t sf = lt_attn_round(stacked_floats(p)), sr = lt_attn_round(stacked_rows(p));
    float *base = j->heads + (size_t)k * head_block_floats(p);
    float *dq = base + 2 * sf + 2 * sr;
    head_block h =
        {base, base + sf, base + 2 * sf, base + 2 * sf + sr, dq, (uint8_t *)(dq + (size_t)dq_buckets(p) * sf), NULL,
         NULL, NULL,      NULL};
    if (packed_tiles(p)) {
        h.qa = (uint16_t *)(dq + (size_t)dq_buckets(p) * sf + cov_floats(p));
        h.da = h.qa + packed_rows_elems(p), h.qt = h.da + packed_rows_elems(p), h.dt = h.qt + packed_cols_elems(p);
    }
    return h;
}

/* A (rows, D) operand for sgemm: in place for f32, converted into `scratch` for bf16. */
static const float *operand(const void *base, lt_dtype dt, const lt_attention_layout *l, int64_t b, int64_t t,
                            int64_t h, int64_t rows, int64_t D, float *scratch, int *ld) {
    const void *src = lt_attn_at(base, dt, lt_attn_off(l, b, t, h));
    if (dt == LT_DTYPE_F32) {
        *ld = (int)l->token;
        return src;
    }
    lt_attn_load(scratch, src, dt, l->token, rows, D);
    *ld = (int)D;
    return scratch;
}

/* dst (rows·G, D) <- the G heads from kv head kvh's first query head of tokens [t, t + rows) of
 * row b, stacked token-major, as f32. */
static void stack_rows(float *dst, const void *base, lt_dtype dt, const lt_attention_layout *l, int64_t b, int64_t t,
                       int64_t rows, int64_t h0, int64_t G, int64_t D) {
    for (int64_t i = 0; i < rows; i++)
        lt_attn_load(dst + i * G * D, lt_attn_at(base, dt, lt_attn_off(l, b, t + i, h0)), dt, l->head, G, D);
}

/* dst (D, ldt) <- the transpose of rows x D elements at (b, t, h) of base, as f32. */
static void transpose_rows(float *dst, int64_t ldt, const void *base, lt_dtype dt, const lt_attention_layout *l,
                           int64_t b, int64_t t, int64_t h, int64_t rows, int64_t D) {
    for (int64_t i = 0; i < rows; i++) {
        const int64_t off = lt_attn_off(l, b, t + i, h);
        if (dt == LT_DTYPE_F32) {
            const float *src = (const float *)base + off;
            for (int64_t d = 0; d < D; d++) dst[d * ldt + i] = src[d];
        } else {
            const uint16_t *src = (const uint16_t *)base + off;
            for (int64_t d = 0; d < D; d++) dst[d * ldt + i] = lt_attn_bf16(src[d]);
        }
    }
}

/* Visible key columns [*c0, *c1) of query q in the key block starting at kb of width c, clamped
 * so that 0 <= c0 <= c1 <= c (c0 == c1 when the block holds none of its keys). */
static inline void cols(int64_t q, int64_t s0, int64_t window, int64_t kb, int64_t c, int64_t *c0, int64_t *c1) {
    int64_t lo = lt_attn_lo(q, s0, window) - kb, hi = q - kb + 1;
    lo = lo < 0 ? 0 : lo > c ? c : lo;
    hi = hi > c ? c : hi < lo ? lo : hi;
    *c0 = lo;
    *c1 = hi;
}

/* ---- the softmax rows in vector registers (a build for an AVX-512 or AVX2 + FMA CPU; others
 * keep the loops below) ----
 * lt_fast_exp's steps sixteen (AVX-512) or eight (AVX2) lanes at a time, with its multiply-adds
 * fused, and the row's max, sum and masking in the same pass over the tile row. fwd_row_vec and
 * bwd_row_vec (contracts on the AVX2 forms below) work in whole vectors: the tile rows' strides
 * (FBC = 128, BC = 64) are multiples of 16, so the lanes past c stay in the row; whatever they
 * held, they come out 0. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define LT_FLASH_VEC 16

static inline __m512 exp16(__m512 x) {
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter);
    const __m512 n = _mm512_sub_ps(t, shifter);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 q = _mm512_set1_ps(1.0f / 5040.0f);
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 720.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 120.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 24.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 6.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.5f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)),
                                           _mm512_set1_epi32(127)),
                          23);
    return _mm512_mul_ps(q, _mm512_castsi512_ps(e));
}

/* Lanes y..y+15 inside [c0, c1), as a mask (c0 <= c1 <= c, y < c). */
static inline __mmask16 band16(int64_t y, int64_t c0, int64_t c1) {
    const int64_t lo = c0 - y <= 0 ? 0 : c0 - y >= 16 ? 16 : c0 - y, hi = c1 - y >= 16 ? 16 : c1 - y <= 0 ? 0 : c1 - y;
    return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

static inline float fwd_row_vec(float *srow, int64_t c, int64_t c0, int64_t c1, float m, float *m_out) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t y = 0; y < c; y += 16) mx = _mm512_mask_max_ps(mx, band16(y, c0, c1), mx, _mm512_loadu_ps(srow + y));
    const float mr = _mm512_reduce_max_ps(mx), mnew = mr > m ? mr : m;
    *m_out = mnew;
    const __m512 vm = _mm512_set1_ps(mnew);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t y = 0; y < c; y += 16) {
        const __m512 v = _mm512_maskz_mov_ps(band16(y, c0, c1), exp16(_mm512_sub_ps(_mm512_loadu_ps(srow + y), vm)));
        sum = _mm512_add_ps(sum, v);
        _mm512_storeu_ps(srow + y, v);
    }
    return _mm512_reduce_add_ps(sum);
}

static inline void bwd_row_vec(float *srow, float *drow, int64_t c, int64_t c0, int64_t c1, float L, float Dq) {
    const __m512 vl = _mm512_set1_ps(L), vd = _mm512_set1_ps(Dq);
    for (int64_t y = 0; y < c; y += 16) {
        const __mmask16 band = band16(y, c0, c1);
        const __m512 pv = _mm512_maskz_mov_ps(band, exp16(_mm512_sub_ps(_mm512_loadu_ps(srow + y), vl)));
        _mm512_storeu_ps(srow + y, pv);
        _mm512_storeu_ps(drow + y, _mm512_maskz_mul_ps(band, pv, _mm512_sub_ps(_mm512_loadu_ps(drow + y), vd)));
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LT_FLASH_VEC 8

static inline __m256 exp8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(12582912.0f);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
    const __m256 n = _mm256_sub_ps(t, shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(1.0f / 5040.0f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 720.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 120.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 24.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 6.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000)),
                                           _mm256_set1_epi32(127)),
                          23);
    return _mm256_mul_ps(q, _mm256_castsi256_ps(e));
}

/* Lanes y..y+7 inside [c0, c1). */
static inline __m256 band8(int64_t y, int64_t c0, int64_t c1) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)y), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32((int)c0 - 1)),
                                        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)c1), idx));
    return _mm256_castsi256_ps(in);
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Forward row of c keys: srow[y] <- exp(srow[y] - mnew) inside [c0, c1), 0 outside, with mnew =
 * max(m, the band's max); returns the band's sum, *m_out = mnew. */
static inline float fwd_row_vec(float *srow, int64_t c, int64_t c0, int64_t c1, float m, float *m_out) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t y = 0; y < c; y += 8)
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(srow + y), band8(y, c0, c1)));
    float mr = hmax8(mx);
    const float mnew = mr > m ? mr : m;
    *m_out = mnew;
    const __m256 vm = _mm256_set1_ps(mnew);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t y = 0; y < c; y += 8) {
        const __m256 v = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(srow + y), vm)), band8(y, c0, c1));
        sum = _mm256_add_ps(sum, v);
        _mm256_storeu_ps(srow + y, v);
    }
    return hsum8(sum);
}

/* Backward row: srow <- P = exp(srow - L), drow <- P·(drow - Dq) inside [c0, c1), both 0 outside. */
static inline void bwd_row_vec(float *srow, float *drow, int64_t c, int64_t c0, int64_t c1, float L, float Dq) {
    const __m256 vl = _mm256_set1_ps(L), vd = _mm256_set1_ps(Dq);
    for (int64_t y = 0; y < c; y += 8) {
        const __m256 band = band8(y, c0, c1);
        const __m256 pv = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(srow + y), vl)), band);
        _mm256_storeu_ps(srow + y, pv);
        const __m256 ds = _mm256_mul_ps(pv, _mm256_sub_ps(_mm256_loadu_ps(drow + y), vd));
        _mm256_storeu_ps(drow + y, _mm256_and_ps(ds, band));
    }
}
#endif

/* A tile's product: f32, or on operands rounded to bf16 when the call asks (tile_gemm.h). */
static void tile(const lt_attention_params *p, const flash_slot *sl, int trans_a, int64_t M, int64_t N, int64_t K,
                 float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc) {
    if (p->bf16_products) lt_cpu_tile_gemm_bf16(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, sl->pack);
    else lt_cpu_tile_gemm(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- forward ---------------------------------------------------------------------------- */

/* Query tokens [qa, qe) of one sequence starting at s0, all heads of kv head kvh of row b. */
LT_CPU_CLONES static void fwd_segment(const flash_job *j, flash_slot *sl, int64_t b, int64_t kvh, int64_t qa,
                                      int64_t qe, int64_t s0) {
    const lt_attention_params *p = j->p;
    const lt_attention_args *a = j->a;
    const int64_t D = p->D, G = j->group, R = (qe - qa) * G, W = p->window;
    const float cap = p->softcap;
    int ldv;
    float *Q = sl->q, *O = sl->acc, *S = sl->s, *m = sl->m, *l = sl->l;
    stack_rows(Q, a->q, p->dtype, &p->q_layout, b, qa, qe - qa, kvh * G, G, D);
    const int64_t Dp = up32(D), bk = b * p->Hkv + kvh;
    const uint16_t *ktb = j->ktb ? j->ktb + (size_t)bk * packed_kv_elems(p) : NULL;
    const uint16_t *vb = j->vb ? j->vb + (size_t)bk * packed_kv_elems(p) : NULL;
    if (ktb) lt_cpu_bf16_pack_a(0, Q, D, R, D, sl->qpk, Dp, up32(R), Dp);
    memset(O, 0, (size_t)(R * D) * sizeof(float));
    for (int64_t x = 0; x < R; x++) {
        m[x] = -INFINITY;
        l[x] = 0;
    }
    for (int64_t kb = lt_attn_lo(qa, s0, W); kb < qe; kb += FBC) {
        const int64_t c = qe - kb < FBC ? qe - kb : FBC;
        int64_t c0 = 0, c1 = 0;
        const float *Kt = j->kt + ((b * p->Hkv + kvh) * D) * kt_ld(p) + kb;
        const float *V = operand(a->v, p->dtype, &p->kv_layout, b, kb, kvh, c, D, sl->v, &ldv);
        if (ktb)
            lt_cpu_tile_gemm_bf16_packed(R, c, D, p->scale, sl->qpk, Dp, ktb + kb * 2, 32, kt_keys(p) * 2, 0.0f, S,
                                         FBC);
        else tile(p, sl, 0, R, c, D, p->scale, Q, D, Kt, kt_ld(p), 0.0f, S, FBC);
        for (int64_t x = 0; x < R; x++) {
            float *srow = S + x * FBC;
            if (x % G == 0) cols(qa + x / G, s0, W, kb, c, &c0, &c1);
            if (c1 <= c0) {
                memset(srow, 0, (size_t)c * sizeof(float));
                continue;
            }
#if defined(LT_FLASH_VEC)
            if (cap <= 0) {
                float mnew;
                const float sum = fwd_row_vec(srow, c, c0, c1, m[x], &mnew);
                const float alpha = m[x] == -INFINITY ? 0.0f : lt_fast_exp(m[x] - mnew);
                l[x] = l[x] * alpha + sum;
                m[x] = mnew;
                if (alpha != 1.0f) {
                    float *o = O + x * D;
                    for (int64_t d = 0; d < D; d++) o[d] *= alpha;
                }
                continue;
            }
#endif
            if (cap > 0) {
                const float inv = 1.0f / cap;
#pragma omp simd
                for (int64_t y = c0; y < c1; y++) srow[y] = cap * lt_fast_tanh(srow[y] * inv);
            }
            const float mx = lt_attn_max(srow + c0, c1 - c0);
            const float mnew = mx > m[x] ? mx : m[x];
            const float alpha = m[x] == -INFINITY ? 0.0f : lt_fast_exp(m[x] - mnew);
#pragma omp simd
            for (int64_t y = c0; y < c1; y++) srow[y] = lt_fast_exp(srow[y] - mnew);
            const float sum = lt_attn_sum(srow + c0, c1 - c0);
            memset(srow, 0, (size_t)c0 * sizeof(float));
            memset(srow + c1, 0, (size_t)(c - c1) * sizeof(float));
            l[x] = l[x] * alpha + sum;
            m[x] = mnew;
            if (alpha != 1.0f) {
                float *o = O + x * D;
                for (int64_t d = 0; d < D; d++) o[d] *= alpha;
            }
        }
        if (vb && kb % 2 == 0) {
            uint16_t *pk = sl->pack;
            lt_cpu_bf16_pack_a(0, S, FBC, R, c, pk, up32(c), up32(R), up32(c));
            lt_cpu_tile_gemm_bf16_packed(R, D, c, 1.0f, pk, up32(c), vb + kb * Dp, 32, Dp * 2, 1.0f, O, D);
        } else {
            tile(p, sl, 0, R, D, c, 1.0f, S, FBC, V, ldv, 1.0f, O, D);
        }
    }
    const size_t es = p->dtype == LT_DTYPE_F32 ? 4 : 2;
    for (int64_t x = 0; x < R; x++) {
        const int64_t t = qa + x / G, h = kvh * G + x % G;
        void *dst = (char *)a->out + lt_attn_off(&p->o_layout, b, t, h) * (int64_t)es;
        lt_attn_store(dst, p->dtype, p->o_layout.token, O + x * D, 1, D, 1.0f / l[x]);
        a->lse[(b * p->H + h) * p->T + t] = m[x] + logf(l[x]);
    }
}

/* Calls seg(job, slot, b, kv head, x0, x1, s0, s1) for each piece of [t0, t1) inside one sequence. */
typedef void (*segment_fn)(const flash_job *, flash_slot *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
static void for_segments(const flash_job *j, flash_slot *sl, int64_t b, int64_t head, int64_t t0, int64_t t1,
                         segment_fn seg) {
    for (int64_t x = t0; x < t1;) {
        int64_t s0, s1;
        lt_attn_seq(j->p, b, x, &s0, &s1);
        int64_t e = s1 < t1 ? s1 : t1;
        seg(j, sl, b, head, x, e, s0, s1);
        x = e;
    }
}

static void fwd_seg(const flash_job *j, flash_slot *sl, int64_t b, int64_t kvh, int64_t x0, int64_t x1, int64_t s0,
                    int64_t s1) {
    (void)s1;
    fwd_segment(j, sl, b, kvh, x0, x1, s0);
}

/* Item i of (B, Hkv, query tiles), heaviest (last) tiles first so the tail of the schedule is short. */
static void fwd_item(void *ctx, int64_t i, int slot) {
    const flash_job *j = ctx;
    const lt_attention_params *p = j->p;
    flash_slot sl = slot_of(j, slot);
    const int64_t bk = p->B * p->Hkv, tile = cdiv(p->T, FBR) - 1 - i / bk;
    const int64_t b = (i % bk) / p->Hkv, kvh = (i % bk) % p->Hkv, t0 = tile * FBR;
    for_segments(j, &sl, b, kvh, t0, t0 + FBR < p->T ? t0 + FBR : p->T, fwd_seg);
}

/* Kᵀ tiles [begin, end) of (B, Hkv, key tiles) into j->kt. */
static void kt_tiles(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const flash_job *j = arg;
    const lt_attention_params *p = j->p;
    const int64_t nt = cdiv(p->T, BC);
    for (int64_t i = begin; i < end; i++) {
        const int64_t bk = i / nt, t0 = (i % nt) * BC, rows = p->T - t0 < BC ? p->T - t0 : BC;
        transpose_rows(j->kt + bk * p->D * kt_ld(p) + t0, kt_ld(p), j->a->k, p->dtype, &p->kv_layout, bk / p->Hkv, t0,
                       bk % p->Hkv, rows, p->D);
    }
}

/* Packed path: Kᵀ (from j->kt) and, for f32 inputs, V of key tiles [begin, end) of (B, Hkv, key
 * tiles) as VNNI pair rows; the last tile also zeroes the keys past T that products may read. */
static void kv_pack_tiles(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const flash_job *j = arg;
    const lt_attention_params *p = j->p;
    const int64_t nt = cdiv(p->T, BC), D = p->D, Dp = up32(D), keys = kt_keys(p);
    for (int64_t i = begin; i < end; i++) {
        const int64_t bk = i / nt, t0 = (i % nt) * BC, n = p->T - t0 < BC ? p->T - t0 : BC, last = i % nt == nt - 1;
        const int64_t width = last ? keys - t0 : BC; /* keys written, zeros past T */
        uint16_t *kd = j->ktb + (size_t)bk * packed_kv_elems(p);
        lt_cpu_bf16_pack_b_rows(j->kt + bk * D * kt_ld(p) + t0, kt_ld(p), n, D, kd + t0 * 2, keys * 2, Dp / 2, width);
        if (!j->vb) continue;
        int ldv;
        const float *V = operand(j->a->v, p->dtype, &p->kv_layout, bk / p->Hkv, t0, bk % p->Hkv, n, D, NULL, &ldv);
        lt_cpu_bf16_pack_b_rows(V, ldv, D, n, j->vb + (size_t)bk * packed_kv_elems(p) + t0 * Dp, Dp * 2, width / 2, Dp);
    }
}

lt_status lt_attention_flash_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    const int64_t items = flash_items(p);
    float *kt = a->workspace;
    flash_job j = {.p = p,
                   .a = a,
                   .slots = kt + flash_shared_floats(p, 0),
                   .slot_floats = flash_carve(p, 0, NULL, NULL),
                   .kt = kt,
                   .group = group_of(p),
                   .backward = 0};
    lt_parallel_for(lt_ctx_threads(ctx), p->B * p->Hkv * cdiv(p->T, BC), 1, kt_tiles, &j);
    if (packed_tiles(p)) {
        j.ktb = (uint16_t *)(kt + lt_attn_round(kt_floats(p)));
        j.vb = p->dtype == LT_DTYPE_F32 ? j.ktb + (size_t)up32(p->D) * (size_t)kt_keys(p) : NULL;
        lt_parallel_for(lt_ctx_threads(ctx), p->B * p->Hkv * cdiv(p->T, BC), 1, kv_pack_tiles, &j);
    }
    lt_attn_schedule(lt_attn_slots(lt_ctx_threads(ctx), items), items, fwd_item, &j);
    return LT_OK;
}

/* ---- backward --------------------------------------------------------------------------- */

/* In place over an (R, c) tile of stacked rows (tokens q0.., G rows each) and keys kb..: S
 * (scaled, uncapped scores) becomes P = exp(cap(S) - lse) and dP becomes dS = P (dP - D_i)
 * cap'(S); invisible entries become 0. lse and dvec are the tile's stacked rows. */
LT_CPU_CLONES static void grad_tile(const flash_job *j, float *S, float *dP, int64_t R, int64_t c, int64_t q0,
                                    int64_t kb, int64_t s0, const float *lse, const float *dvec) {
    const float cap = j->p->softcap;
    const int64_t G = j->group;
    int64_t c0 = 0, c1 = 0;
    for (int64_t x = 0; x < R; x++) {
        float *srow = S + x * BC, *drow = dP + x * BC;
        const float L = lse[x], Dq = dvec[x];
        if (x % G == 0) cols(q0 + x / G, s0, j->p->window, kb, c, &c0, &c1);
#if defined(LT_FLASH_VEC)
        if (cap <= 0) {
            bwd_row_vec(srow, drow, c, c0, c1, L, Dq);
            continue;
        }
#endif
        if (cap > 0) {
            const float inv = 1.0f / cap;
#pragma omp simd
            for (int64_t y = c0; y < c1; y++) {
                float t = lt_fast_tanh(srow[y] * inv);
                float pv = lt_fast_exp(cap * t - L);
                srow[y] = pv;
                drow[y] = pv * (drow[y] - Dq) * (1.0f - t * t);
            }
        } else {
#pragma omp simd
            for (int64_t y = c0; y < c1; y++) {
                float pv = lt_fast_exp(srow[y] - L);
                srow[y] = pv;
                drow[y] = pv * (drow[y] - Dq);
            }
        }
        memset(srow, 0, (size_t)c0 * sizeof(float));
        memset(srow + c1, 0, (size_t)(c - c1) * sizeof(float));
        memset(drow, 0, (size_t)c0 * sizeof(float));
        memset(drow + c1, 0, (size_t)(c - c1) * sizeof(float));
    }
}

/* The beta of a tile's dQ product into the item's bucket for stacked rows [x0, x0 + R): rows
 * reached for the first time are written, not added to (a part below x0 reached now is zeroed),
 * and their tokens flagged as held. */
static float dq_beta(flash_slot *sl, int64_t x0, int64_t R, int64_t D, int64_t G) {
    if (x0 + R <= sl->dq_hw) return 1.0f;
    const int64_t from = x0 > sl->dq_hw ? x0 : sl->dq_hw;
    if (from != x0) memset(sl->dq + from * D, 0, (size_t)((x0 + R - from) * D) * sizeof(float));
    memset(sl->cov + from / G, 1, (size_t)((x0 + R - from) / G));
    sl->dq_hw = x0 + R;
    return from == x0 ? 0.0f : 1.0f;
}

/* bwd_seg on the packed path (packed_tiles): the same sums with Q and dO packed once per kv head,
 * Kᵀ, Vᵀ and K once per key tile, and dK, dV accumulated transposed (dKᵀ += Qᵀ·dS, dVᵀ += dOᵀ·P:
 * the packed transposes read at the tile's row offset, P and dS packed as they are), transposed
 * back when the key tile is done. */
static void bwd_seg_packed(const flash_job *j, flash_slot *sl, int64_t b, int64_t kvh, int64_t ka, int64_t ke,
                           int64_t s0, int64_t s1) {
    const lt_attention_params *p = j->p;
    const lt_attention_args *a = j->a;
    const int64_t D = p->D, G = j->group, c = ke - ka, W = p->window;
    const int64_t qend = W > 0 && ke - 1 + W < s1 ? ke - 1 + W : s1;
    const int64_t ldr = packed_rows_ld(p), ldt = packed_cols_ld(p), cp = up32(c), pD = lt_cpu_bf16_panel_elems(D);
    int ldk;
    const float *K = operand(a->k, p->dtype, &p->kv_layout, b, ka, kvh, c, D, sl->k, &ldk);
    transpose_rows(sl->kt, BC, a->k, p->dtype, &p->kv_layout, b, ka, kvh, c, D);
    transpose_rows(sl->vt, BC, a->v, p->dtype, &p->kv_layout, b, ka, kvh, c, D);
    lt_cpu_bf16_pack_b(sl->kt, BC, c, D, sl->pkt);
    lt_cpu_bf16_pack_b(sl->vt, BC, c, D, sl->pvt);
    lt_cpu_bf16_pack_b(K, ldk, D, c, sl->pk);
    float *dKt = sl->acc, *dVt = sl->acc2; /* (D, c) at row stride BC */
    memset(dKt, 0, (size_t)(D * BC) * sizeof(float));
    memset(dVt, 0, (size_t)(D * BC) * sizeof(float));
    uint16_t *pk = sl->pack; /* this pair's packed P, dS */
    for (int64_t qb = ka; qb < qend; qb += BBR) {
        const int64_t R = (qend - qb < BBR ? qend - qb : BBR) * G, x0 = qb * G, pR = lt_cpu_bf16_panel_elems(R);
        lt_cpu_tile_gemm_bf16_packed(R, c, D, p->scale, sl->qa + x0 * ldr, ldr, sl->pkt, pD, 32, 0.0f, sl->s, BC);
        lt_cpu_tile_gemm_bf16_packed(R, c, D, 1.0f, sl->da + x0 * ldr, ldr, sl->pvt, pD, 32, 0.0f, sl->dp, BC);
        grad_tile(j, sl->s, sl->dp, R, c, qb, ka, s0, sl->lse + x0, sl->dvec + x0);
        lt_cpu_bf16_pack_b(sl->s, BC, c, R, pk);
        lt_cpu_tile_gemm_bf16_packed(D, c, R, 1.0f, sl->dt + x0, ldt, pk, pR, 32, 1.0f, dVt, BC);
        lt_cpu_bf16_pack_b(sl->dp, BC, c, R, pk);
        lt_cpu_tile_gemm_bf16_packed(D, c, R, 1.0f, sl->qt + x0, ldt, pk, pR, 32, 1.0f, dKt, BC);
        const float beta = dq_beta(sl, x0, R, D, G);
        lt_cpu_bf16_pack_a(0, sl->dp, BC, R, c, pk, cp, up32(R), cp);
        lt_cpu_tile_gemm_bf16_packed(R, D, c, 1.0f, pk, cp, sl->pk, lt_cpu_bf16_panel_elems(c), 32, beta,
                                     sl->dq + x0 * D, D);
    }
    float *dK = sl->kt, *dV = sl->vt; /* (c, D), over the tiles' Kᵀ and Vᵀ */
    for (int64_t t = 0; t < c; t++)
        for (int64_t d = 0; d < D; d++) {
            dK[t * D + d] = dKt[d * BC + t];
            dV[t * D + d] = dVt[d * BC + t];
        }
    const size_t es = p->dtype == LT_DTYPE_F32 ? 4 : 2;
    const int64_t off = lt_attn_off(&p->kv_layout, b, ka, kvh);
    lt_attn_store((char *)a->dk + off * (int64_t)es, p->dtype, p->kv_layout.token, dK, c, D, p->scale);
    lt_attn_store((char *)a->dv + off * (int64_t)es, p->dtype, p->kv_layout.token, dV, c, D, 1.0f);
}

/* Keys [ka, ke) of the sequence [s0, s1), kv head kvh of row b, against the stacked rows of every
 * query that sees one of these keys: dK and dV of the keys (complete when the loop ends) and this
 * tile's share of dQ, accumulated into the item's bucket sl->dq. */
static void bwd_seg(const flash_job *j, flash_slot *sl, int64_t b, int64_t kvh, int64_t ka, int64_t ke, int64_t s0,
                    int64_t s1) {
    if (sl->qa) {
        bwd_seg_packed(j, sl, b, kvh, ka, ke, s0, s1);
        return;
    }
    const lt_attention_params *p = j->p;
    const lt_attention_args *a = j->a;
    const int64_t D = p->D, G = j->group, c = ke - ka, W = p->window;
    /* The last query to see key ke-1 is ke-1+W-1 inside the window, else the sequence's last. */
    const int64_t qend = W > 0 && ke - 1 + W < s1 ? ke - 1 + W : s1;
    int ldk;
    const float *K = operand(a->k, p->dtype, &p->kv_layout, b, ka, kvh, c, D, sl->k, &ldk);
    transpose_rows(sl->kt, BC, a->k, p->dtype, &p->kv_layout, b, ka, kvh, c, D);
    transpose_rows(sl->vt, BC, a->v, p->dtype, &p->kv_layout, b, ka, kvh, c, D);
    float *dK = sl->acc, *dV = sl->acc2;
    memset(dK, 0, (size_t)(c * D) * sizeof(float));
    memset(dV, 0, (size_t)(c * D) * sizeof(float));
    for (int64_t qb = ka; qb < qend; qb += BBR) {
        const int64_t R = (qend - qb < BBR ? qend - qb : BBR) * G, x0 = qb * G;
        const float *Q = sl->qs + x0 * D, *dO = sl->dos + x0 * D;
        tile(p, sl, 0, R, c, D, p->scale, Q, D, sl->kt, BC, 0.0f, sl->s, BC);
        tile(p, sl, 0, R, c, D, 1.0f, dO, D, sl->vt, BC, 0.0f, sl->dp, BC);
        grad_tile(j, sl->s, sl->dp, R, c, qb, ka, s0, sl->lse + x0, sl->dvec + x0);
        tile(p, sl, 1, c, D, R, 1.0f, sl->s, BC, dO, D, 1.0f, dV, D);
        tile(p, sl, 1, c, D, R, 1.0f, sl->dp, BC, Q, D, 1.0f, dK, D);
        const float beta = dq_beta(sl, x0, R, D, G);
        tile(p, sl, 0, R, D, c, 1.0f, sl->dp, BC, K, ldk, beta, sl->dq + x0 * D, D);
    }
    const size_t es = p->dtype == LT_DTYPE_F32 ? 4 : 2;
    const int64_t off = lt_attn_off(&p->kv_layout, b, ka, kvh);
    lt_attn_store((char *)a->dk + off * (int64_t)es, p->dtype, p->kv_layout.token, dK, c, D, p->scale);
    lt_attn_store((char *)a->dv + off * (int64_t)es, p->dtype, p->kv_layout.token, dV, c, D, 1.0f);
}

/* Item i: bucket i / nk of kv head kv0 + i % nk (every head's bucket 0, the heaviest, first): its
 * key tiles bucket, bucket + buckets, ... in ascending order. */
static void bwd_item(void *ctx, int64_t i, int slot) {
    const flash_job *j = ctx;
    const int64_t k = i % j->nk, bucket = i / j->nk;
    flash_slot sl = slot_of(j, slot);
    head_block hb = head_block_of(j, k);
    sl.qs = hb.qs, sl.dos = hb.dos, sl.lse = hb.lse, sl.dvec = hb.dvec;
    sl.qa = hb.qa, sl.da = hb.da, sl.qt = hb.qt, sl.dt = hb.dt;
    sl.dq = hb.dq + (size_t)bucket * lt_attn_round(stacked_floats(j->p));
    sl.dq_hw = 0;
    sl.cov = hb.cov + bucket * j->p->T;
    memset(sl.cov, 0, (size_t)j->p->T);
    for (int64_t t0 = bucket * BC; t0 < j->p->T; t0 += dq_buckets(j->p) * BC)
        for_segments(j, &sl, j->b, j->kv0 + k, t0, t0 + BC < j->p->T ? t0 + BC : j->p->T, bwd_seg);
}

/* Tokens [begin, end) of (nk, T) over the kv heads in flight: Q and dO stacked, lse stacked, and
 * D_i = sum_d dO_id O_id. */
LT_CPU_CLONES static void stack_tokens(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const flash_job *j = arg;
    const lt_attention_params *p = j->p;
    const lt_attention_args *a = j->a;
    const int64_t G = j->group, D = p->D;
    for (int64_t u = begin; u < end; u++) {
        const int64_t k = u / p->T, t = u % p->T, h0 = (j->kv0 + k) * G;
        head_block hb = head_block_of(j, k);
        stack_rows(hb.qs + t * G * D, a->q, p->dtype, &p->q_layout, j->b, t, 1, h0, G, D);
        stack_rows(hb.dos + t * G * D, a->dout, p->dtype, &p->o_layout, j->b, t, 1, h0, G, D);
        for (int64_t g = 0; g < G; g++) {
            const int64_t x = t * G + g, off = lt_attn_off(&p->o_layout, j->b, t, h0 + g);
            const float *dO = hb.dos + x * D;
            float sum = 0;
            if (p->dtype == LT_DTYPE_F32) {
                const float *o = (const float *)a->out + off;
#pragma omp simd reduction(+ : sum)
                for (int64_t d = 0; d < D; d++) sum += o[d] * dO[d];
            } else {
                const uint16_t *o = (const uint16_t *)a->out + off;
#pragma omp simd reduction(+ : sum)
                for (int64_t d = 0; d < D; d++) sum += lt_attn_bf16(o[d]) * dO[d];
            }
            hb.dvec[x] = sum;
            hb.lse[x] = a->lse[(j->b * p->H + h0 + g) * p->T + t];
        }
    }
}

/* The packed path's Q and dO, in items of 64 stacked rows: (nk, 4, chunks) over the kv heads in
 * flight, the four being Q's and dO's rows and Q's and dO's transposes; the last chunk also zeroes
 * what products may read past the T·G rows. */
#define PACK_ROWS 64
static int64_t pack_chunks(const lt_attention_params *p) { return cdiv((int64_t)stacked_rows(p), PACK_ROWS); }

static void pack_heads(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const flash_job *j = arg;
    const lt_attention_params *p = j->p;
    const int64_t D = p->D, TG = (int64_t)stacked_rows(p), nc = pack_chunks(p);
    const int64_t ldr = packed_rows_ld(p), ldc = packed_cols_ld(p);
    for (int64_t u = begin; u < end; u++) {
        const int64_t k = u / (4 * nc), what = u / nc % 4, c = u % nc, r0 = c * PACK_ROWS;
        const int64_t n = TG - r0 < PACK_ROWS ? TG - r0 : PACK_ROWS, last = c == nc - 1;
        head_block hb = head_block_of(j, k);
        const float *src = (what % 2 ? hb.dos : hb.qs) + r0 * D;
        if (what < 2)
            lt_cpu_bf16_pack_a(0, src, D, n, D, (what ? hb.da : hb.qa) + r0 * ldr, ldr, n + (last ? 32 : 0), ldr);
        else
            lt_cpu_bf16_pack_a(1, src, D, D, n, (what == 3 ? hb.dt : hb.qt) + r0, ldc, up32(D),
                               last ? ldc - r0 : PACK_ROWS);
    }
}

/* Stacked dQ rows [begin, end) of (nk, T·G) over the kv heads in flight: the buckets that hold the
 * row (cov) summed in index order, scaled, stored at their (token, head). A bucket that holds no
 * value there would add zeros: skipping it gives the same sums (up to the sign of an exact zero).
 * A query sees itself, so the bucket of its own key tile holds its row; a token outside every
 * packed sequence is held by none and gets 0. */
LT_CPU_CLONES static void dq_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const flash_job *j = arg;
    const lt_attention_params *p = j->p;
    const int64_t D = p->D, rows = (int64_t)stacked_rows(p);
    const size_t stride = lt_attn_round(stacked_floats(p));
    const size_t es = p->dtype == LT_DTYPE_F32 ? 4 : 2;
    for (int64_t u = begin; u < end; u++) {
        const int64_t k = u / rows, x = u % rows;
        head_block hb = head_block_of(j, k);
        const int64_t t = x / j->group;
        float *acc = hb.dq + (size_t)x * (size_t)D;
        int held = hb.cov[t];
        for (int64_t nb = 1; nb < dq_buckets(p); nb++) {
            if (!hb.cov[nb * p->T + t]) continue;
            const float *part = hb.dq + (size_t)nb * stride + (size_t)x * (size_t)D;
            if (!held) {
                memcpy(acc, part, (size_t)D * sizeof(float));
                held = 1;
                continue;
            }
#pragma omp simd
            for (int64_t d = 0; d < D; d++) acc[d] += part[d];
        }
        if (!held) memset(acc, 0, (size_t)D * sizeof(float));
        const int64_t off = lt_attn_off(&p->q_layout, j->b, t, (j->kv0 + k) * j->group + x % j->group);
        lt_attn_store((char *)j->a->dq + off * (int64_t)es, p->dtype, p->q_layout.token, acc, 1, D, p->scale);
    }
}

lt_status lt_attention_flash_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    const int threads = lt_ctx_threads(ctx);
    float *ws = a->workspace;
    flash_job j = {.p = p,
                   .a = a,
                   .slots = ws + flash_shared_floats(p, 1),
                   .slot_floats = flash_carve(p, 1, NULL, NULL),
                   .heads = ws,
                   .group = group_of(p),
                   .backward = 1};
    const int slots = flash_slots(p, 1, threads);
    for (j.b = 0; j.b < p->B; j.b++)
        for (j.kv0 = 0; j.kv0 < p->Hkv; j.kv0 += j.nk) {
            j.nk = p->Hkv - j.kv0 < kv_batch(p) ? p->Hkv - j.kv0 : kv_batch(p);
            lt_parallel_for(threads, j.nk * p->T, 64, stack_tokens, &j);
            if (packed_tiles(p)) lt_parallel_for(threads, j.nk * 4 * pack_chunks(p), 1, pack_heads, &j);
            lt_attn_schedule(slots, j.nk * dq_buckets(p), bwd_item, &j);
            lt_parallel_for(threads, j.nk * (int64_t)stacked_rows(p), 64, dq_rows, &j);
        }
    return LT_OK;
}
