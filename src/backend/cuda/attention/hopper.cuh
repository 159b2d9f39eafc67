/* The Hopper pieces of the warp-specialised attention kernels (fwd_ws.cu, bwd_ws.cu): shared-memory
 * mbarriers, TMA tile loads (cp.async.bulk.tensor) and 1-D bulk copies completing on an mbarrier,
 * bulk fp32 reductions from shared to global memory, named barriers, register reallocation
 * (setmaxnreg), and on the host the one tensor-map encoder (the driver's cuTensorMapEncodeTiled,
 * reached through cudaGetDriverEntryPointByVersion, so nothing links libcuda). sm_90a only on the
 * device side, like wgmma.cuh: the helpers compile to nothing elsewhere and callers guard with
 * LT_WGMMA_OK. No clusters, no multicast, no TMA stores, no scheduling policy. Private to
 * src/backend/cuda/attention/. */
#ifndef LT_ATTN_HOPPER_CUH
#define LT_ATTN_HOPPER_CUH

#include <cuda.h> /* CUtensorMap and its enums only: the encoder comes from the runtime's entry point */
#include <stdint.h>

#include "backend/cuda/attention/wgmma.cuh"
#include "backend/cuda/cuda_common.cuh"

/* ---- mbarriers (64-bit words in shared memory) ------------------------------------------- */
static __device__ __forceinline__ void lt_mbar_init(uint64_t *bar, uint32_t count) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(lt_smem_addr(bar)), "r"(count) : "memory");
#else
    (void)bar;
    (void)count;
#endif
}
/* Makes the initialised barriers visible to the asynchronous proxy (the TMA unit) before use. */
static __device__ __forceinline__ void lt_mbar_init_fence(void) {
#if LT_WGMMA_OK
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void lt_mbar_arrive(uint64_t *bar) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(lt_smem_addr(bar)) : "memory");
#else
    (void)bar;
#endif
}
/* One arrival that also announces `bytes` of asynchronous copies completing on this phase. */
static __device__ __forceinline__ void lt_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(lt_smem_addr(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar;
    (void)bytes;
#endif
}
/* Waits until the phase of the given parity has completed. A fresh barrier counts its (never
 * started) previous phase, parity 1, as complete: producers wait "empty" slots with parity
 * phase ^ 1 so that their first pass goes straight through. */
static __device__ __forceinline__ void lt_mbar_wait(uint64_t *bar, uint32_t parity) {
#if LT_WGMMA_OK
    const uint32_t a = lt_smem_addr(bar);
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
#else
    (void)bar;
    (void)parity;
#endif
}

/* ---- TMA and bulk copies ------------------------------------------------------------------ */
/* The box at coordinates (c0 innermost .. c3) of a 4-D tensor map into shared memory (1024-byte
 * aligned for the 128-byte swizzle), completing the box's bytes on bar. Out-of-range elements
 * arrive as zeros and still count towards the box's bytes. */
static __device__ __forceinline__ void lt_tma_load_4d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                      int c2, int c3) {
#if LT_WGMMA_OK
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(lt_smem_addr(dst)),
                 "l"((uint64_t)map), "r"(lt_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
#else
    (void)dst;
    (void)map;
    (void)bar;
    (void)c0;
    (void)c1;
    (void)c2;
    (void)c3;
#endif
}
static __device__ __forceinline__ void lt_tma_prefetch_map(const CUtensorMap *map) {
#if LT_WGMMA_OK
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
#else
    (void)map;
#endif
}
/* 1-D bulk copy global -> shared (16-byte aligned, bytes a multiple of 16) completing on bar. */
static __device__ __forceinline__ void lt_bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#if LT_WGMMA_OK
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     lt_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(lt_smem_addr(bar))
                 : "memory");
#else
    (void)dst;
    (void)src;
    (void)bytes;
    (void)bar;
#endif
}
/* dst[i] += src[i] (fp32) for bytes/4 elements, shared -> global, asynchronous (bulk group). */
static __device__ __forceinline__ void lt_bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes) {
#if LT_WGMMA_OK
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(lt_smem_addr(src)), "r"(bytes)
                 : "memory");
#else
    (void)dst;
    (void)src;
    (void)bytes;
#endif
}
static __device__ __forceinline__ void lt_bulk_commit(void) {
#if LT_WGMMA_OK
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
/* Waits until the committed bulk groups have read their shared-memory sources. */
static __device__ __forceinline__ void lt_bulk_wait_read0(void) {
#if LT_WGMMA_OK
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
/* Waits until the committed bulk groups have completed (writes performed). */
static __device__ __forceinline__ void lt_bulk_wait0(void) {
#if LT_WGMMA_OK
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

/* ---- warp specialisation ------------------------------------------------------------------ */
/* Register budget of the calling warpgroup (every thread of it executes this). */
template <int N> static __device__ __forceinline__ void lt_setmaxnreg_dec(void) {
#if LT_WGMMA_OK
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N> static __device__ __forceinline__ void lt_setmaxnreg_inc(void) {
#if LT_WGMMA_OK
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
/* Named barriers 1..15 (0 is __syncthreads): `n` threads in all, a multiple of 32. */
static __device__ __forceinline__ void lt_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void lt_bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* ---- host: tensor maps ------------------------------------------------------------------------ */
typedef CUresult (*lt_tma_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's cuTensorMapEncodeTiled, looked up once (NULL when the driver lacks it). */
static inline lt_tma_encode_fn lt_tma_encoder(void) {
    static lt_tma_encode_fn fn = NULL;
    static int tried = 0;
    if (!tried) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (lt_tma_encode_fn)p;
        (void)cudaGetLastError();
        tried = 1;
    }
    return fn;
}

/* The tensor map of a bf16 tensor (B, T, heads, D) with element strides (sb, st, sh) and D
 * contiguous, as the 4-D map (D, T, heads, B) read in boxes of 64 columns x `rows` tokens of one
 * head, 128-byte swizzled: one box is one column block of the swizzled tiles of wgmma.cuh (column
 * block c of a tile is the box at coordinates (64c, t0, h, b)). Rows past T read as zeros.
 * LT_ERR_UNSUPPORTED, naming `what`, when the driver lacks the encoder or rejects the shape. */
static inline lt_status lt_tma_map_bf16(lt_ctx *ctx, const char *what, CUtensorMap *map, const void *base, int64_t B,
                                        int64_t T, int64_t heads, int64_t D, int64_t sb, int64_t st, int64_t sh,
                                        int rows) {
    const lt_tma_encode_fn encode = lt_tma_encoder();
    if (!encode) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: the driver has no cuTensorMapEncodeTiled", what);
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)T, (cuuint64_t)heads, (cuuint64_t)B};
    /* A dimension of extent 1 never steps; give it a legal stride. */
    const cuuint64_t strides[3] = {(cuuint64_t)st * 2, (cuuint64_t)(heads > 1 ? sh : D) * 2,
                                   (cuuint64_t)(B > 1 ? sb : D) * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1}, estr[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base, dims, strides, box, estr,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor map rejected (CUresult %d)", what, (int)r);
    return LT_OK;
}

#endif
