/* Export round trips through longtune's own readers: a random LoRA adapter (every projection,
 * nonzero B) on each tiny fixture model, merged and written as an HF folder (single file and
 * sharded) and as GGUF (f32 and q8_0), is loaded back with lt_model_load and its logits compared
 * with the base + adapter run through the model's LoRA path; a training checkpoint merges to the
 * same model as its PEFT folder; the GGUF LoRA adapter is re-read with the GGUF reader (keys,
 * names, shapes, the llama Q/K row permutation of B); and the typed errors (adapter of another
 * shape, output exists, a quantizer this build lacks) name what is wrong. An export with a RoPE
 * override (YaRN with its betas and attention factor, linear, Llama 3, dynamic) from an HF and a
 * GGUF base reads back, through config.json and the GGUF keys, as the override applied to the base:
 * the same scaling fields and RoPE table, and the same logits as the base with the override set;
 * the GGUF keys are the ones llama.cpp reads. */
#define _GNU_SOURCE
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
#include <omp.h>

#include "export/export_internal.h"
#include "helpers/test_util.h"
#include "longtune/export_model.h"
#include "longtune/gguf.h"
#include "longtune/safetensors.h"
#include "longtune/model.h"
#include "longtune/train.h"
#include "model/model_internal.h"

#define RANK 4
#define ALPHA 8.0f
#define T_TOK 12
/* f32 export: the merged weight W + s·B·A rounds once per element where the LoRA path adds
 * s·(x·Aᵀ)·Bᵀ; both in f32, so the logits agree to accumulated f32 rounding. */
#define TOL_F32 1e-4
/* q8_0: 8-bit weights with an f16 scale per 32; the logits move by about 1% of their range. */
#define TOL_Q8_0 6e-2

static char tmp_root[256];

static int run_setup(void **state) {
    (void)state;
    snprintf(tmp_root, sizeof tmp_root, "/tmp/lt_test_export.XXXXXX");
    assert_non_null(mkdtemp(tmp_root));
    return 0;
}

static int run_teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    return system(cmd) == 0 ? 0 : 1;
}

static void must(lt_ctx *ctx, lt_status s, const char *what) {
    if (s != LT_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, lt_status_str(s), lt_ctx_error(ctx));
        fail();
    }
}

static const char *fixture(const char *c, const char *file, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/model/%s%s%s", lt_test_source_dir(), c, file ? "/" : "", file ? file : "");
    return buf;
}

static void tokens(int32_t *t, int64_t V, uint64_t *rng) {
    for (int i = 0; i < T_TOK; i++) t[i] = (int32_t)(lt_test_rand_u64(rng) % (uint64_t)V);
}

static void logits_of(lt_ctx *ctx, lt_model *m, const int32_t *tok, float *out) {
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = T_TOK, ro.forward_only = 1;
    must(ctx, lt_model_prepare(ctx, m, &ro), "prepare");
    lt_model_batch b = {0};
    b.B = 1, b.T = T_TOK, b.tokens = tok;
    must(ctx, lt_model_logits(ctx, m, &b, out), "logits");
}

/* Loads path without an adapter (LoRA B stays zero) and returns its logits. */
static void plain_logits(lt_ctx *ctx, const char *path, const int32_t *tok, float *out) {
    lt_model *m;
    lt_lora_options lo = {0};
    lo.rank = 1;
    must(ctx, lt_model_load(ctx, path, NULL, &lo, &m), path);
    logits_of(ctx, m, tok, out);
    lt_model_free(ctx, m);
}

static double rel_err(const float *x, const float *ref, int64_t n) {
    double m = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return INFINITY;
        m = fmax(m, fabs((double)x[i] - ref[i]));
        r = fmax(r, fabs((double)ref[i]));
    }
    return r > 0 ? m / r : m;
}

/* A model with a random adapter: loads base with LoRA on every projection, fills A and B with
 * normals, saves the PEFT folder (and a checkpoint when ckpt != NULL) and returns its logits. */
static void make_adapter(lt_ctx *ctx, const char *base, const char *dir, const char *ckpt, uint64_t *rng,
                         const int32_t *tok, float *ref, int64_t *V) {
    lt_model *m;
    lt_lora_options lo = {0};
    lo.rank = RANK, lo.alpha = ALPHA, lo.targets = LT_LORA_ALL_TARGETS;
    must(ctx, lt_model_load(ctx, base, NULL, &lo, &m), base);
    *V = lt_model_get_config(m)->V;
    int64_t np;
    lt_model_lora_params(m, &np);
    float *v = lt_test_fresh(rng, np, 0.05f);
    must(ctx, lt_model_lora_set(ctx, m, 0, np, v), "lora set");
    int64_t n = lt_model_lora_count(m);
    lt_train_param *ps = calloc((size_t)n, sizeof *ps);
    float *moments = calloc((size_t)np, sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        lt_lora_tensor t;
        must(ctx, lt_model_lora_tensor(ctx, m, i, &t), "lora tensor");
        const char *s = t.name + strlen("base_model.model.");
        snprintf(ps[i].name, sizeof ps[i].name, "%.*s", (int)(strlen(s) - strlen(".weight")), s);
        ps[i].ndim = 2;
        ps[i].shape[0] = t.value.shape[0];
        ps[i].shape[1] = t.value.shape[1];
        ps[i].data = v + t.offset;
        ps[i].m = ps[i].v = moments + t.offset;
    }
    lt_train_options opt;
    memset(&opt, 0, sizeof opt);
    opt.lora_rank = RANK, opt.lora_alpha = ALPHA;
    must(ctx, lt_peft_save(ctx, dir, base, &opt, ps, (int)n), "peft save");
    if (ckpt) {
        lt_train_state st;
        memset(&st, 0, sizeof st);
        must(ctx, lt_checkpoint_save(ctx, ckpt, &opt, &st, ps, (int)n), "checkpoint save");
    }
    logits_of(ctx, m, tok, ref);
    free(ps);
    free(moments);
    free(v);
    lt_model_free(ctx, m);
}

static void export_ok(lt_ctx *ctx, const char *base, const char *adapter, const char *out, lt_export_format f,
                      int outtype_set, lt_dtype dt, uint64_t shard, lt_export_report *rep) {
    lt_export_options o;
    memset(&o, 0, sizeof o);
    o.format = f, o.outtype = dt, o.outtype_set = outtype_set, o.adapter = adapter, o.max_shard_bytes = shard;
    must(ctx, lt_export_model(ctx, base, out, &o, rep), out);
}

static void check_case(const char *c, int from_gguf) {
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed() ^ (uint64_t)strlen(c) ^ (uint64_t)from_gguf;
    char base[1024], dir[512], ckpt[600], out[600];
    if (from_gguf) fixture(c, "model.gguf", base, sizeof base);
    else fixture(c, NULL, base, sizeof base);
    snprintf(dir, sizeof dir, "%s/%s-%d-adapter", tmp_root, c, from_gguf);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint.ltck", dir);
    int32_t tok[T_TOK];
    int64_t V = 96;
    tokens(tok, V, &rng);
    float *ref = malloc(sizeof(float) * T_TOK * 256), *got = malloc(sizeof(float) * T_TOK * 256);
    make_adapter(ctx, base, dir, ckpt, &rng, tok, ref, &V);
    assert_true(V <= 256);
    int64_t n = T_TOK * V;
    lt_export_report rep;
    /* HF f32, one file. */
    snprintf(out, sizeof out, "%s/%s-%d-hf", tmp_root, c, from_gguf);
    export_ok(ctx, base, dir, out, LT_EXPORT_HF, 1, LT_DTYPE_F32, 0, &rep);
    assert_int_equal(rep.n_shards, 1);
    assert_true(rep.n_merged > 0);
    plain_logits(ctx, out, tok, got);
    double e = rel_err(got, ref, n);
    fprintf(stderr, "%s%s hf f32: rel err %.3g\n", c, from_gguf ? " (gguf)" : "", e);
    assert_true(e <= TOL_F32);
    /* HF sharded: the index is read back. */
    snprintf(out, sizeof out, "%s/%s-%d-hf-sharded", tmp_root, c, from_gguf);
    export_ok(ctx, base, dir, out, LT_EXPORT_HF, 1, LT_DTYPE_F32, 20000, &rep);
    assert_true(rep.n_shards > 1);
    char idx[700];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", out);
    assert_int_equal(access(idx, R_OK), 0);
    plain_logits(ctx, out, tok, got);
    assert_true(rel_err(got, ref, n) <= TOL_F32);
    /* The checkpoint merges to the same model. */
    snprintf(out, sizeof out, "%s/%s-%d-ckpt.gguf", tmp_root, c, from_gguf);
    export_ok(ctx, base, ckpt, out, LT_EXPORT_GGUF, 1, LT_DTYPE_F32, 0, &rep);
    plain_logits(ctx, out, tok, got);
    e = rel_err(got, ref, n);
    fprintf(stderr, "%s%s gguf f32 (from the checkpoint): rel err %.3g\n", c, from_gguf ? " (gguf)" : "", e);
    assert_true(e <= TOL_F32);
    /* GGUF q8_0: norms stay f32, every matrix q8_0; the requantization error is reported. */
    snprintf(out, sizeof out, "%s/%s-%d-q8.gguf", tmp_root, c, from_gguf);
    export_ok(ctx, base, dir, out, LT_EXPORT_GGUF, 1, LT_DTYPE_Q8_0, 0, &rep);
    int saw_q = 0;
    for (int k = 0; k < rep.n_classes; k++) {
        if (!strcmp(rep.classes[k].name, "attn_q")) {
            saw_q = 1;
            assert_int_equal(rep.classes[k].dtype, LT_DTYPE_Q8_0);
            assert_true(rep.classes[k].max_abs > 0 && rep.classes[k].rms > 0);
            assert_true(rep.classes[k].rms <= rep.classes[k].max_abs);
        }
        if (!strcmp(rep.classes[k].name, "norm")) assert_int_equal(rep.classes[k].dtype, LT_DTYPE_F32);
    }
    assert_true(saw_q);
    plain_logits(ctx, out, tok, got);
    e = rel_err(got, ref, n);
    fprintf(stderr, "%s%s gguf q8_0: rel err %.3g\n", c, from_gguf ? " (gguf)" : "", e);
    assert_true(e <= TOL_Q8_0);
    free(ref);
    free(got);
    lt_ctx_free(ctx);
}

static void test_llama_tied_hf(void **s) {
    (void)s;
    check_case("llama_tied", 0);
}
static void test_llama_tied_gguf(void **s) {
    (void)s;
    check_case("llama_tied", 1);
}
static void test_llama3_untied_hf(void **s) {
    (void)s;
    check_case("llama3_untied", 0);
}
static void test_llama3_untied_gguf(void **s) {
    (void)s;
    check_case("llama3_untied", 1);
}
static void test_qwen2_untied(void **s) {
    (void)s;
    check_case("qwen2_untied", 0);
}
static void test_qwen3_tied(void **s) {
    (void)s;
    check_case("qwen3_tied", 0);
}

/* The whole file of path, malloc'd, its size in *n. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    unsigned char *b = malloc((size_t)len);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Rows convert on the run's threads a round at a time: the same bytes and the same error report
 * from 1, 2 and 3 threads (rounds of 8 rows a thread, so several rounds and a ragged last one per
 * matrix), for a merged requantized GGUF (llama Q/K rows reordered) and a merged HF f16 folder. */
static void test_threads_same_bytes(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed() + 11;
    char base[1024], dir[512];
    fixture("llama_tied", NULL, base, sizeof base);
    snprintf(dir, sizeof dir, "%s/threads-adapter", tmp_root);
    int32_t tok[T_TOK];
    int64_t V = 96;
    tokens(tok, V, &rng);
    float *ref = malloc(sizeof(float) * T_TOK * 256);
    make_adapter(ctx, base, dir, NULL, &rng, tok, ref, &V);
    const int saved = omp_get_max_threads();
    for (int fmt = 0; fmt < 2; fmt++) {
        unsigned char *first = NULL;
        size_t first_n = 0;
        lt_export_report first_rep;
        for (int nt = 1; nt <= 3; nt++) {
            omp_set_num_threads(nt);
            char out[600], file[700];
            snprintf(out, sizeof out, "%s/threads-%d-%d%s", tmp_root, fmt, nt, fmt ? "" : ".gguf");
            lt_export_report rep;
            if (fmt) export_ok(ctx, base, dir, out, LT_EXPORT_HF, 1, LT_DTYPE_F16, 0, &rep);
            else export_ok(ctx, base, dir, out, LT_EXPORT_GGUF, 1, LT_DTYPE_Q8_0, 0, &rep);
            snprintf(file, sizeof file, "%s%s", out, fmt ? "/model.safetensors" : "");
            size_t n;
            unsigned char *b = slurp(file, &n);
            if (!first) {
                first = b, first_n = n, first_rep = rep;
                assert_true(rep.n_merged > 0);
                continue;
            }
            fprintf(stderr, "%s with %d threads: %zu bytes, %s\n", fmt ? "hf f16" : "gguf q8_0", nt, n,
                    n == first_n && !memcmp(b, first, n) ? "identical" : "DIFFERENT");
            assert_int_equal(n, first_n);
            assert_memory_equal(b, first, n);
            assert_int_equal(rep.n_classes, first_rep.n_classes);
            for (int k = 0; k < rep.n_classes; k++) {
                assert_true(rep.classes[k].max_abs == first_rep.classes[k].max_abs);
                assert_true(rep.classes[k].rms == first_rep.classes[k].rms);
            }
            free(b);
        }
        free(first);
    }
    omp_set_num_threads(saved);
    free(ref);
    lt_ctx_free(ctx);
}

/* The LoRA GGUF: keys llama.cpp checks, one A/B pair per adapted projection with A (r, in) and
 * B (out, r); B's rows of attn_q/attn_k in GGUF order for the llama architecture. */
static void test_gguf_lora(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed() + 7;
    char base[1024], dir[512], out[600];
    fixture("llama_tied", "model.gguf", base, sizeof base);
    snprintf(dir, sizeof dir, "%s/lora-adapter", tmp_root);
    int32_t tok[T_TOK];
    tokens(tok, 96, &rng);
    float ref[T_TOK * 96];
    int64_t V;
    make_adapter(ctx, base, dir, NULL, &rng, tok, ref, &V);
    snprintf(out, sizeof out, "%s/lora.gguf", tmp_root);
    lt_export_report rep;
    export_ok(ctx, base, dir, out, LT_EXPORT_GGUF_LORA, 0, LT_DTYPE_F32, 0, &rep);
    lt_gguf *g, *bg;
    must(ctx, lt_gguf_open(ctx, out, &g), out);
    must(ctx, lt_gguf_open(ctx, base, &bg), base);
    const char *str;
    size_t len;
    must(ctx, lt_gguf_get_str(ctx, g, "general.type", &str, &len), "general.type");
    assert_true(len == 7 && !memcmp(str, "adapter", 7));
    must(ctx, lt_gguf_get_str(ctx, g, "adapter.type", &str, &len), "adapter.type");
    assert_true(len == 4 && !memcmp(str, "lora", 4));
    must(ctx, lt_gguf_get_str(ctx, g, "general.architecture", &str, &len), "arch");
    assert_true(len == 5 && !memcmp(str, "llama", 5));
    double alpha;
    must(ctx, lt_gguf_get_f64(ctx, g, "adapter.lora.alpha", &alpha), "alpha");
    assert_true(alpha == ALPHA);
    lt_model_config cfg;
    must(ctx, lt_model_inspect(ctx, base, NULL, &cfg), "inspect");
    assert_int_equal(lt_gguf_tensor_count(g), cfg.L * LT_PROJ_COUNT_ * 2);
    static const char *const names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    lt_safetensors *st;
    char ap[700];
    snprintf(ap, sizeof ap, "%s/adapter_model.safetensors", dir);
    must(ctx, lt_safetensors_open(ctx, ap, &st), ap);
    for (int64_t l = 0; l < cfg.L; l++)
        for (int k = 0; k < LT_PROJ_COUNT_; k++) {
            char n[128], w[96], pb[200];
            lt_tensor A, Bt, W, PB;
            snprintf(w, sizeof w, "blk.%lld.%s.weight", (long long)l, names[k]);
            snprintf(n, sizeof n, "%s.lora_a", w);
            must(ctx, lt_gguf_find_tensor(ctx, g, n, &A), n);
            snprintf(n, sizeof n, "%s.lora_b", w);
            must(ctx, lt_gguf_find_tensor(ctx, g, n, &Bt), n);
            must(ctx, lt_gguf_find_tensor(ctx, bg, w, &W), w);
            /* llama.cpp: W ne = (in, out), A ne = (in, r), B ne = (r, out). */
            assert_int_equal(A.shape[0], RANK);
            assert_int_equal(A.shape[1], W.shape[1]);
            assert_int_equal(Bt.shape[0], W.shape[0]);
            assert_int_equal(Bt.shape[1], RANK);
            snprintf(pb, sizeof pb, "base_model.model.model.layers.%lld.%s.%s.lora_B.weight", (long long)l,
                     k <= LT_PROJ_O ? "self_attn" : "mlp", lt_proj_name((lt_proj)k));
            must(ctx, lt_safetensors_find(ctx, st, pb, &PB), pb);
            int64_t D = cfg.D;
            for (int64_t gr = 0; gr < Bt.shape[0]; gr++) {
                int64_t r = gr;
                if (k <= LT_PROJ_K) { /* GGUF row h*D + 2i + s holds rotate-half row h*D + s*D/2 + i */
                    int64_t h = gr / D, wv = gr % D;
                    r = h * D + (wv % 2) * (D / 2) + wv / 2;
                }
                for (int64_t j = 0; j < RANK; j++)
                    assert_true(((const float *)Bt.data)[gr * RANK + j] == ((const float *)PB.data)[r * RANK + j]);
            }
        }
    lt_safetensors_close(ctx, st);
    lt_gguf_close(g);
    lt_gguf_close(bg);
    lt_ctx_free(ctx);
}

static void expect_err(lt_ctx *ctx, lt_status got, lt_status want, const char *pat) {
    if (got != want || !strstr(lt_ctx_error(ctx), pat)) {
        fprintf(stderr, "want %s /%s/, got %s: %s\n", lt_status_str(want), pat, lt_status_str(got), lt_ctx_error(ctx));
        fail();
    }
}

static void test_errors(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed() + 11;
    char base[1024], qbase[1024], dir[512], out[600];
    fixture("llama_tied", NULL, base, sizeof base);
    fixture("qwen3_tied", NULL, qbase, sizeof qbase);
    snprintf(dir, sizeof dir, "%s/err-adapter", tmp_root);
    int32_t tok[T_TOK];
    tokens(tok, 96, &rng);
    float ref[T_TOK * 96];
    int64_t V;
    make_adapter(ctx, qbase, dir, NULL, &rng, tok, ref, &V);
    lt_export_options o;
    memset(&o, 0, sizeof o);
    o.adapter = dir;
    o.format = LT_EXPORT_GGUF;
    snprintf(out, sizeof out, "%s/err.gguf", tmp_root);
    /* qwen3_tied has head_dim 24: its q_proj LoRA B is (96, 4), llama_tied's q_proj is (64, 64). */
    expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_SHAPE, "does not match this base");
    assert_int_not_equal(access(out, F_OK), 0);
    o.adapter = NULL;
    must(ctx, lt_export_model(ctx, base, out, &o, NULL), "plain conversion");
    expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_INVALID_ARG, "--overwrite");
    o.overwrite = 1;
    must(ctx, lt_export_model(ctx, base, out, &o, NULL), "overwrite");
    o.outtype_set = 1;
    o.outtype = LT_DTYPE_Q8_0;
    o.format = LT_EXPORT_HF;
    expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_INVALID_ARG, "f32, f16 or bf16");
    o.format = LT_EXPORT_GGUF;
    o.outtype = LT_DTYPE_INT4_G64;
    expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_INVALID_ARG, "GGUF has no type");
    o.outtype = LT_DTYPE_F32;
    o.format = LT_EXPORT_GGUF_LORA;
    expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_INVALID_ARG, "needs an adapter");
    o.format = LT_EXPORT_GGUF;
    o.adapter = "/nonexistent/adapter";
    expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_NOT_FOUND, "/nonexistent/adapter");
    /* The free-space check every writer runs before its first byte. */
    expect_err(ctx, lt_ex_check_space(ctx, out, (uint64_t)1 << 62), LT_ERR_IO, "no space");
    must(ctx, lt_ex_check_space(ctx, out, 1024), "space for 1 KiB");
    lt_ctx_free(ctx);
}

/* The logits of path with ov applied (NULL: as the file says). */
static void rope_logits(lt_ctx *ctx, const char *path, const lt_rope_override *ov, const int32_t *tok, float *out) {
    lt_model *m;
    lt_lora_options lo = {0};
    lo.rank = 1;
    must(ctx, lt_model_load(ctx, path, NULL, &lo, &m), path);
    if (ov) must(ctx, lt_model_set_rope(ctx, m, ov), "set rope");
    logits_of(ctx, m, tok, out);
    lt_model_free(ctx, m);
}

static void same_rope(const lt_model_config *got, const lt_model_config *want, const char *what) {
    fprintf(stderr, "%s: %s factor %g orig %lld max %lld attn %g\n", what, lt_rope_scaling_name(got->rope_scaling),
            got->rope_factor, (long long)got->rope_original_ctx, (long long)got->max_positions,
            lt_model_rope_attn_factor(got));
    assert_int_equal(got->rope_scaling, want->rope_scaling);
    assert_true(fabs(got->rope_factor - want->rope_factor) <= 1e-6 * want->rope_factor);
    assert_int_equal(got->rope_original_ctx, want->rope_original_ctx);
    assert_int_equal(got->max_positions, want->max_positions);
    assert_true(fabs(lt_model_rope_attn_factor(got) - lt_model_rope_attn_factor(want)) <= 1e-6);
    float a[LT_ROPE_MAX_FACTORS + 1], b[LT_ROPE_MAX_FACTORS + 1];
    lt_model_rope_table(got, 0, a);
    lt_model_rope_table(want, 0, b);
    for (int64_t i = 0; i < LT_ROPE_TABLE_LEN(want->D); i++) {
        if (fabs((double)a[i] - b[i]) > 1e-6 * fabs((double)b[i])) {
            fprintf(stderr, "%s: RoPE table [%lld] %.9g, expected %.9g\n", what, (long long)i, (double)a[i],
                    (double)b[i]);
            fail();
        }
    }
}

static double gguf_num(lt_ctx *ctx, const char *path, const char *key) {
    lt_gguf *g;
    must(ctx, lt_gguf_open(ctx, path, &g), path);
    double v = 0;
    must(ctx, lt_gguf_get_f64(ctx, g, key, &v), key);
    lt_gguf_close(g);
    return v;
}

static int gguf_has(lt_ctx *ctx, const char *path, const char *key) {
    lt_gguf *g;
    must(ctx, lt_gguf_open(ctx, path, &g), path);
    lt_gguf_type t;
    int has = lt_gguf_get_type(ctx, g, key, &t) == LT_OK;
    lt_ctx_clear_error(ctx);
    lt_gguf_close(g);
    return has;
}

static void test_rope_override(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed() + 23;
    int32_t tok[T_TOK];
    tokens(tok, 96, &rng);
    float ref[T_TOK * 96], got[T_TOK * 96];
    lt_rope_override ovs[4];
    memset(ovs, 0, sizeof ovs);
    ovs[0].scaling = LT_ROPE_SCALING_YARN, ovs[0].factor = 4, ovs[0].original_ctx = 32;
    ovs[0].beta_fast = 16, ovs[0].beta_slow = 2, ovs[0].attn_factor = 1.25;
    ovs[1].scaling = LT_ROPE_SCALING_YARN, ovs[1].factor = 8; /* defaults: betas 32, 1; 0.1·ln 8 + 1 */
    ovs[2].scaling = LT_ROPE_SCALING_LINEAR, ovs[2].factor = 2;
    ovs[3].scaling = LT_ROPE_SCALING_LLAMA3, ovs[3].factor = 8, ovs[3].original_ctx = 16;
    for (int from_gguf = 0; from_gguf < 2; from_gguf++) {
        char base[1024], out[600], what[96];
        fixture("llama_tied", from_gguf ? "model.gguf" : NULL, base, sizeof base);
        lt_model_config bc;
        must(ctx, lt_model_inspect(ctx, base, NULL, &bc), base);
        for (int k = 0; k < 4; k++) {
            lt_model_config want = bc;
            must(ctx, lt_model_config_apply_rope(ctx, &want, &ovs[k]), "apply rope");
            rope_logits(ctx, base, &ovs[k], tok, ref);
            for (int f = 0; f < 2; f++) {
                lt_export_options o;
                memset(&o, 0, sizeof o);
                o.format = f ? LT_EXPORT_GGUF : LT_EXPORT_HF, o.outtype = LT_DTYPE_F32, o.outtype_set = 1;
                o.rope = ovs[k];
                snprintf(out, sizeof out, "%s/rope-%d-%d%s", tmp_root, from_gguf, k, f ? ".gguf" : "");
                snprintf(what, sizeof what, "%s %s -> %s", lt_rope_scaling_name(ovs[k].scaling),
                         from_gguf ? "gguf" : "hf", f ? "gguf" : "hf");
                lt_export_report rr;
                must(ctx, lt_export_model(ctx, base, out, &o, &rr), what);
                /* custom YaRN betas: llama.cpp's llama loader keeps 32, 1; the note names the flags */
                if (f && k == 0) assert_non_null(strstr(rr.note, "--yarn-beta-fast 16 --yarn-beta-slow 2"));
                if (f && k == 1) assert_null(strstr(rr.note, "yarn_beta"));
                lt_model_config rc;
                if (!f) {
                    char cj[700];
                    snprintf(cj, sizeof cj, "%s/config.json", out);
                    must(ctx, lt_model_config_read_hf(ctx, cj, &rc), cj);
                } else {
                    must(ctx, lt_model_inspect(ctx, out, NULL, &rc), out);
                }
                /* a GGUF carries Llama 3's scaling as rope_freqs.weight, which the logits read */
                int freqs = f && ovs[k].scaling == LT_ROPE_SCALING_LLAMA3;
                if (!freqs) same_rope(&rc, &want, what);
                else assert_int_equal(rc.max_positions, want.max_positions);
                rope_logits(ctx, out, NULL, tok, got);
                double e = rel_err(got, ref, T_TOK * 96);
                fprintf(stderr, "%s: logits rel err %.3g\n", what, e);
                assert_true(e <= TOL_F32);
                if (!f) continue;
                /* the keys llama.cpp reads */
                if (freqs) {
                    assert_false(gguf_has(ctx, out, "llama.rope.scaling.type"));
                    lt_gguf *g;
                    lt_tensor t;
                    must(ctx, lt_gguf_open(ctx, out, &g), out);
                    must(ctx, lt_gguf_find_tensor(ctx, g, "rope_freqs.weight", &t), "rope_freqs.weight");
                    lt_gguf_close(g);
                    continue;
                }
                assert_true(fabs(gguf_num(ctx, out, "llama.rope.scaling.factor") - ovs[k].factor) < 1e-6);
                assert_true(gguf_num(ctx, out, "llama.rope.scaling.original_context_length") ==
                            (double)want.rope_original_ctx);
                assert_true(gguf_num(ctx, out, "llama.context_length") == (double)want.max_positions);
                if (k == 0) {
                    double dflt = 0.1 * log(4.0) + 1;
                    assert_true(fabs(gguf_num(ctx, out, "llama.rope.scaling.attn_factor") - 1.25 / dflt) < 1e-6);
                    assert_true(gguf_num(ctx, out, "llama.rope.scaling.yarn_beta_fast") == 16);
                    assert_true(gguf_num(ctx, out, "llama.rope.scaling.yarn_beta_slow") == 2);
                }
                if (k == 1) assert_false(gguf_has(ctx, out, "llama.rope.scaling.attn_factor"));
            }
        }
        /* dynamic NTK: config.json carries it; llama.cpp has no form for it */
        lt_export_options o;
        memset(&o, 0, sizeof o);
        o.rope.scaling = LT_ROPE_SCALING_DYNAMIC, o.rope.factor = 2;
        snprintf(out, sizeof out, "%s/rope-dyn-%d", tmp_root, from_gguf);
        must(ctx, lt_export_model(ctx, base, out, &o, NULL), "dynamic hf");
        char cj[700];
        snprintf(cj, sizeof cj, "%s/config.json", out);
        lt_model_config rc, want = bc;
        must(ctx, lt_model_config_read_hf(ctx, cj, &rc), cj);
        must(ctx, lt_model_config_apply_rope(ctx, &want, &o.rope), "apply dynamic");
        assert_int_equal(rc.rope_scaling, LT_ROPE_SCALING_DYNAMIC);
        assert_true(rc.rope_factor == 2 && rc.max_positions == want.max_positions);
        o.format = LT_EXPORT_GGUF;
        snprintf(out, sizeof out, "%s/rope-dyn-%d.gguf", tmp_root, from_gguf);
        expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_UNSUPPORTED, "no dynamic RoPE scaling");
        assert_int_not_equal(access(out, F_OK), 0);
        o.format = LT_EXPORT_GGUF_LORA, o.adapter = "/nonexistent/adapter"; /* refused before it is read */
        expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_INVALID_ARG, "carries no RoPE");
        o.format = LT_EXPORT_HF, o.adapter = NULL, o.rope.factor = -1;
        expect_err(ctx, lt_export_model(ctx, base, out, &o, NULL), LT_ERR_INVALID_ARG, "");
    }
    /* a GGUF whose scaling is a rope_freqs.weight tensor keeps it */
    char l3[1024], out3[600];
    fixture("llama3_untied", "model.gguf", l3, sizeof l3);
    lt_export_options o3;
    memset(&o3, 0, sizeof o3);
    o3.format = LT_EXPORT_GGUF, o3.rope = ovs[2];
    snprintf(out3, sizeof out3, "%s/rope-l3.gguf", tmp_root);
    expect_err(ctx, lt_export_model(ctx, l3, out3, &o3, NULL), LT_ERR_UNSUPPORTED, "cannot replace it");
    lt_ctx_free(ctx);
}

/* A GGUF that names its Hugging Face source gives the adapter a base transformers can load. */
static void test_peft_base_model(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    char gg[400], dir[400], cfg[500];
    static const char *const urls[] = {"https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct", NULL};
    static const char *const want[] = {"\"HuggingFaceTB/SmolLM2-135M-Instruct\"", NULL};
    for (int c = 0; c < 2; c++) {
        snprintf(gg, sizeof gg, "%s/named-%d.gguf", tmp_root, c);
        lt_gguf_writer *w;
        must(ctx, lt_gguf_writer_new(ctx, &w), "writer");
        must(ctx, lt_gguf_writer_set_str(ctx, w, "general.architecture", "llama", 5), "kv");
        if (urls[c]) must(ctx, lt_gguf_writer_set_str(ctx, w, "general.source.url", urls[c], strlen(urls[c])), "kv");
        must(ctx, lt_gguf_writer_begin(ctx, w, gg), gg);
        must(ctx, lt_gguf_writer_finish(ctx, w), gg);
        lt_gguf_writer_free(w);
        float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, mv[8] = {0};
        lt_train_param p[2];
        memset(p, 0, sizeof p);
        snprintf(p[0].name, sizeof p[0].name, "model.layers.0.self_attn.q_proj.lora_A");
        snprintf(p[1].name, sizeof p[1].name, "model.layers.0.self_attn.q_proj.lora_B");
        for (int i = 0; i < 2; i++) {
            p[i].ndim = 2, p[i].data = a, p[i].m = p[i].v = mv;
            p[i].shape[0] = i ? 4 : 2, p[i].shape[1] = i ? 2 : 4;
        }
        lt_train_options opt;
        memset(&opt, 0, sizeof opt);
        opt.lora_rank = 2, opt.lora_alpha = 4;
        snprintf(dir, sizeof dir, "%s/named-adapter-%d", tmp_root, c);
        must(ctx, lt_peft_save(ctx, dir, gg, &opt, p, 2), "peft save");
        snprintf(cfg, sizeof cfg, "%s/adapter_config.json", dir);
        FILE *f = fopen(cfg, "rb");
        assert_non_null(f);
        char text[8192];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        char line[600];
        snprintf(line, sizeof line, "\"%s\"", gg);
        if (!strstr(text, want[c] ? want[c] : line)) {
            fprintf(stderr, "adapter_config.json lacks %s:\n%s\n", want[c] ? want[c] : line, text);
            fail();
        }
    }
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_tied_hf),      cmocka_unit_test(test_llama_tied_gguf),
        cmocka_unit_test(test_llama3_untied_hf),   cmocka_unit_test(test_llama3_untied_gguf),
        cmocka_unit_test(test_qwen2_untied),       cmocka_unit_test(test_qwen3_tied),
        cmocka_unit_test(test_gguf_lora),          cmocka_unit_test(test_errors),
        cmocka_unit_test(test_peft_base_model),    cmocka_unit_test(test_rope_override),
        cmocka_unit_test(test_threads_same_bytes),
    };
    return cmocka_run_group_tests(tests, run_setup, run_teardown);
}
