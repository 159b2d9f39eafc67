/* Hopper warpgroup MMA (wgmma, sm_90a only) for the attention kernels: shared-memory matrix
 * descriptors for the 128-byte-swizzled layout, the m64n64k16 bf16 instructions (both operands in
 * shared memory, or A in registers), the m64n128k16 one of the TMA forward, and the fences around
 * them. Everything here compiles to nothing useful on other targets: callers guard uses with
 * LT_WGMMA_OK and pick another kernel at run time on other GPUs. Private to
 * src/backend/cuda/attention/. */
#ifndef LT_ATTN_WGMMA_CUH
#define LT_ATTN_WGMMA_CUH

#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LT_WGMMA_OK 1
#else
#define LT_WGMMA_OK 0
#endif

/* Tiles live in shared memory in the 128-byte swizzle of the tensor cores: a tile of R rows and
 * C bf16 columns (C a multiple of 64) is C/64 column blocks of R rows x 128 bytes; the 16-byte
 * chunk j of row r sits at chunk j ^ (r % 8). Blocks must start 1024-byte aligned. The same bytes
 * serve as a K-major operand (rows = M or N, columns = K) and as an MN-major one (rows = K,
 * columns = M or N). */
static __device__ __forceinline__ uint32_t lt_sw128_offset(int r, int c, int rows) {
    /* byte offset of element (r, c) */
    return (uint32_t)((c >> 6) * rows * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2);
}

/* Descriptor: start address, leading and stride byte offsets (16-byte units), swizzle 128B.
 * K-major: SBO = 1024 (next 8 rows), LBO unused. MN-major tiles are used only 64 columns wide (one
 * swizzle atom along M/N), so only the offset between 8-row groups along K matters; it is written
 * into both fields (1024), which reads the same whichever field the hardware takes it from. */
static __device__ __forceinline__ uint64_t lt_wgmma_desc(uint32_t saddr) {
    uint64_t d = 0;
    d |= (uint64_t)((saddr & 0x3FFFF) >> 4);
    d |= (uint64_t)(1024 >> 4) << 16;
    d |= (uint64_t)(1024 >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

/* The descriptor of base + bytes (bytes a multiple of 16): only the start-address field changes,
 * and shared memory (< 256 KiB) never carries out of it, so one add replaces the rebuild. */
static __device__ __forceinline__ uint64_t lt_wgmma_desc_at(uint64_t base, uint32_t bytes) {
    return base + (bytes >> 4);
}
/* The same as a 32-bit add on the low word: the high word (stride field, swizzle mode) stays one
 * register. The TMA kernels and the wgmma backward build one descriptor per tile and move it with
 * these constant adds, which (with a warp-uniform warpgroup index) stay in uniform registers: the
 * forward 0.96 -> 0.84 ms at 8k and 15.9 -> 13.2 ms at 32k, the backward 42.9 -> 42.2 ms at 32k and
 * 1.67 -> 1.57 ms at D = 64 (dev/cuda/README.md). */
static __device__ __forceinline__ uint64_t lt_wgmma_desc_at32(uint64_t base, uint32_t bytes) {
    const uint32_t lo = (uint32_t)base + (bytes >> 4), hi = (uint32_t)(base >> 32);
    return (uint64_t)hi << 32 | lo;
}

static __device__ __forceinline__ void lt_wgmma_fence(void) {
#if LT_WGMMA_OK
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void lt_wgmma_commit(void) {
#if LT_WGMMA_OK
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> static __device__ __forceinline__ void lt_wgmma_wait(void) {
#if LT_WGMMA_OK
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Generic-proxy shared-memory writes (st.shared, cp.async) that wgmma reads next. */
static __device__ __forceinline__ void lt_fence_proxy_async(void) {
#if LT_WGMMA_OK
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* Pins accumulator registers in program order around the asynchronous MMAs: the compiler sees a
 * write of every register here, so it cannot move a read of the accumulator above a wait_group or
 * a write of it below an issue (CUTLASS's warpgroup_fence_operand). Emits no instruction. */
template <int N> static __device__ __forceinline__ void lt_pin_f(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> static __device__ __forceinline__ void lt_pin_u(uint32_t *a) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(a[i])::"memory");
}
/* One m64n64 accumulator, one A fragment. */
static __device__ __forceinline__ void lt_wgmma_pin(float d[32]) { lt_pin_f<32>(d); }
static __device__ __forceinline__ void lt_wgmma_pin_u(uint32_t a[4]) { lt_pin_u<4>(a); }

#define LT_WG_D32                                                                                               \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define LT_WG_R32                                                                                 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

/* d (64 x 64 fp32 per warpgroup; the accumulator layout of mma.sync m16n8 per warp, warp w of the
 * group owning rows 16w..16w+15) = A·B (+ d when acc != 0), K = 16. TA / TB: 0 = K-major,
 * 1 = MN-major. */
template <int TA, int TB>
static __device__ __forceinline__ void lt_wgmma_ss(float d[32], uint64_t da, uint64_t db, int acc) {
#if LT_WGMMA_OK
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LT_WG_R32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : LT_WG_D32
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
#else
    (void)d;
    (void)da;
    (void)db;
    (void)acc;
#endif
}

#define LT_WG_D64                                                                                               \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define LT_WG_R64                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "     \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, " \
    "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, " \
    "%58, %59, %60, %61, %62, %63}"

/* d (64 x 128 fp32 per warpgroup: d[4j + e] is row 16·warp + lane/4 + 8·(e/2), column 8j +
 * 2·(lane%4) + e%2) = A·Bᵀ (+ d when acc), K = 16, both operands K-major in the 128-byte swizzle. */
static __device__ __forceinline__ void lt_wgmma_ss_n128(float d[64], uint64_t da, uint64_t db, int acc) {
#if LT_WGMMA_OK
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LT_WG_R64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : LT_WG_D64
                 : "l"(da), "l"(db), "r"(acc));
#else
    (void)d;
    (void)da;
    (void)db;
    (void)acc;
#endif
}

/* d = A·Bᵀ over K = 16·KS with both operands K-major in the 128-byte swizzle: A a tile of RA rows,
 * B one of RB rows, K split in 64-column blocks (dev/cuda/README.md: S = Q·Kᵀ, dP = dO·Vᵀ). */
template <int KS, int RA, int RB>
static __device__ __forceinline__ void lt_wgmma_kmajor(float d[32], uint64_t da, uint64_t db) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
        lt_wgmma_ss<0, 0>(d, lt_wgmma_desc_at(da, (kk >> 2) * (RA * 128) + (kk & 3) * 32),
                          lt_wgmma_desc_at(db, (kk >> 2) * (RB * 128) + (kk & 3) * 32), kk > 0);
}

/* Loads rows t0..t0+R-1 (D bf16 each, row stride st elements) of a global tensor into a swizzled
 * tile with cp.async, NT threads; rows past T are zero-filled (their source clamped in bounds).
 * DV < D: the tensor's rows hold DV values (a head dim padded to the kernel's D, as D = 96 runs the
 * D = 128 kernels); columns DV..D-1 are not loaded and keep the zeros lt_wg_zero_pad wrote there
 * once, so they add nothing to S = Q·Kᵀ or dP = dO·Vᵀ. */
template <int R, int D, int NT, int DV = D>
static __device__ __forceinline__ void lt_wg_load_tile(unsigned char *s, const __nv_bfloat16 *g, int64_t st, int t0,
                                                       int T, int tid) {
    constexpr int CH = D / 8;
    static_assert((R * CH) % NT == 0, "tile chunks must divide over the threads");
    static_assert(DV % 8 == 0 && DV <= D && NT % CH == 0, "valid columns in whole 16-byte chunks");
    if (DV < D && (tid % CH) * 8 >= DV) return; /* this thread's chunk column is past DV in every row */
#pragma unroll
    for (int it = 0; it < R * CH / NT; it++) {
        const int i = tid + it * NT, r = i / CH, c = (i % CH) * 8, t = t0 + r;
        const __nv_bfloat16 *src = g + (int64_t)(t < T ? t : T - 1) * st + c;
        lt_cp_async16(s + lt_sw128_offset(r, c, R), src, t < T ? 16 : 0);
    }
}

/* Zeros in columns DV..D-1 of a swizzled tile of R rows (NT threads), once before the first
 * lt_wg_load_tile<R, D, NT, DV> into it; nothing when DV = D. The caller fences (generic to async
 * proxy) and synchronises before an MMA reads the tile, as it does after every load. */
template <int R, int D, int NT, int DV = D>
static __device__ __forceinline__ void lt_wg_zero_pad(unsigned char *s, int tid) {
    constexpr int CH = D / 8;
    if (DV < D && (tid % CH) * 8 >= DV) {
#pragma unroll
        for (int it = 0; it < R * CH / NT; it++) {
            const int i = tid + it * NT, r = i / CH, c = (i % CH) * 8;
            *(uint4 *)(s + lt_sw128_offset(r, c, R)) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* The same with A (64 x 16 bf16) in registers, in mma.sync's A-fragment layout per warp. */
template <int TB>
static __device__ __forceinline__ void lt_wgmma_rs(float d[32], const uint32_t a[4], uint64_t db, int acc) {
#if LT_WGMMA_OK
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LT_WG_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : LT_WG_D32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
#else
    (void)d;
    (void)a;
    (void)db;
    (void)acc;
#endif
}

/* d[n] += A·B[:, 64n..64n+63] for n < NH, K = 16·KK: A in registers (KK fragments of 64 x 16), B
 * MN-major in the swizzle (KK·16 rows, 64-column blocks of R rows each); issued, committed and
 * waited for (O += P·V, dQ += dS·K). */
template <int NH, int KK, int R>
static __device__ __forceinline__ void lt_wgmma_rs_wait(float (*d)[32], uint32_t (*a)[4], uint64_t db) {
#pragma unroll
    for (int n = 0; n < NH; n++) lt_wgmma_pin(d[n]);
#pragma unroll
    for (int kk = 0; kk < KK; kk++) lt_wgmma_pin_u(a[kk]);
    lt_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KK; kk++)
#pragma unroll
        for (int n = 0; n < NH; n++) lt_wgmma_rs<1>(d[n], a[kk], lt_wgmma_desc_at(db, n * (R * 128) + kk * 2048), 1);
    lt_wgmma_commit();
    lt_wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < NH; n++) lt_wgmma_pin(d[n]);
}

#endif
