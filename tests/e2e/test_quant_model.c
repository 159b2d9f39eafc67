/* Models whose projections mix GGUF block types per tensor and per layer, as llama.cpp's _K_M
 * files do, with the embedding and a tied or untied head in block types too. The test writes two
 * GGUF files at run time: the mixed one (weights quantized by lt_quantize_row, IQ4 blocks drawn
 * at random) and an f32 twin holding exactly the mixed file's dequantized values. The mixed model
 * must load with every tensor in its own type and its bytes unchanged, be priced by the size
 * table byte for byte, and compute the loss and every LoRA gradient of the twin. */
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
#include "longtune/gguf.h"
#include "longtune/model.h"
#include "model/model_internal.h"

enum { L = 3, C = 256, F = 512, H = 4, HKV = 2, D = 64, V = 96, B = 2, T = 16 };

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 4096;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
    put_str(b, k);
    put_u32(b, LT_GGUF_U32);
    put_u32(b, v);
}
static void kv_f32(buf *b, const char *k, float v) {
    put_str(b, k);
    put_u32(b, LT_GGUF_F32);
    put(b, &v, 4);
}

/* ggml type ids of the lt dtypes used here. */
static uint32_t ggml_id(lt_dtype t) {
    switch (t) {
    case LT_DTYPE_F32: return 0;
    case LT_DTYPE_Q4_0: return 2;
    case LT_DTYPE_Q4_1: return 3;
    case LT_DTYPE_Q5_0: return 6;
    case LT_DTYPE_Q5_1: return 7;
    case LT_DTYPE_Q8_0: return 8;
    case LT_DTYPE_Q2_K: return 10;
    case LT_DTYPE_Q3_K: return 11;
    case LT_DTYPE_Q4_K: return 12;
    case LT_DTYPE_Q5_K: return 13;
    case LT_DTYPE_Q6_K: return 14;
    case LT_DTYPE_IQ4_NL: return 20;
    case LT_DTYPE_IQ4_XS: return 23;
    default: fail_msg("no ggml id for %s", lt_dtype_name(t));
    }
    return 0;
}

typedef struct tensor_spec {
    char name[64];
    lt_dtype dt;
    int64_t rows, cols;
    uint8_t *q; /* bytes in dt */
    float *f;   /* dequantized */
    size_t qbytes;
} tensor_spec;

/* Fills a tensor of dt: values ~ N(0, sd) quantized, or for IQ4 (no quantizer) random blocks at
 * a matching scale; f gets the exact dequantized values. */
static void make_tensor(uint64_t *rng, tensor_spec *t, const char *name, lt_dtype dt, int64_t rows, int64_t cols,
                        float sd, float mean) {
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dt = dt;
    t->rows = rows;
    t->cols = cols;
    int64_t rb = lt_dtype_row_bytes(dt, cols);
    assert_true(rb > 0);
    t->qbytes = (size_t)(rows * rb);
    t->q = malloc(t->qbytes);
    t->f = malloc((size_t)(rows * cols) * 4);
    float *x = malloc((size_t)cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *q = t->q + r * rb;
        if (dt == LT_DTYPE_IQ4_NL || dt == LT_DTYPE_IQ4_XS) {
            for (int64_t i = 0; i < rb; i++) q[i] = (uint8_t)lt_test_rand_u64(rng);
            int64_t bb = lt_dtype_block_bytes(dt);
            for (int64_t b = 0; b < rb / bb; b++) {
                /* IQ4_NL: x = d·k, |k| <= 127; IQ4_XS: x = d·s·k with s in [-32, 31] */
                uint16_t d = lt_f32_to_f16(dt == LT_DTYPE_IQ4_NL ? 2.0f * sd / 127 : 2.0f * sd / (127 * 24));
                memcpy(q + b * bb, &d, 2);
            }
        } else if (dt == LT_DTYPE_F32) {
            lt_test_fill_normal(rng, (float *)q, cols, sd);
            for (int64_t i = 0; i < cols; i++) ((float *)q)[i] += mean;
        } else {
            lt_test_fill_normal(rng, x, cols, sd);
            lt_quantize_row(dt, x, q, cols);
        }
        lt_dequantize_row(dt, q, t->f + r * cols, cols);
    }
    free(x);
}

/* Writes the llama-arch GGUF of these tensors, in dt (twin = 0) or as f32 (twin = 1). */
static void write_gguf(const char *path, const tensor_spec *ts, int n, int twin) {
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, (uint64_t)n);
    put_u64(&b, 9);
    put_str(&b, "general.architecture");
    put_u32(&b, LT_GGUF_STRING);
    put_str(&b, "llama");
    kv_u32(&b, "llama.block_count", L);
    kv_u32(&b, "llama.embedding_length", C);
    kv_u32(&b, "llama.feed_forward_length", F);
    kv_u32(&b, "llama.attention.head_count", H);
    kv_u32(&b, "llama.attention.head_count_kv", HKV);
    kv_u32(&b, "llama.context_length", 256);
    kv_f32(&b, "llama.rope.freq_base", 10000.0f);
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        put_str(&b, ts[i].name);
        int nd = ts[i].rows > 1 ? 2 : 1;
        put_u32(&b, (uint32_t)nd);
        put_u64(&b, (uint64_t)ts[i].cols);
        if (nd == 2) put_u64(&b, (uint64_t)ts[i].rows);
        put_u32(&b, twin ? 0 : ggml_id(ts[i].dt));
        put_u64(&b, off);
        size_t sz = twin ? (size_t)(ts[i].rows * ts[i].cols) * 4 : ts[i].qbytes;
        off = (off + sz + 31) / 32 * 32;
    }
    uint8_t zero[32] = {0};
    while (b.n % 32) put(&b, zero, 1);
    for (int i = 0; i < n; i++) {
        size_t sz = twin ? (size_t)(ts[i].rows * ts[i].cols) * 4 : ts[i].qbytes;
        put(&b, twin ? (const void *)ts[i].f : ts[i].q, sz);
        while (b.n % 32) put(&b, zero, 1);
    }
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b.p, 1, b.n, fp), b.n);
    fclose(fp);
    free(b.p);
}

static const char *proj_gguf[LT_PROJ_COUNT_] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                "ffn_gate", "ffn_up", "ffn_down"};

/* Layer 0 as a Q4_K_M file (attn_v and ffn_down in Q6_K), layer 1 with those two in Q4_K (the
 * per-layer mix), layer 2 covering the remaining block types. */
static const lt_dtype layer_types[L][LT_PROJ_COUNT_] = {
    {LT_DTYPE_Q4_K, LT_DTYPE_Q4_K, LT_DTYPE_Q6_K, LT_DTYPE_Q4_K, LT_DTYPE_Q4_K, LT_DTYPE_Q4_K, LT_DTYPE_Q6_K},
    {LT_DTYPE_Q5_K, LT_DTYPE_Q3_K, LT_DTYPE_Q4_K, LT_DTYPE_Q2_K, LT_DTYPE_IQ4_XS, LT_DTYPE_Q5_0, LT_DTYPE_Q4_K},
    {LT_DTYPE_Q5_1, LT_DTYPE_Q8_0, LT_DTYPE_IQ4_NL, LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_Q6_K, LT_DTYPE_Q5_K},
};

static int build_specs(uint64_t *rng, tensor_spec *ts, int tied, lt_dtype embed_dt, lt_dtype head_dt) {
    int n = 0;
    make_tensor(rng, &ts[n++], "token_embd.weight", embed_dt, V, C, 0.1f, 0);
    if (!tied) make_tensor(rng, &ts[n++], "output.weight", head_dt, V, C, 0.1f, 0);
    make_tensor(rng, &ts[n++], "output_norm.weight", LT_DTYPE_F32, 1, C, 0.05f, 1.0f);
    for (int l = 0; l < L; l++) {
        char name[64];
        for (int p = 0; p < LT_PROJ_COUNT_; p++) {
            int64_t rows, cols;
            lt_model_proj_shape(&(lt_model_config){.C = C, .F = F, .H = H, .Hkv = HKV, .D = D}, (lt_proj)p, &rows,
                                &cols);
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, proj_gguf[p]);
            make_tensor(rng, &ts[n++], name, layer_types[l][p], rows, cols, 0.06f, 0);
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        make_tensor(rng, &ts[n++], name, LT_DTYPE_F32, 1, C, 0.05f, 1.0f);
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        make_tensor(rng, &ts[n++], name, LT_DTYPE_F32, 1, C, 0.05f, 1.0f);
    }
    return n;
}

static const tensor_spec *spec(const tensor_spec *ts, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(ts[i].name, name)) return &ts[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

typedef struct step_out {
    double loss;
    float *grads;
    int64_t n;
} step_out;

/* Loads path (an fp8 base with the projections of fp8_skip as the file holds them), checks the
 * size table against the allocator, runs one forward/backward. */
static step_out run_step_skip(lt_ctx *ctx, const char *path, lt_dtype quantize, unsigned fp8_skip, const int32_t *tok,
                              const int32_t *tgt, lt_model **keep) {
    lt_lora_options lo = {0};
    lo.rank = 4;
    lt_model_options mo = {0};
    mo.quantize_dtype = quantize;
    mo.fp8_skip = fp8_skip;
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, path, &mo, &cfg), LT_OK);
    lt_model_run_options ro = {0};
    ro.B = B, ro.T = T, ro.recompute = LT_RECOMPUTE_EVERY;
    lt_model_sizes want;
    assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
    size_t base = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes; /* a model loaded before */
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, path, &mo, &lo, &m);
    if (s != LT_OK) fail_msg("load %s: %s", path, lt_ctx_error(ctx));
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    lt_model_sizes got = lt_model_get_sizes(m);
    for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes - base, want.total);
    lt_model_batch b;
    memset(&b, 0, sizeof b);
    b.B = B, b.T = T, b.tokens = tok, b.targets = tgt;
    lt_model_result r;
    lt_model_zero_grads(m);
    size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
    lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes, before); /* a step allocates nothing */
    step_out o;
    o.loss = r.loss_sum / (double)r.n_tokens;
    float *g = lt_model_lora_grads(m, &o.n);
    o.grads = malloc((size_t)o.n * 4);
    memcpy(o.grads, g, (size_t)o.n * 4);
    *keep = m;
    return o;
}

static step_out run_step(lt_ctx *ctx, const char *path, lt_dtype quantize, const int32_t *tok, const int32_t *tgt,
                         lt_model **keep) {
    return run_step_skip(ctx, path, quantize, 0, tok, tgt, keep);
}

static void mixed_types_load_and_match_f32_twin(int tied, lt_dtype embed_dt, lt_dtype head_dt) {
    uint64_t rng = lt_test_seed();
    tensor_spec ts[64];
    int n = build_specs(&rng, ts, tied, embed_dt, head_dt);
    char qpath[256], fpath[256];
    snprintf(qpath, sizeof qpath, "/tmp/lt_test_quant_model_%d_q.gguf", (int)getpid());
    snprintf(fpath, sizeof fpath, "/tmp/lt_test_quant_model_%d_f.gguf", (int)getpid());
    write_gguf(qpath, ts, n, 0);
    write_gguf(fpath, ts, n, 1);
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(lt_test_rand_u64(&rng) % V);
        tgt[i] = i % 5 == 4 ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % V);
    }

    lt_ctx *ctx = lt_ctx_new();
    lt_model *mq = NULL, *mf = NULL;
    step_out q = run_step(ctx, qpath, LT_DTYPE_F32, tok, tgt, &mq);
    /* Every tensor is held in its file type, its bytes unchanged (Q/K rows un-permuted whole). */
    const lt_model_config *cfg = lt_model_get_config(mq);
    assert_int_equal(cfg->embed_dtype, embed_dt);
    assert_int_equal(cfg->head_dtype, tied ? embed_dt : head_dt);
    assert_int_equal(mq->embed.dtype, embed_dt);
    assert_memory_equal(mq->embed.data, ts[0].q, ts[0].qbytes);
    if (!tied)
        assert_memory_equal(mq->head.data, spec(ts, n, "output.weight")->q, spec(ts, n, "output.weight")->qbytes);
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LT_PROJ_COUNT_; p++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, proj_gguf[p]);
            const tensor_spec *t = spec(ts, n, name);
            assert_int_equal(lt_model_proj_dtype(cfg, l, (lt_proj)p), layer_types[l][p]);
            const lt_tensor *w = &mq->layers[l].w[p];
            assert_int_equal(w->dtype, layer_types[l][p]);
            int64_t rb = lt_dtype_row_bytes(t->dt, t->cols);
            for (int64_t r = 0; r < t->rows; r++) {
                int64_t sr = r;
                if (p == LT_PROJ_Q || p == LT_PROJ_K) {
                    int64_t h = r / D, wi = r % D, s = wi / (D / 2), i = wi % (D / 2);
                    sr = h * D + 2 * i + s;
                }
                assert_memory_equal((const uint8_t *)w->data + r * rb, t->q + sr * rb, (size_t)rb);
            }
        }
    assert_int_equal(cfg->proj_dtype[LT_PROJ_V], LT_DTYPE_Q6_K);
    assert_int_equal(lt_model_proj_dtype(cfg, 1, LT_PROJ_V), LT_DTYPE_Q4_K);

    step_out f = run_step(ctx, fpath, LT_DTYPE_F32, tok, tgt, &mf);
    /* The same values through the dequantizing matmul and loss as through the f32 ones. */
    print_message("mixed loss %.9f, f32 twin %.9f\n", q.loss, f.loss);
    assert_true(isfinite(q.loss) && q.loss > 0);
    assert_true(fabs(q.loss - f.loss) <= 1e-5 * f.loss);
    assert_int_equal(q.n, f.n);
    double gn = 0, dn = 0;
    for (int64_t i = 0; i < q.n; i++) {
        gn += (double)f.grads[i] * f.grads[i];
        dn += ((double)q.grads[i] - f.grads[i]) * ((double)q.grads[i] - f.grads[i]);
    }
    assert_true(gn > 0);
    assert_true(sqrt(dn / gn) <= 1e-4);
    lt_model_free(ctx, mq);
    lt_model_free(ctx, mf);
    /* --quantize q4_k of the twin: every projection Q4_K (rows of 256 and 512), the loss close */
    lt_model *mk = NULL;
    step_out k = run_step(ctx, fpath, LT_DTYPE_Q4_K, tok, tgt, &mk);
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LT_PROJ_COUNT_; p++) assert_int_equal(mk->layers[l].w[p].dtype, LT_DTYPE_Q4_K);
    print_message("--quantize q4_k loss %.6f\n", k.loss);
    assert_true(fabs(k.loss - f.loss) <= 0.05 * f.loss); /* as int4_g64 (test_model) */
    /* the encodings on the load's threads write the one-thread bytes (3 threads: uneven splits) */
    for (int th = 1; th <= 3; th += 2) {
        lt_ctx_set_threads(ctx, th);
        lt_model *m1 = NULL;
        step_out k1 = run_step(ctx, fpath, LT_DTYPE_Q4_K, tok, tgt, &m1);
        for (int l = 0; l < L; l++)
            for (int p = 0; p < LT_PROJ_COUNT_; p++) {
                const lt_tensor *a = &mk->layers[l].w[p], *c = &m1->layers[l].w[p];
                assert_int_equal(lt_tensor_nbytes(a), lt_tensor_nbytes(c));
                assert_memory_equal(a->data, c->data, (size_t)lt_tensor_nbytes(a));
            }
        lt_model_free(ctx, m1);
        free(k1.grads);
    }
    lt_ctx_set_threads(ctx, 0);
    lt_model_free(ctx, mk);
    free(k.grads);
    /* an fp8 base from the mixed file's block types: every projection packed from its values (v is
     * not permuted: its bytes are lt_fp8_pack of the twin's f32 rows), the loss and the LoRA
     * gradients close to the twin's through the FP8 products (x rounded per row too) */
    lt_model *m8 = NULL;
    step_out e8 = run_step(ctx, qpath, LT_DTYPE_FP8, tok, tgt, &m8);
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LT_PROJ_COUNT_; p++) assert_int_equal(m8->layers[l].w[p].dtype, LT_DTYPE_FP8);
    const tensor_spec *tv = spec(ts, n, "blk.1.attn_v.weight");
    const size_t pv_bytes = (size_t)tv->rows * (size_t)lt_dtype_row_bytes(LT_DTYPE_FP8, tv->cols);
    assert_int_equal(pv_bytes, (size_t)tv->rows * (size_t)(tv->cols + 4)); /* one byte a weight, a scale a row */
    uint8_t *pv = malloc(pv_bytes);
    lt_fp8_pack(tv->f, tv->rows, tv->cols, pv);
    assert_int_equal(lt_tensor_nbytes(&m8->layers[1].w[LT_PROJ_V]), (int64_t)pv_bytes);
    assert_memory_equal(m8->layers[1].w[LT_PROJ_V].data, pv, pv_bytes);
    free(pv);
    double g8 = 0, d8 = 0;
    for (int64_t i = 0; i < e8.n; i++) {
        g8 += (double)f.grads[i] * f.grads[i];
        d8 += ((double)e8.grads[i] - f.grads[i]) * ((double)e8.grads[i] - f.grads[i]);
    }
    print_message("fp8 base loss %.6f (f32 %.6f), gradients %.4f off\n", e8.loss, f.loss, sqrt(d8 / g8));
    /* e4m3 keeps 3 significand bits: each operand of every product is off by ~3.6 % rms (2^-3 /
     * sqrt(12)), and the LoRA gradients here pass through about twenty such products. The loss
     * of these random weights moves by about 0.5 % typically, but a seed whose logits sit near
     * each other can move it by nearly 3 %: the bound is --quantize q4_k's (5 %), whose weight
     * error is of the same order; a wrong scale or code moves the loss by far more. */
    assert_true(fabs(e8.loss - f.loss) <= 0.05 * f.loss);
    assert_true(sqrt(d8 / g8) <= 0.3);
    lt_model_free(ctx, m8);
    free(e8.grads);
    /* fp8 with k and down skipped: those two held in the file's block types layer by layer (the
     * size table, which run_step checks against the allocator, prices them so), the rest fp8 */
    const unsigned skip = 1u << LT_PROJ_K | 1u << LT_PROJ_DOWN;
    lt_model_options fo = {0};
    lt_model_config fcfg;
    assert_int_equal(lt_model_inspect(ctx, qpath, &fo, &fcfg), LT_OK);
    step_out es = run_step_skip(ctx, qpath, LT_DTYPE_FP8, skip, tok, tgt, &m8);
    for (int l = 0; l < L; l++)
        for (int p = 0; p < LT_PROJ_COUNT_; p++)
            assert_int_equal(m8->layers[l].w[p].dtype,
                             skip >> p & 1u ? lt_model_proj_dtype(&fcfg, l, (lt_proj)p) : LT_DTYPE_FP8);
    assert_true(lt_dtype_is_quantized(m8->layers[0].w[LT_PROJ_DOWN].dtype));
    double ds = 0;
    for (int64_t i = 0; i < es.n; i++) ds += ((double)es.grads[i] - f.grads[i]) * ((double)es.grads[i] - f.grads[i]);
    print_message("fp8 base, k and down skipped: loss %.6f, gradients %.4f off\n", es.loss, sqrt(ds / g8));
    assert_true(fabs(es.loss - f.loss) <= 0.05 * f.loss);
    assert_true(sqrt(ds / g8) <= 0.3);
    lt_model_free(ctx, m8);
    free(es.grads);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
    free(q.grads);
    free(f.grads);
    for (int i = 0; i < n; i++) free(ts[i].q), free(ts[i].f);
    unlink(qpath);
    unlink(fpath);
}

static void tied_q6_k_embedding(void **state) {
    (void)state;
    mixed_types_load_and_match_f32_twin(1, LT_DTYPE_Q6_K, LT_DTYPE_Q6_K);
}

static void untied_q8_0_embedding_q5_k_head(void **state) {
    (void)state;
    mixed_types_load_and_match_f32_twin(0, LT_DTYPE_Q8_0, LT_DTYPE_Q5_K);
}

/* --quantize with a K-quant on rows that are not whole super-blocks takes llama.cpp's fallback
 * type; a format --quantize does not offer is a typed error. */
static void quantize_k_types_and_fallback(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/model/llama_tied", lt_test_source_dir());
    lt_model_options mo = {0};
    lt_model_config cfg;
    const lt_dtype q[3] = {LT_DTYPE_Q4_K, LT_DTYPE_Q5_K, LT_DTYPE_Q6_K};
    const lt_dtype fb[3] = {LT_DTYPE_Q5_0, LT_DTYPE_Q5_1, LT_DTYPE_Q8_0};
    for (int i = 0; i < 3; i++) {
        mo.quantize_dtype = q[i];
        assert_int_equal(lt_model_inspect(ctx, dir, &mo, &cfg), LT_OK);
        /* the tiny fixture's rows (C = 64, F = 128) are not whole super-blocks */
        for (int p = 0; p < LT_PROJ_COUNT_; p++) assert_int_equal(cfg.proj_dtype[p], fb[i]);
    }
    mo.quantize_dtype = LT_DTYPE_IQ4_XS;
    assert_int_equal(lt_model_inspect(ctx, dir, &mo, &cfg), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "iq4_xs"));
    lt_ctx_free(ctx);
}

int main(int argc, char **argv) {
    lt_test_omp_passive(argv);
    (void)argc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tied_q6_k_embedding),
        cmocka_unit_test(untied_q8_0_embedding_q5_k_head),
        cmocka_unit_test(quantize_k_types_and_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
