/* Export of a mixture-of-experts base (tests/fixtures/moe/qwen3moe, Qwen3-MoE, E = 8) with LoRA on
 * its experts. Every merged expert matrix equals base + s·B_e·A_e computed here in float64:
 *   - from PEFT's own adapter (tests/fixtures/moe/peft_experts/both), its factors read in PEFT's
 *     layout (A_e = A[e·r : (e+1)·r], B_e[o, j] = B[o, j·E + e]);
 *   - from a fresh random adapter written by longtune (PEFT folder and training checkpoint), its
 *     factors read in longtune's storage (gate stack, up stack, down stack).
 * The HF folder holds per-expert tensors, the GGUF the stacks blk.N.ffn_{gate,up,down}_exps
 * (E, rows, cols) (from the HF and from the GGUF base); the GGUF LoRA holds 3-D factors
 * ffn_*_exps.lora_a (E, r, in) and lora_b (E, rows, r), gate_up's A under both gate and up.
 * A block-quantized base (tests/fixtures/moe/quant/model_q.gguf: Q4_0 gate/up, Q8_0 down) merges
 * into its own types within half a quantization step of base + delta, and exactly into f32.
 * Refused with typed errors: an expert adapter onto a base without experts (naming the tensor),
 * GGUF output of what llama.cpp's qwen3moe cannot run (a dense layer, top-k not renormalised).
 * Qwen2-MoE's shared expert round-trips with the rest. */
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
#include "longtune/export_model.h"
#include "longtune/gguf.h"
#include "longtune/safetensors.h"
#include "longtune/tensor.h"
#include "longtune/train.h"
#include "train/train_internal.h"

#define E_ 8
#define C_ 32
#define F_ 16
#define L_ 2

/* The adapter's expert factors per layer in float64, per expert: A_gu[e] (r, C), Bg[e] (F, r),
 * Bu[e] (F, r), A_d[e] (r, F), Bd[e] (C, r). */
typedef struct {
    int64_t r;
    double scale;
    double *agu, *bg, *bu, *ad, *bd; /* [L][E][...] */
} factors;

static void factors_alloc(factors *f, int64_t r, double scale) {
    f->r = r;
    f->scale = scale;
    size_t n = (size_t)(L_ * E_);
    f->agu = calloc(n * (size_t)(r * C_), sizeof(double));
    f->bg = calloc(n * (size_t)(F_ * r), sizeof(double));
    f->bu = calloc(n * (size_t)(F_ * r), sizeof(double));
    f->ad = calloc(n * (size_t)(r * F_), sizeof(double));
    f->bd = calloc(n * (size_t)(C_ * r), sizeof(double));
}

static void factors_free(factors *f) { free(f->agu), free(f->bg), free(f->bu), free(f->ad), free(f->bd); }

static void tensor_f32(lt_ctx *ctx, lt_safetensors *st, const char *name, int64_t d0, int64_t d1, const float **out) {
    lt_tensor t;
    if (lt_safetensors_find(ctx, st, name, &t) != LT_OK) fprintf(stderr, "missing %s\n", name);
    assert_int_equal(lt_safetensors_find(ctx, st, name, &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_F32);
    assert_int_equal(t.shape[0], d0);
    assert_int_equal(t.shape[1], d1);
    *out = t.data;
}

/* PEFT's layout, as its ParamWrapper computes delta_e. */
static void factors_from_peft(lt_ctx *ctx, const char *dir, factors *f) {
    char path[800];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    lt_safetensors *st;
    assert_int_equal(lt_safetensors_open(ctx, path, &st), LT_OK);
    int64_t r = f->r, rE = r * E_;
    for (int64_t l = 0; l < L_; l++) {
        char k[256];
        const float *A, *B, *Ad, *Bd;
        snprintf(k, sizeof k, "base_model.model.model.layers.%lld.mlp.experts.base_layer.lora_A.weight", (long long)l);
        tensor_f32(ctx, st, k, rE, C_, &A);
        snprintf(k, sizeof k, "base_model.model.model.layers.%lld.mlp.experts.base_layer.lora_B.weight", (long long)l);
        tensor_f32(ctx, st, k, 2 * F_, rE, &B);
        snprintf(k, sizeof k, "base_model.model.model.layers.%lld.mlp.experts.lora_A.weight", (long long)l);
        tensor_f32(ctx, st, k, rE, F_, &Ad);
        snprintf(k, sizeof k, "base_model.model.model.layers.%lld.mlp.experts.lora_B.weight", (long long)l);
        tensor_f32(ctx, st, k, C_, rE, &Bd);
        for (int64_t e = 0; e < E_; e++) {
            int64_t le = l * E_ + e;
            for (int64_t j = 0; j < r; j++) {
                for (int64_t i = 0; i < C_; i++) f->agu[(le * r + j) * C_ + i] = A[(e * r + j) * C_ + i];
                for (int64_t i = 0; i < F_; i++) f->ad[(le * r + j) * F_ + i] = Ad[(e * r + j) * F_ + i];
                for (int64_t o = 0; o < F_; o++) {
                    f->bg[(le * F_ + o) * r + j] = B[o * rE + j * E_ + e];
                    f->bu[(le * F_ + o) * r + j] = B[(F_ + o) * rE + j * E_ + e];
                }
                for (int64_t o = 0; o < C_; o++) f->bd[(le * C_ + o) * r + j] = Bd[o * rE + j * E_ + e];
            }
        }
    }
    lt_safetensors_close(ctx, st);
}

/* base + s·B_e·A_e of expert e's matrix w (0 gate, 1 up, 2 down) in layer l, row o, column i. */
static double want_elem(const factors *f, const float *base, int64_t l, int w, int64_t e, int64_t o, int64_t i) {
    int64_t le = l * E_ + e, r = f->r, cols = w == 2 ? F_ : C_;
    double d = 0;
    for (int64_t j = 0; j < r; j++) {
        double b = w == 0 ? f->bg[(le * F_ + o) * r + j]
            : w == 1      ? f->bu[(le * F_ + o) * r + j]
                          : f->bd[(le * C_ + o) * r + j];
        double a = w == 2 ? f->ad[(le * r + j) * F_ + i] : f->agu[(le * r + j) * C_ + i];
        d += b * a;
    }
    return (double)base[o * cols + i] + f->scale * d;
}

static const char *const hf_w[3] = {"gate_proj", "up_proj", "down_proj"};
static const char *const gg_w[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};

static char base_dir[600], base_gguf[700];

/* Compares every merged expert element of an HF export (gguf == NULL) or GGUF export. */
static void check_merged(lt_ctx *ctx, const char *out, int gguf, const factors *f) {
    lt_safetensors *bs, *os = NULL;
    lt_gguf *og = NULL;
    char path[800];
    snprintf(path, sizeof path, "%s/model.safetensors", base_dir);
    assert_int_equal(lt_safetensors_open(ctx, path, &bs), LT_OK);
    if (gguf) assert_int_equal(lt_gguf_open(ctx, out, &og), LT_OK);
    else {
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        assert_int_equal(lt_safetensors_open(ctx, path, &os), LT_OK);
    }
    double worst = 0, delta = 0;
    for (int64_t l = 0; l < L_; l++)
        for (int w = 0; w < 3; w++) {
            int64_t rows = w == 2 ? C_ : F_, cols = w == 2 ? F_ : C_;
            const float *stack = NULL;
            if (gguf) {
                char k[128];
                lt_tensor t;
                snprintf(k, sizeof k, "blk.%lld.%s.weight", (long long)l, gg_w[w]);
                assert_int_equal(lt_gguf_find_tensor(ctx, og, k, &t), LT_OK);
                assert_int_equal(t.ndim, 3);
                assert_int_equal(t.shape[0], E_);
                assert_int_equal(t.shape[1], rows);
                assert_int_equal(t.shape[2], cols);
                assert_int_equal(t.dtype, LT_DTYPE_F32);
                stack = t.data;
            }
            for (int64_t e = 0; e < E_; e++) {
                char k[160];
                const float *base, *got;
                snprintf(k, sizeof k, "model.layers.%lld.mlp.experts.%lld.%s.weight", (long long)l, (long long)e,
                         hf_w[w]);
                tensor_f32(ctx, bs, k, rows, cols, &base);
                if (gguf) got = stack + e * rows * cols;
                else tensor_f32(ctx, os, k, rows, cols, &got);
                for (int64_t o = 0; o < rows; o++)
                    for (int64_t i = 0; i < cols; i++) {
                        double want = want_elem(f, base, l, w, e, o, i);
                        worst = fmax(worst, fabs((double)got[o * cols + i] - want));
                        delta = fmax(delta, fabs(want - (double)base[o * cols + i]));
                    }
            }
        }
    fprintf(stderr, "%s: merged experts max |err| %.3g (delta up to %.3g)\n", out, worst, delta);
    assert_true(delta > 0.05); /* the adapter moves the weights */
    assert_true(worst <= 1e-5);
    lt_safetensors_close(ctx, bs);
    if (os) lt_safetensors_close(ctx, os);
    if (og) lt_gguf_close(og);
}

/* The GGUF LoRA's expert factors equal the adapter's. */
static void check_gguf_lora(lt_ctx *ctx, const char *path, const factors *f) {
    lt_gguf *g;
    assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
    int64_t r = f->r;
    for (int64_t l = 0; l < L_; l++)
        for (int w = 0; w < 3; w++) {
            int64_t rows = w == 2 ? C_ : F_, in = w == 2 ? F_ : C_;
            char k[128];
            lt_tensor a, b;
            snprintf(k, sizeof k, "blk.%lld.%s.weight.lora_a", (long long)l, gg_w[w]);
            assert_int_equal(lt_gguf_find_tensor(ctx, g, k, &a), LT_OK);
            snprintf(k, sizeof k, "blk.%lld.%s.weight.lora_b", (long long)l, gg_w[w]);
            assert_int_equal(lt_gguf_find_tensor(ctx, g, k, &b), LT_OK);
            assert_int_equal(a.ndim, 3);
            assert_int_equal(b.ndim, 3);
            int64_t sa[3] = {E_, r, in}, sb[3] = {E_, rows, r};
            assert_memory_equal(a.shape, sa, sizeof sa);
            assert_memory_equal(b.shape, sb, sizeof sb);
            const float *A = a.data, *B = b.data;
            for (int64_t e = 0; e < E_; e++) {
                int64_t le = l * E_ + e;
                for (int64_t j = 0; j < r; j++)
                    for (int64_t i = 0; i < in; i++)
                        assert_true(A[(e * r + j) * in + i] ==
                                    (float)(w == 2 ? f->ad[(le * r + j) * F_ + i] : f->agu[(le * r + j) * C_ + i]));
                for (int64_t o = 0; o < rows; o++)
                    for (int64_t j = 0; j < r; j++) {
                        double want = w == 0 ? f->bg[(le * F_ + o) * r + j]
                            : w == 1         ? f->bu[(le * F_ + o) * r + j]
                                             : f->bd[(le * C_ + o) * r + j];
                        assert_true(B[(e * rows + o) * r + j] == (float)want);
                    }
            }
        }
    lt_gguf_close(g);
}

static void export_ok(lt_ctx *ctx, const char *base, const char *adapter, const char *out, lt_export_format fmt) {
    lt_export_options o;
    memset(&o, 0, sizeof o);
    o.format = fmt, o.adapter = adapter, o.overwrite = 1;
    o.outtype = LT_DTYPE_F32, o.outtype_set = fmt != LT_EXPORT_GGUF_LORA;
    lt_export_report rep;
    lt_status s = lt_export_model(ctx, base, out, &o, &rep);
    if (s != LT_OK) fprintf(stderr, "%s: %s\n", out, lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
}

static void rm_rf(const char *p) {
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    assert_int_equal(system(cmd), 0);
}

static void peft_adapter_merges(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char adapter[700], tmp[256], out[400];
    snprintf(adapter, sizeof adapter, "%s/tests/fixtures/moe/peft_experts/both", lt_test_source_dir());
    snprintf(tmp, sizeof tmp, "/tmp/lt_test_export_moe_%ld", (long)getpid());
    mkdir(tmp, 0755);
    factors f;
    factors_alloc(&f, 2, 4.0 / 2.0);
    factors_from_peft(ctx, adapter, &f);
    snprintf(out, sizeof out, "%s/hf", tmp);
    export_ok(ctx, base_dir, adapter, out, LT_EXPORT_HF);
    check_merged(ctx, out, 0, &f);
    snprintf(out, sizeof out, "%s/hf_from_gguf", tmp);
    export_ok(ctx, base_gguf, adapter, out, LT_EXPORT_HF);
    check_merged(ctx, out, 0, &f);
    snprintf(out, sizeof out, "%s/m.gguf", tmp);
    export_ok(ctx, base_dir, adapter, out, LT_EXPORT_GGUF);
    check_merged(ctx, out, 1, &f);
    snprintf(out, sizeof out, "%s/m2.gguf", tmp);
    export_ok(ctx, base_gguf, adapter, out, LT_EXPORT_GGUF);
    check_merged(ctx, out, 1, &f);
    snprintf(out, sizeof out, "%s/lora.gguf", tmp);
    export_ok(ctx, base_gguf, adapter, out, LT_EXPORT_GGUF_LORA);
    check_gguf_lora(ctx, out, &f);
    factors_free(&f);
    rm_rf(tmp);
    lt_ctx_free(ctx);
}

/* A fresh random expert adapter saved by longtune as a PEFT folder and a checkpoint; both merge
 * to base + delta from the storage's own layout. */
static void longtune_adapter_and_checkpoint_merge(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed();
    const int64_t r = 3;
    const float alpha = 5;
    lt_lora_options lo = {0};
    lo.rank = r, lo.alpha = alpha;
    lo.targets = (1u << LT_PROJ_Q) | (1u << LT_PROJ_O) | LT_LORA_EXPERT_TARGETS;
    lt_model *m;
    lt_status s = lt_model_load(ctx, base_dir, NULL, &lo, &m);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    int64_t np;
    lt_model_lora_params(m, &np);
    float *v = lt_test_fresh(&rng, np, 0.2f), *mom = calloc((size_t)np, sizeof(float));
    assert_int_equal(lt_model_lora_set(ctx, m, 0, np, v), LT_OK);
    factors f;
    factors_alloc(&f, r, alpha / (double)r);
    int64_t n = lt_model_lora_count(m);
    lt_train_param *ps = calloc((size_t)n, sizeof *ps);
    for (int64_t i = 0; i < n; i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        const char *nm = t.name + strlen("base_model.model.");
        snprintf(ps[i].name, sizeof ps[i].name, "%.*s", (int)(strlen(nm) - strlen(".weight")), nm);
        ps[i].ndim = 2;
        ps[i].shape[0] = t.value.shape[0];
        ps[i].shape[1] = t.value.shape[1];
        ps[i].data = v + t.offset;
        ps[i].m = ps[i].v = mom + t.offset;
        if (!t.experts) continue;
        /* The storage (model.h): A (E·r, in); gate_up B the gate stack then the up stack
           (E·moe_F, r) each; down B (E·C, r). */
        const float *x = v + t.offset;
        int64_t l = t.layer;
        for (int64_t e = 0; e < E_; e++) {
            int64_t le = l * E_ + e;
            for (int64_t j = 0; j < r; j++) {
                if (!t.is_b && t.proj == LT_PROJ_GATE)
                    for (int64_t q = 0; q < C_; q++) f.agu[(le * r + j) * C_ + q] = x[(e * r + j) * C_ + q];
                if (!t.is_b && t.proj == LT_PROJ_DOWN)
                    for (int64_t q = 0; q < F_; q++) f.ad[(le * r + j) * F_ + q] = x[(e * r + j) * F_ + q];
                if (t.is_b && t.proj == LT_PROJ_GATE)
                    for (int64_t o = 0; o < F_; o++) {
                        f.bg[(le * F_ + o) * r + j] = x[(e * F_ + o) * r + j];
                        f.bu[(le * F_ + o) * r + j] = x[E_ * F_ * r + (e * F_ + o) * r + j];
                    }
                if (t.is_b && t.proj == LT_PROJ_DOWN)
                    for (int64_t o = 0; o < C_; o++) f.bd[(le * C_ + o) * r + j] = x[(e * C_ + o) * r + j];
            }
        }
    }
    char tmp[256], dir[400], ck[400], out[400];
    snprintf(tmp, sizeof tmp, "/tmp/lt_test_export_moe_lt_%ld", (long)getpid());
    mkdir(tmp, 0755);
    snprintf(dir, sizeof dir, "%s/adapter", tmp);
    snprintf(ck, sizeof ck, "%s/checkpoint.ltck", tmp);
    lt_train_options opt;
    memset(&opt, 0, sizeof opt);
    opt.lora_rank = r, opt.lora_alpha = alpha;
    snprintf(opt.lora_targets, sizeof opt.lora_targets, "q_proj,o_proj,experts.gate_up_proj,experts.down_proj");
    assert_int_equal(lt_peft_save_named(ctx, dir, "qwen3moe", &opt, ps, (int)n, m), LT_OK);
    lt_train_state st;
    memset(&st, 0, sizeof st);
    assert_int_equal(lt_checkpoint_save(ctx, ck, &opt, &st, ps, (int)n), LT_OK);
    lt_model_free(ctx, m);
    free(ps);
    free(mom);
    free(v);
    snprintf(out, sizeof out, "%s/hf_peft", tmp);
    export_ok(ctx, base_dir, dir, out, LT_EXPORT_HF);
    check_merged(ctx, out, 0, &f);
    snprintf(out, sizeof out, "%s/hf_ckpt", tmp);
    export_ok(ctx, base_dir, ck, out, LT_EXPORT_HF);
    check_merged(ctx, out, 0, &f);
    snprintf(out, sizeof out, "%s/ckpt.gguf", tmp);
    export_ok(ctx, base_gguf, ck, out, LT_EXPORT_GGUF);
    check_merged(ctx, out, 1, &f);
    snprintf(out, sizeof out, "%s/lora.gguf", tmp);
    export_ok(ctx, base_dir, ck, out, LT_EXPORT_GGUF_LORA);
    check_gguf_lora(ctx, out, &f);
    factors_free(&f);
    rm_rf(tmp);
    lt_ctx_free(ctx);
}

static void refusals(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char adapter[700], dense[700], tmp[256];
    snprintf(adapter, sizeof adapter, "%s/tests/fixtures/moe/peft_experts/both", lt_test_source_dir());
    snprintf(dense, sizeof dense, "%s/tests/fixtures/model/llama_tied", lt_test_source_dir());
    snprintf(tmp, sizeof tmp, "/tmp/lt_test_export_moe_dense_%ld", (long)getpid());
    lt_export_options o;
    memset(&o, 0, sizeof o);
    o.format = LT_EXPORT_HF, o.adapter = adapter;
    lt_status s = lt_export_model(ctx, dense, tmp, &o, NULL);
    fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_true(s == LT_ERR_UNSUPPORTED || s == LT_ERR_SHAPE);
    assert_non_null(strstr(lt_ctx_error(ctx), "experts"));
    struct stat sb;
    assert_int_not_equal(stat(tmp, &sb), 0); /* nothing written */
    /* What llama.cpp's qwen3moe cannot run is refused for GGUF, named. */
    static const char *const cases[][3] = {{"qwen3moe_dense1", "gguf", "layer 1 is a dense MLP"},
                                           {"qwen3moe_nonorm", "gguf", "norm_topk_prob false"}};
    for (int i = 0; i < 2; i++) {
        char b[700];
        snprintf(b, sizeof b, "%s/tests/fixtures/moe/%s", lt_test_source_dir(), cases[i][0]);
        memset(&o, 0, sizeof o);
        o.format = strcmp(cases[i][1], "gguf") ? LT_EXPORT_HF : LT_EXPORT_GGUF;
        assert_int_equal(lt_export_model(ctx, b, tmp, &o, NULL), LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), cases[i][2]));
        assert_int_not_equal(stat(tmp, &sb), 0);
    }
    lt_ctx_free(ctx);
}

/* Fresh random expert LoRA on the quantized GGUF base, saved by longtune; every expert element of
 * the merged GGUF against dequantized base + delta in float64. */
static void quantized_base_requantizes(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed() ^ 0x9e37u;
    char base[700];
    snprintf(base, sizeof base, "%s/tests/fixtures/moe/quant/model_q.gguf", lt_test_source_dir());
    const int64_t r = 2;
    const float alpha = 4;
    lt_lora_options lo = {0};
    lo.rank = r, lo.alpha = alpha;
    lo.targets = (1u << LT_PROJ_V) | LT_LORA_EXPERT_TARGETS;
    lt_model *m;
    lt_status s = lt_model_load(ctx, base, NULL, &lo, &m);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    const lt_model_config *c = lt_model_get_config(m);
    int64_t E = c->n_experts, C = c->C, F = c->moe_F, L = c->L;
    int64_t np;
    lt_model_lora_params(m, &np);
    float *v = lt_test_fresh(&rng, np, 0.2f), *mom = calloc((size_t)np, sizeof(float));
    assert_int_equal(lt_model_lora_set(ctx, m, 0, np, v), LT_OK);
    int64_t n = lt_model_lora_count(m);
    lt_train_param *ps = calloc((size_t)n, sizeof *ps);
    const float *xa[8][2] = {{0}}, *xb[8][2] = {{0}};
    assert_true(L <= 8);
    for (int64_t i = 0; i < n; i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        const char *nm = t.name + strlen("base_model.model.");
        snprintf(ps[i].name, sizeof ps[i].name, "%.*s", (int)(strlen(nm) - strlen(".weight")), nm);
        ps[i].ndim = 2;
        ps[i].shape[0] = t.value.shape[0];
        ps[i].shape[1] = t.value.shape[1];
        ps[i].data = v + t.offset;
        ps[i].m = ps[i].v = mom + t.offset;
        if (t.experts) {
            int w = t.proj == LT_PROJ_DOWN;
            if (t.is_b) xb[t.layer][w] = v + t.offset;
            else xa[t.layer][w] = v + t.offset;
        }
    }
    char tmp[256], dir[400], out[400];
    snprintf(tmp, sizeof tmp, "/tmp/lt_test_export_moe_q_%ld", (long)getpid());
    mkdir(tmp, 0755);
    snprintf(dir, sizeof dir, "%s/adapter", tmp);
    lt_train_options opt;
    memset(&opt, 0, sizeof opt);
    opt.lora_rank = r, opt.lora_alpha = alpha;
    assert_int_equal(lt_peft_save_named(ctx, dir, "q", &opt, ps, (int)n, m), LT_OK);
    lt_model_free(ctx, m);
    free(ps);
    lt_gguf *bg;
    assert_int_equal(lt_gguf_open(ctx, base, &bg), LT_OK);
    for (int pass = 0; pass < 2; pass++) {
        snprintf(out, sizeof out, "%s/m%d.gguf", tmp, pass);
        lt_export_options o;
        memset(&o, 0, sizeof o);
        o.format = LT_EXPORT_GGUF, o.adapter = dir, o.overwrite = 1;
        o.outtype = LT_DTYPE_F32, o.outtype_set = pass == 1;
        s = lt_export_model(ctx, base, out, &o, NULL);
        if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
        assert_int_equal(s, LT_OK);
        lt_gguf *og;
        assert_int_equal(lt_gguf_open(ctx, out, &og), LT_OK);
        double worst = 0;
        int64_t flips = 0, total = 0;
        for (int64_t l = 0; l < L; l++)
            for (int w = 0; w < 3; w++) {
                int64_t rows = w == 2 ? C : F, cols = w == 2 ? F : C, wd = w == 2;
                char k[128];
                lt_tensor bt, ot;
                snprintf(k, sizeof k, "blk.%lld.%s.weight", (long long)l, gg_w[w]);
                assert_int_equal(lt_gguf_find_tensor(ctx, bg, k, &bt), LT_OK);
                assert_int_equal(lt_gguf_find_tensor(ctx, og, k, &ot), LT_OK);
                assert_int_equal(ot.dtype, pass ? LT_DTYPE_F32 : bt.dtype); /* each stack keeps its type */
                int64_t brb = lt_dtype_row_bytes(bt.dtype, cols), orb = lt_dtype_row_bytes(ot.dtype, cols);
                float *br = malloc((size_t)cols * sizeof(float)), *orow = malloc((size_t)cols * sizeof(float));
                float *wf = malloc((size_t)cols * sizeof(float)), *wq = malloc((size_t)cols * sizeof(float));
                uint8_t *qb = malloc((size_t)cols * sizeof(float));
                double *want = malloc((size_t)cols * sizeof(double));
                for (int64_t e = 0; e < E; e++)
                    for (int64_t q = 0; q < rows; q++) {
                        int64_t g = e * rows + q;
                        lt_dequantize_row(bt.dtype, (const uint8_t *)bt.data + g * brb, br, cols);
                        if (ot.dtype == LT_DTYPE_F32) memcpy(orow, (const uint8_t *)ot.data + g * orb, (size_t)orb);
                        else lt_dequantize_row(ot.dtype, (const uint8_t *)ot.data + g * orb, orow, cols);
                        /* storage: A (E·r, in); B gate stack, up stack (E·F, r) or (E·C, r) */
                        const float *A = xa[l][wd] + e * r * cols;
                        const float *B = xb[l][wd] + (w == 1 ? E * F * r : 0) + g * r;
                        for (int64_t i = 0; i < cols; i++) {
                            double d = 0;
                            for (int64_t j = 0; j < r; j++) d += (double)B[j] * (double)A[j * cols + i];
                            want[i] = (double)br[i] + (alpha / (double)r) * d;
                        }
                        if (ot.dtype == LT_DTYPE_F32) {
                            for (int64_t i = 0; i < cols; i++) {
                                double err = fabs((double)orow[i] - want[i]);
                                assert_true(err <= 1e-5);
                                worst = fmax(worst, err);
                            }
                            continue;
                        }
                        /* Quantized: the reference merged row through the same block quantizer;
                           an f32 rounding apart, a level may flip (one step at most, rarely). */
                        for (int64_t i = 0; i < cols; i++) wf[i] = (float)want[i];
                        lt_quantize_row(ot.dtype, wf, qb, cols);
                        lt_dequantize_row(ot.dtype, qb, wq, cols);
                        for (int64_t b0 = 0; b0 < cols; b0 += 32) {
                            double amax = 0;
                            for (int64_t i = b0; i < b0 + 32 && i < cols; i++) amax = fmax(amax, fabs(want[i]));
                            double step = ot.dtype == LT_DTYPE_Q4_0 ? amax / 8 : amax / 127;
                            for (int64_t i = b0; i < b0 + 32 && i < cols; i++) {
                                double err = fabs((double)orow[i] - (double)wq[i]);
                                assert_true(err <= 1.01 * step + 1e-6);
                                flips += err > 1e-6;
                                total++;
                                worst = fmax(worst, fabs((double)orow[i] - want[i]) / (amax > 0 ? amax : 1));
                            }
                        }
                    }
                free(br), free(orow), free(want), free(wf), free(wq), free(qb);
            }
        fprintf(stderr, "%s: merged experts, worst error %.3g%s; %lld of %lld levels differ from the reference's\n",
                out, worst, pass ? "" : " / block max", (long long)flips, (long long)total);
        assert_true(flips * 100 <= total); /* at most 1 % */
        lt_gguf_close(og);
    }
    lt_gguf_close(bg);
    free(v);
    free(mom);
    rm_rf(tmp);
    lt_ctx_free(ctx);
}

/* Without an adapter: the HF export holds the base's own tensors under the same names
 * (Mixtral's block_sparse_moe.experts.<e>.w1/w3/w2, the routers), the GGUF export the fixture
 * GGUF's tensors (Mixtral: llama arch, Q/K rows permuted; the expert stacks) bit for bit. */
static void round_trip(const char *fixture, const char *expert_key) {
    lt_ctx *ctx = lt_ctx_new();
    char base[700], gg[760], tmp[256], hf[400], out[400], p1[800], p2[800];
    snprintf(base, sizeof base, "%s/tests/fixtures/moe/%s", lt_test_source_dir(), fixture);
    snprintf(gg, sizeof gg, "%s/model.gguf", base);
    snprintf(tmp, sizeof tmp, "/tmp/lt_test_export_moe_mix_%ld", (long)getpid());
    mkdir(tmp, 0755);
    snprintf(hf, sizeof hf, "%s/hf", tmp);
    snprintf(out, sizeof out, "%s/m.gguf", tmp);
    export_ok(ctx, base, NULL, hf, LT_EXPORT_HF);
    export_ok(ctx, base, NULL, out, LT_EXPORT_GGUF);
    lt_safetensors *a, *b;
    snprintf(p1, sizeof p1, "%s/model.safetensors", base);
    snprintf(p2, sizeof p2, "%s/model.safetensors", hf);
    assert_int_equal(lt_safetensors_open(ctx, p1, &a), LT_OK);
    assert_int_equal(lt_safetensors_open(ctx, p2, &b), LT_OK);
    assert_int_equal(lt_safetensors_count(a), lt_safetensors_count(b));
    int experts = 0;
    for (int64_t i = 0; i < lt_safetensors_count(a); i++) {
        const char *k = lt_safetensors_name(a, i);
        lt_tensor x, y;
        assert_int_equal(lt_safetensors_find(ctx, a, k, &x), LT_OK);
        if (lt_safetensors_find(ctx, b, k, &y) != LT_OK) fprintf(stderr, "missing %s\n", k);
        assert_int_equal(lt_safetensors_find(ctx, b, k, &y), LT_OK);
        assert_int_equal(x.dtype, y.dtype);
        assert_memory_equal(x.data, y.data, (size_t)lt_tensor_numel(&x) * sizeof(float));
        experts += strstr(k, expert_key) != NULL;
    }
    assert_int_equal(experts, 2 * 4 * 3);
    lt_safetensors_close(ctx, a);
    lt_safetensors_close(ctx, b);
    lt_gguf *ga, *gb;
    assert_int_equal(lt_gguf_open(ctx, gg, &ga), LT_OK);
    assert_int_equal(lt_gguf_open(ctx, out, &gb), LT_OK);
    assert_int_equal(lt_gguf_tensor_count(ga), lt_gguf_tensor_count(gb));
    for (int64_t i = 0; i < lt_gguf_tensor_count(ga); i++) {
        const char *k = lt_gguf_tensor_name(ga, i);
        lt_tensor x, y;
        assert_int_equal(lt_gguf_find_tensor(ctx, ga, k, &x), LT_OK);
        assert_int_equal(lt_gguf_find_tensor(ctx, gb, k, &y), LT_OK);
        assert_int_equal(x.ndim, y.ndim);
        assert_memory_equal(x.shape, y.shape, (size_t)x.ndim * sizeof(int64_t));
        assert_memory_equal(x.data, y.data, (size_t)lt_tensor_numel(&x) * sizeof(float));
    }
    lt_gguf_close(ga);
    lt_gguf_close(gb);
    rm_rf(tmp);
    lt_ctx_free(ctx);
}

static void mixtral_round_trip(void **state) {
    (void)state;
    round_trip("mixtral", "block_sparse_moe.experts.");
}

/* Qwen2-MoE: the shared expert (mlp.shared_expert.*, its (1, C) gate; GGUF ffn_*_shexp and the
 * vector ffn_gate_inp_shexp) and q/k/v biases beside the routed experts. */
static void qwen2moe_round_trip(void **state) {
    (void)state;
    round_trip("qwen2moe_shared", "mlp.experts.");
}

int main(void) {
    snprintf(base_dir, sizeof base_dir, "%s/tests/fixtures/moe/qwen3moe", lt_test_source_dir());
    snprintf(base_gguf, sizeof base_gguf, "%s/model.gguf", base_dir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(peft_adapter_merges),        cmocka_unit_test(longtune_adapter_and_checkpoint_merge),
        cmocka_unit_test(quantized_base_requantizes), cmocka_unit_test(mixtral_round_trip),
        cmocka_unit_test(qwen2moe_round_trip),        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
