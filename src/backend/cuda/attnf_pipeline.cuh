/* The Hopper pieces of the warp-specialised attention forward (attention_fwd_ws.cu): shared-memory
 * mbarriers, TMA tile loads (cp.async.bulk.tensor) and the host-side tensor-map encoder (reached
 * through cudaGetDriverEntryPointByVersion, so nothing links libcuda), register reallocation
 * (setmaxnreg), named barriers and the m64n128k16 warpgroup MMA. sm_90a only, like wgmma.cuh: the
 * device helpers compile to nothing elsewhere and callers guard with LT_WGMMA_OK. No clusters, no
 * multicast, no TMA stores. Private to src/backend/cuda/. */
#ifndef LT_ATTNF_PIPELINE_CUH
#define LT_ATTNF_PIPELINE_CUH

#include <cuda.h> /* CUtensorMap and its enums only: the encoder comes from the runtime's entry point */
#include <stdint.h>

#include "backend/cuda/attention_cuda.h"
#include "backend/cuda/wgmma.cuh"

/* ---- mbarriers (64-bit words in shared memory) ------------------------------------------- */
static __device__ __forceinline__ void lt_mbar_init(uint64_t *bar, int count) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(lt_smem_addr(bar)), "r"(count) : "memory");
#else
    (void)bar; (void)count;
#endif
}
/* Makes the initialised barriers visible to the asynchronous proxy (the TMA unit) before use. */
static __device__ __forceinline__ void lt_mbar_init_fence(void) {
#if LT_WGMMA_OK
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
/* One arrival that also announces `bytes` of transaction (TMA) traffic for the current phase. */
static __device__ __forceinline__ void lt_mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(lt_smem_addr(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar; (void)bytes;
#endif
}
static __device__ __forceinline__ void lt_mbar_arrive(uint64_t *bar) {
#if LT_WGMMA_OK
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(lt_smem_addr(bar)) : "memory");
#else
    (void)bar;
#endif
}
/* Waits until the phase of the given parity has completed. A fresh barrier counts its (never
 * started) previous phase, parity 1, as complete: producers wait "empty" slots with parity
 * phase ^ 1 so that their first pass goes straight through. */
static __device__ __forceinline__ void lt_mbar_wait(uint64_t *bar, int parity) {
#if LT_WGMMA_OK
    const uint32_t a = lt_smem_addr(bar);
    uint32_t ok = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!ok);
#else
    (void)bar; (void)parity;
#endif
}

/* ---- TMA --------------------------------------------------------------------------------- */
/* One box of a 4-D tensor map into shared memory (1024-byte aligned for the 128-byte swizzle),
 * completing `bytes` of transaction on bar. Out-of-range elements arrive as zeros and still count
 * towards the box's bytes. */
static __device__ __forceinline__ void lt_tma_load_4d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                                      int c1, int c2, int c3) {
#if LT_WGMMA_OK
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
                 "%5, %6}], [%2];\n" ::"r"(lt_smem_addr(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(lt_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
#else
    (void)dst; (void)map; (void)bar; (void)c0; (void)c1; (void)c2; (void)c3;
#endif
}
static __device__ __forceinline__ void lt_tma_prefetch_desc(const CUtensorMap *map) {
#if LT_WGMMA_OK
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#else
    (void)map;
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
/* Named barriers 1..15 (0 is __syncthreads): `n` threads in all, counted by warps. */
static __device__ __forceinline__ void lt_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void lt_bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* ---- m64n128k16 ---------------------------------------------------------------------------- */
template <int N> static __device__ __forceinline__ void lt_pin_f(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> static __device__ __forceinline__ void lt_pin_u(uint32_t *a) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(a[i])::"memory");
}

#define LT_WG_D64                                                                                   \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),   \
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),   \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),   \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),   \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define LT_WG_R64                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "     \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, " \
    "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, " \
    "%58, %59, %60, %61, %62, %63}"

/* d (64 x 128 fp32 per warpgroup: d[4j + e] is row 16·warp + lane/4 + 8·(e/2), column 8j +
 * 2·(lane%4) + e%2) = A·Bᵀ (+ d when acc), K = 16, both operands K-major in the 128-byte swizzle. */
static __device__ __forceinline__ void lt_wgmma_ss_n128(float d[64], uint64_t da, uint64_t db, int acc) {
#if LT_WGMMA_OK
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LT_WG_R64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : LT_WG_D64
                 : "l"(da), "l"(db), "r"(acc));
#else
    (void)d; (void)da; (void)db; (void)acc;
#endif
}

/* ---- host: tensor maps ------------------------------------------------------------------------ */
typedef CUresult (*lt_tmap_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                      const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                      CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                      CUtensorMapFloatOOBfill);

/* The driver's cuTensorMapEncodeTiled, looked up once (NULL when the driver lacks it). */
static inline lt_tmap_encode_fn lt_tmap_encoder(void) {
    static lt_tmap_encode_fn fn = NULL;
    static int tried = 0;
    if (!tried) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (lt_tmap_encode_fn)p;
        (void)cudaGetLastError();
        tried = 1;
    }
    return fn;
}

/* A bf16 tensor (B, T, heads, D) with element strides sb, st, sh (D contiguous) as a 4-D map
 * (D, heads, T, B) read in boxes of 64 columns x 1 head x `rows` tokens, 128-byte swizzled: one
 * box is one column block of the swizzled tiles of wgmma.cuh. Returns 0 on success. */
static inline int lt_tmap_bhtd(CUtensorMap *m, const void *base, int64_t B, int64_t T, int64_t heads, int64_t D,
                               int64_t sb, int64_t st, int64_t sh, int rows) {
    lt_tmap_encode_fn enc = lt_tmap_encoder();
    if (!enc) return -1;
    cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t str[3] = {(cuuint64_t)sh * 2, (cuuint64_t)st * 2, (cuuint64_t)sb * 2};
    cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1};
    cuuint32_t es[4] = {1, 1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)base, dim, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
                   CUDA_SUCCESS
               ? 0
               : -1;
}

/* ---- entry points of attention_fwd_ws.cu (host) --------------------------------------------- */
/* The warp-specialised forward on the prepared parameter block (D = 64 or 128, sm_90a; stages = 2
 * or 3 K/V slots), queued on lt_cuda_stream(). LT_ERR_CUDA when a tensor map cannot be encoded. */
lt_status lt_attn_fwd_ws_launch(lt_ctx *ctx, const lt_attention_params *p, const lt_attn_dev *d, int stages);
/* 1 when the driver offers cuTensorMapEncodeTiled (the kernel's one host-side requirement). */
int lt_attn_fwd_ws_available(void);

#endif
