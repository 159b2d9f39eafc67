/* GGUF outputs: the merged model (a GGUF base's metadata carried over key by key; an HF base's
 * synthesized as convert_hf_to_gguf.py writes it for llama / qwen2 / qwen3, tokenizer included)
 * with llama-arch Q/K rows permuted back to llama.cpp's interleaved order and norms, biases and
 * RoPE factors in f32; and llama.cpp's LoRA adapter GGUF (general.type = adapter, A as (r, in),
 * B as (out, r), the Q/K permutation applied to B's rows) for `llama-cli -m base --lora file`.
 * Mixture-of-experts layers go out as llama.cpp stores them: the router blk.N.ffn_gate_inp (E, C)
 * in f32 and each of gate, up and down as one stack blk.N.ffn_{gate,up,down}_exps (E, rows, cols);
 * LoRA on the experts as 3-D factors of those stacks, which llama.cpp applies per selected expert
 * (build_lora_mm_id: mul_mat_id of A (E, r, in) then of B (E, out, r)); gate_up's shared A is
 * written for both ffn_gate_exps and ffn_up_exps. */
#include <math.h>
#include <string.h>

#include "export/export_internal.h"
#include "export/pipeline.h"
#include "longtune/alloc.h"
#include "model/model_internal.h"

/* Llama-arch GGUF (Llama, Mixtral): Q/K rows interleaved, vocab_size and rope.dimension_count. */
static int llama_gguf(const lt_ex_base *b) { return !strcmp(b->arch, "llama"); }

static uint32_t llama_ftype(lt_dtype t) {
    switch (t) {
    case LT_DTYPE_F32: return 0;
    case LT_DTYPE_F16: return 1;
    case LT_DTYPE_Q4_0: return 2;
    case LT_DTYPE_Q4_1: return 3;
    case LT_DTYPE_Q8_0: return 7;
    case LT_DTYPE_Q5_0: return 8;
    case LT_DTYPE_Q5_1: return 9;
    case LT_DTYPE_Q2_K: return 10;
    case LT_DTYPE_Q3_K: return 12;
    case LT_DTYPE_Q4_K: return 15;
    case LT_DTYPE_Q5_K: return 17;
    case LT_DTYPE_Q6_K: return 18;
    case LT_DTYPE_IQ4_NL: return 25;
    case LT_DTYPE_IQ4_XS: return 30;
    case LT_DTYPE_BF16: return 32;
    default: return 0;
    }
}

/* Keys a rewritten file must not inherit: its type mix and layout are the writer's. */
static int skip_key(const char *k, size_t n) {
    static const char *const skip[] = {"general.file_type", "general.quantization_version", "general.alignment"};
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        if (strlen(skip[i]) == n && !memcmp(k, skip[i], n)) return 1;
    return 0;
}

static lt_status arch_u32(lt_ctx *ctx, lt_gguf_writer *w, const char *arch, const char *key, int64_t v) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return lt_gguf_writer_set_u32(ctx, w, k, (uint32_t)v);
}

static lt_status arch_f32(lt_ctx *ctx, lt_gguf_writer *w, const char *arch, const char *key, double v) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return lt_gguf_writer_set_f32(ctx, w, k, (float)v);
}

/* Under a RoPE override, the keys rope_keys writes anew: {arch}.context_length and
 * {arch}.rope.scaling.*. */
static int rope_key(const lt_ex_base *b, const char *k, size_t n) {
    size_t al = strlen(b->arch);
    if (!b->rope_override || n <= al + 1 || memcmp(k, b->arch, al) || k[al] != '.') return 0;
    const char *r = k + al + 1;
    size_t rn = n - al - 1;
    return (rn == 14 && !memcmp(r, "context_length", 14)) || (rn > 13 && !memcmp(r, "rope.scaling.", 13));
}

static lt_status copy_metadata(lt_ctx *ctx, const lt_ex_base *b, lt_gguf_writer *w) {
    int64_t n = lt_gguf_kv_count(b->gg);
    for (int64_t i = 0; i < n; i++) {
        const char *k;
        size_t kl;
        lt_gguf_type t;
        LT_TRY(lt_gguf_kv_key(ctx, b->gg, i, &k, &kl, &t));
        if (skip_key(k, kl) || rope_key(b, k, kl)) continue;
        LT_TRY(lt_gguf_writer_copy_kv(ctx, w, b->gg, i));
    }
    return LT_OK;
}

/* The RoPE scaling as llama.cpp reads it (llama-model.cpp) and convert_hf_to_gguf.py writes it:
 * rope.scaling.type linear|yarn with factor and original_context_length; YaRN adds its betas and
 * attention factor (yarn_beta_fast/slow, yarn_attn_factor: transformers' attention_factor) and,
 * when that factor is not YaRN's default 0.1·ln(factor) + 1, rope.scaling.attn_factor, which
 * llama.cpp multiplies onto the default. Llama 3's scaling travels as rope_freqs.weight (no
 * keys); dynamic NTK and longrope on these architectures have no llama.cpp form and are refused. */
static lt_status rope_keys(lt_ctx *ctx, const lt_ex_base *b, lt_gguf_writer *w) {
    const lt_model_config *c = &b->cfg;
    const char *arch = b->arch;
    char k[128];
    switch (c->rope_scaling) {
    case LT_ROPE_SCALING_NONE:
    case LT_ROPE_SCALING_LLAMA3: return LT_OK;
    case LT_ROPE_SCALING_LINEAR:
    case LT_ROPE_SCALING_YARN: break;
    default:
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "export: llama.cpp has no %s RoPE scaling for %s models; export --format hf (transformers "
                        "reads it)",
                        lt_rope_scaling_name(c->rope_scaling), arch);
    }
    int yarn = c->rope_scaling == LT_ROPE_SCALING_YARN;
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    LT_TRY(lt_gguf_writer_set_str(ctx, w, k, yarn ? "yarn" : "linear", yarn ? 4 : 6));
    LT_TRY(arch_f32(ctx, w, arch, "rope.scaling.factor", c->rope_factor));
    LT_TRY(arch_u32(ctx, w, arch, "rope.scaling.original_context_length", c->rope_original_ctx));
    if (!yarn) return LT_OK;
    double att = lt_model_rope_attn_factor(c), dflt = c->rope_factor <= 1 ? 1.0 : 0.1 * log(c->rope_factor) + 1.0;
    LT_TRY(arch_f32(ctx, w, arch, "rope.scaling.yarn_attn_factor", att));
    LT_TRY(arch_f32(ctx, w, arch, "rope.scaling.yarn_beta_fast", c->rope_beta_fast != 0 ? c->rope_beta_fast : 32));
    LT_TRY(arch_f32(ctx, w, arch, "rope.scaling.yarn_beta_slow", c->rope_beta_slow != 0 ? c->rope_beta_slow : 1));
    if (fabs(att - dflt) > 1e-7 * dflt) LT_TRY(arch_f32(ctx, w, arch, "rope.scaling.attn_factor", att / dflt));
    return LT_OK;
}

/* YaRN betas other than 32 and 1 are written, but llama.cpp's llama, qwen2 and qwen3 loaders keep
 * their own 32 and 1: the report's note says which flags give llama.cpp the trained ones. */
static void rope_note(const lt_ex_base *b, lt_export_report *rep) {
    const lt_model_config *c = &b->cfg;
    if (c->rope_scaling != LT_ROPE_SCALING_YARN) return;
    double bf = c->rope_beta_fast != 0 ? c->rope_beta_fast : 32, bs = c->rope_beta_slow != 0 ? c->rope_beta_slow : 1;
    if (bf == 32 && bs == 1) return;
    char rest[sizeof rep->note];
    snprintf(rest, sizeof rest, "%s", rep->note); /* first, before a longer note can cut it off */
    int n = snprintf(rep->note, sizeof rep->note,
                     "llama.cpp reads yarn_beta_fast/slow only for some architectures, not %s: run it with "
                     "--yarn-beta-fast %g --yarn-beta-slow %g",
                     b->arch, bf, bs);
    if (!rest[0] || n < 0 || (size_t)n + 3 >= sizeof rep->note) return;
    size_t at = (size_t)n, room = sizeof rep->note - at - 3, len = strlen(rest);
    memcpy(rep->note + at, "; ", 2);
    memcpy(rep->note + at + 2, rest, len < room ? len : room);
    rep->note[at + 2 + (len < room ? len : room)] = 0;
}

static lt_status synth_metadata(lt_ctx *ctx, const lt_ex_base *b, lt_gguf_writer *w, lt_export_report *rep) {
    const lt_model_config *c = &b->cfg;
    const char *arch = b->arch;
    LT_TRY(lt_gguf_writer_set_str(ctx, w, "general.architecture", arch, strlen(arch)));
    LT_TRY(lt_gguf_writer_set_str(ctx, w, "general.type", "model", 5));
    const char *name = strrchr(b->dir, '/') ? strrchr(b->dir, '/') + 1 : b->dir;
    LT_TRY(lt_gguf_writer_set_str(ctx, w, "general.name", name, strlen(name)));
    LT_TRY(arch_u32(ctx, w, arch, "context_length", c->max_positions));
    LT_TRY(arch_u32(ctx, w, arch, "embedding_length", c->C));
    LT_TRY(arch_u32(ctx, w, arch, "block_count", c->L));
    /* Mixtral's experts are its MLPs: llama.cpp reads their width as feed_forward_length */
    LT_TRY(arch_u32(ctx, w, arch, "feed_forward_length", c->arch == LT_ARCH_MIXTRAL ? c->moe_F : c->F));
    LT_TRY(arch_u32(ctx, w, arch, "attention.head_count", c->H));
    LT_TRY(arch_u32(ctx, w, arch, "attention.head_count_kv", c->Hkv));
    LT_TRY(arch_f32(ctx, w, arch, "rope.freq_base", c->rope_theta));
    LT_TRY(rope_keys(ctx, b, w));
    LT_TRY(arch_f32(ctx, w, arch, "attention.layer_norm_rms_epsilon", c->rms_eps));
    LT_TRY(arch_u32(ctx, w, arch, "attention.key_length", c->D));
    LT_TRY(arch_u32(ctx, w, arch, "attention.value_length", c->D));
    if (llama_gguf(b)) {
        LT_TRY(arch_u32(ctx, w, arch, "vocab_size", c->V));
        LT_TRY(arch_u32(ctx, w, arch, "rope.dimension_count", c->D));
    }
    if (c->n_experts > 0) { /* as convert_hf_to_gguf.py writes Qwen3-MoE and Mixtral */
        LT_TRY(arch_u32(ctx, w, arch, "expert_count", c->n_experts));
        LT_TRY(arch_u32(ctx, w, arch, "expert_used_count", c->n_experts_used));
        if (c->arch != LT_ARCH_MIXTRAL) LT_TRY(arch_u32(ctx, w, arch, "expert_feed_forward_length", c->moe_F));
        if (c->moe_shared_F > 0) LT_TRY(arch_u32(ctx, w, arch, "expert_shared_feed_forward_length", c->moe_shared_F));
    }
    lt_status s = lt_ex_tokenizer_to_gguf(ctx, b, w, rep->note, sizeof rep->note);
    if (s == LT_ERR_NOT_FOUND || s == LT_ERR_UNSUPPORTED) {
        /* The file is still a valid GGUF (longtune reads it); llama.cpp needs a vocabulary. */
        snprintf(rep->note, sizeof rep->note, "tokenizer not carried over (llama.cpp needs one): %s",
                 lt_ctx_error(ctx));
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    rep->tokenizer_converted = s == LT_OK;
    return s;
}

typedef struct gguf_sink {
    lt_gguf_writer *w;
} gguf_sink;

static lt_status to_gguf(lt_ctx *ctx, void *arg, const void *data, size_t n) {
    return lt_gguf_writer_write(ctx, ((gguf_sink *)arg)->w, data, n);
}

/* What llama.cpp's loaders cannot read of an MoE base: Qwen3-MoE without renormalised top-k or
 * with dense layers (llama.cpp's qwen3moe has neither), Mixtral with dense layers. */
static lt_status moe_gguf_check(lt_ctx *ctx, const lt_ex_base *b) {
    const lt_model_config *c = &b->cfg;
    if (c->n_experts < 1) return LT_OK;
    for (int64_t l = 0; l < c->L; l++)
        if (!lt_model_layer_is_moe(c, l))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "%s: layer %lld is a dense MLP among mixture-of-experts layers, which llama.cpp's %s has "
                            "no form for; export --format hf",
                            b->path, (long long)l, b->arch);
    /* llama.cpp's qwen2moe never renormalises the top-k weights, qwen3moe and Mixtral always do */
    int want = c->arch != LT_ARCH_QWEN2_MOE;
    if (c->moe_norm_topk != want)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: the top-k router weights are %srenormalised (norm_topk_prob %s), which llama.cpp's %s "
                        "never does; export --format hf",
                        b->path, want ? "not " : "", want ? "false" : "true", b->arch);
    return LT_OK;
}

lt_status lt_ex_write_gguf(lt_ctx *ctx, lt_ex_base *b, const lt_ex_adapter *a, const char *out,
                           const lt_export_options *opt, lt_export_report *rep) {
    if (!b->gg) LT_TRY(moe_gguf_check(ctx, b));
    int rope = b->has_rope_freqs || ((!b->gg || b->rope_override) && b->cfg.rope_scaling == LT_ROPE_SCALING_LLAMA3);
    int64_t np = lt_ex_pieces(b, rope, NULL, 0);
    size_t pbytes = (size_t)np * (sizeof(lt_ex_piece) + sizeof(lt_tensor) + sizeof(lt_dtype));
    lt_ex_piece *ps = lt_alloc(ctx, LT_DEVICE_CPU, pbytes, "export pieces");
    if (!ps) return lt_ctx_status(ctx);
    lt_tensor *ts = (lt_tensor *)(ps + np);
    lt_dtype *dts = (lt_dtype *)(ts + np);
    lt_ex_pieces(b, rope, ps, np);
    lt_gguf_writer *w = NULL;
    lt_ex_rows rows = {0};
    lt_status s = lt_gguf_writer_new(ctx, &w);
    if (s != LT_OK) goto done;
    s = b->gg ? copy_metadata(ctx, b, w) : synth_metadata(ctx, b, w, rep);
    if (s == LT_OK && b->gg && b->rope_override) {
        if ((s = arch_u32(ctx, w, b->arch, "context_length", b->cfg.max_positions)) == LT_OK) s = rope_keys(ctx, b, w);
    }
    if (s != LT_OK) goto done;
    if (b->gg) rep->tokenizer_converted = lt_gguf_writer_has_key(w, "tokenizer.ggml.tokens");
    rope_note(b, rep);
    lt_dtype main = LT_DTYPE_F32;
    int quantized = 0;
    int64_t n_sub = 0; /* expert pieces after a stack's first: streamed into the same tensor */
    for (int64_t i = 0; i < np; i++) {
        if ((s = lt_ex_find(ctx, b, &ps[i], &ts[i])) != LT_OK) goto done;
        if ((s = lt_ex_pick_dtype(ctx, b, a, &ps[i], &ts[i], opt, &dts[i])) != LT_OK) goto done;
        if (ps[i].kind == EX_PROJ && ps[i].layer == 0 && ps[i].which == LT_PROJ_Q) main = dts[i];
        quantized |= lt_dtype_is_quantized(dts[i]);
        if (ps[i].kind == EX_EXPERT && ps[i].expert > 0) {
            if (dts[i] != dts[i - 1]) {
                s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: the experts of layer %lld's %s stack have different types",
                             b->path, (long long)ps[i].layer, lt_ex_class_name(&ps[i]));
                goto done;
            }
            n_sub++;
            continue;
        }
        char name[160];
        lt_ex_gguf_name(&ps[i], name, sizeof name);
        int64_t shape[3] = {ps[i].shape[0], ps[i].shape[1], 0};
        int nd = ps[i].ndim;
        if (ps[i].kind == EX_EXPERT)
            shape[0] = b->cfg.n_experts, shape[1] = ps[i].shape[0], shape[2] = ps[i].shape[1], nd = 3;
        if (ps[i].kind == EX_SHEXP_GATE) shape[0] = ps[i].shape[1], nd = 1; /* a vector, as llama.cpp has it */
        if ((s = lt_gguf_writer_add_tensor(ctx, w, name, dts[i], nd, shape)) != LT_OK) goto done;
    }
    if ((s = lt_gguf_writer_set_u32(ctx, w, "general.file_type", llama_ftype(main))) != LT_OK) goto done;
    if (quantized && (s = lt_gguf_writer_set_u32(ctx, w, "general.quantization_version", 2)) != LT_OK) goto done;
    uint64_t bytes = lt_gguf_writer_file_bytes(w);
    if ((s = lt_ex_check_space(ctx, out, bytes)) != LT_OK) goto done;
    if ((s = lt_ex_rows_init(ctx, &rows, b)) != LT_OK) goto done;
    if ((s = lt_gguf_writer_begin(ctx, w, out)) != LT_OK) goto done;
    gguf_sink sk = {w};
    for (int64_t i = 0; i < np && s == LT_OK; i++)
        s = lt_ex_stream_piece(ctx, b, a, &ps[i], &ts[i], dts[i], llama_gguf(b), &rows, to_gguf, &sk, rep);
    if (s == LT_OK) s = lt_gguf_writer_finish(ctx, w);
    if (s == LT_OK) {
        rep->bytes = bytes;
        rep->n_files = 1;
        rep->n_tensors -= n_sub; /* a stack is one tensor */
        for (int64_t i = 0; i < np; i++)
            rep->n_merged -= ps[i].kind == EX_EXPERT && ps[i].expert > 0 && lt_ex_piece_merged(a, &ps[i]);
    }
done:
    lt_ex_rows_free(ctx, &rows);
    lt_gguf_writer_free(w);
    lt_free(ctx, LT_DEVICE_CPU, ps, pbytes);
    return s;
}

lt_status lt_ex_write_gguf_lora(lt_ctx *ctx, lt_ex_base *b, const lt_ex_adapter *a, const char *out,
                                const lt_export_options *opt, lt_export_report *rep) {
    (void)opt;
    const lt_model_config *c = &b->cfg;
    lt_gguf_writer *w = NULL;
    lt_status s = lt_gguf_writer_new(ctx, &w);
    if (s != LT_OK) return s;
    const char *arch = b->arch;
    char name[160];
    if ((s = lt_gguf_writer_set_str(ctx, w, "general.architecture", arch, strlen(arch))) != LT_OK) goto done;
    if ((s = lt_gguf_writer_set_str(ctx, w, "general.type", "adapter", 7)) != LT_OK) goto done;
    if ((s = lt_gguf_writer_set_str(ctx, w, "adapter.type", "lora", 4)) != LT_OK) goto done;
    if ((s = lt_gguf_writer_set_f32(ctx, w, "adapter.lora.alpha", a->alpha)) != LT_OK) goto done;
    if (a->base_model[0] &&
        (s = lt_gguf_writer_set_str(ctx, w, "general.base_model.0.name", a->base_model, strlen(a->base_model))) !=
            LT_OK)
        goto done;
    if ((s = lt_gguf_writer_set_u32(ctx, w, "general.base_model.count", a->base_model[0] ? 1 : 0)) != LT_OK) goto done;
    /* Two passes over the same tensors: declare, then write. */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            uint64_t bytes = lt_gguf_writer_file_bytes(w);
            if ((s = lt_ex_check_space(ctx, out, bytes)) != LT_OK) goto done;
            if ((s = lt_gguf_writer_begin(ctx, w, out)) != LT_OK) goto done;
            rep->bytes = bytes;
        }
        for (int64_t l = 0; l < c->L && s == LT_OK; l++) {
            for (int k = 0; k < LT_PROJ_COUNT_ && s == LT_OK; k++) {
                if (!lt_ex_adapter_has(a, l, k)) continue;
                lt_ex_piece p = {EX_PROJ, l, k, 2, {0, 0}, 0};
                lt_ex_gguf_name(&p, name, sizeof name);
                int64_t o = 0, in = 0;
                if (k == LT_PROJ_Q) o = c->H * c->D, in = c->C;
                else if (k == LT_PROJ_K || k == LT_PROJ_V) o = c->Hkv * c->D, in = c->C;
                else if (k == LT_PROJ_O) o = c->C, in = c->H * c->D;
                else if (k == LT_PROJ_DOWN) o = c->C, in = c->F;
                else o = c->F, in = c->C;
                if (pass == 0) {
                    int64_t sa[2] = {a->rank, in}, sb[2] = {o, a->rank};
                    char full_a[176], full_b[176];
                    snprintf(full_a, sizeof full_a, "%s.lora_a", name);
                    snprintf(full_b, sizeof full_b, "%s.lora_b", name);
                    if ((s = lt_gguf_writer_add_tensor(ctx, w, full_a, LT_DTYPE_F32, 2, sa)) != LT_OK) goto done;
                    if ((s = lt_gguf_writer_add_tensor(ctx, w, full_b, LT_DTYPE_F32, 2, sb)) != LT_OK) goto done;
                    continue;
                }
                const float *A = a->a[l * LT_PROJ_COUNT_ + k], *B = a->b[l * LT_PROJ_COUNT_ + k];
                if ((s = lt_gguf_writer_write(ctx, w, A, (size_t)(a->rank * in) * sizeof(float))) != LT_OK) break;
                int qk = llama_gguf(b) && (k == LT_PROJ_Q || k == LT_PROJ_K);
                for (int64_t g = 0; g < o && s == LT_OK; g++) {
                    int64_t r = qk ? lt_ex_deinterleave_row(g, c->D) : g;
                    s = lt_gguf_writer_write(ctx, w, B + r * a->rank, (size_t)a->rank * sizeof(float));
                }
                rep->n_tensors += 2;
            }
            /* Expert stacks: A (E, r, in), B (E, rows, r) per stack; gate and up share gate_up's A. */
            for (int which = LT_PROJ_GATE; which <= LT_PROJ_DOWN && s == LT_OK; which++) {
                if (!lt_ex_adapter_has_expert(a, l, which)) continue;
                int wd = which == LT_PROJ_DOWN;
                int64_t E = c->n_experts, r = a->rank, rows, in;
                lt_ex_expert_shape(c, which, &rows, &in);
                lt_ex_piece p = {EX_EXPERT, l, which, 2, {rows, in}, 0};
                lt_ex_gguf_name(&p, name, sizeof name);
                if (pass == 0) {
                    int64_t sa[3] = {E, r, in}, sb[3] = {E, rows, r};
                    char full_a[176], full_b[176];
                    snprintf(full_a, sizeof full_a, "%s.lora_a", name);
                    snprintf(full_b, sizeof full_b, "%s.lora_b", name);
                    if ((s = lt_gguf_writer_add_tensor(ctx, w, full_a, LT_DTYPE_F32, 3, sa)) != LT_OK) goto done;
                    if ((s = lt_gguf_writer_add_tensor(ctx, w, full_b, LT_DTYPE_F32, 3, sb)) != LT_OK) goto done;
                    continue;
                }
                const float *A = a->xa[l * 2 + wd], *B = a->xb[l * 2 + wd] + (which == LT_PROJ_UP ? E * rows * r : 0);
                if ((s = lt_gguf_writer_write(ctx, w, A, (size_t)(E * r * in) * sizeof(float))) != LT_OK) break;
                if ((s = lt_gguf_writer_write(ctx, w, B, (size_t)(E * rows * r) * sizeof(float))) != LT_OK) break;
                rep->n_tensors += 2;
            }
        }
        if (s != LT_OK) goto done;
    }
    if (s == LT_OK) s = lt_gguf_writer_finish(ctx, w);
    if (s == LT_OK) rep->n_files = 1;
    else rep->bytes = 0;
done:
    lt_gguf_writer_free(w);
    return s;
}
