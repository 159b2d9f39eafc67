/* The memory guard around a real training run of a tiny random Llama: (1) a ceiling below what
 * the run needs makes preparing it fail with a clean LT_ERR_OOM naming the limit, nothing leaked;
 * (2) memory taken outside the allocator mid-run trips the watchdog, the trainer stops at the next
 * step boundary with a checkpoint, the aborted_memory_ceiling artifact (with the plan) is written,
 * and the checkpoint resumes a run. The glue is the one a CLI uses: on_breach raises the trainer's
 * stop request. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, mkdtemp */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/guard.h"
#include "longtune/log.h"
#include "longtune/plan.h"
#include "longtune/safetensors.h"
#include "longtune/sysinfo.h"
#include "longtune/train.h"

#define MIB (1024ull * 1024ull)
enum { V = 96, C = 32, F = 64, L = 2, H = 4, HKV = 2, D = 8 };

static uint64_t rng;
static char root[128], model_dir[256];

static void put_tensor(lt_safetensors_entry *e, char (*names)[96], float **bufs, int *n, const char *name, int64_t r,
                       int64_t c, int norm) {
    snprintf(names[*n], 96, "%s", name);
    int64_t numel = c ? r * c : r;
    bufs[*n] = malloc((size_t)numel * sizeof(float));
    assert_non_null(bufs[*n]);
    lt_test_fill_normal(&rng, bufs[*n], numel, norm ? 0.05f : 0.2f);
    if (norm)
        for (int64_t i = 0; i < numel; i++) bufs[*n][i] += 1.0f;
    int64_t shape[2] = {r, c};
    e[*n].name = names[*n];
    e[*n].tensor = lt_tensor_view(bufs[*n], LT_DTYPE_F32, LT_DEVICE_CPU, c ? 2 : 1, shape);
    (*n)++;
}

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    snprintf(root, sizeof root, "/tmp/lt_guard_train_XXXXXX");
    assert_non_null(mkdtemp(root));
    snprintf(model_dir, sizeof model_dir, "%s/model", root);
    assert_int_equal(mkdir(model_dir, 0755), 0);
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d, "
            "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
            "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"max_position_embeddings\": 512, "
            "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
            "\"hidden_act\": \"silu\"}\n",
            V, C, F, L, H, HKV);
    fclose(f);
    enum { NT = 3 + 9 * L };
    lt_safetensors_entry e[NT];
    char names[NT][96];
    float *bufs[NT];
    int n = 0;
    put_tensor(e, names, bufs, &n, "model.embed_tokens.weight", V, C, 0);
    put_tensor(e, names, bufs, &n, "model.norm.weight", C, 0, 1);
    put_tensor(e, names, bufs, &n, "lm_head.weight", V, C, 0);
    for (int l = 0; l < L; l++) {
        char nm[96];
#define T_(s, r, c, norm) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), put_tensor(e, names, bufs, &n, nm, r, c, norm))
        T_("input_layernorm.weight", C, 0, 1);
        T_("post_attention_layernorm.weight", C, 0, 1);
        T_("self_attn.q_proj.weight", H * D, C, 0);
        T_("self_attn.k_proj.weight", HKV * D, C, 0);
        T_("self_attn.v_proj.weight", HKV * D, C, 0);
        T_("self_attn.o_proj.weight", C, H * D, 0);
        T_("mlp.gate_proj.weight", F, C, 0);
        T_("mlp.up_proj.weight", F, C, 0);
        T_("mlp.down_proj.weight", C, F, 0);
#undef T_
    }
    lt_ctx *ctx = lt_ctx_new();
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    assert_int_equal(lt_safetensors_write(ctx, path, e, n, NULL, 0), LT_OK);
    lt_ctx_free(ctx);
    for (int i = 0; i < n; i++) free(bufs[i]);
    return 0;
}

static void rm_f(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
}

static int teardown(void **state) {
    (void)state;
    rm_f(model_dir, "config.json");
    rm_f(model_dir, "model.safetensors");
    rmdir(model_dir);
    char ad[256];
    snprintf(ad, sizeof ad, "%s/adapters", root);
    const char *files[] = {"adapter_config.json", "adapter_model.safetensors", LT_TRAIN_CHECKPOINT_FILE,
                           "metrics.jsonl", "aborted_memory_ceiling.json"};
    for (int i = 0; i < 5; i++) rm_f(ad, files[i]);
    rmdir(ad);
    rmdir(root);
    return 0;
}

typedef struct dataset {
    int32_t *tokens;
    int64_t *offsets;
    lt_pack_input in;
} dataset;

static void make_data(dataset *d, int64_t n_seqs) {
    d->offsets = malloc((size_t)(n_seqs + 1) * sizeof(int64_t));
    assert_non_null(d->offsets);
    d->offsets[0] = 0;
    for (int64_t i = 0; i < n_seqs; i++) d->offsets[i + 1] = d->offsets[i] + 8 + (int64_t)(lt_test_rand_u64(&rng) % 24);
    d->tokens = malloc((size_t)d->offsets[n_seqs] * sizeof(int32_t));
    assert_non_null(d->tokens);
    for (int64_t j = 0; j < d->offsets[n_seqs]; j++) d->tokens[j] = (int32_t)(lt_test_rand_u64(&rng) % V);
    d->in = (lt_pack_input){d->tokens, NULL, d->offsets, n_seqs};
}

static lt_train_options options(int64_t iters) {
    lt_train_options in, o;
    memset(&in, 0, sizeof in);
    snprintf(in.model, sizeof in.model, "%s", model_dir);
    snprintf(in.data, sizeof in.data, "(in memory)");
    snprintf(in.adapter_path, sizeof in.adapter_path, "%s/adapters", root);
    in.iters = iters;
    in.batch_size = 2;
    in.max_seq_length = 64;
    in.learning_rate = 1e-3;
    in.lora_rank = 4;
    in.steps_per_eval = 1000000;
    in.steps_per_report = 1000000;
    in.save_every = 1000000;
    in.val_batches = 1;
    in.threads = 1;
    lt_ctx *ctx = lt_ctx_new();
    lt_status s = lt_train_options_resolve(ctx, &in, &o);
    if (s != LT_OK) fail_msg("resolve: %s", lt_ctx_error(ctx));
    lt_ctx_free(ctx);
    return o;
}

static void tiny_ceiling_fails_preparing_cleanly(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, 1);
    lt_train_options o = options(4);
    lt_lora_options lora;
    assert_int_equal(lt_train_lora_options(ctx, &o, &lora), LT_OK);
    /* Room for half the planned peak of a 2 x 1024-token run beyond what the process holds now
     * (megabytes, so the resident set's page-sized jitter cannot decide the outcome): the model
     * loads, preparing the run's activations fails. */
    lt_model_config cfg;
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    assert_int_equal(lt_model_inspect(ctx, model_dir, &mo, &cfg), LT_OK);
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.lora = lora;
    po.run.B = 2;
    po.run.T = 1024;
    po.run.threads = 1;
    lt_plan plan;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &plan), LT_OK);
    assert_true(plan.peak_bytes > 4 * MIB);
    lt_guard_options go = {.device = LT_DEVICE_CPU, .allow_low_memory = 1, .no_watchdog = 1};
    go.ceiling_bytes = lt_sys_process_rss() + plan.peak_bytes / 2;
    lt_guard *g = NULL;
    assert_int_equal(lt_guard_start(ctx, &go, &g), LT_OK);
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, model_dir, &mo, &lora, &m), LT_OK);
    assert_int_equal(lt_model_prepare(ctx, m, &po.run), LT_ERR_OOM);
    assert_non_null(strstr(lt_ctx_error(ctx), "limit"));
    fprintf(stderr, "refused as it should be: %s\n", lt_ctx_error(ctx));
    lt_model_free(ctx, m);
    lt_guard_stop(g);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* What a CLI installs as on_breach: the same stop request SIGTERM raises. */
static void stop_training(void *user) {
    (void)user;
    lt_train_request_stop(SIGXCPU);
}

typedef struct leak {
    double delay_s;
    size_t bytes;
    unsigned char *block;
} leak;

/* Simulates a library that takes memory behind the allocator's back, some time into the run. */
static void *leak_later(void *arg) {
    leak *k = arg;
    struct timespec ts = {(time_t)k->delay_s, (long)((k->delay_s - (double)(time_t)k->delay_s) * 1e9)};
    nanosleep(&ts, NULL);
    k->block = malloc(k->bytes);
    if (k->block)
        for (size_t i = 0; i < k->bytes; i += 4096) k->block[i] = (unsigned char)(i >> 12 | 1);
    return NULL;
}

static void watchdog_breach_stops_with_checkpoint_and_artifact(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, 1);
    lt_train_options o = options(1000000); /* far more steps than the run will get */
    lt_lora_options lora;
    assert_int_equal(lt_train_lora_options(ctx, &o, &lora), LT_OK);
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, model_dir, &mo, &lora, &m), LT_OK);
    dataset train;
    make_data(&train, 64);

    /* The plan of this run, as `longtune plan` prints it. */
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.lora = lora;
    po.run.B = o.batch_size;
    po.run.T = o.max_seq_length;
    po.run.threads = 1;
    lt_plan plan;
    assert_int_equal(lt_plan_compute(ctx, lt_model_get_config(m), &po, &plan), LT_OK);

    /* A ceiling 48 MiB above the resident set now; 128 MiB appear outside the allocator later. */
    lt_train_clear_stop();
    lt_guard_options go = {.device = LT_DEVICE_CPU,
                           .allow_low_memory = 1,
                           .interval_s = 0.02,
                           .plan_bytes = plan.peak_bytes,
                           .on_breach = stop_training};
    go.ceiling_bytes = lt_sys_process_rss() + 48 * MIB;
    lt_guard *g = NULL;
    assert_int_equal(lt_guard_start(ctx, &go, &g), LT_OK);
    leak k = {0.3, 128 * MIB, NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, leak_later, &k), 0);
    FILE *devnull = fopen("/dev/null", "w");
    lt_train_result res;
    memset(&res, 0, sizeof res);
    lt_status s = lt_train_fit(ctx, &o, m, &train.in, NULL, devnull, &res);
    pthread_join(th, NULL);
    fclose(devnull);
    if (s != LT_ERR_INTERRUPTED) fail_msg("fit returned %s: %s", lt_status_str(s), lt_ctx_error(ctx));
    assert_true(lt_guard_tripped(g));
    assert_int_equal(lt_train_stop_requested(), SIGXCPU);
    lt_guard_breach b = lt_guard_get_breach(g);
    assert_string_equal(b.source, "host_rss");
    assert_true(b.observed_bytes > b.ceiling_bytes);
    fprintf(stderr, "stopped: %s\n", lt_ctx_error(ctx));

    /* The artifact, as the CLI writes it, with the plan embedded. */
    char ckpt[512], art[512], pj[4096];
    snprintf(ckpt, sizeof ckpt, "%s/adapters/" LT_TRAIN_CHECKPOINT_FILE, root);
    snprintf(art, sizeof art, "%s/adapters/aborted_memory_ceiling.json", root);
    assert_int_equal(lt_plan_to_json(ctx, &plan, pj, sizeof pj), LT_OK);
    /* The step the checkpoint holds: resume it below and read it back from the result. */
    lt_guard_abort_record r;
    memset(&r, 0, sizeof r);
    r.breach = b;
    r.plan_peak_bytes = plan.peak_bytes;
    r.plan_json = pj;
    r.checkpoint = ckpt;
    r.allocator_peak_bytes = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes;
    lt_guard_stop(g);
    free(k.block);
    lt_train_clear_stop();

    /* The checkpoint resumes: first to read the step it holds (stop at the first boundary), then
     * to train two more steps, whose checkpoint resumes in turn. */
    lt_train_options o2 = o;
    snprintf(o2.resume_adapter_file, sizeof o2.resume_adapter_file, "%s", ckpt);
    lt_train_result res2;
    memset(&res2, 0, sizeof res2);
    res2.stop_at = 1;
    devnull = fopen("/dev/null", "w");
    lt_status s2 = lt_train_fit(ctx, &o2, m, &train.in, NULL, devnull, &res2);
    if (s2 != LT_ERR_INTERRUPTED && s2 != LT_OK) fail_msg("resume: %s", lt_ctx_error(ctx));
    int64_t step = res2.start_step;
    memset(&res2, 0, sizeof res2);
    res2.stop_at = step + 2;
    s2 = lt_train_fit(ctx, &o2, m, &train.in, NULL, devnull, &res2);
    if (s2 != LT_ERR_INTERRUPTED) fail_msg("resume and train: %s", lt_ctx_error(ctx));
    assert_int_equal(res2.start_step, step);
    assert_true(isfinite(res2.last_train_loss));
    memset(&res2, 0, sizeof res2);
    res2.stop_at = 1;
    s2 = lt_train_fit(ctx, &o2, m, &train.in, NULL, devnull, &res2);
    fclose(devnull);
    assert_int_equal(s2, LT_ERR_INTERRUPTED);
    assert_int_equal(res2.start_step, step + 2);
    res2.steps = step + 2;
    fprintf(stderr, "checkpoint of step %lld resumed and trained to step %lld\n", (long long)step,
            (long long)res2.steps);
    r.step = step;
    assert_int_equal(lt_guard_write_abort(ctx, art, &r), LT_OK);
    FILE *f = fopen(art, "rb");
    assert_non_null(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "status")->valuestring, LT_GUARD_ABORT_STATUS);
    assert_int_equal(cJSON_GetObjectItem(j, "step")->valueint, step);
    assert_true(cJSON_GetObjectItem(j, "ceiling_bytes")->valuedouble == (double)b.ceiling_bytes);
    assert_true(cJSON_GetObjectItem(j, "observed_bytes")->valuedouble > (double)b.ceiling_bytes);
    cJSON *pl = cJSON_GetObjectItem(j, "plan");
    assert_true(cJSON_GetObjectItem(pl, "peak_bytes")->valuedouble == (double)plan.peak_bytes);
    cJSON_Delete(j);

    lt_model_free(ctx, m);
    free(train.tokens);
    free(train.offsets);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

int main(void) {
    lt_log_set_level(LT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tiny_ceiling_fails_preparing_cleanly),
        cmocka_unit_test(watchdog_breach_stops_with_checkpoint_and_artifact),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
