/* CPU GEMM and weight matmuls. f32 weights go straight to OpenBLAS; bf16, f16 and block-quantized
 * weights are dequantized LT_MATMUL_TILE rows at a time into a per-thread f32 workspace and
 * multiplied there, so a quantized base never exists in f32 as a whole (QLoRA). A run with bf16
 * products sends bf16 weights to oneDNN instead (ops_matmul_bf16.c). The OpenMP build
 * of OpenBLAS runs single-threaded inside our parallel regions, so threads never oversubscribe.
 * The LoRA adapters' thin products (one side of rank r <= 16) have their own AVX-512 loops: they
 * are memory-bound, and OpenBLAS packs the wide operand before reading it. */
#include <cblas.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__x86_64__) && defined(__GNUC__))
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/ops_matmul_bf16.h"
#include "core/ctx_state.h"
#include "core/parallel.h"

/* Weight rows dequantized per tile: 64 rows × in ≤ 64 × 16K floats = 4 MiB per thread at the
 * widest layers we target, small enough for L2/L3 residency at C ≤ 4096 (also tried 32: more
 * GEMM calls for no gain at N ≥ 256; 256: larger workspace, no gain). */
#define LT_MATMUL_TILE 64

/* Tokens per thread chunk in the NN mode, where threads split the rows of x instead of W. */
#define LT_MATMUL_NN_ROWS 32

/* The thin products are AVX-512 code: always used when the build targets AVX-512 (-march=native on
 * such a CPU), else (a portable x86-64 build) compiled for AVX-512 by function attribute and used
 * when the CPU at hand has it. */
#if defined(__AVX512F__)
#define LT_THIN 1
#define THIN_FN
static int thin_available(void) { return 1; }
#elif defined(__x86_64__) && defined(__GNUC__)
#define LT_THIN 1
#define THIN_FN __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
static int thin_available(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
#endif

#if defined(LT_THIN)
/* ---- thin products: C (M, N) with one of M, N (or both) at most THIN_MAX ----
 * The adapters' x·Aᵀ, dy·B (row dots), dyᵀ·lu and dluᵀ·x (column sums), lu·Bᵀ and dlu·A (rank-r
 * updates). Each output element is one fixed-order sum however rows or columns are split among
 * threads, so the results do not depend on the thread count. */
#define THIN_MAX 16
/* Bᵀ copies for the NN row-dot and TN rank-K cases live on the calling thread's stack: at most
 * this many floats. */
#define THIN_BT_FLOATS 16384
/* Rows per thread chunk of the rank-K updates: a few KiB of C each, so short row sets still spread. */
#define RANKK_GRAIN 16

/* Row dots: C[m, n] = alpha·sum_k A[m, k]·Bt[n, k] + beta·C[m, n] for n < N <= THIN_MAX. */
typedef struct {
    const float *A, *Bt;
    float *C;
    int64_t N, K, lda, ldb, ldc;
    float alpha, beta;
} rowdot_job;

/* Column sums: acc[t, i] = sum_k Th[k, t]·W[k, i] for t < r <= THIN_MAX over 16-column chunks of
 * the wide operand W (K, width); C gets alpha·acc + beta·C, as C[t, i] or (transposed) C[i, t]. */
typedef struct {
    const float *W, *Th;
    float *C;
    int64_t r, width, K, ldw, ldt, ldc;
    float alpha, beta;
    int transposed;
} colsum_job;

/* A work item is a run of at most COLSUM_CHUNKS 16-column chunks. Rows go in blocks of COLSUM_ROWS:
 * the block's slice of W is read row by row (contiguous runs of up to 2 KiB, which the hardware
 * prefetchers stream) while each chunk is summed over the block with its r accumulators in
 * registers, parked in `part` between blocks. The block boundaries are fixed, so how columns are
 * grouped into items changes nothing in any sum. */
#define COLSUM_CHUNKS 32
#define COLSUM_ROWS 16

typedef struct {
    const colsum_job *j;
    int64_t chunks, items;
} colsum_split;

/* Rank-K updates: C[m, :] = alpha·sum_k A[m, k]·Bk[k, :] + beta·C[m, :] for K <= THIN_MAX, the
 * adapters' lu·Bᵀ and dlu·A, with Bk (K, N) read in place (NN) or from a transposed copy of B (N, K).
 * Each row is a sweep over 16-column chunks with the K row values broadcast: one read and one write
 * of C, no packing. The sum over k runs in one fixed order for every element. */
typedef struct {
    const float *A, *Bk;
    float *C;
    int64_t N, K, lda, ldb, ldc;
    float alpha, beta;
} rankk_job;
#endif

#if defined(LT_THIN)
/* ---- the AVX-512 loops ----
 * The row dots (r = 8, and r = 16 as two passes of 8 columns) and the rank-8 updates take three
 * rows a pass, so each chunk of the narrow operand (Bᵀ of dy·B, B of lu·Bᵀ: 48 KiB at 1536
 * columns, past L1) is loaded once for three rows; the column sums go in 16-row blocks (64-row
 * blocks kept 64 rows of the wide matrix in flight per chunk) over items balanced across the
 * threads. On the 2-core Xeon (Sapphire Rapids) VM the 24 products of
 * dev/cpu/05-lora-thin-probe.c took 4.2-4.8 ms at 2048 tokens against 5.7-7.7 ms taking one row a
 * pass with 64-row blocks (0.87-0.93 against 1.34-1.40 ms at 512; OpenBLAS 0.3.21's SkylakeX
 * kernels 10.9-11.5 and 2.4 ms). At r = 16, `bench lora --rank 16` (one SmolLM2 layer, 2048 rows,
 * two pairs alternated) measured what the adapters add as 5.6-6.1 -> 4.5-5.1 ms forward and 19.4
 * -> 15.1-15.2 ms backward. Also tried: column sums walking all rows per 16-column chunk, 1.5-2x
 * slower than OpenBLAS once the wide matrix had left the cache. */
THIN_FN static inline __mmask16 thin_mask(int64_t n) {
    const uint32_t bits = n >= 16 ? 0xFFFFu : (1u << n) - 1u;
    return (__mmask16)bits;
}

THIN_FN static inline __attribute__((always_inline)) void rowdot_row(const rowdot_job *j, int64_t m, const int64_t N) {
    const float *a = j->A + m * j->lda;
    __m512 acc[THIN_MAX];
    for (int64_t n = 0; n < N; n++) acc[n] = _mm512_setzero_ps();
    for (int64_t k = 0; k < j->K; k += 16) {
        const __mmask16 mk = thin_mask(j->K - k);
        const __m512 av = _mm512_maskz_loadu_ps(mk, a + k);
        for (int64_t n = 0; n < N; n++)
            acc[n] = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, j->Bt + n * j->ldb + k), acc[n]);
    }
    float *c = j->C + m * j->ldc;
    for (int64_t n = 0; n < N; n++) {
        const float v = j->alpha * _mm512_reduce_add_ps(acc[n]);
        c[n] = j->beta == 0.0f ? v : v + j->beta * c[n];
    }
}

/* The eight sums of v[0..7], lane n holding v[n]'s: halves added, then three rounds of pairwise
 * adds (one fixed order). */
THIN_FN static inline __m256 thin_hsum8(const __m512 *v) {
    __m256 t[8];
    for (int n = 0; n < 8; n++) t[n] = _mm256_add_ps(_mm512_castps512_ps256(v[n]), _mm512_extractf32x8_ps(v[n], 1));
    const __m256 w0 = _mm256_hadd_ps(_mm256_hadd_ps(t[0], t[1]), _mm256_hadd_ps(t[2], t[3]));
    const __m256 w1 = _mm256_hadd_ps(_mm256_hadd_ps(t[4], t[5]), _mm256_hadd_ps(t[6], t[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(w0, w1, 0x20), _mm256_permute2f128_ps(w0, w1, 0x31));
}

/* Rows m .. m + RB - 1 (RB <= 3) against the 8 columns n0 .. n0 + 7: each chunk of Bᵀ loaded once
 * serves RB rows (24 accumulators), so a Bᵀ wider than L1 (dy·B over 1536 columns) is read from
 * L2 a third as often as row by row. */
THIN_FN static inline __attribute__((always_inline)) void rowdot8_rows(const rowdot_job *j, int64_t m, int64_t n0,
                                                                       const int RB) {
    const float *a[3], *bt = j->Bt + n0 * j->ldb;
    __m512 acc[3][8];
    for (int i = 0; i < RB; i++) {
        a[i] = j->A + (m + i) * j->lda;
        for (int n = 0; n < 8; n++) acc[i][n] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < j->K; k += 16) {
        const __mmask16 mk = thin_mask(j->K - k);
        __m512 av[3];
        for (int i = 0; i < RB; i++) av[i] = _mm512_maskz_loadu_ps(mk, a[i] + k);
        for (int n = 0; n < 8; n++) {
            const __m512 b = _mm512_maskz_loadu_ps(mk, bt + n * j->ldb + k);
            for (int i = 0; i < RB; i++) acc[i][n] = _mm512_fmadd_ps(av[i], b, acc[i][n]);
        }
    }
    const __m256 alpha = _mm256_set1_ps(j->alpha), beta = _mm256_set1_ps(j->beta);
    for (int i = 0; i < RB; i++) {
        float *c = j->C + (m + i) * j->ldc + n0;
        __m256 v = _mm256_mul_ps(alpha, thin_hsum8(acc[i]));
        if (j->beta != 0.0f) v = _mm256_fmadd_ps(beta, _mm256_loadu_ps(c), v);
        _mm256_storeu_ps(c, v);
    }
}

THIN_FN static void rowdot_rows(void *arg, int64_t m0, int64_t m1, int thread) {
    (void)thread;
    const rowdot_job *j = arg;
    if (j->N == 8 || j->N == 16) {
        for (int64_t n0 = 0; n0 < j->N; n0 += 8) {
            int64_t m = m0;
            for (; m + 3 <= m1; m += 3) rowdot8_rows(j, m, n0, 3);
            for (; m < m1; m++) rowdot8_rows(j, m, n0, 1);
        }
        return;
    }
    for (int64_t m = m0; m < m1; m++) rowdot_row(j, m, j->N);
}

THIN_FN static inline __attribute__((always_inline)) void colsum_run(const colsum_job *j, int64_t c0, int64_t c1,
                                                                     const int64_t r) {
    float part[THIN_MAX][16 * COLSUM_CHUNKS];
    for (int64_t k0 = 0; k0 < j->K; k0 += COLSUM_ROWS) {
        const int64_t k1 = k0 + COLSUM_ROWS < j->K ? k0 + COLSUM_ROWS : j->K;
        for (int64_t ch = c0; ch < c1; ch++) {
            const int64_t i = ch * 16, slot = (ch - c0) * 16;
            const __mmask16 mk = thin_mask(j->width - i);
            __m512 acc[THIN_MAX];
            for (int64_t t = 0; t < r; t++) acc[t] = k0 ? _mm512_loadu_ps(part[t] + slot) : _mm512_setzero_ps();
            for (int64_t k = k0; k < k1; k++) {
                const __m512 w = _mm512_maskz_loadu_ps(mk, j->W + k * j->ldw + i);
                const float *th = j->Th + k * j->ldt;
                for (int64_t t = 0; t < r; t++) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(th[t]), w, acc[t]);
            }
            for (int64_t t = 0; t < r; t++) _mm512_storeu_ps(part[t] + slot, acc[t]);
        }
    }
    for (int64_t ch = c0; ch < c1; ch++) {
        const int64_t i = ch * 16, n = j->width - i < 16 ? j->width - i : 16;
        for (int64_t t = 0; t < r; t++)
            for (int64_t x = 0; x < n; x++) {
                float *c = j->transposed ? j->C + (i + x) * j->ldc + t : j->C + t * j->ldc + i + x;
                const float v = j->alpha * part[t][(ch - c0) * 16 + x];
                *c = j->beta == 0.0f ? v : v + j->beta * *c;
            }
    }
}

THIN_FN static void colsum_items(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const colsum_split *sp = arg;
    const colsum_job *j = sp->j;
    for (int64_t it = b; it < e; it++) {
        const int64_t c0 = it * sp->chunks / sp->items, c1 = (it + 1) * sp->chunks / sp->items;
        if (j->r == 8) colsum_run(j, c0, c1, 8);
        else if (j->r == 16) colsum_run(j, c0, c1, 16);
        else colsum_run(j, c0, c1, j->r);
    }
}

THIN_FN static inline __attribute__((always_inline)) void rankk_row(const rankk_job *j, int64_t m, const int64_t K) {
    const float *a = j->A + m * j->lda;
    float *c = j->C + m * j->ldc;
    __m512 av[THIN_MAX];
    for (int64_t k = 0; k < K; k++) av[k] = _mm512_set1_ps(a[k]);
    const __m512 alpha = _mm512_set1_ps(j->alpha), beta = _mm512_set1_ps(j->beta);
    for (int64_t n = 0; n < j->N; n += 16) {
        const __mmask16 mk = thin_mask(j->N - n);
        __m512 acc = _mm512_mul_ps(av[0], _mm512_maskz_loadu_ps(mk, j->Bk + n));
        for (int64_t k = 1; k < K; k++)
            acc = _mm512_fmadd_ps(av[k], _mm512_maskz_loadu_ps(mk, j->Bk + k * j->ldb + n), acc);
        acc = _mm512_mul_ps(alpha, acc);
        if (j->beta != 0.0f) acc = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mk, c + n), acc);
        _mm512_mask_storeu_ps(c + n, mk, acc);
    }
}

/* Rows m .. m + RB - 1 (RB <= 3) of a rank-8 update: each chunk of Bk loaded once serves RB rows
 * (24 broadcast values in registers), so a Bk wider than L1 (lu·Bᵀ over 1536 columns) is read
 * from L2 a third as often. The same sum per element as rankk_row. */
THIN_FN static inline __attribute__((always_inline)) void rankk8_rows(const rankk_job *j, int64_t m, const int RB) {
    __m512 av[3][8];
    float *c[3];
    for (int i = 0; i < RB; i++) {
        const float *a = j->A + (m + i) * j->lda;
        c[i] = j->C + (m + i) * j->ldc;
        for (int k = 0; k < 8; k++) av[i][k] = _mm512_set1_ps(a[k]);
    }
    const __m512 alpha = _mm512_set1_ps(j->alpha), beta = _mm512_set1_ps(j->beta);
    for (int64_t n = 0; n < j->N; n += 16) {
        const __mmask16 mk = thin_mask(j->N - n);
        __m512 acc[3];
        __m512 b = _mm512_maskz_loadu_ps(mk, j->Bk + n);
        for (int i = 0; i < RB; i++) acc[i] = _mm512_mul_ps(av[i][0], b);
        for (int k = 1; k < 8; k++) {
            b = _mm512_maskz_loadu_ps(mk, j->Bk + k * j->ldb + n);
            for (int i = 0; i < RB; i++) acc[i] = _mm512_fmadd_ps(av[i][k], b, acc[i]);
        }
        for (int i = 0; i < RB; i++) {
            __m512 v = _mm512_mul_ps(alpha, acc[i]);
            if (j->beta != 0.0f) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mk, c[i] + n), v);
            _mm512_mask_storeu_ps(c[i] + n, mk, v);
        }
    }
}

THIN_FN static void rankk_rows(void *arg, int64_t m0, int64_t m1, int thread) {
    (void)thread;
    const rankk_job *j = arg;
    if (j->K == 8) {
        int64_t m = m0;
        for (; m + 3 <= m1; m += 3) rankk8_rows(j, m, 3);
        for (; m < m1; m++) rankk8_rows(j, m, 1);
        return;
    }
    for (int64_t m = m0; m < m1; m++) {
        if (j->K == 16) rankk_row(j, m, 16);
        else rankk_row(j, m, j->K);
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define LT_THIN2 1
/* ---- the row dots in AVX2 + FMA, for x86-64 CPUs without AVX-512 ----
 * x·Aᵀ and dy·B: N taken 8 at a time so the accumulators stay in the 16 ymm registers, each
 * element one fixed-order sum, so results do not depend on the thread count. On one core of the
 * 2-core AMD EPYC (Zen 3) VM at the SmolLM2 shapes (512 tokens, r = 8, the four projection shapes)
 * the two take 2.4-2.5 ms against 3.2 ms with OpenBLAS 0.3.21's Zen kernels. The column sums
 * and rank-r updates stay with OpenBLAS there: AVX2 ports of the loops above (8 lanes, broadcasts
 * from memory; also two halves per broadcast, and 256-column blocks for the updates) took 1.4-2.6x
 * OpenBLAS's time. */
#define THIN2_FN __attribute__((target("avx2,fma")))
static int thin2_available(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

THIN2_FN static inline __m256i thin2_mask(int64_t n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), lane);
}

/* Horizontal sum in one fixed order: the two 128-bit halves, then pairs. */
THIN2_FN static inline float thin2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Row dots for the columns n0 .. n0 + NB - 1 (NB <= 8) of row m. */
THIN2_FN static inline __attribute__((always_inline)) void rowdot2_block(const rowdot_job *j, int64_t m, int64_t n0,
                                                                         const int64_t NB) {
    const float *a = j->A + m * j->lda;
    const float *bt = j->Bt + n0 * j->ldb;
    __m256 acc[8];
    for (int64_t n = 0; n < NB; n++) acc[n] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= j->K; k += 8) {
        const __m256 av = _mm256_loadu_ps(a + k);
        for (int64_t n = 0; n < NB; n++) acc[n] = _mm256_fmadd_ps(av, _mm256_loadu_ps(bt + n * j->ldb + k), acc[n]);
    }
    if (k < j->K) {
        const __m256i mk = thin2_mask(j->K - k);
        const __m256 av = _mm256_maskload_ps(a + k, mk);
        for (int64_t n = 0; n < NB; n++)
            acc[n] = _mm256_fmadd_ps(av, _mm256_maskload_ps(bt + n * j->ldb + k, mk), acc[n]);
    }
    float *c = j->C + m * j->ldc + n0;
    for (int64_t n = 0; n < NB; n++) {
        const float v = j->alpha * thin2_hsum(acc[n]);
        c[n] = j->beta == 0.0f ? v : v + j->beta * c[n];
    }
}

THIN2_FN static void rowdot2_rows(void *arg, int64_t m0, int64_t m1, int thread) {
    (void)thread;
    const rowdot_job *j = arg;
    for (int64_t m = m0; m < m1; m++)
        for (int64_t n0 = 0; n0 < j->N; n0 += 8) {
            if (j->N - n0 >= 8) rowdot2_block(j, m, n0, 8);
            else rowdot2_block(j, m, n0, j->N - n0);
        }
}

#endif

#if defined(LT_THIN)

/* The loops of one instruction set over the jobs above; NULL leaves that case to OpenBLAS. */
typedef struct {
    lt_range_fn rowdot, rankk, colsum;
} thin_kernels;

/* Runs the thin cases (one side of rank <= 16); 0 when the shape is not one of them (the caller
 * uses OpenBLAS). */
static int thin_gemm(const thin_kernels *kf, lt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const int threads = lt_ctx_threads(ctx);
    if (kf->rowdot && !ta && N <= 16 && (tb || N * K <= THIN_BT_FLOATS)) {
        /* C = A·Bᵀ with Bᵀ's rows read in place (tb), or from a copy of B transposed (NN). */
        float bt[THIN_BT_FLOATS];
        rowdot_job j = {A, B, C, N, K, lda, ldb, ldc, alpha, beta};
        if (!tb) {
            for (int64_t k = 0; k < K; k++)
                for (int64_t n = 0; n < N; n++) bt[n * K + k] = B[k * ldb + n];
            j.Bt = bt, j.ldb = K;
        }
        lt_parallel_for(threads, M, 64, kf->rowdot, &j);
        return 1;
    }
    if (kf->rankk && !ta && K <= 16 && (!tb || N * K <= THIN_BT_FLOATS)) {
        float bk[THIN_BT_FLOATS];
        rankk_job j = {A, B, C, N, K, lda, ldb, ldc, alpha, beta};
        if (tb) {
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) bk[k * N + n] = B[n * ldb + k];
            j.Bk = bk, j.ldb = N;
        }
        lt_parallel_for(threads, M, RANKK_GRAIN, kf->rankk, &j);
        return 1;
    }
    if (kf->colsum && ta && !tb && (M <= 16 || N <= 16)) {
        /* C = Aᵀ·B with A (K, M), B (K, N): the thin side is summed against 16-column chunks of
         * the wide one; Aᵀ thin (M <= 16) gives C's rows directly, B thin gives them transposed. */
        const int a_thin = M <= 16;
        colsum_job j = {a_thin ? B : A,     a_thin ? A : B,     C,   a_thin ? M : N, a_thin ? N : M, K,
                        a_thin ? ldb : lda, a_thin ? lda : ldb, ldc, alpha,          beta,           !a_thin};
        colsum_split sp = {&j, (j.width + 15) / 16, 0};
        const int64_t nt = lt_parallel_threads(threads), least = (sp.chunks + COLSUM_CHUNKS - 1) / COLSUM_CHUNKS;
        /* a multiple of the threads where the chunks allow, so no thread takes one item more */
        const int64_t even = (least + nt - 1) / nt * nt;
        sp.items = nt > least ? (nt < sp.chunks ? nt : sp.chunks) : (even <= sp.chunks ? even : least);
        lt_parallel_for(threads, sp.items, 1, kf->colsum, &sp);
        return 1;
    }
    return 0;
}
#endif

void lt_cpu_gemm(lt_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
#if defined(LT_THIN)
    static const thin_kernels k512 = {rowdot_rows, rankk_rows, colsum_items};
    if (K > 0 && thin_available() &&
        thin_gemm(&k512, ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
#if defined(LT_THIN2)
    static const thin_kernels k256 = {rowdot2_rows, NULL, NULL};
    if (K > 0 && thin2_available() &&
        thin_gemm(&k256, ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
#endif
#else
    (void)ctx;
#endif
    if (K <= 0) { /* BLAS would not touch C when K = 0 with beta 1; make beta explicit */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

size_t lt_cpu_matmul_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads) {
    if (wdtype == LT_DTYPE_F32) return 0;
    size_t tiles = (size_t)lt_parallel_threads(threads) * LT_MATMUL_TILE * (size_t)in * sizeof(float);
    if (wdtype != LT_DTYPE_FP8) return tiles;
    /* fp8: x rounded as the FP8 product sees it (fp8_round_x), before the tiles */
    return (size_t)(N_max > 0 ? N_max : 0) * (size_t)(in > out ? in : out) * sizeof(float) + tiles;
}

typedef struct mm_job {
    const lt_tensor *w;
    const float *x;
    float *y;
    float *ws;
    int64_t N, out, in;
    float beta;
    size_t row_bytes;
    int nn; /* NN mode (fp8: the row scales are in x) */
} mm_job;

/* The FP8 product's view of x (N, width), as the CUDA one quantizes it: NT rounds each row of x
 * to e4m3 with its own scale (lt_fp8_row_scale); NN first multiplies x (dy, width out) by W's row
 * scales column by column, then does the same. xr holds the rounded values times the row scale. */
typedef struct fp8_x_job {
    const float *x, *col_scale;
    float *xr;
    int64_t width;
} fp8_x_job;

static void fp8_round_x(void *arg, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const fp8_x_job *j = arg;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->width;
        float *d = j->xr + r * j->width, inv, sc;
        if (j->col_scale) {
            for (int64_t i = 0; i < j->width; i++) d[i] = x[i] * j->col_scale[i];
            x = d;
        }
        (void)lt_fp8_row_scale(x, j->width, &inv, &sc);
        for (int64_t i = 0; i < j->width; i++) d[i] = lt_fp8_to_f32(lt_f32_to_fp8(x[i] * inv)) * sc;
    }
}

static void dequant_rows(const mm_job *j, int64_t r0, int64_t r1, float *dst) {
    const uint8_t *base = j->w->data;
    if (j->w->dtype == LT_DTYPE_FP8) { /* q rows, times the row scale in NT (NN folds it into x) */
        const float *scale = lt_fp8_scales(base, j->out, j->in);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *q = base + (size_t)r * (size_t)j->in;
            const float sc = j->nn ? 1.0f : scale[r];
            float *d = dst + (r - r0) * j->in;
            for (int64_t i = 0; i < j->in; i++) d[i] = lt_fp8_to_f32(q[i]) * sc;
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        lt_dequantize_row(j->w->dtype, base + (size_t)r * j->row_bytes, dst + (r - r0) * j->in, j->in);
}

/* NT: threads own tiles of W's rows, i.e. column blocks of y. */
static void nt_tiles(void *arg, int64_t t0, int64_t t1, int thread) {
    const mm_job *j = arg;
    float *tile = j->ws + (size_t)thread * LT_MATMUL_TILE * (size_t)j->in;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = t * LT_MATMUL_TILE, r1 = r0 + LT_MATMUL_TILE < j->out ? r0 + LT_MATMUL_TILE : j->out;
        dequant_rows(j, r0, r1, tile);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)j->N, (blasint)(r1 - r0), (blasint)j->in, 1.0f,
                    j->x, (blasint)j->in, tile, (blasint)j->in, j->beta, j->y + r0, (blasint)j->out);
    }
}

/* NN: threads own chunks of x's rows and walk every tile of W, accumulating into their rows of y. */
static void nn_rows(void *arg, int64_t c0, int64_t c1, int thread) {
    const mm_job *j = arg;
    float *tile = j->ws + (size_t)thread * LT_MATMUL_TILE * (size_t)j->in;
    int64_t n0 = c0 * LT_MATMUL_NN_ROWS, n1 = c1 * LT_MATMUL_NN_ROWS < j->N ? c1 * LT_MATMUL_NN_ROWS : j->N;
    for (int64_t r0 = 0; r0 < j->out; r0 += LT_MATMUL_TILE) {
        int64_t r1 = r0 + LT_MATMUL_TILE < j->out ? r0 + LT_MATMUL_TILE : j->out;
        dequant_rows(j, r0, r1, tile);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)(n1 - n0), (blasint)j->in, (blasint)(r1 - r0),
                    1.0f, j->x + n0 * j->out + r0, (blasint)j->out, tile, (blasint)j->in, r0 == 0 ? j->beta : 1.0f,
                    j->y + n0 * j->in, (blasint)j->in);
    }
}

void lt_cpu_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                   float *y, void *ws) {
    int64_t out = w->shape[0], in = w->shape[1];
    if (N <= 0) return;
    if (w->dtype == LT_DTYPE_F32) {
        /* One OpenBLAS call on OpenBLAS's own threads, which share the packed panels. Also tried
         * (16-core device, T = 512): one single-threaded call per block of y over our threads,
         * each thread packing its own copy of the shared operand: 521 ms of matmul per step
         * against 467 ms. */
        const float *W = w->data;
        if (mode != LT_MATMUL_NN) /* NT or NT_SAME_X: nothing to reuse here */
            lt_cpu_gemm(ctx, 0, 1, N, out, in, 1.0f, x, in, W, in, beta, y, out);
        else lt_cpu_gemm(ctx, 0, 0, N, in, out, 1.0f, x, out, W, in, beta, y, in);
        return;
    }
    const size_t bf16x = lt_ctx_bf16x(ctx); /* the run's bf16 products, on a workspace sized for them */
    if (bf16x && lt_cpu_bf16x_matmul(ctx, mode, w, x, N, beta, y, ws, bf16x)) return;
    const int fp8 = w->dtype == LT_DTYPE_FP8;
    if (mode == LT_MATMUL_NT_DECODE && !fp8 && lt_cpu_matvec(ctx, w, x, N, beta, y, ws)) return;
    mm_job j = {w, x, y, ws, N, out, in, beta, (size_t)lt_dtype_row_bytes(w->dtype, in), mode == LT_MATMUL_NN};
    int threads = lt_ctx_threads(ctx);
    if (fp8) { /* x rounded first; the tiles follow it in the workspace */
        fp8_x_job fx = {x, NULL, ws, mode == LT_MATMUL_NN ? out : in};
        if (mode == LT_MATMUL_NN) fx.col_scale = lt_fp8_scales(w->data, out, in);
        lt_parallel_for(threads, N, 16, fp8_round_x, &fx);
        j.x = ws;
        j.ws = (float *)ws + (size_t)N * (size_t)(in > out ? in : out);
    }
    if (mode != LT_MATMUL_NN) {
        lt_parallel_for(threads, (out + LT_MATMUL_TILE - 1) / LT_MATMUL_TILE, 1, nt_tiles, &j);
    } else {
        lt_parallel_for(threads, (N + LT_MATMUL_NN_ROWS - 1) / LT_MATMUL_NN_ROWS, 1, nn_rows, &j);
    }
}
