/* The loaded model apart from its step: the run memory (allocated once by lt_model_prepare from
 * the layout in layout.c), the attention path chosen there (the device's kernel, or ring or
 * Ulysses attention under context parallel), the accessors and the LoRA tensors' views. Loading
 * lives in load.c, the step in step.c (with layer.c, proj.c and offload.c). */
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/context_parallel.h"
#include "model/model_internal.h"

/* ---- run memory ---- */

/* Whole pages: host_register pins page ranges, and two ranges on one page cannot both be pinned. */
#define STAGE_PAGE ((size_t)4096)

void lt_model_free_inputs(lt_ctx *ctx, lt_model *m) {
    if (!m->host_inputs_block) return;
    if (m->be->host_register)
        (void)m->be->host_register(ctx, m->host_inputs, (m->lay.in_bytes + STAGE_PAGE - 1) & ~(STAGE_PAGE - 1), 0);
    lt_free(ctx, LT_DEVICE_CPU, m->host_inputs_block, m->host_inputs_bytes);
    m->host_inputs_block = m->host_inputs = NULL;
    m->host_inputs_bytes = 0;
}

static void free_run(lt_ctx *ctx, lt_model *m) {
    lt_model_release_offload(ctx, m); /* first: its copies may still touch the blocks */
    for (int c = LT_MEM_ACTIVATIONS; c < LT_MEM_CLASS_COUNT_; c++) {
        if (m->block[c]) lt_free(ctx, m->opt.device, m->block[c], m->block_bytes[c]);
        m->block[c] = NULL;
        m->block_bytes[c] = 0;
    }
    if (m->cp_ws) lt_free(ctx, m->opt.device, m->cp_ws, m->cp_ws_bytes);
    m->cp_ws = NULL;
    m->cp_ws_bytes = 0;
    lt_model_free_inputs(ctx, m);
    m->lay.in_bytes = 0;
    m->prepared = 0;
}

lt_cp_attention_params lt_model_cp_params(const lt_model *m, int64_t T_local) {
    lt_cp_attention_params p = {T_local * lt_comm_size(m->cp),
                                m->cfg.H,
                                m->cfg.Hkv,
                                m->cfg.D,
                                0,
                                m->run.attention,
                                m->lay.attn_bf16 ? LT_DTYPE_BF16 : LT_DTYPE_F32};
    return p;
}

/* The Ulysses workspace of a prepared context-parallel run, allocated with the run (the planner
 * prices the same lt_cp_ulysses_workspace_bytes). */
static lt_status cp_alloc(lt_ctx *ctx, lt_model *m) {
    if (m->cp_ws) lt_free(ctx, m->opt.device, m->cp_ws, m->cp_ws_bytes);
    m->cp_ws = NULL, m->cp_ws_bytes = 0;
    if (!m->cp || m->cp_kind != LT_CP_ULYSSES || !m->prepared) return LT_OK;
    lt_cp_attention_params p = lt_model_cp_params(m, m->run.T);
    size_t bytes = lt_cp_ulysses_workspace_bytes(&p, lt_comm_size(m->cp), m->opt.device, m->lay.threads);
    if (bytes == SIZE_MAX) {
        LT_TRY(lt_cp_ulysses_check(ctx, m->cp, &p));
        return lt_error(ctx, LT_ERR_OOM, "model: the context-parallel workspace at T = %lld overflows", (long long)p.T);
    }
    if (!(m->cp_ws = lt_alloc(ctx, m->opt.device, bytes, "context-parallel (Ulysses) workspace")))
        return lt_ctx_status(ctx);
    m->cp_ws_bytes = bytes;
    return LT_OK;
}

/* The attention every layer's forward and backward run, decided once. */
static void resolve_attn_path(lt_model *m) {
    if (!m->cp) m->attn_path = LT_ATTN_PATH_KERNEL;
    else m->attn_path = m->cp_kind == LT_CP_ULYSSES ? LT_ATTN_PATH_ULYSSES : LT_ATTN_PATH_RING;
}

/* The activation, transient and workspace blocks of lay. */
static lt_status alloc_blocks(lt_ctx *ctx, lt_model *m, const lt_layout *lay) {
    static const char *const what[LT_MEM_CLASS_COUNT_] =
        {"", "", "", "model activations", "model transients", "model workspace"};
    for (int c = LT_MEM_ACTIVATIONS; c < LT_MEM_CLASS_COUNT_; c++) {
        if (!lay->class_bytes[c]) continue;
        if (!(m->block[c] = lt_alloc(ctx, m->opt.device, lay->class_bytes[c], what[c]))) return lt_ctx_status(ctx);
        m->block_bytes[c] = lay->class_bytes[c];
    }
    return LT_OK;
}

/* A device run's host staging of the inputs piece, pinned, so the step's one upload is queued (and,
 * in a captured step, replayed) rather than staged by the driver. */
static lt_status alloc_staging(lt_ctx *ctx, lt_model *m, size_t in_bytes) {
    if (!in_bytes) return LT_OK;
    size_t pages = (in_bytes + STAGE_PAGE - 1) & ~(STAGE_PAGE - 1);
    m->host_inputs_bytes = pages + STAGE_PAGE;
    m->host_inputs_block = lt_calloc(ctx, LT_DEVICE_CPU, m->host_inputs_bytes, "model input staging");
    if (!m->host_inputs_block) return lt_ctx_status(ctx);
    m->host_inputs = (uint8_t *)(((uintptr_t)m->host_inputs_block + STAGE_PAGE - 1) & ~(uintptr_t)(STAGE_PAGE - 1));
    lt_status s = m->be->host_register ? m->be->host_register(ctx, m->host_inputs, pages, 1) : LT_OK;
    if (s != LT_OK) {
        lt_free(ctx, LT_DEVICE_CPU, m->host_inputs_block, m->host_inputs_bytes);
        m->host_inputs_block = m->host_inputs = NULL;
    }
    return s;
}

/* The host block of offloaded checkpoints (pinned on a device) and the backend's copy queue. */
static lt_status alloc_offload(lt_ctx *ctx, lt_model *m) {
    if (!m->lay.offload) return LT_OK;
    const char *hw = "offloaded checkpoints (host)";
    m->offload = m->opt.device == LT_DEVICE_CPU ? lt_alloc(ctx, LT_DEVICE_CPU, m->lay.offload_bytes, hw)
                                                : lt_alloc_pinned(ctx, m->lay.offload_bytes, hw);
    return m->offload ? m->be->xfer_open(ctx, &m->xfer) : lt_ctx_status(ctx);
}

lt_status lt_model_prepare(lt_ctx *ctx, lt_model *m, const lt_model_run_options *run_in) {
    lt_layout lay;
    free_run(ctx, m);
    lt_model_run_options run_dev = *run_in, *run = &run_dev;
    run_dev.device = m->opt.device;
    LT_TRY(lt_model_layout(ctx, &m->cfg, &m->lora, run, &lay));
    lt_status s = alloc_blocks(ctx, m, &lay);
    if (s == LT_OK) s = alloc_staging(ctx, m, lay.in_bytes);
    if (s != LT_OK) {
        free_run(ctx, m);
        return s;
    }
    /* Keep the weights/LoRA part of the layout from load, take the run part (free_run reads the
     * offload size from it from here on). */
    m->lay = lay;
    if ((s = alloc_offload(ctx, m)) != LT_OK) {
        free_run(ctx, m);
        return s;
    }
    m->run = *run;
    m->prepared = 1;
    if (lt_model_rope_depends_on_T(&m->cfg) && (s = lt_model_rope_refresh(ctx, m, run->T)) != LT_OK) {
        free_run(ctx, m);
        return s;
    }
    resolve_attn_path(m);
    if ((s = cp_alloc(ctx, m)) != LT_OK) free_run(ctx, m);
    return s;
}

lt_model_sizes lt_model_get_sizes(const lt_model *m) {
    lt_model_sizes s;
    memset(&s, 0, sizeof s);
    for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) {
        s.bytes[c] = m->block[c] ? lt_alloc_accounted_size(m->opt.device, m->block_bytes[c]) : 0;
        if (c == LT_MEM_WEIGHTS && m->opt.device == LT_DEVICE_CPU)
            s.bytes[c] += lt_alloc_accounted_size(LT_DEVICE_CPU, lt_model_meta_bytes(&m->cfg));
        s.total += s.bytes[c];
    }
    if (m->offload) { /* as lt_model_size_table counts it */
        s.offload_bytes = lt_alloc_accounted_size(LT_DEVICE_CPU, m->lay.offload_bytes);
        if (m->opt.device == LT_DEVICE_CPU) {
            s.bytes[LT_MEM_ACTIVATIONS] += s.offload_bytes;
            s.total += s.offload_bytes;
        }
    }
    s.n_lora_params = m->lay.n_lora;
    return s;
}

const lt_model_config *lt_model_get_config(const lt_model *m) { return &m->cfg; }
const lt_lora_options *lt_model_get_lora(const lt_model *m) { return &m->lora; }
lt_device lt_model_get_device(const lt_model *m) { return m->opt.device; }
const lt_layer_desc *lt_model_get_layer(const lt_model *m, int64_t l) {
    return l >= 0 && l < m->cfg.L ? &m->layers[l].desc : NULL;
}

float *lt_model_lora_params(lt_model *m, int64_t *n) {
    if (n) *n = m->lay.n_lora;
    return m->lora_params;
}

float *lt_model_lora_grads(lt_model *m, int64_t *n) {
    if (n) *n = m->lay.n_lora;
    return m->lora_grads;
}

lt_status lt_model_set_context_parallel(lt_ctx *ctx, lt_model *m, struct lt_comm *comm) {
    int world = lt_comm_size(comm), on = comm && (world > 1 || lt_cp_env_forced());
    if (on) {
        if (lt_comm_device(comm) != m->opt.device)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "model: context parallel over a %s communicator needs a model on "
                            "its device (host: MPI; CUDA: NCCL)",
                            lt_comm_backend_name(lt_comm_get_backend(comm)));
        lt_cp_attention_params p = {2 * world, m->cfg.H, m->cfg.Hkv, m->cfg.D, 0, LT_ATTENTION_AUTO, LT_DTYPE_F32};
        int kind = lt_cp_choose(&p, world, m->opt.device);
        if (kind < 0)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "model: context parallel on this device needs Ulysses attention, "
                            "which splits Hkv = %lld key/value heads over the %d ranks (not a multiple)",
                            (long long)m->cfg.Hkv, world);
        for (int64_t l = 0; l < m->cfg.L; l++) {
            const lt_layer_desc *d = &m->layers[l].desc;
            if (d->window != 0 || d->softcap != 0.0f)
                return lt_error(ctx, LT_ERR_UNSUPPORTED,
                                "model: context parallel attention has no sliding window or "
                                "softcap (layer %lld has %s%s)",
                                (long long)l, lt_attn_kind_name(d->attn), d->softcap != 0.0f ? " with a softcap" : "");
        }
        if (m->cfg.query_scale != 0 && (float)m->cfg.query_scale != 1.0f / sqrtf((float)m->cfg.D))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "model: context parallel attention scales scores by 1/sqrt(D); this model's query "
                            "scale is %g",
                            m->cfg.query_scale);
        m->cp_kind = kind;
    }
    m->cp = on ? comm : NULL;
    resolve_attn_path(m);
    return cp_alloc(ctx, m);
}

int lt_model_cp_kind(const lt_model *m) { return m->cp ? m->cp_kind : -1; }

void lt_model_set_grad_ready(lt_model *m, lt_model_grad_ready_fn fn, void *arg) {
    m->grad_ready = fn;
    m->grad_ready_arg = fn ? arg : NULL;
}

void lt_model_zero_grads(lt_model *m) {
    /* The zero op takes no thread count and reports nothing through the context. */
    if (m->lora_grads && m->lay.lora_bytes) m->be->zero(NULL, m->lora_grads, m->lay.lora_bytes);
}

static lt_status lora_range(lt_ctx *ctx, const lt_model *m, int64_t offset, int64_t n) {
    if (offset < 0 || n < 0 || offset > m->lay.n_lora || n > m->lay.n_lora - offset)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lora: range [%lld, %lld) outside the %lld parameters",
                        (long long)offset, (long long)(offset + n), (long long)m->lay.n_lora);
    return LT_OK;
}

lt_status lt_model_lora_get(lt_ctx *ctx, const lt_model *m, int grads, int64_t offset, int64_t n, float *dst) {
    LT_TRY(lora_range(ctx, m, offset, n));
    if (!n) return LT_OK;
    const float *src = (grads ? m->lora_grads : m->lora_params) + offset;
    return m->be->copy_to_host(ctx, dst, src, (size_t)n * sizeof(float));
}

lt_status lt_model_lora_set(lt_ctx *ctx, lt_model *m, int64_t offset, int64_t n, const float *src) {
    LT_TRY(lora_range(ctx, m, offset, n));
    if (!n) return LT_OK;
    return m->be->copy_to_device(ctx, m->lora_params + offset, src, (size_t)n * sizeof(float));
}

/* Adapted plain modules per LoRA layer: one per targeted projection, one per fused module (Phi-3). */
static int64_t plain_modules(const lt_model *m) {
    int64_t t = 0;
    for (int p = 0; p < LT_PROJ_COUNT_; p++)
        t += ((m->lora.targets >> p) & 1u) && lt_model_lora_owner(&m->cfg, (lt_proj)p) == (lt_proj)p;
    return t;
}

/* Expert stacks adapted in layer l (0, 1 or 2). */
static int64_t expert_modules(const lt_model *m, int64_t l) {
    if (!lt_model_layer_is_moe(&m->cfg, l)) return 0;
    return ((m->lora.targets & LT_LORA_EXPERTS_GATE_UP) != 0) + ((m->lora.targets & LT_LORA_EXPERTS_DOWN) != 0);
}

/* Per LoRA layer, in order: A then B of each plain module (projection order), then of the expert
 * stacks (gate_up, then down), as PEFT saves them. */
int64_t lt_model_lora_count(const lt_model *m) {
    int64_t t = 0, plain = plain_modules(m);
    for (int64_t l = m->l0; l < m->cfg.L; l++) t += 2 * (plain + expert_modules(m, l));
    return t;
}

static void expert_tensor(const lt_model *m, int64_t l, int w, int is_b, lt_lora_tensor *out) {
    const lt_model_config *c = &m->cfg;
    const lt_layer *L = &m->layers[l];
    int64_t E = c->n_experts, r = m->lora.rank, in = w ? c->moe_F : c->C, o = w ? c->C : 2 * c->moe_F;
    int64_t shape[2] = {is_b ? o * E * r : E * r, is_b ? 1 : in};
    float *v = is_b ? L->ex_b[w] : L->ex_a[w], *g = is_b ? L->ex_gb[w] : L->ex_ga[w];
    out->layer = l;
    out->proj = w ? LT_PROJ_DOWN : LT_PROJ_GATE;
    out->is_b = is_b;
    out->value = lt_tensor_view(v, LT_DTYPE_F32, m->opt.device, 2, shape);
    out->grad = lt_tensor_view(g, LT_DTYPE_F32, m->opt.device, 2, shape);
    out->offset = v - m->lora_params;
    out->experts = E;
    out->peft_rows = is_b ? o : r * E;
    out->peft_cols = is_b ? r * E : in;
    /* PEFT nests the first listed target parameter (gate_up) innermost, under base_layer */
    int nested = !w && (m->lora.targets & LT_LORA_EXPERTS_DOWN);
    snprintf(out->name, sizeof out->name, "base_model.model.model.layers.%lld.mlp.experts%s.lora_%c.weight",
             (long long)l, nested ? ".base_layer" : "", is_b ? 'B' : 'A');
}

lt_status lt_model_lora_tensor(lt_ctx *ctx, const lt_model *m, int64_t i, lt_lora_tensor *out) {
    int64_t n = lt_model_lora_count(m);
    if (i < 0 || i >= n)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lora tensor %lld outside [0, %lld)", (long long)i, (long long)n);
    memset(out, 0, sizeof *out);
    int64_t plain = plain_modules(m), l = m->l0, j = i;
    while (j >= 2 * (plain + expert_modules(m, l))) j -= 2 * (plain + expert_modules(m, l)), l++;
    int is_b = (int)(j % 2);
    if (j / 2 >= plain) { /* an expert stack: gate_up first when adapted */
        int w = j / 2 - plain == 1 || !(m->lora.targets & LT_LORA_EXPERTS_GATE_UP);
        expert_tensor(m, l, w, is_b, out);
        return LT_OK;
    }
    int p = 0, seen = -1;
    for (p = 0; p < LT_PROJ_COUNT_; p++)
        if (((m->lora.targets >> p) & 1u) && lt_model_lora_owner(&m->cfg, (lt_proj)p) == (lt_proj)p) {
            seen++;
            if (seen == j / 2) break;
        }
    int64_t o, in;
    lt_model_proj_shape(&m->cfg, (lt_proj)p, &o, &in);
    for (int q = p + 1; q < LT_PROJ_COUNT_; q++) { /* a fused module's B spans its members' rows */
        int64_t qo, qi;
        lt_model_proj_shape(&m->cfg, (lt_proj)q, &qo, &qi);
        if (q != p && lt_model_lora_owner(&m->cfg, (lt_proj)q) == (lt_proj)p) o += qo;
    }
    int64_t shape[2] = {is_b ? o : m->lora.rank, is_b ? m->lora.rank : in};
    const lt_layer *L = &m->layers[l];
    float *v = is_b ? L->lora_b[p] : L->lora_a[p], *g = is_b ? L->grad_b[p] : L->grad_a[p];
    out->layer = l;
    out->proj = (lt_proj)p;
    out->is_b = is_b;
    out->value = lt_tensor_view(v, LT_DTYPE_F32, m->opt.device, 2, shape);
    out->grad = lt_tensor_view(g, LT_DTYPE_F32, m->opt.device, 2, shape);
    out->offset = v - m->lora_params;
    out->peft_rows = shape[0];
    out->peft_cols = shape[1];
    snprintf(out->name, sizeof out->name, "base_model.model.model.layers.%lld.%s.%s.lora_%c.weight", (long long)l,
             p <= LT_PROJ_O ? "self_attn" : "mlp", lt_model_lora_module(&m->cfg, (lt_proj)p), is_b ? 'B' : 'A');
    return LT_OK;
}
