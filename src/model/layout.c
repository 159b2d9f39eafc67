/* The model's memory as size tables: one pure function per lifetime class (frozen weights, LoRA
 * parameters and gradients, saved activations, transients with the step's inputs, workspaces)
 * carves it into aligned pieces, pricing the layer list from each layer's description. The
 * planner calls lt_model_size_table, the model allocates exactly the same numbers in
 * lt_model_load / lt_model_prepare; nothing here touches memory. */
#include <string.h>

#include "longtune/alloc.h"
#include "model/model_internal.h"
#include "model/config_bounds.h"

lt_status lt_model_bf16x(lt_ctx *ctx, const char *where, int requested, lt_device dev, const lt_backend *be, int *on) {
    *on = 0;
    if (requested < 0 || requested > 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: bf16_products %d is not 0 or 1", where, requested);
    if (requested && dev == LT_DEVICE_CPU && !be->matmul_bf16x_workspace_bytes)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: bf16_products needs oneDNN, which this build lacks (install libdnnl-dev, e.g. by "
                        "scripts/setup.sh, and rebuild)",
                        where);
    if (requested && dev == LT_DEVICE_CPU && be->matmul_bf16x_available && !be->matmul_bf16x_available())
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: bf16_products: oneDNN makes no bf16 products on this CPU (it needs AVX-512); run "
                        "without the option",
                        where);
    *on = requested && be->matmul_bf16x_workspace_bytes;
    return LT_OK;
}

static const char *const proj_names[LT_PROJ_COUNT_] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"};

const char *lt_proj_name(lt_proj p) { return (unsigned)p < LT_PROJ_COUNT_ ? proj_names[p] : "unknown"; }

const char *lt_mem_class_name(lt_mem_class c) {
    static const char *const n[LT_MEM_CLASS_COUNT_] = {"weights",     "lora",       "grads",
                                                       "activations", "transients", "workspace"};
    return (unsigned)c < LT_MEM_CLASS_COUNT_ ? n[c] : "unknown";
}

void lt_model_proj_shape(const lt_model_config *cfg, lt_proj p, int64_t *out, int64_t *in) {
    int64_t qd = cfg->H * cfg->D, kvd = cfg->Hkv * cfg->D;
    switch (p) {
    case LT_PROJ_Q: *out = qd, *in = cfg->C; break;
    case LT_PROJ_K:
    case LT_PROJ_V: *out = kvd, *in = cfg->C; break;
    case LT_PROJ_O: *out = cfg->C, *in = qd; break;
    case LT_PROJ_GATE:
    case LT_PROJ_UP: *out = cfg->F, *in = cfg->C; break;
    default: *out = cfg->C, *in = cfg->F; break;
    }
}

lt_lora_options lt_model_resolve_lora(const lt_model_config *cfg, const lt_lora_options *in) {
    lt_lora_options o;
    memset(&o, 0, sizeof o);
    if (in) o = *in;
    o.targets &= LT_LORA_ALL_TARGETS | LT_LORA_EXPERT_TARGETS;
    int all_default = !(o.targets & LT_LORA_ALL_TARGETS);
    if (all_default) o.targets |= LT_LORA_ALL_TARGETS;
    if (o.rank <= 0) o.rank = 8;
    if (o.alpha == 0) o.alpha = 16;
    if (o.num_layers <= 0 || o.num_layers > cfg->L) o.num_layers = cfg->L;
    /* MoE layers' MLPs are the frozen experts: the default targets there are the attention's */
    for (int64_t l = cfg->L - o.num_layers; all_default && l < cfg->L; l++)
        if (lt_model_layer_is_moe(cfg, l)) o.targets = (o.targets & LT_LORA_EXPERT_TARGETS) | 0xfu;
    return o;
}

size_t lt_model_meta_bytes(const lt_model_config *cfg) { return sizeof(lt_model) + (size_t)cfg->L * sizeof(lt_layer); }

/* Bump allocator over offsets: returns the `align`-aligned offset of a piece of `bytes` and
 * advances. Saturates at SIZE_MAX so an overflow is caught once at the end. */
static size_t carve_aligned(size_t *cur, size_t bytes, size_t align) {
    size_t a = (*cur + align - 1) / align * align;
    if (a < *cur || bytes > SIZE_MAX - a) {
        *cur = SIZE_MAX;
        return 0;
    }
    *cur = a + bytes;
    return a;
}

static size_t carve(size_t *cur, size_t bytes) { return carve_aligned(cur, bytes, LT_MODEL_ALIGN); }

/* a·b, or -1 (which nb turns into SIZE_MAX) when it overflows. */
static int64_t mulx(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? -1 : r;
}

/* n elements of s bytes, saturating. */
static size_t nb(int64_t n, size_t s) {
    if (n < 0 || (n && (uint64_t)n > SIZE_MAX / s)) return SIZE_MAX;
    return (size_t)n * s;
}

static int emit(size_t *cur, void (*fn)(void *, const lt_wpiece *), void *arg, lt_wkind k, int64_t layer, int which,
                lt_dtype dt, int ndim, int64_t s0, int64_t s1) {
    lt_wpiece p;
    memset(&p, 0, sizeof p);
    p.kind = k;
    p.layer = layer;
    p.which = which;
    p.dtype = dt;
    p.ndim = ndim;
    p.shape[0] = s0;
    p.shape[1] = s1;
    int64_t rb = lt_dtype_row_bytes(dt, ndim == 2 ? s1 : s0);
    if (rb < 0) return 0;
    p.bytes = ndim == 2 ? nb(s0, (size_t)rb) : (size_t)rb;
    if (p.bytes == SIZE_MAX) return 0;
    p.offset = carve(cur, p.bytes);
    if (fn) fn(arg, &p);
    return 1;
}

lt_dtype lt_model_proj_dtype(const lt_model_config *c, int64_t l, lt_proj p) {
    if ((unsigned)p >= LT_PROJ_COUNT_) return LT_DTYPE_F32;
    if (l >= 0 && l < LT_MODEL_MAX_MIXED_LAYERS && c->layer_proj_dtype[l][p])
        return (lt_dtype)(c->layer_proj_dtype[l][p] - 1);
    return c->proj_dtype[p];
}

size_t lt_model_weights_walk(const lt_model_config *c, void (*fn)(void *arg, const lt_wpiece *p), void *arg) {
    size_t cur = 0;
    int ok = emit(&cur, fn, arg, LT_W_EMBED, -1, 0, c->embed_dtype, 2, c->V, c->C);
    if (!c->tie_embeddings) ok &= emit(&cur, fn, arg, LT_W_HEAD, -1, 0, c->head_dtype, 2, c->V, c->C);
    ok &= emit(&cur, fn, arg, LT_W_FINAL_NORM, -1, 0, LT_DTYPE_F32, 1, c->C, 0);
    ok &= emit(&cur, fn, arg, LT_W_INV_FREQ, -1, 0, LT_DTYPE_F32, 1, LT_ROPE_TABLE_LEN(c->D), 0);
    if (c->rope_local_theta > 0)
        ok &= emit(&cur, fn, arg, LT_W_INV_FREQ_LOCAL, -1, 0, LT_DTYPE_F32, 1, LT_ROPE_TABLE_LEN(c->D), 0);
    for (int64_t l = 0; ok && l < c->L; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(c, l, &d);
        for (int p = 0; p < LT_PROJ_COUNT_; p++) {
            int64_t o, i;
            lt_model_layer_proj_shape(c, l, (lt_proj)p, &o, &i);
            ok &= emit(&cur, fn, arg, LT_W_PROJ, l, p, lt_model_proj_dtype(c, l, (lt_proj)p), 2, o, i);
        }
        if (d.mlp == LT_MLP_KIND_MOE) ok &= emit(&cur, fn, arg, LT_W_ROUTER, l, 0, LT_DTYPE_F32, 2, c->n_experts, c->C);
        for (int w = 0; d.mlp == LT_MLP_KIND_MOE && c->moe_shared_F > 0 && w < 3; w++)
            ok &= emit(&cur, fn, arg, LT_W_SHARED, l, w, LT_DTYPE_F32, 2, w < 2 ? c->moe_shared_F : c->C,
                       w < 2 ? c->C : c->moe_shared_F);
        if (d.mlp == LT_MLP_KIND_MOE && c->moe_shared_F > 0)
            ok &= emit(&cur, fn, arg, LT_W_SHARED_GATE, l, 0, LT_DTYPE_F32, 1, c->C, 0);
        if (d.qkv_bias)
            for (int b = 0; b < 3; b++)
                ok &= emit(&cur, fn, arg, LT_W_BIAS, l, b, LT_DTYPE_F32, 1, (b ? c->Hkv : c->H) * d.D, 0);
        ok &= emit(&cur, fn, arg, LT_W_ATTN_NORM, l, 0, LT_DTYPE_F32, 1, c->C, 0);
        ok &= emit(&cur, fn, arg, LT_W_MLP_NORM, l, 0, LT_DTYPE_F32, 1, c->C, 0);
        if (d.norm == LT_NORM_PLACE_SANDWICH) {
            ok &= emit(&cur, fn, arg, LT_W_POST_ATTN_NORM, l, 0, LT_DTYPE_F32, 1, c->C, 0);
            ok &= emit(&cur, fn, arg, LT_W_POST_MLP_NORM, l, 0, LT_DTYPE_F32, 1, c->C, 0);
        }
        if (d.qk_norm) {
            ok &= emit(&cur, fn, arg, LT_W_Q_NORM, l, 0, LT_DTYPE_F32, 1, d.D, 0);
            ok &= emit(&cur, fn, arg, LT_W_K_NORM, l, 0, LT_DTYPE_F32, 1, d.D, 0);
        }
    }
    return ok && cur != SIZE_MAX ? cur : 0;
}

/* Store layout: offsets from 0, plus one, held in pointer fields (NULL = absent; the values are
 * never dereferenced).
 * Pieces start at multiples of `align`; above the host's 64 (a device) the store's size is
 * rounded up to it too, so every store of an array starts aligned. keep_mlp: the store keeps the
 * gate and up projections (no recompute), gu_es bytes an element. */
static size_t store_layout(const lt_model_config *c, const lt_layer_desc *wd, const lt_lora_options *lo, int64_t B,
                           int64_t T, size_t align, int keep_x_in, int keep_mlp, size_t attn_es, size_t gu_es,
                           lt_store *s) {
    int64_t N = mulx(B, T), qd = mulx(c->H, c->D), kvd = mulx(c->Hkv, c->D);
    size_t cur = 0;
    memset(s, 0, sizeof *s);
#define PIECE_ES(field, n, es) s->field = (float *)(uintptr_t)(carve_aligned(&cur, nb(n, es), align) + 1)
#define PIECE(field, n) PIECE_ES(field, n, sizeof(float))
    if (keep_x_in) PIECE(x_in, mulx(N, c->C));
    if (wd->qk_norm) {
        PIECE_ES(q_raw, mulx(N, qd), attn_es);
        PIECE_ES(k_raw, mulx(N, kvd), attn_es);
        PIECE(rstd_q, mulx(N, c->H));
        PIECE(rstd_k, mulx(N, c->Hkv));
    }
    PIECE_ES(q, mulx(N, qd), attn_es);
    PIECE_ES(k, mulx(N, kvd), attn_es);
    PIECE_ES(v, mulx(N, kvd), attn_es);
    PIECE_ES(att, mulx(N, qd), attn_es);
    PIECE(lse, mulx(mulx(B, c->H), T));
    PIECE_ES(x_mid, mulx(N, c->C), attn_es);
    if (keep_mlp && lt_model_dense_F(c)) {
        PIECE_ES(g, mulx(N, c->F), gu_es);
        PIECE_ES(u, mulx(N, c->F), gu_es);
    }
    PIECE(rstd1, N);
    PIECE(rstd2, N);
    for (int p = 0; p < LT_PROJ_COUNT_; p++)
        if (lo->targets & (1u << p)) PIECE(lu[p], mulx(N, lo->rank));
#undef PIECE
#undef PIECE_ES
    if (align > LT_MODEL_ALIGN && cur != SIZE_MAX) carve_aligned(&cur, 0, align);
    return cur;
}

/* The attention half of a store that a kept-q/k/v layout keeps per LoRA layer (lt_layout.keep_qkv):
 * what the backward reads that the recompute would otherwise rebuild (the per-head norm's inputs
 * and statistics, q, k, v after norm and RoPE, x_mid, the LoRA products of q, k, v, o). The other
 * fields are NULL; att and lse are kept apart (keep_att, keep_lse). */
static size_t kept_layout(const lt_model_config *c, const lt_layer_desc *wd, const lt_lora_options *lo, int64_t N,
                          size_t align, size_t attn_es, lt_store *s) {
    int64_t qd = mulx(c->H, c->D), kvd = mulx(c->Hkv, c->D);
    size_t cur = 0;
    memset(s, 0, sizeof *s);
#define PIECE_ES(field, n, es) s->field = (float *)(uintptr_t)(carve_aligned(&cur, nb(n, es), align) + 1)
#define PIECE(field, n) PIECE_ES(field, n, sizeof(float))
    if (wd->qk_norm) {
        PIECE_ES(q_raw, mulx(N, qd), attn_es);
        PIECE_ES(k_raw, mulx(N, kvd), attn_es);
        PIECE(rstd_q, mulx(N, c->H));
        PIECE(rstd_k, mulx(N, c->Hkv));
    }
    PIECE_ES(q, mulx(N, qd), attn_es);
    PIECE_ES(k, mulx(N, kvd), attn_es);
    PIECE_ES(v, mulx(N, kvd), attn_es);
    PIECE_ES(x_mid, mulx(N, c->C), attn_es);
    static const lt_proj attn_projs[4] = {LT_PROJ_Q, LT_PROJ_K, LT_PROJ_V, LT_PROJ_O};
    for (int i = 0; i < 4; i++)
        if (lo->targets & (1u << attn_projs[i])) PIECE(lu[attn_projs[i]], mulx(N, lo->rank));
#undef PIECE
#undef PIECE_ES
    if (cur != SIZE_MAX) carve_aligned(&cur, 0, align);
    return cur;
}

static void rebase_store(lt_store *s, const lt_store *off, uint8_t *base) {
    float **dst = (float **)s;
    float *const *src = (float *const *)off;
    for (size_t i = 0; i < sizeof *s / sizeof(float *); i++)
        dst[i] = src[i] ? (float *)(base + (uintptr_t)src[i] - 1) : NULL;
}

void lt_model_store_at(const lt_layout *lay, uint8_t *base, int kept, lt_store *out) {
    rebase_store(out, kept ? &lay->act_off : &lay->store_off, base);
}

void lt_model_kept_at(const lt_layout *lay, uint8_t *base, lt_store *st) {
    lt_store k;
    rebase_store(&k, &lay->kept_off, base);
    float **dst = (float **)st;
    float *const *src = (float *const *)&k;
    for (size_t i = 0; i < sizeof k / sizeof(float *); i++)
        if (src[i]) dst[i] = src[i];
}

int lt_model_recomputes_layer(const lt_model_config *c, lt_recompute r, int64_t l) {
    if (l < 0 || l >= c->L) return 0;
    if (r == LT_RECOMPUTE_EVERY || r == LT_RECOMPUTE_EVERY_K) return 1;
    if (r != LT_RECOMPUTE_SLIDING && r != LT_RECOMPUTE_GLOBAL) return 0;
    lt_layer_desc d;
    lt_model_describe_layer(c, l, &d);
    return d.attn == (r == LT_RECOMPUTE_SLIDING ? LT_ATTN_KIND_SLIDING : LT_ATTN_KIND_FULL);
}

/* Whether layer l's attention is a sliding window's. */
static int sliding_layer(const lt_model_config *c, int64_t l) {
    lt_layer_desc d;
    lt_model_describe_layer(c, l, &d);
    return d.attn == LT_ATTN_KIND_SLIDING;
}

int64_t lt_model_recompute_cap(lt_recompute r, int64_t k) {
    return r == LT_RECOMPUTE_EVERY ? 1 : k > 0 ? k : r == LT_RECOMPUTE_EVERY_K ? 2 : 1;
}

/* Where the last segment of the K LoRA layers under policy r (segments of at most cap layers)
 * starts: its layers keep their forward stores until their backward, which never recomputes
 * them, so they neither keep nor rerun attention. K when no layer is recomputed. */
static int64_t last_segment_start(const lt_model_config *c, lt_recompute r, int64_t cap, int64_t K) {
    int64_t start = K, len = 0;
    for (int64_t j = 0; j < K; j++) {
        if (!lt_model_recomputes_layer(c, r, c->L - K + j)) {
            len = 0;
            continue;
        }
        if (len == 0 || len == cap) start = j, len = 0;
        len++;
    }
    return start;
}

void lt_model_attention_rerun_split(const lt_model_config *c, lt_recompute r, int64_t cap, int64_t K, int64_t rerun,
                                    int64_t *sliding, int64_t *other) {
    int64_t n_sl = 0, n_all = 0, end = last_segment_start(c, r, cap < 1 ? 1 : cap, K);
    for (int64_t j = 0; j < end; j++)
        if (lt_model_recomputes_layer(c, r, c->L - K + j)) n_all++, n_sl += sliding_layer(c, c->L - K + j);
    if (rerun < 0 || rerun > n_all) rerun = n_all;
    *sliding = rerun < n_sl ? rerun : n_sl;
    *other = rerun - *sliding;
}

void lt_model_rc_walk(const lt_model_config *c, lt_recompute r, int64_t cap, int64_t K, int64_t rerun, lt_rc_place *out,
                      lt_rc_counts *n) {
    memset(n, 0, sizeof *n);
    int64_t rerun_sl, rerun_full, seen_sl = 0, seen_full = 0, end = last_segment_start(c, r, cap, K);
    lt_model_attention_rerun_split(c, r, cap, K, rerun, &rerun_sl, &rerun_full);
    int64_t len = 0; /* layers so far in the open segment (0: none open) */
    for (int64_t j = 0; j < K; j++) {
        lt_rc_place p;
        memset(&p, 0, sizeof p);
        p.rec = lt_model_recomputes_layer(c, r, c->L - K + j);
        if (!p.rec) {
            p.idx = (int32_t)n->n_kept++;
            len = 0;
        } else {
            if (len == 0 || len == cap) n->n_seg++, len = 0;
            p.seg = (int32_t)(n->n_seg - 1);
            p.pos = (int32_t)len++;
            p.idx = (int32_t)n->n_rec++;
            if (len > n->max_len) n->max_len = len;
        }
        p.katt = -1;
        if (p.rec && j < end) { /* the last segment's attention stays in its stores */
            const int sl = sliding_layer(c, c->L - K + j);
            const int reruns = sl ? seen_sl++ < rerun_sl : seen_full++ < rerun_full;
            if (!reruns) p.katt = (int32_t)n->n_katt++;
        }
        /* the segment's last layer: the next one is kept, opens a segment, or there is none */
        p.last = p.rec && (j + 1 == K || len == cap || !lt_model_recomputes_layer(c, r, c->L - K + j + 1));
        if (out) out[j] = p;
    }
}

/* The run's shape and the choices resolved from its options, shared by the per-class layouts. */
typedef struct run_shape {
    const lt_model_config *c;
    lt_lora_options lo;
    const lt_model_run_options *run;
    const lt_backend *be; /* of run->device: its kernels' workspace sizes */
    lt_layer_desc wd;     /* the widest layer (what a store slot must hold) */
    int64_t B, T, N, K;   /* K LoRA layers */
    int64_t qd, kvd;      /* H·D, Hkv·D */
    size_t al, es;        /* piece alignment; bytes of a saved element */
    int fwd_only, keep_mlp;
} run_shape;

/* bytes rounded up to al, saturating. */
static size_t round_up(size_t bytes, size_t al) {
    return bytes > SIZE_MAX - al ? SIZE_MAX : (bytes + al - 1) / al * al;
}

/* Frozen weights, LoRA parameters and their gradients: what lt_model_load allocates. */
static lt_status layout_params(lt_ctx *ctx, const lt_model_config *c, const lt_lora_options *lora_in, lt_layout *o,
                               lt_lora_options *lo_out) {
    /* The bounds keep every size product below 2^63; the store layouts check theirs besides. */
    LT_TRY(lt_model_config_check_bounds(ctx, "model layout", c, NULL));
    if (c->V <= 0 || c->C <= 0 || c->F <= 0 || c->L <= 0 || c->H <= 0 || c->Hkv <= 0 || c->D <= 0 || c->D % 2 ||
        c->H % c->Hkv)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model layout: bad config (V, C, F, L, H, Hkv, D)");
    LT_TRY(lt_model_check_layers(ctx, c));
    lt_lora_options lo = lt_model_resolve_lora(c, lora_in);
    if (!(lo.dropout >= 0 && lo.dropout < 1))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lora: dropout %g outside [0, 1)", (double)lo.dropout);
    o->weights_bytes = lt_model_weights_walk(c, NULL, NULL);
    if (!o->weights_bytes)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model layout: weight sizes overflow or rows are not whole blocks");
    LT_TRY(lt_model_check_lora_targets(ctx, c, lo.targets));
    LT_TRY(lt_model_check_moe_lora(ctx, c, &lo));
    int64_t n = 0;
    for (int p = 0; p < LT_PROJ_COUNT_; p++)
        if (lo.targets & (1u << p)) { /* a fused module's members share its owner's A */
            int64_t out, in;
            lt_model_proj_shape(c, (lt_proj)p, &out, &in);
            int64_t add = mulx(lo.rank, out + (lt_model_lora_owner(c, (lt_proj)p) == (lt_proj)p ? in : 0));
            n = add < 0 || n > INT64_MAX - add ? -1 : n + add;
            if (n < 0) break;
        }
    o->lora_plain = n;
    o->n_lora = n < 0 ? -1 : mulx(n, lo.num_layers);
    /* the experts' adapters: MoE layers among the LoRA layers only */
    for (int64_t l = c->L - lo.num_layers; o->n_lora >= 0 && l < c->L; l++) {
        int64_t add = lt_model_moe_lora_elems(c, &lo, l);
        o->n_lora = o->n_lora > INT64_MAX - add ? -1 : o->n_lora + add;
    }
    if (o->n_lora < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model layout: LoRA rank %lld over %lld layers overflows",
                        (long long)lo.rank, (long long)lo.num_layers);
    o->lora_bytes = nb(o->n_lora, sizeof(float));
    o->class_bytes[LT_MEM_WEIGHTS] = o->weights_bytes;
    o->class_bytes[LT_MEM_LORA] = o->lora_bytes;
    o->class_bytes[LT_MEM_GRADS] = o->lora_bytes;
    *lo_out = lo;
    return LT_OK;
}

/* The recompute policy: its segment cap (every: 1; every:K: K, 0 = 2; by kind: K, 0 = 1; at most
 * the LoRA layers), which LoRA layers it recomputes, and the refusal of a by-kind policy whose
 * kind the LoRA layers lack. A forward-only run recomputes nothing. */
static lt_status resolve_recompute(lt_ctx *ctx, const lt_model_run_options *run, run_shape *r, lt_layout *o,
                                   lt_rc_counts *n) {
    const lt_model_config *c = r->c;
    lt_recompute p = run->recompute;
    if ((unsigned)p > LT_RECOMPUTE_GLOBAL)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: unknown recompute policy %d", (int)p);
    if (run->recompute_k < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: recompute_k %lld is negative",
                        (long long)run->recompute_k);
    int64_t cap = lt_model_recompute_cap(p, run->recompute_k);
    if (cap > r->K) cap = r->K;
    o->rc = r->fwd_only ? LT_RECOMPUTE_NONE : p;
    o->rc_k = o->rc == LT_RECOMPUTE_NONE ? 0 : cap;
    if (run->recompute_attention_layers < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: recompute_attention_layers %lld is negative",
                        (long long)run->recompute_attention_layers);
    o->rc_rerun = run->recompute_attention ? -1 : run->recompute_attention_layers;
    lt_model_rc_walk(c, o->rc, cap, r->K, o->rc_rerun, NULL, n);
    o->n_rec = n->n_rec;
    o->n_katt = n->n_katt;
    if ((o->rc == LT_RECOMPUTE_SLIDING || o->rc == LT_RECOMPUTE_GLOBAL) && !n->n_rec) {
        int sl = o->rc == LT_RECOMPUTE_SLIDING;
        int64_t in_model = 0;
        for (int64_t l = 0; l < c->L; l++) in_model += lt_model_recomputes_layer(c, o->rc, l);
        if (!in_model)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: recompute %s: the model has no %s layers",
                            sl ? "sliding" : "global", sl ? "sliding-window" : "full-attention (global)");
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "model run: recompute %s: none of the LoRA layers (the last %lld of %lld) has %s attention",
                        sl ? "sliding" : "global", (long long)r->K, (long long)c->L, sl ? "sliding-window" : "full");
    }
    return LT_OK;
}

/* Whether projections ps[0..np) of every layer (dense layers only with dense_only) take bf16
 * inputs (lt_layout.mlp_bf16, qkv_bf16, o_bf16): the backend has the ops, LoRA has no dropout (whose masks
 * apply to f32 inputs), and lora_bf16_takes accepts each projection with its adapter. */
static int bf16_inputs_ok(const run_shape *r, const lt_proj *ps, int np, int dense_only) {
    const lt_backend *be = r->be;
    const lt_model_config *c = r->c;
    if (!be->lora_bf16_takes || !be->rmsnorm_fwd_bf16 || !be->glu_fwd_bf16 || !be->glu_bwd_bf16 || !be->lora_fwd_bf16 ||
        !be->lora_bwd_bf16 || r->lo.dropout > 0)
        return 0;
    for (int64_t l = 0; l < c->L; l++) {
        if (dense_only && lt_model_layer_is_moe(c, l)) continue;
        for (int i = 0; i < np; i++) {
            int64_t out, in;
            lt_model_proj_shape(c, ps[i], &out, &in);
            int64_t rank = r->lo.targets & (1u << ps[i]) ? r->lo.rank : 0;
            if (!be->lora_bf16_takes(lt_model_proj_dtype(c, l, ps[i]), out, in, rank)) return 0;
        }
    }
    return 1;
}

/* The run's shape, and its mode flags resolved once into the layout (saved dtype, bf16 attention
 * tensors, checkpoints as residuals, kept attention and q/k/v, offload, the chunk), so the step
 * reads them instead of the options. */
static lt_status resolve_run(lt_ctx *ctx, const lt_model_run_options *run, run_shape *r, lt_layout *o) {
    const lt_model_config *c = r->c;
    r->run = run;
    r->B = run->B, r->T = run->T;
    if (r->B <= 0 || r->T <= 0 || r->B > INT32_MAX || r->T > INT32_MAX || r->B * r->T > INT32_MAX)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: B=%lld, T=%lld out of range", (long long)r->B,
                        (long long)r->T);
    lt_device dev = run->device;
    if ((unsigned)dev >= LT_DEVICE_COUNT_)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: unknown device %d", (int)dev);
    /* The workspaces are the device's kernels' own sizes, which only a build with that backend
     * knows. */
    if (!(r->be = lt_backend_get(dev)))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "model run: this build has no %s backend (planning for it needs one)",
                        dev == LT_DEVICE_CUDA ? "CUDA" : "such");
    o->device = dev;
    o->align = r->al = dev == LT_DEVICE_CPU ? LT_MODEL_ALIGN : LT_ALLOC_ALIGN_DEVICE;
    r->N = r->B * r->T, r->K = r->lo.num_layers, r->qd = c->H * c->D, r->kvd = c->Hkv * c->D;
    o->threads = run->threads > 0 ? run->threads : lt_ctx_threads(ctx);
    r->fwd_only = run->forward_only;
    lt_rc_counts rc;
    LT_TRY(resolve_recompute(ctx, run, r, o, &rc));
    r->keep_mlp = !r->fwd_only && !rc.n_rec;
    if (run->saved_bf16 < -1 || run->saved_bf16 > 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: saved_bf16 %d outside -1..1", run->saved_bf16);
    o->saved_dtype = run->saved_bf16 > 0 ? LT_DTYPE_BF16 : run->saved_bf16 < 0 ? LT_DTYPE_F32 : r->be->saved_dtype;
    LT_TRY(lt_model_bf16x(ctx, "model run", run->bf16_products, dev, r->be, &o->bf16x));
    r->es = o->saved_dtype == LT_DTYPE_BF16 ? 2 : 4;
    o->attn_bf16 = o->saved_dtype == LT_DTYPE_BF16;
    if (run->act_f32 < 0 || run->act_f32 > 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: act_f32 %d outside 0..1", run->act_f32);
    static const lt_proj mlp[3] = {LT_PROJ_GATE, LT_PROJ_UP, LT_PROJ_DOWN}, o_proj = LT_PROJ_O;
    o->mlp_bf16 = !run->act_f32 && bf16_inputs_ok(r, mlp, 3, 1);
    o->qkv_bf16 = !run->act_f32 && bf16_inputs_ok(r, lt_proj_group_qkv, 3, 0);
    o->o_bf16 = !run->act_f32 && o->attn_bf16 && bf16_inputs_ok(r, &o_proj, 1, 0);
    if (run->gu_f32 < 0 || run->gu_f32 > 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: gu_f32 %d outside 0..1", run->gu_f32);
    o->gu_bf16 = o->mlp_bf16 && !run->gu_f32;
    o->hf_bf16 = !r->fwd_only && o->mlp_bf16;
    const size_t gu_es = o->gu_bf16 ? 2 : 4;
    /* Segments of one layer: a recomputed layer's checkpoint is its input, the layer before writes it. */
    o->resid_ckpt = !r->fwd_only && rc.n_rec && rc.max_len == 1;
    o->store_bytes = store_layout(c, &r->wd, &r->lo, r->B, r->T, r->al, !r->fwd_only && !o->resid_ckpt, 0, r->es, gu_es,
                                  &o->store_off);
    if (!r->fwd_only && rc.n_kept)
        o->act_store_bytes = store_layout(c, &r->wd, &r->lo, r->B, r->T, r->al, 1, 1, r->es, gu_es, &o->act_off);
    if (run->chunk_rows < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: chunk_rows %lld is negative", (long long)run->chunk_rows);
    o->chunk = run->chunk_rows ? run->chunk_rows : LT_MODEL_CHUNK_ROWS;
    if (o->chunk > r->N) o->chunk = r->N;
    /* A store per kept LoRA layer, slots for the longest segment and one input per segment. */
    if (r->fwd_only) {
        o->n_act_stores = 0, o->n_tr_stores = 1, o->n_ckpt = 0;
    } else {
        o->n_act_stores = rc.n_kept, o->n_tr_stores = rc.max_len, o->n_ckpt = rc.n_seg;
    }
    if (run->offload_ckpt && !r->fwd_only && !o->n_ckpt)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "model run: checkpoint offload needs a recompute policy (all, every:K, "
                        "sliding or global): without one there are no checkpoints to offload");
    /* Offload keeps two slots on the device and the rest on the host (see lt_layout.offload); with
     * two checkpoints or fewer there is nothing to move. */
    o->offload = run->offload_ckpt && o->n_ckpt > 2;
    o->keep_attn = o->n_ckpt && o->n_katt > 0;
    /* On the host, also what the recompute's q/k/v and o projections would rebuild (about 4% of a
     * T=2048 step): the CUDA step keeps only the attention output (its device graph and memory
     * budget are tuned around that). */
    o->keep_qkv = o->keep_attn && dev == LT_DEVICE_CPU;
    return LT_OK;
}

/* Saved across the step: the stores of the kept LoRA layers (all of them without recompute), the
 * checkpoints, and with kept attention each recomputed layer's attention output and lse (and on
 * the host q/k/v). */
static void layout_activations(const run_shape *r, lt_layout *o) {
    const lt_model_config *c = r->c;
    size_t al = r->al, cur = 0;
    o->act_stores = carve_aligned(&cur, nb(o->n_act_stores, o->act_store_bytes), al);
    /* Each piece rounded up to the alignment so every layer's starts aligned. */
    o->ckpt_stride = round_up(nb(r->N * c->C, r->es), al);
    if (o->offload) o->offload_bytes = nb(o->n_ckpt - 2, o->ckpt_stride);
    o->ckpt = carve_aligned(&cur, nb(o->offload ? 2 : o->n_ckpt, o->ckpt_stride), al);
    if (o->keep_attn) {
        o->att_stride = round_up(nb(r->N * r->qd, r->es), al);
        o->lse_stride = round_up(nb(r->B * c->H * r->T, 4), al);
        o->keep_att = carve_aligned(&cur, nb(o->n_katt, o->att_stride), al);
        o->keep_lse = carve_aligned(&cur, nb(o->n_katt, o->lse_stride), al);
    }
    if (o->keep_qkv) {
        o->kept_stride = kept_layout(c, &r->wd, &r->lo, r->N, al, r->es, &o->kept_off);
        o->keep_store = carve_aligned(&cur, nb(o->n_katt, o->kept_stride), al);
    }
    o->class_bytes[LT_MEM_ACTIVATIONS] = cur == SIZE_MAX ? SIZE_MAX : (o->n_act_stores + o->n_ckpt ? cur : 0);
}

/* Device runs only: the step's inputs as one piece the host stages and copies in with a single
 * transfer per step (see lt_layout.inputs); the transients carve it. */
static void layout_inputs(const run_shape *r, lt_layout *o) {
    if (o->device == LT_DEVICE_CPU) return;
    o->in_tokens = carve(&o->in_bytes, nb(r->N, 4));
    o->in_targets = carve(&o->in_bytes, nb(r->N, 4));
    o->in_pos = carve(&o->in_bytes, nb(r->N, 4));
    o->in_scalars = carve(&o->in_bytes, 4 * sizeof(float));
    o->in_offs = carve(&o->in_bytes, nb(r->B * (r->T + 1), 4)); /* packed rows' offsets, S <= T */
}

/* The segment's stores (the frozen layers below the LoRA ones and the forward-only pass run in
 * place on one of them), the loss's row statistics, the inputs, and in a forward-only run the final
 * norm's input and output (a training run keeps them in the workspace). */
static void layout_transients(const run_shape *r, lt_layout *o) {
    size_t al = r->al, cur = 0, nc = nb(r->N * r->c->C, 4);
    o->tr_stores = carve_aligned(&cur, nb(o->n_tr_stores, o->store_bytes), al);
    if (r->fwd_only) {
        o->final_class = LT_MEM_TRANSIENTS;
        o->xf = carve_aligned(&cur, nc, al);
        o->hf = carve_aligned(&cur, nc, al);
    }
    o->rstd_f = carve_aligned(&cur, nb(r->N, 4), al);
    o->lse_f = carve_aligned(&cur, nb(r->N, 4), al);
    o->tloss = carve_aligned(&cur, nb(r->N, 4), al);
    if (o->device == LT_DEVICE_CPU) o->pos = carve_aligned(&cur, nb(r->N, 4), al);
    else o->inputs = carve_aligned(&cur, o->in_bytes, al);
    if (o->attn_batch_bytes) o->attn_batch = carve_aligned(&cur, nb(o->n_attn_batch, o->attn_batch_bytes), al);
    o->class_bytes[LT_MEM_TRANSIENTS] = cur;
}

/* The step's per-batch attention preparations: the distinct windows of the layers that attend,
 * and the buffer each needs at the run's shape (rounded to the piece alignment). */
static lt_status layout_attn_batch(lt_ctx *ctx, const run_shape *r, lt_layout *o) {
    const lt_model_config *c = r->c;
    o->n_attn_batch = 0;
    for (int64_t l = 0; l < c->L; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(c, l, &d);
        if (d.attn == LT_ATTN_KIND_NONE) continue;
        int seen = 0;
        for (int i = 0; i < o->n_attn_batch; i++) seen |= o->attn_window[i] == d.window;
        if (seen) continue;
        if (o->n_attn_batch == LT_MODEL_ATTN_WINDOWS_MAX)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "model layout: more than %d distinct attention windows",
                            LT_MODEL_ATTN_WINDOWS_MAX);
        o->attn_window[o->n_attn_batch++] = d.window;
    }
    lt_attention_params ap;
    memset(&ap, 0, sizeof ap);
    ap.B = r->B, ap.T = r->T, ap.H = c->H, ap.Hkv = c->Hkv, ap.D = c->D;
    ap.dtype = o->attn_bf16 ? LT_DTYPE_BF16 : LT_DTYPE_F32;
    ap.device = o->device;
    size_t bytes = o->n_attn_batch ? lt_attention_batch_bytes(&ap) : 0;
    o->attn_batch_bytes = bytes ? round_up(bytes, r->al) : 0;
    return LT_OK;
}

/* The backward's whole-batch gradients (training only) and the chunk buffers of the
 * position-wise work, from *cur on. */
static void layout_buffers(const run_shape *r, lt_layout *o, size_t *cur) {
    const lt_model_config *c = r->c;
    size_t al = r->al;
    int64_t CH = o->chunk, F = lt_model_dense_F(c), max_in = c->C > F ? c->C : F; /* F: dense MLPs only */
    if (r->qd > max_in) max_in = r->qd;
    if (!r->fwd_only) {
        /* The final norm's input and output are dead once its backward has run, before any
         * layer's backward writes attention's gradients: they share one region. */
        o->dx = carve_aligned(cur, nb(r->N * c->C, 4), al);
        size_t region = carve_aligned(cur, 0, al), fin = region, grads = region;
        o->final_class = LT_MEM_WORKSPACE;
        o->xf = carve_aligned(&fin, nb(r->N * c->C, 4), al);
        if (!o->hf_bf16) o->hf = carve_aligned(&fin, nb(r->N * c->C, 4), al); /* else in the loss's place */
        o->datt = carve_aligned(&grads, nb(r->N * r->qd, r->es), al);
        o->dq = carve_aligned(&grads, nb(r->N * r->qd, r->es), al);
        o->dk = carve_aligned(&grads, nb(r->N * r->kvd, r->es), al);
        o->dv = carve_aligned(&grads, nb(r->N * r->kvd, r->es), al);
        *cur = fin > grads ? fin : grads;
    }
    o->h = carve_aligned(cur, nb(CH * c->C, 4), al);
    if (o->resid_ckpt && o->saved_dtype == LT_DTYPE_BF16) o->xc = carve_aligned(cur, nb(CH * c->C, 4), al);
    if (o->attn_bf16) o->mc = carve_aligned(cur, nb(CH * c->C, 4), al);
    if (!r->keep_mlp) {
        o->g = carve_aligned(cur, nb(CH * F, o->gu_bf16 ? 2 : 4), al);
        o->u = carve_aligned(cur, nb(CH * F, o->gu_bf16 ? 2 : 4), al);
    }
    o->dg = carve_aligned(cur, nb(CH * F, 4), al);
    if (o->attn_bf16) {
        /* q, k, v and attention's rows in f32 (qc, ac) are dead whenever dg is live (a chunk's MLP
         * runs after its attention half, the MLP's backward before the attention half's), so they
         * take dg's buffer when it holds both. */
        size_t qb = nb(CH * (r->qd + 2 * r->kvd), 4), ab = nb(CH * (r->wd.qk_norm ? r->qd + r->kvd : r->qd), 4);
        size_t in_dg = o->dg, qc = carve_aligned(&in_dg, qb, al), ac = carve_aligned(&in_dg, ab, al);
        int fits = in_dg != SIZE_MAX && o->dg != SIZE_MAX && in_dg - o->dg <= nb(CH * F, 4);
        o->qc = fits ? qc : carve_aligned(cur, qb, al);
        o->ac = fits ? ac : carve_aligned(cur, ab, al);
    }
    if (r->wd.norm == LT_NORM_PLACE_SANDWICH) { /* a block's output before its post-norm, and its rstd */
        o->pn = carve_aligned(cur, nb(CH * c->C, 4), al);
        o->prs = carve_aligned(cur, nb(CH, 4), al);
    }
    if (r->lo.dropout > 0) o->scratch = carve_aligned(cur, nb(CH * max_in, 4), al); /* dropout's masked inputs */
    if (!r->fwd_only) {
        /* the up gradient goes over u, or under mlp_bf16 into dg's second half (mlp_bwd) */
        o->da = carve_aligned(cur, nb(CH * F, o->gu_bf16 ? 2 : 4), al); /* bf16 under gu_bf16 */
        /* dh, a norm's input gradient, is made once da is dead (the MLP's after its glu backward,
         * the attention half's after the MLP) and can use da's buffer; not with sandwich norms,
         * whose post-MLP norm gradient is dh while the down projection's backward writes da. */
        int dh_in_da = F * (o->gu_bf16 ? 2 : 4) >= c->C * 4 && r->wd.norm != LT_NORM_PLACE_SANDWICH;
        o->dh = dh_in_da ? o->da : carve_aligned(cur, nb(CH * c->C, 4), al);
        o->dlu = carve_aligned(cur, nb(CH * 3 * r->lo.rank, 4), al); /* dlu of a group of three (q, k, v) */
    }
}

/* The matmul's workspace: the largest over every layer's projections (their dtypes may differ
 * per layer) at the chunk. The head's products run in the loss, which has a workspace of its own;
 * lt_model_logits, the one caller of the head's matmul outside the loss, allocates one for its call
 * (a vocabulary-wide head's bf16 x staging took 235 MB here, four times what SmolLM2-135M's
 * projections need, at every length). */
static size_t matmul_workspace(const run_shape *r, const lt_layout *o) {
    const lt_model_config *c = r->c;
    size_t mm = 0;
    int64_t mixed = c->L < LT_MODEL_MAX_MIXED_LAYERS ? c->L : LT_MODEL_MAX_MIXED_LAYERS;
    for (int p = 0; p < LT_PROJ_COUNT_; p++) {
        int64_t out, in;
        lt_model_proj_shape(c, (lt_proj)p, &out, &in);
        for (int64_t l = -1; l < mixed; l++) { /* -1: proj_dtype itself */
            lt_dtype dt = l < 0 ? c->proj_dtype[p] : lt_model_proj_dtype(c, l, (lt_proj)p);
            if (l >= 0 && dt == c->proj_dtype[p]) continue;
            size_t w = r->be->matmul_workspace_bytes(dt, out, in, o->chunk, o->threads);
            if (w > mm) mm = w;
            if (o->bf16x) w = r->be->matmul_bf16x_workspace_bytes(dt, out, in, o->chunk, o->threads);
            if (w > mm) mm = w;
        }
    }
    return mm;
}

/* lora_bwd's own share of the matmul workspace: the largest over the groups the step runs
 * (q, k, v and gate, up share an input; o and down alone), every projection counted as adapted. */
static size_t lora_workspace(const run_shape *r, const lt_layout *o) {
    if (r->fwd_only || !r->be->lora_workspace_bytes || r->K == 0) return 0;
    static const lt_proj o_alone = LT_PROJ_O, down_alone = LT_PROJ_DOWN;
    const struct {
        int G;
        const lt_proj *p;
    } groups[] = {{3, lt_proj_group_qkv}, {2, lt_proj_group_gate_up}, {1, &o_alone}, {1, &down_alone}};
    size_t lw = 0;
    for (size_t i = 0; i < sizeof groups / sizeof *groups; i++) {
        int64_t in = 0, out_max = 0;
        for (int g = 0; g < groups[i].G; g++) {
            int64_t out, pin;
            lt_model_proj_shape(r->c, groups[i].p[g], &out, &pin);
            in = pin;
            if (out > out_max) out_max = out;
        }
        size_t w = r->be->lora_workspace_bytes(groups[i].G, r->lo.rank, in, out_max, o->threads);
        if (w > lw) lw = w;
    }
    return lw;
}

/* Attention's workspace for one layer kind's parameters: the largest over the passes the run
 * makes and over how many sequences a row holds. That count is known only at the call, and a
 * device kernel's workspace may depend on it (a copy of the offsets; a backward plan chosen by the
 * mean sequence length): take unpacked rows, one and T sequences per row. Nothing reads the
 * offsets here. */
static size_t attn_kind_workspace(const run_shape *r, lt_attention_params *ap, int threads) {
    static const int32_t packed;
    const int64_t seqs[3] = {0, 1, r->T};
    size_t aw = 0;
    for (int pass = 0; pass < 2 - r->fwd_only; pass++)
        for (int i = 0; i < 3; i++) {
            ap->seq_offsets = seqs[i] ? &packed : NULL;
            ap->S = seqs[i];
            size_t w = lt_attention_workspace_bytes(ap, pass, threads);
            if (w > aw) aw = w;
        }
    return aw;
}

/* The attention workspace every layer's call can use: checked and sized per distinct layer kind
 * (window, softcap, head dim), the largest taken; a device run adds the (B, T+1) offsets table
 * once more, which bounds every count of sequences when only the table's size and such a plan
 * depend on it. */
static lt_status attn_workspace(lt_ctx *ctx, const run_shape *r, const lt_layout *o, size_t *out) {
    const lt_model_config *c = r->c;
    size_t aw = 0;
    lt_layer_desc prev;
    memset(&prev, 0, sizeof prev);
    for (int64_t l = 0; l < c->L; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(c, l, &d);
        if (l && d.window == prev.window && d.softcap == prev.softcap && d.D == prev.D) continue;
        prev = d;
        lt_attention_params ap;
        memset(&ap, 0, sizeof ap);
        ap.B = r->B, ap.T = r->T, ap.H = c->H, ap.Hkv = c->Hkv, ap.D = d.D;
        ap.dtype = o->attn_bf16 ? LT_DTYPE_BF16 : LT_DTYPE_F32;
        ap.device = o->device;
        ap.impl = r->run->attention;
        ap.window = d.window;
        ap.softcap = d.softcap;
        ap.bf16_products = o->bf16x;
        LT_TRY(lt_attention_check(ctx, &ap));
        size_t w = attn_kind_workspace(r, &ap, o->threads);
        if (w > aw) aw = w;
    }
    if (o->device != LT_DEVICE_CPU) {
        size_t table = nb(r->B * (r->T + 1), 4);
        aw = table > SIZE_MAX - aw ? SIZE_MAX : aw + table;
    }
    *out = aw;
    return LT_OK;
}

/* The fused loss's workspace over the batch (forward, and forward-backward in training). */
static size_t lce_workspace(const run_shape *r, const lt_layout *o) {
    const lt_model_config *c = r->c;
    lt_lce_options lopt;
    memset(&lopt, 0, sizeof lopt);
    lopt.impl = r->run->loss;
    lopt.reduction = LT_REDUCTION_SUM;
    lopt.bf16_products = o->bf16x;
    int64_t hs[2] = {r->N, c->C}, wsh[2] = {c->V, c->C};
    lt_tensor hv = lt_tensor_view(NULL, LT_DTYPE_F32, o->device, 2, hs);
    lt_lce_args la;
    memset(&la, 0, sizeof la);
    la.h = o->hf_bf16 ? lt_tensor_view(NULL, LT_DTYPE_BF16, o->device, 2, hs) : hv;
    la.w = lt_tensor_view(NULL, c->tie_embeddings ? c->embed_dtype : c->head_dtype, o->device, 2, wsh);
    la.dh = &hv; /* ∂/∂h is f32 (into dx) */
    size_t lw = lt_lce_workspace_bytes(&lopt, &la, 0, o->threads);
    if (!r->fwd_only) { /* the training step calls lt_lce_forward_backward */
        size_t lb = lt_lce_workspace_bytes(&lopt, &la, LT_LCE_PASS_FORWARD_BACKWARD, o->threads);
        if (lb > lw) lw = lb;
    }
    return lw;
}

/* The backward's gradients, the chunk buffers and the kernels' own workspaces at this shape. The
 * MoE dispatch buffers and the matmul's workspace come first, the chunk buffers last: attention
 * and the loss run between the chunk loops, when no chunk buffer holds anything a later op reads,
 * and their workspaces are scratch of one call, so both start where the chunk buffers do and
 * reach past them only when larger. */
static lt_status layout_workspace(lt_ctx *ctx, const run_shape *r, lt_layout *o) {
    size_t cur = 0;
    LT_TRY(lt_model_moe_layout(ctx, r->c, &r->lo, r->run, r->be, o->chunk, !r->fwd_only, o->bf16x, o->threads, r->al,
                               &cur, &o->moe));
    o->mm_ws_bytes = matmul_workspace(r, o);
    if (o->moe.mm_ws_bytes > o->mm_ws_bytes) o->mm_ws_bytes = o->moe.mm_ws_bytes; /* shared experts */
    size_t lw = lora_workspace(r, o);
    if (lw > o->mm_ws_bytes) o->mm_ws_bytes = lw;
    o->mm_ws = carve_aligned(&cur, o->mm_ws_bytes, r->al);
    layout_buffers(r, o, &cur); /* the whole-batch gradients, then the chunk buffers from o->h on */
    LT_TRY(attn_workspace(ctx, r, o, &o->attn_ws_bytes));
    size_t a_end = o->h, l_end = o->h;
    o->attn_ws = carve_aligned(&a_end, o->attn_ws_bytes, r->al);
    if (o->hf_bf16) o->hf = carve_aligned(&l_end, nb(r->N * r->c->C, 2), r->al);
    o->lce_ws_bytes = lce_workspace(r, o);
    o->lce_ws = carve_aligned(&l_end, o->lce_ws_bytes, r->al);
    if (a_end > cur) cur = a_end;
    if (l_end > cur) cur = l_end;
    o->class_bytes[LT_MEM_WORKSPACE] = cur;
    return LT_OK;
}

lt_status lt_model_layout(lt_ctx *ctx, const lt_model_config *c, const lt_lora_options *lora_in,
                          const lt_model_run_options *run, lt_layout *o) {
    memset(o, 0, sizeof *o);
    run_shape r;
    memset(&r, 0, sizeof r);
    r.c = c;
    LT_TRY(layout_params(ctx, c, lora_in, o, &r.lo));
    if (!run) return LT_OK;
    r.wd = lt_model_widest_layer(c);
    LT_TRY(resolve_run(ctx, run, &r, o));
    layout_activations(&r, o);
    layout_inputs(&r, o);
    LT_TRY(layout_attn_batch(ctx, &r, o));
    layout_transients(&r, o);
    LT_TRY(layout_workspace(ctx, &r, o));
    for (int i = 0; i < LT_MEM_CLASS_COUNT_; i++)
        if (o->class_bytes[i] == SIZE_MAX || o->offload_bytes == SIZE_MAX)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: %s bytes overflow at B=%lld T=%lld",
                            lt_mem_class_name((lt_mem_class)i), (long long)r.B, (long long)r.T);
    return LT_OK;
}

lt_status lt_model_size_table(lt_ctx *ctx, const lt_model_config *cfg, const lt_lora_options *lora,
                              const lt_model_run_options *run, lt_model_sizes *out) {
    memset(out, 0, sizeof *out);
    lt_layout lay;
    LT_TRY(lt_model_layout(ctx, cfg, lora, run, &lay));
    lt_device dev = run ? run->device : LT_DEVICE_CPU;
    for (int i = 0; i < LT_MEM_CLASS_COUNT_; i++) {
        out->bytes[i] = lay.class_bytes[i] ? lt_alloc_accounted_size(dev, lay.class_bytes[i]) : 0;
        /* The host bookkeeping counts where the classes live only when that is the host. */
        if (i == LT_MEM_WEIGHTS && dev == LT_DEVICE_CPU)
            out->bytes[i] += lt_alloc_accounted_size(LT_DEVICE_CPU, lt_model_meta_bytes(cfg));
        out->total += out->bytes[i];
    }
    if (lay.offload) {
        out->offload_bytes = lt_alloc_accounted_size(LT_DEVICE_CPU, lay.offload_bytes);
        if (dev == LT_DEVICE_CPU) {
            out->bytes[LT_MEM_ACTIVATIONS] += out->offload_bytes;
            out->total += out->offload_bytes;
        }
    }
    out->n_lora_params = lay.n_lora;
    return LT_OK;
}
