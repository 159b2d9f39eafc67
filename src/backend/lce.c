/* The public boundary of the linear cross-entropy (include/longtune/lce.h): validates options,
 * shapes, dtypes, targets and weights once, asks the backend of h's device whether it serves the
 * request (head dtype, impl: supports.c), resolves the options (impl, ignore index) and calls that
 * backend's lce slot. The implementations trust what reaches them (lce_impl.h); this file knows no
 * backend by name. */
#include <math.h>

#include "backend/backend.h"
#include "longtune/alloc.h"

/* Head dtypes the op takes at all; everything else is LT_ERR_DTYPE (which of them a backend
 * serves is its `supports`). */
static int head_dtype_ok(lt_dtype t) { return t == LT_DTYPE_F32 || t == LT_DTYPE_BF16 || lt_dtype_is_quantized(t); }
static int act_dtype_ok(lt_dtype t) { return t == LT_DTYPE_F32 || t == LT_DTYPE_BF16; }

static lt_status check_options(lt_ctx *ctx, const lt_lce_options *in, lt_lce_options *o) {
    *o = *in;
    if ((unsigned)o->impl > LT_LCE_NAIVE)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: unknown impl %d", (int)o->impl);
    if ((unsigned)o->reduction > LT_REDUCTION_NONE)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: unknown reduction %d", (int)o->reduction);
    if (o->ignore_index == 0) o->ignore_index = LT_IGNORE_INDEX;
    if (o->ignore_index > 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: ignore_index %d must be negative (it would shadow a token)",
                        (int)o->ignore_index);
    if (!(o->label_smoothing >= 0 && o->label_smoothing < 1))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: label_smoothing %g is outside [0, 1)",
                        (double)o->label_smoothing);
    if (!(o->z_loss >= 0 && isfinite(o->z_loss)))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: z_loss %g must be finite and >= 0", (double)o->z_loss);
    if (!(o->softcap >= 0 && isfinite(o->softcap)))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: softcap %g must be finite and >= 0", (double)o->softcap);
    if (o->tile_n < 0 || o->tile_v < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: tile_n %d / tile_v %d must be >= 0", o->tile_n, o->tile_v);
    /* AUTO is the fused kernel; every request that passes validation is one it serves on CPU. */
    if (o->impl == LT_LCE_AUTO) o->impl = LT_LCE_FUSED;
    return LT_OK;
}

static lt_status check_matrix(lt_ctx *ctx, const lt_tensor *t, const char *name, lt_device dev, int64_t rows,
                              int64_t cols) {
    if (t->ndim != 2) return lt_error(ctx, LT_ERR_SHAPE, "lce: %s must be 2-D, got %d dims", name, t->ndim);
    if (t->device != dev)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: %s is on device %d, h on device %d", name, (int)t->device,
                        (int)dev);
    if ((rows >= 0 && t->shape[0] != rows) || (cols >= 0 && t->shape[1] != cols))
        return lt_error(ctx, LT_ERR_SHAPE, "lce: %s is (%lld, %lld), expected (%lld, %lld)", name,
                        (long long)t->shape[0], (long long)t->shape[1], (long long)(rows >= 0 ? rows : t->shape[0]),
                        (long long)(cols >= 0 ? cols : t->shape[1]));
    if (!lt_tensor_is_contiguous(t))
        return lt_error(ctx, LT_ERR_SHAPE, "lce: %s must be contiguous (row-major, no padding)", name);
    return LT_OK;
}

/* Shapes, dtypes and pointers; data pointers only when `data` (workspace sizing passes views). */
static lt_status check_args(lt_ctx *ctx, const lt_lce_options *o, const lt_lce_args *a, int backward, int data) {
    if (!a) return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: args is NULL");
    lt_device dev = a->h.device;
    if ((unsigned)dev >= LT_DEVICE_COUNT_)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: h has unknown device %d", (int)dev);
    LT_TRY(check_matrix(ctx, &a->h, "h", dev, -1, -1));
    int64_t N = a->h.shape[0], C = a->h.shape[1], V = a->w.shape[0];
    if (!act_dtype_ok(a->h.dtype))
        return lt_error(ctx, LT_ERR_DTYPE, "lce: h must be f32 or bf16, got %s", lt_dtype_name(a->h.dtype));
    if (!head_dtype_ok(a->w.dtype))
        return lt_error(ctx, LT_ERR_DTYPE, "lce: head w must be f32, bf16 or a block format (q8_0, q4_k, ...), got %s",
                        lt_dtype_name(a->w.dtype));
    LT_TRY(check_matrix(ctx, &a->w, "w", dev, -1, C));
    if (N < 1 || C < 1 || V < 1)
        return lt_error(ctx, LT_ERR_SHAPE, "lce: empty problem (N=%lld, V=%lld, C=%lld)", (long long)N, (long long)V,
                        (long long)C);
    /* BLAS takes int dimensions and leading dimensions. */
    if (N > INT32_MAX || V > INT32_MAX || C > INT32_MAX)
        return lt_error(ctx, LT_ERR_SHAPE, "lce: N=%lld, V=%lld or C=%lld exceeds 2^31-1", (long long)N, (long long)V,
                        (long long)C);
    if (C % lt_dtype_block_elems(a->w.dtype))
        return lt_error(ctx, LT_ERR_SHAPE, "lce: C=%lld is not a multiple of the %s block (%lld weights)", (long long)C,
                        lt_dtype_name(a->w.dtype), (long long)lt_dtype_block_elems(a->w.dtype));
    if (N > INT64_MAX / V || N > INT64_MAX / C || V > INT64_MAX / C || N * V > INT64_MAX / 8)
        return lt_error(ctx, LT_ERR_SHAPE, "lce: N·V or V·C overflows");
    if (backward) { /* pass 1 or 2 */
        if (!a->dh) return lt_error(ctx, LT_ERR_INVALID_ARG, "lce backward: dh is NULL");
        LT_TRY(check_matrix(ctx, a->dh, "dh", dev, N, C));
        if (!act_dtype_ok(a->dh->dtype))
            return lt_error(ctx, LT_ERR_DTYPE, "lce backward: dh must be f32 or bf16, got %s",
                            lt_dtype_name(a->dh->dtype));
        if (a->dw) {
            if (a->w.dtype != LT_DTYPE_F32 && a->w.dtype != LT_DTYPE_BF16)
                return lt_error(
                    ctx, LT_ERR_UNSUPPORTED,
                    "lce backward: grad of a %s head is not computed (quantized heads are frozen); pass dw = NULL",
                    lt_dtype_name(a->w.dtype));
            LT_TRY(check_matrix(ctx, a->dw, "dw", dev, V, C));
            if (a->dw->dtype != LT_DTYPE_F32)
                return lt_error(ctx, LT_ERR_DTYPE, "lce backward: dw must be f32, got %s", lt_dtype_name(a->dw->dtype));
        }
    }
    if (data) {
        if (!a->h.data || !a->w.data || !a->targets || !a->lse || (backward != 1 && !a->loss))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: h, w, targets, lse%s must be set",
                            backward == 1 ? "" : " and loss");
        if (backward && (!a->dloss || !a->dh->data || (a->dw && !a->dw->data)))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "lce backward: dloss, dh (and dw when given) must have data");
        if ((uintptr_t)a->workspace % LT_ALLOC_ALIGN_HOST)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: workspace must be %d-byte aligned", LT_ALLOC_ALIGN_HOST);
    }
    (void)o;
    return LT_OK;
}

/* Targets in [0, V) or the ignore index, weights finite and >= 0; host memory. */
static lt_status check_targets_host(lt_ctx *ctx, const lt_lce_options *o, const lt_lce_args *a) {
    int64_t N = a->h.shape[0], V = a->w.shape[0];
    for (int64_t i = 0; i < N; i++) {
        int32_t t = a->targets[i];
        if (t != o->ignore_index && (t < 0 || t >= V))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "lce: target %d at position %lld is outside [0, %lld) and is not the ignore index %d",
                            (int)t, (long long)i, (long long)V, (int)o->ignore_index);
        if (a->token_weight && !(a->token_weight[i] >= 0 && isfinite(a->token_weight[i])))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: token_weight %g at position %lld must be finite and >= 0",
                            (double)a->token_weight[i], (long long)i);
    }
    return LT_OK;
}

static lt_op_query query(const lt_lce_options *requested, const lt_lce_args *a) {
    const lt_op_query q = {.op = LT_OP_LCE,
                           .dtype = a->h.dtype,
                           .wdtype = a->w.dtype,
                           .impl = (int)requested->impl,
                           .softcap = requested->softcap};
    return q;
}

/* pass: LT_LCE_PASS_FORWARD, _BACKWARD or _FORWARD_BACKWARD. */
static lt_status run(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a, int pass) {
    static const lt_lce_options defaults;
    const lt_lce_options *req = opt ? opt : &defaults;
    lt_lce_options o;
    LT_TRY(check_options(ctx, req, &o));
    LT_TRY(check_args(ctx, &o, a, pass, 1));
    if (pass == LT_LCE_PASS_FORWARD_BACKWARD && !a->dloss)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce forward_backward: dloss must be set (it is an input)");
    const lt_op_query q = query(req, a);
    LT_TRY(lt_backend_supports(ctx, a->h.device, &q));
    /* Host targets are checked here; a device's own copy is checked by that backend (lce_impl.h). */
    if (a->h.device == LT_DEVICE_CPU) LT_TRY(check_targets_host(ctx, &o, a));
    const lt_backend *be = lt_backend_get(a->h.device);
    return pass == LT_LCE_PASS_FORWARD_BACKWARD ? be->lce_fwd_bwd(ctx, &o, a)
        : pass == LT_LCE_PASS_BACKWARD          ? be->lce_bwd(ctx, &o, a)
                                                : be->lce_fwd(ctx, &o, a);
}

lt_status lt_lce_forward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    return run(ctx, opt, a, LT_LCE_PASS_FORWARD);
}

lt_status lt_lce_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    return run(ctx, opt, a, LT_LCE_PASS_BACKWARD);
}

lt_status lt_lce_forward_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    return run(ctx, opt, a, LT_LCE_PASS_FORWARD_BACKWARD);
}

size_t lt_lce_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass, int threads) {
    static const lt_lce_options defaults;
    lt_lce_options o;
    if (pass < LT_LCE_PASS_FORWARD || pass > LT_LCE_PASS_FORWARD_BACKWARD) return 0;
    if (check_options(NULL, opt ? opt : &defaults, &o) != LT_OK || check_args(NULL, &o, a, pass, 0) != LT_OK) return 0;
    const lt_backend *be = lt_backend_get(a->h.device);
    return be ? be->lce_workspace_bytes(&o, a, pass, threads) : 0;
}
