/* Whole training runs on a tiny random Llama written as a Hugging Face folder: a short run lowers
 * the training and validation loss and writes metrics, checkpoint and PEFT adapter; a run stopped
 * part-way and resumed from its checkpoint reproduces the uninterrupted run bit for bit (losses and
 * final LoRA weights), with dropout, accumulation, clipping, warmup and cosine all on; the saved
 * adapter loads back into a fresh model. The real-model QLoRA check is test_train_real.c. */
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

static uint64_t rng;
static char model_dir[256];
static FILE *devnull;

enum { V = 64, C = 32, F = 48, L = 2, H = 4, HKV = 2, D = 8 };

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A random f32 Llama (untied head) as config.json + model.safetensors. */
static void make_model(void) {
    snprintf(model_dir, sizeof model_dir, "/tmp/lt_test_train_run_%ld_model", (long)getpid());
    mkdir(model_dir, 0755);
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d,"
             " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"max_position_embeddings\": 256,"
             " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
             " \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}",
             V, C, F, L, H, HKV);
    write_file(path, cfg);
    enum { NT = 3 + 9 * L };
    lt_safetensors_entry e[NT];
    char names[NT][96];
    float *bufs[NT];
    int n = 0;
    struct {
        const char *fmt;
        int64_t r, c;
    } per_layer[9] = {
        {"model.layers.%d.input_layernorm.weight", C, 0},
        {"model.layers.%d.self_attn.q_proj.weight", H * D, C},
        {"model.layers.%d.self_attn.k_proj.weight", HKV * D, C},
        {"model.layers.%d.self_attn.v_proj.weight", HKV * D, C},
        {"model.layers.%d.self_attn.o_proj.weight", C, H * D},
        {"model.layers.%d.post_attention_layernorm.weight", C, 0},
        {"model.layers.%d.mlp.gate_proj.weight", F, C},
        {"model.layers.%d.mlp.up_proj.weight", F, C},
        {"model.layers.%d.mlp.down_proj.weight", C, F},
    };
    for (int t = 0; t < NT; t++) {
        int64_t r, c;
        int norm = 0;
        if (t == 0) snprintf(names[t], 96, "model.embed_tokens.weight"), r = V, c = C;
        else if (t == 1) snprintf(names[t], 96, "model.norm.weight"), r = C, c = 0, norm = 1;
        else if (t == 2) snprintf(names[t], 96, "lm_head.weight"), r = V, c = C;
        else {
            int l = (t - 3) / 9, k = (t - 3) % 9;
            snprintf(names[t], 96, per_layer[k].fmt, l);
            r = per_layer[k].r;
            c = per_layer[k].c;
            norm = c == 0;
        }
        int64_t numel = c ? r * c : r;
        bufs[t] = malloc((size_t)numel * sizeof(float));
        if (norm)
            for (int64_t i = 0; i < numel; i++) bufs[t][i] = 1.0f + 0.1f * (float)lt_test_normal(&rng);
        else lt_test_fill_normal(&rng, bufs[t], numel, t == 0 ? 1.0f : 0.15f);
        int64_t shape[2] = {r, c};
        e[n].name = names[t];
        e[n].tensor = lt_tensor_view(bufs[t], LT_DTYPE_F32, LT_DEVICE_CPU, c ? 2 : 1, shape);
        n++;
    }
    lt_ctx *ctx = lt_ctx_new();
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    assert_int_equal(lt_safetensors_write(ctx, path, e, n, NULL, 0), LT_OK);
    lt_ctx_free(ctx);
    for (int t = 0; t < NT; t++) free(bufs[t]);
}

/* Sequences with a learnable rule: tok[i] = (a + i*s) mod V, s in {1, 2, 3}; the first two tokens
 * are a prompt (unsupervised). */
static lt_train_options run_options(const char *adapter_dir) {
    lt_train_options in, o;
    memset(&in, 0, sizeof in);
    snprintf(in.model, sizeof in.model, "%s", model_dir);
    snprintf(in.data, sizeof in.data, "(in memory)");
    snprintf(in.adapter_path, sizeof in.adapter_path, "%s", adapter_dir);
    in.iters = 40;
    in.batch_size = 2;
    in.max_seq_length = 48;
    in.learning_rate = 1e-2;
    in.lora_rank = 4;
    in.lora_alpha = 8;
    in.steps_per_eval = 20;
    in.steps_per_report = 5;
    in.save_every = 20;
    in.val_batches = -1;
    in.seed = 7;
    in.threads = 1;
    lt_ctx *ctx = lt_ctx_new();
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    lt_ctx_free(ctx);
    return o;
}

static lt_model *load(lt_ctx *ctx, const lt_train_options *o) {
    lt_lora_options lora;
    assert_int_equal(lt_train_lora_options(ctx, o, &lora), LT_OK);
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, o->model, &mo, &lora, &m);
    if (s != LT_OK) fprintf(stderr, "load: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    return m;
}

static void short_run_lowers_loss(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/lt_test_train_run_%ld_a", (long)getpid());
    lt_train_options o = run_options(dir);
    o.lr_schedule = LT_LR_SCHEDULE_COSINE;
    o.warmup = 4;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t ds = 11;
    lt_test_dataset train, valid;
    lt_test_dataset_make(&train, 96, V, 6, 14, &ds);
    lt_test_dataset_make(&valid, 16, V, 6, 14, &ds);
    lt_model *m = load(ctx, &o);
    double losses[40];
    lt_train_result res;
    memset(&res, 0, sizeof res);
    res.step_loss = losses;
    lt_status s = lt_train_fit(ctx, &o, m, &train.in, &valid.in, devnull, &res);
    if (s != LT_OK) fprintf(stderr, "fit: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    assert_int_equal(res.steps, 40);
    double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[37] + losses[38] + losses[39]) / 3;
    fprintf(stderr, "train loss %.4f -> %.4f, val loss %.4f -> %.4f, peak %zu plan %zu\n", first, last,
            res.first_val_loss, res.last_val_loss, res.peak_bytes, res.plan_bytes);
    assert_true(isfinite(first) && isfinite(last));
    assert_true(last < 0.8 * first);
    assert_true(res.last_val_loss < 0.9 * res.first_val_loss);
    /* The plan covers what the run held at its peak, apart from the context's small bookkeeping
       (packing plans, which the planner does not see): within 10%. */
    assert_true(res.plan_bytes > 0 && (double)res.peak_bytes < 1.1 * (double)res.plan_bytes + 65536);
    /* Outputs: metrics lines with val_loss at 0, 20, 40; the adapter; the checkpoint. */
    char p[400], line[512];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    int lines = 0, vals = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        vals += strstr(line, "\"val_loss\"") != NULL;
        if (strstr(line, "train_loss")) {
            assert_non_null(strstr(line, "\"learning_rate\""));
            assert_non_null(strstr(line, "\"tokens_per_s\""));
            assert_non_null(strstr(line, "\"peak_bytes\""));
            assert_non_null(strstr(line, "\"plan_bytes\""));
        }
    }
    fclose(f);
    assert_int_equal(vals, 3);
    assert_int_equal(lines, 1 + 8);
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    assert_int_equal(access(p, R_OK), 0);
    snprintf(p, sizeof p, "%s/" LT_TRAIN_CHECKPOINT_FILE, dir);
    assert_int_equal(access(p, R_OK), 0);

    /* The exported adapter loads back into a fresh model and gives the same validation loss. */
    lt_lora_options lora;
    assert_int_equal(lt_peft_read_config(ctx, dir, L, &lora), LT_OK);
    assert_int_equal(lora.rank, 4);
    assert_true(lora.alpha == 8.0f);
    assert_int_equal(lora.targets, LT_LORA_ALL_TARGETS);
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    lt_model *m2 = NULL;
    assert_int_equal(lt_model_load(ctx, model_dir, &mo, &lora, &m2), LT_OK);
    assert_int_equal(lt_peft_load(ctx, dir, m2), LT_OK);
    int64_t n1, n2;
    float *p1 = lt_model_lora_params(m, &n1), *p2 = lt_model_lora_params(m2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(p1, p2, (size_t)n1 * sizeof(float));
    lt_model_free(ctx, m2);

    lt_model_free(ctx, m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_test_rm_adapter_dir(dir);
    lt_test_dataset_free(&train);
    lt_test_dataset_free(&valid);
    lt_ctx_free(ctx);
}

/* An uninterrupted run and one stopped at a random step and resumed give the same losses and
 * adapter; `curriculum` (may be "") is the run's sequence-length curriculum. */
static void resume_case(const char *curriculum) {
    char dir_a[256], dir_b[256];
    snprintf(dir_a, sizeof dir_a, "/tmp/lt_test_train_run_%ld_full", (long)getpid());
    snprintf(dir_b, sizeof dir_b, "/tmp/lt_test_train_run_%ld_split", (long)getpid());
    lt_train_options oa = run_options(dir_a), ob = run_options(dir_b);
    for (lt_train_options *o = &oa; o; o = o == &oa ? &ob : NULL) {
        snprintf(o->seq_len_curriculum, sizeof o->seq_len_curriculum, "%s", curriculum);
        o->iters = 12;
        o->grad_accum = 2;
        o->grad_clip = 0.5;
        o->lora_dropout = 0.1;
        o->weight_decay = 0.01;
        o->lr_schedule = LT_LR_SCHEDULE_COSINE;
        o->warmup = 2;
        o->save_every = 100;
        o->steps_per_eval = 4;
        lt_ctx *rc = lt_ctx_new();
        lt_train_options r;
        assert_int_equal(lt_train_options_resolve(rc, o, &r), LT_OK);
        *o = r; /* the curriculum's stages follow the new iters */
        lt_ctx_free(rc);
    }
    lt_ctx *ctx = lt_ctx_new();
    uint64_t ds = 5;
    lt_test_dataset train, valid;
    lt_test_dataset_make(&train, 20, V, 6, 14, &ds); /* a few batches per epoch, so the run crosses epochs */
    lt_test_dataset_make(&valid, 6, V, 6, 14, &ds);
    double full[12], split[12];
    for (int i = 0; i < 12; i++) full[i] = split[i] = NAN;

    lt_model *m = load(ctx, &oa);
    lt_train_result ra;
    memset(&ra, 0, sizeof ra);
    ra.step_loss = full;
    assert_int_equal(lt_train_fit(ctx, &oa, m, &train.in, &valid.in, devnull, &ra), LT_OK);
    int64_t n;
    float *pa = lt_model_lora_params(m, &n);
    float *want = malloc((size_t)n * sizeof(float));
    memcpy(want, pa, (size_t)n * sizeof(float));
    lt_model_free(ctx, m);

    m = load(ctx, &ob);
    lt_train_result rb;
    memset(&rb, 0, sizeof rb);
    rb.step_loss = split;
    /* Interrupted at a random step (from the printed test seed), evaluation steps included. */
    const int64_t stop = 1 + (int64_t)(lt_test_rand_u64(&rng) % 11);
    rb.stop_at = stop;
    assert_int_equal(lt_train_fit(ctx, &ob, m, &train.in, &valid.in, devnull, &rb), LT_ERR_INTERRUPTED);
    char at[32];
    snprintf(at, sizeof at, "step %lld", (long long)stop);
    assert_non_null(strstr(lt_ctx_error(ctx), at));
    lt_model_free(ctx, m);

    /* A fresh process would start from the base again: load anew, then resume. */
    m = load(ctx, &ob);
    snprintf(ob.resume_adapter_file, sizeof ob.resume_adapter_file, "%s", dir_b); /* the folder will do */
    memset(&rb, 0, sizeof rb);
    rb.step_loss = split;
    lt_status s = lt_train_fit(ctx, &ob, m, &train.in, &valid.in, devnull, &rb);
    if (s != LT_OK) fprintf(stderr, "resume: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    assert_int_equal(rb.start_step, stop);
    assert_int_equal(rb.steps, 12);
    assert_int_equal(rb.tokens, ra.tokens);
    for (int i = 0; i < 12; i++) assert_memory_equal(&full[i], &split[i], sizeof(double));
    float *pb = lt_model_lora_params(m, &n);
    assert_memory_equal(want, pb, (size_t)n * sizeof(float));
    assert_memory_equal(&ra.last_val_loss, &rb.last_val_loss, sizeof(double));
    lt_model_free(ctx, m);

    /* A checkpoint of another run (different rank) is refused before anything changes. */
    lt_train_options oc = ob;
    oc.lora_rank = 2;
    m = load(ctx, &oc);
    memset(&rb, 0, sizeof rb);
    assert_int_equal(lt_train_fit(ctx, &oc, m, &train.in, &valid.in, devnull, &rb), LT_ERR_INVALID_ARG);
    lt_model_free(ctx, m);

    free(want);
    lt_test_rm_adapter_dir(dir_a);
    lt_test_rm_adapter_dir(dir_b);
    lt_test_dataset_free(&train);
    lt_test_dataset_free(&valid);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void resume_is_bit_exact(void **state) {
    (void)state;
    resume_case("");
}

/* Under a curriculum the stage changes (steps 5 and 9 of 12) start new passes over the data; a
 * resume on either side of them reproduces the run. */
static void resume_is_bit_exact_with_curriculum(void **state) {
    (void)state;
    resume_case("0:16,0.4:32,0.7:48");
}

/* Rows follow the stages: the metrics name each window's stage and length, batches never exceed
 * it, and the validation loss is measured at the longest stage's rows throughout. */
static void curriculum_stages_in_metrics(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/lt_test_train_run_%ld_curr", (long)getpid());
    lt_train_options in = run_options(dir), o;
    snprintf(in.seq_len_curriculum, sizeof in.seq_len_curriculum, "0:16,0.5:48");
    in.iters = 20;
    in.max_seq_length = 0;
    lt_ctx *ctx = lt_ctx_new();
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    assert_int_equal(o.max_seq_length, 48);
    assert_int_equal(lt_train_seq_len_at(&o, 0), 16);
    assert_int_equal(lt_train_seq_len_at(&o, 9), 16);
    assert_int_equal(lt_train_seq_len_at(&o, 10), 48);
    uint64_t ds = 3;
    lt_test_dataset train, valid;
    lt_test_dataset_make(&train, 48, V, 6, 14, &ds);
    lt_test_dataset_make(&valid, 8, V, 6, 14, &ds);
    lt_model *m = load(ctx, &o);
    lt_train_result res;
    memset(&res, 0, sizeof res);
    lt_status s = lt_train_fit(ctx, &o, m, &train.in, &valid.in, devnull, &res);
    if (s != LT_OK) fprintf(stderr, "fit: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    char p[400], line[512];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    int short_lines = 0, long_lines = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "train_loss")) continue;
        long long step = atoll(strstr(line, "\"step\":") + 7);
        const char *sl = strstr(line, "\"seq_len\":");
        assert_non_null(sl);
        long long len = atoll(sl + 10);
        assert_int_equal(len, step <= 10 ? 16 : 48);
        assert_non_null(strstr(line, step <= 10 ? "\"stage\":1" : "\"stage\":2"));
        short_lines += len == 16;
        long_lines += len == 48;
    }
    fclose(f);
    assert_int_equal(short_lines, 2);
    assert_int_equal(long_lines, 2);
    lt_model_free(ctx, m);

    /* A curriculum beyond the model's context is refused before any step. */
    lt_train_options in2 = run_options(dir), o2;
    snprintf(in2.seq_len_curriculum, sizeof in2.seq_len_curriculum, "0:64,0.5:100000");
    in2.max_seq_length = 0;
    assert_int_equal(lt_train_options_resolve(ctx, &in2, &o2), LT_OK);
    m = load(ctx, &o2);
    memset(&res, 0, sizeof res);
    assert_int_equal(lt_train_fit(ctx, &o2, m, &train.in, &valid.in, devnull, &res), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "exceeds the model's context"));
    lt_model_free(ctx, m);

    lt_test_rm_adapter_dir(dir);
    lt_test_dataset_free(&train);
    lt_test_dataset_free(&valid);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static int teardown(void **state) {
    (void)state;
    char p[400];
    snprintf(p, sizeof p, "%s/config.json", model_dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", model_dir);
    unlink(p);
    rmdir(model_dir);
    return 0;
}

int main(void) {
    rng = lt_test_seed();
    devnull = fopen("/dev/null", "w");
    make_model();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(short_run_lowers_loss),
        cmocka_unit_test(resume_is_bit_exact),
        cmocka_unit_test(resume_is_bit_exact_with_curriculum),
        cmocka_unit_test(curriculum_stages_in_metrics),
    };
    int rc = cmocka_run_group_tests(tests, NULL, teardown);
    fclose(devnull);
    return rc;
}
