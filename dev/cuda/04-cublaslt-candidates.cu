/* cuBLASLt's heuristic candidates for the GEMM shapes of a Qwen3-8B training step at 8k tokens and
 * of the fused loss's tiles: for each shape, up to 16 algorithms cuBLASLtMatmulAlgoGetHeuristic
 * offers (4 MiB of workspace, as the library gives it), each timed with CUDA events (median of 15
 * after 3 warmups) and printed with its tile and stage ids; then the fastest against the first,
 * which is the one the library runs. Shapes are column-major cuBLAS terms of the row-major
 * products: forward y = x·Wᵀ is TN (m = out, n = tokens, k = in), input gradient dx = dy·W is NN
 * (m = in, n = tokens, k = out). Operands are constant bf16 (0x3c3c): the ranking, not the
 * absolute rate, is what this measures. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CHECK(x)                                                                     \
    do {                                                                             \
        long e_ = (long)(x);                                                         \
        if (e_) {                                                                    \
            fprintf(stderr, "%s:%d: %s failed (%ld)\n", __FILE__, __LINE__, #x, e_); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

struct shape {
    const char *name;
    int ta; /* A transposed */
    long m, n, k;
    int c_bf16; /* C and D in bf16 (else fp32) */
    float beta;
};

int main() {
    cublasLtHandle_t lt;
    CHECK(cublasLtCreate(&lt));
    const size_t wsb = 4u << 20, big = (size_t)1 << 31;
    void *ws, *A, *B, *Cm;
    CHECK(cudaMalloc(&ws, wsb));
    CHECK(cudaMalloc(&A, big));
    CHECK(cudaMalloc(&B, big));
    CHECK(cudaMalloc(&Cm, big));
    CHECK(cudaMemset(A, 0x3c, big));
    CHECK(cudaMemset(B, 0x3c, big));
    CHECK(cudaMemset(Cm, 0, big));
    const shape shapes[] = {
        {"loss GEMM 1 TN 16384x1024x4096 bf16", 1, 16384, 1024, 4096, 1, 0.f},
        {"loss GEMM 2 NN 4096x1024x16384 f32 beta 1", 0, 4096, 1024, 16384, 0, 1.f},
        {"q fwd TN 4096x8192x4096", 1, 4096, 8192, 4096, 0, 0.f},
        {"k fwd TN 1024x8192x4096", 1, 1024, 8192, 4096, 0, 0.f},
        {"o fwd TN 4096x8192x4096 beta 1", 1, 4096, 8192, 4096, 0, 1.f},
        {"gate fwd TN 12288x8192x4096", 1, 12288, 8192, 4096, 0, 0.f},
        {"down fwd TN 4096x8192x12288 beta 1", 1, 4096, 8192, 12288, 0, 1.f},
        {"q bwd NN 4096x8192x4096", 0, 4096, 8192, 4096, 0, 0.f},
        {"k bwd NN 4096x8192x1024 beta 1", 0, 4096, 8192, 1024, 0, 1.f},
        {"gate bwd NN 4096x8192x12288", 0, 4096, 8192, 12288, 0, 0.f},
        {"down bwd NN 12288x8192x4096", 0, 12288, 8192, 4096, 0, 0.f},
    };
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (const shape &s : shapes) {
        cublasLtMatmulDesc_t op;
        CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
        CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        cublasLtMatrixLayout_t ad, bd, cd;
        CHECK(cublasLtMatrixLayoutCreate(&ad, CUDA_R_16BF, s.ta ? s.k : s.m, s.ta ? s.m : s.k, s.ta ? s.k : s.m));
        CHECK(cublasLtMatrixLayoutCreate(&bd, CUDA_R_16BF, s.k, s.n, s.k));
        CHECK(cublasLtMatrixLayoutCreate(&cd, s.c_bf16 ? CUDA_R_16BF : CUDA_R_32F, s.m, s.n, s.m));
        cublasLtMatmulPreference_t pref;
        CHECK(cublasLtMatmulPreferenceCreate(&pref));
        CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        cublasLtMatmulHeuristicResult_t res[16];
        int nres = 0;
        CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, ad, bd, cd, cd, pref, 16, res, &nres));
        const double flop = 2.0 * s.m * s.n * s.k;
        const float alpha = 1.f;
        printf("%s: %d candidates\n", s.name, nres);
        double best = 1e30, first = 0;
        int bi = -1;
        for (int i = 0; i < nres; i++) {
            for (int w = 0; w < 3; w++)
                cublasLtMatmul(lt, op, &alpha, A, ad, B, bd, &s.beta, Cm, cd, Cm, cd, &res[i].algo, ws, wsb, st);
            std::vector<float> t;
            for (int r = 0; r < 15; r++) {
                CHECK(cudaEventRecord(e0, st));
                cublasStatus_t rc =
                    cublasLtMatmul(lt, op, &alpha, A, ad, B, bd, &s.beta, Cm, cd, Cm, cd, &res[i].algo, ws, wsb, st);
                CHECK(cudaEventRecord(e1, st));
                CHECK(cudaEventSynchronize(e1));
                if (rc != CUBLAS_STATUS_SUCCESS) {
                    t.clear();
                    break;
                }
                float ms;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms);
            }
            if (t.empty()) {
                printf("  #%2d failed\n", i);
                continue;
            }
            std::sort(t.begin(), t.end());
            const double med = t[t.size() / 2];
            if (i == 0) first = med;
            if (med < best) best = med, bi = i;
            int tile = 0, stages = 0;
            size_t got;
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &got);
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages,
                                                 &got);
            printf("  #%2d %.4f ms %.0f TFLOP/s tile %d stages %d\n", i, med, flop / med / 1e9, tile, stages);
        }
        printf("  fastest #%d %.4f ms against #0 %.4f ms: %.3fx\n", bi, best, first, first / best);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(ad);
        cublasLtMatrixLayoutDestroy(bd);
        cublasLtMatrixLayoutDestroy(cd);
        cublasLtMatmulDescDestroy(op);
    }
    return 0;
}
