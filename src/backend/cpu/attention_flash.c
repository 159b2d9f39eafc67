/* Flash attention on the CPU: tiles of LT_ATTN_BR queries x LT_ATTN_BC keys, QK^T and PV as
 * OpenBLAS sgemm on the tiles, online softmax, saved per-row log-sum-exp, and a backward that
 * recomputes each tile once (one pass over key tiles giving dK, dV and dQ; dQ is summed in a fixed
 * number of buckets so the result does not depend on the thread count). Tiles are cut at
 * packed-sequence boundaries and only the keys inside the causal / window band of the tile's own
 * sequence are visited, so a packed row costs sum(len^2), not T^2. No (T, T) buffer exists. */
#include <cblas.h>
#include <math.h>

#include "backend/cpu/attention_cpu.h"
#include "core/parallel.h"

#define BR LT_ATTN_BR
#define BC LT_ATTN_BC

/* One thread's scratch. The f32 tile copies exist only for bf16 (f32 tensors are read in place
 * by sgemm with their token stride as leading dimension). Products with Kᵀ and Vᵀ read transposed
 * copies (kt, vt here; all of Kᵀ in the forward's shared workspace): OpenBLAS runs these 64-wide
 * tiles as NN about 1.7x faster than as NT (measured 156 against 86-92 GFLOP/s on one core). */
typedef struct {
    float *q, *k, *v, *dout; /* bf16 -> f32 tiles: (BR, D), (BC, D), (BC, D), (BR, D) */
    float *kt, *vt;          /* backward: Kᵀ, Vᵀ of the key tile, (D, BC) */
    float *s, *dp;           /* (BR, BC): scores then P; dP then dS (backward) */
    float *acc, *acc2;       /* forward: O (BR, D); dQ pass: dQ (BR, D); dK/dV pass: dK, dV (BC, D) */
    float *m, *l;            /* forward: running max and sum per query row */
    float *dq;               /* backward: the dQ bucket of the item running (not carved) */
} flash_slot;

/* Lays one slot out from `base` (or only counts when base is NULL); returns its size in floats.
 * The workspace size and the kernels both come from here, so they cannot disagree. */
static size_t flash_carve(const lt_attention_params *p, int backward, float *base, flash_slot *sl) {
    const size_t D = (size_t)p->D, conv = p->dtype != LT_DTYPE_F32;
    const size_t rows = BR > BC ? BR : BC;
    size_t off = 0;
#define TAKE(field, count)                                           \
    do {                                                             \
        size_t n_ = (count);                                         \
        if (sl) sl->field = n_ && base ? base + off : NULL;          \
        off += lt_attn_round(n_);                                    \
    } while (0)
    TAKE(q, conv * BR * D);
    TAKE(k, conv * (size_t)backward * BC * D);
    TAKE(v, conv * (size_t)!backward * BC * D);
    TAKE(dout, conv * (size_t)backward * BR * D);
    TAKE(kt, (size_t)backward * D * BC);
    TAKE(vt, (size_t)backward * D * BC);
    TAKE(s, (size_t)BR * BC);
    TAKE(dp, (size_t)backward * BR * BC);
    TAKE(acc, rows * D);
    TAKE(acc2, (size_t)backward * BC * D);
    TAKE(m, (size_t)!backward * BR);
    TAKE(l, (size_t)!backward * BR);
#undef TAKE
    return off;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Work items: forward and the dQ pass run over (B, H, query tiles), the dK/dV pass over
 * (B, Hkv, key tiles). */
static int64_t flash_items(const lt_attention_params *p) { return p->B * p->H * cdiv(p->T, BR); }

/* The backward's key tiles of one kv head are dealt round-robin into this many buckets; a bucket
 * is one work item (its tiles run in ascending order on one thread) with its own dQ accumulator,
 * and the buckets are summed in index order. So dQ is bit-identical for any thread count, at the
 * cost of DQ_BUCKETS·T·(H/Hkv)·D floats of workspace; 4 balances the causal tiles on 2-4 threads. */
#define DQ_BUCKETS 4

static size_t dq_bucket_floats(const lt_attention_params *p) { return (size_t)(p->T * (p->H / p->Hkv) * p->D); }

/* Forward: Kᵀ of every (row, kv head), (B, Hkv, D, ld) with ld = T rounded up to 16 floats plus 16
 * more, so that the rows of a tile do not all fall into the same L1 sets when T is a power of two. */
static int64_t kt_ld(const lt_attention_params *p) { return (p->T + 15) / 16 * 16 + 16; }
static size_t kt_floats(const lt_attention_params *p) { return (size_t)(p->B * p->Hkv * p->D * kt_ld(p)); }

static size_t flash_shared_floats(const lt_attention_params *p, int backward) {
    /* Backward: D_i = rowsum(dO * O) per (b, h, t), then the dQ buckets of one kv head. */
    if (!backward) return lt_attn_round(kt_floats(p));
    return lt_attn_round((size_t)(p->B * p->H * p->T)) + DQ_BUCKETS * lt_attn_round(dq_bucket_floats(p));
}

static int flash_slots(const lt_attention_params *p, int backward, int threads) {
    return lt_attn_slots(threads, backward ? DQ_BUCKETS : flash_items(p));
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
    float *slots;      /* slot i at slots + i * slot_floats */
    size_t slot_floats;
    const float *dvec; /* backward: (B, H, T) */
    float *dq;         /* backward: DQ_BUCKETS buckets of (H/Hkv, T, D) for the kv head running */
    float *kt;         /* forward: Kᵀ, (B, Hkv, D, T) */
    int64_t b, kvh;    /* backward: the (row, kv head) running */
    int64_t group;     /* H / Hkv */
    int backward;
} flash_job;

static flash_slot slot_of(const flash_job *j, int slot) {
    flash_slot s;
    s.dq = NULL;
    flash_carve(j->p, j->backward, j->slots + (size_t)slot * j->slot_floats, &s);
    return s;
}

/* A (rows, D) operand for sgemm: in place for f32, converted into `scratch` for bf16. */
static const float *operand(const void *base, lt_dtype dt, const lt_attention_layout *l, int64_t b,
                            int64_t t, int64_t h, int64_t rows, int64_t D, float *scratch, int *ld) {
    const void *src = lt_attn_at(base, dt, lt_attn_off(l, b, t, h));
    if (dt == LT_DTYPE_F32) {
        *ld = (int)l->token;
        return src;
    }
    lt_attn_load(scratch, src, dt, l->token, rows, D);
    *ld = (int)D;
    return scratch;
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

/* ---- forward ---------------------------------------------------------------------------- */

/* Queries [qa, qe) of one sequence starting at s0, head h of row b. */
static void fwd_segment(const flash_job *j, flash_slot *sl, int64_t b, int64_t h, int64_t qa,
                        int64_t qe, int64_t s0) {
    const lt_attention_params *p = j->p;
    const lt_attention_args *a = j->a;
    const int64_t D = p->D, r = qe - qa, kvh = h / j->group, W = p->window;
    const float cap = p->softcap;
    int ldq, ldv;
    const float *Q = operand(a->q, p->dtype, &p->q_layout, b, qa, h, r, D, sl->q, &ldq);
    float *O = sl->acc, *S = sl->s, *m = sl->m, *l = sl->l;
    memset(O, 0, (size_t)(r * D) * sizeof(float));
    for (int64_t i = 0; i < r; i++) {
        m[i] = -INFINITY;
        l[i] = 0;
    }
    for (int64_t kb = lt_attn_lo(qa, s0, W); kb < qe; kb += BC) {
        const int64_t c = qe - kb < BC ? qe - kb : BC;
        const float *Kt = j->kt + ((b * p->Hkv + kvh) * D) * kt_ld(p) + kb;
        const float *V = operand(a->v, p->dtype, &p->kv_layout, b, kb, kvh, c, D, sl->v, &ldv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)c, (int)D, p->scale, Q, ldq,
                    Kt, (int)kt_ld(p), 0.0f, S, BC);
        for (int64_t i = 0; i < r; i++) {
            float *srow = S + i * BC;
            int64_t c0, c1;
            cols(qa + i, s0, W, kb, c, &c0, &c1);
            if (c1 <= c0) {
                memset(srow, 0, (size_t)c * sizeof(float));
                continue;
            }
            if (cap > 0) {
                const float inv = 1.0f / cap;
#pragma omp simd
                for (int64_t x = c0; x < c1; x++) srow[x] = cap * lt_attn_tanh(srow[x] * inv);
            }
            const float mx = lt_attn_max(srow + c0, c1 - c0);
            const float mnew = mx > m[i] ? mx : m[i];
            const float alpha = m[i] == -INFINITY ? 0.0f : lt_attn_exp(m[i] - mnew);
#pragma omp simd
            for (int64_t x = c0; x < c1; x++) srow[x] = lt_attn_exp(srow[x] - mnew);
            const float sum = lt_attn_sum(srow + c0, c1 - c0);
            memset(srow, 0, (size_t)c0 * sizeof(float));
            memset(srow + c1, 0, (size_t)(c - c1) * sizeof(float));
            l[i] = l[i] * alpha + sum;
            m[i] = mnew;
            if (alpha != 1.0f) {
                float *o = O + i * D;
                for (int64_t d = 0; d < D; d++) o[d] *= alpha;
            }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)D, (int)c, 1.0f, S, BC, V,
                    ldv, 1.0f, O, (int)D);
    }
    float *lse = a->lse + (b * p->H + h) * p->T;
    for (int64_t i = 0; i < r; i++) {
        void *dst = (char *)a->out + lt_attn_off(&p->o_layout, b, qa + i, h) * (p->dtype == LT_DTYPE_F32 ? 4 : 2);
        lt_attn_store(dst, p->dtype, p->o_layout.token, O + i * D, 1, D, 1.0f / l[i]);
        lse[qa + i] = m[i] + logf(l[i]);
    }
}

/* Calls seg(job, slot, b, head, x0, x1, s0, s1) for each piece of [t0, t1) inside one sequence. */
typedef void (*segment_fn)(const flash_job *, flash_slot *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
static void for_segments(const flash_job *j, flash_slot *sl, int64_t b, int64_t head, int64_t t0,
                         int64_t t1, segment_fn seg) {
    for (int64_t x = t0; x < t1;) {
        int64_t s0, s1;
        lt_attn_seq(j->p, b, x, &s0, &s1);
        int64_t e = s1 < t1 ? s1 : t1;
        seg(j, sl, b, head, x, e, s0, s1);
        x = e;
    }
}

static void fwd_seg(const flash_job *j, flash_slot *sl, int64_t b, int64_t h, int64_t x0, int64_t x1,
                    int64_t s0, int64_t s1) {
    (void)s1;
    fwd_segment(j, sl, b, h, x0, x1, s0);
}

/* Item i of (B, H, query tiles), heaviest (last) tiles first so the tail of the schedule is short. */
static void query_tile_item(const flash_job *j, int64_t i, int64_t *b, int64_t *h, int64_t *t0, int64_t *t1) {
    const lt_attention_params *p = j->p;
    const int64_t bh = p->B * p->H, nt = cdiv(p->T, BR), tile = nt - 1 - i / bh;
    *b = (i % bh) / p->H;
    *h = (i % bh) % p->H;
    *t0 = tile * BR;
    *t1 = *t0 + BR < p->T ? *t0 + BR : p->T;
}

static void fwd_item(void *ctx, int64_t i, int slot) {
    const flash_job *j = ctx;
    flash_slot sl = slot_of(j, slot);
    int64_t b, h, t0, t1;
    query_tile_item(j, i, &b, &h, &t0, &t1);
    for_segments(j, &sl, b, h, t0, t1, fwd_seg);
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

lt_status lt_attention_flash_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    const int64_t items = flash_items(p);
    float *kt = a->workspace;
    flash_job j = {.p = p, .a = a, .slots = kt + flash_shared_floats(p, 0),
                   .slot_floats = flash_carve(p, 0, NULL, NULL), .kt = kt, .group = p->H / p->Hkv, .backward = 0};
    lt_parallel_for(lt_ctx_threads(ctx), p->B * p->Hkv * cdiv(p->T, BC), 1, kt_tiles, &j);
    lt_attn_schedule(lt_attn_slots(lt_ctx_threads(ctx), items), items, fwd_item, &j);
    return LT_OK;
}

/* ---- backward --------------------------------------------------------------------------- */

/* In place over an (r, c) tile of queries q0.. and keys kb..: S (scaled, uncapped scores) becomes
 * P = exp(cap(S) - lse) and dP becomes dS = P (dP - D_i) cap'(S); invisible entries become 0. */
static void grad_tile(const flash_job *j, float *S, float *dP, int64_t r, int64_t c, int64_t q0,
                      int64_t kb, int64_t s0, const float *lse, const float *dvec) {
    const float cap = j->p->softcap;
    for (int64_t i = 0; i < r; i++) {
        float *srow = S + i * BC, *drow = dP + i * BC;
        const int64_t q = q0 + i;
        const float L = lse[q], Dq = dvec[q];
        int64_t c0, c1;
        cols(q, s0, j->p->window, kb, c, &c0, &c1);
        if (cap > 0) {
            const float inv = 1.0f / cap;
#pragma omp simd
            for (int64_t x = c0; x < c1; x++) {
                float t = lt_attn_tanh(srow[x] * inv);
                float pv = lt_attn_exp(cap * t - L);
                srow[x] = pv;
                drow[x] = pv * (drow[x] - Dq) * (1.0f - t * t);
            }
        } else {
#pragma omp simd
            for (int64_t x = c0; x < c1; x++) {
                float pv = lt_attn_exp(srow[x] - L);
                srow[x] = pv;
                drow[x] = pv * (drow[x] - Dq);
            }
        }
        memset(srow, 0, (size_t)c0 * sizeof(float));
        memset(srow + c1, 0, (size_t)(c - c1) * sizeof(float));
        memset(drow, 0, (size_t)c0 * sizeof(float));
        memset(drow + c1, 0, (size_t)(c - c1) * sizeof(float));
    }
}

/* Keys [ka, ke) of the sequence [s0, s1), kv head kvh of row b, against every query head of the
 * group and every query that sees one of these keys: dK and dV of the keys (complete when the loop
 * ends) and this tile's share of dQ, accumulated into the item's bucket sl->dq. */
static void bwd_seg(const flash_job *j, flash_slot *sl, int64_t b, int64_t kvh, int64_t ka, int64_t ke,
                    int64_t s0, int64_t s1) {
    const lt_attention_params *p = j->p;
    const lt_attention_args *a = j->a;
    const int64_t D = p->D, c = ke - ka, W = p->window, T = p->T;
    /* The last query to see key ke-1 is ke-1+W-1 inside the window, else the sequence's last. */
    const int64_t qend = W > 0 && ke - 1 + W < s1 ? ke - 1 + W : s1;
    int ldq, lddo, ldk;
    const float *K = operand(a->k, p->dtype, &p->kv_layout, b, ka, kvh, c, D, sl->k, &ldk);
    transpose_rows(sl->kt, BC, a->k, p->dtype, &p->kv_layout, b, ka, kvh, c, D);
    transpose_rows(sl->vt, BC, a->v, p->dtype, &p->kv_layout, b, ka, kvh, c, D);
    float *dK = sl->acc, *dV = sl->acc2;
    memset(dK, 0, (size_t)(c * D) * sizeof(float));
    memset(dV, 0, (size_t)(c * D) * sizeof(float));
    for (int64_t g = 0; g < j->group; g++) {
        const int64_t h = kvh * j->group + g;
        const float *lse = a->lse + (b * p->H + h) * T, *dvec = j->dvec + (b * p->H + h) * T;
        float *dQ = sl->dq + g * T * D;
        for (int64_t qb = ka; qb < qend; qb += BR) {
            const int64_t r = qend - qb < BR ? qend - qb : BR;
            const float *Q = operand(a->q, p->dtype, &p->q_layout, b, qb, h, r, D, sl->q, &ldq);
            const float *dO = operand(a->dout, p->dtype, &p->o_layout, b, qb, h, r, D, sl->dout, &lddo);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)c, (int)D, p->scale, Q,
                        ldq, sl->kt, BC, 0.0f, sl->s, BC);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)c, (int)D, 1.0f, dO, lddo,
                        sl->vt, BC, 0.0f, sl->dp, BC);
            grad_tile(j, sl->s, sl->dp, r, c, qb, ka, s0, lse, dvec);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)c, (int)D, (int)r, 1.0f, sl->s, BC,
                        dO, lddo, 1.0f, dV, (int)D);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)c, (int)D, (int)r, 1.0f, sl->dp, BC,
                        Q, ldq, 1.0f, dK, (int)D);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)D, (int)c, 1.0f, sl->dp, BC,
                        K, ldk, 1.0f, dQ + qb * D, (int)D);
        }
    }
    const size_t es = p->dtype == LT_DTYPE_F32 ? 4 : 2;
    const int64_t off = lt_attn_off(&p->kv_layout, b, ka, kvh);
    lt_attn_store((char *)a->dk + off * (int64_t)es, p->dtype, p->kv_layout.token, dK, c, D, p->scale);
    lt_attn_store((char *)a->dv + off * (int64_t)es, p->dtype, p->kv_layout.token, dV, c, D, 1.0f);
}

/* Bucket i of the running (row, kv head): its key tiles i, i + DQ_BUCKETS, ... in ascending order. */
static void bwd_item(void *ctx, int64_t i, int slot) {
    const flash_job *j = ctx;
    flash_slot sl = slot_of(j, slot);
    sl.dq = j->dq + (size_t)i * lt_attn_round(dq_bucket_floats(j->p));
    memset(sl.dq, 0, dq_bucket_floats(j->p) * sizeof(float));
    for (int64_t t0 = i * BC; t0 < j->p->T; t0 += DQ_BUCKETS * BC)
        for_segments(j, &sl, j->b, j->kvh, t0, t0 + BC < j->p->T ? t0 + BC : j->p->T, bwd_seg);
}

/* dQ rows [begin, end) of the running (row, kv head): the buckets summed in index order, scaled. */
static void dq_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const flash_job *j = arg;
    const lt_attention_params *p = j->p;
    const int64_t D = p->D;
    const size_t stride = lt_attn_round(dq_bucket_floats(p));
    const size_t es = p->dtype == LT_DTYPE_F32 ? 4 : 2;
    for (int64_t x = begin; x < end; x++) {
        const int64_t g = x / p->T, t = x % p->T;
        float *acc = j->dq + (size_t)x * (size_t)D;
        for (int nb = 1; nb < DQ_BUCKETS; nb++) {
            const float *part = j->dq + (size_t)nb * stride + (size_t)x * (size_t)D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) acc[d] += part[d];
        }
        const int64_t off = lt_attn_off(&p->q_layout, j->b, t, j->kvh * j->group + g);
        lt_attn_store((char *)j->a->dq + off * (int64_t)es, p->dtype, p->q_layout.token, acc, 1, D, p->scale);
    }
}

typedef struct {
    const lt_attention_params *p;
    const lt_attention_args *a;
    float *dvec;
} dvec_job;

/* D_i = sum_d dO_id O_id for rows [begin, end) of (B, T), all heads. */
static void dvec_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const dvec_job *j = arg;
    const lt_attention_params *p = j->p;
    for (int64_t bt = begin; bt < end; bt++) {
        const int64_t b = bt / p->T, t = bt % p->T;
        for (int64_t h = 0; h < p->H; h++) {
            const int64_t off = lt_attn_off(&p->o_layout, b, t, h);
            float sum = 0;
            if (p->dtype == LT_DTYPE_F32) {
                const float *o = (const float *)j->a->out + off, *g = (const float *)j->a->dout + off;
#pragma omp simd reduction(+ : sum)
                for (int64_t d = 0; d < p->D; d++) sum += o[d] * g[d];
            } else {
                const uint16_t *o = (const uint16_t *)j->a->out + off, *g = (const uint16_t *)j->a->dout + off;
#pragma omp simd reduction(+ : sum)
                for (int64_t d = 0; d < p->D; d++) sum += lt_attn_bf16(o[d]) * lt_attn_bf16(g[d]);
            }
            j->dvec[(b * p->H + h) * p->T + t] = sum;
        }
    }
}

lt_status lt_attention_flash_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    const int threads = lt_ctx_threads(ctx);
    float *dvec = a->workspace;
    flash_job j = {.p = p, .a = a, .slots = dvec + flash_shared_floats(p, 1),
                   .slot_floats = flash_carve(p, 1, NULL, NULL), .dvec = dvec,
                   .dq = dvec + lt_attn_round((size_t)(p->B * p->H * p->T)), .group = p->H / p->Hkv,
                   .backward = 1};
    dvec_job dj = {.p = p, .a = a, .dvec = dvec};
    lt_parallel_for(threads, p->B * p->T, 256, dvec_rows, &dj);
    const int slots = flash_slots(p, 1, threads);
    for (j.b = 0; j.b < p->B; j.b++)
        for (j.kvh = 0; j.kvh < p->Hkv; j.kvh++) {
            lt_attn_schedule(slots, DQ_BUCKETS, bwd_item, &j);
            lt_parallel_for(threads, j.group * p->T, 64, dq_rows, &j);
        }
    return LT_OK;
}
