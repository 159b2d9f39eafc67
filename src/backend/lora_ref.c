/* The reference LoRA projection ops (backend.h's lora_fwd / lora_bwd) composed from a backend's
 * matmul and gemm, projection by projection, in the order the model ran them before the fused
 * ops existed (so the CPU trainer's results did not change). No dropout here: the model keeps
 * its own path for LoRA dropout. The LoRA products are marked as nested gemm time for the op
 * profiler; the enclosing op is profiled as matmul. */
#include "backend/backend.h"
#include "backend/prof.h"

void lt_lora_fwd_ref(const lt_backend *be, lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n,
                     int64_t r, float s, float beta, void *ws) {
    int ran_base = 0;
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        const int64_t out = P->w->shape[0], in = P->w->shape[1];
        if (P->y && P->yc && P->yc != P->y && beta != 0.0f) { /* a copy within the device's memory */
            lt_status cs = be->copy_to_device(ctx, P->y, P->yc, sizeof(float) * (size_t)(n * out));
            LT_ASSERT(cs == LT_OK);
        }
        if (P->y) {
            be->matmul(ctx, ran_base ? LT_MATMUL_NT_SAME_X : LT_MATMUL_NT, P->w, x, n, beta, P->y, ws);
            ran_base = 1;
            if (P->bias) be->add_bias(ctx, P->y, P->bias, n, out);
        }
        if (!P->a) continue;
        const int ph = lt_prof_begin(be->device, LT_PROF_GEMM);
        be->gemm(ctx, 0, 1, n, r, in, 1.0f, x, in, P->a, in, 0.0f, P->lu, r);
        if (P->y) be->gemm(ctx, 0, 1, n, out, r, s, P->lu, r, P->b, r, 1.0f, P->y, out);
        lt_prof_end(ph);
    }
}

void lt_lora_bwd_ref(const lt_backend *be, lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n,
                     int64_t r, float s, float *dx, float beta, float *dlu, void *ws) {
    for (int g = 0; g < G; g++) {
        const lt_lora_proj *P = &p[g];
        const int64_t out = P->w->shape[0], in = P->w->shape[1];
        if (dx) be->matmul(ctx, LT_MATMUL_NN, P->w, P->dy, n, g ? 1.0f : beta, dx, ws);
        if (!P->a) continue;
        const int ph = lt_prof_begin(be->device, LT_PROF_GEMM);
        /* gb += s·dyᵀ·lu ; dlu = s·dy·B ; ga += dluᵀ·x ; dx += dlu·A */
        be->gemm(ctx, 1, 0, out, r, n, s, P->dy, out, P->lu, r, 1.0f, P->gb, r);
        be->gemm(ctx, 0, 0, n, r, out, s, P->dy, out, P->b, r, 0.0f, dlu, r);
        be->gemm(ctx, 1, 0, r, in, n, 1.0f, dlu, r, x, in, 1.0f, P->ga, in);
        if (dx) be->gemm(ctx, 0, 0, n, in, r, 1.0f, dlu, r, P->a, in, 1.0f, dx, in);
        lt_prof_end(ph);
    }
}
