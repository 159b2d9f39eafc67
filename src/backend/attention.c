/* The public boundary of attention: validates the params and args once (shapes, dtype, strides,
 * packed offsets, options), asks the device's backend whether it serves the request (head dim,
 * dtype: supports.c), resolves the defaults, provides the workspace through the accounting
 * allocator when the caller passes none, and calls the backend's attention slot. A per-batch
 * preparation (lt_attention_batch_prepare) runs the offsets' validation and the backend's
 * batch slot once; calls that pass it check only that it matches. It computes nothing itself and
 * knows no backend by name. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "longtune/alloc.h"

static int64_t layout_span(const lt_attention_layout *l, int64_t B, int64_t T, int64_t heads, int64_t D) {
    /* Largest element offset + 1 the layout reaches; -1 on overflow. */
    int64_t span = D, t;
    const int64_t ext[3] = {B, T, heads}, str[3] = {l->batch, l->token, l->head};
    for (int i = 0; i < 3; i++) {
        if (__builtin_mul_overflow(ext[i] - 1, str[i], &t) || __builtin_add_overflow(span, t, &span)) return -1;
    }
    return span;
}

static lt_attention_layout layout_resolve(lt_attention_layout l, int64_t T, int64_t heads, int64_t D) {
    if (l.batch == 0 && l.token == 0 && l.head == 0) {
        l.head = D;
        l.token = heads * D;
        l.batch = T * heads * D;
    }
    return l;
}

static lt_status layout_check(lt_ctx *ctx, const char *name, lt_attention_layout l, int64_t B, int64_t T, int64_t heads,
                              int64_t D) {
    l = layout_resolve(l, T, heads, D);
    const int64_t ext[3] = {B, T, heads}, str[3] = {l.batch, l.token, l.head};
    const char *dim[3] = {"batch", "token", "head"};
    for (int i = 0; i < 3; i++) {
        if (str[i] < 0 || (ext[i] > 1 && str[i] < D))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "attention: %s %s stride %lld must be >= D = %lld (rows would overlap)", name, dim[i],
                            (long long)str[i], (long long)D);
    }
    if (l.token > INT_MAX)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: %s token stride %lld exceeds INT_MAX", name,
                        (long long)l.token);
    if (layout_span(&l, B, T, heads, D) < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: %s layout overflows int64", name);
    return LT_OK;
}

/* The packed rows' offsets: each row starts at 0, never decreases and ends at T. */
static lt_status offsets_check(lt_ctx *ctx, const lt_attention_params *p) {
    if (!p->seq_offsets) return LT_OK;
    for (int64_t b = 0; b < p->B; b++) {
        const int32_t *o = p->seq_offsets + b * (p->S + 1);
        if (o[0] != 0)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: seq_offsets row %lld starts at %d, not 0",
                            (long long)b, (int)o[0]);
        for (int64_t s = 1; s <= p->S; s++)
            if (o[s] < o[s - 1])
                return lt_error(ctx, LT_ERR_INVALID_ARG,
                                "attention: seq_offsets row %lld index %lld: %d < %d (not monotone)", (long long)b,
                                (long long)s, (int)o[s], (int)o[s - 1]);
        if (o[p->S] != p->T)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "attention: seq_offsets row %lld ends at %d, not T = %lld (must cover the row)",
                            (long long)b, (int)o[p->S], (long long)p->T);
    }
    return LT_OK;
}

/* A prepared batch stands for the offsets' check only when it was made for this very batch. */
static lt_status batch_match(lt_ctx *ctx, const lt_attention_params *p) {
    const lt_attention_batch *b = p->batch;
    if (b->B != p->B || b->T != p->T || b->S != p->S || b->window != p->window || b->device != p->device)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "attention: prepared batch (B=%lld T=%lld S=%lld window=%lld device %d) does not match "
                        "the call (B=%lld T=%lld S=%lld window=%lld device %d)",
                        (long long)b->B, (long long)b->T, (long long)b->S, (long long)b->window, (int)b->device,
                        (long long)p->B, (long long)p->T, (long long)p->S, (long long)p->window, (int)p->device);
    if (b->seq_offsets != p->seq_offsets || b->seq_offsets_device != p->seq_offsets_device)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "attention: prepared batch was made for other seq_offsets (%p, device %p; the call "
                        "passes %p, device %p)",
                        (const void *)b->seq_offsets, (const void *)b->seq_offsets_device, (const void *)p->seq_offsets,
                        (const void *)p->seq_offsets_device);
    return LT_OK;
}

lt_status lt_attention_check(lt_ctx *ctx, const lt_attention_params *p) {
    if (!p) return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: params is NULL");
    if (p->B < 1 || p->T < 1 || p->H < 1 || p->Hkv < 1 || p->D < 1)
        return lt_error(ctx, LT_ERR_SHAPE, "attention: B=%lld T=%lld H=%lld Hkv=%lld D=%lld must all be >= 1",
                        (long long)p->B, (long long)p->T, (long long)p->H, (long long)p->Hkv, (long long)p->D);
    if (p->H % p->Hkv)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: H=%lld is not a multiple of Hkv=%lld", (long long)p->H,
                        (long long)p->Hkv);
    int64_t n;
    if (__builtin_mul_overflow(p->B, p->T, &n) || __builtin_mul_overflow(n, p->H, &n) ||
        __builtin_mul_overflow(n, p->D, &n) || n > INT64_MAX / 4)
        return lt_error(ctx, LT_ERR_SHAPE, "attention: B*T*H*D overflows");
    if ((unsigned)p->device >= LT_DEVICE_COUNT_)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: unknown device %d", (int)p->device);
    if ((unsigned)p->impl > LT_ATTENTION_NAIVE)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: unknown impl %d", (int)p->impl);
    if (p->dtype != LT_DTYPE_F32 && p->dtype != LT_DTYPE_BF16 && p->dtype != LT_DTYPE_F16)
        return lt_error(ctx, LT_ERR_DTYPE, "attention: dtype %s is not accepted (f32, bf16)", lt_dtype_name(p->dtype));
    if (!isfinite(p->scale) || p->scale < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: scale %g must be finite and > 0 (0 = 1/sqrt(D))",
                        (double)p->scale);
    if (!isfinite(p->softcap) || p->softcap < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: softcap %g must be finite and >= 0", (double)p->softcap);
    if (p->window < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: window %lld is negative", (long long)p->window);
    if (p->bf16_products < 0 || p->bf16_products > 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: bf16_products %d is not 0 or 1", p->bf16_products);
    LT_TRY(layout_check(ctx, "q", p->q_layout, p->B, p->T, p->H, p->D));
    LT_TRY(layout_check(ctx, "kv", p->kv_layout, p->B, p->T, p->Hkv, p->D));
    LT_TRY(layout_check(ctx, "out", p->o_layout, p->B, p->T, p->H, p->D));
    if (!p->seq_offsets && p->S != 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: S=%lld given without seq_offsets", (long long)p->S);
    if (p->seq_offsets) {
        if (p->S < 1 || p->S > INT32_MAX)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: S=%lld sequences per row must be in 1..INT32_MAX",
                            (long long)p->S);
        if (__builtin_mul_overflow(p->B, p->S + 1, &n))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "attention: B*(S+1) offsets overflow");
    }
    LT_TRY(p->batch ? batch_match(ctx, p) : offsets_check(ctx, p));
    const lt_op_query q = {.op = LT_OP_ATTENTION,
                           .dtype = p->dtype,
                           .impl = (int)p->impl,
                           .head_dim = p->D,
                           .window = p->window,
                           .softcap = p->softcap};
    return lt_backend_supports(ctx, p->device, &q);
}

size_t lt_attention_workspace_bytes(const lt_attention_params *p, int backward, int threads) {
    if (!p) return 0;
    const lt_backend *be = lt_backend_get(p->device);
    return be ? be->attention_workspace_bytes(p, backward != 0, threads) : 0;
}

size_t lt_attention_batch_bytes(const lt_attention_params *p) {
    if (!p) return 0;
    const lt_backend *be = lt_backend_get(p->device);
    return be ? be->attention_batch_bytes(p) : 0;
}

lt_status lt_attention_batch_prepare(lt_ctx *ctx, const lt_attention_params *p, void *buffer, size_t bytes,
                                     lt_attention_batch *out) {
    if (!out) return lt_error(ctx, LT_ERR_INVALID_ARG, "attention batch: out is NULL");
    memset(out, 0, sizeof *out);
    if (!p) return lt_error(ctx, LT_ERR_INVALID_ARG, "attention batch: params is NULL");
    lt_attention_params r = *p;
    r.batch = NULL;
    LT_TRY(lt_attention_check(ctx, &r));
    const size_t need = lt_attention_batch_bytes(&r);
    const uintptr_t align = p->device == LT_DEVICE_CPU ? LT_ALLOC_ALIGN_HOST : LT_ALLOC_ALIGN_DEVICE;
    if (need && (!buffer || bytes < need))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention batch: buffer of %zu bytes, %zu needed",
                        buffer ? bytes : (size_t)0, need);
    if (need && (uintptr_t)buffer % align)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "attention batch: buffer %p is not aligned to %u bytes", buffer,
                        (unsigned)align);
    out->B = p->B, out->T = p->T, out->S = p->S, out->window = p->window, out->device = p->device;
    out->seq_offsets = p->seq_offsets, out->seq_offsets_device = p->seq_offsets_device;
    out->bounds = need ? buffer : NULL;
    const lt_backend *be = lt_backend_get(p->device);
    if (!be) return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention batch: no backend for device %d", (int)p->device);
    /* The backend reads the offsets' copy it uses in its kernels, as in run(). */
    if (p->device != LT_DEVICE_CPU && p->seq_offsets && p->seq_offsets_device) r.seq_offsets = p->seq_offsets_device;
    r.seq_offsets_device = NULL;
    lt_status s = be->attention_batch_prepare(ctx, &r, out);
    if (s != LT_OK) memset(out, 0, sizeof *out);
    return s;
}

static lt_status run(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a, int backward) {
    LT_TRY(lt_attention_check(ctx, p));
    const char *what = backward ? "attention backward" : "attention forward";
    if (!a) return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: args is NULL", what);
    if (!a->q || !a->k || !a->v || !a->out || !a->lse)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: q, k, v, out and lse must all be set", what);
    if (backward && (!a->dout || !a->dq || !a->dk || !a->dv))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: dout, dq, dk and dv must all be set", what);

    lt_attention_params r = *p;
    /* Validated above on the host copy; the kernels take the device one when there is one. */
    if (p->device != LT_DEVICE_CPU && p->seq_offsets && p->seq_offsets_device) r.seq_offsets = p->seq_offsets_device;
    r.seq_offsets_device = NULL;
    r.q_layout = layout_resolve(p->q_layout, p->T, p->H, p->D);
    r.kv_layout = layout_resolve(p->kv_layout, p->T, p->Hkv, p->D);
    r.o_layout = layout_resolve(p->o_layout, p->T, p->H, p->D);
    if (r.scale == 0) r.scale = 1.0f / sqrtf((float)p->D);
    if (r.impl == LT_ATTENTION_AUTO) r.impl = LT_ATTENTION_FLASH;

    const lt_backend *be = lt_backend_get(p->device);
    if (!be) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: no backend for device %d", what, (int)p->device);
    lt_status (*fn)(lt_ctx *, const lt_attention_params *, lt_attention_args *) =
        backward ? be->attention_bwd : be->attention_fwd;

    size_t need = lt_attention_workspace_bytes(p, backward, lt_ctx_threads(ctx));
    lt_attention_args w = *a;
    if (a->workspace) {
        const uintptr_t align = p->device == LT_DEVICE_CPU ? LT_ALLOC_ALIGN_HOST : LT_ALLOC_ALIGN_DEVICE;
        if ((uintptr_t)a->workspace % align)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: workspace %p is not aligned to %u bytes", what, a->workspace,
                            (unsigned)align);
        if (a->workspace_size < need)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: workspace of %zu bytes, %zu needed", what, a->workspace_size,
                            need);
        return fn(ctx, &r, &w);
    }
    w.workspace_size = need;
    if (need) {
        w.workspace = lt_alloc(ctx, p->device, need, "attention workspace");
        if (!w.workspace) return lt_ctx_status(ctx);
    }
    lt_status s = fn(ctx, &r, &w);
    if (need) lt_free(ctx, p->device, w.workspace, need);
    return s;
}

lt_status lt_attention_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return run(ctx, p, a, 0);
}

lt_status lt_attention_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return run(ctx, p, a, 1);
}
