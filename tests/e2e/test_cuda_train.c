/* The model and trainer on CUDA against the same model on the CPU: tiny random Llama (bf16, untied),
 * Qwen2 (f32, q/k/v biases, tied), Qwen3 (bf16, per-head q/k norm, H·D != C), a QLoRA Llama
 * (--quantize int4_g64) and a Llama with an fp8 base but for up (--base-dtype fp8 --fp8-skip up: gate's
 * FP8 product and up's bf16 one read the same x), written as Hugging Face folders with head dim 64
 * (a CUDA attention size).
 * Loss, per-token loss and every LoRA gradient of a packed batch agree under every recompute
 * policy (the CUDA model keeps bf16 checkpoints) and in row chunks; a short training run (accumulation, clipping, weight decay) tracks the CPU trajectory;
 * the planner's CUDA plan equals the allocator's device high-water byte for byte; the exported
 * adapter loads back into a fresh CUDA model exactly. Without a CUDA build or device it prints
 * "skipped: no CUDA device" and exits 77. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "helpers/train_data.h"
#include "longtune/alloc.h"
#include "longtune/plan.h"
#include "longtune/safetensors.h"
#include "longtune/sysinfo.h"
#include "longtune/train.h"
#include "model/model_internal.h"

#if LT_HAVE_CUDA

/* The CUDA step rounds every matmul input (activations, and f32 weights) to bf16 and runs the
 * attention in bf16; the CPU step is f32 throughout. bf16 keeps 8 significant bits (unit roundoff
 * u = 2^-8). A tensor's error is measured against its largest magnitude: the loss, a mean of
 * token losses, carries a few u; gradients, which pass back through every layer's rounded inputs
 * a second time, are allowed 4 u per layer traversal (forward and backward of L = 2..3 layers:
 * at most ~24 u, rounded up to 2^-3 of the largest gradient). Structural mistakes (a missing term,
 * a wrong sign, a stale buffer) give errors of order 1. */
#define BF16_U 0x1.0p-8
#define TOL_LOSS (8 * BF16_U)
#define TOL_GRAD (32 * BF16_U)
/* Training trajectories: each step's mean loss within TOL_LOSS of the CPU one (relative). Adam
 * turns a gradient element below the bf16 noise into a full-size step of either sign, so the
 * final parameters are compared as a whole: the L2 distance between the two runs' parameters is
 * at most a quarter of the distance the CPU run travelled from the shared initialisation. */
#define TOL_TRAJECTORY 0.25
/* An fp8 base: both devices round x to e4m3 the same way, but an element that the bf16 noise
 * upstream moves across a rounding boundary moves by a whole e4m3 step (2^-4 to 2^-3 of itself).
 * About one element in ten does, which adds ~sqrt(0.1)·2^-3 (4 %) of a product's scale: every
 * tolerance above is doubled for it (tol). */

static uint64_t rng;
static FILE *devnull;

typedef struct tiny {
    const char *name, *model_type, *arch;
    int64_t V, C, F, L, H, Hkv, D;
    int tied, qkv_bias, qk_norm, quantize; /* quantize: 1 int4_g64, 2 fp8 but for up */
    lt_dtype dtype;
    char dir[256];
} tiny;

static tiny tinies[] = {
    {"llama-bf16", "llama", "LlamaForCausalLM", 256, 128, 256, 3, 2, 1, 64, 0, 0, 0, 0, LT_DTYPE_BF16, ""},
    {"qwen2-f32", "qwen2", "Qwen2ForCausalLM", 192, 128, 192, 2, 2, 2, 64, 1, 1, 0, 0, LT_DTYPE_F32, ""},
    {"qwen3-bf16", "qwen3", "Qwen3ForCausalLM", 160, 96, 160, 2, 2, 1, 64, 1, 0, 1, 0, LT_DTYPE_BF16, ""},
    {"llama-qlora", "llama", "LlamaForCausalLM", 256, 128, 256, 2, 2, 2, 64, 0, 0, 0, 1, LT_DTYPE_F32, ""},
    {"llama-fp8", "llama", "LlamaForCausalLM", 256, 128, 256, 2, 2, 1, 64, 0, 0, 0, 2, LT_DTYPE_BF16, ""},
};
#define N_TINY (sizeof tinies / sizeof tinies[0])

static double tol(const tiny *t, double base) { return t->quantize == 2 ? 2 * base : base; }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* One random tensor in t's dtype: norms near 1, biases small, matrices N(0, 0.6/sqrt(in)) (the
 * embedding N(0, 1)). Returns the buffer (caller frees). */
static void *random_tensor(const tiny *t, int64_t rows, int64_t cols, int kind) {
    int64_t n = cols ? rows * cols : rows;
    float *f = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        double z = lt_test_normal(&rng);
        f[i] = (float)(kind == 1 ? 1.0 + 0.1 * z : kind == 2 ? 0.1 * z : kind == 3 ? z : 0.6 * z / sqrt((double)cols));
    }
    if (t->dtype == LT_DTYPE_F32) return f;
    uint16_t *b = malloc((size_t)n * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++) b[i] = lt_f32_to_bf16(f[i]);
    free(f);
    return b;
}

static void write_tiny(tiny *t) {
    snprintf(t->dir, sizeof t->dir, "/tmp/lt_test_cuda_train_%ld_%s", (long)getpid(), t->name);
    mkdir(t->dir, 0755);
    char path[400], cfg[1400];
    snprintf(path, sizeof path, "%s/config.json", t->dir);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"vocab_size\": %lld, \"hidden_size\": %lld,"
             " \"intermediate_size\": %lld, \"num_hidden_layers\": %lld, \"num_attention_heads\": %lld,"
             " \"num_key_value_heads\": %lld, \"head_dim\": %lld, \"max_position_embeddings\": 512,"
             " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": %s,"
             " \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}",
             t->arch, t->model_type, (long long)t->V, (long long)t->C, (long long)t->F, (long long)t->L,
             (long long)t->H, (long long)t->Hkv, (long long)t->D, t->tied ? "true" : "false");
    write_text(path, cfg);
    enum { MAXT = 64 };
    lt_safetensors_entry e[MAXT];
    char names[MAXT][96];
    void *bufs[MAXT];
    int n = 0;
    int64_t qd = t->H * t->D, kvd = t->Hkv * t->D;
#define ADD(nm, r, c, kind)                                                                  \
    do {                                                                                     \
        assert_true(n < MAXT);                                                               \
        snprintf(names[n], sizeof names[n], "%s", nm);                                       \
        bufs[n] = random_tensor(t, r, c, kind);                                              \
        int64_t shape_[2] = {r, c};                                                          \
        e[n].name = names[n];                                                                \
        e[n].tensor = lt_tensor_view(bufs[n], t->dtype, LT_DEVICE_CPU, (c) ? 2 : 1, shape_); \
        n++;                                                                                 \
    } while (0)
    ADD("model.embed_tokens.weight", t->V, t->C, 3);
    ADD("model.norm.weight", t->C, 0, 1);
    if (!t->tied) ADD("lm_head.weight", t->V, t->C, 0);
    for (int64_t l = 0; l < t->L; l++) {
        char nm[96];
#define LAYER(fmt, r, c, kind)                      \
    do {                                            \
        snprintf(nm, sizeof nm, fmt, (long long)l); \
        ADD(nm, r, c, kind);                        \
    } while (0)
        LAYER("model.layers.%lld.input_layernorm.weight", t->C, 0, 1);
        LAYER("model.layers.%lld.post_attention_layernorm.weight", t->C, 0, 1);
        LAYER("model.layers.%lld.self_attn.q_proj.weight", qd, t->C, 0);
        LAYER("model.layers.%lld.self_attn.k_proj.weight", kvd, t->C, 0);
        LAYER("model.layers.%lld.self_attn.v_proj.weight", kvd, t->C, 0);
        LAYER("model.layers.%lld.self_attn.o_proj.weight", t->C, qd, 0);
        LAYER("model.layers.%lld.mlp.gate_proj.weight", t->F, t->C, 0);
        LAYER("model.layers.%lld.mlp.up_proj.weight", t->F, t->C, 0);
        LAYER("model.layers.%lld.mlp.down_proj.weight", t->C, t->F, 0);
        if (t->qkv_bias) {
            LAYER("model.layers.%lld.self_attn.q_proj.bias", qd, 0, 2);
            LAYER("model.layers.%lld.self_attn.k_proj.bias", kvd, 0, 2);
            LAYER("model.layers.%lld.self_attn.v_proj.bias", kvd, 0, 2);
        }
        if (t->qk_norm) {
            LAYER("model.layers.%lld.self_attn.q_norm.weight", t->D, 0, 1);
            LAYER("model.layers.%lld.self_attn.k_norm.weight", t->D, 0, 1);
        }
#undef LAYER
    }
#undef ADD
    lt_ctx *ctx = lt_ctx_new();
    snprintf(path, sizeof path, "%s/model.safetensors", t->dir);
    lt_status s = lt_safetensors_write(ctx, path, e, n, NULL, 0);
    if (s != LT_OK) fprintf(stderr, "%s: %s\n", t->name, lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    lt_ctx_free(ctx);
    for (int i = 0; i < n; i++) free(bufs[i]);
}

static lt_model *load(lt_ctx *ctx, const tiny *t, lt_device dev, const lt_lora_options *lo) {
    lt_model_options mo = {.device = dev};
    mo.quantize_dtype = t->quantize == 1 ? LT_DTYPE_INT4_G64 : t->quantize == 2 ? LT_DTYPE_FP8 : LT_DTYPE_F32;
    mo.fp8_skip = t->quantize == 2 ? 1u << LT_PROJ_UP : 0;
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, t->dir, &mo, lo, &m);
    if (s != LT_OK) fprintf(stderr, "%s load on %s: %s\n", t->name, dev ? "cuda" : "cpu", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    return m;
}

/* variant 1: 40-row chunks of the position-wise work (the 192 rows of a batch are 5 chunks, the
 * last one short) and the attention rerun in the recompute instead of kept. */
static lt_model_run_options run_variant(int64_t B, int64_t T, lt_recompute rc, int variant) {
    lt_model_run_options ro = {0};
    ro.B = B, ro.T = T, ro.recompute = rc, ro.recompute_k = 2;
    if (variant == 1) ro.chunk_rows = 40, ro.recompute_attention = 1;
    return ro;
}

static void prepare_variant(lt_ctx *ctx, lt_model *m, int64_t B, int64_t T, lt_recompute rc, int variant) {
    lt_model_run_options ro = run_variant(B, T, rc, variant);
    ro.act_f32 = variant == 2; /* the products' inputs in f32 */
    ro.gu_f32 = variant == 3;  /* only the gate and up outputs in f32: the same bits as act_f32 */
    lt_status s = lt_model_prepare(ctx, m, &ro);
    if (s != LT_OK) fprintf(stderr, "prepare: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
}

static void prepare(lt_ctx *ctx, lt_model *m, int64_t B, int64_t T, lt_recompute rc) {
    prepare_variant(ctx, m, B, T, rc, 0);
}

/* max |got - want| / max |want|, and fails above tol. */
static double compare(const char *what, const float *got, const float *want, int64_t n, double tol) {
    double scale = 0, worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e <= worst)) worst = e, wi = i;
    }
    double rel = scale > 0 ? worst / scale : worst;
    if (!(rel <= tol)) {
        fprintf(stderr, "%s: max error %.3g (relative %.3g > %.3g) at %lld (got %.8g want %.8g)\n", what, worst, rel,
                tol, (long long)wi, (double)got[wi], (double)want[wi]);
        fail();
    }
    return rel;
}

/* A packed batch: B rows of T tokens, each row 2-3 sequences with restarting positions, a few
 * ignored targets (prompt tokens), and a padded tail in the last row. */
typedef struct batch {
    int64_t B, T, S;
    int32_t tokens[512], targets[512], positions[512], offsets[16];
} batch;

static void make_batch(batch *b, int64_t V) {
    b->B = 2, b->T = 96, b->S = 3;
    const int32_t cuts[2][4] = {{0, 40, 71, 96}, {0, 30, 80, 96}};
    for (int64_t r = 0; r < b->B; r++)
        for (int64_t s = 0; s <= b->S; s++) b->offsets[r * (b->S + 1) + s] = cuts[r][s];
    for (int64_t r = 0; r < b->B; r++)
        for (int64_t s = 0; s < b->S; s++)
            for (int32_t i = cuts[r][s]; i < cuts[r][s + 1]; i++) {
                int64_t k = r * b->T + i;
                b->tokens[k] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
                b->positions[k] = i - cuts[r][s];
                int last = i + 1 == cuts[r][s + 1], pad = r == 1 && s == 2;
                b->targets[k] = last || pad || i - cuts[r][s] < 3 ? LT_IGNORE_INDEX
                                                                  : (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
            }
}

static lt_model_batch view(const batch *b) {
    lt_model_batch mb = {0};
    mb.B = b->B, mb.T = b->T, mb.S = b->S;
    mb.tokens = b->tokens, mb.targets = b->targets, mb.positions = b->positions, mb.seq_offsets = b->offsets;
    return mb;
}

/* ---- one step: CUDA against CPU ---- */

static void step_matches_cpu(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TINY; ti++) {
        const tiny *t = &tinies[ti];
        lt_ctx *ctx = lt_ctx_new();
        lt_lora_options lo = {0};
        lo.rank = 8, lo.alpha = 16, lo.seed = 3;
        lt_model *mc = load(ctx, t, LT_DEVICE_CPU, &lo), *mg = load(ctx, t, LT_DEVICE_CUDA, &lo);
        int64_t n = 0;
        (void)lt_model_lora_params(mc, &n);
        /* B starts at zero (PEFT), which would leave every A gradient zero: give both models the
         * same random adapter instead. The CUDA model starts from the same init as the CPU one. */
        float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *gc = malloc((size_t)n * 4);
        assert_int_equal(lt_model_lora_get(ctx, mg, 0, 0, n, p), LT_OK);
        assert_memory_equal(p, lt_model_lora_params(mc, NULL), (size_t)n * 4);
        lt_test_fill_normal(&rng, p, n, 0.05f);
        assert_int_equal(lt_model_lora_set(ctx, mc, 0, n, p), LT_OK);
        assert_int_equal(lt_model_lora_set(ctx, mg, 0, n, p), LT_OK);
        batch b;
        make_batch(&b, t->V);
        lt_model_batch mb = view(&b);
        int64_t N = b.B * b.T;

        prepare(ctx, mc, b.B, b.T, LT_RECOMPUTE_NONE);
        float tl_c[512], tl_g[512];
        lt_model_result rc, rg;
        lt_model_zero_grads(mc);
        assert_int_equal(lt_model_forward_backward(ctx, mc, &mb, 0.0f, &rc, tl_c), LT_OK);
        memcpy(gc, lt_model_lora_grads(mc, NULL), (size_t)n * 4);

        /* The fourth runs in 40-row chunks with the attention rerun (run_variant); the fifth is the
         * first with every activation the backend would hand its products in bf16 (the MLP's gate
         * and up outputs, activation and gradients, attention's output into o) held in f32; the
         * sixth keeps only the gate and up outputs in f32, which must give the fifth's very bits
         * (the products round their inputs to bf16 either way). */
        const lt_recompute pol[6] = {LT_RECOMPUTE_NONE,  LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K,
                                     LT_RECOMPUTE_EVERY, LT_RECOMPUTE_NONE,  LT_RECOMPUTE_NONE};
        float tl_0[512], *g0 = malloc((size_t)n * 4);
        for (int pi = 0; pi < 6; pi++) {
            prepare_variant(ctx, mg, b.B, b.T, pol[pi], pi == 3 ? 1 : pi >= 4 ? pi - 2 : 0);
            for (int64_t i = 0; i < N; i++) tl_g[i] = LT_TEST_POISON;
            lt_model_zero_grads(mg);
            lt_status s = lt_model_forward_backward(ctx, mg, &mb, 0.0f, &rg, tl_g);
            if (s != LT_OK) fprintf(stderr, "%s cuda step: %s\n", t->name, lt_ctx_error(ctx));
            assert_int_equal(s, LT_OK);
            assert_int_equal(rg.n_tokens, rc.n_tokens);
            char what[200];
            float lg = (float)(rg.loss_sum / (double)rg.n_tokens), lc = (float)(rc.loss_sum / (double)rc.n_tokens);
            snprintf(what, sizeof what, "%s loss (recompute %d)", t->name, pi);
            double el = compare(what, &lg, &lc, 1, tol(t, TOL_LOSS));
            snprintf(what, sizeof what, "%s token_loss (recompute %d)", t->name, pi);
            double et = compare(what, tl_g, tl_c, N, tol(t, TOL_LOSS));
            assert_int_equal(lt_model_lora_get(ctx, mg, 1, 0, n, g), LT_OK);
            double eg = 0;
            for (int64_t i = 0; i < lt_model_lora_count(mg); i++) {
                lt_lora_tensor lt;
                assert_int_equal(lt_model_lora_tensor(ctx, mg, i, &lt), LT_OK);
                assert_int_equal(lt.grad.device, LT_DEVICE_CUDA);
                snprintf(what, sizeof what, "%s %s grad (recompute %d)", t->name, lt.name, pi);
                double e = compare(what, g + lt.offset, gc + lt.offset, lt_tensor_numel(&lt.grad), tol(t, TOL_GRAD));
                eg = fmax(eg, e);
            }
            fprintf(stderr,
                    "  %-12s recompute %d: loss %.6f vs %.6f (rel %.2e), token_loss rel %.2e, worst grad rel %.2e\n",
                    t->name, pi, (double)lg, (double)lc, el, et, eg);
            if (pi == 0) {
                /* every tiny but the fp8 one (whose projections but up take fp8 products) hands
                 * its products bf16 inputs and holds its gate and up outputs in bf16 */
                assert_int_equal(mg->lay.mlp_bf16, t->quantize != 2);
                assert_int_equal(mg->lay.o_bf16, t->quantize != 2);
                assert_int_equal(mg->lay.qkv_bf16, t->quantize != 2);
                assert_int_equal(mg->lay.gu_bf16, t->quantize != 2);
            }
            if (pi == 4) memcpy(tl_0, tl_g, sizeof tl_0), memcpy(g0, g, (size_t)n * 4);
            if (pi == 5) {
                assert_int_equal(mg->lay.gu_bf16, 0);
                assert_int_equal(mg->lay.mlp_bf16, t->quantize != 2);
                int same = memcmp(tl_0, tl_g, (size_t)N * 4) == 0 && memcmp(g0, g, (size_t)n * 4) == 0;
                fprintf(stderr, "  %-12s f32 activations against the backend's bf16 ones: %s\n", t->name,
                        same ? "the same bits" : "DIFFERENT");
                assert_true(same);
            }
        }
        free(g0);
        lt_model_free(ctx, mg);
        lt_model_free(ctx, mc);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        free(p), free(g), free(gc);
        lt_ctx_free(ctx);
    }
}

/* ---- the plan is the device high-water ---- */

static void plan_equals_device_high_water(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TINY; ti++) {
        const tiny *t = &tinies[ti];
        /* The last in 40-row chunks with the attention rerun (run_variant). */
        const lt_recompute pol[3] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY};
        for (int pi = 0; pi < 3; pi++) {
            lt_ctx *ctx = lt_ctx_new();
            lt_lora_options lo = {0};
            lo.rank = 4;
            lt_model *m = load(ctx, t, LT_DEVICE_CUDA, &lo);
            prepare_variant(ctx, m, 2, 96, pol[pi], pi == 2);
            batch b;
            make_batch(&b, t->V);
            lt_model_batch mb = view(&b);
            lt_model_result r;
            assert_int_equal(lt_model_forward_backward(ctx, m, &mb, 0.0f, &r, NULL), LT_OK);
            assert_int_equal(lt_model_forward(ctx, m, &mb, &r, NULL), LT_OK);
            lt_plan_options po = {0};
            po.device = LT_DEVICE_CUDA;
            po.lora = *lt_model_get_lora(m);
            po.run = run_variant(2, 96, pol[pi], pi == 2);
            lt_plan p;
            assert_int_equal(lt_plan_compute(ctx, lt_model_get_config(m), &po, &p), LT_OK);
            size_t measured = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes;
            size_t planned = p.peak_bytes - p.bytes[LT_PLAN_OPTIMIZER]; /* no trainer here */
            fprintf(stderr, "  %-12s recompute %d: plan %zu measured %zu\n", t->name, pi, planned, measured);
            assert_int_equal(planned, measured);
            lt_model_sizes ms = lt_model_get_sizes(m);
            for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(ms.bytes[c], p.bytes[c]);
            lt_model_free(ctx, m);
            lt_ctx_free(ctx);
        }
    }
}

/* ---- training: the CUDA trajectory tracks the CPU one ---- */

enum { ITERS = 8 };

static lt_train_options run_options(const tiny *t, const char *dir, lt_device dev) {
    lt_train_options in, o;
    memset(&in, 0, sizeof in);
    snprintf(in.model, sizeof in.model, "%s", t->dir);
    snprintf(in.data, sizeof in.data, "(in memory)");
    snprintf(in.adapter_path, sizeof in.adapter_path, "%s", dir);
    in.iters = ITERS, in.batch_size = 2, in.max_seq_length = 128, in.learning_rate = 5e-3;
    in.lora_rank = 4, in.lora_alpha = 8, in.grad_accum = 2, in.grad_clip = 0.5, in.weight_decay = 0.01;
    in.steps_per_eval = 4, in.save_every = 100, in.val_batches = -1, in.seed = 5, in.threads = 2;
    in.device = dev;
    if (t->quantize == 1) snprintf(in.quantize, sizeof in.quantize, "int4_g64");
    if (t->quantize == 2) {
        snprintf(in.base_dtype, sizeof in.base_dtype, "fp8");
        snprintf(in.fp8_skip, sizeof in.fp8_skip, "up");
    }
    lt_ctx *ctx = lt_ctx_new();
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    lt_ctx_free(ctx);
    return o;
}

static lt_model *load_for(lt_ctx *ctx, const tiny *t, const lt_train_options *o) {
    lt_lora_options lora;
    assert_int_equal(lt_train_lora_options(ctx, o, &lora), LT_OK);
    return load(ctx, t, o->device, &lora);
}

static void training_tracks_cpu(void **state) {
    (void)state;
    const tiny *cases[3] = {&tinies[0], &tinies[3], &tinies[4]}; /* bf16 Llama, QLoRA, fp8 base */
    for (int ci = 0; ci < 3; ci++) {
        const tiny *t = cases[ci];
        uint64_t ds = 17;
        lt_test_dataset train, valid;
        lt_test_dataset_make(&train, 40, t->V, 8, 24, &ds);
        lt_test_dataset_make(&valid, 8, t->V, 8, 24, &ds);
        double loss[2][ITERS];
        float *final[2] = {NULL, NULL}, *init = NULL;
        int64_t n = 0;
        char dirs[2][256];
        for (int dev = 0; dev < 2; dev++) {
            snprintf(dirs[dev], sizeof dirs[dev], "/tmp/lt_test_cuda_train_%ld_run%d", (long)getpid(), dev);
            lt_train_options o = run_options(t, dirs[dev], dev ? LT_DEVICE_CUDA : LT_DEVICE_CPU);
            lt_ctx *ctx = lt_ctx_new();
            lt_model *m = load_for(ctx, t, &o);
            if (!dev) { /* both devices start from the same host-drawn initialisation */
                (void)lt_model_lora_params(m, &n);
                init = malloc((size_t)n * 4);
                assert_int_equal(lt_model_lora_get(ctx, m, 0, 0, n, init), LT_OK);
            }
            lt_train_result res;
            memset(&res, 0, sizeof res);
            res.step_loss = loss[dev];
            lt_status s = lt_train_fit(ctx, &o, m, &train.in, &valid.in, devnull, &res);
            if (s != LT_OK) fprintf(stderr, "%s fit on %s: %s\n", t->name, dev ? "cuda" : "cpu", lt_ctx_error(ctx));
            assert_int_equal(s, LT_OK);
            assert_int_equal(res.steps, ITERS);
            final[dev] = malloc((size_t)n * 4);
            assert_int_equal(lt_model_lora_get(ctx, m, 0, 0, n, final[dev]), LT_OK);
            fprintf(stderr, "  %-12s %s: val %.4f -> %.4f, peak %zu plan %zu (host peak %zu)\n", t->name,
                    dev ? "cuda" : "cpu ", res.first_val_loss, res.last_val_loss, res.peak_bytes, res.plan_bytes,
                    res.host_peak_bytes);
            assert_true(res.last_val_loss < res.first_val_loss);
            if (dev) {
                /* The planner's CUDA plan is the device high-water of the whole run. */
                assert_int_equal(res.plan_bytes, res.peak_bytes);
                /* The adapter the run saved loads into a fresh CUDA model as the very values. */
                lt_lora_options back;
                assert_int_equal(lt_peft_read_config(ctx, dirs[dev], t->L, &back), LT_OK);
                lt_model *m2 = load(ctx, t, LT_DEVICE_CUDA, &back);
                assert_int_equal(lt_peft_load(ctx, dirs[dev], m2), LT_OK);
                float *q = malloc((size_t)n * 4);
                assert_int_equal(lt_model_lora_get(ctx, m2, 0, 0, n, q), LT_OK);
                assert_memory_equal(q, final[dev], (size_t)n * 4);
                free(q);
                lt_model_free(ctx, m2);
            }
            lt_model_free(ctx, m);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
            lt_ctx_free(ctx);
        }
        for (int i = 0; i < ITERS; i++) {
            float g = (float)loss[1][i], c = (float)loss[0][i];
            char what[160];
            snprintf(what, sizeof what, "%s step %d loss", t->name, i + 1);
            compare(what, &g, &c, 1, tol(t, TOL_LOSS));
        }
        double apart = 0, travelled = 0;
        for (int64_t i = 0; i < n; i++) {
            apart += ((double) final[1][i] - final[0][i]) * ((double) final[1][i] - final[0][i]);
            travelled += ((double) final[0][i] - init[i]) * ((double) final[0][i] - init[i]);
        }
        double e = sqrt(apart / travelled);
        fprintf(stderr, "  %-12s loss step 1 %.5f/%.5f, step %d %.5f/%.5f (cuda/cpu), params apart/travelled %.3f\n",
                t->name, loss[1][0], loss[0][0], ITERS, loss[1][ITERS - 1], loss[0][ITERS - 1], e);
        assert_true(travelled > 0 && e <= tol(t, TOL_TRAJECTORY));
        free(final[0]), free(final[1]), free(init);
        lt_test_rm_adapter_dir(dirs[0]);
        lt_test_rm_adapter_dir(dirs[1]);
        lt_test_dataset_free(&train);
        lt_test_dataset_free(&valid);
    }
}

/* The checkpoint a run saved in dir, read on the host: params, m and v (3n floats). */
static float *read_checkpoint(lt_ctx *ctx, const lt_model *m, const lt_train_options *o, const char *dir,
                              int64_t *step) {
    int64_t n = 0, count = lt_model_lora_count(m);
    (void)lt_model_lora_params((lt_model *)m, &n);
    float *st = malloc((size_t)(3 * n) * 4);
    lt_train_param *tp = calloc((size_t)count, sizeof *tp);
    const char *prefix = "base_model.model.";
    for (int64_t i = 0; i < count; i++) {
        lt_lora_tensor lt;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &lt), LT_OK);
        size_t len = strlen(lt.name) - strlen(prefix) - strlen(".weight");
        memcpy(tp[i].name, lt.name + strlen(prefix), len);
        tp[i].ndim = 2;
        tp[i].shape[0] = lt.value.shape[0], tp[i].shape[1] = lt.value.shape[1];
        tp[i].data = st + lt.offset, tp[i].m = st + n + lt.offset, tp[i].v = st + 2 * n + lt.offset;
    }
    char path[400];
    snprintf(path, sizeof path, "%s/" LT_TRAIN_CHECKPOINT_FILE, dir);
    lt_train_state ts;
    lt_status s = lt_checkpoint_load(ctx, path, o, &ts, tp, (int)count);
    if (s != LT_OK) fprintf(stderr, "%s: %s\n", path, lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    *step = ts.step;
    free(tp);
    return st;
}

static double rel_l2(const float *a, const float *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return r > 0 ? sqrt(d / r) : INFINITY;
}

/* Save and resume on CUDA: the checkpoint of a stopped run holds the device's parameters exactly
 * and its AdamW moments; resuming it continues the uninterrupted run (losses of the remaining
 * steps within TOL_LOSS, final parameters and moments within TOL_TRAJECTORY: the dQ sums of the
 * attention backward use atomics, so CUDA runs agree to rounding, not bit for bit). A lost
 * moment (zeros after resume) would put m and v off by about half. */
static void resume_on_cuda(void **state) {
    (void)state;
    const tiny *t = &tinies[0];
    uint64_t ds = 23;
    lt_test_dataset train, valid;
    lt_test_dataset_make(&train, 40, t->V, 8, 24, &ds);
    lt_test_dataset_make(&valid, 8, t->V, 8, 24, &ds);
    char da[256], db[256];
    snprintf(da, sizeof da, "/tmp/lt_test_cuda_train_%ld_full", (long)getpid());
    snprintf(db, sizeof db, "/tmp/lt_test_cuda_train_%ld_split", (long)getpid());
    lt_train_options oa = run_options(t, da, LT_DEVICE_CUDA), ob = run_options(t, db, LT_DEVICE_CUDA);
    lt_ctx *ctx = lt_ctx_new();
    double full[ITERS], split[ITERS];
    lt_model *m = load_for(ctx, t, &oa);
    lt_train_result r;
    memset(&r, 0, sizeof r);
    r.step_loss = full;
    assert_int_equal(lt_train_fit(ctx, &oa, m, &train.in, &valid.in, devnull, &r), LT_OK);
    int64_t n = 0, step = 0;
    (void)lt_model_lora_params(m, &n);
    float *want = read_checkpoint(ctx, m, &oa, da, &step);
    assert_int_equal(step, ITERS);
    lt_model_free(ctx, m);

    const int64_t stop = 3;
    m = load_for(ctx, t, &ob);
    memset(&r, 0, sizeof r);
    r.step_loss = split;
    r.stop_at = stop;
    assert_int_equal(lt_train_fit(ctx, &ob, m, &train.in, &valid.in, devnull, &r), LT_ERR_INTERRUPTED);
    float *mid = read_checkpoint(ctx, m, &ob, db, &step), *dev = malloc((size_t)n * 4);
    assert_int_equal(step, stop);
    assert_int_equal(lt_model_lora_get(ctx, m, 0, 0, n, dev), LT_OK);
    assert_memory_equal(mid, dev, (size_t)n * 4); /* the saved parameters are the device's */
    double mm = 0, vv = 0;
    for (int64_t i = 0; i < n; i++) mm += fabs((double)mid[n + i]), vv += mid[2 * n + i];
    assert_true(mm > 0 && vv > 0 && isfinite(mm) && isfinite(vv));
    lt_model_free(ctx, m);

    m = load_for(ctx, t, &ob);
    snprintf(ob.resume_adapter_file, sizeof ob.resume_adapter_file, "%s", db);
    memset(&r, 0, sizeof r);
    r.step_loss = split;
    lt_status s = lt_train_fit(ctx, &ob, m, &train.in, &valid.in, devnull, &r);
    if (s != LT_OK) fprintf(stderr, "resume: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    assert_int_equal(r.start_step, stop);
    for (int64_t i = stop; i < ITERS; i++) {
        float a = (float)split[i], b = (float)full[i];
        compare("resumed step loss", &a, &b, 1, TOL_LOSS);
    }
    float *got = read_checkpoint(ctx, m, &ob, db, &step);
    assert_int_equal(step, ITERS);
    double ep = rel_l2(got, want, n), em = rel_l2(got + n, want + n, n), ev = rel_l2(got + 2 * n, want + 2 * n, n);
    fprintf(stderr, "  resume at %lld: params %.2e, m %.2e, v %.2e relative L2 from the uninterrupted run\n",
            (long long)stop, ep, em, ev);
    assert_true(ep <= TOL_TRAJECTORY && em <= TOL_TRAJECTORY && ev <= TOL_TRAJECTORY);
    lt_model_free(ctx, m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    free(want), free(mid), free(dev), free(got);
    lt_test_rm_adapter_dir(da);
    lt_test_rm_adapter_dir(db);
    lt_test_dataset_free(&train);
    lt_test_dataset_free(&valid);
    lt_ctx_free(ctx);
}

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    devnull = fopen("/dev/null", "w");
    for (size_t i = 0; i < N_TINY; i++) write_tiny(&tinies[i]);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < N_TINY; i++) lt_test_rm_model_dir(tinies[i].dir);
    if (devnull) fclose(devnull);
    return 0;
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(step_matches_cpu),
        cmocka_unit_test(plan_equals_device_high_water),
        cmocka_unit_test(training_tracks_cpu),
        cmocka_unit_test(resume_on_cuda),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#else

int main(void) { return lt_test_cuda_skip(); }

#endif
