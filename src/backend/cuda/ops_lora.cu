/* The CUDA LoRA projection ops (backend.h's lora_fwd / lora_bwd): the base product through the
 * weight matmul and the rank-r LoRA products arranged around it so each activation is streamed
 * as few times as possible. The down-products (x·Aᵀ, dy·B, dyᵀ·lu) read the bf16 copy of x or dy
 * that the matmul makes for cuBLASLt anyway (fp32 accumulate; x·Aᵀ and dy·B on the tensor cores
 * with the f32 factor split into bf16 hi and lo parts as the kernel loads it); the up-product lu·Bᵀ
 * writes y before the base product, which then accumulates onto it (beta = 1) instead of a second
 * read-modify-write pass; the backward's dlu·A updates of a group that shares dx are one pass, and
 * the members of a group run each of these kernels in one launch (the *_batch ops, the same bits).
 * Shapes the kernels do not take (rank > 16 or not a multiple of 4, activations too large for one
 * bf16 chunk, misaligned factors) run lt_lora_*_ref on the CUDA table instead. It does not fuse
 * anything into cuBLASLt's kernels, and dA = dluᵀ·x reads x in f32 (rounded to bf16 on the way to
 * the tensor cores), projection by projection.
 * lora_fwd_bf16 / lora_bwd_bf16 are the same ops given x, dy or both already in bf16 (the MLP's
 * activation and its gradients): every product then reads those rows where it would have read
 * its own rounding of the f32 ones, so nothing is converted and the results are the same bits.
 * An output wanted in bf16 (yh: the MLP's gate and up; dxh: the down projection's input gradient)
 * is written so by both the rank update and the base product (cuBLASLt's C and D in bf16), half
 * the f32 output's traffic each; a residual added onto (beta 1) is read where it lies (yc) by the
 * rank update, which writes y whole. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

extern "C" {
#include "backend/prof.h"
}

static int al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether projection P's adapter can take the fused path at rank r. */
static int lora_fast(const lt_lora_proj *P, int64_t r) {
    const int64_t in = P->w->shape[1];
    return P->a && r >= 4 && r <= 16 && r % 4 == 0 && in % 8 == 0 && al16(P->a) && al16(P->b) && al16(P->lu);
}

int lt_cuda_lora_bf16_takes(lt_dtype wdtype, int64_t out, int64_t in, int64_t r) {
    return wdtype != LT_DTYPE_FP8 && in % 8 == 0 && out % 8 == 0 && (r == 0 || (r >= 4 && r <= 16 && r % 4 == 0));
}

/* The base product of projection P onto y (NT) or dx (NN) from the f32 rows (staged, or already
 * staged when same_x) or from the bf16 rows xh read in place. */
static void base_product(lt_ctx *ctx, lt_matmul_mode mode, const lt_lora_proj *P, const float *x, const uint16_t *xh,
                         int64_t n, float beta, float *y, void *ws, int same_x) {
    if (xh) lt_cuda_matmul_bf16x(ctx, mode, P->w, xh, n, beta, y, ws);
    else lt_cuda_matmul_reuse(ctx, mode, P->w, x, n, beta, y, ws, same_x);
}

/* Whether member P's forward takes the fused path: lu = x·Aᵀ on the tensor cores, then the rank
 * update and the base product onto y (or yh); a member wanting lu only (a recompute) needs the first. */
static int fwd_fused(const lt_lora_proj *P, int64_t r) {
    if (!lora_fast(P, r)) return 0;
    if (!P->y && !P->yh) return 1;
    return P->w->shape[0] % 4 == 0 && (P->yh || (al16(P->y) && (!P->yc || al16(P->yc))));
}

/* The lu = x·Aᵀ of every adapted member of a group in one launch, when all of them take the fused
 * path (from xh, else from the staged bf16 copy of x, or from the f32 x rounded as it is loaded when
 * every member wants lu only: the same values). Returns 1 when done; *staged then says the matmul
 * workspace holds x in bf16. */
static int lu_batch(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n, int64_t r,
                    void *ws, void *gws, size_t gws_bytes, int *staged) {
    lt_cuda_skinny_op ops[LT_CUDA_SKINNY_BATCH];
    int na = 0, lu_only = 1;
    const lt_lora_proj *first = NULL;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        if (!P->a) continue;
        if (!fwd_fused(P, r) || G > LT_CUDA_SKINNY_BATCH) return 0;
        if (!first) first = P;
        lu_only &= !P->y && !P->yh;
        const int64_t in = P->w->shape[1];
        ops[na++] = (lt_cuda_skinny_op){NULL, in, P->a, in, P->lu, r, in, 1.0f, 0.0f};
    }
    if (na < 2) return 0;
    const int64_t in = first->w->shape[1];
    for (int j = 0; j < na; j++)
        if (ops[j].k != in) return 0;
    const void *a = xh;
    int a_f32 = 0;
    if (!a && lu_only) a = x, a_f32 = 1;
    if (!a) {
        a = lt_cuda_matmul_stage_x(ctx, LT_MATMUL_NT, first->w, x, n, ws, 0);
        if (!a) return 0;
        *staged = 1;
    }
    for (int j = 0; j < na; j++) ops[j].a = a;
    const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
    const int ok = lt_cuda_skinny_h_n_batch(ctx, 1, na, ops, n, r, a_f32, gws, gws_bytes);
    lt_prof_end(ph);
    return ok;
}

/* After lu_batch: y = beta·y (or yc) + s·lu·Bᵀ of every adapted member in one launch, when they
 * all write y in the same precision (the base products then accumulate onto it). 1 when done. */
static int up_batch(lt_ctx *ctx, const lt_lora_proj *p, int G, int64_t n, int64_t r, float s, float beta) {
    lt_cuda_rank_op ops[LT_CUDA_SKINNY_BATCH];
    int na = 0, h = -1;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        if (!P->a) continue;
        if (!P->y && !P->yh) return 0;
        if (h >= 0 && h != (P->yh != NULL)) return 0;
        h = P->yh != NULL;
        const int64_t out = P->w->shape[0];
        ops[na++] =
            (lt_cuda_rank_op){P->lu, r,  {P->b, NULL, NULL}, r, h ? NULL : P->yc, h ? (void *)P->yh : (void *)P->y,
                              out,   out};
    }
    if (na < 2) return 0;
    const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
    const int ok = lt_cuda_rank_update_batch(ctx, na, ops, n, (int)r, (int)r, 1, s, h ? 0.0f : beta, h);
    lt_prof_end(ph);
    return ok;
}

/* lora_fwd of an f32 x, or (lora_fwd_bf16) of its bf16 rounding xh; an output with yh set is
 * written in bf16 (xh given, beta 0, no bias: the layout asks for nothing else). */
static void lora_fwd_any(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                         int64_t r, float s, float beta, void *ws) {
    int staged = 0; /* the matmul workspace holds x in bf16 from an earlier member of the group */
    size_t gws_bytes = 0;
    void *gws = lt_cuda_gemm_workspace(ctx, &gws_bytes);
    const int lu_done = lu_batch(ctx, p, G, x, xh, n, r, ws, gws, gws_bytes, &staged);
    const int up_done = lu_done && up_batch(ctx, p, G, n, r, s, beta);
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        const int64_t out = P->w->shape[0], in = P->w->shape[1];
        if (!P->y && !P->yh) { /* lu only (a recompute): one pass over the f32 x, rounded as the forward's copy */
            if (!P->a || lu_done) continue;
            const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
            const void *xa = xh ? (const void *)xh : (const void *)x;
            if (!lora_fast(P, r) ||
                !lt_cuda_skinny_h_n(ctx, 1, n, r, in, 1.0f, xa, !xh, in, P->a, in, 0.0f, P->lu, r, gws, gws_bytes)) {
                LT_ASSERT(!xh); /* lora_bf16_takes admits only shapes the bf16 kernel takes */
                lt_cuda_gemm(ctx, 0, 1, n, r, in, 1.0f, x, in, P->a, in, 0.0f, P->lu, r);
            }
            lt_prof_end(ph);
            continue;
        }
        LT_ASSERT(!P->yh || (xh && beta == 0.0f && !P->bias && al16(P->yh)));
        const void *xb = NULL;
        if (fwd_fused(P, r)) xb = xh ? xh : lt_cuda_matmul_stage_x(ctx, LT_MATMUL_NT, P->w, x, n, ws, staged);
        LT_ASSERT(xb || !xh || !P->a);
        if (!xb && P->y && P->yc && P->yc != P->y && beta != 0.0f) /* the residual into y first */
            lt_cuda_check_abort(ctx,
                                cudaMemcpyAsync(P->y, P->yc, sizeof(float) * (size_t)(n * out),
                                                cudaMemcpyDeviceToDevice, lt_cuda_stream(ctx)),
                                "lora: the residual into y");
        if (xb) {
            const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
            int ok = lu_done ||
                lt_cuda_skinny_h_n(ctx, 1, n, r, in, 1.0f, xb, 0, in, P->a, in, 0.0f, P->lu, r, gws, gws_bytes);
            /* y = beta·y + s·lu·Bᵀ (B (out, r) read transposed), then the base product onto it */
            const float *bp[3] = {P->b, NULL, NULL};
            if (!up_done && P->yh)
                ok = ok && lt_cuda_rank_update_h(ctx, n, out, (int)r, s, P->lu, r, bp, (int)r, 1, r, 0.0f, P->yh, out);
            else if (!up_done)
                ok = ok &&
                    lt_cuda_rank_update(ctx, n, out, (int)r, s, P->lu, r, bp, (int)r, 1, r, beta, P->yc, P->y, out);
            lt_prof_end(ph);
            LT_ASSERT(ok); /* lora_fast and stage_x checked every condition the kernels have */
            if (P->yh) lt_cuda_matmul_bf16xy(ctx, LT_MATMUL_NT, P->w, xh, n, 1.0f, P->yh, ws);
            else base_product(ctx, LT_MATMUL_NT, P, x, xh, n, 1.0f, P->y, ws, 1);
        } else if (P->yh) { /* no adapter */
            lt_cuda_matmul_bf16xy(ctx, LT_MATMUL_NT, P->w, xh, n, 0.0f, P->yh, ws);
        } else {
            base_product(ctx, LT_MATMUL_NT, P, x, xh, n, beta, P->y, ws, staged);
            if (P->a) {
                const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
                lt_cuda_gemm(ctx, 0, 1, n, r, in, 1.0f, x, in, P->a, in, 0.0f, P->lu, r);
                lt_cuda_gemm(ctx, 0, 1, n, out, r, s, P->lu, r, P->b, r, 1.0f, P->y, out);
                lt_prof_end(ph);
            }
        }
        staged = 1;
        if (P->bias) lt_cuda_add_bias(ctx, P->y, P->bias, n, out);
    }
}

void lt_cuda_lora_fwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                      float beta, void *ws) {
    lora_fwd_any(ctx, p, G, x, NULL, n, r, s, beta, ws);
}

void lt_cuda_lora_fwd_bf16(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                           int64_t r, float s, float beta, void *ws) {
    LT_ASSERT((x == NULL) != (xh == NULL));
    lora_fwd_any(ctx, p, G, x, xh, n, r, s, beta, ws);
}

/* One adapter's products in the backward that read dy (f32, and dyb its bf16 rows when staged or
 * given): dl = s·dy·B (dl's row stride ldd) and gb += s·dyᵀ·lu. */
static void adapter_dl_gb(lt_ctx *ctx, const lt_lora_proj *P, const void *dyb, int64_t n, int64_t r, float s, float *dl,
                          int64_t ldd, void *gws, size_t gws_bytes) {
    const int64_t out = P->w->shape[0];
    if (dyb) { /* dlu and gb from the bf16 dy the base product reads */
        int k1 = lt_cuda_skinny_h_n(ctx, 0, n, r, out, s, dyb, 0, out, P->b, r, 0.0f, dl, ldd, gws, gws_bytes);
        int k2 =
            k1 && lt_cuda_skinny_h_tall(ctx, out, r, n, s, dyb, 0, out, P->lu, r, 1.0f, P->gb, r, 1, gws, gws_bytes);
        LT_ASSERT((k1 && k2) || !P->dyh);
        if (!k1) lt_cuda_gemm(ctx, 0, 0, n, r, out, s, P->dy, out, P->b, r, 0.0f, dl, ldd);
        if (!k2) lt_cuda_gemm(ctx, 1, 0, out, r, n, s, P->dy, out, P->lu, r, 1.0f, P->gb, r);
    } else {
        lt_cuda_gemm(ctx, 1, 0, out, r, n, s, P->dy, out, P->lu, r, 1.0f, P->gb, r);
        lt_cuda_gemm(ctx, 0, 0, n, r, out, s, P->dy, out, P->b, r, 0.0f, dl, ldd);
    }
}

/* ga += dlᵀ·x of the G adapted members P[j] (each's dl = dlu's column block j, row stride ldd),
 * x in f32 (rounded to bf16 as the other LoRA products read it) or xh: one launch for the group
 * where the kernels take it. */
static void adapter_ga(lt_ctx *ctx, const lt_lora_proj *const *P, int G, const float *x, const uint16_t *xh, int64_t n,
                       int64_t r, const float *dlu, int64_t ldd, void *gws, size_t gws_bytes) {
    const int64_t in = P[0]->w->shape[1];
    const void *xa = xh ? (const void *)xh : (const void *)x;
    lt_cuda_skinny_op ops[LT_CUDA_SKINNY_BATCH];
    for (int j = 0; j < G; j++) ops[j] = (lt_cuda_skinny_op){xa, in, dlu + j * r, ldd, P[j]->ga, in, in, 1.0f, 1.0f};
    if (lt_cuda_skinny_h_tall_batch(ctx, G, ops, r, n, !xh, 0, gws, gws_bytes)) return;
    LT_ASSERT(!xh);
    for (int j = 0; j < G; j++) lt_cuda_gemm(ctx, 1, 0, r, in, n, 1.0f, dlu + j * r, ldd, x, in, 1.0f, P[j]->ga, in);
}

/* adapter_dl_gb of the adapted members of a group whose dy is bf16 already (dyh), in one launch
 * each for dl and gb; each member's dl is dlu's column block of its adapted index. Returns which
 * members it ran (a bit each). */
static unsigned dl_gb_batch(lt_ctx *ctx, const lt_lora_proj *p, int G, int64_t n, int64_t r, float s, float *dlu,
                            int64_t ldd, void *gws, size_t gws_bytes) {
    lt_cuda_skinny_op dl[LT_CUDA_SKINNY_BATCH], gb[LT_CUDA_SKINNY_BATCH];
    unsigned done = 0;
    int nb = 0, ia = 0;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        if (!P->a) continue;
        float *d = dlu + (ia++) * r;
        if (!P->dyh) continue;
        const int64_t out = P->w->shape[0];
        dl[nb] = (lt_cuda_skinny_op){P->dyh, out, P->b, r, d, ldd, out, s, 0.0f};
        gb[nb] = (lt_cuda_skinny_op){P->dyh, out, P->lu, r, P->gb, r, out, s, 1.0f};
        nb++, done |= 1u << g;
    }
    if (nb < 2) return 0;
    const int ok = lt_cuda_skinny_h_n_batch(ctx, 0, nb, dl, n, r, 0, gws, gws_bytes) &&
        lt_cuda_skinny_h_tall_batch(ctx, nb, gb, r, n, 0, 1, gws, gws_bytes);
    LT_ASSERT(ok); /* lora_bf16_takes admits only shapes the bf16 kernels take */
    return done;
}

/* lora_bwd of one projection with dy in bf16, its input gradient written in bf16 to dxh (beta 0):
 * dlu·A rounded first, then the base product added onto it (C and D in bf16). lora_bf16_takes
 * admitted the projection, so its adapter, if any, is on the fused path. */
static void lora_bwd_dxh(lt_ctx *ctx, const lt_lora_proj *P, const float *x, const uint16_t *xh, int64_t n, int64_t r,
                         float s, uint16_t *dxh, float *dlu, void *ws) {
    const int64_t out = P->w->shape[0], in = P->w->shape[1];
    LT_ASSERT(P->dyh && al16(dxh) && (!P->a || (lora_fast(P, r) && out % 4 == 0 && in % 4 == 0)));
    if (P->a) {
        size_t gws_bytes = 0;
        void *gws = lt_cuda_gemm_workspace(ctx, &gws_bytes);
        const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
        adapter_dl_gb(ctx, P, P->dyh, n, r, s, dlu, r, gws, gws_bytes);
        adapter_ga(ctx, &P, 1, x, xh, n, r, dlu, r, gws, gws_bytes);
        const float *ap[3] = {P->a, NULL, NULL};
        const int ok = lt_cuda_rank_update_h(ctx, n, in, (int)r, 1.0f, dlu, r, ap, (int)r, 0, in, 0.0f, dxh, in);
        lt_prof_end(ph);
        LT_ASSERT(ok); /* lora_fast checked every condition the kernels have */
    }
    lt_cuda_matmul_bf16xy(ctx, LT_MATMUL_NN, P->w, P->dyh, n, P->a ? 1.0f : 0.0f, dxh, ws);
}

/* lora_bwd of an f32 x or its bf16 rounding xh, each dy_g in f32 or (p[g].dyh) bf16. */
static void lora_bwd_any(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                         int64_t r, float s, float *dx, float beta, float *dlu, void *ws) {
    /* The fused path takes the whole group or none of it: every adapter fast, dx (n, in) aligned. */
    int na = 0, ok = G >= 1 && G <= 3;
    const int64_t in = p[0].w->shape[1];
    for (int g = 0; g < G && ok; g++) {
        if (!p[g].a) continue;
        na++;
        ok = lora_fast(&p[g], r) && p[g].w->shape[1] == in && p[g].w->shape[0] % 4 == 0;
    }
    if (ok && dx) ok = in % 4 == 0 && al16(dx);
    int any_h = xh != NULL;
    for (int g = 0; g < G; g++) any_h |= p[g].dyh != NULL;
    if (!na && any_h) { /* no adapter: dx alone, the base products of the dy's */
        for (int g = 0; g < G && dx; g++)
            base_product(ctx, LT_MATMUL_NN, &p[g], p[g].dy, p[g].dyh, n, g ? 1.0f : beta, dx, ws, 0);
        return;
    }
    if (!ok || !na) { /* the f32 composition; lora_bf16_takes keeps bf16 inputs off it */
        LT_ASSERT(!any_h);
        lt_lora_bwd_ref(&lt_backend_cuda, ctx, p, G, x, n, r, s, dx, beta, dlu, ws);
        return;
    }
    size_t gws_bytes = 0;
    void *gws = lt_cuda_gemm_workspace(ctx, &gws_bytes);
    const int64_t ldd = na * r; /* dlu (n, na·r): the adapted members' column blocks in order */
    const float *apieces[3] = {NULL, NULL, NULL};
    const lt_lora_proj *adapted[3] = {NULL, NULL, NULL};
    /* the members of a group with their dy in bf16 already: dl and gb side by side */
    int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
    const unsigned batched = G > 1 ? dl_gb_batch(ctx, p, G, n, r, s, dlu, ldd, gws, gws_bytes) : 0;
    lt_prof_end(ph);
    int ia = 0, based = 0;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        const float bbeta = based ? 1.0f : beta;
        if (!P->a) {
            if (dx) base_product(ctx, LT_MATMUL_NN, P, P->dy, P->dyh, n, bbeta, dx, ws, 0), based = 1;
            continue;
        }
        float *dl = dlu + ia * r;
        adapted[ia] = P;
        apieces[ia++] = P->a;
        const void *dyb = P->dyh ? P->dyh : lt_cuda_matmul_stage_x(ctx, LT_MATMUL_NN, P->w, P->dy, n, ws, 0);
        ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
        if (!(batched >> g & 1u)) adapter_dl_gb(ctx, P, dyb, n, r, s, dl, ldd, gws, gws_bytes);
        /* alone: ga now; in a group, after the loop for all members at once (x read once) */
        if (G == 1) adapter_ga(ctx, &P, 1, x, xh, n, r, dl, ldd, gws, gws_bytes);
        int pre = 0;
        if (dx && G == 1) /* alone: dx = beta·dx + dlu·A first, the base product accumulates onto it */
            pre = lt_cuda_rank_update(ctx, n, in, (int)r, 1.0f, dl, ldd, apieces, (int)r, 0, in, bbeta, NULL, dx, in);
        lt_prof_end(ph);
        if (dx) base_product(ctx, LT_MATMUL_NN, P, P->dy, P->dyh, n, pre ? 1.0f : bbeta, dx, ws, dyb != NULL);
        based = 1;
        if (dx && G == 1 && !pre) {
            const int ph2 = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
            lt_cuda_gemm(ctx, 0, 0, n, in, r, 1.0f, dl, ldd, P->a, in, 1.0f, dx, in);
            lt_prof_end(ph2);
        }
    }
    if (G == 1) return;
    ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
    adapter_ga(ctx, adapted, na, x, xh, n, r, dlu, ldd, gws, gws_bytes);
    lt_prof_end(ph);
    if (!dx) return;
    /* dx += dlu·[A of the adapted members]: one pass over dx for the group */
    ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
    if (!lt_cuda_rank_update(ctx, n, in, (int)ldd, 1.0f, dlu, ldd, apieces, (int)r, 0, in, 1.0f, NULL, dx, in))
        for (int j = 0; j < na; j++)
            lt_cuda_gemm(ctx, 0, 0, n, in, r, 1.0f, dlu + j * r, ldd, apieces[j], in, 1.0f, dx, in);
    lt_prof_end(ph);
}

void lt_cuda_lora_bwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                      float *dx, float beta, float *dlu, void *ws) {
    lora_bwd_any(ctx, p, G, x, NULL, n, r, s, dx, beta, dlu, ws);
}

void lt_cuda_lora_bwd_bf16(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                           int64_t r, float s, float *dx, uint16_t *dxh, float beta, float *dlu, void *ws) {
    LT_ASSERT((x == NULL) != (xh == NULL));
    if (dxh) {
        LT_ASSERT(G == 1 && !dx && beta == 0.0f);
        lora_bwd_dxh(ctx, p, x, xh, n, r, s, dxh, dlu, ws);
        return;
    }
    lora_bwd_any(ctx, p, G, x, xh, n, r, s, dx, beta, dlu, ws);
}
