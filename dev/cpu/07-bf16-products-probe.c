/* Lab probe: OpenBLAS's sgemm on f32 x and W against oneDNN's bf16 matmul on x rounded to bf16
 * (the rounding timed with it) and W held in bf16 as it lies, f32 y: the CPU's bf16 products
 * (src/backend/cpu/ops_matmul_bf16.c) at the five weight shapes of a SmolLM2-135M step, NT (x·Wᵀ)
 * and NN (dy·W), weights hot, y overwritten. Not built by CMake; needs Debian's libdnnl-dev:
 *   gcc -O2 -fopenmp dev/cpu/07-bf16-products-probe.c -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -ldnnl -o /tmp/bf16-probe
 *   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive /tmp/bf16-probe [rows=512]
 * Prints per shape the mean ms of 20 calls after 20 untimed ones, GFLOP/s, the ratio, oneDNN's
 * scratchpad bytes and the kernel it picked. Measured on the 2-core Xeon (Sapphire Rapids) VM, 2
 * threads, two runs (oneDNN 2.6.3 picked brg:avx512_core_amx_bf16 everywhere): at 512 rows OpenBLAS
 * 217-334 GFLOP/s, oneDNN 1.8-3.7× that (421-1136 GFLOP/s; the 192-wide k and v products gain the
 * least); at 2048 rows 1.9-4.1×; scratchpads 58-580 KB. */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                        \
    do {                                                             \
        dnnl_status_t st_ = (x);                                     \
        if (st_ != dnnl_success) {                                   \
            fprintf(stderr, "%s: oneDNN status %d\n", #x, (int)st_); \
            exit(1);                                                 \
        }                                                            \
    } while (0)

#define REPS 20

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Nearest even, as lt_f32_to_bf16 (the probe's inputs hold no NaN). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static dnnl_engine_t eng;
static dnnl_stream_t stream;

/* nn = 0: y (M, out) = x (M, in)·Wᵀ; nn = 1: y (M, in) = x (M, out)·W. W is (out, in). */
static void run(int64_t M, int64_t out, int64_t in, int nn) {
    const int64_t K = nn ? out : in, N = nn ? in : out;
    float *x = malloc((size_t)(M * K) * 4), *W = malloc((size_t)(out * in) * 4), *y = malloc((size_t)(M * N) * 4);
    uint16_t *xb = malloc((size_t)(M * K) * 2), *Wb = malloc((size_t)(out * in) * 2);
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)(rand() % 100) / 100.0f;
    for (int64_t i = 0; i < out * in; i++) W[i] = (float)(rand() % 100) / 100.0f, Wb[i] = to_bf16(W[i]);
    double t0 = 0, tb = 0, td = 0;
    for (int pass = 0; pass < 2; pass++) {
        t0 = now();
        for (int r = 0; r < REPS; r++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, nn ? CblasNoTrans : CblasTrans, (int)M, (int)N, (int)K, 1.0f, x,
                        (int)K, W, (int)in, 0.0f, y, (int)N);
        tb = (now() - t0) / REPS;
    }
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    CK(dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_bf16, dnnl_ab));
    CK(dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_bf16, nn ? dnnl_ab : dnnl_ba));
    CK(dnnl_memory_desc_init_by_tag(&c, 2, dc, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    CK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c));
    dnnl_primitive_attr_t attr;
    CK(dnnl_primitive_attr_create(&attr));
    CK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    dnnl_primitive_desc_t pd;
    CK(dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL));
    const char *impl;
    CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    const dnnl_memory_desc_t *sd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    const size_t spad = dnnl_memory_desc_get_size(sd);
    dnnl_primitive_t prim;
    CK(dnnl_primitive_create(&prim, pd));
    void *sp = malloc(spad ? spad : 1);
    dnnl_memory_t ma, mb, mc, ms;
    CK(dnnl_memory_create(&ma, &a, eng, xb));
    CK(dnnl_memory_create(&mb, &b, eng, Wb));
    CK(dnnl_memory_create(&mc, &c, eng, y));
    CK(dnnl_memory_create(&ms, sd, eng, sp));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma},
                               {DNNL_ARG_WEIGHTS, mb},
                               {DNNL_ARG_DST, mc},
                               {DNNL_ARG_SCRATCHPAD, ms}};
    for (int pass = 0; pass < 2; pass++) {
        t0 = now();
        for (int r = 0; r < REPS; r++) {
#pragma omp parallel for
            for (int64_t i = 0; i < M * K; i++) xb[i] = to_bf16(x[i]);
            CK(dnnl_primitive_execute(prim, stream, 4, args));
            CK(dnnl_stream_wait(stream));
        }
        td = (now() - t0) / REPS;
    }
    const double fl = 2.0 * (double)M * (double)N * (double)K;
    printf("%s rows %-5lld out %-5lld in %-5lld  OpenBLAS %7.3f ms %6.1f GFLOP/s | oneDNN bf16 %7.3f ms %6.1f GFLOP/s "
           " %.2fx  scratchpad %zu B (%s)\n",
           nn ? "NN" : "NT", (long long)M, (long long)out, (long long)in, tb * 1e3, fl / tb * 1e-9, td * 1e3,
           fl / td * 1e-9, tb / td, spad, impl);
    dnnl_memory_destroy(ma), dnnl_memory_destroy(mb), dnnl_memory_destroy(mc), dnnl_memory_destroy(ms);
    dnnl_primitive_destroy(prim), dnnl_primitive_desc_destroy(pd), dnnl_primitive_attr_destroy(attr);
    free(x), free(W), free(y), free(xb), free(Wb), free(sp);
}

int main(int argc, char **argv) {
    const int64_t M = argc > 1 ? atoll(argv[1]) : 512;
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
    /* (out, in): q and o, k and v, gate and up, gate|up together, down */
    const int64_t shapes[5][2] = {{576, 576}, {192, 576}, {1536, 576}, {3072, 576}, {576, 1536}};
    for (int nn = 0; nn < 2; nn++)
        for (int i = 0; i < 5; i++) run(M, shapes[i][0], shapes[i][1], nn);
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}
