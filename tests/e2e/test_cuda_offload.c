/* Checkpoint offload on CUDA: a tiny random Qwen3 (bf16, per-head q/k norm, head dim 64) with six
 * LoRA layers over a frozen one, trained with and without lt_model_run_options.offload_ckpt. The
 * checkpoints then travel to page-locked host memory on a copy stream and back while layers
 * compute; loss, per-token losses and every LoRA gradient must be bit-identical to the run that
 * keeps them on the device, over consecutive steps, under recompute all and every:2, with row
 * chunks and the attention kept or rerun. The plan equals the device high-water byte for byte and
 * its host side equals the pinned high-water; a whole lt_train_fit run with offload_checkpoints ends
 * at the very parameters of the run without, and its plan is its device high-water. Without a CUDA build or device it prints "skipped:
 * no CUDA device" and exits 77. */
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
#include "longtune/plan.h"
#include "longtune/train.h"

#if LT_HAVE_CUDA

static uint64_t rng;
static char dir[256];
static const lt_test_tiny tiny = {160, 128, 256, 7, 2, 1, 64, 1, LT_DTYPE_BF16};
#define LORA_LAYERS 6

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    snprintf(dir, sizeof dir, "/tmp/lt_test_cuda_offload_%ld", (long)getpid());
    lt_test_tiny_write(&tiny, dir, &rng);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    lt_test_rm_model_dir(dir);
    return 0;
}

static lt_model *load(lt_ctx *ctx) {
    lt_lora_options lo = {0};
    lo.rank = 8, lo.alpha = 16, lo.seed = 3, lo.num_layers = LORA_LAYERS;
    lt_model_options mo = {.device = LT_DEVICE_CUDA};
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, dir, &mo, &lo, &m);
    if (s != LT_OK) fprintf(stderr, "load: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    return m;
}

enum { B = 2, T = 96, N = B * T, S = 3 };

typedef struct batch {
    int32_t tokens[N], targets[N], positions[N], offsets[B * (S + 1)];
} batch;

static lt_model_batch make_batch(batch *b, uint64_t step) {
    const int32_t cuts[B][S + 1] = {{0, 40, 71, 96}, {0, 30, 80, 96}};
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
    mb.B = B, mb.T = T, mb.S = S, mb.step = step;
    mb.tokens = b->tokens, mb.targets = b->targets, mb.positions = b->positions, mb.seq_offsets = b->offsets;
    return mb;
}

static void step(lt_ctx *ctx, lt_model *m, const lt_model_batch *mb, double *loss, float *tl, float *g, int64_t n) {
    lt_model_result r;
    for (int i = 0; i < N; i++) tl[i] = LT_TEST_POISON;
    lt_model_zero_grads(m);
    lt_status s = lt_model_forward_backward(ctx, m, mb, 0.0f, &r, tl);
    if (s != LT_OK) fprintf(stderr, "step: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    *loss = r.loss_sum;
    assert_int_equal(lt_model_lora_get(ctx, m, 1, 0, n, g), LT_OK);
}

static lt_model_run_options variant(int v) {
    lt_model_run_options ro = {0};
    ro.B = B, ro.T = T;
    ro.recompute = v & 1 ? LT_RECOMPUTE_EVERY_K : LT_RECOMPUTE_EVERY, ro.recompute_k = 2;
    ro.chunk_rows = v & 2 ? 40 : 0;
    ro.recompute_attention = (v >> 2) & 1;
    return ro;
}

static void bit_identical_on_cuda(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load(ctx);
    int64_t n = 0;
    (void)lt_model_lora_params(m, &n);
    float *p = malloc((size_t)n * 4);
    assert_non_null(p);
    lt_test_fill_normal(&rng, p, n, 0.05f); /* B != 0 so every gradient is live */
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, p), LT_OK);
    batch b1, b2;
    lt_model_batch mb1 = make_batch(&b1, 1), mb2 = make_batch(&b2, 2);
    float *g0 = malloc((size_t)n * 4), *g1 = malloc((size_t)n * 4), *h0 = malloc((size_t)n * 4),
          *h1 = malloc((size_t)n * 4);
    assert_true(g0 && g1 && h0 && h1);
    static float tl0[N], tl1[N], tm0[N], tm1[N];
    for (int v = 0; v < 8; v++) {
        lt_model_run_options ro = variant(v);
        double l0, l1, k0, k1;
        assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
        step(ctx, m, &mb1, &l0, tl0, g0, n);
        step(ctx, m, &mb2, &k0, tm0, h0, n);
        ro.offload_ckpt = 1;
        assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
        size_t pinned = lt_mem_get_pinned_stats(ctx).used_bytes;
        assert_true(pinned > 0);
        step(ctx, m, &mb1, &l1, tl1, g1, n);
        step(ctx, m, &mb2, &k1, tm1, h1, n);
        fprintf(stderr, "  variant %d (%s, chunks %lld, recompute attention %d): loss %.6f / %.6f, %zu bytes pinned\n",
                v, v & 1 ? "every:2" : "all", (long long)ro.chunk_rows, ro.recompute_attention, l0, l1, pinned);
        assert_memory_equal(&l0, &l1, sizeof l0);
        assert_memory_equal(&k0, &k1, sizeof k0);
        assert_memory_equal(tl0, tl1, sizeof tl0);
        assert_memory_equal(tm0, tm1, sizeof tm0);
        assert_memory_equal(g0, g1, (size_t)n * 4);
        assert_memory_equal(h0, h1, (size_t)n * 4);
    }
    free(p), free(g0), free(g1), free(h0), free(h1);
    lt_model_free(ctx, m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    assert_int_equal(lt_mem_get_pinned_stats(ctx).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* The plan with offload: device classes = the device high-water, host side = the pinned one. */
static void plan_equals_high_waters(void **state) {
    (void)state;
    for (int v = 0; v < 8; v += 5) {
        lt_ctx *ctx = lt_ctx_new();
        lt_model *m = load(ctx);
        lt_model_run_options ro = variant(v);
        ro.offload_ckpt = 1;
        assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
        batch b;
        lt_model_batch mb = make_batch(&b, 1);
        lt_model_result r;
        assert_int_equal(lt_model_forward_backward(ctx, m, &mb, 0.0f, &r, NULL), LT_OK);
        lt_plan_options po = {0};
        po.device = LT_DEVICE_CUDA, po.lora = *lt_model_get_lora(m), po.run = ro;
        lt_plan p;
        assert_int_equal(lt_plan_compute(ctx, lt_model_get_config(m), &po, &p), LT_OK);
        size_t measured = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes;
        size_t planned = p.peak_bytes - p.bytes[LT_PLAN_OPTIMIZER]; /* no trainer here */
        size_t pinned = lt_mem_get_pinned_stats(ctx).peak_bytes;
        fprintf(stderr, "  variant %d: device plan %zu measured %zu; host plan %zu pinned %zu\n", v, planned, measured,
                p.offload_bytes, pinned);
        assert_int_equal(planned, measured);
        assert_int_equal(p.offload_bytes, pinned);
        lt_model_free(ctx, m);
        lt_ctx_free(ctx);
    }
}

/* lt_train_fit with and without offload_checkpoints (options, trainer, model): the same final
 * adapter bit for bit, plan == device high-water in both. */
static void training_run_is_identical(void **state) {
    (void)state;
    uint64_t ds = 23;
    lt_test_dataset train, valid;
    lt_test_dataset_make(&train, 32, tiny.V, 8, 24, &ds);
    lt_test_dataset_make(&valid, 8, tiny.V, 8, 24, &ds);
    float *final[2] = {NULL, NULL};
    int64_t n = 0;
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    for (int off = 0; off < 2; off++) {
        char adir[300];
        snprintf(adir, sizeof adir, "%s_run%d", dir, off);
        lt_train_options in, o;
        memset(&in, 0, sizeof in);
        snprintf(in.model, sizeof in.model, "%s", dir);
        snprintf(in.data, sizeof in.data, "(in memory)");
        snprintf(in.adapter_path, sizeof in.adapter_path, "%s", adir);
        in.iters = 4, in.batch_size = 2, in.max_seq_length = 128, in.learning_rate = 5e-3;
        in.lora_rank = 4, in.lora_alpha = 8, in.num_layers = LORA_LAYERS, in.steps_per_eval = 2, in.save_every = 100;
        in.val_batches = -1, in.seed = 5, in.device = LT_DEVICE_CUDA, in.recompute = LT_RECOMPUTE_EVERY;
        in.offload_checkpoints = off;
        lt_ctx *ctx = lt_ctx_new();
        assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
        lt_lora_options lora;
        assert_int_equal(lt_train_lora_options(ctx, &o, &lora), LT_OK);
        lt_model_options mo = {.device = LT_DEVICE_CUDA};
        lt_model *m = NULL;
        assert_int_equal(lt_model_load(ctx, dir, &mo, &lora, &m), LT_OK);
        lt_train_result res;
        memset(&res, 0, sizeof res);
        lt_status s = lt_train_fit(ctx, &o, m, &train.in, &valid.in, devnull, &res);
        if (s != LT_OK) fprintf(stderr, "fit (offload %d): %s\n", off, lt_ctx_error(ctx));
        assert_int_equal(s, LT_OK);
        (void)lt_model_lora_params(m, &n);
        final[off] = malloc((size_t)n * 4);
        assert_int_equal(lt_model_lora_get(ctx, m, 0, 0, n, final[off]), LT_OK);
        fprintf(stderr, "  fit offload %d: val %.5f -> %.5f, device peak %zu plan %zu\n", off, res.first_val_loss,
                res.last_val_loss, res.peak_bytes, res.plan_bytes);
        assert_int_equal(res.plan_bytes, res.peak_bytes);
        lt_model_free(ctx, m);
        lt_ctx_free(ctx);
        lt_test_rm_adapter_dir(adir);
    }
    assert_memory_equal(final[0], final[1], (size_t)n * 4);
    free(final[0]), free(final[1]);
    fclose(devnull);
    lt_test_dataset_free(&train);
    lt_test_dataset_free(&valid);
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bit_identical_on_cuda),
        cmocka_unit_test(plan_equals_high_waters),
        cmocka_unit_test(training_run_is_identical),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#else

int main(void) { return lt_test_cuda_skip(); }

#endif
