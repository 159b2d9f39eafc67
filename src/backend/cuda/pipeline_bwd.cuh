/* Hopper asynchronous-copy plumbing for the warp-specialised attention backward: shared-memory
 * mbarriers (init, arrive, expect-tx, parity wait), TMA tensor loads and 1-D bulk copies that
 * complete on an mbarrier, bulk reductions (fp32 add) from shared to global memory, named
 * barriers and register reallocation (setmaxnreg); on the host, the tensor map of a (B, T, heads,
 * D) bf16 tensor in the 128-byte swizzle of wgmma.cuh. The driver's encoder is fetched through
 * the runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda. sm_90a only on the
 * device side (LT_WGMMA_OK); no scheduling policy lives here. Private to src/backend/cuda/. */
#ifndef LT_PIPELINE_BWD_CUH
#define LT_PIPELINE_BWD_CUH

#include <cuda.h>
#include <stdint.h>

#include "backend/cuda/wgmma.cuh"

static __device__ __forceinline__ void lt_mbar_init(uint64_t *bar, uint32_t count) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(lt_smem_addr(bar)), "r"(count) : "memory");
#else
    (void)bar; (void)count;
#endif
}
/* Makes initialised barriers visible to the async proxy (TMA) before any copy signals them. */
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
static __device__ __forceinline__ void lt_mbar_arrive_tx(uint64_t *bar, uint32_t bytes) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(lt_smem_addr(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar; (void)bytes;
#endif
}
/* Waits until the phase of the given parity has completed (a fresh barrier counts parity 1 as
 * completed, so a producer's first wait on an "empty" barrier passes at once). */
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
    (void)bar; (void)parity;
#endif
}

/* TMA: the box at coordinates (c0 innermost .. c3) of a 4-D tensor map into shared memory,
 * completing `box bytes` on bar. */
static __device__ __forceinline__ void lt_tma_load_4d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                                      int c1, int c2, int c3) {
#if LT_WGMMA_OK
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(lt_smem_addr(dst)),
                 "l"((uint64_t)map), "r"(lt_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
#else
    (void)dst; (void)map; (void)bar; (void)c0; (void)c1; (void)c2; (void)c3;
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
    (void)dst; (void)src; (void)bytes; (void)bar;
#endif
}
/* dst[i] += src[i] (fp32) for bytes/4 elements, shared -> global, asynchronous (bulk group). */
static __device__ __forceinline__ void lt_bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes) {
#if LT_WGMMA_OK
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(lt_smem_addr(src)), "r"(bytes)
                 : "memory");
#else
    (void)dst; (void)src; (void)bytes;
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
/* Barrier `id` (1..15; 0 is __syncthreads) over `n` threads, a multiple of 32. */
static __device__ __forceinline__ void lt_named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* Register reallocation between warpgroups (every warp of the group executes it). */
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

/* The tensor map of a bf16 tensor (B, T, heads, D) with element strides (sb, st, sh) and D
 * contiguous, read in boxes of 64 columns x `rows` rows of one head, 128-byte swizzled (the
 * layout lt_sw128_offset describes: column block c of a tile is the box at column 64c). Rows past
 * T read as zeros. LT_ERR_UNSUPPORTED when the driver lacks the encoder or rejects the shape. */
static inline lt_status lt_tma_map_bf16(lt_ctx *ctx, CUtensorMap *map, const void *base, int64_t B, int64_t T,
                                        int64_t heads, int64_t D, int64_t sb, int64_t st, int64_t sh, int rows) {
    typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static encode_fn encode = NULL;
    static int looked = 0;
    if (!looked) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            encode = (encode_fn)fn;
        (void)cudaGetLastError();
        looked = 1;
    }
    if (!encode) return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention backward: the driver has no cuTensorMapEncodeTiled");
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)T, (cuuint64_t)heads, (cuuint64_t)B};
    /* A dimension of extent 1 never steps; give it a legal stride. */
    const cuuint64_t strides[3] = {(cuuint64_t)st * 2, (cuuint64_t)(heads > 1 ? sh : D) * 2,
                                   (cuuint64_t)(B > 1 ? sb : D) * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1}, estr[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base, dims, strides, box, estr,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "attention backward: tensor map rejected (CUresult %d)", (int)r);
    return LT_OK;
}

#endif
