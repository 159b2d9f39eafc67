/* The CPU's lora_bwd (backend.h): the reference composition's products, with the adapters of a
 * group that share the input x (q, k, v; gate, up) taken together where that reads less:
 *   dx = beta·dx + Σ_g dy_g·W_g                    (the base products, one matmul each)
 *   gb_g += s·dy_gᵀ·lu_g ; dlu_g = s·dy_g·B_g       (per adapter; dlu_g in columns g·r of dlu)
 *   [ga_g] += dluᵀ·x ; dx += dlu·[A_g]             (one product each over the group's G·r columns)
 * so x is read once for the A gradients instead of G times, and dx is read and written once for
 * the adapters' share instead of G times. A single adapter runs the reference order. The sums
 * differ from the reference's only in association. The stacked copies and the transposed dB
 * product live in the op's workspace (lt_cpu_lora_workspace_bytes), after the base products are
 * done with it. */
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

void lt_cpu_lora_bwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                     float *dx, float beta, float *dlu, void *ws) {
    const int64_t in = p[0].w->shape[1];
    int na = 0;
    for (int g = 0; g < G; g++) {
        if (dx) lt_cpu_matmul(ctx, LT_MATMUL_NN, p[g].w, p[g].dy, n, g ? 1.0f : beta, dx, ws);
        na += p[g].a != NULL;
    }
    if (!na) return;
    const int64_t R = (int64_t)na * r;
    const int stacked = na > 1;
    float *t = ws; /* free now: the base products are done */
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
            if (dx) lt_cpu_gemm(ctx, 0, 0, n, in, r, 1.0f, d, r, P->a, in, 1.0f, dx, in);
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
            lt_cpu_gemm(ctx, 0, 0, n, in, R, 1.0f, dlu, R, t, in, 1.0f, dx, in);
        }
    }
    lt_prof_end(ph);
}
