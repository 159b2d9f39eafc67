/* Ring attention on the host: the zig-zag split, the forward (online softmax over the key/value
 * blocks as they come round the ring) and the backward (the blocks travel with their dK/dV
 * accumulators and return home after a full turn). Exchanges are the communicator's blocking
 * sendrecv after each block's compute, so communication is not overlapped with compute here; the
 * inner loops are plain C over one kv-head group per thread, written to be checked, not to be fast. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/parallel.h"
#include "longtune/alloc.h"
#include "longtune/context_parallel.h"

int64_t lt_cp_zigzag_position(int64_t T, int world, int rank, int64_t i) {
    int64_t c = T / (2 * (int64_t)world);
    int64_t chunk = i < c ? rank : 2 * (int64_t)world - 1 - rank;
    return chunk * c + (i < c ? i : i - c);
}

void lt_cp_zigzag_scatter(const float *full, float *local, int64_t T, int world, int rank, int64_t row_elems) {
    for (int64_t i = 0; i < T / world; i++)
        memcpy(local + i * row_elems, full + lt_cp_zigzag_position(T, world, rank, i) * row_elems,
               (size_t)row_elems * sizeof(float));
}

void lt_cp_zigzag_gather(const float *local, float *full, int64_t T, int world, int rank, int64_t row_elems) {
    for (int64_t i = 0; i < T / world; i++)
        memcpy(full + lt_cp_zigzag_position(T, world, rank, i) * row_elems, local + i * row_elems,
               (size_t)row_elems * sizeof(float));
}

lt_status lt_cp_attention_check(lt_ctx *ctx, const lt_comm *comm, const lt_cp_attention_params *p) {
    int world = lt_comm_size(comm);
    if (!p || p->T <= 0 || p->H <= 0 || p->Hkv <= 0 || p->D <= 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "context parallel: shapes must be positive");
    if (p->H % p->Hkv)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "context parallel: H = %lld is not a multiple of Hkv = %lld",
                        (long long)p->H, (long long)p->Hkv);
    if (p->T % (2 * (int64_t)world))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "context parallel: T = %lld is not a multiple of 2·world = %d (the zig-zag split's chunks)",
                        (long long)p->T, 2 * world);
    if (!(p->scale >= 0) || isinf(p->scale))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "context parallel: scale %g", (double)p->scale);
    if (p->T > ((int64_t)1 << 40) || p->H * p->D > ((int64_t)1 << 24) || p->Hkv * p->D > ((int64_t)1 << 24))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "context parallel: shapes (T %lld, H %lld, D %lld) beyond the limits",
                        (long long)p->T, (long long)p->H, (long long)p->D);
    if (lt_comm_device(comm) != LT_DEVICE_CPU)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "context parallel: ring attention runs on host buffers; the %s "
                        "communicator takes device buffers",
                        lt_comm_backend_name(lt_comm_get_backend(comm)));
    return LT_OK;
}

/* Floats of one key/value block (k and v of T/world tokens) and of the statistics. */
static size_t kv_floats(const lt_cp_attention_params *p, int world) {
    return (size_t)(p->T / world) * (size_t)(p->Hkv * p->D);
}

size_t lt_cp_attention_workspace_bytes(const lt_cp_attention_params *p, int world, int backward) {
    if (!p || world < 1 || p->T <= 0 || p->T > ((int64_t)1 << 40) || p->Hkv * p->D > ((int64_t)1 << 24) ||
        p->H > ((int64_t)1 << 24))
        return SIZE_MAX;
    /* Forward: current and next block of (k, v); m and l per query row. Backward: current and next
     * block of (k, v, dk, dv); delta per query row. */
    size_t blocks = (size_t)(backward ? 8 : 4) * kv_floats(p, world);
    size_t rows = (size_t)(backward ? 1 : 2) * (size_t)p->H * (size_t)(p->T / world);
    return lt_alloc_accounted_size(LT_DEVICE_CPU, blocks * sizeof(float)) +
        lt_alloc_accounted_size(LT_DEVICE_CPU, rows * sizeof(float));
}

/* One block pair: local query chunk at local offset qo (c tokens) against key chunk at offset ko
 * of the block in hand; causal = the same whole-sequence chunk (the diagonal), else every key is
 * earlier than every query. */
typedef struct pair {
    int64_t qo, ko;
    int causal;
} pair;

/* The pairs of local chunks (r, 2W-1-r) with the chunks (s, 2W-1-s) of the block from rank s whose
 * keys some query may see; returns how many (at most 4). */
static int block_pairs(int world, int rank, int src, int64_t c, pair out[4]) {
    int64_t qg[2] = {rank, 2 * (int64_t)world - 1 - rank}, kg[2] = {src, 2 * (int64_t)world - 1 - src};
    int n = 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            if (kg[b] <= qg[a]) out[n++] = (pair){a * c, b * c, kg[b] == qg[a]};
    return n;
}

typedef struct fwd_job {
    const lt_cp_attention_params *p;
    int64_t Tl, c, group;
    float scale;
    const float *q, *kb, *vb; /* kb, vb: the block in hand, (Tl, Hkv, D) */
    float *o, *m, *l;         /* o unnormalised (Tl, H, D); m, l (H, Tl) */
    pair pr[4];
    int npr;
} fwd_job;

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Online softmax update of every query row of the pairs, kv heads [g0, g1). */
static void fwd_range(void *arg, int64_t g0, int64_t g1, int thread) {
    (void)thread;
    const fwd_job *j = arg;
    const int64_t H = j->p->H, Hkv = j->p->Hkv, D = j->p->D, c = j->c, Tl = j->Tl;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t h = g * j->group; h < (g + 1) * j->group; h++)
            for (int x = 0; x < j->npr; x++) {
                const pair *pr = &j->pr[x];
                for (int64_t i = 0; i < c; i++) {
                    int64_t qi = pr->qo + i, nk = pr->causal ? i + 1 : c;
                    const float *qv = j->q + (qi * H + h) * D;
                    float mx = -INFINITY;
                    for (int64_t t = 0; t < nk; t++) {
                        float s = dot(qv, j->kb + ((pr->ko + t) * Hkv + g) * D, D) * j->scale;
                        mx = s > mx ? s : mx;
                    }
                    float *m = &j->m[h * Tl + qi], *l = &j->l[h * Tl + qi], *o = j->o + (qi * H + h) * D;
                    float mn = mx > *m ? mx : *m;
                    float alpha = *m == -INFINITY ? 0.0f : expf(*m - mn);
                    for (int64_t d = 0; d < D; d++) o[d] *= alpha;
                    float sum = *l * alpha;
                    for (int64_t t = 0; t < nk; t++) {
                        int64_t kt = pr->ko + t;
                        float e = expf(dot(qv, j->kb + (kt * Hkv + g) * D, D) * j->scale - mn);
                        sum += e;
                        const float *vv = j->vb + (kt * Hkv + g) * D;
                        for (int64_t d = 0; d < D; d++) o[d] += e * vv[d];
                    }
                    *m = mn;
                    *l = sum;
                }
            }
}

static float resolved_scale(const lt_cp_attention_params *p) {
    return p->scale > 0 ? p->scale : (float)(1.0 / sqrt((double)p->D));
}

lt_status lt_cp_attention_forward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const float *q,
                                  const float *k, const float *v, float *out, float *lse) {
    LT_TRY(lt_cp_attention_check(ctx, comm, p));
    const int world = lt_comm_size(comm), rank = lt_comm_rank(comm);
    const int64_t Tl = p->T / world, c = Tl / 2, H = p->H, D = p->D;
    const size_t n = kv_floats(p, world), rows = (size_t)(H * Tl);
    size_t bb = 4 * n * sizeof(float), sb = 2 * rows * sizeof(float);
    float *blk = lt_alloc(ctx, LT_DEVICE_CPU, bb, "ring attention key/value blocks");
    float *st = lt_alloc(ctx, LT_DEVICE_CPU, sb, "ring attention row statistics");
    lt_status s = LT_OK;
    if (!blk || !st) {
        s = LT_ERR_OOM;
        goto done;
    }
    float *cur = blk, *nxt = blk + 2 * n;
    memcpy(cur, k, n * sizeof(float));
    memcpy(cur + n, v, n * sizeof(float));
    fwd_job j = {.p = p,
                 .Tl = Tl,
                 .c = c,
                 .group = H / p->Hkv,
                 .scale = resolved_scale(p),
                 .q = q,
                 .o = out,
                 .m = st,
                 .l = st + rows};
    for (size_t i = 0; i < rows; i++) j.m[i] = -INFINITY, j.l[i] = 0;
    memset(out, 0, (size_t)(Tl * H * D) * sizeof(float));
    for (int step = 0; step < world; step++) {
        int src = ((rank - step) % world + world) % world;
        j.kb = cur;
        j.vb = cur + n;
        j.npr = block_pairs(world, rank, src, c, j.pr);
        lt_parallel_for(lt_ctx_threads(ctx), p->Hkv, 1, fwd_range, &j);
        if (step + 1 < world) {
            s = lt_comm_sendrecv(ctx, comm, cur, 2 * n * sizeof(float), (rank + 1) % world, nxt, 2 * n * sizeof(float),
                                 (rank + world - 1) % world);
            if (s != LT_OK) goto done;
            float *t = cur;
            cur = nxt, nxt = t;
        }
    }
    /* Every row saw at least its own key (the diagonal chunk comes at step 0), so l > 0. */
    for (int64_t i = 0; i < Tl; i++)
        for (int64_t h = 0; h < H; h++) {
            float l = j.l[h * Tl + i], inv = 1.0f / l, *o = out + (i * H + h) * D;
            for (int64_t d = 0; d < D; d++) o[d] *= inv;
            lse[h * Tl + i] = j.m[h * Tl + i] + logf(l);
        }
done:
    if (blk) lt_free(ctx, LT_DEVICE_CPU, blk, bb);
    if (st) lt_free(ctx, LT_DEVICE_CPU, st, sb);
    return s;
}

typedef struct bwd_job {
    const lt_cp_attention_params *p;
    int64_t Tl, c, group;
    float scale;
    const float *q, *lse, *dout, *delta;
    const float *kb, *vb; /* the block in hand */
    float *dkb, *dvb;     /* its travelling gradients */
    float *dq;
    pair pr[4];
    int npr;
} bwd_job;

static void bwd_range(void *arg, int64_t g0, int64_t g1, int thread) {
    (void)thread;
    const bwd_job *j = arg;
    const int64_t H = j->p->H, Hkv = j->p->Hkv, D = j->p->D, c = j->c, Tl = j->Tl;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t h = g * j->group; h < (g + 1) * j->group; h++)
            for (int x = 0; x < j->npr; x++) {
                const pair *pr = &j->pr[x];
                for (int64_t i = 0; i < c; i++) {
                    int64_t qi = pr->qo + i, nk = pr->causal ? i + 1 : c;
                    const float *qv = j->q + (qi * H + h) * D, *dov = j->dout + (qi * H + h) * D;
                    float *dqv = j->dq + (qi * H + h) * D;
                    float lse = j->lse[h * Tl + qi], delta = j->delta[h * Tl + qi];
                    for (int64_t t = 0; t < nk; t++) {
                        size_t kv = (size_t)(((pr->ko + t) * Hkv + g) * D);
                        float pij = expf(dot(qv, j->kb + kv, D) * j->scale - lse);
                        float ds = pij * (dot(dov, j->vb + kv, D) - delta) * j->scale;
                        for (int64_t d = 0; d < D; d++) {
                            dqv[d] += ds * j->kb[kv + (size_t)d];
                            j->dkb[kv + (size_t)d] += ds * qv[d];
                            j->dvb[kv + (size_t)d] += pij * dov[d];
                        }
                    }
                }
            }
}

lt_status lt_cp_attention_backward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const float *q,
                                   const float *k, const float *v, const float *out, const float *lse,
                                   const float *dout, float *dq, float *dk, float *dv) {
    LT_TRY(lt_cp_attention_check(ctx, comm, p));
    const int world = lt_comm_size(comm), rank = lt_comm_rank(comm);
    const int64_t Tl = p->T / world, c = Tl / 2, H = p->H, D = p->D;
    const size_t n = kv_floats(p, world), rows = (size_t)(H * Tl);
    size_t bb = 8 * n * sizeof(float), sb = rows * sizeof(float);
    float *blk = lt_alloc(ctx, LT_DEVICE_CPU, bb, "ring attention key/value/gradient blocks");
    float *delta = lt_alloc(ctx, LT_DEVICE_CPU, sb, "ring attention row deltas");
    lt_status s = LT_OK;
    if (!blk || !delta) {
        s = LT_ERR_OOM;
        goto done;
    }
    /* delta_i = dout_i · out_i: the softmax backward's row term, local to each query. */
    for (int64_t i = 0; i < Tl; i++)
        for (int64_t h = 0; h < H; h++) {
            double acc = 0;
            for (int64_t d = 0; d < D; d++) acc += (double)dout[(i * H + h) * D + d] * out[(i * H + h) * D + d];
            delta[h * Tl + i] = (float)acc;
        }
    float *cur = blk, *nxt = blk + 4 * n;
    memcpy(cur, k, n * sizeof(float));
    memcpy(cur + n, v, n * sizeof(float));
    memset(cur + 2 * n, 0, 2 * n * sizeof(float));
    memset(dq, 0, (size_t)(Tl * H * D) * sizeof(float));
    bwd_job j = {.p = p,
                 .Tl = Tl,
                 .c = c,
                 .group = H / p->Hkv,
                 .scale = resolved_scale(p),
                 .q = q,
                 .lse = lse,
                 .dout = dout,
                 .delta = delta,
                 .dq = dq};
    const int right = (rank + 1) % world, left = (rank + world - 1) % world;
    for (int step = 0; step < world; step++) {
        int src = ((rank - step) % world + world) % world;
        j.kb = cur, j.vb = cur + n, j.dkb = cur + 2 * n, j.dvb = cur + 3 * n;
        j.npr = block_pairs(world, rank, src, c, j.pr);
        lt_parallel_for(lt_ctx_threads(ctx), p->Hkv, 1, bwd_range, &j);
        if (world == 1) break;
        /* The last hop carries only the gradients, back to the block's owner. */
        size_t off = step + 1 < world ? 0 : 2 * n, cnt = (4 * n - off) * sizeof(float);
        s = lt_comm_sendrecv(ctx, comm, cur + off, cnt, right, nxt + off, cnt, left);
        if (s != LT_OK) goto done;
        float *t = cur;
        cur = nxt, nxt = t;
    }
    memcpy(dk, cur + 2 * n, n * sizeof(float));
    memcpy(dv, cur + 3 * n, n * sizeof(float));
done:
    if (blk) lt_free(ctx, LT_DEVICE_CPU, blk, bb);
    if (delta) lt_free(ctx, LT_DEVICE_CPU, delta, sb);
    return s;
}
