/* The trainer's pieces that need no model: options (flags and JSON config), the learning-rate
 * schedule, checkpoints (round trip, truncated/corrupted files, mismatched runs), the metrics log
 * and the stop request. Whole training runs are tested in test_train_run.c. */
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
#include "longtune/alloc.h"
#include "longtune/train.h"

static uint64_t rng;

static void tmp_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "/tmp/lt_test_train_%ld_%s", (long)getpid(), name);
}

static lt_train_options base_options(void) {
    lt_train_options o;
    memset(&o, 0, sizeof o);
    snprintf(o.model, sizeof o.model, "m.gguf");
    snprintf(o.data, sizeof o.data, "d");
    return o;
}

static void options_defaults_and_flags(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options in = base_options(), o;
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_int_equal(o.iters, 1000);
    assert_int_equal(o.batch_size, 4);
    assert_int_equal(o.lora_rank, 8);
    assert_string_equal(o.adapter_path, "adapters");
    assert_string_equal(o.lora_targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    assert_int_equal(o.attention, LT_ATTENTION_FLASH);
    assert_int_equal(o.loss, LT_LCE_FUSED);
    /* Both spellings of a key; short target names normalise and deduplicate. */
    assert_int_equal(lt_train_options_set(ctx, &in, "learning-rate", "2e-4"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "max_seq_length", "512"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "lora-targets", "q, v,q_proj"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute", "every:3"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "lr-schedule", "cosine"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "seed", "18446744073709551615"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_true(o.learning_rate == 2e-4);
    assert_int_equal(o.max_seq_length, 512);
    assert_string_equal(o.lora_targets, "q_proj,v_proj");
    assert_int_equal(o.recompute, LT_RECOMPUTE_EVERY_K);
    assert_int_equal(o.recompute_every, 3);
    assert_int_equal(o.lr_schedule, LT_LR_SCHEDULE_COSINE);
    assert_true(o.seed == UINT64_MAX);
    assert_string_equal(o.cuda_graph, "on"); /* the default */
    assert_int_equal(lt_train_options_set(ctx, &in, "cuda-graph", "off"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_string_equal(o.cuda_graph, "off");
    assert_int_equal(lt_train_options_set(ctx, &in, "cuda-graph", "maybe"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "cuda_graph"));
    assert_int_equal(lt_train_options_set(ctx, &in, "cuda-graph", "on"), LT_OK);
    assert_int_equal(o.recompute_attention, 0); /* the default: attention kept */
    assert_int_equal(lt_train_option_kind_of("recompute-attention"), LT_TRAIN_OPTION_BOOL);
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute-attention", "true"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_int_equal(o.recompute_attention, 1);
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute-attention", "false"), LT_OK);
    assert_int_equal(lt_train_option_kind_of("mask-prompt"), LT_TRAIN_OPTION_BOOL);
    assert_int_equal(lt_train_option_kind_of("iters"), LT_TRAIN_OPTION_VALUE);
    assert_int_equal(lt_train_option_kind_of("nope"), LT_TRAIN_OPTION_UNKNOWN);
    /* Bad values are typed errors naming the option. */
    assert_int_equal(lt_train_options_set(ctx, &in, "iters", "12x"), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "iters"));
    assert_int_equal(lt_train_options_set(ctx, &in, "batch-size", "0"), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute", "every:0"), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_train_options_set(ctx, &in, "lr-schedule", "linear"), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_train_options_set(ctx, &in, "seed", "-1"), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_train_options_set(ctx, &in, "frobnicate", "1"), LT_ERR_NOT_FOUND);
    assert_int_equal(lt_train_options_set(ctx, &in, "lora-targets", "q,lm_head"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "lm_head"));
    lt_train_options none;
    memset(&none, 0, sizeof none);
    assert_int_equal(lt_train_options_resolve(ctx, &none, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "model"));
    lt_ctx_free(ctx);
}

/* The curriculum resolves to stages at ceil(p · iters) and sets max_seq_length to the longest;
 * malformed, non-monotone or contradictory curricula are refused naming the problem. */
static void curriculum_options(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options in = base_options(), o;
    in.iters = 100;
    assert_int_equal(lt_train_options_set(ctx, &in, "seq-len-curriculum", "0:2048,0.3:8192,0.705:32768"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_int_equal(o.n_stages, 3);
    assert_int_equal(o.max_seq_length, 32768);
    assert_int_equal(o.stage_step[1], 30);
    assert_int_equal(o.stage_step[2], 71);
    assert_int_equal(lt_train_seq_len_at(&o, 0), 2048);
    assert_int_equal(lt_train_seq_len_at(&o, 29), 2048);
    assert_int_equal(lt_train_seq_len_at(&o, 30), 8192);
    assert_int_equal(lt_train_seq_len_at(&o, 70), 8192);
    assert_int_equal(lt_train_seq_len_at(&o, 71), 32768);
    /* Resolving a resolved run changes nothing. */
    lt_train_options again;
    assert_int_equal(lt_train_options_resolve(ctx, &o, &again), LT_OK);
    assert_memory_equal(&o, &again, sizeof o);
    /* Without a curriculum every step has max_seq_length. */
    lt_train_options plain = base_options(), p;
    assert_int_equal(lt_train_options_resolve(ctx, &plain, &p), LT_OK);
    assert_int_equal(p.n_stages, 0);
    assert_int_equal(lt_train_seq_len_at(&p, 5), p.max_seq_length);
    static const struct {
        const char *value, *msg;
    } bad[] = {
        {"0.1:2048,0.5:4096", "progress 0"},
        {"0:2048,0.5:1024", "must not fall"},
        {"0:2048,0.5:4096,0.4:8192", "rise"},
        {"0:2048,1:4096", "rise"},
        {"0:2048,0.5", "progress:length"},
        {"0:2048,0.5:4k", "not an integer"},
        {"0:1", "outside"},
        {"0:2048,", "trailing"},
        {"nan:2048", "progress:length"},
        {"0:2048,0.5:-4", "no length"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lt_train_options b = base_options();
        assert_int_equal(lt_train_options_set(ctx, &b, "seq-len-curriculum", bad[i].value), LT_OK);
        assert_int_equal(lt_train_options_resolve(ctx, &b, &o), LT_ERR_INVALID_ARG);
        if (!strstr(lt_ctx_error(ctx), bad[i].msg)) fprintf(stderr, "%s: %s\n", bad[i].value, lt_ctx_error(ctx));
        assert_non_null(strstr(lt_ctx_error(ctx), bad[i].msg));
        assert_non_null(strstr(lt_ctx_error(ctx), "seq_len_curriculum"));
    }
    /* An explicit max_seq_length must be the longest stage's. */
    lt_train_options b = base_options();
    assert_int_equal(lt_train_options_set(ctx, &b, "seq-len-curriculum", "0:512,0.5:1024"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &b, "max-seq-length", "2048"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &b, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "max_seq_length"));
    assert_int_equal(lt_train_options_set(ctx, &b, "max-seq-length", "1024"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &b, &o), LT_OK);
    /* Seventeen stages are too many. */
    char many[256] = "0:64";
    for (int k = 1; k < 17; k++) snprintf(many + strlen(many), sizeof many - strlen(many), ",0.%02d:64", k * 5);
    assert_int_equal(lt_train_options_set(ctx, &b, "seq-len-curriculum", many), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &b, "max-seq-length", "64"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &b, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "more than 16"));
    lt_ctx_free(ctx);
}

/* The small Qwen3 config the recompute auto tests plan. */
static lt_model_config auto_config(void) {
    lt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = LT_ARCH_QWEN3, c.V = 4096, c.C = 256, c.F = 768, c.L = 8, c.H = 4, c.Hkv = 2, c.D = 64;
    c.rope_theta = 1e6, c.rms_eps = 1e-6f, c.qk_norm = 1, c.bos_id = c.eos_id = -1;
    for (int p = 0; p < LT_PROJ_COUNT_; p++) c.proj_dtype[p] = LT_DTYPE_F32;
    c.embed_dtype = c.head_dtype = LT_DTYPE_F32;
    return c;
}

/* recompute auto with the chunk given picks the first candidate, in order of recompute work, whose
 * plan fits: with a budget equal to each candidate's own plan, the choice is the first candidate at
 * or below it, the chunk as given (one rerunning attention may rerun it in only the fewest layers
 * that fit the budget), or an earlier candidate keeping attention with it rerun in the fewest of
 * its layers that fit; a budget below every plan is LT_ERR_OOM naming the smallest. */
static void recompute_auto_choice(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config c = auto_config();
    lt_train_options in = base_options(), o;
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute", "auto"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "max-seq-length", "1024"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "chunk-rows", "4096"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_int_equal(o.recompute_auto, 1);
    lt_plan_options po;
    assert_int_equal(lt_train_plan_options(ctx, &o, 1, 1, &po), LT_OK);
    /* The candidates' own plans, in the chooser's order: by cost, recompute work over the step's
     * (every layer 0.29 of this step, rerunning attention 0.10 more) plus 0.08·log2 k for segments. */
    static const struct {
        lt_recompute r;
        int64_t k;
        int rerun;
    } cand[] = {{LT_RECOMPUTE_NONE, 0, 0},   {LT_RECOMPUTE_EVERY, 1, 0},   {LT_RECOMPUTE_EVERY_K, 2, 0},
                {LT_RECOMPUTE_EVERY, 1, 1},  {LT_RECOMPUTE_EVERY_K, 4, 0}, {LT_RECOMPUTE_EVERY_K, 2, 1},
                {LT_RECOMPUTE_EVERY_K, 4, 1}};
    enum { NC = sizeof cand / sizeof cand[0] };
    size_t peak[NC], smallest = SIZE_MAX;
    for (int i = 0; i < NC; i++) {
        lt_train_options ci = o;
        ci.recompute_auto = 0, ci.recompute = cand[i].r, ci.recompute_every = cand[i].k > 1 ? cand[i].k : 0;
        ci.recompute_attention = cand[i].rerun;
        lt_plan_options pi;
        assert_int_equal(lt_train_plan_options(ctx, &ci, 1, 1, &pi), LT_OK);
        lt_plan p;
        assert_int_equal(lt_train_plan(ctx, &ci, &c, &pi, NULL, &p), LT_OK);
        peak[i] = p.peak_bytes;
        if (peak[i] < smallest) smallest = peak[i];
    }
    assert_true(peak[1] < peak[0]); /* recompute saves memory at this shape */
    assert_true(peak[3] < peak[1]); /* so does rerunning attention */
    for (int i = 0; i < NC; i++) {
        int want = 0;
        while (peak[want] > peak[i]) want++;
        lt_train_options chosen;
        lt_plan p;
        assert_int_equal(lt_train_choose_recompute(ctx, &o, &c, &po, NULL, peak[i], &chosen, &p), LT_OK);
        assert_int_equal(chosen.recompute_auto, 0);
        assert_int_equal(chosen.chunk_rows, 4096);
        assert_true(p.peak_bytes <= peak[i]);
        int from = want; /* the candidate chosen: the first that fits, or an earlier one below */
        for (int j = 0; j < want; j++)
            if (!cand[j].rerun && chosen.recompute == cand[j].r &&
                chosen.recompute_every == (cand[j].k > 1 ? cand[j].k : 0))
                from = j;
        if (from == want) {
            assert_int_equal(chosen.recompute, cand[want].r);
            if (cand[want].r == LT_RECOMPUTE_EVERY_K) assert_int_equal(chosen.recompute_every, cand[want].k);
            if (!cand[want].rerun || chosen.recompute_attention) {
                assert_int_equal(chosen.recompute_attention, cand[want].rerun);
                assert_int_equal(chosen.recompute_attention_layers, 0);
                assert_int_equal(p.peak_bytes, peak[want]);
                continue;
            }
            assert_true(p.peak_bytes > peak[want]); /* above its plan with attention rerun everywhere */
        }
        /* attention rerun in only some of the layers, the fewest that fit: of the first candidate
         * that fits, or of an earlier one keeping attention, whose estimate plus those layers'
         * attention is below the first fitting one's */
        assert_int_equal(chosen.recompute_attention, 0);
        assert_true(chosen.recompute_attention_layers > 0 && chosen.recompute_attention_layers < c.L);
        lt_train_options fewer = chosen;
        fewer.recompute_attention_layers--;
        lt_plan_options pf;
        assert_int_equal(lt_train_plan_options(ctx, &fewer, 1, 1, &pf), LT_OK);
        lt_plan pp;
        assert_int_equal(lt_train_plan(ctx, &fewer, &c, &pf, NULL, &pp), LT_OK);
        assert_true(pp.peak_bytes > peak[i]);
    }
    lt_train_options chosen;
    assert_int_equal(lt_train_choose_recompute(ctx, &o, &c, &po, NULL, smallest - 1, &chosen, NULL), LT_ERR_OOM);
    assert_non_null(strstr(lt_ctx_error(ctx), "no policy fits"));
    /* The trainer refuses an unchosen auto; grad_checkpoint or offload beside auto is refused. */
    lt_train_options b = in;
    assert_int_equal(lt_train_options_set(ctx, &b, "grad-checkpoint", "true"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &b, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "auto"));
    assert_int_equal(lt_train_options_set(ctx, &b, "recompute", "none"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &b, &o), LT_OK);
    assert_int_equal(o.recompute_auto, 0);
    lt_ctx_free(ctx);
}

/* Without a given chunk, recompute auto also halves the chunk of the position-wise work (down to
 * 1,024 rows, below B·T): a budget that only a smaller chunk meets without recompute gets recompute
 * none at the largest chunk that meets it (cheaper than recomputing every layer); plans do not grow
 * as the chunk shrinks, and stop shrinking once attention's and the loss's workspaces, which share
 * the chunk buffers' place, are the larger; a given chunk is never changed; a bad chunk_rows is
 * refused by name. */
static void recompute_auto_halves_the_chunk(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config c = auto_config();
    lt_train_options in = base_options(), o;
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute", "auto"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "max-seq-length", "2048"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "batch-size", "4"), LT_OK); /* 8,192 rows */
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_int_equal(o.chunk_rows, 0);
    size_t none[4]; /* recompute none at chunks of 8192 (the default), 4096, 2048, 1024 rows */
    for (int i = 0; i < 4; i++) {
        lt_train_options ci = o;
        ci.recompute_auto = 0, ci.recompute = LT_RECOMPUTE_NONE, ci.chunk_rows = i ? 8192 >> i : 0;
        lt_plan_options pi;
        assert_int_equal(lt_train_plan_options(ctx, &ci, 1, 1, &pi), LT_OK);
        assert_int_equal(pi.run.chunk_rows, ci.chunk_rows);
        lt_plan p;
        assert_int_equal(lt_train_plan(ctx, &ci, &c, &pi, NULL, &p), LT_OK);
        none[i] = p.peak_bytes;
        if (i) assert_true(none[i] <= none[i - 1]);
    }
    assert_true(none[1] < none[0] && none[3] < none[0]);
    lt_plan_options po;
    assert_int_equal(lt_train_plan_options(ctx, &o, 1, 1, &po), LT_OK);
    for (int i = 0; i < 4; i++) {
        lt_train_options chosen;
        lt_plan p;
        assert_int_equal(lt_train_choose_recompute(ctx, &o, &c, &po, NULL, none[i], &chosen, &p), LT_OK);
        int j = i; /* the largest chunk whose plan meets none[i] */
        while (j > 0 && none[j - 1] <= none[i]) j--;
        assert_int_equal(chosen.recompute, LT_RECOMPUTE_NONE);
        assert_int_equal(chosen.chunk_rows, j ? 8192 >> j : 0);
        assert_true(p.peak_bytes == none[j]);
    }
    /* Given, the chunk stays: below none's plan at it, auto recomputes instead. */
    lt_train_options g = in;
    assert_int_equal(lt_train_options_set(ctx, &g, "chunk-rows", "8192"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &g, &o), LT_OK);
    assert_int_equal(lt_train_plan_options(ctx, &o, 1, 1, &po), LT_OK);
    lt_train_options chosen;
    assert_int_equal(lt_train_choose_recompute(ctx, &o, &c, &po, NULL, none[3], &chosen, NULL), LT_OK);
    assert_int_equal(chosen.chunk_rows, 8192);
    assert_int_not_equal(chosen.recompute, LT_RECOMPUTE_NONE);
    /* Out of range: named. */
    assert_int_equal(lt_train_options_set(ctx, &g, "chunk-rows", "0"), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "chunk-rows"));
    lt_ctx_free(ctx);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void options_config_file_then_flags(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char path[256];
    tmp_path(path, sizeof path, "config.json");
    write_text(path,
               "{\n \"model\": \"x.gguf\", \"data\": \"dd\", \"iters\": 50, \"learning_rate\": 0.001,\n"
               " \"mask_prompt\": true, \"lora_targets\": [\"q\", \"down\"], \"warmup\": 5\n}\n");
    lt_train_options in, o;
    memset(&in, 0, sizeof in);
    assert_int_equal(lt_train_options_load_json(ctx, &in, path), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "iters", "70"), LT_OK); /* a flag overrides */
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_string_equal(o.model, "x.gguf");
    assert_int_equal(o.iters, 70);
    assert_true(o.learning_rate == 0.001);
    assert_int_equal(o.mask_prompt, 1);
    assert_int_equal(o.warmup, 5);
    assert_string_equal(o.lora_targets, "q_proj,down_proj");
    /* Malformed JSON names the line; an unknown key and a bad value name the key. */
    write_text(path, "{\n \"iters\": 5,\n \"seed\": ,\n}\n");
    assert_int_equal(lt_train_options_load_json(ctx, &in, path), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), ":3:"));
    write_text(path, "{\"iterz\": 5}");
    assert_int_equal(lt_train_options_load_json(ctx, &in, path), LT_ERR_NOT_FOUND);
    assert_non_null(strstr(lt_ctx_error(ctx), "iterz"));
    write_text(path, "{\"batch_size\": -3}");
    assert_int_equal(lt_train_options_load_json(ctx, &in, path), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "batch_size"));
    write_text(path, "[1, 2]");
    assert_int_equal(lt_train_options_load_json(ctx, &in, path), LT_ERR_FORMAT);
    unlink(path);
    assert_int_equal(lt_train_options_load_json(ctx, &in, path), LT_ERR_IO);
    lt_ctx_free(ctx);
}

static void schedule_values(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options in = base_options(), o;
    in.iters = 110;
    in.warmup = 10;
    in.learning_rate = 1e-3;
    in.min_lr = 1e-4;
    in.lr_schedule = LT_LR_SCHEDULE_COSINE;
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    /* Warmup: linear, reaching the peak at its last step. */
    assert_true(fabs(lt_train_lr(&o, 0) - 1e-4) < 1e-15);
    assert_true(fabs(lt_train_lr(&o, 4) - 5e-4) < 1e-15);
    assert_true(fabs(lt_train_lr(&o, 9) - 1e-3) < 1e-15);
    /* Cosine over the 100 steps after warmup: peak, midpoint, and monotone down to near min_lr. */
    assert_true(fabs(lt_train_lr(&o, 10) - 1e-3) < 1e-15);
    assert_true(fabs(lt_train_lr(&o, 60) - 5.5e-4) < 1e-12);
    double prev = 1;
    for (int64_t s = 10; s < 110; s++) {
        double lr = lt_train_lr(&o, s);
        assert_true(lr <= prev && lr > 1e-4);
        prev = lr;
    }
    double want_last = 1e-4 + 0.5 * 9e-4 * (1 + cos(3.14159265358979323846 * 0.99));
    assert_true(fabs(lt_train_lr(&o, 109) - want_last) < 1e-15);
    o.lr_schedule = LT_LR_SCHEDULE_CONSTANT;
    assert_true(lt_train_lr(&o, 50) == 1e-3 && lt_train_lr(&o, 109) == 1e-3);
    assert_true(fabs(lt_train_lr(&o, 2) - 3e-4) < 1e-15);
    lt_ctx_free(ctx);
}

/* A small param set with its storage: A (r, in), B (out, r) per module. */
typedef struct {
    lt_train_param p[4];
    float *mem;
} pset;

static void pset_make(pset *s, int64_t r) {
    const char *names[4] = {"model.layers.0.self_attn.q_proj.lora_A", "model.layers.0.self_attn.q_proj.lora_B",
                            "model.layers.1.mlp.down_proj.lora_A", "model.layers.1.mlp.down_proj.lora_B"};
    const int64_t shapes[4][2] = {{r, 16}, {24, r}, {r, 40}, {16, r}};
    int64_t total = 0;
    for (int i = 0; i < 4; i++) total += shapes[i][0] * shapes[i][1];
    s->mem = malloc((size_t)total * 4 * sizeof(float));
    lt_test_fill_normal(&rng, s->mem, total * 4, 1.0f);
    int64_t at = 0;
    for (int i = 0; i < 4; i++) {
        lt_train_param *p = &s->p[i];
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "%s", names[i]);
        p->ndim = 2;
        p->shape[0] = shapes[i][0];
        p->shape[1] = shapes[i][1];
        int64_t n = shapes[i][0] * shapes[i][1];
        p->data = s->mem + at;
        p->m = s->mem + at + n;
        p->v = s->mem + at + 2 * n;
        p->grad = s->mem + at + 3 * n;
        at += 4 * n;
    }
}

static int64_t pset_floats(const pset *s) {
    int64_t n = 0;
    for (int i = 0; i < 4; i++) n += 4 * lt_train_param_numel(&s->p[i]);
    return n;
}

static void checkpoint_round_trip(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options in = base_options(), o;
    in.lora_rank = 4;
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    pset a, b;
    pset_make(&a, 4);
    pset_make(&b, 4);
    lt_train_state st = {.step = 37,
                         .rng = {1, 2, 3, UINT64_MAX},
                         .data_epoch = 2,
                         .data_cursor = 11,
                         .tokens_seen = 123456,
                         .elapsed_s = 9.5};
    char path[256];
    tmp_path(path, sizeof path, "ckpt.bin");
    assert_int_equal(lt_checkpoint_save(ctx, path, &o, &st, a.p, 4), LT_OK);
    lt_train_state got;
    memset(&got, 0, sizeof got);
    assert_int_equal(lt_checkpoint_load(ctx, path, &o, &got, b.p, 4), LT_OK);
    assert_memory_equal(&got, &st, sizeof st);
    for (int i = 0; i < 4; i++) {
        size_t bytes = (size_t)lt_train_param_numel(&a.p[i]) * sizeof(float);
        assert_memory_equal(a.p[i].data, b.p[i].data, bytes);
        assert_memory_equal(a.p[i].m, b.p[i].m, bytes);
        assert_memory_equal(a.p[i].v, b.p[i].v, bytes);
    }
    /* The loaded checkpoint accounts its buffer and frees it. */
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    free(a.mem);
    free(b.mem);
    unlink(path);
    lt_ctx_free(ctx);
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static void checkpoint_bad_files_change_nothing(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options in = base_options(), o;
    in.lora_rank = 4;
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    pset a, b;
    pset_make(&a, 4);
    pset_make(&b, 4);
    float *before = malloc((size_t)pset_floats(&b) * sizeof(float));
    memcpy(before, b.mem, (size_t)pset_floats(&b) * sizeof(float));
    lt_train_state st = {.step = 5, .rng = {9, 8, 7, 6}}, got = {.step = -1};
    char path[256];
    tmp_path(path, sizeof path, "ckpt_bad.bin");
    assert_int_equal(lt_checkpoint_save(ctx, path, &o, &st, a.p, 4), LT_OK);
    long size = file_size(path);
    FILE *f = fopen(path, "rb");
    unsigned char *bytes = malloc((size_t)size);
    assert_int_equal(fread(bytes, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    /* Truncated at random points, and single flipped bytes anywhere: LT_ERR_FORMAT, nothing written. */
    for (int trial = 0; trial < 40; trial++) {
        long cut = (long)(lt_test_rand_u64(&rng) % (uint64_t)size);
        f = fopen(path, "wb");
        fwrite(bytes, 1, (size_t)cut, f);
        fclose(f);
        assert_int_equal(lt_checkpoint_load(ctx, path, &o, &got, b.p, 4), LT_ERR_FORMAT);
        long at = (long)(lt_test_rand_u64(&rng) % (uint64_t)size);
        bytes[at] ^= (unsigned char)(1u << (lt_test_rand_u64(&rng) % 8));
        f = fopen(path, "wb");
        fwrite(bytes, 1, (size_t)size, f);
        fclose(f);
        assert_int_equal(lt_checkpoint_load(ctx, path, &o, &got, b.p, 4), LT_ERR_FORMAT);
        /* Restore the good file and bytes for the next trial. */
        assert_int_equal(lt_checkpoint_save(ctx, path, &o, &st, a.p, 4), LT_OK);
        f = fopen(path, "rb");
        assert_int_equal(fread(bytes, 1, (size_t)size, f), (size_t)size);
        fclose(f);
    }
    assert_int_equal(got.step, -1);
    assert_memory_equal(before, b.mem, (size_t)pset_floats(&b) * sizeof(float));
    /* A different run: rank (shape and option), learning rate, layout. */
    lt_train_options o2 = o;
    o2.learning_rate = 3e-4;
    assert_int_equal(lt_checkpoint_load(ctx, path, &o2, &got, b.p, 4), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "learning_rate"));
    snprintf(b.p[2].name, sizeof b.p[2].name, "model.layers.1.mlp.up_proj.lora_A");
    assert_int_equal(lt_checkpoint_load(ctx, path, &o, &got, b.p, 4), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "up_proj"));
    assert_int_equal(lt_checkpoint_load(ctx, path, &o, &got, b.p, 3), LT_ERR_INVALID_ARG);
    pset c;
    pset_make(&c, 2);
    o2 = o;
    o2.lora_rank = 2;
    assert_int_equal(lt_checkpoint_load(ctx, path, &o2, &got, c.p, 4), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "lora_rank"));
    assert_int_equal(got.step, -1);
    /* A missing file is an I/O error; the atomic writer left no temp file behind. */
    unlink(path);
    assert_int_equal(lt_checkpoint_load(ctx, path, &o, &got, b.p, 4), LT_ERR_IO);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_int_not_equal(access(tmp, F_OK), 0);
    free(bytes);
    free(before);
    free(a.mem);
    free(b.mem);
    free(c.mem);
    lt_ctx_free(ctx);
}

static void metrics_lines_and_resume_truncation(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char path[256];
    tmp_path(path, sizeof path, "metrics.jsonl");
    lt_metrics *m;
    assert_int_equal(lt_metrics_open(ctx, path, -1, &m), LT_OK);
    for (int s = 1; s <= 6; s++) {
        lt_metrics_record r = {.step = s,
                               .train_loss = 3.0 - 0.1 * s,
                               .val_loss = s % 3 ? NAN : 2.5,
                               .learning_rate = 1e-4,
                               .tokens_per_s = 100,
                               .tokens = 10 * s,
                               .elapsed_s = s,
                               .peak_bytes = 4096,
                               .plan_bytes = -1};
        assert_int_equal(lt_metrics_write(ctx, m, &r), LT_OK);
    }
    lt_metrics_close(ctx, m);
    char line[512];
    FILE *f = fopen(path, "r");
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        assert_non_null(strstr(line, "\"train_loss\":"));
        assert_non_null(strstr(line, "\"peak_bytes\":4096"));
        assert_null(strstr(line, "plan_bytes"));
        assert_int_equal(strstr(line, "val_loss") != NULL, n % 3 == 0);
    }
    fclose(f);
    assert_int_equal(n, 6);
    /* Resume at step 4: records 5 and 6 go, new ones append. */
    assert_int_equal(lt_metrics_open(ctx, path, 4, &m), LT_OK);
    lt_metrics_record r = {.step = 5,
                           .train_loss = 1,
                           .val_loss = NAN,
                           .learning_rate = NAN,
                           .tokens_per_s = NAN,
                           .tokens = -1,
                           .elapsed_s = NAN,
                           .peak_bytes = -1,
                           .plan_bytes = -1};
    assert_int_equal(lt_metrics_write(ctx, m, &r), LT_OK);
    lt_metrics_close(ctx, m);
    f = fopen(path, "r");
    n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        if (n == 5) assert_string_equal(line, "{\"step\":5,\"train_loss\":1}\n");
    }
    fclose(f);
    assert_int_equal(n, 5);
    unlink(path);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void stop_request(void **state) {
    (void)state;
    lt_train_clear_stop();
    assert_int_equal(lt_train_stop_requested(), 0);
    lt_train_request_stop(15);
    assert_int_equal(lt_train_stop_requested(), 15);
    lt_train_clear_stop();
    assert_int_equal(lt_train_stop_requested(), 0);
}

int main(void) {
    rng = lt_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(options_defaults_and_flags),
        cmocka_unit_test(options_config_file_then_flags),
        cmocka_unit_test(schedule_values),
        cmocka_unit_test(curriculum_options),
        cmocka_unit_test(recompute_auto_choice),
        cmocka_unit_test(recompute_auto_halves_the_chunk),
        cmocka_unit_test(checkpoint_round_trip),
        cmocka_unit_test(checkpoint_bad_files_change_nothing),
        cmocka_unit_test(metrics_lines_and_resume_truncation),
        cmocka_unit_test(stop_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
