/* Decode attention on CUDA (flash-decoding): one query row per token over the keys its KV-cache row
 * holds. The visible keys of each (token, head) are split into chunks; a block of DEC_WARPS warps
 * runs an online softmax over one chunk (each warp a key at a time, a lane holding D/32 elements of
 * q and of the running output), merges its warps in shared memory and writes the chunk's max,
 * sum and unnormalised output to the workspace; the combine kernel rescales the chunks by their
 * maxima and normalises. Scores are cap·tanh(scale·q·k/cap) under a softcap, as the prefill
 * kernels compute them; GQA reads kv head h / (H / Hkv); a window keeps the last `window` keys.
 * f32 throughout (the cache is f32). */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_ops.h"

#define DEC_WARPS 4   /* warps per chunk block (also tried 8: no gain at D = 64, more idle warps) */
#define DEC_CHUNK 256 /* keys per chunk at least (short rows run one chunk) */
#define DEC_MAX_SPLITS 64
#define DEC_MAX_PER_LANE 8 /* D <= 256 */

static int64_t dec_splits(int64_t max_len) {
    int64_t s = (max_len + DEC_CHUNK - 1) / DEC_CHUNK;
    return s < 1 ? 1 : s > DEC_MAX_SPLITS ? DEC_MAX_SPLITS : s;
}

static __global__ void decode_split_k(lt_decode_attention_params p, int64_t splits, float *part) {
    const int64_t t = blockIdx.x, s = blockIdx.y, i = t / p.H, h = t % p.H, kvh = h / (p.H / p.Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t D = p.D, len = p.len[i], lo = p.window > 0 && len > p.window ? len - p.window : 0;
    const int64_t span = len - lo, chunk = (span + splits - 1) / splits;
    const int64_t k0 = lo + s * chunk, k1 = k0 + chunk < len ? k0 + chunk : len;
    const float *q = p.q + t * D;
    const float *kb = p.kc + ((int64_t)p.seq[i] * p.ctx * p.Hkv + kvh) * D;
    const float *vb = p.vc + ((int64_t)p.seq[i] * p.ctx * p.Hkv + kvh) * D;
    float qr[DEC_MAX_PER_LANE], acc[DEC_MAX_PER_LANE];
#pragma unroll
    for (int e = 0; e < DEC_MAX_PER_LANE; e++) {
        int64_t d = lane + 32 * e;
        qr[e] = d < D ? q[d] : 0.0f;
        acc[e] = 0.0f;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t j = k0 + warp; j < k1; j += DEC_WARPS) {
        const float *k = kb + j * p.Hkv * D, *v = vb + j * p.Hkv * D;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < DEC_MAX_PER_LANE; e++) {
            int64_t d = lane + 32 * e;
            if (d < D) dot += qr[e] * k[d];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float sc = dot * p.scale;
        if (p.softcap > 0.0f) sc = p.softcap * tanhf(sc / p.softcap);
        if (sc > mx) {
            float c = __expf(mx - sc);
            sum *= c;
#pragma unroll
            for (int e = 0; e < DEC_MAX_PER_LANE; e++) acc[e] *= c;
            mx = sc;
        }
        float w = __expf(sc - mx);
        sum += w;
#pragma unroll
        for (int e = 0; e < DEC_MAX_PER_LANE; e++) {
            int64_t d = lane + 32 * e;
            if (d < D) acc[e] += w * v[d];
        }
    }
    /* merge the warps: their maxima, sums and outputs through shared memory */
    __shared__ float wm[DEC_WARPS], ws[DEC_WARPS], wo[DEC_WARPS][32 * DEC_MAX_PER_LANE];
    if (lane == 0) wm[warp] = mx, ws[warp] = sum;
#pragma unroll
    for (int e = 0; e < DEC_MAX_PER_LANE; e++) wo[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w]);
    float *out = part + (t * splits + s) * (D + 2);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++)
            if (wm[w] > -INFINITY) o += __expf(wm[w] - M) * wo[w][d];
        out[2 + d] = o;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++)
            if (wm[w] > -INFINITY) L += __expf(wm[w] - M) * ws[w];
        out[0] = M, out[1] = L;
    }
}

static __global__ void decode_combine_k(lt_decode_attention_params p, int64_t splits, const float *part) {
    const int64_t t = blockIdx.x, D = p.D;
    const float *pt = part + t * splits * (D + 2);
    float M = -INFINITY;
    for (int64_t s = 0; s < splits; s++) M = fmaxf(M, pt[s * (D + 2)]);
    float L = 0.0f;
    for (int64_t s = 0; s < splits; s++) {
        float m = pt[s * (D + 2)];
        if (m > -INFINITY) L += __expf(m - M) * pt[s * (D + 2) + 1];
    }
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int64_t s = 0; s < splits; s++) {
            float m = pt[s * (D + 2)];
            if (m > -INFINITY) o += __expf(m - M) * pt[s * (D + 2) + 2 + d];
        }
        p.out[t * D + d] = o * inv;
    }
}

extern "C" size_t lt_cuda_decode_attention_workspace_bytes(const lt_decode_attention_params *p, int threads) {
    (void)threads;
    return (size_t)(p->n * p->H * dec_splits(p->max_len) * (p->D + 2)) * sizeof(float);
}

extern "C" lt_status lt_cuda_decode_attention(lt_ctx *ctx, const lt_decode_attention_params *p) {
    if (p->n <= 0) return LT_OK;
    if (p->n * p->H > 0x7fffffff || p->D > 32 * DEC_MAX_PER_LANE)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "decode attention (CUDA): %lld query heads of D=%lld",
                        (long long)(p->n * p->H), (long long)p->D);
    int64_t splits = dec_splits(p->max_len);
    dim3 grid((unsigned)(p->n * p->H), (unsigned)splits);
    float *part = (float *)p->workspace;
    decode_split_k<<<grid, 32 * DEC_WARPS, 0, lt_cuda_stream(ctx)>>>(*p, splits, part);
    LT_CUDA_LAUNCHED(ctx, "decode attention");
    decode_combine_k<<<(unsigned)(p->n * p->H), 64, 0, lt_cuda_stream(ctx)>>>(*p, splits, part);
    LT_CUDA_LAUNCHED(ctx, "decode attention combine");
    return LT_OK;
}
