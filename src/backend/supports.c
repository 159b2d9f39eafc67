/* Which valid requests each backend serves: the one place a backend's refusals are written (head
 * dims, dtypes, impls), reached through its table's `supports` slot. Compiled in every build, so a
 * build without the CUDA backend still names why a CUDA request could not run anywhere before it
 * says the backend is missing. Validation of the request itself (shapes, strides, options) stays
 * at the public boundaries; nothing here computes. */
#include "backend/attention_impl.h"
#include "backend/backend.h"

static lt_status attention_dtype(lt_ctx *ctx, const lt_op_query *q) {
    if (q->dtype == LT_DTYPE_F16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention: dtype f16 is not supported (f32, bf16)");
    return LT_OK;
}

/* Decode attention reads an f32 cache on every backend; head dims up to a backend's limit. */
static lt_status decode_attention_common(lt_ctx *ctx, const lt_op_query *q, int64_t max_d, const char *be) {
    if (q->dtype != LT_DTYPE_F32)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "decode attention: dtype %s is not supported (f32)",
                        lt_dtype_name(q->dtype));
    if (q->head_dim > max_d || q->head_dim < 1)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "decode attention: head dim D=%lld outside the %s limit 1..%lld",
                        (long long)q->head_dim, be, (long long)max_d);
    if (q->window < 0 || q->softcap < 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "decode attention: negative window or softcap");
    return LT_OK;
}

lt_status lt_backend_cpu_supports(lt_ctx *ctx, const lt_op_query *q) {
    switch (q->op) {
    case LT_OP_ATTENTION:
        LT_TRY(attention_dtype(ctx, q));
        if (q->head_dim > LT_ATTENTION_CPU_MAX_D)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention: head dim D=%lld exceeds the CPU limit %d",
                            (long long)q->head_dim, LT_ATTENTION_CPU_MAX_D);
        return LT_OK;
    case LT_OP_LCE: /* every head dtype and impl the boundary accepts */ return LT_OK;
    case LT_OP_DECODE_ATTENTION: return decode_attention_common(ctx, q, LT_ATTENTION_CPU_MAX_D, "CPU");
    default: return lt_error(ctx, LT_ERR_UNSUPPORTED, "cpu backend: unknown op %d", (int)q->op);
    }
}

/* The CUDA decode kernel keeps a head's D values in registers, at most eight per lane of a warp. */
#define LT_DECODE_ATTENTION_CUDA_MAX_D 256

static int cuda_head_dim_ok(int64_t D) {
    static const int64_t dims[] = LT_ATTENTION_CUDA_HEAD_DIMS;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] == D) return 1;
    return 0;
}

lt_status lt_backend_cuda_supports(lt_ctx *ctx, const lt_op_query *q) {
    switch (q->op) {
    case LT_OP_ATTENTION:
        LT_TRY(attention_dtype(ctx, q));
        if (!cuda_head_dim_ok(q->head_dim))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "attention: head dim D=%lld has no CUDA kernel (" LT_ATTENTION_CUDA_HEAD_DIMS_TEXT ")",
                            (long long)q->head_dim);
        if (q->impl == LT_ATTENTION_NAIVE)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention (CUDA): the naive oracle is CPU-only");
        if (!LT_HAVE_CUDA_ATTENTION)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention: CUDA attention is not in this build");
        return LT_OK;
    case LT_OP_LCE:
        switch (q->wdtype) {
        case LT_DTYPE_BF16:
        case LT_DTYPE_Q8_0:
        case LT_DTYPE_Q4_0:
        case LT_DTYPE_Q4_1:
        case LT_DTYPE_INT4_G64:
        case LT_DTYPE_Q5_0:
        case LT_DTYPE_Q5_1:
        case LT_DTYPE_Q2_K:
        case LT_DTYPE_Q3_K:
        case LT_DTYPE_Q4_K:
        case LT_DTYPE_Q5_K:
        case LT_DTYPE_Q6_K:
        case LT_DTYPE_IQ4_NL:
        case LT_DTYPE_IQ4_XS: break;
        default:
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "lce (CUDA): head dtype %s; implemented: bf16, q8_0, q4_0, q4_1, int4_g64, q5_0, q5_1, "
                            "q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs",
                            lt_dtype_name(q->wdtype));
        }
        if (q->impl == LT_LCE_NAIVE)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): the naive oracle is CPU-only");
        if (!LT_HAVE_CUDA) return lt_error(ctx, LT_ERR_UNSUPPORTED, "CUDA linear cross-entropy is not in this build");
        return LT_OK;
    case LT_OP_DECODE_ATTENTION:
        LT_TRY(decode_attention_common(ctx, q, LT_DECODE_ATTENTION_CUDA_MAX_D, "CUDA"));
        if (!LT_HAVE_CUDA) return lt_error(ctx, LT_ERR_UNSUPPORTED, "CUDA decode attention is not in this build");
        return LT_OK;
    default: return lt_error(ctx, LT_ERR_UNSUPPORTED, "cuda backend: unknown op %d", (int)q->op);
    }
}
