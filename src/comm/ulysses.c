/* Ulysses context-parallel attention: each rank holds T/world tokens (the zig-zag split of
 * ring_attention.c) of every head; an all-to-all over heads gives it all T tokens of H/world query
 * heads and their Hkv/world key/value heads (GQA groups stay on one rank), the unchanged causal
 * attention kernel of the device runs on them, and a second all-to-all brings the output home. The
 * backward mirrors it. Buffers live where the communicator's collectives take them (host: MPI or
 * self; CUDA: NCCL), in f32 or bf16, so the same code serves the CPU reference and the GPU. Not here: packed rows,
 * overlap of the all-to-all with the kernel, or H/world not a multiple of H/Hkv (that is ring's). */
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/context_parallel.h"

/* Pieces per exchange are 2·world on each side (two chunks per peer). */
#define MAX_WORLD 256

typedef struct uly {
    int64_t T, Tl, c, H, Hs, Hkv, Hks, D;
    int world, rank;
    lt_device dev;
    size_t es; /* bytes per element of the attention tensors (f32 4, bf16 2) */
} uly;

static uly shape(const lt_comm *comm, const lt_cp_attention_params *p) {
    uly u;
    u.world = lt_comm_size(comm), u.rank = lt_comm_rank(comm);
    u.T = p->T, u.Tl = p->T / u.world, u.c = u.Tl / 2;
    u.H = p->H, u.Hs = p->H / u.world, u.Hkv = p->Hkv, u.Hks = p->Hkv / u.world, u.D = p->D;
    u.dev = lt_comm_device(comm);
    u.es = p->dtype == LT_DTYPE_BF16 ? 2 : 4;
    return u;
}

int lt_cp_env_forced(void) {
    const char *force = getenv("LONGTUNE_CP");
    return force && (!strcmp(force, "ring") || !strcmp(force, "ulysses"));
}

int lt_cp_choose(const lt_cp_attention_params *p, int world, lt_device dev) {
    if (!p || world < 1 || p->Hkv <= 0) return -1;
    const char *force = getenv("LONGTUNE_CP");
    int uly_ok = p->Hkv % world == 0 && world <= MAX_WORLD, ring_ok = dev == LT_DEVICE_CPU;
    if (force && !strcmp(force, "ring")) return ring_ok ? LT_CP_RING : -1;
    if (force && !strcmp(force, "ulysses")) return uly_ok ? LT_CP_ULYSSES : -1;
    return uly_ok ? LT_CP_ULYSSES : ring_ok ? LT_CP_RING : -1;
}

static lt_attention_params attn(const uly *u, const lt_cp_attention_params *p) {
    lt_attention_params ap;
    memset(&ap, 0, sizeof ap);
    ap.B = 1, ap.T = u->T, ap.H = u->Hs, ap.Hkv = u->Hks, ap.D = u->D;
    ap.dtype = u->es == 2 ? LT_DTYPE_BF16 : LT_DTYPE_F32;
    ap.device = u->dev;
    ap.impl = p->impl;
    ap.scale = p->scale;
    return ap;
}

lt_status lt_cp_ulysses_check(lt_ctx *ctx, const lt_comm *comm, const lt_cp_attention_params *p) {
    int world = lt_comm_size(comm);
    if (!p || p->T <= 0 || p->H <= 0 || p->Hkv <= 0 || p->D <= 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "context parallel (Ulysses): shapes must be positive");
    if (p->H % p->Hkv)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "context parallel (Ulysses): H = %lld is not a multiple of Hkv = %lld",
                        (long long)p->H, (long long)p->Hkv);
    if (p->dtype != LT_DTYPE_F32 && p->dtype != LT_DTYPE_BF16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "context parallel (Ulysses): dtype %s (f32, bf16)",
                        lt_dtype_name(p->dtype));
    if (world > MAX_WORLD || p->Hkv % world)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "context parallel (Ulysses): Hkv = %lld key/value heads cannot be split over %d ranks "
                        "(each rank takes whole GQA groups; at most %d ranks)",
                        (long long)p->Hkv, world, MAX_WORLD);
    if (p->T % (2 * (int64_t)world))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "context parallel (Ulysses): T = %lld is not a multiple of 2·world = %d (the zig-zag split)",
                        (long long)p->T, 2 * world);
    if (p->T > ((int64_t)1 << 31) || p->H * p->D > ((int64_t)1 << 24))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "context parallel (Ulysses): shapes (T %lld, H %lld, D %lld) beyond "
                        "the limits",
                        (long long)p->T, (long long)p->H, (long long)p->D);
    uly u = shape(comm, p);
    lt_attention_params ap = attn(&u, p);
    return lt_attention_check(ctx, &ap);
}

/* Byte offsets of the workspace pieces. */
/* No staging buffer of its own: a transpose stages through a head-layout buffer of the same
 * size (T·H/world = T/world·H elements) that is dead at that moment: before the kernel, the one
 * it will write (oh forward, dqh backward); after it, qh. */
typedef struct carve {
    size_t qh, kh, vh, oh, doh, dqh, dkh, dvh, attn, attn_bytes, total;
} carve;

static size_t add(size_t *cur, size_t bytes, size_t al) {
    if (*cur == SIZE_MAX || bytes > SIZE_MAX - al || *cur > SIZE_MAX - (bytes + al)) {
        *cur = SIZE_MAX;
        return 0;
    }
    size_t at = (*cur + al - 1) / al * al;
    *cur = at + bytes;
    return at;
}

static carve layout(const uly *u, const lt_cp_attention_params *p, int threads) {
    carve w;
    memset(&w, 0, sizeof w);
    const size_t al = 256, q = (size_t)(u->T * u->Hs * u->D) * u->es, kv = (size_t)(u->T * u->Hks * u->D) * u->es;
    size_t cur = 0;
    w.qh = add(&cur, q, al), w.kh = add(&cur, kv, al), w.vh = add(&cur, kv, al), w.oh = add(&cur, q, al);
    w.doh = add(&cur, q, al), w.dqh = add(&cur, q, al), w.dkh = add(&cur, kv, al), w.dvh = add(&cur, kv, al);
    lt_attention_params ap = attn(u, p);
    size_t a0 = lt_attention_workspace_bytes(&ap, 0, threads), a1 = lt_attention_workspace_bytes(&ap, 1, threads);
    w.attn_bytes = a0 > a1 ? a0 : a1;
    w.attn = add(&cur, w.attn_bytes, al);
    w.total = cur;
    return w;
}

size_t lt_cp_ulysses_workspace_bytes(const lt_cp_attention_params *p, int world, lt_device dev, int threads) {
    if (!p || world < 1 || world > MAX_WORLD || p->T <= 0 || p->H <= 0 || p->Hkv <= 0 || p->D <= 0 ||
        (p->dtype != LT_DTYPE_F32 && p->dtype != LT_DTYPE_BF16) || p->Hkv % world || p->H % p->Hkv ||
        p->T % (2 * (int64_t)world) || p->T > ((int64_t)1 << 31) || p->H * p->D > ((int64_t)1 << 24))
        return SIZE_MAX;
    uly u;
    u.world = world, u.rank = 0, u.T = p->T, u.Tl = p->T / world, u.c = u.Tl / 2;
    u.H = p->H, u.Hs = p->H / world, u.Hkv = p->Hkv, u.Hks = p->Hkv / world, u.D = p->D, u.dev = dev;
    u.es = p->dtype == LT_DTYPE_BF16 ? 2 : 4;
    carve w = layout(&u, p, threads);
    return w.attn_bytes == SIZE_MAX ? SIZE_MAX : w.total;
}

/* The all-to-all over heads. E: bytes of one token's heads on one rank (heads/world · D · es).
 * to_heads: local (Tl, heads, D) -> stage (world, Tl, E) -> head (T, heads/world, D) in
 * whole-sequence order: the two zig-zag chunks of rank i land at chunks i and 2·world-1-i. */
static void zigzag_pieces(const uly *u, size_t ch, lt_comm_piece *by_rank, lt_comm_piece *by_position) {
    /* by_rank: the two chunks of every rank in the order the stage holds them; by_position: the same
     * chunks at their places in the whole sequence (rank j's at j and 2·world-1-j). */
    for (int j = 0; j < u->world; j++) {
        by_rank[2 * j] = (lt_comm_piece){j, (size_t)(2 * j) * ch, ch};
        by_rank[2 * j + 1] = (lt_comm_piece){j, (size_t)(2 * j + 1) * ch, ch};
        by_position[2 * j] = (lt_comm_piece){j, (size_t)j * ch, ch};
        by_position[2 * j + 1] = (lt_comm_piece){j, (size_t)(2 * u->world - 1 - j) * ch, ch};
    }
}

static lt_status to_heads(lt_ctx *ctx, lt_comm *comm, const uly *u, const void *local, void *stage, void *head,
                          int64_t heads) {
    const size_t E = (size_t)(heads / u->world * u->D) * u->es, total = (size_t)u->T * E;
    LT_TRY(lt_comm_transpose(ctx, comm, stage, local, u->Tl, u->world, E));
    lt_comm_piece sp[2 * MAX_WORLD], rp[2 * MAX_WORLD];
    zigzag_pieces(u, (size_t)u->c * E, sp, rp);
    return lt_comm_exchange(ctx, comm, stage, total, sp, 2 * u->world, head, total, rp, 2 * u->world);
}

/* The reverse: head (T, heads/world, D) -> stage (world, Tl, E) -> local (Tl, heads, D). */
static lt_status from_heads(lt_ctx *ctx, lt_comm *comm, const uly *u, const void *head, void *stage, void *local,
                            int64_t heads) {
    const size_t E = (size_t)(heads / u->world * u->D) * u->es, total = (size_t)u->T * E;
    lt_comm_piece sp[2 * MAX_WORLD], rp[2 * MAX_WORLD];
    zigzag_pieces(u, (size_t)u->c * E, rp, sp);
    LT_TRY(lt_comm_exchange(ctx, comm, head, total, sp, 2 * u->world, stage, total, rp, 2 * u->world));
    return lt_comm_transpose(ctx, comm, local, stage, u->world, u->Tl, E);
}

static lt_status check_ws(lt_ctx *ctx, const carve *w, void *ws, size_t ws_bytes) {
    if (w->total == SIZE_MAX || w->attn_bytes == SIZE_MAX || !ws || ws_bytes < w->total)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "context parallel (Ulysses): workspace of %zu bytes, %zu needed",
                        ws_bytes, w->total);
    return LT_OK;
}

#define AT(off) ((void *)((uint8_t *)ws + (off)))

/* Shared start of both passes: checks, the workspace's carving, q/k/v exchanged into head layout
 * (through `stage`, a region the kernel writes only after the exchanges) and the attention call's
 * q/k/v and workspace set. */
static lt_status heads_in(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const void *q, const void *k,
                          const void *v, void *ws, size_t ws_bytes, int threads, int backward, uly *u, carve *w,
                          lt_attention_args *aa) {
    LT_TRY(lt_cp_ulysses_check(ctx, comm, p));
    *u = shape(comm, p);
    *w = layout(u, p, threads);
    LT_TRY(check_ws(ctx, w, ws, ws_bytes));
    void *stage = AT(backward ? w->dqh : w->oh);
    LT_TRY(to_heads(ctx, comm, u, q, stage, AT(w->qh), u->H));
    LT_TRY(to_heads(ctx, comm, u, k, stage, AT(w->kh), u->Hkv));
    LT_TRY(to_heads(ctx, comm, u, v, stage, AT(w->vh), u->Hkv));
    memset(aa, 0, sizeof *aa);
    aa->q = AT(w->qh), aa->k = AT(w->kh), aa->v = AT(w->vh), aa->out = AT(w->oh);
    aa->workspace = w->attn_bytes ? AT(w->attn) : NULL;
    aa->workspace_size = w->attn_bytes;
    return LT_OK;
}

lt_status lt_cp_ulysses_forward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const void *q,
                                const void *k, const void *v, void *out, float *lse, void *ws, size_t ws_bytes,
                                int threads) {
    uly u;
    carve w;
    lt_attention_args aa;
    LT_TRY(heads_in(ctx, comm, p, q, k, v, ws, ws_bytes, threads, 0, &u, &w, &aa));
    aa.lse = lse;
    lt_attention_params ap = attn(&u, p);
    LT_TRY(lt_attention_forward(ctx, &ap, &aa));
    return from_heads(ctx, comm, &u, AT(w.oh), AT(w.qh), out, u.H); /* qh is dead now */
}

lt_status lt_cp_ulysses_backward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const void *q,
                                 const void *k, const void *v, const void *out, const float *lse, const void *dout,
                                 void *dq, void *dk, void *dv, void *ws, size_t ws_bytes, int threads) {
    uly u;
    carve w;
    lt_attention_args aa;
    /* The forward's head-layout inputs are not kept (that would double the attention activations):
     * they are exchanged again from the local ones. */
    LT_TRY(heads_in(ctx, comm, p, q, k, v, ws, ws_bytes, threads, 1, &u, &w, &aa));
    void *stage = AT(w.dqh);
    LT_TRY(to_heads(ctx, comm, &u, out, stage, AT(w.oh), u.H));
    LT_TRY(to_heads(ctx, comm, &u, dout, stage, AT(w.doh), u.H));
    aa.lse = (float *)lse;
    aa.dout = AT(w.doh), aa.dq = AT(w.dqh), aa.dk = AT(w.dkh), aa.dv = AT(w.dvh);
    lt_attention_params ap = attn(&u, p);
    LT_TRY(lt_attention_backward(ctx, &ap, &aa));
    stage = AT(w.qh); /* dead once the kernel has run */
    LT_TRY(from_heads(ctx, comm, &u, AT(w.dqh), stage, dq, u.H));
    LT_TRY(from_heads(ctx, comm, &u, AT(w.dkh), stage, dk, u.Hkv));
    return from_heads(ctx, comm, &u, AT(w.dvh), stage, dv, u.Hkv);
}
