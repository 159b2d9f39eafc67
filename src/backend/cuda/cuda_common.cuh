/* Shared pieces of the CUDA kernels: warp-level bf16 tensor-core MMA (m16n8k16, fp32 accumulate),
 * ldmatrix, cp.async and the error helpers of the launchers. Everything here is sm_80-class PTX, so
 * the portable compute_80 target compiles it too; Hopper-only instructions (wgmma, TMA) are not
 * used. Private to src/backend/cuda/. */
#ifndef LT_CUDA_COMMON_CUH
#define LT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "longtune/alloc.h"
#include "longtune/status.h"
}

/* Returns LT_OK or records a CUDA failure in ctx, clearing CUDA's sticky error first. */
static inline lt_status lt_cuda_check(lt_ctx *ctx, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return LT_OK;
    (void)cudaGetLastError();
    return lt_error(ctx, LT_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

#include "backend/cuda/cuda_state.h"

static inline size_t lt_cuda_align(size_t n) { return (n + 255) & ~(size_t)255; }

static __device__ __forceinline__ uint32_t lt_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte async global->shared copy; bytes < 16 zero-fills the rest (0 = all zeros, used for rows
 * past the end of the sequence). */
static __device__ __forceinline__ void lt_cp_async16(void *smem, const void *gmem, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(lt_smem_addr(smem)), "l"(gmem), "r"(bytes));
}
static __device__ __forceinline__ void lt_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void lt_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void lt_ldsm_x4(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(lt_smem_addr(smem)));
}
static __device__ __forceinline__ void lt_ldsm_x4_t(uint32_t r[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(lt_smem_addr(smem)));
}

/* c += a·b for one 16x8x16 tile: a row-major 16x16 bf16 (4 regs), b "col" 16x8 (2 regs). */
static __device__ __forceinline__ void lt_mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t lt_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

#endif
