/* The CPU's lora_fwd and lora_bwd (backend.h): the reference composition's products, arranged so
 * the base products accumulate onto what the adapters wrote (beta = 1: OpenBLAS then runs no pass
 * that scales or zeroes C first, and the rank-r products write instead of reading and writing),
 * and with the adapters of a group that share the input x (q, k, v; gate, up) taken together
 * where that reads less:
 *   forward:  lu = x·Aᵀ ; y = beta·y + s·lu·Bᵀ ; y += x·Wᵀ
 *   backward: gb_g += s·dy_gᵀ·lu_g ; dlu_g = s·dy_g·B_g   (per adapter; dlu_g in columns g·r of dlu)
 *             [ga_g] += dluᵀ·x ; dx = beta·dx + dlu·[A_g]   (one product each over the group's G·r
 *                                                          columns)
 *             dx += Σ_g dy_g·W_g                           (the base products, one matmul each)
 * so x is read once for the A gradients instead of G times, and dx is written once for the
 * adapters' share instead of read and written G times. A single adapter runs the same order on
 * its own. The sums differ from the reference's (lt_lora_*_ref: the base product first) only in
 * association. The stacked copies and the transposed dB product live in the op's workspace
 * (lt_cpu_lora_workspace_bytes), before the base products take it over. */
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/prof.h"

/* An output width from which gb += s·dyᵀ·lu runs as (luᵀ·dy)ᵀ: OpenBLAS 0.3.21 took 2.9 ms for
 * the 1536 x 8 product over 2048 rows as dyᵀ·lu and 1.9 ms as luᵀ·dy (2 threads, Zen 3), while at
 * 576 columns the direct form was the faster. */
#define LORA_GB_SWAP_OUT 1024

size_t lt_cpu_lora_workspace_bytes(int G, int64_t r, int64_t in, int64_t out_max, int threads) {
    (void)threads;
    const int64_t stacked = G > 1 ? (int64_t)G * r * in : 0, swapped = out_max >= LORA_GB_SWAP_OUT ? out_max * r : 0;
    return (size_t)(stacked > swapped ? stacked : swapped) * sizeof(float);
}

/* t: out·r floats of workspace when out >= LORA_GB_SWAP_OUT. */
static void grad_b(lt_ctx *ctx, const lt_lora_proj *P, int64_t out, int64_t n, int64_t r, float s, float *t) {
    if (out >= LORA_GB_SWAP_OUT) {
        lt_cpu_gemm(ctx, 1, 0, r, out, n, s, P->lu, r, P->dy, out, 0.0f, t, out);
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < r; k++) P->gb[o * r + k] += t[k * out + o];
        return;
    }
    lt_cpu_gemm(ctx, 1, 0, out, r, n, s, P->dy, out, P->lu, r, 1.0f, P->gb, r);
}

void lt_cpu_lora_fwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                     float beta, void *ws) {
    int ran_base = 0;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        const int64_t out = P->w->shape[0], in = P->w->shape[1];
        float yb = beta;
        if (P->y && P->yc && P->yc != P->y && beta != 0.0f) memcpy(P->y, P->yc, sizeof(float) * (size_t)(n * out));
        if (P->a) {
            const int ph = lt_prof_begin(LT_DEVICE_CPU, LT_PROF_GEMM);
            lt_cpu_gemm(ctx, 0, 1, n, r, in, 1.0f, x, in, P->a, in, 0.0f, P->lu, r);
            if (P->y) lt_cpu_gemm(ctx, 0, 1, n, out, r, s, P->lu, r, P->b, r, beta, P->y, out);
            lt_prof_end(ph);
            yb = 1.0f;
        }
        if (!P->y) continue; /* lu only (a recompute) */
        lt_cpu_matmul(ctx, ran_base ? LT_MATMUL_NT_SAME_X : LT_MATMUL_NT, P->w, x, n, yb, P->y, ws);
        ran_base = 1;
        if (P->bias) lt_cpu_add_bias(ctx, P->y, P->bias, n, out);
    }
}

/* dx += Σ_g dy_g·W_g, the first product scaling dx by beta. */
static void base_products(lt_ctx *ctx, const lt_lora_proj *p, int G, int64_t n, float *dx, float beta, void *ws) {
    for (int g = 0; g < G; g++) lt_cpu_matmul(ctx, LT_MATMUL_NN, p[g].w, p[g].dy, n, g ? 1.0f : beta, dx, ws);
}

void lt_cpu_lora_bwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                     float *dx, float beta, float *dlu, void *ws) {
    const int64_t in = p[0].w->shape[1];
    int na = 0;
    for (int g = 0; g < G; g++) na += p[g].a != NULL;
    if (!na) {
        if (dx) base_products(ctx, p, G, n, dx, beta, ws);
        return;
    }
    const int64_t R = (int64_t)na * r;
    const int stacked = na > 1;
    float *t = ws; /* the base products take it over at the end */
    const int64_t ld = stacked ? R : r;
    const int ph = lt_prof_begin(LT_DEVICE_CPU, LT_PROF_GEMM);
    int64_t col = 0;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        if (!P->a) continue;
        const int64_t out = P->w->shape[0];
        float *d = dlu + (stacked ? col : 0);
        grad_b(ctx, P, out, n, r, s, t);
        lt_cpu_gemm(ctx, 0, 0, n, r, out, s, P->dy, out, P->b, r, 0.0f, d, ld);
        if (!stacked) {
            lt_cpu_gemm(ctx, 1, 0, r, in, n, 1.0f, d, r, x, in, 1.0f, P->ga, in);
            if (dx) lt_cpu_gemm(ctx, 0, 0, n, in, r, 1.0f, d, r, P->a, in, beta, dx, in);
        }
        col += r;
    }
    if (stacked) {
        lt_cpu_gemm(ctx, 1, 0, R, in, n, 1.0f, dlu, R, x, in, 0.0f, t, in);
        col = 0;
        for (int g = 0; g < G; g++) {
            if (!p[g].a) continue;
            float *ga = p[g].ga;
            const float *tg = t + col * in;
            for (int64_t i = 0; i < r * in; i++) ga[i] += tg[i];
            col += r;
        }
        if (dx) {
            col = 0;
            for (int g = 0; g < G; g++) {
                if (!p[g].a) continue;
                for (int64_t i = 0; i < r * in; i++) t[col * in + i] = p[g].a[i];
                col += r;
            }
            lt_cpu_gemm(ctx, 0, 0, n, in, R, 1.0f, dlu, R, t, in, beta, dx, in);
        }
    }
    lt_prof_end(ph);
    if (dx) base_products(ctx, p, G, n, dx, 1.0f, ws);
}
