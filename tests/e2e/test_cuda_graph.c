/* Whole-step CUDA graphs (src/train/step_graph.c) on a tiny random Llama (bf16, head dim 64): steps
 * replayed from the captured graph give bit-identical losses, LoRA parameters and AdamW moments to
 * the same steps run eagerly (fresh tokens, targets, positions and packed offsets every step, a
 * learning rate that changes every step, clipping on); a change of batch shape falls back to an
 * eager step and a graph is recaptured only when the new shape repeats; nothing is allocated on
 * the device after the first step; the trainer with --cuda-graph on and off trains the same
 * adapter to the bit (packed rows). The attention backward runs its dQ pass without atomics (an
 * lt_attn_cuda_tuning override of dq = LT_ATTN_DQ_SEP) and the tiny model has two query heads per
 * key head, so even eager runs repeat to the bit. A mixture-of-experts model with the router's
 * load-balancing loss is captured and replayed the same way. Without a CUDA build or device it prints "skipped: no CUDA device" and exits
 * 77. */
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
#include "longtune/safetensors.h"
#include "longtune/train.h"
#include "train/step_graph.h"

#if LT_HAVE_CUDA
#include "backend/cuda/attention/tuning.h"

enum { V = 256, C = 128, F = 256, L = 2, H = 2, HKV = 1, D = 64 };
enum { STEPS = 6, BMAX = 2, TMAX = 96 };

static uint64_t rng;
static char model_dir[256];
static FILE *devnull;

static void write_model(void) {
    snprintf(model_dir, sizeof model_dir, "/tmp/lt_test_cuda_graph_%ld", (long)getpid());
    mkdir(model_dir, 0755);
    char path[400], cfg[1200];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d,"
             " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
             " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
             " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}",
             V, C, F, L, H, HKV, D);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(cfg, f);
    fclose(f);
    enum { MAXT = 32 };
    lt_safetensors_entry e[MAXT];
    char names[MAXT][96];
    uint16_t *bufs[MAXT];
    int n = 0;
    struct {
        const char *fmt;
        int64_t r, c;
        int kind;
    } spec[] = {
        {"model.layers.%d.input_layernorm.weight", C, 0, 1},
        {"model.layers.%d.post_attention_layernorm.weight", C, 0, 1},
        {"model.layers.%d.self_attn.q_proj.weight", H * D, C, 0},
        {"model.layers.%d.self_attn.k_proj.weight", HKV * D, C, 0},
        {"model.layers.%d.self_attn.v_proj.weight", HKV * D, C, 0},
        {"model.layers.%d.self_attn.o_proj.weight", C, H * D, 0},
        {"model.layers.%d.mlp.gate_proj.weight", F, C, 0},
        {"model.layers.%d.mlp.up_proj.weight", F, C, 0},
        {"model.layers.%d.mlp.down_proj.weight", C, F, 0},
    };
    for (int k = -3; k < L * 9; k++) {
        int64_t r, c;
        int kind;
        if (k == -3) snprintf(names[n], sizeof names[n], "model.embed_tokens.weight"), r = V, c = C, kind = 2;
        else if (k == -2) snprintf(names[n], sizeof names[n], "model.norm.weight"), r = C, c = 0, kind = 1;
        else if (k == -1) snprintf(names[n], sizeof names[n], "lm_head.weight"), r = V, c = C, kind = 0;
        else {
            snprintf(names[n], sizeof names[n], spec[k % 9].fmt, k / 9);
            r = spec[k % 9].r, c = spec[k % 9].c, kind = spec[k % 9].kind;
        }
        int64_t cnt = c ? r * c : r;
        bufs[n] = malloc((size_t)cnt * sizeof(uint16_t));
        for (int64_t i = 0; i < cnt; i++) {
            double z = lt_test_normal(&rng);
            double v = kind == 1 ? 1.0 + 0.1 * z : kind == 2 ? z : 0.6 * z / sqrt((double)c);
            bufs[n][i] = lt_f32_to_bf16((float)v);
        }
        int64_t shape[2] = {r, c};
        e[n].name = names[n];
        e[n].tensor = lt_tensor_view(bufs[n], LT_DTYPE_BF16, LT_DEVICE_CPU, c ? 2 : 1, shape);
        n++;
    }
    lt_ctx *ctx = lt_ctx_new();
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    assert_int_equal(lt_safetensors_write(ctx, path, e, n, NULL, 0), LT_OK);
    lt_ctx_free(ctx);
    for (int i = 0; i < n; i++) free(bufs[i]);
}

static lt_model *load(lt_ctx *ctx) {
    lt_model_options mo = {.device = LT_DEVICE_CUDA};
    lt_lora_options lo = {0};
    lo.rank = 4, lo.alpha = 8, lo.seed = 3;
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, model_dir, &mo, &lo, &m);
    if (s != LT_OK) fprintf(stderr, "load: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    lt_model_run_options ro = {0};
    ro.B = BMAX, ro.T = TMAX, ro.recompute = LT_RECOMPUTE_EVERY;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    return m;
}

/* Step k's batch of shape `kind`: 0 = 2 rows of 96 tokens packed as 3 sequences with cut points
 * drawn per step (a row's third one may be empty), 1 = 2 rows of 64 tokens (fixed cuts, S = 3).
 * Both pad to S = 4 in the step graph. Tokens, targets, positions and kind 0's offsets are drawn
 * afresh from a per-step seed, so a replay must read new inputs. */
typedef struct batch {
    int32_t tok[BMAX * TMAX], tgt[BMAX * TMAX], pos[BMAX * TMAX], offs[BMAX * 4];
    lt_model_batch b;
} batch;

static void make_batch(batch *bt, int kind, uint64_t seed) {
    static const int32_t cut1[2][4] = {{0, 20, 64, 64}, {0, 64, 64, 64}};
    int32_t cut0[2][4];
    int64_t T = kind ? 64 : 96, S = 3;
    uint64_t s = seed;
    for (int r = 0; r < 2; r++) {
        cut0[r][0] = 0;
        cut0[r][1] = 8 + (int32_t)(lt_test_rand_u64(&s) % 40);
        cut0[r][2] = cut0[r][1] + 8 + (int32_t)(lt_test_rand_u64(&s) % (uint64_t)(96 - 8 - cut0[r][1] + 1));
        cut0[r][3] = 96;
    }
    const int32_t(*cut)[4] = kind ? cut1 : (const int32_t(*)[4])cut0;
    memset(&bt->b, 0, sizeof bt->b);
    for (int64_t r = 0; r < BMAX; r++) {
        for (int64_t k = 0; k <= S; k++) bt->offs[r * (S + 1) + k] = cut[r][k];
        for (int64_t k = 0; k < S; k++)
            for (int32_t i = cut[r][k]; i < cut[r][k + 1]; i++) {
                int64_t j = r * T + i;
                bt->tok[j] = (int32_t)(lt_test_rand_u64(&s) % V);
                bt->pos[j] = i - cut[r][k];
                bt->tgt[j] =
                    i + 1 == cut[r][k + 1] || i == cut[r][k] ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&s) % V);
            }
    }
    bt->b.B = BMAX, bt->b.T = T, bt->b.S = S;
    bt->b.tokens = bt->tok, bt->b.targets = bt->tgt, bt->b.positions = bt->pos, bt->b.seq_offsets = bt->offs;
}

/* Runs `n` steps of the shapes in kinds[] through a step graph (enable on or off) on a fresh model
 * whose adapter starts at init; returns the losses, the gradient norms the steps read back with
 * their losses and the final params + moments (3n floats). Each norm is the one before clipping:
 * the clipped gradients left behind measure min(norm, grad_clip). */
static void run_steps(const int *kinds, int nsteps, int enable, const float *init, uint64_t seed, double *loss,
                      double *gnorm, float **state_out, lt_step_graph_stats *stats) {
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load(ctx);
    int64_t n = 0;
    float *params = lt_model_lora_params(m, &n), *grads = lt_model_lora_grads(m, &n);
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, init), LT_OK);
    size_t nb = (size_t)n * sizeof(float);
    float *mm = lt_calloc(ctx, LT_DEVICE_CUDA, nb, "test moments"),
          *vv = lt_calloc(ctx, LT_DEVICE_CUDA, nb, "test moments");
    assert_non_null(mm);
    assert_non_null(vv);
    lt_step_optim so = {params, grads, mm, vv, n, 0.05};
    lt_step_graph *g = NULL;
    assert_int_equal(lt_step_graph_init(ctx, m, &so, BMAX, TMAX, enable, &g), LT_OK);
    assert_true(isnan(lt_step_graph_grad_norm(g))); /* no step yet */
    uint64_t allocs = 0;
    size_t used = 0;
    for (int k = 0; k < nsteps; k++) {
        batch bt;
        make_batch(&bt, kinds[k], seed + (uint64_t)k);
        lt_adamw_params hp = {1e-2f / (float)(k + 1), 0.9f, 0.999f, 1e-8f, 0.01f, k + 1};
        lt_model_result r;
        lt_status s = lt_step_graph_run(ctx, g, &bt.b, 0.0f, &hp, &r);
        if (s != LT_OK) fprintf(stderr, "step %d: %s\n", k, lt_ctx_error(ctx));
        assert_int_equal(s, LT_OK);
        assert_true(r.n_tokens > 0 && isfinite(r.loss_sum));
        loss[k] = r.loss_sum / (double)r.n_tokens;
        gnorm[k] = lt_step_graph_grad_norm(g);
        const double left = sqrt((double)lt_backend_get(LT_DEVICE_CUDA)->sumsq(ctx, grads, n));
        assert_true(isfinite(gnorm[k]) && gnorm[k] > 0);
        if (fabs(left - fmin(gnorm[k], so.grad_clip)) > 1e-5 * fmin(gnorm[k], so.grad_clip))
            fail_msg("step %d: gradient norm %.9g read back, clipped gradients measure %.9g (clip %g)", k, gnorm[k],
                     left, so.grad_clip);
        lt_mem_stats ms = lt_mem_get_stats(ctx, LT_DEVICE_CUDA);
        if (k == 0) allocs = ms.n_allocs, used = ms.used_bytes;
        /* Nothing allocates on the device after the first step (a capture would refuse it). */
        assert_int_equal(ms.n_allocs, allocs);
        assert_int_equal(ms.used_bytes, used);
    }
    *stats = lt_step_graph_get_stats(g);
    float *st = malloc(3 * nb);
    assert_int_equal(lt_model_lora_get(ctx, m, 0, 0, n, st), LT_OK);
    assert_int_equal(lt_backend_get(LT_DEVICE_CUDA)->copy_to_host(ctx, st + n, mm, nb), LT_OK);
    assert_int_equal(lt_backend_get(LT_DEVICE_CUDA)->copy_to_host(ctx, st + 2 * n, vv, nb), LT_OK);
    *state_out = st;
    lt_step_graph_free(ctx, g);
    lt_free(ctx, LT_DEVICE_CUDA, mm, nb);
    lt_free(ctx, LT_DEVICE_CUDA, vv, nb);
    lt_model_free(ctx, m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
}

static float *random_init(int64_t *n_out) {
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load(ctx);
    int64_t n = 0;
    (void)lt_model_lora_params(m, &n);
    float *p = malloc((size_t)n * sizeof(float));
    lt_test_fill_normal(&rng, p, n, 0.05f); /* B = 0 (PEFT) would leave A's gradients zero */
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
    *n_out = n;
    return p;
}

static void compare_runs(const char *what, const int *kinds, int nsteps, lt_step_graph_stats *on_stats) {
    int64_t n = 0;
    float *init = random_init(&n), *eager = NULL, *graph = NULL;
    uint64_t seed = lt_test_rand_u64(&rng);
    double le[16], lg[16], ne[16], ng[16];
    lt_step_graph_stats se, sg;
    run_steps(kinds, nsteps, 0, init, seed, le, ne, &eager, &se);
    run_steps(kinds, nsteps, 1, init, seed, lg, ng, &graph, &sg);
    fprintf(stderr, "  %s: graph %lld replayed, %lld captured, %lld eager%s%s; eager run %lld steps\n", what,
            (long long)sg.replays, (long long)sg.captures, (long long)sg.eager, sg.why_off[0] ? "; off: " : "",
            sg.why_off, (long long)se.eager);
    assert_int_equal(se.eager, nsteps);
    assert_int_equal(se.replays + se.captures, 0);
    for (int k = 0; k < nsteps; k++) {
        fprintf(stderr, "    step %d (shape %d): loss %.9f eager %.9f, gradient norm %.9g eager %.9g\n", k + 1,
                kinds[k], lg[k], le[k], ng[k], ne[k]);
        assert_true(lg[k] == le[k]);
        assert_true(ng[k] == ne[k]);
    }
    assert_memory_equal(graph, eager, (size_t)(3 * n) * sizeof(float));
    double travelled = 0;
    for (int64_t i = 0; i < n; i++) travelled += fabs((double)graph[i] - init[i]);
    assert_true(travelled > 0); /* the steps did update the adapter */
    *on_stats = sg;
    free(init), free(eager), free(graph);
}

static void replay_is_bit_identical(void **state) {
    (void)state;
    const int kinds[STEPS] = {0, 0, 0, 0, 0, 0};
    lt_step_graph_stats s;
    compare_runs("one shape", kinds, STEPS, &s);
    assert_string_equal(s.why_off, "");
    assert_int_equal(s.eager, 1);    /* the first step of the shape */
    assert_int_equal(s.captures, 1); /* the second, launched at once */
    assert_int_equal(s.replays, STEPS - 2);
}

static void shape_change_falls_back(void **state) {
    (void)state;
    /* A A A B A B B B: eager, capture, replay, eager (new shape), replay (A's graph still fits),
     * eager (B once more after A), capture (B twice in a row), replay. */
    const int kinds[8] = {0, 0, 0, 1, 0, 1, 1, 1};
    lt_step_graph_stats s;
    compare_runs("shape changes", kinds, 8, &s);
    assert_int_equal(s.eager, 3);
    assert_int_equal(s.captures, 2);
    assert_int_equal(s.replays, 3);
}

/* A mixture-of-experts model with the router's load-balancing loss (tests/fixtures/moe/
 * qwen3moe_hd64: Qwen3-MoE, head dim 64, a dense layer between two MoE layers) is captured too:
 * its aux gradient's scale and its aux loss travel as data, so replayed steps give the eager
 * steps' losses, aux losses, LoRA parameters and moments to the bit. Rows of 12 tokens, two
 * documents each cut afresh per step; steps 0-3 count every token, steps 4-6 leave row 1's second
 * document (from token 7 on) out of the statistics as padding (real_seqs), a new key: eager,
 * capture, replay, replay, eager, capture, replay. */
enum { MOE_T = 12, MOE_STEPS = 7 };

static void moe_run_steps(int enable, const float *init, uint64_t seed, double *loss, double *aux, float **state_out,
                          lt_step_graph_stats *stats) {
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/moe/qwen3moe_hd64", lt_test_source_dir());
    lt_model_options mo = {.device = LT_DEVICE_CUDA};
    lt_lora_options lo = {0};
    lo.rank = 4, lo.alpha = 8, lo.seed = 3;
    lt_model *m = NULL;
    lt_status st = lt_model_load(ctx, dir, &mo, &lo, &m);
    if (st != LT_OK) fprintf(stderr, "load %s: %s\n", dir, lt_ctx_error(ctx));
    assert_int_equal(st, LT_OK);
    assert_true(lt_model_get_config(m)->moe_aux_coef > 0);
    lt_model_run_options ro = {0};
    ro.B = 2, ro.T = MOE_T, ro.recompute = LT_RECOMPUTE_EVERY, ro.moe_chunk_tokens = 5;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    int64_t n = 0;
    float *params = lt_model_lora_params(m, &n), *grads = lt_model_lora_grads(m, &n);
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, init), LT_OK);
    size_t nb = (size_t)n * sizeof(float);
    float *mm = lt_calloc(ctx, LT_DEVICE_CUDA, nb, "test moments"),
          *vv = lt_calloc(ctx, LT_DEVICE_CUDA, nb, "test moments");
    assert_non_null(mm);
    assert_non_null(vv);
    lt_step_optim so = {params, grads, mm, vv, n, 0.05};
    lt_step_graph *g = NULL;
    assert_int_equal(lt_step_graph_init(ctx, m, &so, 2, MOE_T, enable, &g), LT_OK);
    const int64_t vocab = lt_model_get_config(m)->V;
    for (int k = 0; k < MOE_STEPS; k++) {
        int32_t tok[2 * MOE_T], tgt[2 * MOE_T], pos[2 * MOE_T], offs[2 * 3], rs[2] = {2, k < 4 ? 2 : 1};
        uint64_t r = seed + (uint64_t)k;
        for (int row = 0; row < 2; row++) {
            int32_t cut = k < 4 ? 3 + (int32_t)(lt_test_rand_u64(&r) % 7) : 7;
            offs[row * 3] = 0, offs[row * 3 + 1] = cut, offs[row * 3 + 2] = MOE_T;
            for (int32_t i = 0; i < MOE_T; i++) {
                int64_t j = row * MOE_T + i;
                tok[j] = (int32_t)(lt_test_rand_u64(&r) % (uint64_t)vocab);
                pos[j] = i < cut ? i : i - cut;
                tgt[j] = i + 1 == cut || i + 1 == MOE_T ? LT_IGNORE_INDEX
                                                        : (int32_t)(lt_test_rand_u64(&r) % (uint64_t)vocab);
            }
        }
        lt_model_batch b;
        memset(&b, 0, sizeof b);
        b.B = 2, b.T = MOE_T, b.S = 2, b.tokens = tok, b.targets = tgt, b.positions = pos, b.seq_offsets = offs;
        b.real_seqs = rs;
        lt_adamw_params hp = {1e-2f / (float)(k + 1), 0.9f, 0.999f, 1e-8f, 0.01f, k + 1};
        lt_model_result res;
        lt_status s = lt_step_graph_run(ctx, g, &b, 0.0f, &hp, &res);
        if (s != LT_OK) fprintf(stderr, "moe step %d: %s\n", k, lt_ctx_error(ctx));
        assert_int_equal(s, LT_OK);
        loss[k] = res.loss_sum / (double)res.n_tokens;
        aux[k] = res.aux_loss;
        assert_true(isfinite(loss[k]) && aux[k] > 1.0 && aux[k] < 8.0); /* E·Σ f·P: k = 2 balanced, E·k at most */
    }
    *stats = lt_step_graph_get_stats(g);
    float *out = malloc(3 * nb);
    assert_int_equal(lt_model_lora_get(ctx, m, 0, 0, n, out), LT_OK);
    assert_int_equal(lt_backend_get(LT_DEVICE_CUDA)->copy_to_host(ctx, out + n, mm, nb), LT_OK);
    assert_int_equal(lt_backend_get(LT_DEVICE_CUDA)->copy_to_host(ctx, out + 2 * n, vv, nb), LT_OK);
    *state_out = out;
    lt_step_graph_free(ctx, g);
    lt_free(ctx, LT_DEVICE_CUDA, mm, nb);
    lt_free(ctx, LT_DEVICE_CUDA, vv, nb);
    lt_model_free(ctx, m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void moe_aux_step_replays(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/moe/qwen3moe_hd64", lt_test_source_dir());
    lt_model_options mo = {.device = LT_DEVICE_CUDA};
    lt_lora_options lo = {0};
    lo.rank = 4, lo.alpha = 8, lo.seed = 3;
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &m), LT_OK);
    int64_t n = 0;
    (void)lt_model_lora_params(m, &n);
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
    float *init = malloc((size_t)n * sizeof(float)), *eager = NULL, *graph = NULL;
    lt_test_fill_normal(&rng, init, n, 0.05f);
    uint64_t seed = lt_test_rand_u64(&rng);
    double le[MOE_STEPS], lg[MOE_STEPS], ae[MOE_STEPS], ag[MOE_STEPS];
    lt_step_graph_stats se, sg;
    moe_run_steps(0, init, seed, le, ae, &eager, &se);
    moe_run_steps(1, init, seed, lg, ag, &graph, &sg);
    fprintf(stderr, "  moe aux: graph %lld replayed, %lld captured, %lld eager%s%s\n", (long long)sg.replays,
            (long long)sg.captures, (long long)sg.eager, sg.why_off[0] ? "; off: " : "", sg.why_off);
    for (int k = 0; k < MOE_STEPS; k++) {
        fprintf(stderr, "    step %d: loss %.9f eager %.9f, aux %.9f eager %.9f\n", k + 1, lg[k], le[k], ag[k], ae[k]);
        assert_true(lg[k] == le[k]);
        assert_true(ag[k] == ae[k]);
    }
    assert_string_equal(sg.why_off, "");
    assert_int_equal(sg.eager, 2);
    assert_int_equal(sg.captures, 2);
    assert_int_equal(sg.replays, 3);
    assert_memory_equal(graph, eager, (size_t)(3 * n) * sizeof(float));
    free(init), free(eager), free(graph);
}

/* The trainer end to end on packed rows of 32 tokens (2 to 4 examples of 8 to 15 tokens each, so
 * S pads to 2 or 4 and most steps repeat the step before's shape); evaluation runs between steps.
 * Same adapter and losses as --cuda-graph off, to the bit. */
static void trainer_graph_on_equals_off(void **state) {
    (void)state;
    uint64_t ds = 29;
    lt_test_dataset train, valid;
    lt_test_dataset_make(&train, 48, V, 8, 8, &ds);
    lt_test_dataset_make(&valid, 8, V, 8, 8, &ds);
    double loss[2][STEPS];
    float *final[2] = {NULL, NULL};
    int64_t n = 0;
    for (int on = 0; on < 2; on++) {
        char dir[256];
        snprintf(dir, sizeof dir, "/tmp/lt_test_cuda_graph_%ld_run%d", (long)getpid(), on);
        lt_train_options in, o;
        memset(&in, 0, sizeof in);
        snprintf(in.model, sizeof in.model, "%s", model_dir);
        snprintf(in.data, sizeof in.data, "(in memory)");
        snprintf(in.adapter_path, sizeof in.adapter_path, "%s", dir);
        snprintf(in.cuda_graph, sizeof in.cuda_graph, "%s", on ? "on" : "off");
        in.iters = STEPS, in.batch_size = 2, in.max_seq_length = 32, in.learning_rate = 5e-3, in.warmup = 2;
        in.lora_rank = 4, in.lora_alpha = 8, in.grad_clip = 0.5, in.weight_decay = 0.01;
        in.steps_per_eval = 3, in.save_every = 100, in.val_batches = -1, in.seed = 5, in.threads = 2;
        in.device = LT_DEVICE_CUDA;
        lt_ctx *ctx = lt_ctx_new();
        assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
        lt_lora_options lora;
        assert_int_equal(lt_train_lora_options(ctx, &o, &lora), LT_OK);
        lt_model_options mo = {.device = LT_DEVICE_CUDA};
        lt_model *m = NULL;
        assert_int_equal(lt_model_load(ctx, model_dir, &mo, &lora, &m), LT_OK);
        lt_train_result res;
        memset(&res, 0, sizeof res);
        res.step_loss = loss[on];
        lt_status s = lt_train_fit(ctx, &o, m, &train.in, &valid.in, devnull, &res);
        if (s != LT_OK) fprintf(stderr, "fit (graph %d): %s\n", on, lt_ctx_error(ctx));
        assert_int_equal(s, LT_OK);
        assert_int_equal(res.plan_bytes, res.peak_bytes); /* the plan is still the high-water */
        (void)lt_model_lora_params(m, &n);
        final[on] = malloc((size_t)n * sizeof(float));
        assert_int_equal(lt_model_lora_get(ctx, m, 0, 0, n, final[on]), LT_OK);
        fprintf(stderr, "  trainer graph %s: loss %.6f -> %.6f, val %.4f -> %.4f\n", on ? "on " : "off", loss[on][0],
                loss[on][STEPS - 1], res.first_val_loss, res.last_val_loss);
        lt_model_free(ctx, m);
        lt_ctx_free(ctx);
        lt_test_rm_adapter_dir(dir);
    }
    for (int k = 0; k < STEPS; k++) assert_true(loss[0][k] == loss[1][k]);
    assert_memory_equal(final[0], final[1], (size_t)n * sizeof(float));
    free(final[0]), free(final[1]);
    lt_test_dataset_free(&train);
    lt_test_dataset_free(&valid);
}

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    devnull = fopen("/dev/null", "w");
    /* dQ without atomics: eager runs repeat to the bit */
    const lt_attn_cuda_tuning force = {.dq = LT_ATTN_DQ_SEP};
    lt_attn_cuda_tuning_set(&force);
    write_model();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    lt_test_rm_model_dir(model_dir);
    if (devnull) fclose(devnull);
    return 0;
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replay_is_bit_identical),
        cmocka_unit_test(shape_change_falls_back),
        cmocka_unit_test(trainer_graph_on_equals_off),
        cmocka_unit_test(moe_aux_step_replays),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#else

int main(void) { return lt_test_cuda_skip(); }

#endif
