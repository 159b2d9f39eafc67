/* The CUDA LoRA projection ops (backend.h's lora_fwd / lora_bwd): the base product through the
 * weight matmul and the rank-r LoRA products arranged around it so each activation is streamed
 * as few times as possible. The first down-product of an input (x·Aᵀ, dy·B) reads it in f32 and
 * writes the bf16 copy the matmul needs for cuBLASLt in the same pass; the others (the group's
 * next x·Aᵀ, dyᵀ·lu) read that copy (fp32 accumulate, f32 factors); the up-product lu·Bᵀ
 * writes y before the base product, which then accumulates onto it (beta = 1) instead of a second
 * read-modify-write pass; the backward's dlu·A updates of a group that shares dx are one pass.
 * For bf16 W at rank 8 or 16 the forward goes further: s·lu is appended to the staged x's rows
 * and B to a bf16 copy of W's, and one cuBLASLt GEMM over K = in + r writes y (see kcat_enabled);
 * the backward likewise appends dlu to dy's staged rows and A under a copy of W's rows, so each
 * member's GEMM over K = out + r adds dy·W + dlu·A into dx with no separate pass.
 * Shapes the kernels do not take (rank > 16 or not a multiple of 4, activations too large for one
 * bf16 chunk, misaligned factors) run lt_lora_*_ref on the CUDA table instead; a group's dA =
 * dluᵀ·x is one f32 pass over x for all its members. It fuses nothing into cuBLASLt's kernels. */
#include <stdlib.h>

#include <cuda_bf16.h>
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

/* ext (out, in + r) bf16 = [W | B]: W's rows (bf16, in % 8 == 0) and B (out, r, f32, r % 8 == 0)
 * rounded, eight elements (16 bytes) a thread. */
__global__ void ext_build_k(const uint4 *__restrict__ w, const float *__restrict__ b, int64_t out, int64_t in, int r,
                            uint4 *__restrict__ ext) {
    const int64_t kq = (in + r) / 8, inq = in / 8, total = out * kq;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / kq, c = i - o * kq;
        if (c < inq) {
            ext[i] = w[o * inq + c];
        } else {
            const float4 *src = (const float4 *)(b + o * r + 8 * (c - inq));
            const float4 u = src[0], v = src[1];
            __nv_bfloat162 p0 = __floats2bfloat162_rn(u.x, u.y), p1 = __floats2bfloat162_rn(u.z, u.w);
            __nv_bfloat162 p2 = __floats2bfloat162_rn(v.x, v.y), p3 = __floats2bfloat162_rn(v.z, v.w);
            ext[i] = make_uint4(*reinterpret_cast<uint32_t *>(&p0), *reinterpret_cast<uint32_t *>(&p1),
                                *reinterpret_cast<uint32_t *>(&p2), *reinterpret_cast<uint32_t *>(&p3));
        }
    }
}

/* ext (out + r, in) bf16 = [W; A]: W's rows (bf16) then A (r, in, f32) rounded, eight elements a
 * thread (in % 8 == 0). */
__global__ void ext_rows_k(const uint4 *__restrict__ w, const float *__restrict__ a, int64_t out, int64_t in, int r,
                           uint4 *__restrict__ ext) {
    const int64_t inq = in / 8, wq = out * inq, total = (out + r) * inq;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        if (i < wq) {
            ext[i] = w[i];
        } else {
            const float4 *src = (const float4 *)(a + 8 * (i - wq));
            const float4 u = src[0], v = src[1];
            __nv_bfloat162 p0 = __floats2bfloat162_rn(u.x, u.y), p1 = __floats2bfloat162_rn(u.z, u.w);
            __nv_bfloat162 p2 = __floats2bfloat162_rn(v.x, v.y), p3 = __floats2bfloat162_rn(v.z, v.w);
            ext[i] = make_uint4(*reinterpret_cast<uint32_t *>(&p0), *reinterpret_cast<uint32_t *>(&p1),
                                *reinterpret_cast<uint32_t *>(&p2), *reinterpret_cast<uint32_t *>(&p3));
        }
    }
}

/* The K-extended forward (on unless LONGTUNE_LORA_KCAT=0, which keeps the rank-update path for
 * A/B measurements): y = [x | s·lu]·[W | B]ᵀ in one GEMM, so y is written once and never read
 * back, at the price of copying W (bf16) beside B per call: 4·in bytes per weight row against
 * the 8·n bytes per output column of a y read-modify-write, a win for n >= in / 2. */
static int kcat_enabled(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("LONGTUNE_LORA_KCAT");
        on = !(e && e[0] == '0');
    }
    return on;
}

void lt_cuda_lora_fwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                      float beta, void *ws) {
    int staged = 0; /* an earlier member of the group staged x in bf16 (at some pitch) */
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        const int64_t out = P->w->shape[0], in = P->w->shape[1];
        if (!P->y) { /* lu only (a recompute): one f32 pass over x */
            if (!P->a) continue;
            const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
            lt_cuda_gemm(ctx, 0, 1, n, r, in, 1.0f, x, in, P->a, in, 0.0f, P->lu, r);
            lt_prof_end(ph);
            continue;
        }
        const int fast = lora_fast(P, r) && out % 4 == 0 && al16(P->y) && al16(x);
        void *ext = fast && kcat_enabled() && P->w->dtype == LT_DTYPE_BF16 && r % 8 == 0 && 2 * n >= in &&
                            al16(P->w->data)
                        ? lt_cuda_matmul_ext_slot(P->w, n, ws)
                        : NULL;
        const int64_t pitch = ext ? in + r : in, kext = pitch;
        void *xb = NULL;
        int ok = 0;
        const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
        if (fast) {
            /* lu = x·Aᵀ: from the staged bf16 x, or from x itself while staging it; with ext, s·lu
             * goes into the staged rows' tail columns */
            xb = staged ? lt_cuda_matmul_x_has(LT_MATMUL_NT, P->w, x, n, ws, pitch) : NULL;
            if (xb) {
                ok = lt_cuda_skinny_h_n(1, n, r, in, 1.0f, xb, pitch, P->a, in, 0.0f, P->lu, r,
                                        ext ? (uint16_t *)xb + in : NULL, pitch, s);
            } else if ((xb = lt_cuda_matmul_x_slot(LT_MATMUL_NT, P->w, n, ws, pitch)) != NULL) {
                ok = lt_cuda_skinny_n_store(1, n, r, in, 1.0f, x, in, P->a, in, 0.0f, P->lu, r, xb, pitch,
                                            ext ? (uint16_t *)xb + in : NULL, pitch, s);
                if (ok) lt_cuda_matmul_x_filled(LT_MATMUL_NT, P->w, x, n, ws, pitch);
            }
        }
        if (ok && ext) {
            const int64_t total = out * (kext / 8);
            ext_build_k<<<lt_cuda_grid(total, 256), 256, 0, lt_cuda_stream()>>>(
                (const uint4 *)P->w->data, P->b, out, in, (int)r, (uint4 *)ext);
            LT_CUDA_LAUNCHED("lora: K-extended weight");
        }
        lt_prof_end(ph);
        if (ok && ext) {
            lt_cuda_matmul_ext_run(LT_MATMUL_NT, P->w, ext, kext, xb, n, beta, P->y, ws);
        } else if (ok) {
            const int ph2 = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
            /* y = beta·y + s·lu·Bᵀ (B (out, r) read transposed), then the base product onto it */
            const float *bp[3] = {P->b, NULL, NULL};
            ok = lt_cuda_rank_update(n, out, (int)r, s, P->lu, r, bp, (int)r, 1, r, beta, P->y, out);
            lt_prof_end(ph2);
            LT_ASSERT(ok); /* lora_fast checked every condition the rank update has */
            lt_cuda_matmul_reuse(LT_MATMUL_NT, P->w, x, n, 1.0f, P->y, ws, 1);
        } else {
            lt_cuda_matmul_reuse(LT_MATMUL_NT, P->w, x, n, beta, P->y, ws, staged);
            if (P->a) {
                const int ph3 = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
                lt_cuda_gemm(ctx, 0, 1, n, r, in, 1.0f, x, in, P->a, in, 0.0f, P->lu, r);
                lt_cuda_gemm(ctx, 0, 1, n, out, r, s, P->lu, r, P->b, r, 1.0f, P->y, out);
                lt_prof_end(ph3);
            }
        }
        staged = 1;
        if (P->bias) lt_cuda_add_bias(ctx, P->y, P->bias, n, out);
    }
}

void lt_cuda_lora_bwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                      float *dx, float beta, float *dlu, void *ws) {
    /* The fused path takes the whole group or none of it: every adapter fast, dx (n, in) aligned. */
    int na = 0, ok = G >= 1 && G <= 3;
    const int64_t in = p[0].w->shape[1];
    for (int g = 0; g < G && ok; g++) {
        if (!p[g].a) continue;
        na++;
        ok = lora_fast(&p[g], r) && p[g].w->shape[1] == in && p[g].w->shape[0] % 4 == 0;
    }
    if (ok && dx) ok = in % 4 == 0 && al16(dx);
    if (!ok || !na) {
        lt_lora_bwd_ref(&lt_backend_cuda, ctx, p, G, x, n, r, s, dx, beta, dlu, ws);
        return;
    }
    /* K-extended backward for the whole group or none of it: dx = beta·dx + Σ [dy_g | dlu_g]·[W_g; A_g],
     * every adapted member bf16 at rank 8 or 16, worth its W copy (n >= out / 2), room in ws */
    int kc = dx && kcat_enabled() && r % 8 == 0;
    for (int g = 0; g < G && kc; g++)
        if (p[g].a)
            kc = p[g].w->dtype == LT_DTYPE_BF16 && 2 * n >= p[g].w->shape[0] && al16(p[g].w->data) &&
                 al16(p[g].dy) && lt_cuda_matmul_ext_slot(p[g].w, n, ws) != NULL &&
                 lt_cuda_matmul_x_slot(LT_MATMUL_NN, p[g].w, n, ws, p[g].w->shape[0] + r) != NULL;
    size_t gws_bytes = 0;
    void *gws = lt_cuda_gemm_workspace(&gws_bytes);
    const int64_t ldd = na * r; /* dlu (n, na·r): the adapted members' column blocks in order */
    const float *apieces[3] = {NULL, NULL, NULL};
    float *gas[3] = {NULL, NULL, NULL};
    int ia = 0, based = 0;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        const int64_t out = P->w->shape[0];
        const float bbeta = based ? 1.0f : beta;
        if (!P->a) {
            if (dx) lt_cuda_matmul_reuse(LT_MATMUL_NN, P->w, P->dy, n, bbeta, dx, ws, 0), based = 1;
            continue;
        }
        float *dl = dlu + ia * r;
        apieces[ia++] = P->a;
        const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
        /* dlu = s·dy·B while staging dy in bf16 for the base product, then gb += s·dyᵀ·lu from it */
        const int64_t pitch = kc ? out + r : out;
        void *dyb = al16(P->dy) ? lt_cuda_matmul_x_slot(LT_MATMUL_NN, P->w, n, ws, pitch) : NULL;
        int k1 = dyb && lt_cuda_skinny_n_store(0, n, r, out, s, P->dy, out, P->b, r, 0.0f, dl, ldd, dyb, pitch,
                                               kc ? (uint16_t *)dyb + out : NULL, pitch, s);
        if (k1) lt_cuda_matmul_x_filled(LT_MATMUL_NN, P->w, P->dy, n, ws, pitch);
        else dyb = NULL;
        lt_prof_end(ph);
        if (kc && dyb) { /* gb from the staged dy, then dx += [dy | dlu]·[W; A] in one GEMM */
            const int phk = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
            if (!lt_cuda_skinny_h_tall(out, r, n, s, dyb, pitch, P->lu, r, 1.0f, P->gb, r, 1, gws, gws_bytes))
                lt_cuda_gemm(ctx, 1, 0, out, r, n, s, P->dy, out, P->lu, r, 1.0f, P->gb, r);
            gas[ia - 1] = P->ga;
            if (G == 1) lt_cuda_gemm(ctx, 1, 0, r, in, n, 1.0f, dl, ldd, x, in, 1.0f, P->ga, in);
            void *ext = lt_cuda_matmul_ext_slot(P->w, n, ws);
            ext_rows_k<<<lt_cuda_grid((out + r) * (in / 8), 256), 256, 0, lt_cuda_stream()>>>(
                (const uint4 *)P->w->data, P->a, out, in, (int)r, (uint4 *)ext);
            LT_CUDA_LAUNCHED("lora: K-extended weight (rows)");
            lt_prof_end(phk);
            lt_cuda_matmul_ext_run(LT_MATMUL_NN, P->w, ext, out + r, dyb, n, bbeta, dx, ws);
            based = 1;
            continue;
        }
        LT_ASSERT(!kc); /* a K-extended group stages every member (one chunk, aligned: checked above) */
        if (!dyb) dyb = (void *)lt_cuda_matmul_stage_x(LT_MATMUL_NN, P->w, P->dy, n, ws, 0);
        const int ph1 = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
        if (dyb) {
            if (!k1) k1 = lt_cuda_skinny_h_n(0, n, r, out, s, dyb, out, P->b, r, 0.0f, dl, ldd, NULL, 0, 0.0f);
            int k2 = k1 && lt_cuda_skinny_h_tall(out, r, n, s, dyb, out, P->lu, r, 1.0f, P->gb, r, 1, gws, gws_bytes);
            if (!k1) lt_cuda_gemm(ctx, 0, 0, n, r, out, s, P->dy, out, P->b, r, 0.0f, dl, ldd);
            if (!k2) lt_cuda_gemm(ctx, 1, 0, out, r, n, s, P->dy, out, P->lu, r, 1.0f, P->gb, r);
        } else {
            lt_cuda_gemm(ctx, 1, 0, out, r, n, s, P->dy, out, P->lu, r, 1.0f, P->gb, r);
            lt_cuda_gemm(ctx, 0, 0, n, r, out, s, P->dy, out, P->b, r, 0.0f, dl, ldd);
        }
        gas[ia - 1] = P->ga;
        if (G == 1) lt_cuda_gemm(ctx, 1, 0, r, in, n, 1.0f, dl, ldd, x, in, 1.0f, P->ga, in); /* ga += dluᵀ·x */
        int pre = 0;
        if (dx && G == 1) /* alone: dx = beta·dx + dlu·A first, the base product accumulates onto it */
            pre = lt_cuda_rank_update(n, in, (int)r, 1.0f, dl, ldd, apieces, (int)r, 0, in, bbeta, dx, in);
        lt_prof_end(ph1);
        if (dx) lt_cuda_matmul_reuse(LT_MATMUL_NN, P->w, P->dy, n, pre ? 1.0f : bbeta, dx, ws, dyb != NULL);
        based = 1;
        if (dx && G == 1 && !pre) {
            const int ph2 = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
            lt_cuda_gemm(ctx, 0, 0, n, in, r, 1.0f, dl, ldd, P->a, in, 1.0f, dx, in);
            lt_prof_end(ph2);
        }
    }
    if (G == 1) return;
    const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_GEMM);
    if (kc) dx = NULL; /* the extended GEMMs added every dlu·A already */
    /* ga_g += dlu_gᵀ·x for the adapted members: one pass over x for the group */
    if (!lt_cuda_tall_grouped(in, ldd, (int)r, n, 1.0f, x, in, dlu, ldd, 1.0f, gas, in, gws, gws_bytes))
        for (int j = 0; j < na; j++) lt_cuda_gemm(ctx, 1, 0, r, in, n, 1.0f, dlu + j * r, ldd, x, in, 1.0f, gas[j], in);
    if (!dx) {
        lt_prof_end(ph);
        return;
    }
    /* dx += dlu·[A of the adapted members]: one pass over dx for the group */
    if (!lt_cuda_rank_update(n, in, (int)ldd, 1.0f, dlu, ldd, apieces, (int)r, 0, in, 1.0f, dx, in))
        for (int j = 0; j < na; j++)
            lt_cuda_gemm(ctx, 0, 0, n, in, r, 1.0f, dlu + j * r, ldd, apieces[j], in, 1.0f, dx, in);
    lt_prof_end(ph);
}
