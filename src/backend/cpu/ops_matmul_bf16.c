/* The CPU's bf16 products (lt_model_run_options.bf16_products): for a weight held in bf16, f16 or
 * a block format, y = bf16(x)·bf16(W)ᵀ (NT) or bf16(x)·bf16(W) (NN) + beta·y, the products and
 * sums in f32, through oneDNN's matmul, which runs them on AMX tiles or AVX512-BF16 where the CPU
 * has them and emulates them on other AVX-512 CPUs; it makes none for a CPU with AVX2 alone, where
 * lt_cpu_bf16x_available says so and the option is refused by name. x is rounded to nearest even (lt_cpu_to_bf16,
 * as the CUDA products round it) into the head of the workspace. A bf16 W is read as it lies
 * ((out, in) row-major is oneDNN's "ba" layout for NT and "ab" for NN); any other W is dequantized
 * and rounded to bf16 whole after x, as the CUDA matmul converts it. oneDNN's scratchpad follows
 * (user mode), so the library allocates nothing per call and the planner's workspace is all the
 * memory the products use. A call that would not fit the workspace the caller holds takes the f32
 * path instead (ops_matmul.c). A primitive is made once per shape, mode, beta and thread count and
 * kept in the context's CPU state. Private to src/backend/cpu (ops_matmul.c routes to it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/ops_matmul_bf16.h"
#include "core/ctx_state.h"
#include "core/parallel.h"

#if LT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#define BF16X_ALIGN 64
/* Primitives kept per context: one per (rows, mode, beta) of each projection shape a step runs
 * and the loss's tile products; the least recently used goes when full. */
#define BF16X_CACHE 96
/* Threads that may run single-threaded products at once (lt_cpu_bf16x_gemm_run), a stream each. */
#define BF16X_MAX_THREADS 256

typedef struct bf16x_prim {
    int64_t M, K, N;
    int nn, threads;
    uint32_t beta_bits;
    uint64_t used; /* 0 = free */
    dnnl_primitive_t prim;
    dnnl_memory_desc_t spad_md;
    size_t spad;
} bf16x_prim;

typedef struct bf16x_state {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    int failed; /* the engine could not be made: every call takes the f32 path */
    uint64_t tick;
    bf16x_prim p[BF16X_CACHE];
    /* what the workspace's head holds: x rounded, for NT_SAME_X */
    const float *x;
    const void *ws;
    int64_t x_rows, x_width;
    dnnl_stream_t tstream[BF16X_MAX_THREADS]; /* lt_cpu_bf16x_gemm_run's, one per thread */
} bf16x_state;

static size_t align_up(size_t b) { return (b + BF16X_ALIGN - 1) / BF16X_ALIGN * BF16X_ALIGN; }

static void state_free(void *p) {
    bf16x_state *st = p;
    for (int i = 0; i < BF16X_CACHE; i++)
        if (st->p[i].used) dnnl_primitive_destroy(st->p[i].prim);
    if (st->stream) dnnl_stream_destroy(st->stream);
    for (int t = 0; t < BF16X_MAX_THREADS; t++)
        if (st->tstream[t]) dnnl_stream_destroy(st->tstream[t]);
    if (st->eng) dnnl_engine_destroy(st->eng);
    free(st);
}

static bf16x_state *state_of(lt_ctx *ctx) {
    bf16x_state *st = lt_ctx_backend_state(ctx, LT_DEVICE_CPU);
    if (st) return st;
    st = calloc(1, sizeof *st);
    if (!st) return NULL;
    if (dnnl_engine_create(&st->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&st->stream, st->eng, dnnl_stream_default_flags) != dnnl_success)
        st->failed = 1;
    lt_ctx_set_backend_state(ctx, LT_DEVICE_CPU, st, state_free);
    return st;
}

/* The primitive descriptor of y (M, N) f32 = x (M, K) bf16 · B (K, N) bf16 (+ beta·y), B being W
 * as it lies, with a user scratchpad; NULL when oneDNN takes no such product. */
static dnnl_primitive_desc_t make_pd(dnnl_engine_t eng, int64_t M, int64_t K, int64_t N, int nn, float beta) {
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    int ok = dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_bf16, dnnl_ab) == dnnl_success &&
        dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_bf16, nn ? dnnl_ab : dnnl_ba) == dnnl_success &&
        dnnl_memory_desc_init_by_tag(&c, 2, dc, dnnl_f32, dnnl_ab) == dnnl_success &&
        dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) == dnnl_success &&
        dnnl_primitive_attr_create(&attr) == dnnl_success &&
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && beta != 0.0f)
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, beta) == dnnl_success &&
            dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (ok && dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL) != dnnl_success) pd = NULL;
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return pd;
}

static size_t pd_spad(dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *sd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return sd ? dnnl_memory_desc_get_size(sd) : 0;
}

/* oneDNN's OpenMP regions take omp_get_max_threads(); the context's count rules for the call. */
static int set_threads(int threads) {
    int prev = omp_get_max_threads();
    if (threads != prev) omp_set_num_threads(threads);
    return prev;
}

static bf16x_prim *get_prim(bf16x_state *st, int64_t M, int64_t K, int64_t N, int nn, float beta, int threads) {
    uint32_t bb;
    memcpy(&bb, &beta, sizeof bb);
    bf16x_prim *lru = &st->p[0];
    for (int i = 0; i < BF16X_CACHE; i++) {
        bf16x_prim *e = &st->p[i];
        if (e->used && e->M == M && e->K == K && e->N == N && e->nn == nn && e->beta_bits == bb &&
            e->threads == threads) {
            e->used = ++st->tick;
            return e;
        }
        if (e->used < lru->used) lru = e;
    }
    dnnl_primitive_desc_t pd = make_pd(st->eng, M, K, N, nn, beta);
    if (!pd) return NULL;
    dnnl_primitive_t prim = NULL;
    const dnnl_memory_desc_t *sd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    dnnl_memory_desc_t spad_md;
    if (sd) spad_md = *sd;
    size_t spad = pd_spad(pd);
    if (dnnl_primitive_create(&prim, pd) != dnnl_success) prim = NULL;
    dnnl_primitive_desc_destroy(pd);
    if (!prim || !sd) {
        if (prim) dnnl_primitive_destroy(prim);
        return NULL;
    }
    if (lru->used) dnnl_primitive_destroy(lru->prim);
    *lru = (bf16x_prim){M, K, N, nn, threads, bb, ++st->tick, prim, spad_md, spad};
    return lru;
}

/* Runs e on stream: y (e->M, e->N) f32 (+)= a (e->M, e->K) bf16 · B, B the bf16 W as e reads it,
 * with spad as its scratchpad. */
static void run_prim(const bf16x_state *st, dnnl_stream_t stream, const bf16x_prim *e, const void *a, const void *b,
                     float *y, void *spad) {
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_dims_t da = {e->M, e->K}, db = {e->K, e->N}, dc = {e->M, e->N};
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    int ok = dnnl_memory_desc_init_by_tag(&ad, 2, da, dnnl_bf16, dnnl_ab) == dnnl_success &&
        dnnl_memory_desc_init_by_tag(&bd, 2, db, dnnl_bf16, e->nn ? dnnl_ab : dnnl_ba) == dnnl_success &&
        dnnl_memory_desc_init_by_tag(&cd, 2, dc, dnnl_f32, dnnl_ab) == dnnl_success &&
        dnnl_memory_create(&ma, &ad, st->eng, (void *)a) == dnnl_success &&
        dnnl_memory_create(&mb, &bd, st->eng, (void *)b) == dnnl_success &&
        dnnl_memory_create(&mc, &cd, st->eng, y) == dnnl_success &&
        dnnl_memory_create(&ms, &e->spad_md, st->eng, spad) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma},
                                   {DNNL_ARG_WEIGHTS, mb},
                                   {DNNL_ARG_DST, mc},
                                   {DNNL_ARG_SCRATCHPAD, ms}};
        ok = dnnl_primitive_execute(e->prim, stream, 4, args) == dnnl_success &&
            dnnl_stream_wait(stream) == dnnl_success;
    }
    if (ma) dnnl_memory_destroy(ma);
    if (mb) dnnl_memory_destroy(mb);
    if (mc) dnnl_memory_destroy(mc);
    if (ms) dnnl_memory_destroy(ms);
    LT_ASSERT(ok); /* every descriptor was accepted when the primitive was made */
}

/* Scratchpad bytes oneDNN asks for one product on `threads` threads (planning: a throwaway
 * engine; 0 when oneDNN takes no such product). */
static size_t spad_bytes(dnnl_engine_t eng, int64_t M, int64_t K, int64_t N, int nn, float beta) {
    dnnl_primitive_desc_t pd = make_pd(eng, M, K, N, nn, beta);
    if (!pd) return 0;
    const size_t s = pd_spad(pd);
    dnnl_primitive_desc_destroy(pd);
    return s;
}

/* The weights the bf16 products take: held in bf16 (read as they lie), or in f16 or a block format
 * (dequantized and rounded to bf16 whole into the workspace first, as the CUDA matmul converts
 * them). f32 weights keep the exact f32 products, FP8 its own. */
static int takes(lt_dtype t) { return t != LT_DTYPE_F32 && t != LT_DTYPE_FP8 && t != LT_DTYPE_I32; }

/* Bytes of W rounded to bf16 and of the per-thread f32 rows its conversion goes through (0 for a
 * bf16 W). */
static size_t w_bytes(lt_dtype t, int64_t out, int64_t in, int threads) {
    if (t == LT_DTYPE_BF16) return 0;
    return align_up((size_t)out * (size_t)in * sizeof(uint16_t)) +
        (size_t)threads * align_up((size_t)in * sizeof(float));
}

typedef struct w_job {
    const lt_tensor *w;
    uint16_t *wb;
    float *rows; /* per thread, row_stride floats apart */
    size_t row_stride, row_bytes;
} w_job;

static void w_rows(void *arg, int64_t r0, int64_t r1, int thread) {
    const w_job *j = arg;
    const int64_t in = j->w->shape[1];
    float *f = j->rows + (size_t)thread * j->row_stride;
    for (int64_t r = r0; r < r1; r++) {
        lt_dequantize_row(j->w->dtype, (const uint8_t *)j->w->data + (size_t)r * j->row_bytes, f, in);
        lt_cpu_to_bf16_serial(f, j->wb + r * in, in);
    }
}

int lt_cpu_bf16x_available(void) {
    static int known = -1; /* the same answer on every thread: a benign race */
    if (known >= 0) return known;
    int ok = 0;
    dnnl_engine_t eng;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success) {
        dnnl_primitive_desc_t pd = make_pd(eng, 16, 64, 16, 0, 0.0f);
        ok = pd != NULL;
        if (pd) dnnl_primitive_desc_destroy(pd);
        dnnl_engine_destroy(eng);
    }
    known = ok;
    return ok;
}

size_t lt_cpu_bf16x_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads) {
    if (!takes(wdtype) || N_max <= 0) return 0;
    const int64_t wide = in > out ? in : out;
    size_t spad = 0;
    dnnl_engine_t eng;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success) {
        const int t = lt_parallel_threads(threads), prev = set_threads(t);
        /* the scratchpad grows with the row blocks up to their size: the largest call, and a
         * short one (a last chunk) in case its blocking differs */
        const int64_t rows[3] = {N_max, N_max < 64 ? N_max : 64, N_max};
        for (int nn = 0; nn < 2; nn++)
            for (int i = 0; i < 3; i++) {
                const size_t s = spad_bytes(eng, rows[i], nn ? out : in, nn ? in : out, nn, i == 2 ? 1.0f : 0.0f);
                if (s > spad) spad = s;
            }
        set_threads(prev);
        dnnl_engine_destroy(eng);
    }
    return align_up((size_t)N_max * (size_t)wide * sizeof(uint16_t)) +
        w_bytes(wdtype, out, in, lt_parallel_threads(threads)) + align_up(spad);
}

int lt_cpu_bf16x_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                        float *y, void *ws, size_t ws_bytes) {
    if (!takes(w->dtype) || mode == LT_MATMUL_NT_DECODE || N <= 0 || !ws) return 0;
    bf16x_state *st = state_of(ctx);
    if (!st || st->failed) return 0;
    const int nn = mode == LT_MATMUL_NN;
    const int64_t out = w->shape[0], in = w->shape[1], K = nn ? out : in, Ncols = nn ? in : out;
    const int threads = lt_parallel_threads(lt_ctx_threads(ctx));
    const int prev = set_threads(threads);
    bf16x_prim *e = get_prim(st, N, K, Ncols, nn, beta, threads);
    /* x rounded at the head of the workspace, W rounded after it unless held in bf16, then the
     * scratchpad; a call they would not fit (a scratchpad larger than the planner's probes saw)
     * takes the f32 path instead */
    const size_t xb_bytes = align_up((size_t)N * (size_t)K * sizeof(uint16_t)),
                 wb_bytes = w_bytes(w->dtype, out, in, threads);
    if (!e || xb_bytes + wb_bytes + e->spad > ws_bytes) {
        set_threads(prev);
        return 0;
    }
    uint16_t *xb = ws;
    if (!(mode == LT_MATMUL_NT_SAME_X && st->x == x && st->ws == ws && st->x_rows == N && st->x_width == K))
        lt_cpu_to_bf16(ctx, x, xb, N * K);
    st->x = x, st->ws = ws, st->x_rows = N, st->x_width = K;
    const void *wdata = w->data;
    if (wb_bytes) {
        uint8_t *wb = (uint8_t *)ws + xb_bytes;
        w_job wj = {w, (uint16_t *)wb, (float *)(wb + align_up((size_t)out * (size_t)in * sizeof(uint16_t))),
                    align_up((size_t)in * sizeof(float)) / sizeof(float), (size_t)lt_dtype_row_bytes(w->dtype, in)};
        lt_parallel_for(threads, out, 16, w_rows, &wj);
        wdata = wb;
    }
    run_prim(st, st->stream, e, xb, wdata, y, (uint8_t *)ws + xb_bytes + wb_bytes);
    set_threads(prev);
    return 1;
}

size_t lt_cpu_bf16x_gemm_spad(int64_t M, int64_t K, int64_t N, int nn, float beta) {
    size_t spad = 0;
    dnnl_engine_t eng;
    if (M <= 0 || K <= 0 || N <= 0 || dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) return 0;
    const int prev = set_threads(1);
    spad = align_up(spad_bytes(eng, M, K, N, nn, beta));
    set_threads(prev);
    dnnl_engine_destroy(eng);
    return spad;
}

const lt_cpu_bf16x_gemm *lt_cpu_bf16x_gemm_get(lt_ctx *ctx, int64_t M, int64_t K, int64_t N, int nn, float beta,
                                               int threads) {
    bf16x_state *st = state_of(ctx);
    if (!st || st->failed || threads > BF16X_MAX_THREADS) return NULL;
    for (int t = 0; t < threads; t++)
        if (!st->tstream[t] && dnnl_stream_create(&st->tstream[t], st->eng, dnnl_stream_default_flags) != dnnl_success)
            return NULL;
    const int prev = set_threads(1); /* made for one thread: each caller's thread runs its own */
    const bf16x_prim *e = get_prim(st, M, K, N, nn, beta, 1);
    set_threads(prev);
    return (const lt_cpu_bf16x_gemm *)e;
}

size_t lt_cpu_bf16x_gemm_spad_of(const lt_cpu_bf16x_gemm *g) { return align_up(((const bf16x_prim *)g)->spad); }

void lt_cpu_bf16x_gemm_run(lt_ctx *ctx, const lt_cpu_bf16x_gemm *g, int thread, const uint16_t *a, const void *b,
                           float *y, void *spad) {
    const bf16x_state *st = lt_ctx_backend_state(ctx, LT_DEVICE_CPU);
    run_prim(st, st->tstream[thread], (const bf16x_prim *)g, a, b, y, spad);
}

#else /* no oneDNN in this build: the option is refused where it is set */

int lt_cpu_bf16x_available(void) { return 0; }

size_t lt_cpu_bf16x_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads) {
    (void)wdtype, (void)out, (void)in, (void)N_max, (void)threads;
    return 0;
}

int lt_cpu_bf16x_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                        float *y, void *ws, size_t ws_bytes) {
    (void)ctx, (void)mode, (void)w, (void)x, (void)N, (void)beta, (void)y, (void)ws, (void)ws_bytes;
    return 0;
}

size_t lt_cpu_bf16x_gemm_spad(int64_t M, int64_t K, int64_t N, int nn, float beta) {
    (void)M, (void)K, (void)N, (void)nn, (void)beta;
    return 0;
}

const lt_cpu_bf16x_gemm *lt_cpu_bf16x_gemm_get(lt_ctx *ctx, int64_t M, int64_t K, int64_t N, int nn, float beta,
                                               int threads) {
    (void)ctx, (void)M, (void)K, (void)N, (void)nn, (void)beta, (void)threads;
    return NULL;
}

size_t lt_cpu_bf16x_gemm_spad_of(const lt_cpu_bf16x_gemm *g) {
    (void)g;
    return 0;
}

void lt_cpu_bf16x_gemm_run(lt_ctx *ctx, const lt_cpu_bf16x_gemm *g, int thread, const uint16_t *a, const void *b,
                           float *y, void *spad) {
    (void)ctx, (void)g, (void)thread, (void)a, (void)b, (void)y, (void)spad;
    LT_ASSERT(0); /* lt_cpu_bf16x_gemm_get gave no product to run */
}

#endif
