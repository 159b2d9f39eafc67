/* The recompute policy by layer kind on CUDA, on a tiny random Gemma 3 of eight layers (S S G S S
 * G S S, window 5, head dim 64, LoRA on the last seven): loss, per-token losses and every LoRA
 * gradient of recompute sliding, sliding:2, global and global:2 against the CPU without recompute
 * (bf16 tolerances), bit-identical on the device with and without offloaded checkpoints and, with
 * segments of one layer, with kept attention, attention rerun everywhere or in one or two of the
 * recomputed layers (recompute_attention_layers); the CUDA size table equals what the device
 * allocator holds and a step allocates nothing. Without a CUDA build or device it prints
 * "skipped: no CUDA device" and exits 77. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "helpers/tiny_model.h"
#include "helpers/train_data.h"
#include "longtune/alloc.h"
#include "longtune/model.h"
#include "longtune/plan.h"

#if LT_HAVE_CUDA

/* As tests/e2e/test_cuda_gemma.c: the CUDA step reads matmul and attention inputs in bf16 (unit
 * roundoff u = 2^-8); the loss carries a few u, gradients up to 32 u of the largest one. */
#define BF16_U 0x1.0p-8
#define TOL_LOSS (8 * BF16_U)
#define TOL_GRAD (32 * BF16_U)

static uint64_t rng;
static char dir[256];
static const lt_test_tiny tiny = {128, 128, 256, 8, 2, 1, 64, 1, LT_DTYPE_F32};
#define LORA_LAYERS 7

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    snprintf(dir, sizeof dir, "/tmp/lt_test_cuda_recompute_kind_%ld", (long)getpid());
    lt_test_tiny_write_gemma3(&tiny, 5, 3, dir, &rng);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    lt_test_rm_model_dir(dir);
    return 0;
}

static lt_lora_options lora(void) {
    lt_lora_options lo = {0};
    lo.rank = 8, lo.alpha = 16, lo.seed = 3, lo.num_layers = LORA_LAYERS;
    return lo;
}

/* The model on dev with LoRA values p (n of them). */
static lt_model *load(lt_ctx *ctx, lt_device dev, const float *p, int64_t n) {
    lt_lora_options lo = lora();
    lt_model_options mo = {.device = dev};
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, dir, &mo, &lo, &m);
    if (s != LT_OK) fprintf(stderr, "load: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    int64_t k = 0;
    (void)lt_model_lora_params(m, &k);
    assert_int_equal(k, n);
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, p), LT_OK);
    return m;
}

enum { B = 2, T = 48, N = B * T, S = 2 };

typedef struct batch {
    int32_t tokens[N], targets[N], positions[N], offsets[B * (S + 1)];
} batch;

static lt_model_batch make_batch(batch *b) {
    const int32_t cuts[B][S + 1] = {{0, 20, 48}, {0, 33, 48}};
    for (int r = 0; r < B; r++)
        for (int q = 0; q <= S; q++) b->offsets[r * (S + 1) + q] = cuts[r][q];
    for (int r = 0; r < B; r++)
        for (int q = 0; q < S; q++)
            for (int32_t i = cuts[r][q]; i < cuts[r][q + 1]; i++) {
                int k = r * T + i;
                b->tokens[k] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)tiny.V);
                b->positions[k] = i - cuts[r][q];
                b->targets[k] =
                    i + 1 == cuts[r][q + 1] ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)tiny.V);
            }
    lt_model_batch mb = {0};
    mb.B = B, mb.T = T, mb.S = S, mb.step = 1;
    mb.tokens = b->tokens, mb.targets = b->targets, mb.positions = b->positions, mb.seq_offsets = b->offsets;
    return mb;
}

/* One step under ro: mean loss, token losses, gradients (host copies). */
static void step(lt_ctx *ctx, lt_model *m, const lt_model_batch *mb, const lt_model_run_options *ro, double *loss,
                 float *tl, float *g, int64_t n) {
    lt_status s = lt_model_prepare(ctx, m, ro);
    if (s != LT_OK) fprintf(stderr, "prepare: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    for (int i = 0; i < N; i++) tl[i] = LT_TEST_POISON;
    lt_model_zero_grads(m);
    lt_model_result r;
    s = lt_model_forward_backward(ctx, m, mb, 0.0f, &r, tl);
    if (s != LT_OK) fprintf(stderr, "step: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    *loss = r.loss_sum / (double)r.n_tokens;
    assert_int_equal(lt_model_lora_get(ctx, m, 1, 0, n, g), LT_OK);
}

/* Largest |got - want| over the largest |want|; fails above tol. */
static double compare(const char *what, const float *got, const float *want, int64_t n, double tol) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e;
    }
    double rel = worst / (scale > 0 ? scale : 1);
    if (!(rel <= tol)) {
        fprintf(stderr, "%s: error %.3g of the largest magnitude %.3g > %.3g\n", what, rel, scale, tol);
        fail();
    }
    return rel;
}

typedef struct policy {
    lt_recompute r;
    int64_t k;
} policy;

static const policy POLICIES[] = {{LT_RECOMPUTE_SLIDING, 0},
                                  {LT_RECOMPUTE_SLIDING, 2},
                                  {LT_RECOMPUTE_GLOBAL, 0},
                                  {LT_RECOMPUTE_GLOBAL, 2}};
#define N_POL (sizeof POLICIES / sizeof POLICIES[0])

/* Variant v of a run: 0-3 kept or rerun attention (bit 0) with or without offloaded checkpoints
 * (bit 1); 4 and 5 attention rerun in one or two of the recomputed layers. */
enum { N_VARIANTS = 6 };
static void variant(int v, lt_model_run_options *ro) {
    ro->recompute_attention = v < 4 ? v & 1 : 0;
    ro->offload_ckpt = v < 4 ? (v >> 1) & 1 : 0;
    ro->recompute_attention_layers = v >= 4 ? v - 3 : 0;
}

static void matches_cpu_and_itself(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_lora_options lo = lora();
    lt_model *mc = NULL;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &mc), LT_OK);
    int64_t n = 0;
    float *p = lt_model_lora_params(mc, &n);
    lt_test_fill_normal(&rng, p, n, 0.1f); /* B != 0 so every gradient is live */
    lt_model *mg = load(ctx, LT_DEVICE_CUDA, p, n);
    batch b;
    lt_model_batch mb = make_batch(&b);
    float *gc = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *g1 = malloc((size_t)n * 4);
    assert_true(gc && g && g1);
    float tlc[N], tl[N], tl1[N];
    double lc, l, l1 = 0;
    lt_model_run_options ro = {0};
    ro.B = B, ro.T = T, ro.recompute = LT_RECOMPUTE_NONE, ro.saved_bf16 = -1;
    step(ctx, mc, &mb, &ro, &lc, tlc, gc, n);
    for (size_t pi = 0; pi < N_POL; pi++) {
        char name[32], what[256];
        lt_plan_recompute_name(POLICIES[pi].r, POLICIES[pi].k, name, sizeof name);
        for (int v = 0; v < N_VARIANTS; v++) {
            lt_model_run_options rg = {0};
            rg.B = B, rg.T = T, rg.device = LT_DEVICE_CUDA;
            rg.recompute = POLICIES[pi].r, rg.recompute_k = POLICIES[pi].k;
            variant(v, &rg);
            step(ctx, mg, &mb, &rg, &l, tl, g, n);
            float lf = (float)l, lcf = (float)lc;
            snprintf(what, sizeof what, "recompute %s (variant %d) loss", name, v);
            double el = compare(what, &lf, &lcf, 1, TOL_LOSS);
            snprintf(what, sizeof what, "recompute %s (variant %d) token losses", name, v);
            compare(what, tl, tlc, N, TOL_LOSS);
            snprintf(what, sizeof what, "recompute %s (variant %d) gradients", name, v);
            double eg = compare(what, g, gc, n, TOL_GRAD);
            fprintf(stderr, "  recompute %s variant %d: loss rel %.2e, gradients rel %.2e\n", name, v, el, eg);
            if (v == 0) {
                l1 = l;
                memcpy(tl1, tl, sizeof tl);
                memcpy(g1, g, (size_t)n * 4);
            } else if (v == 2 || ((v == 1 || v >= 4) && POLICIES[pi].k <= 1)) {
                /* offload moves the same bytes; segments of one layer start from the rounded
                 * checkpoint in the forward too, so the kept attention is the rerun's */
                assert_true(l == l1);
                assert_memory_equal(tl, tl1, sizeof tl);
                assert_memory_equal(g, g1, (size_t)n * 4);
            }
        }
    }
    free(gc), free(g), free(g1);
    lt_model_free(ctx, mg);
    lt_model_free(ctx, mc);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* The CUDA plan of each by-kind policy is the device's allocation byte for byte, and a step
 * allocates nothing on the device. */
static void size_table_equals_device_allocations(void **state) {
    (void)state;
    for (size_t pi = 0; pi < N_POL; pi++)
        for (int v = 0; v < N_VARIANTS; v++) {
            lt_ctx *ctx = lt_ctx_new();
            lt_lora_options lo = lora();
            lt_model_options mo = {.device = LT_DEVICE_CUDA};
            lt_model_config cfg;
            assert_int_equal(lt_model_inspect(ctx, dir, &mo, &cfg), LT_OK);
            lt_model_run_options ro = {0};
            ro.B = B, ro.T = T, ro.device = LT_DEVICE_CUDA;
            ro.recompute = POLICIES[pi].r, ro.recompute_k = POLICIES[pi].k;
            variant(v, &ro);
            lt_model_sizes want;
            assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
            lt_model *m = NULL;
            assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &m), LT_OK);
            assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
            lt_model_sizes got = lt_model_get_sizes(m);
            for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
            assert_int_equal(got.offload_bytes, want.offload_bytes);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, want.total);
            lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
            batch b;
            lt_model_batch mb = make_batch(&b);
            lt_model_result r;
            assert_int_equal(lt_model_forward_backward(ctx, m, &mb, 0.0f, &r, NULL), LT_OK);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes, want.total);
            lt_model_free(ctx, m);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
            lt_ctx_free(ctx);
        }
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matches_cpu_and_itself),
        cmocka_unit_test(size_table_equals_device_allocations),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#else
int main(void) { return lt_test_cuda_skip(); }
#endif
