/* Naive attention on the CPU: materialises the (T, T) scores of a head, applies the causal /
 * window / packed mask element by element from its definition, and takes the softmax with libm's
 * expf. It is the oracle the flash kernels are compared with and the "materialised" arm of the
 * benchmark; it deliberately skips no work and saves no memory. The forward keeps the scores of
 * every (b, h) at once, as an autograd graph would; the backward recomputes them (ignoring lse). */
#include <cblas.h>
#include <math.h>

#include "backend/cpu/attention_cpu.h"

/* Query q sees key k: same sequence, not in the future, inside the window. */
static int visible(int64_t q, int64_t k, int64_t seq_start, int64_t window) {
    return k >= seq_start && k <= q && (window == 0 || q - k < window);
}

static size_t td(const lt_attention_params *p) { return lt_attn_round((size_t)(p->T * p->D)); }
static size_t tt(const lt_attention_params *p) {
    size_t n;
    if (__builtin_mul_overflow((size_t)p->T, (size_t)p->T, &n)) return SIZE_MAX / 8;
    return lt_attn_round(n);
}

/* Forward: shared scores (B*H, T, T), per slot Q, K, V, O (T, D). Backward: per slot Q, O, dO,
 * dQ, K, V, dK, dV (T, D) and P, dP (T, T). */
static size_t naive_floats(const lt_attention_params *p, int backward, int threads, size_t *shared, size_t *per) {
    const int slots = lt_attn_slots(threads, backward ? p->B * p->Hkv : p->B * p->H);
    size_t sh = 0, pe, t;
    if (!backward) {
        if (__builtin_mul_overflow((size_t)(p->B * p->H), tt(p), &sh)) return SIZE_MAX;
        pe = 4 * td(p);
    } else {
        if (__builtin_mul_overflow(2, tt(p), &pe) || __builtin_add_overflow(pe, 8 * td(p), &pe)) return SIZE_MAX;
    }
    if (shared) *shared = sh;
    if (per) *per = pe;
    if (__builtin_mul_overflow((size_t)slots, pe, &t) || __builtin_add_overflow(t, sh, &t)) return SIZE_MAX;
    return t;
}

size_t lt_attention_naive_workspace_bytes(const lt_attention_params *p, int backward, int threads) {
    size_t f = naive_floats(p, backward, threads, NULL, NULL), bytes;
    if (f == SIZE_MAX || __builtin_mul_overflow(f, sizeof(float), &bytes)) return SIZE_MAX;
    return bytes;
}

typedef struct {
    const lt_attention_params *p;
    const lt_attention_args *a;
    float *shared, *slots;
    size_t per;
} naive_job;

static void load_head(float *dst, const void *base, const lt_attention_params *p, const lt_attention_layout *l,
                      int64_t b, int64_t h) {
    lt_attn_load(dst, lt_attn_at(base, p->dtype, lt_attn_off(l, b, 0, h)), p->dtype, l->token, p->T, p->D);
}

static void store_head(void *base, const lt_attention_params *p, const lt_attention_layout *l, int64_t b, int64_t h,
                       const float *src, float mul) {
    void *dst = (char *)base + lt_attn_off(l, b, 0, h) * (p->dtype == LT_DTYPE_F32 ? 4 : 2);
    lt_attn_store(dst, p->dtype, l->token, src, p->T, p->D, mul);
}

/* Scores of head (b, h) with Q, K loaded: S = cap(scale Q K^T), invisible entries -inf. */
static void scores(const lt_attention_params *p, int64_t b, const float *Q, const float *K, float *S) {
    const int64_t T = p->T;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)p->D, p->scale, Q, (int)p->D, K,
                (int)p->D, 0.0f, S, (int)T);
    for (int64_t q = 0; q < T; q++) {
        int64_t s0, s1;
        lt_attn_seq(p, b, q, &s0, &s1);
        float *row = S + q * T;
        for (int64_t k = 0; k < T; k++) {
            if (!visible(q, k, s0, p->window)) row[k] = -INFINITY;
            else if (p->softcap > 0) row[k] = p->softcap * tanhf(row[k] / p->softcap);
        }
    }
}

/* Row softmax in place; returns the row's log-sum-exp. Every row has a visible key (itself). */
static float softmax_row(float *row, int64_t n) {
    float mx = -INFINITY, sum = 0;
    for (int64_t k = 0; k < n; k++) mx = row[k] > mx ? row[k] : mx;
    for (int64_t k = 0; k < n; k++) {
        row[k] = row[k] == -INFINITY ? 0.0f : expf(row[k] - mx);
        sum += row[k];
    }
    for (int64_t k = 0; k < n; k++) row[k] /= sum;
    return mx + logf(sum);
}

static void fwd_item(void *ctx, int64_t i, int slot) {
    const naive_job *j = ctx;
    const lt_attention_params *p = j->p;
    const int64_t T = p->T, D = p->D, b = i / p->H, h = i % p->H, kvh = h / (p->H / p->Hkv);
    float *Q = j->slots + (size_t)slot * j->per, *K = Q + td(p), *V = K + td(p), *O = V + td(p);
    float *S = j->shared + (size_t)i * tt(p);
    load_head(Q, j->a->q, p, &p->q_layout, b, h);
    load_head(K, j->a->k, p, &p->kv_layout, b, kvh);
    load_head(V, j->a->v, p, &p->kv_layout, b, kvh);
    scores(p, b, Q, K, S);
    float *lse = j->a->lse + (b * p->H + h) * T;
    for (int64_t q = 0; q < T; q++) lse[q] = softmax_row(S + q * T, T);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)D, (int)T, 1.0f, S, (int)T, V, (int)D, 0.0f, O,
                (int)D);
    store_head(j->a->out, p, &p->o_layout, b, h, O, 1.0f);
}

lt_status lt_attention_naive_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    const int threads = lt_ctx_threads(ctx);
    size_t shared = 0, per = 0;
    naive_floats(p, 0, threads, &shared, &per);
    naive_job j = {.p = p, .a = a, .shared = a->workspace, .slots = (float *)a->workspace + shared, .per = per};
    lt_attn_schedule(lt_attn_slots(threads, p->B * p->H), p->B * p->H, fwd_item, &j);
    return LT_OK;
}

static void bwd_item(void *ctx, int64_t i, int slot) {
    const naive_job *j = ctx;
    const lt_attention_params *p = j->p;
    const lt_attention_args *a = j->a;
    const int64_t T = p->T, D = p->D, b = i / p->Hkv, kvh = i % p->Hkv, group = p->H / p->Hkv;
    float *Q = j->slots + (size_t)slot * j->per, *O = Q + td(p), *dO = O + td(p), *dQ = dO + td(p);
    float *K = dQ + td(p), *V = K + td(p), *dK = V + td(p), *dV = dK + td(p);
    float *P = dV + td(p), *dP = P + tt(p);
    load_head(K, a->k, p, &p->kv_layout, b, kvh);
    load_head(V, a->v, p, &p->kv_layout, b, kvh);
    memset(dK, 0, (size_t)(T * D) * sizeof(float));
    memset(dV, 0, (size_t)(T * D) * sizeof(float));
    for (int64_t g = 0; g < group; g++) {
        const int64_t h = kvh * group + g;
        load_head(Q, a->q, p, &p->q_layout, b, h);
        load_head(O, a->out, p, &p->o_layout, b, h);
        load_head(dO, a->dout, p, &p->o_layout, b, h);
        scores(p, b, Q, K, P);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)D, 1.0f, dO, (int)D, V, (int)D, 0.0f,
                    dP, (int)T);
        for (int64_t q = 0; q < T; q++) {
            float *prow = P + q * T, *drow = dP + q * T, Di = 0, mx = -INFINITY, sum = 0;
            for (int64_t d = 0; d < D; d++) Di += dO[q * D + d] * O[q * D + d];
            for (int64_t k = 0; k < T; k++) mx = prow[k] > mx ? prow[k] : mx;
            for (int64_t k = 0; k < T; k++) sum += prow[k] == -INFINITY ? 0.0f : expf(prow[k] - mx);
            for (int64_t k = 0; k < T; k++) {
                const float sc = prow[k];
                const float pk = sc == -INFINITY ? 0.0f : expf(sc - mx) / sum;
                /* cap'(s) = 1 - tanh^2 = 1 - (capped / cap)^2. */
                const float t = p->softcap > 0 && pk > 0 ? sc / p->softcap : 0.0f;
                drow[k] = pk * (drow[k] - Di) * (1.0f - t * t);
                prow[k] = pk;
            }
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)D, (int)T, 1.0f, P, (int)T, dO, (int)D, 1.0f,
                    dV, (int)D);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)D, (int)T, 1.0f, dP, (int)T, K, (int)D,
                    0.0f, dQ, (int)D);
        store_head(a->dq, p, &p->q_layout, b, h, dQ, p->scale);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)D, (int)T, 1.0f, dP, (int)T, Q, (int)D, 1.0f,
                    dK, (int)D);
    }
    store_head(a->dk, p, &p->kv_layout, b, kvh, dK, p->scale);
    store_head(a->dv, p, &p->kv_layout, b, kvh, dV, 1.0f);
}

lt_status lt_attention_naive_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    const int threads = lt_ctx_threads(ctx);
    size_t per = 0;
    naive_floats(p, 1, threads, NULL, &per);
    naive_job j = {.p = p, .a = a, .shared = NULL, .slots = a->workspace, .per = per};
    lt_attn_schedule(lt_attn_slots(threads, p->B * p->Hkv), p->B * p->Hkv, bwd_item, &j);
    return LT_OK;
}
