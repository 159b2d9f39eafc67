/* The model against PyTorch + transformers + PEFT fixtures (tests/oracle/gen_model_fixtures.py):
 * logits, loss, per-token loss and every LoRA gradient of a packed batch for tiny Llama (tied,
 * llama3 rope scaling), Qwen2 and Qwen3 models. Also: every recompute policy gives the same
 * gradients, packed and unpacked rows give the same per-sequence loss, the size table equals
 * what the allocator measured, bad inputs are typed errors, and each layer carries the description
 * its family's config expands to. */
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

#include "helpers/model_fixture.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/gguf.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"
#include "longtune/sysinfo.h"

/* fp32 end to end against fp32 PyTorch: differences are summation order only. Relative to the
 * largest magnitude of the tensor compared. */
#define ORACLE_REL 1e-4
#define SAME_REL 1e-5

static const char *const CASES[] = {"llama_tied", "llama3_untied", "qwen2_untied", "qwen3_tied"};

typedef lt_test_fixture fixture;

static void case_dir(const char *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/model/%s", lt_test_source_dir(), c);
}

#define ftensor lt_test_fixture_tensor
#define fixture_batch lt_test_fixture_batch
#define compare lt_test_compare

static void open_fixture(lt_ctx *ctx, const char *c, fixture *f) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    lt_test_fixture_open(ctx, dir, f);
}

/* Case c's model (file: a model file inside its folder, or an absolute path elsewhere). */
static lt_model *load_case_file(lt_ctx *ctx, const char *c, const fixture *f, int quantize, const char *file) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    return lt_test_fixture_model_in(ctx, dir, file, c, f, quantize);
}

static lt_model *load_case(lt_ctx *ctx, const char *c, const fixture *f, int quantize) {
    return load_case_file(ctx, c, f, quantize, NULL);
}

static void prepare(lt_ctx *ctx, lt_model *m, int64_t B, int64_t T, lt_recompute rc, int64_t k) {
    lt_model_run_options ro = {0};
    ro.B = B, ro.T = T, ro.recompute = rc, ro.recompute_k = k;
    if (lt_model_prepare(ctx, m, &ro) != LT_OK) {
        fprintf(stderr, "prepare: %s\n", lt_ctx_error(ctx));
        fail();
    }
}

static void check_against_oracle(const char *c, const char *file) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    lt_test_fixture_check_oracle(dir, file, c, ORACLE_REL, SAME_REL);
}

static void matches_pytorch_peft(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) check_against_oracle(CASES[ci], NULL);
}

/* The same models converted as llama.cpp does (permuted Q/K rows, llama3 scaling as a factor
 * tensor, tied head absent) load from GGUF to the same numbers. */
static void gguf_matches_pytorch_peft(void **state) {
    (void)state;
    check_against_oracle("llama_tied", "model.gguf");
    check_against_oracle("llama3_untied", "model.gguf");
}

/* The same three sequences packed into two rows or placed one per row give the same losses. */
static void packed_equals_unpacked(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    open_fixture(ctx, "qwen3_tied", &f);
    lt_model *m = load_case(ctx, "qwen3_tied", &f, 0);
    lt_model_batch pk = fixture_batch(&f);
    prepare(ctx, m, 3, f.T, LT_RECOMPUTE_EVERY, 1);
    float tl_p[64], tl_u[64];
    lt_model_result rp, ru;
    lt_model_zero_grads(m);
    assert_int_equal(lt_model_forward_backward(ctx, m, &pk, 1.0f, &rp, tl_p), LT_OK);
    int64_t ng;
    const float *g0 = lt_model_lora_grads(m, &ng);
    float *gp = malloc((size_t)ng * 4);
    memcpy(gp, g0, (size_t)ng * 4);
    /* Unpacked: row i holds sequence i from position 0, padded with token 0 and ignored targets. */
    int32_t tok[36], tgt[36];
    const int seq[3][3] = {{0, 0, 5}, {0, 5, 12}, {1, 0, 12}};
    for (int i = 0; i < 36; i++) tok[i] = 0, tgt[i] = LT_IGNORE_INDEX;
    for (int s = 0; s < 3; s++)
        for (int t = seq[s][1]; t < seq[s][2]; t++) {
            tok[s * 12 + t - seq[s][1]] = f.tokens[seq[s][0] * 12 + t];
            tgt[s * 12 + t - seq[s][1]] = f.targets[seq[s][0] * 12 + t];
        }
    lt_model_batch ub = {0};
    ub.B = 3, ub.T = 12, ub.tokens = tok, ub.targets = tgt;
    lt_model_zero_grads(m);
    assert_int_equal(lt_model_forward_backward(ctx, m, &ub, 1.0f, &ru, tl_u), LT_OK);
    assert_int_equal(rp.n_tokens, ru.n_tokens);
    for (int s = 0; s < 3; s++) {
        double a = 0, b = 0;
        for (int t = seq[s][1]; t < seq[s][2]; t++) a += tl_p[seq[s][0] * 12 + t];
        for (int t = 0; t < seq[s][2] - seq[s][1]; t++) b += tl_u[s * 12 + t];
        assert_true(fabs(a - b) <= 1e-5 * fabs(b) + 1e-6);
    }
    compare("packed vs unpacked grads", lt_model_lora_grads(m, NULL), gp, ng, SAME_REL);
    free(gp);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    lt_ctx_free(ctx);
}

/* Kept attention on the host keeps the attention half of every LoRA layer (q, k, v after norm and
 * RoPE, the norm's inputs, x_mid, the LoRA products), so the recompute runs no q/k/v or o
 * projection: the step's numbers are those of rerunning attention, bit for bit (the same ops on
 * the same inputs), under both checkpoint dtypes, both recompute policies and LoRA dropout. */
static void kept_qkv_equals_rerun_attention(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) {
        uint64_t rng = lt_test_seed() + 31 + (uint64_t)ci;
        lt_ctx *ctx = lt_ctx_new();
        fixture f;
        open_fixture(ctx, CASES[ci], &f);
        char dir[1024];
        case_dir(CASES[ci], dir, sizeof dir);
        lt_lora_options lo = {0};
        lo.rank = 4, lo.alpha = 8, lo.dropout = ci % 2 ? 0.25f : 0.0f, lo.seed = 5;
        lt_model *m = NULL;
        assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
        int64_t n, N = f.B * f.T;
        float *p = lt_model_lora_params(m, &n);
        lt_test_fill_normal(&rng, p, n, 0.1f); /* B != 0 so every gradient is live */
        lt_model_batch b = fixture_batch(&f);
        b.step = 1;
        float *gk = malloc((size_t)n * 4), tl[2][64];
        assert_true(gk && N <= 64);
        for (int v = 0; v < 4; v++) {
            size_t act[2];
            double loss[2];
            for (int rerun = 0; rerun < 2; rerun++) {
                lt_model_run_options ro = {0};
                ro.B = f.B, ro.T = f.T, ro.recompute = v & 1 ? LT_RECOMPUTE_EVERY_K : LT_RECOMPUTE_EVERY;
                ro.recompute_k = 2, ro.saved_bf16 = v & 2 ? 1 : -1, ro.chunk_rows = v & 2 ? 5 : 0;
                ro.recompute_attention = rerun;
                assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                act[rerun] = lt_model_get_sizes(m).bytes[LT_MEM_ACTIVATIONS];
                lt_model_zero_grads(m);
                lt_model_result r;
                for (int64_t i = 0; i < N; i++) tl[rerun][i] = LT_TEST_POISON;
                assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0.0f, &r, tl[rerun]), LT_OK);
                loss[rerun] = r.loss_sum;
                if (!rerun) memcpy(gk, lt_model_lora_grads(m, NULL), (size_t)n * 4);
            }
            /* every:2 on two layers is one segment, the last, which keeps no attention output */
            if (v & 1 && lt_model_get_config(m)->L <= 2) assert_true(act[0] == act[1]);
            else assert_true(act[0] > act[1]);
            if (loss[0] != loss[1] || memcmp(tl[0], tl[1], (size_t)N * 4) ||
                memcmp(gk, lt_model_lora_grads(m, NULL), (size_t)n * 4)) {
                fprintf(stderr, "%s variant %d: kept q/k/v differs from the rerun (loss %.9g vs %.9g)\n", CASES[ci], v,
                        loss[0], loss[1]);
                fail();
            }
        }
        free(gk);
        lt_model_free(ctx, m);
        lt_safetensors_close(ctx, f.exp);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        lt_ctx_free(ctx);
    }
}

/* The planner's numbers are the allocator's numbers. */
static void size_table_equals_allocations(void **state) {
    (void)state;
    const lt_recompute pol[3] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K};
    for (int pi = 0; pi < 3; pi++)
        for (int fo = 0; fo < 2; fo++)
            for (int var = 0; var < 2; var++) {
                /* var 1: 5-row chunks, bf16 checkpoints and kept attention, or none kept */
                lt_ctx *ctx = lt_ctx_new();
                char dir[1024];
                case_dir("qwen2_untied", dir, sizeof dir);
                lt_lora_options lo = {0};
                lo.rank = 4;
                lo.num_layers = 1;
                lo.targets = (1u << LT_PROJ_Q) | (1u << LT_PROJ_DOWN);
                lt_model_options mo = {0};
                mo.quantize_dtype = pi == 1 ? LT_DTYPE_INT4_G64 : LT_DTYPE_F32;
                lt_model_config cfg;
                assert_int_equal(lt_model_inspect(ctx, dir, &mo, &cfg), LT_OK);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
                lt_model_run_options ro = {0};
                ro.B = 3, ro.T = 12, ro.recompute = pol[pi], ro.recompute_k = 2, ro.forward_only = fo;
                if (var) ro.chunk_rows = 5, ro.saved_bf16 = 1, ro.recompute_attention = pi == 2;
                lt_model_sizes want;
                assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
                lt_model *m = NULL;
                assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &m), LT_OK);
                assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                lt_model_sizes got = lt_model_get_sizes(m);
                for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, want.total);
                assert_int_equal(got.n_lora_params, 4 * (64 + 64) + 4 * (128 + 64));
                if (pi == 1) assert_int_equal(cfg.proj_dtype[LT_PROJ_Q], LT_DTYPE_INT4_G64);
                /* A step allocates nothing. */
                fixture f;
                open_fixture(ctx, "qwen2_untied", &f);
                size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
                lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
                lt_model_batch b = fixture_batch(&f);
                lt_model_result r;
                if (fo) assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_OK);
                else assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes, before);
                lt_safetensors_close(ctx, f.exp);
                lt_model_free(ctx, m);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
                lt_ctx_free(ctx);
            }
}

/* bf16_products = 1: llama_tied's bf16 projections multiply x rounded to bf16 (the CPU through
 * oneDNN), as the CUDA products do. Loss and gradients move by bf16 rounding of the products'
 * inputs only (saved_bf16's bounds below: a few u per layer traversal), and they do move (the
 * path ran); the step allocates nothing and the size table holds the workspace it used. A build
 * without oneDNN refuses the option by name. */
static void bf16_products_step(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    open_fixture(ctx, "llama_tied", &f);
    lt_model *m = load_case(ctx, "llama_tied", &f, 0);
    assert_int_equal(lt_model_get_config(m)->proj_dtype[LT_PROJ_Q], LT_DTYPE_BF16);
    int64_t n;
    float *p = lt_model_lora_params(m, &n);
    uint64_t rng = lt_test_seed() + 29;
    lt_test_fill_normal(&rng, p, n, 0.1f); /* B != 0 so every gradient is live */
    lt_model_batch b = fixture_batch(&f);
    float *g0 = malloc((size_t)n * 4), loss[2] = {0, 0};
    assert_non_null(g0);
    for (int v = 0; v < 2; v++) {
        lt_model_run_options ro = {0};
        ro.B = f.B, ro.T = f.T, ro.recompute = LT_RECOMPUTE_EVERY, ro.bf16_products = v;
        lt_status st = lt_model_prepare(ctx, m, &ro);
        if (v && !lt_sys_cpu_bf16_products()) {
            assert_int_equal(st, LT_ERR_UNSUPPORTED);
            assert_non_null(strstr(lt_ctx_error(ctx), "bf16_products"));
            printf("      bf16 products refused: none on this CPU (no oneDNN, or no AVX-512)\n");
            break;
        }
        assert_int_equal(st, LT_OK);
        lt_model_sizes want;
        assert_int_equal(lt_model_size_table(ctx, lt_model_get_config(m), lt_model_get_lora(m), &ro, &want), LT_OK);
        assert_int_equal(lt_model_get_sizes(m).bytes[LT_MEM_WORKSPACE], want.bytes[LT_MEM_WORKSPACE]);
        size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
        lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
        lt_model_zero_grads(m);
        lt_model_result r;
        assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0.0f, &r, NULL), LT_OK);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes, before);
        loss[v] = (float)r.loss_sum;
        const float *g = lt_model_lora_grads(m, NULL);
        if (!v) {
            memcpy(g0, g, (size_t)n * 4);
            continue;
        }
        compare("bf16 products: loss", &loss[1], &loss[0], 1, 8 * 0x1.0p-8);
        double scale = 0, worst = 0;
        for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)g0[i]));
        for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)g[i] - g0[i]));
        printf("      bf16 products: loss %.7g against %.7g, gradients within %.3g of the largest\n", loss[1], loss[0],
               worst / scale);
        assert_true(worst <= 0x1.0p-3 * scale);
        assert_true(worst > 0 && loss[1] != loss[0]);
    }
    free(g0);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    lt_ctx_free(ctx);
}

/* QLoRA: --quantize holds projections as INT4_G64; the loss stays close to the f32 one. */
static void quantized_base_trains(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    open_fixture(ctx, "llama_tied", &f);
    lt_model *m = load_case(ctx, "llama_tied", &f, 1);
    assert_int_equal(lt_model_get_config(m)->proj_dtype[LT_PROJ_DOWN], LT_DTYPE_INT4_G64);
    prepare(ctx, m, f.B, f.T, LT_RECOMPUTE_EVERY, 1);
    lt_model_batch b = fixture_batch(&f);
    lt_model_result r;
    lt_model_zero_grads(m);
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
    double loss = r.loss_sum / (double)r.n_tokens, want = ftensor(ctx, &f, "loss", NULL)[0];
    /* int4 with 64-wide groups perturbs 0.08-scale weights by ~1/30 of their range */
    assert_true(fabs(loss - want) < 0.05 * want);
    int64_t n;
    float *g = lt_model_lora_grads(m, &n);
    double gn = 0;
    for (int64_t i = 0; i < n; i++) gn += (double)g[i] * g[i];
    assert_true(isfinite(gn) && gn > 0);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    lt_ctx_free(ctx);
}

static void bad_inputs_are_typed_errors(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    open_fixture(ctx, "llama_tied", &f);
    lt_model *m = load_case(ctx, "llama_tied", &f, 0);
    lt_model_batch b = fixture_batch(&f);
    lt_model_result r;
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_ERR_INVALID_ARG); /* not prepared */
    prepare(ctx, m, f.B, f.T, LT_RECOMPUTE_NONE, 0);
    int32_t tok[64];
    memcpy(tok, f.tokens, sizeof tok);
    tok[7] = 96;
    b.tokens = tok;
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "position 7"));
    /* Targets are checked on the host, before any upload (the CUDA loss no longer waits to check
     * them on the device): one past the vocabulary and a negative one that is not the ignore index
     * are refused by index, in forward and forward_backward alike. */
    int32_t tgt[64];
    b = fixture_batch(&f);
    memcpy(tgt, b.targets, sizeof tgt);
    tgt[11] = 96;
    b.targets = tgt;
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "target 96 at position 11"));
    tgt[11] = LT_IGNORE_INDEX;
    tgt[3] = -1;
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "target -1 at position 3"));
    tgt[3] = LT_IGNORE_INDEX;
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_OK);
    b = fixture_batch(&f);
    b.T = f.T + 1;
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_ERR_INVALID_ARG);
    /* LoRA state through get/set (the device-neutral path): a range outside is refused, a
     * round trip lands in the flat buffer. */
    int64_t n;
    float *lp = lt_model_lora_params(m, &n), two[2] = {0.25f, -0.5f}, back[2];
    assert_int_equal(lt_model_lora_get(ctx, m, 0, n - 1, 2, back), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "outside"));
    assert_int_equal(lt_model_lora_set(ctx, m, -1, 2, two), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_model_lora_set(ctx, m, n - 2, 2, two), LT_OK);
    assert_true(lp[n - 2] == 0.25f && lp[n - 1] == -0.5f);
    assert_int_equal(lt_model_lora_get(ctx, m, 1, n - 2, 2, back), LT_OK);
    assert_memory_equal(back, lt_model_lora_grads(m, NULL) + n - 2, sizeof back);
    assert_int_equal(lt_model_device_available(ctx, LT_DEVICE_CPU), LT_OK);
    /* Run options out of range are named. */
    lt_model_run_options ro = {0};
    ro.B = f.B, ro.T = f.T, ro.recompute = LT_RECOMPUTE_EVERY, ro.saved_bf16 = 2;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "saved_bf16"));
    ro.saved_bf16 = 0, ro.bf16_products = 2;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "bf16_products"));
    ro.bf16_products = 0, ro.chunk_rows = -3;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "chunk_rows"));
    b = fixture_batch(&f);
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_ERR_INVALID_ARG); /* no run left prepared */
    assert_non_null(strstr(lt_ctx_error(ctx), "lt_model_prepare"));
    /* A GPU model holds an f32 embedding/head as bf16 (what the CUDA loss reads); the host keeps f32. */
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);

    /* A folder whose weights lack a tensor, and one of an architecture we do not implement. */
    char dir[] = "/tmp/lt_test_model_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[256], src[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    case_dir("llama_tied", src, sizeof src);
    strcat(src, "/config.json");
    FILE *in = fopen(src, "r"), *out = fopen(p, "w");
    int ch;
    while ((ch = fgetc(in)) != EOF) fputc(ch, out);
    fclose(in), fclose(out);
    float w[64 * 2];
    for (int i = 0; i < 128; i++) w[i] = 1;
    int64_t sh[2] = {2, 64};
    lt_safetensors_entry e = {"model.embed_tokens.weight", lt_tensor_view(w, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh)};
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(lt_safetensors_write(ctx, p, &e, 1, NULL, 0), LT_OK);
    lt_model *bad = NULL;
    assert_int_equal(lt_model_load(ctx, dir, NULL, NULL, &bad), LT_ERR_NOT_FOUND);
    assert_non_null(strstr(lt_ctx_error(ctx), "model.layers.0.self_attn.q_proj.weight"));
    snprintf(p, sizeof p, "%s/config.json", dir);
    out = fopen(p, "w");
    fputs("{\"model_type\":\"gpt_neox\",\"vocab_size\":96,\"hidden_size\":64}", out);
    fclose(out);
    assert_int_equal(lt_model_load(ctx, dir, NULL, NULL, &bad), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "gpt_neox"));
    assert_null(bad);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void write_bytes(const char *path, const void *buf, size_t size) {
    FILE *out = fopen(path, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(buf, 1, size, out), size);
    assert_int_equal(fclose(out), 0);
}

/* A GGUF whose rope_freqs.weight holds a zero (then a negative factor): llama3_untied's file with
 * its last factor replaced is refused at load with LT_ERR_FORMAT naming the file, the tensor, the
 * index and the value, and leaks nothing. */
static void gguf_bad_rope_factor_is_named(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char src[1200], dir[] = "/tmp/lt_test_rope_freqs_XXXXXX", p[256];
    assert_non_null(mkdtemp(dir));
    case_dir("llama3_untied", src, sizeof src);
    strcat(src, "/model.gguf");
    lt_gguf *gg = NULL;
    assert_int_equal(lt_gguf_open(ctx, src, &gg), LT_OK);
    lt_tensor t;
    assert_int_equal(lt_gguf_find_tensor(ctx, gg, "rope_freqs.weight", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_F32);
    float fac[64];
    const size_t nf = (size_t)lt_tensor_numel(&t);
    assert_true(nf >= 2 && nf <= 64);
    memcpy(fac, t.data, nf * sizeof(float));
    lt_gguf_close(gg);
    FILE *in = fopen(src, "rb");
    assert_non_null(in);
    assert_int_equal(fseek(in, 0, SEEK_END), 0);
    const size_t size = (size_t)ftell(in);
    rewind(in);
    unsigned char *buf = malloc(size);
    assert_int_equal(fread(buf, 1, size, in), size);
    fclose(in);
    size_t at = 0, hits = 0; /* where the factors lie in the file: their bytes occur once */
    for (size_t o = 0; o + nf * sizeof(float) <= size; o++)
        if (!memcmp(buf + o, fac, nf * sizeof(float))) at = o, hits++;
    assert_int_equal(hits, 1);
    snprintf(p, sizeof p, "%s/model.gguf", dir);
    write_bytes(p, buf, size); /* the copy as it is loads: the refusals below are the factor's */
    lt_model *good = NULL;
    assert_int_equal(lt_model_load(ctx, p, NULL, NULL, &good), LT_OK);
    lt_model_free(ctx, good);
    const float bad[] = {0.0f, -1.0f};
    const char *want[] = {"] = 0 (a frequency factor must be finite and positive)",
                          "] = -1 (a frequency factor must be finite and positive)"};
    for (int i = 0; i < 2; i++) {
        memcpy(buf + at + (nf - 1) * sizeof(float), &bad[i], sizeof(float));
        write_bytes(p, buf, size);
        lt_model *m = NULL;
        assert_int_equal(lt_model_load(ctx, p, NULL, NULL, &m), LT_ERR_FORMAT);
        assert_null(m);
        char name[64];
        snprintf(name, sizeof name, "rope_freqs.weight[%zu", nf - 1);
        const char *err = lt_ctx_error(ctx);
        if (!strstr(err, p) || !strstr(err, name) || !strstr(err, want[i])) fail_msg("message: %s", err);
    }
    free(buf);
    unlink(p);
    rmdir(dir);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* F16 safetensors: the llama_tied weights are bf16 values, which f16 holds exactly (bar a few
 * f16 subnormals, off by < 3e-8), so the f16 copy must match the same oracle. Exercises f16
 * projections (dequantized tile by tile) and an f16 tied embedding (widened to f32 for the head). */
static void f16_safetensors_match(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char src[1200], dir[] = "/tmp/lt_test_f16_XXXXXX", p[256];
    assert_non_null(mkdtemp(dir));
    case_dir("llama_tied", src, sizeof src);
    strcat(src, "/model.safetensors");
    lt_safetensors *st = NULL;
    assert_int_equal(lt_safetensors_open(ctx, src, &st), LT_OK);
    int64_t n = lt_safetensors_count(st);
    lt_safetensors_entry *e = calloc((size_t)n, sizeof *e);
    for (int64_t i = 0; i < n; i++) {
        lt_tensor t;
        assert_int_equal(lt_safetensors_find(ctx, st, lt_safetensors_name(st, i), &t), LT_OK);
        assert_int_equal(t.dtype, LT_DTYPE_BF16);
        int64_t k = lt_tensor_numel(&t);
        uint16_t *h = malloc((size_t)k * 2);
        for (int64_t j = 0; j < k; j++) h[j] = lt_f32_to_f16(lt_bf16_to_f32(((const uint16_t *)t.data)[j]));
        e[i].name = lt_safetensors_name(st, i);
        e[i].tensor = lt_tensor_view(h, LT_DTYPE_F16, LT_DEVICE_CPU, t.ndim, t.shape);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(lt_safetensors_write(ctx, p, e, n, NULL, 0), LT_OK);
    for (int64_t i = 0; i < n; i++) free(e[i].tensor.data);
    free(e);
    lt_safetensors_close(ctx, st);
    case_dir("llama_tied", src, sizeof src);
    strcat(src, "/config.json");
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *in = fopen(src, "r"), *out = fopen(p, "w");
    int ch;
    while ((ch = fgetc(in)) != EOF) fputc(ch, out);
    fclose(in), fclose(out);
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &cfg), LT_OK);
    assert_int_equal(cfg.proj_dtype[LT_PROJ_Q], LT_DTYPE_F16);
    assert_int_equal(cfg.embed_dtype, LT_DTYPE_F32);
    /* A GPU model holds an f16/f32 embedding/head as bf16 (what the CUDA loss reads). */
    lt_model_options mo = {0};
    mo.device = LT_DEVICE_CUDA;
    assert_int_equal(lt_model_inspect(ctx, dir, &mo, &cfg), LT_OK);
    assert_int_equal(cfg.embed_dtype, LT_DTYPE_BF16);
    assert_int_equal(cfg.head_dtype, LT_DTYPE_BF16);
    assert_int_equal(cfg.proj_dtype[LT_PROJ_Q], LT_DTYPE_F16);
    lt_ctx_free(ctx);
    check_against_oracle("llama_tied", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* Every allocation of load and prepare can fail; each failure is LT_ERR_OOM and leaks nothing. */
static void every_allocation_failure_is_clean(void **state) {
    (void)state;
    char dir[1024];
    case_dir("qwen3_tied", dir, sizeof dir);
    int done = 0;
    for (uint64_t nth = 1; nth < 200 && !done; nth++) {
        lt_ctx *ctx = lt_ctx_new();
        lt_mem_fail_nth(ctx, nth);
        lt_model *m = NULL;
        lt_status s = lt_model_load(ctx, dir, NULL, NULL, &m);
        if (s == LT_OK) {
            lt_model_run_options ro = {0};
            ro.B = 2, ro.T = 12, ro.recompute = LT_RECOMPUTE_EVERY;
            s = lt_model_prepare(ctx, m, &ro);
            done = s == LT_OK;
            lt_model_free(ctx, m);
        } else {
            assert_null(m);
        }
        if (!done) assert_int_equal(s, LT_ERR_OOM);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        lt_ctx_free(ctx);
    }
    assert_true(done);
}

/* With LoRA dropout the gradient is still the derivative of the loss the step computed (same step
 * → same masks): a central difference along a random direction agrees with ⟨g, u⟩; another step
 * draws other masks. */
static void dropout_gradients_are_consistent(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 11;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    open_fixture(ctx, "qwen2_untied", &f);
    char dir[1024];
    case_dir("qwen2_untied", dir, sizeof dir);
    lt_lora_options lo = {0};
    lo.rank = 4, lo.alpha = 8, lo.dropout = 0.3f, lo.seed = 5;
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
    prepare(ctx, m, f.B, f.T, LT_RECOMPUTE_EVERY, 1);
    int64_t n;
    float *p = lt_model_lora_params(m, &n);
    lt_test_fill_normal(&rng, p, n, 0.1f); /* B ≠ 0 so every gradient is live */
    lt_model_batch b = fixture_batch(&f);
    b.step = 3;
    lt_model_result r0, r1, r2;
    lt_model_zero_grads(m);
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r0, NULL), LT_OK);
    float *g = malloc((size_t)n * 4), *u = malloc((size_t)n * 4), *p0 = malloc((size_t)n * 4);
    memcpy(g, lt_model_lora_grads(m, NULL), (size_t)n * 4);
    memcpy(p0, p, (size_t)n * 4);
    lt_test_fill_normal(&rng, u, n, 1.0f);
    /* A purely random direction is nearly orthogonal to g (|g·u| ~ |g||u|/sqrt(n)), where the
     * finite difference is dominated by the loss's fp32 rounding; tilting u towards g keeps the
     * random part and makes g·u ~ |g||u|, so the relative tolerance means something. */
    double gg = 0, nn = 0;
    for (int64_t i = 0; i < n; i++) gg += (double)g[i] * g[i], nn += (double)u[i] * u[i];
    for (int64_t i = 0; i < n; i++) u[i] += (float)(sqrt(nn / gg) * g[i]);
    double gu = 0, un = 0;
    for (int64_t i = 0; i < n; i++) gu += (double)g[i] * u[i], un += (double)u[i] * u[i];
    double eps = 1e-2 / sqrt(un);
    for (int64_t i = 0; i < n; i++) p[i] = p0[i] + (float)eps * u[i];
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r1, NULL), LT_OK);
    for (int64_t i = 0; i < n; i++) p[i] = p0[i] - (float)eps * u[i];
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r2, NULL), LT_OK);
    double fd = (r1.loss_sum - r2.loss_sum) / (double)r0.n_tokens / (2 * eps);
    fprintf(stderr, "dropout: directional derivative %.6g, finite difference %.6g\n", gu, fd);
    assert_true(fabs(fd - gu) <= 2e-2 * fabs(gu) + 1e-4);
    memcpy(p, p0, (size_t)n * 4);
    b.step = 4;
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r1, NULL), LT_OK);
    assert_true(r1.loss_sum != r0.loss_sum);
    b.step = 3;
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r2, NULL), LT_OK);
    assert_true(r2.loss_sum == r0.loss_sum);
    free(g), free(u), free(p0);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    lt_ctx_free(ctx);
}

/* saved_bf16 = 1 rounds the checkpoints, the kept attention outputs and attention's inputs,
 * outputs and gradients to bf16 (8 significant bits, unit roundoff u = 2^-8), as the CUDA model
 * does by default; the rest stays f32. The loss, a mean of token losses, carries a few u (the
 * CUDA trainer's test allows 8 u). A gradient moves by a few u per layer traversal (that test
 * allows 4 u per traversal): forward and backward of the fixtures' L <= 3 layers give at most
 * 24 u, rounded up to 2^-3 of the largest gradient. Structural mistakes (a stale chunk, a missed
 * row) give errors of order 1. */
#define SAVED_BF16_LOSS (8 * 0x1.0p-8)
#define SAVED_BF16_REL 0x1.0p-3

/* Position-wise chunks change only the summation order of the LoRA gradients (fp32 rounding):
 * every policy, with and without kept attention, at 5 rows per chunk (the fixture's 36 rows are 8
 * chunks, the last one short) against one chunk, with LoRA dropout on (masks are drawn per
 * element index, whichever chunk holds it). bf16 saving (the CUDA model's layout, run here on the
 * CPU's bf16 attention) moves loss and gradients by bf16 rounding only. */
static void chunks_and_bf16_checkpoints(void **state) {
    (void)state;
    static const char *const cases[2] = {"qwen3_tied", "qwen2_untied"};
    for (int ci = 0; ci < 2; ci++) {
        uint64_t rng = lt_test_seed() + 17 + (uint64_t)ci;
        lt_ctx *ctx = lt_ctx_new();
        fixture f;
        open_fixture(ctx, cases[ci], &f);
        char dir[1024];
        case_dir(cases[ci], dir, sizeof dir);
        lt_lora_options lo = {0};
        lo.rank = 4, lo.alpha = 8, lo.dropout = ci ? 0.25f : 0.0f, lo.seed = 9;
        lt_model *m = NULL;
        assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
        int64_t n, N = f.B * f.T;
        float *p = lt_model_lora_params(m, &n);
        lt_test_fill_normal(&rng, p, n, 0.1f); /* B != 0 so every gradient is live */
        lt_model_batch b = fixture_batch(&f);
        b.step = 2;
        float *g0 = malloc((size_t)n * 4), *gf = malloc((size_t)n * 4), tl0[64], tl[64];
        assert_true(g0 && gf);
        double loss0 = 0, moved = 0;
        /* v = 0: the reference (one chunk); then 5-row chunks under each policy with f32 and bf16
         * checkpoints. */
        for (int v = 0; v < 13; v++) {
            const lt_recompute pol[3] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K};
            lt_model_run_options ro = {0};
            int w = v ? v - 1 : 0, bf16 = w >= 6;
            ro.B = f.B, ro.T = f.T, ro.recompute = pol[w % 3], ro.recompute_k = 2;
            ro.recompute_attention = (w / 3) % 2;
            ro.chunk_rows = v ? 5 : 0;
            ro.saved_bf16 = bf16 ? 1 : -1;
            if (bf16 && ro.recompute == LT_RECOMPUTE_NONE) continue; /* nothing is checkpointed */
            assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
            lt_model_zero_grads(m);
            lt_model_result r;
            for (int64_t i = 0; i < N; i++) tl[i] = LT_TEST_POISON;
            assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0.0f, &r, tl), LT_OK);
            const float *g = lt_model_lora_grads(m, NULL);
            char what[200];
            snprintf(what, sizeof what, "%s variant %d (policy %d, recompute attention %d, %s checkpoints)", cases[ci],
                     v, w % 3, ro.recompute_attention, bf16 ? "bf16" : "f32");
            if (v == 0) {
                loss0 = r.loss_sum;
                memcpy(tl0, tl, sizeof tl);
                memcpy(g0, g, (size_t)n * 4);
                continue;
            }
            float l1 = (float)r.loss_sum, l0 = (float)loss0;
            compare(what, &l1, &l0, 1, bf16 ? SAVED_BF16_LOSS : SAME_REL);
            compare(what, tl, tl0, N, bf16 ? SAVED_BF16_LOSS : SAME_REL);
            if (!bf16) {
                compare(what, g, g0, n, SAME_REL);
                if (w % 3 == 0) memcpy(gf, g, (size_t)n * 4);
                continue;
            }
            double scale = 0, worst = 0;
            for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)gf[i]));
            for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)g[i] - gf[i]));
            fprintf(stderr, "  %s: loss %.6g vs %.6g, grads relative to f32 saving %.3g\n", what, (double)l1,
                    (double)l0, worst / scale);
            moved = fmax(moved, worst / scale);
            compare(what, g, gf, n, SAVED_BF16_REL);
        }
        assert_true(moved > 0); /* the rounding is real */
        free(g0), free(gf);
        lt_model_free(ctx, m);
        lt_safetensors_close(ctx, f.exp);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        lt_ctx_free(ctx);
    }
}

/* The per-layer description: what each family's config expands to (uniform today, loaded models
 * carry it), a sliding-window pattern, and the one check refusing the kinds the step cannot run,
 * at load's layout and in the planner's size table alike, naming the layer and the kind. */
static void layer_descriptions(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    static const struct {
        const char *c;
        int qkv_bias, qk_norm;
    } fam[] = {{"llama_tied", 0, 0}, {"qwen2_untied", 1, 0}, {"qwen3_tied", 0, 1}};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        fixture f;
        open_fixture(ctx, fam[i].c, &f);
        lt_model *m = load_case(ctx, fam[i].c, &f, 0);
        const lt_model_config *cfg = lt_model_get_config(m);
        for (int64_t l = 0; l < cfg->L; l++) {
            const lt_layer_desc *d = lt_model_get_layer(m, l);
            lt_layer_desc want;
            lt_model_describe_layer(cfg, l, &want);
            assert_non_null(d);
            assert_memory_equal(d, &want, sizeof want);
            assert_int_equal(d->attn, LT_ATTN_KIND_FULL);
            assert_int_equal(d->window, 0);
            assert_int_equal(d->D, cfg->D);
            assert_true(d->softcap == 0.0f);
            assert_int_equal(d->qkv_bias, fam[i].qkv_bias);
            assert_int_equal(d->qk_norm, fam[i].qk_norm);
            assert_int_equal(d->norm, LT_NORM_PLACE_PRE);
            assert_int_equal(d->mlp, LT_MLP_KIND_SWIGLU);
            assert_int_equal(d->rope, 0);
        }
        assert_null(lt_model_get_layer(m, -1));
        assert_null(lt_model_get_layer(m, cfg->L));
        assert_int_equal(lt_model_check_layers(ctx, cfg), LT_OK);
        lt_model_free(ctx, m);
        lt_safetensors_close(ctx, f.exp);
    }
    lt_model_config c;
    char dir[1200], path[1300];
    case_dir("qwen3_tied", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(lt_model_config_read_hf(ctx, path, &c), LT_OK);
    lt_model_run_options run = {0};
    run.B = 1, run.T = 16;
    lt_model_sizes full, slid;
    assert_int_equal(lt_model_size_table(ctx, &c, NULL, &run, &full), LT_OK);
    /* Alternating local and global layers: every second layer keeps full attention. */
    lt_model_config w = c;
    w.sliding_window = 4, w.sliding_period = 2, w.L = 4;
    for (int64_t l = 0; l < w.L; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(&w, l, &d);
        assert_int_equal(d.attn, l % 2 ? LT_ATTN_KIND_FULL : LT_ATTN_KIND_SLIDING);
        assert_int_equal(d.window, l % 2 ? 0 : 4);
    }
    w.L = c.L;
    assert_int_equal(lt_model_check_layers(ctx, &w), LT_OK);
    assert_int_equal(lt_model_size_table(ctx, &w, NULL, &run, &slid), LT_OK);
    assert_int_equal(slid.total, full.total); /* the CPU kernel's workspace does not grow with a window */
    /* Refused kinds: one typed error naming the layer and the kind, before any size is priced. */
    lt_model_config bad = c;
    bad.norm_place = LT_NORM_PLACE_POST;
    assert_int_equal(lt_model_check_layers(ctx, &bad), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "layer 0 has a post-norm block"));
    assert_int_equal(lt_model_size_table(ctx, &bad, NULL, &run, &slid), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "post-norm"));
    bad = c;
    bad.mlp = LT_MLP_KIND_MOE;
    assert_int_equal(lt_model_check_layers(ctx, &bad), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "mixture-of-experts"));
    bad = c;
    bad.sliding_window = -1;
    assert_int_equal(lt_model_check_layers(ctx, &bad), LT_ERR_INVALID_ARG);
    bad = c;
    bad.attn_softcap = -2.0f;
    assert_int_equal(lt_model_check_layers(ctx, &bad), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "softcap"));
    lt_ctx_free(ctx);
}

int main(int argc, char **argv) {
    (void)argc;
    lt_test_omp_passive(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matches_pytorch_peft),
        cmocka_unit_test(gguf_matches_pytorch_peft),
        cmocka_unit_test(f16_safetensors_match),
        cmocka_unit_test(packed_equals_unpacked),
        cmocka_unit_test(size_table_equals_allocations),
        cmocka_unit_test(quantized_base_trains),
        cmocka_unit_test(bf16_products_step),
        cmocka_unit_test(bad_inputs_are_typed_errors),
        cmocka_unit_test(gguf_bad_rope_factor_is_named),
        cmocka_unit_test(every_allocation_failure_is_clean),
        cmocka_unit_test(dropout_gradients_are_consistent),
        cmocka_unit_test(chunks_and_bf16_checkpoints),
        cmocka_unit_test(kept_qkv_equals_rerun_attention),
        cmocka_unit_test(layer_descriptions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
