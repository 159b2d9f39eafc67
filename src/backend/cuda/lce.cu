/* Linear cross-entropy on NVIDIA GPUs, chunked: logits are made tile by tile (Nc tokens x Vc
 * vocabulary entries, fp32) by cuBLASLt bf16 tensor-core GEMMs into a bounded workspace, reduced
 * at once into per-token online log-sum-exp statistics (forward), or turned into the bf16 logit
 * gradient in place and multiplied back into dh (and dW) by two more GEMMs (backward). The
 * forward_backward call makes each logit tile once: exp(z - m) against a running reference max m
 * feeds an fp32 dh accumulator (rescaled when m moves), so loss and dh cost two GEMMs. Nothing of
 * size (N, V) is ever stored: the workspace stays under 64 MiB whatever N·V is. Quantized heads
 * are dequantized one vocabulary tile at a time. Gradient filtering of negligible tiles is not
 * done: with the tolerance against the CPU reference it would not pay on dense softmaxes. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_state.cuh"
extern "C" {
#include "backend/lce_impl.h"
}

#include <cublasLt.h>
#include <math.h>
#include <string.h>

/* Tuning constants: the workspace budget bounds Nc·Vc; Nc = 2048 tokens forward, 1024 backward
 * (its fp32 dh accumulator is Nc·C·4 bytes; 2048 measured slower, dev/cuda/README.md). cuBLASLt
 * gets 4 MiB of scratch for its kernels. */
#define LCE_BUDGET ((size_t)56 << 20)
#define LCE_BLAS_WS ((size_t)4 << 20)
#define LCE_NC_DEFAULT 2048
#define LCE_VC_MAX 8192 /* the gradient kernel stages one fp32 logit row (32 KiB) in shared memory */
#define LCE_THREADS 256
/* forward_backward: Nc = 1024 tokens (fp32 dh accumulator 16 MiB at C = 4096) and one logit tile
 * as wide as the budget allows (Vc up to 18432 with bf16 logits, which need no staging; 8192 with fp32
 * logits, staged in shared memory by the statistics kernel), inside 60 MiB. Measured
 * on the H200 (dev/cuda/README.md): the vocabulary width is what pays (fewer read-modify-writes of
 * the accumulator); a wider token chunk did not, and running the next tile's GEMM 1 on a second
 * stream beside the statistics kernel and GEMM 2 gained nothing (cuBLASLt's kernels fill the GPU)
 * while doubling the logit buffer, so there is one stream. The reference max of a token moves only
 * when a tile's max exceeds it by LCE_FB_MARGIN: exp(z - m) <= e^16 stays far from fp32/bf16
 * overflow even summed over any vocabulary, and a row rescale (C multiplies) is then rare after
 * the first tile. The logit tile is bf16 unless the options ask for fp32 (lt_lce_options.
 * fp32_logit_tiles): on the H200 the bf16 tile took 31.9 ms against 33.7 ms (its GEMM 1 writes and
 * the statistics kernel reads half the bytes, and the tile is twice as wide in the same memory). */
#define LCE_FB_BUDGET ((size_t)60 << 20)
#define LCE_FB_NC_DEFAULT 1024
#define LCE_FB_VC_MAX_BF16 18432
#define LCE_FB_MARGIN 16.0f
/* Blocks per SM the bf16 statistics kernel is compiled for. Its row lives in registers (36 a
 * thread for the logits at the widest tile), and it fits the cap of 65536 / (256 x 4) = 64 a
 * thread without spilling; more resident warps keep more loads in flight. Under Nsight Compute on
 * an H100 (clocks at base, N = 8192, V = 151936, C = 4096): 27.2 us a tile at 2 blocks (86
 * registers), 25.5 at 3 (80), 24.4 at 4 (64); warps active 21 -> 39 % of the peak, DRAM 49 -> 54 %
 * of its peak. The whole call's time moved less than its spread between runs (30.2-31.8 ms). */
#define LCE_FB_STATS_BLOCKS 4

typedef struct lce_plan {
    int64_t Nc, Vc, ldz;
    int fb; /* forward_backward layout (accumulator, column sums, 8 stats arrays) */
    int zb; /* bytes per logit of the tile: 4, or 2 for bf16 logits (forward_backward) */
    size_t off_stats, off_misc, off_blas, off_acc, off_deq, off_z, off_colsum, total;
} lce_plan;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Workspace offsets of a plan whose Nc, Vc and zb are set: `stats` fp32 arrays of N, a misc
 * block, cuBLASLt's workspace, the fp32 (Nc, C) accumulator (acc bytes), the column sums of W
 * (label smoothing), the dequantized weight tile, the logit tile. */
static void lce_plan_layout(lce_plan *pl, int64_t N, int64_t C, int stats, size_t acc, int colsum, int quantized) {
    pl->ldz = (pl->Vc + 7) / 8 * 8;
    size_t off = 0;
    pl->off_stats = off;
    off += lt_cuda_align((size_t)N * (size_t)stats * 4);
    pl->off_misc = off;
    off += 256;
    pl->off_blas = off;
    off += LCE_BLAS_WS;
    pl->off_acc = off;
    off += lt_cuda_align(acc);
    pl->off_colsum = off;
    off += colsum ? lt_cuda_align((size_t)C * 4) : 0;
    pl->off_deq = off;
    off += quantized ? lt_cuda_align((size_t)pl->Vc * (size_t)C * 2) : 0;
    pl->off_z = off;
    off += lt_cuda_align((size_t)pl->Nc * (size_t)pl->ldz * (size_t)pl->zb);
    pl->total = off;
}

/* The one-pass forward_backward layout (see lt_lce_forward_backward in lce.h for when it is used). */
static lce_plan lce_make_fb_plan(const lt_lce_options *opt, int64_t N, int64_t V, int64_t C, int quantized) {
    lce_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.fb = 1;
    pl.zb = opt && opt->fp32_logit_tiles ? 4 : 2;
    pl.Nc = opt && opt->tile_n > 0 ? opt->tile_n : min64(N, LCE_FB_NC_DEFAULT);
    if (pl.Nc > N) pl.Nc = N;
    const int smooth = opt && opt->label_smoothing > 0.0f;
    size_t fixed = lt_cuda_align((size_t)N * 8 * 4) + 256 + LCE_BLAS_WS + lt_cuda_align((size_t)pl.Nc * (size_t)C * 4) +
        (smooth ? lt_cuda_align((size_t)C * 4) : 0);
    const int64_t vmax = pl.zb == 4 ? LCE_VC_MAX : LCE_FB_VC_MAX_BF16;
    int64_t vc;
    if (opt && opt->tile_v > 0) {
        vc = opt->tile_v;
    } else {
        size_t per_v = (size_t)pl.Nc * (size_t)pl.zb + (quantized ? (size_t)C * 2 : 0);
        size_t rest = LCE_FB_BUDGET > fixed + per_v * 128 ? LCE_FB_BUDGET - fixed : per_v * 128;
        vc = (int64_t)(rest / per_v);
        vc = vc >= 512 ? vc / 512 * 512 : vc / 128 * 128;
        if (vc > vmax) vc = vmax;
        /* As few tiles as that width allows, all of about the same width: a narrow last tile
         * leaves most SMs idle in its GEMM 1's final wave (V = 151936: nine tiles of 16896, not
         * nine of 16384 and one of 4480). */
        if (vc >= 128 && vc < V) {
            const int64_t ntiles = (V + vc - 1) / vc, g = vc >= 512 ? 256 : 128;
            vc = ((V + ntiles - 1) / ntiles + g - 1) / g * g;
        }
    }
    if (vc < 128) vc = 128;
    if (vc > vmax) vc = vmax;
    if (vc > V) vc = V;
    pl.Vc = vc;
    lce_plan_layout(&pl, N, C, 8, (size_t)pl.Nc * (size_t)C * 4, smooth, quantized);
    return pl;
}

extern "C" void lt_lce_cuda_fb_tiles(const lt_lce_options *opt, int64_t N, int64_t V, int64_t C, int quantized,
                                     int64_t *nc, int64_t *vc) {
    const lce_plan pl = lce_make_fb_plan(opt, N, V, C, quantized);
    *nc = pl.Nc;
    *vc = pl.Vc;
}

static lce_plan lce_make_plan(const lt_lce_options *opt, int64_t N, int64_t V, int64_t C, int backward, int quantized) {
    lce_plan pl;
    memset(&pl, 0, sizeof pl);
    /* The backward keeps an fp32 (Nc, C) dh accumulator that every vocabulary tile's GEMM reads
     * and writes: a smaller Nc leaves room for a wider Vc, which cuts that traffic. */
    pl.Nc = opt && opt->tile_n > 0 ? opt->tile_n : min64(N, backward ? LCE_NC_DEFAULT / 2 : LCE_NC_DEFAULT);
    if (pl.Nc < 1) pl.Nc = 1;
    size_t acc = backward ? (size_t)pl.Nc * (size_t)C * 4 : 0;
    size_t fixed = LCE_BLAS_WS + lt_cuda_align(acc);
    int64_t vc;
    if (opt && opt->tile_v > 0) {
        vc = opt->tile_v;
    } else {
        size_t per_v = (size_t)pl.Nc * 4 + (quantized ? (size_t)C * 2 : 0);
        size_t rest = LCE_BUDGET > fixed + per_v * 128 ? LCE_BUDGET - fixed : per_v * 128;
        vc = (int64_t)(rest / per_v) / 128 * 128;
    }
    if (vc < 128) vc = 128;
    if (vc > LCE_VC_MAX) vc = LCE_VC_MAX;
    if (vc > V) vc = V;
    pl.Vc = vc;
    pl.zb = 4;
    lce_plan_layout(&pl, N, C, 6, acc, 0, quantized);
    return pl;
}

static int lce_quantized(lt_dtype t) { return lt_dtype_is_quantized(t); }

/* forward_backward runs the one-pass kernels unless the request needs the final lse inside each
 * tile (lce.h): dw, or softcap together with label smoothing; chunked asks for the two calls. */
static int lce_fb_one_pass(const lt_lce_options *opt, const lt_lce_args *a) {
    if (a->dw) return 0;
    if (opt && opt->impl == LT_LCE_CHUNKED) return 0;
    return !(opt && opt->softcap > 0.0f && opt->label_smoothing > 0.0f);
}

extern "C" size_t lt_lce_cuda_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass, int threads) {
    (void)threads;
    const int64_t N = a->h.shape[0], V = a->w.shape[0], C = a->h.shape[1];
    const int q = lce_quantized(a->w.dtype);
    if (pass == LT_LCE_PASS_FORWARD_BACKWARD) {
        if (lce_fb_one_pass(opt, a)) return lce_make_fb_plan(opt, N, V, C, q).total;
        size_t f = lce_make_plan(opt, N, V, C, 0, q).total, b = lce_make_plan(opt, N, V, C, 1, q).total;
        return f > b ? f : b;
    }
    return lce_make_plan(opt, N, V, C, pass, q).total;
}

/* ------------------------------------------------------------------------------------------ */
/* cuBLASLt: row-major operands expressed as column-major ones. */

typedef struct lce_blas {
    cublasLtHandle_t lt;
    void *ws;
    struct {
        int ta, tb, ctype;
        int64_t m, n, k, lda, ldb, ldc;
        int ok;
        cublasLtMatmulAlgo_t algo;
    } cache[8];
    int ncache;
} lce_blas;

/* C (m x n, col-major, ldc, fp32 or bf16) = op(A) op(B) + beta·C, A and B bf16. */
static lt_status lce_gemm(lt_ctx *ctx, lce_blas *bl, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                          int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *Cm,
                          cudaDataType_t ctype, int64_t ldc) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t ad = NULL, bd = NULL, cd = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    lt_status st = LT_OK;
    float alpha = 1.0f;
    size_t wsb = LCE_BLAS_WS;
    cublasStatus_t s = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&ad, CUDA_R_16BF, (uint64_t)(ta == CUBLAS_OP_N ? m : k),
                                       (uint64_t)(ta == CUBLAS_OP_N ? k : m), lda);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&bd, CUDA_R_16BF, (uint64_t)(tb == CUBLAS_OP_N ? k : n),
                                       (uint64_t)(tb == CUBLAS_OP_N ? n : k), ldb);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&cd, ctype, (uint64_t)m, (uint64_t)n, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) {
        st = lt_error(ctx, LT_ERR_CUDA, "lce (CUDA): cuBLASLt descriptor setup failed (%d)", (int)s);
        goto done;
    }
    {
        int slot = -1;
        for (int i = 0; i < bl->ncache; i++)
            if (bl->cache[i].ta == (int)ta && bl->cache[i].tb == (int)tb && bl->cache[i].ctype == (int)ctype &&
                bl->cache[i].m == m && bl->cache[i].n == n && bl->cache[i].k == k && bl->cache[i].lda == lda &&
                bl->cache[i].ldb == ldb && bl->cache[i].ldc == ldc)
                slot = i;
        if (slot < 0) {
            cublasLtMatmulHeuristicResult_t res;
            int nres = 0;
            s = cublasLtMatmulPreferenceCreate(&pref);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                         sizeof wsb);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = cublasLtMatmulAlgoGetHeuristic(bl->lt, op, ad, bd, cd, cd, pref, 1, &res, &nres);
            if (s != CUBLAS_STATUS_SUCCESS || nres < 1) {
                st = lt_error(ctx, LT_ERR_CUDA, "lce (CUDA): cuBLASLt has no algorithm for %lld x %lld x %lld (%d)",
                              (long long)m, (long long)n, (long long)k, (int)s);
                goto done;
            }
            slot = bl->ncache < 8 ? bl->ncache++ : 7;
            bl->cache[slot].ta = (int)ta;
            bl->cache[slot].tb = (int)tb;
            bl->cache[slot].ctype = (int)ctype;
            bl->cache[slot].m = m;
            bl->cache[slot].n = n;
            bl->cache[slot].k = k;
            bl->cache[slot].lda = lda;
            bl->cache[slot].ldb = ldb;
            bl->cache[slot].ldc = ldc;
            bl->cache[slot].algo = res.algo;
        }
        s = cublasLtMatmul(bl->lt, op, &alpha, A, ad, B, bd, &beta, Cm, cd, Cm, cd, &bl->cache[slot].algo, bl->ws, wsb,
                           lt_cuda_stream(ctx));
        if (s != CUBLAS_STATUS_SUCCESS)
            st = lt_error(ctx, LT_ERR_CUDA, "lce (CUDA): cuBLASLt matmul failed (%d)", (int)s);
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (cd) cublasLtMatrixLayoutDestroy(cd);
    if (bd) cublasLtMatrixLayoutDestroy(bd);
    if (ad) cublasLtMatrixLayoutDestroy(ad);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels. Row statistics live in the workspace as six (N) fp32 arrays:
 * m (running max), s (Σ exp(z - m)), sumz (Σ z), zt (target logit), and two scratch arrays. */

static __device__ __forceinline__ float lce_cap(float z, float cap) { return cap > 0.0f ? cap * tanhf(z / cap) : z; }

/* first_bad[0]: first target outside [0, V) that is not the ignore index; first_bad[1]: first
 * weight that is negative or not finite. */
static __global__ void lce_check_targets(const int32_t *tgt, const float *tw, int64_t N, int64_t V, int32_t ign,
                                         int64_t *first_bad) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int32_t t = tgt[i];
    if (t != ign && (t < 0 || (int64_t)t >= V)) atomicMin((unsigned long long *)first_bad, (unsigned long long)i);
    if (tw && !(tw[i] >= 0.0f && isfinite(tw[i])))
        atomicMin((unsigned long long *)(first_bad + 1), (unsigned long long)i);
}

static __global__ void lce_init_stats(float *m, float *s, float *sumz, float *zt, int64_t N) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    m[i] = -INFINITY;
    s[i] = 0.0f;
    sumz[i] = 0.0f;
    zt[i] = 0.0f;
}

static __device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

/* One block per token row of the chunk: folds the row's vc logits into the running statistics. */
static __global__ void __launch_bounds__(LCE_THREADS)
    lce_fwd_stats(const float *Z, int64_t ldz, int vc, int64_t v0, const int32_t *tgt, float cap, float *m, float *s,
                  float *sumz, float *zt) {
    const int64_t i = blockIdx.x;
    const float *z = Z + i * ldz;
    const int32_t t = tgt[i];
    float lm = -INFINITY, ls = 0.0f, lz = 0.0f;
    for (int j = threadIdx.x; j < vc; j += LCE_THREADS) {
        float x = lce_cap(z[j], cap);
        if (x > lm) {
            ls = ls * __expf(lm - x) + 1.0f;
            lm = x;
        } else {
            ls += __expf(x - lm);
        }
        lz += x;
        if ((int64_t)t == v0 + j) zt[i] = x;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, lm, o), s2 = __shfl_xor_sync(0xffffffffu, ls, o);
        lse_merge(lm, ls, m2, s2);
        lz += __shfl_xor_sync(0xffffffffu, lz, o);
    }
    __shared__ float sm[LCE_THREADS / 32], ss[LCE_THREADS / 32], sz[LCE_THREADS / 32];
    const int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        sm[w] = lm;
        ss[w] = ls;
        sz[w] = lz;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = m[i], Sx = s[i], Z2 = 0.0f;
        for (int k = 0; k < LCE_THREADS / 32; k++) {
            lse_merge(M, Sx, sm[k], ss[k]);
            Z2 += sz[k];
        }
        m[i] = M;
        s[i] = Sx;
        sumz[i] += Z2;
    }
}

typedef struct lce_consts {
    int32_t ignore;
    float eps, zl, cap, invV;
    int reduction;
} lce_consts;

/* Per token: lse, loss; scratch a = weighted loss, b = weight of non-ignored tokens. */
static __global__ void lce_fwd_finish(lce_consts k, int64_t N, const int32_t *tgt, const float *tw, const float *m,
                                      const float *s, const float *sumz, const float *zt, float *lse, float *token_loss,
                                      float *sa, float *sb, float *loss_none) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float l = m[i] + __logf(s[i]);
    lse[i] = tgt[i] != k.ignore ? l : 0.0f; /* lce.h: 0 for ignored tokens */
    float li = 0.0f, wi = 0.0f;
    if (tgt[i] != k.ignore) {
        wi = tw ? tw[i] : 1.0f;
        li = (1.0f - k.eps) * (l - zt[i]) + k.eps * (l - sumz[i] * k.invV) + k.zl * l * l;
        li *= wi;
    }
    if (token_loss) token_loss[i] = li;
    if (loss_none) loss_none[i] = li;
    sa[i] = li;
    sb[i] = wi;
}

/* One block: out[0] = Σa, out[1] = Σb in double, fixed order (deterministic). */
static __global__ void lce_sum2(const float *a, const float *b, int64_t N, double *out) {
    __shared__ double ra[1024], rb[1024];
    double x = 0.0, y = 0.0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        x += a ? (double)a[i] : 0.0;
        y += (double)b[i];
    }
    ra[threadIdx.x] = x;
    rb[threadIdx.x] = y;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) {
            ra[threadIdx.x] += ra[threadIdx.x + o];
            rb[threadIdx.x] += rb[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = ra[0];
        out[1] = rb[0];
    }
}

static __global__ void lce_fwd_reduce_out(const double *sums, int reduction, float *loss) {
    if (reduction == LT_REDUCTION_MEAN) loss[0] = sums[1] > 0.0 ? (float)(sums[0] / sums[1]) : 0.0f;
    else loss[0] = (float)sums[0];
}

/* Backward per-token coefficient: upstream gradient times weight (0 for ignored tokens). */
static __global__ void lce_bwd_coef(lce_consts k, int64_t N, const int32_t *tgt, const float *tw, const float *dloss,
                                    const double *sums, float *coef) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float c = 0.0f;
    if (tgt[i] != k.ignore) {
        float w = tw ? tw[i] : 1.0f;
        if (k.reduction == LT_REDUCTION_NONE) c = dloss[i] * w;
        else if (k.reduction == LT_REDUCTION_SUM) c = dloss[0] * w;
        else c = sums[1] > 0.0 ? (float)((double)dloss[0] * w / sums[1]) : 0.0f;
    }
    coef[i] = c;
}

static __global__ void lce_weights(const int32_t *tgt, const float *tw, int32_t ign, int64_t N, float *wout) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    wout[i] = tgt[i] != ign ? (tw ? tw[i] : 1.0f) : 0.0f;
}

/* One block per token row: dz_j = c·((1 + 2·zl·lse)·p_j - (1-ε)[j = t] - ε/V)·cap'(z_j), written
 * as bf16 over the first half of the same row (ld 2·ldz bf16) after the row is staged. */
static __global__ void __launch_bounds__(LCE_THREADS)
    lce_bwd_grad(float *Z, int64_t ldz, int vc, int64_t v0, lce_consts k, const int32_t *tgt, const float *lse,
                 const float *coef) {
    extern __shared__ float zrow[];
    const int64_t i = blockIdx.x;
    float *z = Z + i * ldz;
    __nv_bfloat16 *g = (__nv_bfloat16 *)z;
    const float c = coef[i];
    if (c == 0.0f) {
        for (int j = threadIdx.x; j < vc; j += LCE_THREADS) g[j] = __float2bfloat16(0.0f);
        return;
    }
    for (int j = threadIdx.x; j < vc; j += LCE_THREADS) zrow[j] = z[j];
    __syncthreads();
    const float l = lse[i], a = 1.0f + 2.0f * k.zl * l, smooth = k.eps * k.invV;
    const int64_t t = tgt[i];
    for (int j = threadIdx.x; j < vc; j += LCE_THREADS) {
        float x = zrow[j], f = 1.0f;
        if (k.cap > 0.0f) {
            float th = tanhf(x / k.cap);
            x = k.cap * th;
            f = 1.0f - th * th;
        }
        float d = a * __expf(x - l) - smooth - (v0 + j == t ? 1.0f - k.eps : 0.0f);
        g[j] = __float2bfloat16(c * d * f);
    }
}

static __global__ void lce_store_dh(const float *acc, int64_t nc, int64_t C, void *dh, int dh_bf16, int64_t ld) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nc * C) return;
    int64_t r = i / C, col = i % C;
    if (dh_bf16) ((__nv_bfloat16 *)dh)[r * ld + col] = __float2bfloat16(acc[i]);
    else ((float *)dh)[r * ld + col] = acc[i];
}

/* Dequantizes rows [v0, v0+vc) of a block-quantized (V, C) head into bf16 (vc, C). One thread per
 * block of 32 (64 for INT4_G64) weights. */
static __global__ void lce_dequant(const uint8_t *w, int dtype, int64_t row_bytes, int64_t C, int64_t v0, int vc,
                                   __nv_bfloat16 *out) {
    const int be = dtype == LT_DTYPE_INT4_G64 ? 64 : 32;
    const int64_t nb = C / be;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)vc * nb) return;
    int64_t r = idx / nb, bi = idx % nb;
    __nv_bfloat16 *o = out + r * C + bi * be;
    const uint8_t *p = w + (v0 + r) * row_bytes;
    if (dtype == LT_DTYPE_Q8_0) {
        p += bi * 34;
        float d = __half2float(*(const __half *)p);
        for (int j = 0; j < 32; j++) o[j] = __float2bfloat16((float)(int8_t)p[2 + j] * d);
    } else if (dtype == LT_DTYPE_Q4_0) {
        p += bi * 18;
        float d = __half2float(*(const __half *)p);
        for (int j = 0; j < 16; j++) {
            o[j] = __float2bfloat16((float)((p[2 + j] & 0xf) - 8) * d);
            o[j + 16] = __float2bfloat16((float)((p[2 + j] >> 4) - 8) * d);
        }
    } else if (dtype == LT_DTYPE_Q4_1) {
        p += bi * 20;
        float d = __half2float(*(const __half *)p), mn = __half2float(*(const __half *)(p + 2));
        for (int j = 0; j < 16; j++) {
            o[j] = __float2bfloat16((float)(p[4 + j] & 0xf) * d + mn);
            o[j + 16] = __float2bfloat16((float)(p[4 + j] >> 4) * d + mn);
        }
    } else {
        p += bi * 36;
        float sc = __half2float(*(const __half *)p), bias = __half2float(*(const __half *)(p + 2));
        for (int q = 0; q < 8; q++) {
            uint32_t v;
            memcpy(&v, p + 4 + 4 * q, 4);
            for (int j = 0; j < 8; j++) o[q * 8 + j] = __float2bfloat16((float)((v >> (4 * j)) & 0xfu) * sc + bias);
        }
    }
}

/* The same for the formats beyond Q4_1 (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS), one thread per
 * 32-weight group (lt_dq_group32_ext: a 256-weight super-block is 8 of them); a kernel of its own
 * so that lce_dequant keeps its register budget. */
static __global__ void lce_dequant_ext(const uint8_t *w, int dtype, int64_t row_bytes, int64_t C, int64_t v0, int vc,
                                       __nv_bfloat16 *out) {
    const int64_t ng = C / 32;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)vc * ng) return;
    const int64_t r = idx / ng, g = idx % ng;
    float v[32];
    lt_dq_group32_ext((lt_dtype)dtype, w + (v0 + r) * row_bytes, g, v);
    __nv_bfloat16 *o = out + r * C + g * 32;
    for (int j = 0; j < 32; j++) o[j] = __float2bfloat16(v[j]);
}

/* ---- forward_backward (one pass) ---- */

static __device__ __forceinline__ float lce_block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* red may still be read from a previous reduction */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.0f;
    for (int k = 0; k < LCE_THREADS / 32; k++) t += red[k]; /* fixed order: deterministic */
    return t;
}

static __device__ __forceinline__ float lce_block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int k = 0; k < LCE_THREADS / 32; k++) t = fmaxf(t, red[k]);
    return t;
}

/* The row's reference max after a tile whose max is tmax: the tile's on the first tile, else moved
 * up only past LCE_FB_MARGIN; *f = exp(old - new) rescales the row's sum and accumulator (1 when it
 * stays). */
static __device__ __forceinline__ float lce_fb_reference(int first, float mo, float tmax, float *f) {
    *f = 1.0f;
    if (first) return tmax;
    if (tmax <= mo + LCE_FB_MARGIN) return mo;
    *f = __expf(mo - tmax);
    return tmax;
}

/* acc[0..C) *= f by the block's threads. */
static __device__ __forceinline__ void lce_fb_rescale(float *acc, int64_t C, float f) {
    for (int64_t c = threadIdx.x; c < C; c += LCE_THREADS) acc[c] *= f;
}

/* One block per token row of the chunk, vocabulary tile [v0, v0+vc): folds the (softcapped)
 * logits into the row statistics against the reference max m (set by the first tile, moved up
 * only past LCE_FB_MARGIN, which rescales s and the row's fp32 dh accumulator), then writes
 * E_j = exp(z_j - m)·cap'(z_j) as bf16 for the accumulator GEMM. This one reads an fp32 tile: E
 * goes over the first half of the same row (ld 2·ldz bf16), so the row is staged in shared memory
 * (vc floats) before it is overwritten (a bf16 tile: lce_fb_stats_bf16 below). */
static __global__ void __launch_bounds__(LCE_THREADS)
    lce_fb_stats(float *Z, int64_t ldz, int vc, int64_t v0, const int32_t *tgt, float cap, int first, float *m,
                 float *s, float *sumz, float *zt, float *acc, int64_t C) {
    extern __shared__ float zrow[];
    __shared__ float red[LCE_THREADS / 32];
    __shared__ float s_zt, s_m, s_f;
    __shared__ int s_found;
    const int64_t i = blockIdx.x;
    float *z = Z + i * ldz;
    const int64_t t = tgt[i];
    if (threadIdx.x == 0) s_found = 0;
    __syncthreads();
    float lm = -INFINITY, lz = 0.0f;
    for (int j = threadIdx.x; j < vc; j += LCE_THREADS) {
        float x = lce_cap(z[j], cap);
        zrow[j] = x;
        lm = fmaxf(lm, x);
        lz += x;
        if (v0 + j == t) {
            s_zt = x;
            s_found = 1;
        }
    }
    const float tmax = lce_block_max(lm, red);
    const float tsum = lce_block_sum(lz, red);
    if (threadIdx.x == 0) {
        s_m = lce_fb_reference(first, first ? -INFINITY : m[i], tmax, &s_f);
    }
    __syncthreads();
    const float mn = s_m, f = s_f;
    if (f != 1.0f) lce_fb_rescale(acc + i * C, C, f);
    __nv_bfloat16 *g = (__nv_bfloat16 *)z;
    const float icap = cap > 0.0f ? 1.0f / cap : 0.0f;
    float ls = 0.0f;
    for (int j = threadIdx.x; j < vc; j += LCE_THREADS) {
        float x = zrow[j], e = __expf(x - mn), th = x * icap;
        ls += e;
        g[j] = __float2bfloat16(e * (1.0f - th * th));
    }
    const float tse = lce_block_sum(ls, red);
    if (threadIdx.x == 0) {
        m[i] = mn;
        s[i] = first ? tse : s[i] * f + tse;
        sumz[i] = first ? tsum : sumz[i] + tsum;
        if (first || s_found) zt[i] = s_found ? s_zt : 0.0f;
    }
}

/* max, Σ a and Σ b over the block in one exchange (the same shuffle order and fixed warp order as
 * lce_block_max and lce_block_sum, so each result is bit-identical to theirs). */
static __device__ __forceinline__ void lce_block_stats3(float *mx, float *sa, float *sb,
                                                        float (*red)[LCE_THREADS / 32]) {
    float m = *mx, a = *sa, b = *sb;
    for (int o = 16; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    __syncthreads(); /* red may still be read from a previous reduction */
    if ((threadIdx.x & 31) == 0)
        red[0][threadIdx.x >> 5] = m, red[1][threadIdx.x >> 5] = a, red[2][threadIdx.x >> 5] = b;
    __syncthreads();
    m = -INFINITY, a = 0.0f, b = 0.0f;
    for (int k = 0; k < LCE_THREADS / 32; k++) m = fmaxf(m, red[0][k]), a += red[1][k], b += red[2][k];
    *mx = m, *sa = a, *sb = b;
}

/* The statistics kernel over a bf16 logit tile (the default), each row read once: a thread loads its LCE_FB_NV vectors
 * of 8 logits (16-byte loads; element j = 8·(k·LCE_THREADS + thread) + e) into registers, folds
 * them into the statistics, and writes E from the same registers over the logits (E_j at z_j's
 * index). Rows are 16-byte aligned (ldz is a multiple of 8); a vector that straddles vc reads
 * padding of the row (never used) and writes only its elements below vc. Same arithmetic per
 * element as lce_fb_stats.
 * After the first tile the row's reference max is already known, and it stays where it is unless
 * this tile's max passes it by LCE_FB_MARGIN. So E is formed against it straight from the loads,
 * written, and the tile's max, Σz and Σe come out of one block exchange; only when the max does
 * pass it (rare after the first tile) is E formed again, from the registers, against the new one.
 * The first tile takes its max first. Either way the results are those of forming E after the
 * max, bit for bit. */
#define LCE_FB_NV (LCE_FB_VC_MAX_BF16 / (LCE_THREADS * 8))
/* Word q (0..3, a constant once unrolled) of a vector; the two bf16 of a word as floats (exact). */
static __device__ __forceinline__ uint32_t lce_word(const uint4 &u, int q) {
    return q == 0 ? u.x : q == 1 ? u.y : q == 2 ? u.z : u.w;
}
static __device__ __forceinline__ float2 lce_bf2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
static __device__ __forceinline__ uint32_t lce_pack_bf2(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return (uint32_t)__bfloat16_as_ushort(v.x) | (uint32_t)__bfloat16_as_ushort(v.y) << 16;
}

/* E = exp(x - mn)·cap'(x) over the thread's vectors, written over the logits; returns the thread's
 * Σ exp(x - mn) and, with STATS, also folds the logits into its max and Σz. */
template <bool CAP, bool STATS>
static __device__ __forceinline__ float lce_fb_form_e(__nv_bfloat16 *z, const uint4 *raw, int vc, float cap, float mn,
                                                      float *lm, float *lz) {
    const float icap = CAP ? 1.0f / cap : 0.0f;
    float ls = 0.0f;
#pragma unroll
    for (int k = 0; k < LCE_FB_NV; k++) {
        const int j0 = (k * LCE_THREADS + (int)threadIdx.x) * 8;
        if (j0 >= vc) continue;
        uint32_t o[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float2 x = lce_bf2(lce_word(raw[k], q));
            if (CAP) x = make_float2(lce_cap(x.x, cap), lce_cap(x.y, cap));
            const bool in0 = j0 + 2 * q < vc, in1 = j0 + 2 * q + 1 < vc;
            if (STATS) {
                if (in0) *lm = fmaxf(*lm, x.x), *lz += x.x;
                if (in1) *lm = fmaxf(*lm, x.y), *lz += x.y;
            }
            const float e0 = __expf(x.x - mn), e1 = __expf(x.y - mn);
            ls += (in0 ? e0 : 0.0f) + (in1 ? e1 : 0.0f);
            if (CAP) {
                const float t0 = x.x * icap, t1 = x.y * icap;
                o[q] = lce_pack_bf2(e0 * (1.0f - t0 * t0), e1 * (1.0f - t1 * t1));
            } else {
                o[q] = lce_pack_bf2(e0, e1);
            }
        }
        if (j0 + 8 <= vc) {
            *(uint4 *)(z + j0) = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
            unsigned short *zs = (unsigned short *)z;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                if (j0 + 2 * q < vc) zs[j0 + 2 * q] = (unsigned short)(o[q] & 0xffffu);
                if (j0 + 2 * q + 1 < vc) zs[j0 + 2 * q + 1] = (unsigned short)(o[q] >> 16);
            }
        }
    }
    return ls;
}

template <bool CAP>
static __global__ void __launch_bounds__(LCE_THREADS, LCE_FB_STATS_BLOCKS)
    lce_fb_stats_bf16(__nv_bfloat16 *Z, int64_t ldz, int vc, int64_t v0, const int32_t *tgt, float cap, int first,
                      float *m, float *s, float *sumz, float *zt, float *acc, int64_t C) {
    __shared__ float red[3][LCE_THREADS / 32];
    const int64_t i = blockIdx.x;
    __nv_bfloat16 *z = Z + i * ldz;
    uint4 raw[LCE_FB_NV];
#pragma unroll
    for (int k = 0; k < LCE_FB_NV; k++) {
        const int j = (k * LCE_THREADS + (int)threadIdx.x) * 8;
        raw[k] = j < vc ? *(const uint4 *)(z + j) : make_uint4(0u, 0u, 0u, 0u);
    }
    /* The target's logit, read by thread 0 before a barrier that every write of E follows. */
    if (threadIdx.x == 0) {
        const int64_t t = tgt[i] - v0; /* the target's column in this tile, if it is in it */
        const int found = t >= 0 && t < vc;
        if (first || found) zt[i] = found ? lce_cap(__bfloat162float(z[t]), cap) : 0.0f;
    }
    float mo, lm = -INFINITY, lz = 0.0f;
    if (first) {
#pragma unroll
        for (int k = 0; k < LCE_FB_NV; k++) {
            const int j0 = (k * LCE_THREADS + (int)threadIdx.x) * 8;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float2 f = lce_bf2(lce_word(raw[k], q));
                if (CAP) f = make_float2(lce_cap(f.x, cap), lce_cap(f.y, cap));
                if (j0 + 2 * q < vc) lm = fmaxf(lm, f.x);
                if (j0 + 2 * q + 1 < vc) lm = fmaxf(lm, f.y);
            }
        }
        /* Opaque to the compiler: the pass below converts the logits again rather than keeping 64
         * floats a thread live across the reduction (which spilled). */
#pragma unroll
        for (int k = 0; k < LCE_FB_NV; k++)
            asm volatile("" : "+r"(raw[k].x), "+r"(raw[k].y), "+r"(raw[k].z), "+r"(raw[k].w));
        mo = lce_block_max(lm, red[0]); /* its barriers also order thread 0's target read first */
        lm = -INFINITY;
    } else {
        mo = m[i];
        __syncthreads(); /* thread 0's target read before any thread writes E */
    }
    float ls = lce_fb_form_e<CAP, true>(z, raw, vc, cap, mo, &lm, &lz);
    lce_block_stats3(&lm, &lz, &ls, red);
    /* lm, lz, ls: the tile's max, Σz and Σ exp(z - mo), the same in every thread */
    float f = 1.0f, mn = mo;
    if (!first && !(lm <= mo + LCE_FB_MARGIN)) { /* the reference moves: E again against the new one */
        mn = lm;
        f = __expf(mo - lm);
        lce_fb_rescale(acc + i * C, C, f);
        float dummy_m = 0.0f, dummy_z = 0.0f;
        ls = lce_block_sum(lce_fb_form_e<CAP, false>(z, raw, vc, cap, mn, &dummy_m, &dummy_z), red[0]);
    }
    if (threadIdx.x == 0) {
        m[i] = mn;
        s[i] = first ? ls : s[i] * f + ls;
        sumz[i] = first ? lz : sumz[i] + lz;
    }
}

/* colsum[c] (+)= Σ_r wt[r][c] over a bf16 (vc, C) tile, fixed order: Σ_j W_j for label smoothing. */
static __global__ void lce_colsum(const __nv_bfloat16 *wt, int vc, int64_t C, float *colsum, int first) {
    __shared__ float red[8][33];
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float a = 0.0f;
    if (col < C)
        for (int r = threadIdx.y; r < vc; r += 8) a += __bfloat162float(wt[(int64_t)r * C + col]);
    red[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += red[k][threadIdx.x];
        colsum[col] = first ? t : colsum[col] + t;
    }
}

/* Element (row, col) of a (V, C) head in any head dtype, as fp32 (layouts as in lce_dequant). EXT:
 * the formats beyond Q4_1 (lt_dq_elem), instantiated apart so that the other heads' kernels keep
 * their register budget. */
template <bool EXT>
static __device__ float lce_w_elem(const void *w, int dtype, int64_t row_bytes, int64_t row, int64_t col) {
    const uint8_t *p = (const uint8_t *)w + row * row_bytes;
    if (EXT) return lt_dq_elem((lt_dtype)dtype, p, col);
    if (dtype == LT_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[col]);
    const int be = dtype == LT_DTYPE_INT4_G64 ? 64 : 32;
    const int64_t bi = col / be;
    const int j = (int)(col % be);
    if (dtype == LT_DTYPE_Q8_0) {
        p += bi * 34;
        return (float)(int8_t)p[2 + j] * __half2float(*(const __half *)p);
    }
    if (dtype == LT_DTYPE_Q4_0) {
        p += bi * 18;
        const int q = j < 16 ? (p[2 + j] & 0xf) : (p[2 + j - 16] >> 4);
        return (float)(q - 8) * __half2float(*(const __half *)p);
    }
    if (dtype == LT_DTYPE_Q4_1) {
        p += bi * 20;
        const int q = j < 16 ? (p[4 + j] & 0xf) : (p[4 + j - 16] >> 4);
        return (float)q * __half2float(*(const __half *)p) + __half2float(*(const __half *)(p + 2));
    }
    p += bi * 36;
    uint32_t v;
    memcpy(&v, p + 4 + 4 * (j / 8), 4);
    return (float)((v >> (4 * (j % 8))) & 0xfu) * __half2float(*(const __half *)p) +
        __half2float(*(const __half *)(p + 2));
}

/* One block per token row of the chunk, after its last vocabulary tile: lse, loss, and
 * dh = c·[(1 + 2·zl·lse)/s · acc − ε/V · Σ_j W_j − (1−ε)·cap'(z_t) · W_t] (0 for ignored rows or
 * a zero coefficient). sa gets the weighted loss for the reduction. */
template <bool EXT>
static __global__ void __launch_bounds__(LCE_THREADS)
    lce_fb_finish(lce_consts k, const int32_t *tgt, const float *tw, const float *m, const float *s, const float *sumz,
                  const float *zt, const float *coef, const float *acc, int64_t C, const float *colsum, const void *w,
                  int wdtype, int64_t w_row_bytes, void *dh, int dh_bf16, int64_t ld_dh, float *lse, float *token_loss,
                  float *loss_none, float *sa) {
    const int64_t i = blockIdx.x;
    const int32_t t = tgt[i];
    const int ign = t == k.ignore;
    const float l = m[i] + __logf(s[i]);
    if (threadIdx.x == 0) {
        float li = 0.0f;
        if (!ign) {
            li = (1.0f - k.eps) * (l - zt[i]) + k.eps * (l - sumz[i] * k.invV) + k.zl * l * l;
            li *= tw ? tw[i] : 1.0f;
        }
        lse[i] = ign ? 0.0f : l;
        if (token_loss) token_loss[i] = li;
        if (loss_none) loss_none[i] = li;
        sa[i] = li;
    }
    const float c = coef[i];
    __nv_bfloat16 *db = (__nv_bfloat16 *)dh + i * ld_dh;
    float *df = (float *)dh + i * ld_dh;
    if (ign || c == 0.0f) {
        for (int64_t col = threadIdx.x; col < C; col += LCE_THREADS) {
            if (dh_bf16) db[col] = __float2bfloat16(0.0f);
            else df[col] = 0.0f;
        }
        return;
    }
    const float A = c * (1.0f + 2.0f * k.zl * l) / s[i], B = c * k.eps * k.invV;
    const float th = k.cap > 0.0f ? zt[i] / k.cap : 0.0f, T = c * (1.0f - k.eps) * (1.0f - th * th);
    const float *ar = acc + i * C;
    for (int64_t col = threadIdx.x; col < C; col += LCE_THREADS) {
        float v = A * ar[col] - T * lce_w_elem<EXT>(w, wdtype, w_row_bytes, t, col);
        if (colsum) v -= B * colsum[col];
        if (dh_bf16) db[col] = __float2bfloat16(v);
        else df[col] = v;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The entry points. */

typedef struct lce_run {
    lce_plan pl;
    char *ws;
    size_t ws_bytes;
    int own_ws;
    int quantized;
    int64_t N, V, C, row_bytes;
    lce_consts k;
    lce_blas bl;
    float *m, *s, *sumz, *zt, *sa, *sb, *coef; /* coef: forward_backward layout only */
    double *sums;
    int64_t *bad;
    float *z, *acc;
    __nv_bfloat16 *deq;
} lce_run;

static unsigned nblk(int64_t n, int t) { return (unsigned)((n + t - 1) / t); }

/* pass: LT_LCE_PASS_FORWARD, _BACKWARD, or _FORWARD_BACKWARD (the one-pass layout). */
static lt_status lce_begin(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a, int pass, lce_run *r) {
    const int backward = pass != LT_LCE_PASS_FORWARD;
    memset(r, 0, sizeof *r);
    const lt_tensor *h = &a->h, *w = &a->w;
    if (h->device != LT_DEVICE_CUDA || w->device != LT_DEVICE_CUDA)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): h and w must both be on the device");
    if (h->dtype != LT_DTYPE_BF16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): h dtype %s; only bf16 is implemented",
                        lt_dtype_name(h->dtype));
    /* head dtype and impl: served ones only (lt_backend_cuda_supports, supports.c) */
    r->quantized = lt_dtype_is_quantized(w->dtype);
    r->N = h->shape[0];
    r->C = h->shape[1];
    r->V = w->shape[0];
    if (h->stride[1] != 1 || h->stride[0] != r->C || w->shape[1] != r->C ||
        (!r->quantized && (w->stride[1] != 1 || w->stride[0] != r->C)))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): h and w must be contiguous rows");
    r->row_bytes = lt_dtype_row_bytes(w->dtype, r->C);
    if (backward && a->dw && r->quantized)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): dw needs a dense head, got %s", lt_dtype_name(w->dtype));
    if (backward && a->dw && (a->dw->dtype != LT_DTYPE_F32 || a->dw->stride[1] != 1))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): dw must be contiguous f32");
    if (backward && (a->dh->dtype != LT_DTYPE_BF16 && a->dh->dtype != LT_DTYPE_F32))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): dh must be bf16 or f32");
    r->k.ignore = opt && opt->ignore_index ? opt->ignore_index : LT_IGNORE_INDEX;
    r->k.eps = opt ? opt->label_smoothing : 0.0f;
    r->k.zl = opt ? opt->z_loss : 0.0f;
    r->k.cap = opt ? opt->softcap : 0.0f;
    r->k.invV = 1.0f / (float)r->V;
    r->k.reduction = opt ? (int)opt->reduction : 0;

    r->pl = pass == LT_LCE_PASS_FORWARD_BACKWARD ? lce_make_fb_plan(opt, r->N, r->V, r->C, r->quantized)
                                                 : lce_make_plan(opt, r->N, r->V, r->C, backward, r->quantized);
    r->ws_bytes = r->pl.total;
    r->ws = (char *)a->workspace;
    if (!r->ws) {
        r->ws = (char *)lt_alloc(ctx, LT_DEVICE_CUDA, r->ws_bytes, "lce workspace");
        if (!r->ws) return lt_ctx_status(ctx);
        r->own_ws = 1;
    }
    const int64_t N = r->N;
    float *st = (float *)(r->ws + r->pl.off_stats);
    r->m = st;
    r->s = st + N;
    r->sumz = st + 2 * N;
    r->zt = st + 3 * N;
    r->sa = st + 4 * N;
    r->sb = st + 5 * N;
    r->coef = r->pl.fb ? st + 6 * N : NULL;
    r->sums = (double *)(r->ws + r->pl.off_misc);
    r->bad = (int64_t *)(r->ws + r->pl.off_misc + 64);
    r->bl.ws = r->ws + r->pl.off_blas;
    r->acc = (float *)(r->ws + r->pl.off_acc);
    r->deq = (__nv_bfloat16 *)(r->ws + r->pl.off_deq);
    r->z = (float *)(r->ws + r->pl.off_z);
    /* The context's cuBLASLt handle: creating one per call is host work in every step. */
    lt_cuda_state *cst = lt_cuda_state_of(ctx);
    if (!cst) return lt_error(ctx, LT_ERR_INVALID_ARG, "lce (CUDA): needs a context");
    pthread_mutex_lock(&cst->blas_mu);
    r->bl.lt = lt_cuda_blas_handle(cst);
    pthread_mutex_unlock(&cst->blas_mu);
    /* The model checks its targets on the host before the upload (targets_checked): no wait. */
    if (a->targets_checked) return LT_OK;

    /* Targets are on the device: find the first bad one there (this waits for the device). */
    int64_t none[2] = {INT64_MAX, INT64_MAX}, found[2];
    LT_TRY(lt_cuda_check(ctx, cudaMemcpy(r->bad, none, 16, cudaMemcpyHostToDevice), "lce: memcpy"));
    if (N > 0)
        lce_check_targets<<<nblk(N, 256), 256, 0, lt_cuda_stream(ctx)>>>(a->targets, a->token_weight, N, r->V,
                                                                         r->k.ignore, r->bad);
    LT_TRY(lt_cuda_check(ctx, cudaGetLastError(), "lce: target check kernel"));
    LT_TRY(lt_cuda_check(ctx, cudaMemcpy(found, r->bad, 16, cudaMemcpyDeviceToHost), "lce: memcpy"));
    const int64_t first = found[0];
    if (found[1] != INT64_MAX) {
        float wv = 0.0f;
        LT_TRY(
            lt_cuda_check(ctx, cudaMemcpy(&wv, a->token_weight + found[1], 4, cudaMemcpyDeviceToHost), "lce: memcpy"));
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: token_weight %g at position %lld must be finite and >= 0",
                        (double)wv, (long long)found[1]);
    }
    if (first != INT64_MAX) {
        int32_t t = 0;
        LT_TRY(lt_cuda_check(ctx, cudaMemcpy(&t, a->targets + first, 4, cudaMemcpyDeviceToHost), "lce: memcpy"));
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lce: targets[%lld] = %d is outside [0, %lld)", (long long)first,
                        (int)t, (long long)r->V);
    }
    return LT_OK;
}

static void lce_end(lt_ctx *ctx, lce_run *r) {
    if (r->own_ws) lt_free(ctx, LT_DEVICE_CUDA, r->ws, r->ws_bytes); /* waits for the GPU */
}

/* The bf16 (vc, C) rows of the head for vocabulary tile v0. */
static lt_status lce_wtile(lt_ctx *ctx, lce_run *r, const lt_lce_args *a, int64_t v0, int vc,
                           const __nv_bfloat16 **out) {
    if (!r->quantized) {
        *out = (const __nv_bfloat16 *)a->w.data + v0 * r->C;
        return LT_OK;
    }
    const int be = a->w.dtype == LT_DTYPE_INT4_G64 ? 64 : 32;
    auto *k = lt_dq_ext(a->w.dtype) ? lce_dequant_ext : lce_dequant;
    k<<<nblk((int64_t)vc * (r->C / be), 128), 128, 0, lt_cuda_stream(ctx)>>>((const uint8_t *)a->w.data,
                                                                             (int)a->w.dtype, r->row_bytes, r->C, v0,
                                                                             vc, r->deq);
    *out = r->deq;
    return lt_cuda_check(ctx, cudaGetLastError(), "lce: dequantize kernel");
}

/* Z (nc x vc, ld ldz, fp32) = h[n0 .. n0+nc) · Wtileᵀ */
static lt_status lce_logits(lt_ctx *ctx, lce_run *r, const lt_lce_args *a, int64_t n0, int64_t nc,
                            const __nv_bfloat16 *wt, int vc) {
    const __nv_bfloat16 *h = (const __nv_bfloat16 *)a->h.data + n0 * r->C;
    return lce_gemm(ctx, &r->bl, CUBLAS_OP_T, CUBLAS_OP_N, vc, nc, r->C, wt, r->C, h, r->C, 0.0f, r->z, CUDA_R_32F,
                    r->pl.ldz);
}

extern "C" lt_status lt_lce_cuda_forward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    lce_run r;
    lt_status st = lce_begin(ctx, opt, a, 0, &r);
    const int64_t N = r.N, V = r.V;
    if (st != LT_OK) goto done;
    if (N > 0) lce_init_stats<<<nblk(N, 256), 256, 0, lt_cuda_stream(ctx)>>>(r.m, r.s, r.sumz, r.zt, N);
    /* Vocabulary tiles outside, token tiles inside: a quantized tile is dequantized once. */
    for (int64_t v0 = 0; v0 < V && st == LT_OK; v0 += r.pl.Vc) {
        const int vc = (int)min64(r.pl.Vc, V - v0);
        const __nv_bfloat16 *wt = NULL;
        st = lce_wtile(ctx, &r, a, v0, vc, &wt);
        for (int64_t n0 = 0; n0 < N && st == LT_OK; n0 += r.pl.Nc) {
            const int64_t nc = min64(r.pl.Nc, N - n0);
            st = lce_logits(ctx, &r, a, n0, nc, wt, vc);
            if (st != LT_OK) break;
            lce_fwd_stats<<<(unsigned)nc, LCE_THREADS, 0, lt_cuda_stream(ctx)>>>(r.z, r.pl.ldz, vc, v0, a->targets + n0,
                                                                                 r.k.cap, r.m + n0, r.s + n0,
                                                                                 r.sumz + n0, r.zt + n0);
            st = lt_cuda_check(ctx, cudaGetLastError(), "lce: statistics kernel");
        }
    }
    if (st == LT_OK && N > 0) {
        const int none = r.k.reduction == LT_REDUCTION_NONE;
        lce_fwd_finish<<<nblk(N, 256), 256, 0, lt_cuda_stream(ctx)>>>(r.k, N, a->targets, a->token_weight, r.m, r.s,
                                                                      r.sumz, r.zt, a->lse, a->token_loss, r.sa, r.sb,
                                                                      none ? a->loss : NULL);
        if (!none) {
            lce_sum2<<<1, 1024, 0, lt_cuda_stream(ctx)>>>(r.sa, r.sb, N, r.sums);
            lce_fwd_reduce_out<<<1, 1, 0, lt_cuda_stream(ctx)>>>(r.sums, r.k.reduction, a->loss);
        }
        st = lt_cuda_check(ctx, cudaGetLastError(), "lce: loss kernels");
    } else if (st == LT_OK && r.k.reduction != LT_REDUCTION_NONE) {
        st = lt_cuda_check(ctx, cudaMemsetAsync(a->loss, 0, 4, lt_cuda_stream(ctx)), "lce: memset");
    }
done:
    lce_end(ctx, &r);
    return st;
}

/* coef (N) = upstream gradient x token weight, 0 for ignored tokens; the mean divides by the total
 * weight of the non-ignored tokens (r->sb and r->sums as scratch). */
static lt_status lce_coefficients(lt_ctx *ctx, lce_run *r, const lt_lce_args *a, float *coef) {
    const int64_t N = r->N;
    lce_weights<<<nblk(N, 256), 256, 0, lt_cuda_stream(ctx)>>>(a->targets, a->token_weight, r->k.ignore, N, r->sb);
    lce_sum2<<<1, 1024, 0, lt_cuda_stream(ctx)>>>(NULL, r->sb, N, r->sums);
    lce_bwd_coef<<<nblk(N, 256), 256, 0, lt_cuda_stream(ctx)>>>(r->k, N, a->targets, a->token_weight, a->dloss, r->sums,
                                                                coef);
    return lt_cuda_check(ctx, cudaGetLastError(), "lce: coefficient kernels");
}

extern "C" lt_status lt_lce_cuda_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    lce_run r;
    lt_status st = lce_begin(ctx, opt, a, 1, &r);
    const int64_t N = r.N, V = r.V, C = r.C;
    float *coef = r.sa;
    if (st != LT_OK || N == 0) goto done;
    st = lce_coefficients(ctx, &r, a, coef);
    /* Token tiles outside (dh accumulates in fp32 over the whole vocabulary), vocabulary inside. */
    for (int64_t n0 = 0; n0 < N && st == LT_OK; n0 += r.pl.Nc) {
        const int64_t nc = min64(r.pl.Nc, N - n0);
        const __nv_bfloat16 *h = (const __nv_bfloat16 *)a->h.data + n0 * C;
        for (int64_t v0 = 0; v0 < V && st == LT_OK; v0 += r.pl.Vc) {
            const int vc = (int)min64(r.pl.Vc, V - v0);
            const __nv_bfloat16 *wt = NULL;
            st = lce_wtile(ctx, &r, a, v0, vc, &wt);
            if (st == LT_OK) st = lce_logits(ctx, &r, a, n0, nc, wt, vc);
            if (st != LT_OK) break;
            lce_bwd_grad<<<(unsigned)nc, LCE_THREADS, (size_t)vc * 4, lt_cuda_stream(ctx)>>>(r.z, r.pl.ldz, vc, v0, r.k,
                                                                                             a->targets + n0,
                                                                                             a->lse + n0, coef + n0);
            st = lt_cuda_check(ctx, cudaGetLastError(), "lce: gradient kernel");
            const __nv_bfloat16 *g = (const __nv_bfloat16 *)r.z; /* (nc, vc), ld 2·ldz */
            /* acc (nc x C) += G · Wtile */
            if (st == LT_OK)
                st = lce_gemm(ctx, &r.bl, CUBLAS_OP_N, CUBLAS_OP_N, C, nc, vc, wt, C, g, 2 * r.pl.ldz,
                              v0 > 0 ? 1.0f : 0.0f, r.acc, CUDA_R_32F, C);
            /* dW[v0 .. v0+vc) (vc x C, f32) += Gᵀ · h */
            if (st == LT_OK && a->dw)
                st = lce_gemm(ctx, &r.bl, CUBLAS_OP_N, CUBLAS_OP_T, C, vc, nc, h, C, g, 2 * r.pl.ldz, 1.0f,
                              (float *)a->dw->data + v0 * a->dw->stride[0], CUDA_R_32F, a->dw->stride[0]);
        }
        if (st == LT_OK) {
            const int bf = a->dh->dtype == LT_DTYPE_BF16;
            char *dst = (char *)a->dh->data + (size_t)(n0 * a->dh->stride[0]) * (bf ? 2 : 4);
            lce_store_dh<<<nblk(nc * C, 256), 256, 0, lt_cuda_stream(ctx)>>>(r.acc, nc, C, dst, bf, a->dh->stride[0]);
            st = lt_cuda_check(ctx, cudaGetLastError(), "lce: dh store kernel");
        }
    }
done:
    lce_end(ctx, &r);
    return st;
}

/* One pass over the vocabulary per token chunk (lce.h, lt_lce_forward_backward): per vocabulary
 * tile, GEMM 1 makes the logit tile, the statistics kernel turns it into E in place (and moves the
 * reference max), GEMM 2 adds E · Wtile into the fp32 dh accumulator; after the last tile the
 * finish kernel writes lse, the per-token loss and dh. All on the default stream. */
extern "C" lt_status lt_lce_cuda_forward_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    if (!lce_fb_one_pass(opt, a)) {
        LT_TRY(lt_lce_cuda_forward(ctx, opt, a));
        return lt_lce_cuda_backward(ctx, opt, a);
    }
    lce_run r;
    lt_status st = lce_begin(ctx, opt, a, LT_LCE_PASS_FORWARD_BACKWARD, &r);
    if (st != LT_OK) {
        lce_end(ctx, &r);
        return st;
    }
    const int64_t N = r.N, V = r.V, C = r.C;
    const int zbf = r.pl.zb == 2, bf = a->dh->dtype == LT_DTYPE_BF16;
    float *colsum = r.k.eps > 0.0f ? (float *)(r.ws + r.pl.off_colsum) : NULL;
    /* Per-token coefficient (upstream gradient x weight; mean divides by the weight total). */
    st = lce_coefficients(ctx, &r, a, r.coef);
    for (int64_t n0 = 0; n0 < N && st == LT_OK; n0 += r.pl.Nc) {
        const int64_t nc = min64(r.pl.Nc, N - n0);
        const __nv_bfloat16 *h = (const __nv_bfloat16 *)a->h.data + n0 * C;
        for (int64_t v0 = 0; v0 < V && st == LT_OK; v0 += r.pl.Vc) {
            const int vc = (int)min64(r.pl.Vc, V - v0);
            const __nv_bfloat16 *wt = NULL;
            st = lce_wtile(ctx, &r, a, v0, vc, &wt);
            if (st == LT_OK) /* Z (nc x vc) = h_chunk · Wtileᵀ */
                st = lce_gemm(ctx, &r.bl, CUBLAS_OP_T, CUBLAS_OP_N, vc, nc, C, wt, C, h, C, 0.0f, r.z,
                              zbf ? CUDA_R_16BF : CUDA_R_32F, r.pl.ldz);
            if (st != LT_OK) break;
            if (colsum && n0 == 0)
                lce_colsum<<<nblk(C, 32), dim3(32, 8), 0, lt_cuda_stream(ctx)>>>(wt, vc, C, colsum, v0 == 0);
            if (zbf)
                (r.k.cap > 0.0f
                     ? lce_fb_stats_bf16<true>
                     : lce_fb_stats_bf16<
                           false>)<<<(unsigned)nc, LCE_THREADS, 0, lt_cuda_stream(ctx)>>>((__nv_bfloat16 *)r.z,
                                                                                          r.pl.ldz, vc, v0,
                                                                                          a->targets + n0, r.k.cap,
                                                                                          v0 == 0, r.m + n0, r.s + n0,
                                                                                          r.sumz + n0, r.zt + n0, r.acc,
                                                                                          C);
            else
                lce_fb_stats<<<(unsigned)nc, LCE_THREADS, (size_t)vc * 4, lt_cuda_stream(ctx)>>>(r.z, r.pl.ldz, vc, v0,
                                                                                                 a->targets + n0,
                                                                                                 r.k.cap, v0 == 0,
                                                                                                 r.m + n0, r.s + n0,
                                                                                                 r.sumz + n0, r.zt + n0,
                                                                                                 r.acc, C);
            st = lt_cuda_check(ctx, cudaGetLastError(), "lce: statistics kernel");
            /* acc (nc x C) (+)= E · Wtile; E is bf16 with ld 2·ldz (over fp32 logits) or ldz */
            if (st == LT_OK)
                st = lce_gemm(ctx, &r.bl, CUBLAS_OP_N, CUBLAS_OP_N, C, nc, vc, wt, C, r.z,
                              zbf ? r.pl.ldz : 2 * r.pl.ldz, v0 > 0 ? 1.0f : 0.0f, r.acc, CUDA_R_32F, C);
        }
        if (st != LT_OK) break;
        const int none = r.k.reduction == LT_REDUCTION_NONE;
        char *dst = (char *)a->dh->data + (size_t)(n0 * a->dh->stride[0]) * (bf ? 2 : 4);
        auto *fin = lt_dq_ext(a->w.dtype) ? lce_fb_finish<true> : lce_fb_finish<false>;
        fin<<<(unsigned)nc, LCE_THREADS, 0, lt_cuda_stream(ctx)>>>(r.k, a->targets + n0,
                                                                   a->token_weight ? a->token_weight + n0 : NULL,
                                                                   r.m + n0, r.s + n0, r.sumz + n0, r.zt + n0,
                                                                   r.coef + n0, r.acc, C, colsum, a->w.data,
                                                                   (int)a->w.dtype, r.row_bytes, dst, bf,
                                                                   a->dh->stride[0], a->lse + n0,
                                                                   a->token_loss ? a->token_loss + n0 : NULL,
                                                                   none ? a->loss + n0 : NULL, r.sa + n0);
        st = lt_cuda_check(ctx, cudaGetLastError(), "lce: finish kernel");
    }
    if (st == LT_OK && r.k.reduction != LT_REDUCTION_NONE) {
        lce_sum2<<<1, 1024, 0, lt_cuda_stream(ctx)>>>(r.sa, r.sb, N, r.sums);
        lce_fwd_reduce_out<<<1, 1, 0, lt_cuda_stream(ctx)>>>(r.sums, r.k.reduction, a->loss);
        st = lt_cuda_check(ctx, cudaGetLastError(), "lce: loss kernels");
    }
    lce_end(ctx, &r);
    return st;
}
