/* Lab probe: OpenBLAS's sgemm against oneDNN's f32 matmul at the SmolLM2-135M training step's
 * weight products, with each call's weight out of cache as in a step (48 distinct copies of each
 * weight, cycled), on the libraries' own OpenMP threads. For each shape and mode it times
 *   - OpenBLAS (cblas_sgemm, the path the CPU backend takes);
 *   - oneDNN on W as it lies (row-major (out, in): tag ba for x·Wᵀ, ab for dy·W);
 *   - oneDNN on W reordered once into the layout its matmul asks for (format_tag any): a second
 *     copy of every weight, as a backend keeping one would hold;
 * forward x·Wᵀ (NT) and input gradient dy·W (NN), y overwritten (beta 0) or accumulated (beta 1,
 * oneDNN's sum post-op). Not built by CMake; needs Debian's libdnnl-dev:
 *   gcc -O2 dev/cpu/06-onednn-matmul.c -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -ldnnl -o /tmp/onednn-matmul
 *   OMP_NUM_THREADS=2 /tmp/onednn-matmul [T=512]
 * Prints GFLOP/s per arm: the mean of 3 passes over the 48 copies after one untimed pass.
 * Measured on the 2-core Xeon VM (OpenBLAS 0.3.21 SkylakeX kernels, oneDNN 2.6.3 brgemm
 * avx512_core), T = 512, 2 threads:
 *   - NT: OpenBLAS 242-290, oneDNN as W lies 288-322, reordered 299-321; the 3072-wide gate|up
 *     product, half of the forward's FLOPs, 267 / 284 against 288 / 294 (beta 0 / 1);
 *   - NN: OpenBLAS 249-266, oneDNN as W lies 239-279 (slower on the two largest), reordered
 *     281-322.
 * In the training step (`bench train --seq 512 --profile`; a build calling oneDNN for x·Wᵀ over
 * >= 256 rows with W as it lies, alternated with that path switched off, two pairs) the forward's
 * products went 408 / 434 → 397 / 420 ms and the backward's 619 / 661 → 636 / 672 ms: no gain
 * over the step. Only the reordered copies gain on both sides, at the price of two more copies
 * of every weight (850 MB for SmolLM2-135M in f32); the CPU backend keeps OpenBLAS. */
#include <cblas.h>
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define COPIES 48

#define CK(x)                                                        \
    do {                                                             \
        dnnl_status_t st_ = (x);                                     \
        if (st_ != dnnl_success) {                                   \
            fprintf(stderr, "%s: oneDNN status %d\n", #x, (int)st_); \
            exit(1);                                                 \
        }                                                            \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static dnnl_engine_t eng;
static dnnl_stream_t stream;

/* A matmul primitive y (T, n) = x (T, k)·B (k, n) [+ y], B's layout given by tag (any: oneDNN's
 * choice, returned in *bmd). */
static dnnl_primitive_t matmul(int T, int k, int n, dnnl_format_tag_t btag, float beta, dnnl_memory_desc_t *xmd,
                               dnnl_memory_desc_t *bmd, dnnl_memory_desc_t *ymd) {
    dnnl_dims_t xd = {T, k}, bd = {k, n}, yd = {T, n};
    CK(dnnl_memory_desc_init_by_tag(xmd, 2, xd, dnnl_f32, dnnl_ab));
    CK(dnnl_memory_desc_init_by_tag(bmd, 2, bd, dnnl_f32, btag));
    CK(dnnl_memory_desc_init_by_tag(ymd, 2, yd, dnnl_f32, dnnl_ab));
    dnnl_primitive_attr_t attr;
    CK(dnnl_primitive_attr_create(&attr));
    if (beta != 0.0f) {
        dnnl_post_ops_t po;
        CK(dnnl_post_ops_create(&po));
        CK(dnnl_post_ops_append_sum(po, beta));
        CK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_matmul_desc_t md;
    CK(dnnl_matmul_desc_init(&md, xmd, bmd, NULL, ymd));
    dnnl_primitive_desc_t pd;
    CK(dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL));
    *bmd = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    return p;
}

static void run(dnnl_primitive_t p, dnnl_memory_t x, dnnl_memory_t b, dnnl_memory_t y) {
    dnnl_exec_arg_t a[3] = {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, y}};
    CK(dnnl_primitive_execute(p, stream, 3, a));
    CK(dnnl_stream_wait(stream));
}

/* One shape: W (out, in); NT: y (T, out) = x (T, in)·Wᵀ; NN: y (T, in) = x (T, out)·W. */
static void shape(int T, int out, int in, int nn, float beta, float *x, float *y) {
    const int k = nn ? out : in, n = nn ? in : out;
    float *w[COPIES];
    for (int c = 0; c < COPIES; c++) {
        w[c] = malloc(sizeof(float) * (size_t)out * (size_t)in);
        for (long i = 0; i < (long)out * in; i++) w[c][i] = 0.01f * (float)((i * 3 + c) % 11) - 0.05f;
    }
    dnnl_memory_desc_t xmd, bmd, ymd, bany;
    dnnl_primitive_t plain = matmul(T, k, n, nn ? dnnl_ab : dnnl_ba, beta, &xmd, &bmd, &ymd);
    dnnl_primitive_t packed = matmul(T, k, n, dnnl_format_tag_any, beta, &xmd, &bany, &ymd);
    dnnl_memory_t mx, my, mb[COPIES], mp[COPIES];
    CK(dnnl_memory_create(&mx, &xmd, eng, x));
    CK(dnnl_memory_create(&my, &ymd, eng, y));
    dnnl_primitive_desc_t rpd;
    dnnl_primitive_t reorder;
    CK(dnnl_reorder_primitive_desc_create(&rpd, &bmd, eng, &bany, eng, NULL));
    CK(dnnl_primitive_create(&reorder, rpd));
    for (int c = 0; c < COPIES; c++) {
        CK(dnnl_memory_create(&mb[c], &bmd, eng, w[c]));
        CK(dnnl_memory_create(&mp[c], &bany, eng, DNNL_MEMORY_ALLOCATE));
        dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, mb[c]}, {DNNL_ARG_TO, mp[c]}};
        CK(dnnl_primitive_execute(reorder, stream, 2, a));
    }
    CK(dnnl_stream_wait(stream));
    double t[3] = {0, 0, 0};
    for (int pass = 0; pass < 4; pass++)
        for (int arm = 0; arm < 3; arm++) {
            const double t0 = now();
            for (int c = 0; c < COPIES; c++) {
                if (arm == 0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, nn ? CblasNoTrans : CblasTrans, T, n, k, 1.0f, x, k, w[c],
                                in, beta, y, n);
                else run(arm == 1 ? plain : packed, mx, arm == 1 ? mb[c] : mp[c], my);
            }
            if (pass) t[arm] += now() - t0;
        }
    const double gf = 2.0 * T * n * k * COPIES * 3 / 1e9;
    printf("%s beta %.0f  out %5d in %5d: OpenBLAS %4.0f  oneDNN as W lies %4.0f  reordered %4.0f GFLOP/s\n",
           nn ? "NN" : "NT", beta, out, in, gf / t[0], gf / t[1], gf / t[2]);
    for (int c = 0; c < COPIES; c++) dnnl_memory_destroy(mb[c]), dnnl_memory_destroy(mp[c]), free(w[c]);
    dnnl_memory_destroy(mx), dnnl_memory_destroy(my);
    dnnl_primitive_destroy(plain), dnnl_primitive_destroy(packed), dnnl_primitive_destroy(reorder);
    dnnl_primitive_desc_destroy(rpd);
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 512;
    /* (out, in) of q|k|v, o, gate|up, down */
    static const int w[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
    float *x = malloc(sizeof(float) * (size_t)T * 4096), *y = calloc((size_t)T * 4096, sizeof(float));
    for (long i = 0; i < (long)T * 4096; i++) x[i] = 0.01f * (float)((i * 7) % 13) - 0.06f;
    printf("T = %d rows, %d copies of each weight\n", T, COPIES);
    for (int nn = 0; nn < 2; nn++)
        for (int b = 0; b < 2; b++)
            for (int s = 0; s < 4; s++) shape(T, w[s][0], w[s][1], nn, (float)b, x, y);
    free(x), free(y);
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}
