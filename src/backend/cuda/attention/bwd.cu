/* lt_attention_cuda_backward: checks the call, prepares the parameter block, key bounds and
 * workspace, takes the plan of the heuristic (heuristics.cu; variant table in tuning.h) and runs
 * its kernels in order. On compute capability 9.0, D = 64 or 128, the wgmma kernels (bwd_wg.cu):
 * delta = rowsum(dO·O); the main kernel, where one CTA owns 128 keys (64 for rows whose queries
 * see few keys) of one kv head and walks every query head of its group (or a share of them, when
 * the row is short) and every 64-query tile that sees those keys, with dK and dV in registers; and
 * dQ either by fp32 vector atomics into a buffer converted afterwards (long causal rows) or by its
 * own kernel that recomputes S and dP per query tile, forms delta on the way and writes dQ once
 * (packed rows, small windows). Long causal rows without packing or window (T a multiple of 64,
 * one CTA per kv head) take the warp-specialised kernel of bwd_ws.cu instead of the main kernel.
 * D = 256 on compute capability 9.0 runs the wgmma kernel of bwd_wg256.cu (64 keys per CTA, D split
 * over its two warpgroups, dQ by atomics) between the same delta pass and dQ conversion.
 * D = 96 runs the D = 128 kernels (wgmma or warp-specialised) with columns 96..127 zero on load and
 * left unstored. Elsewhere (other GPUs): the mma.sync kernel of bwd_mma.cu with fp32 dQ atomics. Every
 * buffer is workspace sized by lt_attention_cuda_workspace_bytes from the same plan. */
#include "backend/cuda/attention/block.cuh"
#include "backend/cuda/attention/launch.h"
#include "backend/cuda/cuda_common.cuh"

/* delta[b,h,t] = Σ_d dO·O: 16 lanes per (b, t, h) row, 16-byte loads (a memory-bound pass over
 * out and dout; dq_acc is zeroed by cudaMemsetAsync, not here). */
template <int D> static __global__ void attn_bwd_delta(lt_attn_dev p, int B) {
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 4;
    const int sub = threadIdx.x & 15;
    const int64_t n = (int64_t)B * p.T * p.H;
    const bool live = row < n;
    const int64_t rr = live ? row : 0;
    const int h = (int)(rr % p.H), t = (int)((rr / p.H) % p.T), b = (int)(rr / ((int64_t)p.H * p.T));
    const __nv_bfloat16 *o = p.o + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
    const __nv_bfloat16 *g = p.dout + b * p.o_sb + (int64_t)t * p.o_st + h * p.o_sh;
    float acc = 0.0f;
#pragma unroll
    for (int d = sub * 8; d < D; d += 128) {
        if (!live) break;
        acc = lt_attn_dot8(acc, o + d, g + d);
    }
#pragma unroll
    for (int s = 8; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (live && sub == 0) p.delta[((int64_t)b * p.H + h) * p.T + t] = acc;
}

template <int D> static __global__ void attn_bwd_convert_dq(lt_attn_dev p, int B) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    int64_t n = (int64_t)B * p.T * p.H * D;
    if (i >= n) return;
    int d = (int)(i % D);
    int64_t r = i / D;
    int h = (int)(r % p.H), t = (int)((r / p.H) % p.T), b = (int)(r / ((int64_t)p.H * p.T));
    float2 v = *(const float2 *)(p.dq_acc + i);
    *(uint32_t *)(p.dq + b * p.dq_sb + (int64_t)t * p.dq_st + h * p.dq_sh + d) =
        lt_pack_bf16(v.x * p.scale, v.y * p.scale);
}

/* dK, dV from the fp32 sums of split CTAs (lt_attn_dev.dkv_acc, contiguous (B, T, Hkv, D) each). */
template <int D> static __global__ void attn_bwd_convert_dkv(lt_attn_dev p, int B) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    const int64_t n = (int64_t)B * p.T * p.Hkv * D;
    if (i >= n) return;
    const int d = (int)(i % D);
    const int64_t r = i / D;
    const int h = (int)(r % p.Hkv), t = (int)((r / p.Hkv) % p.T), b = (int)(r / ((int64_t)p.Hkv * p.T));
    const float2 k = *(const float2 *)(p.dkv_acc + i), v = *(const float2 *)(p.dkv_acc + n + i);
    const int64_t o = b * p.kv_sb + (int64_t)t * p.kv_st + h * p.kv_sh + d;
    *(uint32_t *)(p.dk + o) = lt_pack_bf16(k.x * p.scale, k.y * p.scale);
    *(uint32_t *)(p.dv + o) = lt_pack_bf16(v.x, v.y);
}
template <int D> static void bwd_delta_queue(const lt_attn_dev &d, int B, int64_t rows, cudaStream_t stream) {
    attn_bwd_delta<D><<<(unsigned)((rows * 16 + 255) / 256), 256, 0, stream>>>(d, B);
}

lt_status lt_attn_bwd_delta_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream) {
    const int64_t rows = (int64_t)B * d.T * d.H;
    switch (D) {
    case 64: bwd_delta_queue<64>(d, B, rows, stream); break;
    case 96: bwd_delta_queue<96>(d, B, rows, stream); break;
    case 256: bwd_delta_queue<256>(d, B, rows, stream); break;
    default: bwd_delta_queue<128>(d, B, rows, stream); break;
    }
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward: delta kernel");
}

static lt_status bwd_convert_dq(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream) {
    const int64_t n2 = (int64_t)B * d.T * d.H * D / 2;
    const unsigned blocks = (unsigned)((n2 + 255) / 256);
    switch (D) {
    case 64: attn_bwd_convert_dq<64><<<blocks, 256, 0, stream>>>(d, B); break;
    case 96: attn_bwd_convert_dq<96><<<blocks, 256, 0, stream>>>(d, B); break;
    case 256: attn_bwd_convert_dq<256><<<blocks, 256, 0, stream>>>(d, B); break;
    default: attn_bwd_convert_dq<128><<<blocks, 256, 0, stream>>>(d, B); break;
    }
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward: dq conversion kernel");
}

static lt_status bwd_convert_dkv(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream) {
    const int64_t n3 = (int64_t)B * d.T * d.Hkv * D / 2;
    const unsigned blocks = (unsigned)((n3 + 255) / 256);
    if (D == 64) attn_bwd_convert_dkv<64><<<blocks, 256, 0, stream>>>(d, B);
    else if (D == 96) attn_bwd_convert_dkv<96><<<blocks, 256, 0, stream>>>(d, B);
    else attn_bwd_convert_dkv<128><<<blocks, 256, 0, stream>>>(d, B);
    return lt_cuda_check(ctx, cudaGetLastError(), "attention backward: dk/dv conversion kernel");
}

/* The wgmma backward: delta (its own pass, or inside the dQ kernel when that runs first), the main
 * kernel (64 or 128 keys per CTA, or the warp-specialised one), then the conversions of whatever
 * went through fp32 sums. */
static lt_status bwd_wg_run(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, const lt_attn_bwd_plan &pl, int ws,
                            cudaStream_t stream) {
    if (ws) {
        LT_TRY(lt_attn_bwd_delta_launch(ctx, d, B, D, stream));
        return lt_attn_bwd_ws_launch(ctx, d, B, D, stream);
    }
    if (d.no_dq && pl.delta_dq) LT_TRY(lt_attn_bwd_dq_launch(ctx, d, B, D, 1, stream));
    else LT_TRY(lt_attn_bwd_delta_launch(ctx, d, B, D, stream));
    LT_TRY(lt_attn_bwd_wg_launch(ctx, d, B, D, pl.bn, stream));
    if (d.dkv_acc) LT_TRY(bwd_convert_dkv(ctx, d, B, D, stream));
    if (d.no_dq) return pl.delta_dq ? LT_OK : lt_attn_bwd_dq_launch(ctx, d, B, D, 0, stream);
    return bwd_convert_dq(ctx, d, B, D, stream);
}

/* The mma.sync backward: delta, the main kernel, the dQ conversion. */
static lt_status bwd_mma_run(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream) {
    LT_TRY(lt_attn_bwd_delta_launch(ctx, d, B, D, stream));
    LT_TRY(lt_attn_bwd_mma_launch(ctx, d, B, D, stream));
    return bwd_convert_dq(ctx, d, B, D, stream);
}

extern "C" lt_status lt_attention_cuda_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    LT_TRY(lt_attn_cuda_supported(ctx, p, p->Hkv)); /* the key/value heads span a grid axis */
    if (p->T == 0 || p->B == 0) return LT_OK;
    const cudaStream_t stream = lt_cuda_stream(ctx);
    size_t ws_bytes = lt_attention_cuda_workspace_bytes(p, 1, 0);
    void *ws = a->workspace;
    if (!ws) {
        ws = lt_alloc(ctx, LT_DEVICE_CUDA, ws_bytes, "attention backward workspace");
        if (!ws) return lt_ctx_status(ctx);
    }
    lt_attn_dev d;
    size_t used = 0;
    lt_status st = lt_attn_cuda_prepare(ctx, p, a, ws, &d, &used, stream);
    const lt_attn_cuda_tuning force = lt_attn_cuda_tuning_get();
    const lt_attn_bwd_plan pl = lt_attn_bwd_choose(p, lt_attn_cuda_device(), &force);
    const int use_ws = lt_attn_bwd_ws_eligible(p, &pl, a->lse);
    if (st == LT_OK) {
        /* Workspace after the key bounds: delta, then the fp32 dQ sums (unless dQ has its own
         * kernel), then the fp32 dK/dV sums of split CTAs. */
        char *w = (char *)ws + used;
        const size_t acc_bytes = (size_t)p->B * (size_t)p->T * (size_t)p->H * (size_t)lt_attn_dq_acc_cols(p, &pl) * 4;
        d.delta = (float *)w;
        w += lt_cuda_align((size_t)p->B * (size_t)p->H * (size_t)p->T * 4);
        d.nsplit = 1;
        d.no_dq = pl.dq_sep;
        if (!pl.dq_sep) {
            d.dq_acc = (float *)w;
            w += lt_cuda_align(acc_bytes);
            st = lt_cuda_check(ctx, cudaMemsetAsync(d.dq_acc, 0, acc_bytes, stream), "attention backward: memset");
        }
        if (st == LT_OK && pl.split > 1) {
            const size_t kv_bytes = (size_t)2 * (size_t)p->B * (size_t)p->T * (size_t)p->Hkv * (size_t)p->D * 4;
            d.nsplit = pl.split;
            d.dkv_acc = (float *)w;
            st = lt_cuda_check(ctx, cudaMemsetAsync(d.dkv_acc, 0, kv_bytes, stream), "attention backward: memset");
        }
    }
    if (st == LT_OK) {
        const int B = (int)p->B, D = (int)p->D;
        st = pl.wg ? bwd_wg_run(ctx, d, B, D, pl, use_ws, stream) : bwd_mma_run(ctx, d, B, D, stream);
    }
    if (!a->workspace) lt_free(ctx, LT_DEVICE_CUDA, ws, ws_bytes);
    return st;
}
