/* Every tuning constant of the CUDA attention kernels, the variant table, what was tried and
 * measured, and the override a test or benchmark sets to force a variant. The heuristics that
 * pick a variant per call are in heuristics.cu. Plain C (the head-dim list is read by the C
 * boundary in src/backend/attention.c); the per-head-dim kernel shapes at the end are C++.
 *
 * Measurements are H200 figures from dev/cuda/README.md unless stated. */
#ifndef LT_ATTN_TUNING_H
#define LT_ATTN_TUNING_H

/* ---- Specialisations -------------------------------------------------------------------------
 * Head dims the bf16 kernels are compiled for (the only list: the boundary's check, its message and
 * the launchers' switches follow it). 64 and 128 have every variant below; 96 (Phi-3) the mma.sync
 * kernels and every other variant on the D = 128 kernels, padded (LT_ATTN_WG_PADDED_HEAD_DIM); 256
 * (Gemma 2/3) the mma.sync kernels, the one-warpgroup wgmma forward with one K/V slot (WG1), the
 * TMA forward with two stages of 64-key tiles (WS2) and the wgmma backward of bwd_wg256.cu. Adding
 * one: README.md. */
#define LT_ATTENTION_CUDA_HEAD_DIMS \
    { 64, 96, 128, 256 }
#define LT_ATTENTION_CUDA_HEAD_DIMS_TEXT "64, 96, 128, 256"
/* The head dims of the wgmma and TMA variants (multiples of 64: one swizzle atom per column block). */
#define LT_ATTN_WGMMA_HEAD_DIM(D) ((D) == 64 || (D) == 128)
/* Head dims that run the D = 128 kernels padded: the wgmma forwards (WG1, WG2) and backward (dQ by
 * atomics or by the dQ kernel) load Q, K, V and dO with the columns past D zeroed, the TMA kernels
 * (WS2, WS3, the warp-specialised backward) read tensor maps D wide whose boxes the TMA unit fills
 * with zeros past D; O, dQ, dK and dV are stored D wide (the warp-specialised backward's fp32 dQ
 * tiles stay 128 wide: lt_attn_dq_acc_cols). A quarter of the 128-wide products is spent on zeros. */
#define LT_ATTN_WG_PADDED_HEAD_DIM(D) ((D) == 96)
/* The head dims of the wgmma and TMA forwards (fwd_wg.cu, fwd_ws.cu): those, and 256 (WG1 and WS2
 * only), whose 64 x 256 fp32 O (128 registers a thread) still fits a warpgroup beside a 64-key S
 * tile; a 128-key S tile beside it would not, nor would one warpgroup's dK and dV at 256
 * (bwd_wg256.cu splits D over two). */
#define LT_ATTN_FWD_WG_HEAD_DIM(D) (LT_ATTN_WGMMA_HEAD_DIM(D) || (D) == 256 || LT_ATTN_WG_PADDED_HEAD_DIM(D))

/* ---- Variant table ---------------------------------------------------------------------------
 * forward (lt_attn_fwd_kind)       file         D       CTA                          per SM
 *   MMA  mma.sync, FlashAttention-2 fwd_mma.cu   all     16·MT·NW rows, NW warps      -
 *   WG2  wgmma, 2 K/V buffers       fwd_wg.cu    64,128  64 rows, 1 warpgroup         2
 *   WG1  wgmma, 1 K/V slot          fwd_wg.cu    64,128, 64 rows, 1 warpgroup         3 (256: 2)
 *                                                256
 *   WS2  TMA + warp-specialised     fwd_ws.cu    64,128, 128 rows, 1 producer + 2     1
 *                                                256       consumer warpgroups
 *   WS3  the same, 3 K/V stages     fwd_ws.cu    64,128  (256: WS2)                   1
 * backward (lt_attn_bwd_plan)
 *   mma  mma.sync, dQ by atomics    bwd_mma.cu   all     128 keys (256: 64), 8 warps  -
 *   wg   wgmma, dQ by atomics       bwd_wg.cu    64,128  128 keys, 2 warpgroups       1
 *   wg   wgmma, dQ by its own kernel bwd_wg.cu   64,128  64 keys (bn), 1 warpgroup    2
 *          + the dQ kernel                               64 queries, 1 warpgroup      2
 *   ws   TMA + warp-specialised     bwd_ws.cu    64,128  128 keys, 1 producer + 2     1
 *                                                          consumer warpgroups
 *   wg   wgmma, D split over the    bwd_wg256.cu 256     64 keys, 2 warpgroups        1
 *          warpgroups, dQ by atomics
 * D = 96 runs every variant on the D = 128 kernels with the columns past 96 zero. The wgmma and
 * TMA kernels need compute capability 9.0 (sm_90a code); elsewhere the mma.sync kernels run. */
typedef enum lt_attn_fwd_kind {
    LT_ATTN_FWD_AUTO = 0, /* the heuristic (in an override: no override) */
    LT_ATTN_FWD_MMA,
    LT_ATTN_FWD_WG2,
    LT_ATTN_FWD_WG1,
    LT_ATTN_FWD_WS2,
    LT_ATTN_FWD_WS3,
    LT_ATTN_FWD_KINDS_
} lt_attn_fwd_kind;
/* Short names, indexed by lt_attn_fwd_kind (the names the measurements in the notes use). */
#define LT_ATTN_FWD_KIND_NAMES \
    { "default", "mma", "wg", "wg1", "ws", "ws3" }

typedef enum lt_attn_bwd_kind {
    LT_ATTN_BWD_AUTO = 0,
    LT_ATTN_BWD_MMA, /* the mma.sync kernels on any shape */
    LT_ATTN_BWD_WG   /* the wgmma kernels, never the warp-specialised one */
} lt_attn_bwd_kind;
/* Short names, indexed by lt_attn_bwd_kind. */
#define LT_ATTN_BWD_KIND_NAMES \
    { "default", "mma", "wg" }

typedef enum lt_attn_dq_kind {
    LT_ATTN_DQ_AUTO = 0,
    LT_ATTN_DQ_ATOMIC, /* fp32 atomics into a buffer, converted afterwards */
    LT_ATTN_DQ_SEP     /* its own kernel, recomputing S and dP (bit-reproducible: no atomics) */
} lt_attn_dq_kind;
/* Short names, indexed by lt_attn_dq_kind. */
#define LT_ATTN_DQ_KIND_NAMES \
    { "default", "atomic", "sep" }

/* A forced choice for tests and measurements; zero fields leave the heuristic's choice. A forced
 * variant the device or shape cannot run falls back as the heuristic's would (a TMA forward
 * without the driver's encoder runs WG2; anything wgmma off compute capability 9.0 runs MMA). */
typedef struct lt_attn_cuda_tuning {
    int fwd;                /* lt_attn_fwd_kind (D = 64, 128) */
    int bwd;                /* lt_attn_bwd_kind */
    int dq;                 /* lt_attn_dq_kind (wgmma backward) */
    int bwd_bn;             /* 128: 128 keys per CTA of the wgmma main kernel even with dQ by its own kernel */
    int delta_sep;          /* 1: delta by its own pass even when the dQ kernel could form it */
    int split;              /* CTAs sharing a kv head's query heads: a divisor of H / Hkv; 0 = heuristic */
    int fwd_ws_no_pingpong; /* 1: the TMA forward's consumers issue MMAs without taking turns */
} lt_attn_cuda_tuning;

#ifdef __cplusplus
extern "C" {
#endif
/* Installs the override for every later call in the process (copied; NULL clears it). Tests and
 * benchmarks only: nothing on the product path sets it. Not thread-safe against running calls. */
void lt_attn_cuda_tuning_set(const lt_attn_cuda_tuning *t);
lt_attn_cuda_tuning lt_attn_cuda_tuning_get(void);
#ifdef __cplusplus
}
#endif

/* ---- Heuristic thresholds (heuristics.cu) -----------------------------------------------------
 * Rows whose queries see few keys ("sparse"): packed rows whose sequences average at most
 * LT_ATTN_SPARSE_MEAN_SEQ tokens, or a window of at most LT_ATTN_SPARSE_WINDOW keys. Both
 * directions then pick kernels of many small tiles: the forward WG1 (the overlap of three CTAs per
 * SM pays more than prefetching when a row sees few tiles), the backward dQ by its own kernel
 * (recomputing S and dP per query tile costs less than the fp32 dQ buffer's memset, atomics and
 * conversion) with 64 keys per main-kernel CTA (a 64-key block sees fewer query tiles of a short
 * sequence than a 128-key one, and two CTAs share an SM), delta formed by the dQ kernel
 * (one pass and one launch fewer). The sparse paths together gained 18 % over the dense ones on
 * packed 2k rows (0.143 + 0.590 ms = 8.1x one causal row with the dense paths forced). */
#define LT_ATTN_SPARSE_MEAN_SEQ 1024
#define LT_ATTN_SPARSE_WINDOW 512
/* Forward on rows that are not sparse: the TMA kernel (WS3) when its 128-row blocks number at least
 * NUM/DEN of the SMs, else WG2. Measured forward-only per shape: WS3 ahead of WG2 from 128 blocks up
 * (T = 512 x 32 heads), behind by 4 % at 72 blocks (T = 1024 x 9 heads). */
#define LT_ATTN_FWD_WS_MIN_SM_NUM 3
#define LT_ATTN_FWD_WS_MIN_SM_DEN 4
/* Backward split: while the main kernel's CTAs number fewer than LT_ATTN_BWD_SPLIT_WAVES waves
 * (CTAs per SM x SMs), the query heads of a group are split over 2, then up to LT_ATTN_BWD_SPLIT_MAX
 * CTAs (fp32 dK/dV sums in the workspace): the first key blocks of a causal row carry most of the
 * work, so one wave of them leaves SMs idle. Measured and not taken: the warp-specialised backward
 * with one CTA per kv head beat the split at >= 128 CTAs (H = 32/8, D = 128: T = 4096 0.763 ms
 * against 1.219 with the split, T = 2048 0.383 against 0.390); that selection was never run. */
#define LT_ATTN_BWD_SPLIT_WAVES 2
#define LT_ATTN_BWD_SPLIT_MAX 4
/* Grid y / z extent limit (query or key blocks in gridDim.y, batch in gridDim.z). */
#define LT_ATTN_GRID_YZ_MAX 65535
/* SM count assumed when the device cannot be queried. */
#define LT_ATTN_SM_COUNT_FALLBACK 132

/* ---- Key bounds (prepare.cu) ------------------------------------------------------------------
 * Host sequence offsets travel as a kernel parameter (no host-to-device copy before the launch) in
 * pieces of up to LT_ATTN_OFFS_INLINE entries: training batches of short sequences fit in one;
 * a synchronous copy's latency was a visible share of the call. */
#define LT_ATTN_OFFS_INLINE 960

/* ---- Forward tiles ----------------------------------------------------------------------------
 * mma.sync (fwd_mma.cu): 64 keys per tile, K/V double-buffered with cp.async; query rows per CTA =
 * 16 x MT x NW from the per-head-dim table below. MT = 2 lets each K/V fragment read from shared
 * memory feed two MMAs (shared-memory bandwidth, not the tensor cores, bounds MT = 1); QREG keeps
 * Q's fragments in registers. Measured: D = 128 (4, 2, no) 250 TFLOP/s at T = 8k against 167 for
 * (8, 1, yes), (4, 2, yes) spills; D = 64 (4, 2, yes); D = 96 (8, 1, yes), (4, 2, no) spills. D = 256
 * (8, 1, no): the shape that fits, not a measured choice (lt_attn_fwd_mma_shape<256>). */
#define LT_ATTN_FWD_MMA_BN 64
/* wgmma (fwd_wg.cu): 64 query rows (one warpgroup), 64-key tiles; 2 K/V buffers, two
 * CTAs per SM (one's softmax overlaps the other's MMAs), or 1 slot, three CTAs per SM. At D = 256
 * the tiles are 32 KiB each and only WG1 is built: two CTAs per SM (97 KiB, 255 registers a thread,
 * no spills); WG2 would hold one CTA per SM (161 KiB) and spilled 44 bytes, so a forced WG2 runs
 * WG1 there. */
#define LT_ATTN_FWD_WG_BM 64
#define LT_ATTN_FWD_WG_BN 64
/* TMA (fwd_ws.cu): 128 query rows (two consumers of 64), 128-key tiles in a 2- or 3-stage ring;
 * registers per thread: producer 40, consumers 232. Consumers take turns issuing their MMAs
 * (ping-pong on named barriers) and overlap the softmax of tile n with P·V of tile n - 1. D = 256
 * takes 64-key tiles (lt_attn_fwd_ws_bn) in 2 stages: O (128 registers a thread) beside a 64 x 64
 * S (32) and its bf16 P (16) fits the consumers' 232 registers, and Q (64 KiB) with two stages of
 * K and V (32 KiB each) takes 192 KiB of shared memory; a third stage would not fit. */
#define LT_ATTN_FWD_WS_BM 128
#define LT_ATTN_FWD_WS_BN 128
#define LT_ATTN_FWD_WS_BN256 64
#define LT_ATTN_FWD_WS_REG_PRODUCER 40
#define LT_ATTN_FWD_WS_REG_CONSUMER 232

/* ---- Backward tiles ---------------------------------------------------------------------------
 * mma.sync (bwd_mma.cu): 128 keys per CTA (8 warps), 64-query steps over every query
 * head of the group. v2, where each warp owned 16 keys and held Pᵀ/dSᵀ in registers, ran 10-25 %
 * slower. Skip tests are whole-warp only: a branch inside the unrolled loops stops the compiler
 * from issuing the next fragment loads early, which measured slower. */
#define LT_ATTN_BWD_MMA_BN 128
#define LT_ATTN_BWD_MMA_BM 64
#define LT_ATTN_BWD_MMA_WARPS 8
/* wgmma (bwd_wg.cu): 64 queries per step; 128 keys per CTA (two warpgroups) with dQ
 * by fp32 2-wide vector atomics (16-byte red.global.add.v4.f32 after a lane-pair exchange measured
 * slower: 4.40 against 4.31 ms at 8k), or 64 keys (one warpgroup, two CTAs per SM) without dQ. The
 * dQ kernel: 64 query rows, 64-key tiles, double-buffered. */
#define LT_ATTN_BWD_WG_BM 64
#define LT_ATTN_BWD_DQ_BM 64
#define LT_ATTN_BWD_DQ_BN 64
/* D = 256 (bwd_wg256.cu): 1 = dQ by the dQ kernel (bwd_dq256.cu, recomputing S and dP per tile) on
 * every row, 0 = by the main kernel's fp32 atomics except on sparse rows. H100, T = 8192, H = 16,
 * Hkv = 8, three builds alternated in one call: atomics 5.38-5.39 ms, a one-warpgroup dQ kernel
 * (64 rows a CTA, one CTA an SM) 4.68 ms, and a two-warpgroup dQ kernel shaped like the main one
 * (S and dP on one warpgroup each, dS handed through shared memory, 128 dQ columns a warpgroup)
 * 4.93-4.98 ms. The dQ kernel now gives each warpgroup its own 64 rows of a 128-row CTA, both
 * reading the same K and V tiles: backward 4.51 -> 4.18-4.21 ms against the one-warpgroup kernel
 * (two builds alternated twice in one call, H100). */
#ifndef LT_ATTN_BWD256_DQ_SEP
#define LT_ATTN_BWD256_DQ_SEP 1
#endif
/* TMA (bwd_ws.cu, dev/cuda/README.md): 128 keys per CTA, 64-query steps, a 2-stage Q/dO ring (a
 * third stage measured no faster: 41.2 against 41.1 ms at 32k); registers: producer 24, consumers
 * 240. Issuing dV before dPᵀ is waited for (dS from the bf16 P) measured 2-5 % slower (2.69 against
 * 2.64 ms at 8k, 42.8 against 41.8 at 32k). 1.6x the wgmma kernel at 8k and 32k. */
#define LT_ATTN_BWD_WS_BN 128
#define LT_ATTN_BWD_WS_BM 64
#define LT_ATTN_BWD_WS_STAGES 2
#define LT_ATTN_BWD_WS_REG_PRODUCER 24
#define LT_ATTN_BWD_WS_REG_CONSUMER 240

#ifdef __cplusplus
extern "C++" { /* C++ even where a C header includes this one inside extern "C" */
/* mma.sync forward per head dim: NW warps, MT 16-row tiles per warp, QREG Q kept in registers. */
template <int D> struct lt_attn_fwd_mma_shape;
template <> struct lt_attn_fwd_mma_shape<64> {
    static constexpr int NW = 4, MT = 2;
    static constexpr bool QREG = true;
};
template <> struct lt_attn_fwd_mma_shape<96> {
    static constexpr int NW = 8, MT = 1;
    static constexpr bool QREG = true;
};
template <> struct lt_attn_fwd_mma_shape<128> {
    static constexpr int NW = 4, MT = 2;
    static constexpr bool QREG = false;
};
/* D = 256: one 16-row tile per warp (O alone is 128 fp32 registers a thread), Q re-read from shared
 * memory; 128 query rows and two 64-key K/V buffers take 198 KiB of shared memory (rows padded to
 * 264), one CTA per SM. */
template <> struct lt_attn_fwd_mma_shape<256> {
    static constexpr int NW = 8, MT = 1;
    static constexpr bool QREG = false;
};
/* mma.sync backward per head dim: BN keys per CTA (LT_ATTN_BWD_MMA_BN, 8 warps, 64-query steps).
 * D = 256 takes 64 keys: with 128 the K, V, Q and dO tiles alone exceed Hopper's 227 KiB and dK/dV
 * would need 256 fp32 registers a thread; with 64 keys the warps tile Sᵀ 2 x 4 (32 keys x 16
 * queries) and dK/dV 2 x 4 (32 keys x 64 columns, as D = 128), in 217.5 KiB (FlashAttention-2 and
 * -3 also run hdim 256 backward on 64 x 64 tiles). */
template <int D> struct lt_attn_bwd_mma_shape { static constexpr int BN = LT_ATTN_BWD_MMA_BN; };
template <> struct lt_attn_bwd_mma_shape<256> { static constexpr int BN = 64; };
/* Keys per tile of the TMA forward (fwd_ws.cu). */
constexpr int lt_attn_fwd_ws_bn(int D) { return D == 256 ? LT_ATTN_FWD_WS_BN256 : LT_ATTN_FWD_WS_BN; }
} /* extern "C++" */
#endif

#endif
