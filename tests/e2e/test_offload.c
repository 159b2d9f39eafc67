/* Checkpoint offload (lt_model_run_options.offload_ckpt) on the CPU reference, which runs the very
 * schedule of the device (two slots, copies out in the forward, prefetches in the backward) between
 * host blocks: loss, per-token losses and every LoRA gradient are bit-identical with and without
 * offload under recompute all and every:K, f32 and bf16 checkpoints, row chunks, kept or rerun
 * attention, a frozen layer below the LoRA ones, and over consecutive steps; the size table equals
 * the allocations; the CUDA plan (pure, no device needed) moves exactly n_ckpt - 2 checkpoints from
 * the device to the host; misuse and every allocation failure are clean. The device run itself is
 * tests/e2e/test_cuda_offload.c. */
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
#include "backend/backend.h"
#include "longtune/alloc.h"
#include "longtune/plan.h"
#include "longtune/train.h"

static uint64_t rng;
static char dir[256];
/* Seven layers, LoRA on the last six: resid checkpoints 6 (4 offloaded), every:2 -> 3 (1). */
static const lt_test_tiny tiny = {96, 64, 128, 7, 2, 1, 32, 1, LT_DTYPE_F32};
#define LORA_LAYERS 6

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    snprintf(dir, sizeof dir, "/tmp/lt_test_offload_%ld", (long)getpid());
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
    lo.rank = 4, lo.alpha = 8, lo.seed = 3, lo.num_layers = LORA_LAYERS;
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, dir, NULL, &lo, &m);
    if (s != LT_OK) fprintf(stderr, "load: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    return m;
}

enum { B = 2, T = 24, N = B * T, S = 2 };

typedef struct batch {
    int32_t tokens[N], targets[N], positions[N], offsets[B * (S + 1)];
} batch;

static lt_model_batch make_batch(batch *b, uint64_t step) {
    const int32_t cuts[B][S + 1] = {{0, 10, 24}, {0, 17, 24}};
    for (int r = 0; r < B; r++)
        for (int q = 0; q < S; q++) {
            b->offsets[r * (S + 1) + q] = cuts[r][q];
            b->offsets[r * (S + 1) + q + 1] = cuts[r][q + 1];
            for (int32_t i = cuts[r][q]; i < cuts[r][q + 1]; i++) {
                int k = r * T + i;
                b->tokens[k] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)tiny.V);
                b->positions[k] = i - cuts[r][q];
                b->targets[k] =
                    i + 1 == cuts[r][q + 1] ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)tiny.V);
            }
        }
    lt_model_batch mb = {0};
    mb.B = B, mb.T = T, mb.S = S, mb.step = step;
    mb.tokens = b->tokens, mb.targets = b->targets, mb.positions = b->positions, mb.seq_offsets = b->offsets;
    return mb;
}

/* One step's results: loss, token losses, gradients. */
static void step(lt_ctx *ctx, lt_model *m, const lt_model_batch *mb, double *loss, float *tl, float *g, int64_t n) {
    lt_model_result r;
    for (int i = 0; i < N; i++) tl[i] = LT_TEST_POISON;
    lt_model_zero_grads(m);
    lt_status s = lt_model_forward_backward(ctx, m, mb, 0.0f, &r, tl);
    if (s != LT_OK) fprintf(stderr, "step: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    *loss = r.loss_sum;
    memcpy(g, lt_model_lora_grads(m, NULL), (size_t)n * 4);
}

static void bit_identical_on_cpu(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load(ctx);
    int64_t n = 0;
    float *p = lt_model_lora_params(m, &n);
    lt_test_fill_normal(&rng, p, n, 0.1f); /* B != 0 so every gradient is live */
    batch b1, b2;
    lt_model_batch mb1 = make_batch(&b1, 1), mb2 = make_batch(&b2, 2);
    float *g0 = malloc((size_t)n * 4), *g1 = malloc((size_t)n * 4), *h0 = malloc((size_t)n * 4),
          *h1 = malloc((size_t)n * 4);
    assert_true(g0 && g1 && h0 && h1);
    float tl0[N], tl1[N], tm0[N], tm1[N];
    /* policy (all, every:2) x saved dtype x (one chunk and kept attention, or 7-row chunks and
     * the attention rerun) */
    for (int v = 0; v < 8; v++) {
        lt_model_run_options ro = {0};
        ro.B = B, ro.T = T;
        ro.recompute = v & 1 ? LT_RECOMPUTE_EVERY_K : LT_RECOMPUTE_EVERY, ro.recompute_k = 2;
        ro.saved_bf16 = v & 2 ? 1 : -1;
        ro.chunk_rows = v & 4 ? 7 : 0;
        ro.recompute_attention = (v >> 2) & 1;
        double l0, l1, k0, k1;
        assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
        step(ctx, m, &mb1, &l0, tl0, g0, n);
        step(ctx, m, &mb2, &k0, tm0, h0, n);
        ro.offload_ckpt = 1;
        assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
        lt_model_sizes ms = lt_model_get_sizes(m);
        assert_true(ms.offload_bytes > 0);
        /* two steps in a row: the slots' tenants from the first must not leak into the second */
        step(ctx, m, &mb1, &l1, tl1, g1, n);
        step(ctx, m, &mb2, &k1, tm1, h1, n);
        fprintf(stderr, "  variant %2d (%s, %s, chunks %lld, recompute attention %d): loss %.6f, offloaded %zu bytes\n",
                v, v & 1 ? "every:2" : "all", v & 2 ? "bf16" : "f32", (long long)ro.chunk_rows, ro.recompute_attention,
                l0 / 40, ms.offload_bytes);
        assert_memory_equal(&l0, &l1, sizeof l0);
        assert_memory_equal(&k0, &k1, sizeof k0);
        assert_memory_equal(tl0, tl1, sizeof tl0);
        assert_memory_equal(tm0, tm1, sizeof tm0);
        assert_memory_equal(g0, g1, (size_t)n * 4);
        assert_memory_equal(h0, h1, (size_t)n * 4);
    }
    free(g0), free(g1), free(h0), free(h1);
    lt_model_free(ctx, m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* The size table with offload equals what prepare allocates, host high-water included. */
static void size_table_equals_allocations(void **state) {
    (void)state;
    for (int v = 0; v < 2; v++) {
        lt_ctx *ctx = lt_ctx_new();
        lt_model *m = load(ctx);
        lt_model_run_options ro = {0};
        ro.B = B, ro.T = T, ro.offload_ckpt = 1;
        ro.recompute = v ? LT_RECOMPUTE_EVERY_K : LT_RECOMPUTE_EVERY, ro.recompute_k = 2, ro.saved_bf16 = 1;
        size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
        assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
        size_t after = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
        lt_model_sizes got = lt_model_get_sizes(m), want;
        ro.device = LT_DEVICE_CPU;
        assert_int_equal(lt_model_size_table(ctx, lt_model_get_config(m), lt_model_get_lora(m), &ro, &want), LT_OK);
        assert_memory_equal(got.bytes, want.bytes, sizeof got.bytes);
        assert_int_equal(got.total, want.total);
        assert_int_equal(got.offload_bytes, want.offload_bytes);
        /* the checkpoints that leave the slots: n_ckpt - 2 of (N, C) bf16 */
        int64_t n_ckpt = v ? (LORA_LAYERS + 1) / 2 : LORA_LAYERS;
        assert_int_equal(want.offload_bytes,
                         lt_alloc_accounted_size(LT_DEVICE_CPU,
                                                 (size_t)(n_ckpt - 2) *
                                                     (((size_t)N * (size_t)tiny.C * 2 + 63) / 64 * 64)));
        size_t run = 0;
        for (int c = LT_MEM_ACTIVATIONS; c < LT_MEM_CLASS_COUNT_; c++) run += want.bytes[c];
        assert_int_equal(after - before, run); /* the CPU's copy queue allocates nothing */
        /* the plan says the same, offload inside the activations class and the peak on the CPU */
        lt_plan_options po = {0};
        po.device = LT_DEVICE_CPU, po.lora = *lt_model_get_lora(m), po.run = ro;
        lt_plan pl;
        assert_int_equal(lt_plan_compute(ctx, lt_model_get_config(m), &po, &pl), LT_OK);
        assert_int_equal(pl.offload_bytes, want.offload_bytes);
        assert_int_equal(pl.bytes[LT_PLAN_ACTIVATIONS], want.bytes[LT_MEM_ACTIVATIONS]);
        char js[2048];
        assert_int_equal(lt_plan_to_json(ctx, &pl, js, sizeof js), LT_OK);
        assert_non_null(strstr(js, "\"offload_checkpoints\": true"));
        lt_model_free(ctx, m);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        lt_ctx_free(ctx);
    }
}

/* The planner's CUDA numbers at the Qwen3-8B shape: offload moves exactly n_ckpt - 2 checkpoints
 * (36 layers, T tokens of C = 4096 bf16 each) off the device, to the host. */
static void cuda_plan_moves_checkpoints(void **state) {
    (void)state;
    if (!lt_backend_get(LT_DEVICE_CUDA)) {
        fprintf(stderr, "  (this build has no CUDA backend: the CUDA plan is not computed)\n");
        return;
    }
    lt_model_config c = {0};
    c.arch = LT_ARCH_QWEN3, c.V = 151936, c.C = 4096, c.F = 12288, c.L = 36, c.H = 32, c.Hkv = 8, c.D = 128;
    c.rope_theta = 1e6, c.rms_eps = 1e-6f, c.qk_norm = 1, c.bos_id = c.eos_id = -1;
    for (int p = 0; p < LT_PROJ_COUNT_; p++) c.proj_dtype[p] = LT_DTYPE_BF16;
    c.embed_dtype = c.head_dtype = LT_DTYPE_BF16;
    lt_ctx *ctx = lt_ctx_new();
    const int64_t Ts[3] = {32768, 262144, 400000};
    for (int i = 0; i < 3; i++) {
        lt_plan_options po = {0};
        po.device = LT_DEVICE_CUDA, po.lora.rank = 8;
        po.run.B = 1, po.run.T = Ts[i], po.run.recompute = LT_RECOMPUTE_EVERY, po.run.recompute_attention = 1;
        lt_plan off, on;
        assert_int_equal(lt_plan_compute(ctx, &c, &po, &off), LT_OK);
        po.run.offload_ckpt = 1;
        assert_int_equal(lt_plan_compute(ctx, &c, &po, &on), LT_OK);
        size_t ck = (size_t)Ts[i] * 4096 * 2, stride = (ck + 255) / 256 * 256;
        assert_int_equal(off.offload_bytes, 0);
        assert_int_equal(on.offload_bytes, lt_alloc_accounted_size(LT_DEVICE_CPU, 34 * stride));
        assert_int_equal(off.bytes[LT_PLAN_ACTIVATIONS] - on.bytes[LT_PLAN_ACTIVATIONS], 34 * stride);
        assert_int_equal(off.peak_bytes - on.peak_bytes, 34 * stride);
        fprintf(stderr, "  qwen3-8b T=%lld: device %.2f -> %.2f GiB, host %.2f GiB\n", (long long)Ts[i],
                (double)off.peak_bytes / 1073741824.0, (double)on.peak_bytes / 1073741824.0,
                (double)on.offload_bytes / 1073741824.0);
    }
    /* the search honours a host budget: with 64 GiB of host the answer is host-bound */
    lt_plan_options po = {0};
    po.device = LT_DEVICE_CUDA, po.lora.rank = 8;
    po.run.B = 1, po.run.recompute = LT_RECOMPUTE_EVERY, po.run.recompute_attention = 1, po.run.offload_ckpt = 1;
    po.host_budget_bytes = (size_t)64 << 30;
    int64_t best = 0;
    int found = 0;
    assert_int_equal(lt_plan_search_max(ctx, &c, &po, LT_PLAN_SEARCH_SEQ, 1 << 22, (size_t)139 << 30, &best, &found),
                     LT_OK);
    assert_true(found);
    po.run.T = best;
    lt_plan at, past;
    assert_int_equal(lt_plan_compute(ctx, &c, &po, &at), LT_OK);
    po.run.T = best + 1;
    assert_int_equal(lt_plan_compute(ctx, &c, &po, &past), LT_OK);
    assert_true(at.offload_bytes <= po.host_budget_bytes && past.offload_bytes > po.host_budget_bytes);
    fprintf(stderr, "  host budget 64 GiB: longest T %lld\n", (long long)best);
    lt_ctx_free(ctx);
}

static void misuse_and_failures_are_clean(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load(ctx);
    size_t base = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
    lt_model_run_options ro = {0};
    ro.B = B, ro.T = T, ro.offload_ckpt = 1;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_ERR_INVALID_ARG); /* no recompute: nothing to offload */
    assert_non_null(strstr(lt_ctx_error(ctx), "recompute"));
    lt_ctx_clear_error(ctx);
    ro.forward_only = 1; /* an evaluation run has no checkpoints and ignores the option */
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    assert_int_equal(lt_model_get_sizes(m).offload_bytes, 0);
    ro.forward_only = 0, ro.recompute = LT_RECOMPUTE_EVERY;
    /* every allocation of the prepare fails once, cleanly */
    for (uint64_t k = 1;; k++) {
        lt_mem_fail_nth(ctx, k);
        lt_status s = lt_model_prepare(ctx, m, &ro);
        lt_mem_fail_nth(ctx, 0);
        if (s == LT_OK) break;
        assert_int_equal(s, LT_ERR_OOM);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, base);
        lt_ctx_clear_error(ctx);
        assert_true(k < 20);
    }
    lt_model_free(ctx, m);
    /* the trainer's option: set by name, refused without a recompute policy */
    lt_train_options in, out;
    memset(&in, 0, sizeof in);
    snprintf(in.model, sizeof in.model, "%s", dir);
    snprintf(in.data, sizeof in.data, "(in memory)");
    assert_int_equal(lt_train_options_set(ctx, &in, "offload-checkpoints", "true"), LT_OK);
    assert_int_equal(in.offload_checkpoints, 1);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &out), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "recompute"));
    lt_ctx_clear_error(ctx);
    in.grad_checkpoint = 1;
    assert_int_equal(lt_train_options_resolve(ctx, &in, &out), LT_OK);
    assert_true(out.offload_checkpoints && out.recompute == LT_RECOMPUTE_EVERY);
    /* pinned memory needs a CUDA build; without one it is a typed refusal */
    void *pp = lt_alloc_pinned(ctx, 4096, "test");
    if (pp) {
        assert_int_equal(lt_mem_get_pinned_stats(ctx).used_bytes, 4096);
        lt_free_pinned(ctx, pp, 4096);
    } else {
        assert_true(lt_ctx_status(ctx) == LT_ERR_UNSUPPORTED || lt_ctx_status(ctx) == LT_ERR_OOM);
        lt_ctx_clear_error(ctx);
    }
    assert_int_equal(lt_mem_get_pinned_stats(ctx).used_bytes, 0);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bit_identical_on_cpu),
        cmocka_unit_test(size_table_equals_allocations),
        cmocka_unit_test(cuda_plan_moves_checkpoints),
        cmocka_unit_test(misuse_and_failures_are_clean),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
