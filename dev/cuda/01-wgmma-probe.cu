/* Device probe of the wgmma conventions the attention kernels rely on (src/backend/cuda/wgmma.cuh):
 * one warpgroup multiplies 64x64 tiles held in the 128-byte swizzle, K-major and MN-major, with A
 * from shared memory and from registers, and prints the largest error against a host product.
 * A diagnosis aid for a new GPU or toolkit (dev/cuda/README.md), not a test of the library. */
#include <cstdio>
#include <cstdlib>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/wgmma.cuh"

/* mode 0: C = A·Bᵀ, A (64 x 128) and B (64 x 128) K-major (like Sᵀ = K·Qᵀ).
 * mode 1: C = A·B, A (64 x 64) in registers, B (64 K x 64 N) MN-major (like dV += Pᵀ·dO).
 * mode 2: C = Aᵀ·B, A stored (128 K x 64 M), B (128 K x 64 N), both MN-major (like dQ = dS·K). */
static __global__ void probe(int mode, const float *A, const float *B, float *C) {
    __shared__ __align__(1024) unsigned char sa[128 * 128 * 2], sb[128 * 128 * 2];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int ar = mode == 0 ? 64 : mode == 1 ? 64 : 128, ac = mode == 0 ? 128 : 64;
    const int br = mode == 0 ? 64 : mode == 1 ? 64 : 128, bc = mode == 0 ? 128 : 64;
    for (int i = tid; i < ar * ac; i += 128) {
        const int r = i / ac, c = i % ac;
        *(__nv_bfloat16 *)(sa + lt_sw128_offset(r, c, ar)) = __float2bfloat16(A[i]);
    }
    for (int i = tid; i < br * bc; i += 128) {
        const int r = i / bc, c = i % bc;
        *(__nv_bfloat16 *)(sb + lt_sw128_offset(r, c, br)) = __float2bfloat16(B[i]);
    }
    lt_fence_proxy_async();
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.0f;
    const uint32_t a = lt_smem_addr(sa), b = lt_smem_addr(sb);
    lt_wgmma_fence();
    if (mode == 0) {
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
            lt_wgmma_ss<0, 0>(d, lt_wgmma_desc(a + (kk >> 2) * (64 * 128) + (kk & 3) * 32),
                              lt_wgmma_desc(b + (kk >> 2) * (64 * 128) + (kk & 3) * 32), 1);
    } else if (mode == 1) {
        const int g = lane >> 2, c = 2 * (lane & 3), r0 = 16 * warp + g;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t f[4];
            const int k = 16 * kk + c;
            f[0] = lt_pack_bf16(A[r0 * 64 + k], A[r0 * 64 + k + 1]);
            f[1] = lt_pack_bf16(A[(r0 + 8) * 64 + k], A[(r0 + 8) * 64 + k + 1]);
            f[2] = lt_pack_bf16(A[r0 * 64 + k + 8], A[r0 * 64 + k + 9]);
            f[3] = lt_pack_bf16(A[(r0 + 8) * 64 + k + 8], A[(r0 + 8) * 64 + k + 9]);
            lt_wgmma_fence();
            lt_wgmma_rs<1>(d, f, lt_wgmma_desc(b + kk * 2048), 1);
        }
    } else {
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
            lt_wgmma_ss<1, 1>(d, lt_wgmma_desc(a + kk * 2048), lt_wgmma_desc(b + kk * 2048), 1);
    }
    lt_wgmma_commit();
    lt_wgmma_wait<0>();
    const int g = lane >> 2, c = 2 * (lane & 3);
    for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) C[(16 * warp + g + 8 * (e >> 1)) * 64 + 8 * j + c + (e & 1)] = d[4 * j + e];
}

static float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

int main(void) {
    const char *names[3] = {"SS K-major (A·Bt)", "RS, B MN-major (A·B)", "SS A,B MN-major (At·B)"};
    int bad = 0;
    for (int mode = 0; mode < 3; mode++) {
        const int na = 128 * 128, nb = 128 * 128;
        float *A = (float *)malloc(na * 4), *B = (float *)malloc(nb * 4), *C = (float *)malloc(64 * 64 * 4);
        srand(mode + 1);
        for (int i = 0; i < na; i++) A[i] = bf((float)rand() / RAND_MAX - 0.5f);
        for (int i = 0; i < nb; i++) B[i] = bf((float)rand() / RAND_MAX - 0.5f);
        float *dA, *dB, *dC;
        cudaMalloc(&dA, na * 4);
        cudaMalloc(&dB, nb * 4);
        cudaMalloc(&dC, 64 * 64 * 4);
        cudaMemcpy(dA, A, na * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, B, nb * 4, cudaMemcpyHostToDevice);
        cudaMemset(dC, 0xff, 64 * 64 * 4);
        probe<<<1, 128>>>(mode, dA, dB, dC);
        cudaError_t e = cudaDeviceSynchronize();
        cudaMemcpy(C, dC, 64 * 64 * 4, cudaMemcpyDeviceToHost);
        double err = 0, mx = 0;
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < 64; n++) {
                double ref = 0;
                if (mode == 0)
                    for (int k = 0; k < 128; k++) ref += (double)A[m * 128 + k] * B[n * 128 + k];
                if (mode == 1)
                    for (int k = 0; k < 64; k++) ref += (double)A[m * 64 + k] * B[k * 64 + n];
                if (mode == 2)
                    for (int k = 0; k < 128; k++) ref += (double)A[k * 64 + m] * B[k * 64 + n];
                double x = C[m * 64 + n];
                if (!(fabs(x - ref) <= err)) err = isnan(x) ? INFINITY : fabs(x - ref);
                if (fabs(ref) > mx) mx = fabs(ref);
            }
        printf("probe %-24s %s max err %.3g (max |ref| %.3g) %s\n", names[mode], cudaGetErrorString(e), err, mx,
               err < 1e-3 * mx + 1e-3 ? "OK" : "WRONG");
        bad += !(err < 1e-3 * mx + 1e-3);
        cudaFree(dA);
        cudaFree(dB);
        cudaFree(dC);
        free(A);
        free(B);
        free(C);
    }
    return bad ? 1 : 0;
}
