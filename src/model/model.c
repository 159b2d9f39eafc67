/* The one decoder: forward and backward of packed rows through the backend op table, LoRA on the
 * projections of the last K layers, gradient checkpointing by segments (checkpoints and attention's
 * tensors in the layout's saved dtype), position-wise work in row chunks, and the run memory
 * (allocated once by lt_model_prepare from the layout in layout.c). Loading lives in load.c. No
 * op is called directly and nothing is allocated inside a step. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/parallel.h"
#include "longtune/alloc.h"
#include "longtune/context_parallel.h"
#include "backend/prof.h"
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

static lt_cp_attention_params cp_params(const lt_model *m, int64_t T_local) {
    lt_cp_attention_params p = {T_local * lt_comm_size(m->cp), m->cfg.H, m->cfg.Hkv, m->cfg.D, 0, m->run.attention,
                                m->lay.attn_bf16 ? LT_DTYPE_BF16 : LT_DTYPE_F32};
    return p;
}

/* The Ulysses workspace of a prepared context-parallel run, allocated with the run (the planner
 * prices the same lt_cp_ulysses_workspace_bytes). */
static lt_status cp_alloc(lt_ctx *ctx, lt_model *m) {
    if (m->cp_ws) lt_free(ctx, m->opt.device, m->cp_ws, m->cp_ws_bytes);
    m->cp_ws = NULL, m->cp_ws_bytes = 0;
    if (!m->cp || m->cp_kind != LT_CP_ULYSSES || !m->prepared) return LT_OK;
    lt_cp_attention_params p = cp_params(m, m->run.T);
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

lt_status lt_model_prepare(lt_ctx *ctx, lt_model *m, const lt_model_run_options *run_in) {
    lt_layout lay;
    free_run(ctx, m);
    lt_model_run_options run_dev = *run_in, *run = &run_dev;
    run_dev.device = m->opt.device;
    LT_TRY(lt_model_layout(ctx, &m->cfg, &m->lora, run, &lay));
    static const char *const what[LT_MEM_CLASS_COUNT_] = {"", "", "", "model activations", "model transients",
                                                          "model workspace"};
    for (int c = LT_MEM_ACTIVATIONS; c < LT_MEM_CLASS_COUNT_; c++) {
        if (!lay.class_bytes[c]) continue;
        m->block[c] = lt_alloc(ctx, m->opt.device, lay.class_bytes[c], what[c]);
        if (!m->block[c]) {
            lt_status s = lt_ctx_status(ctx);
            free_run(ctx, m);
            return s;
        }
        m->block_bytes[c] = lay.class_bytes[c];
    }
    if (lay.in_bytes) {
        /* Pinned, so the step's one upload is queued (and, in a captured step, replayed) rather
         * than staged by the driver. */
        size_t pages = (lay.in_bytes + STAGE_PAGE - 1) & ~(STAGE_PAGE - 1);
        m->host_inputs_bytes = pages + STAGE_PAGE;
        m->host_inputs_block = lt_calloc(ctx, LT_DEVICE_CPU, m->host_inputs_bytes, "model input staging");
        lt_status s = m->host_inputs_block ? LT_OK : lt_ctx_status(ctx);
        if (s == LT_OK) {
            m->host_inputs = (uint8_t *)(((uintptr_t)m->host_inputs_block + STAGE_PAGE - 1) & ~(uintptr_t)(STAGE_PAGE - 1));
            if (m->be->host_register && (s = m->be->host_register(ctx, m->host_inputs, pages, 1)) != LT_OK) {
                lt_free(ctx, LT_DEVICE_CPU, m->host_inputs_block, m->host_inputs_bytes);
                m->host_inputs_block = m->host_inputs = NULL;
            }
        }
        if (s != LT_OK) {
            free_run(ctx, m);
            return s;
        }
    }
    /* Keep the weights/LoRA part of the layout from load, take the run part (free_run reads the
     * offload size from it from here on). */
    m->lay = lay;
    if (lay.offload) {
        const char *hw = "offloaded checkpoints (host)";
        m->offload = m->opt.device == LT_DEVICE_CPU ? lt_alloc(ctx, LT_DEVICE_CPU, lay.offload_bytes, hw)
                                                    : lt_alloc_pinned(ctx, lay.offload_bytes, hw);
        lt_status s = m->offload ? m->be->xfer_open(ctx, &m->xfer) : lt_ctx_status(ctx);
        if (s != LT_OK) {
            free_run(ctx, m);
            return s;
        }
    }
    m->run = *run;
    m->prepared = 1;
    lt_status s = cp_alloc(ctx, m);
    if (s != LT_OK) free_run(ctx, m);
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
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "model: context parallel over a %s communicator needs a model on "
                            "its device (host: MPI; CUDA: NCCL)", lt_comm_backend_name(lt_comm_get_backend(comm)));
        lt_cp_attention_params p = {2 * world, m->cfg.H, m->cfg.Hkv, m->cfg.D, 0, LT_ATTENTION_AUTO, LT_DTYPE_F32};
        int kind = lt_cp_choose(&p, world, m->opt.device);
        if (kind < 0)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "model: context parallel on this device needs Ulysses attention, "
                            "which splits Hkv = %lld key/value heads over the %d ranks (not a multiple)",
                            (long long)m->cfg.Hkv, world);
        m->cp_kind = kind;
    }
    m->cp = on ? comm : NULL;
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
        return lt_error(ctx, LT_ERR_INVALID_ARG, "lora: range [%lld, %lld) outside the %lld parameters", (long long)offset,
                        (long long)(offset + n), (long long)m->lay.n_lora);
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

int64_t lt_model_lora_count(const lt_model *m) {
    int64_t t = 0;
    for (int p = 0; p < LT_PROJ_COUNT_; p++) t += (m->lora.targets >> p) & 1u;
    return 2 * t * m->lora.num_layers;
}

lt_status lt_model_lora_tensor(lt_ctx *ctx, const lt_model *m, int64_t i, lt_lora_tensor *out) {
    int64_t n = lt_model_lora_count(m);
    if (i < 0 || i >= n) return lt_error(ctx, LT_ERR_INVALID_ARG, "lora tensor %lld outside [0, %lld)", (long long)i, (long long)n);
    memset(out, 0, sizeof *out);
    int64_t per_layer = n / m->lora.num_layers, j = i % per_layer;
    int64_t l = m->l0 + i / per_layer;
    int p = 0, seen = -1;
    for (p = 0; p < LT_PROJ_COUNT_; p++)
        if ((m->lora.targets >> p) & 1u) {
            seen++;
            if (seen == j / 2) break;
        }
    int is_b = (int)(j % 2);
    int64_t o, in;
    lt_model_proj_shape(&m->cfg, (lt_proj)p, &o, &in);
    int64_t shape[2] = {is_b ? o : m->lora.rank, is_b ? m->lora.rank : in};
    const lt_layer *L = &m->layers[l];
    float *v = is_b ? L->lora_b[p] : L->lora_a[p], *g = is_b ? L->grad_b[p] : L->grad_a[p];
    out->layer = l;
    out->proj = (lt_proj)p;
    out->is_b = is_b;
    out->value = lt_tensor_view(v, LT_DTYPE_F32, m->opt.device, 2, shape);
    out->grad = lt_tensor_view(g, LT_DTYPE_F32, m->opt.device, 2, shape);
    out->offset = v - m->lora_params;
    snprintf(out->name, sizeof out->name, "base_model.model.model.layers.%lld.%s.%s.lora_%c.weight", (long long)l,
             p <= LT_PROJ_O ? "self_attn" : "mlp", lt_proj_name((lt_proj)p), is_b ? 'B' : 'A');
    return LT_OK;
}

/* ---- one step ---- */

typedef struct step {
    lt_ctx *ctx;
    lt_model *m;
    const lt_backend *be;
    int64_t B, T, N;
    const int32_t *tokens, *targets; /* (N) in the model's memory */
    const int32_t *pos;
    const int32_t *seq_offsets;      /* host (the attention boundary validates them there) */
    const int32_t *seq_offsets_dev;  /* device runs: their copy in the inputs piece */
    int64_t n_tok;                   /* non-ignored targets */
    float dloss;                     /* upstream gradient of the summed loss */
    float *scalars;                  /* device runs: [0] loss, [1] dloss in device memory */
    int defer_loss;                  /* leave the loss on the device (lt_model_batch.defer_loss) */
    int64_t S;
    uint64_t drop_seed;  /* 0 bits mean dropout off (evaluation) */
    uint64_t drop_row0;  /* tokens before this batch's row 0 in the whole (data-parallel) batch */
    int train;
    /* Offload: the checkpoint each device slot holds (-1 none) and whether a copy into it is
     * still to be waited for. */
    int64_t slot_has[2];
    int slot_pending[2];
} step;

static uint8_t *blk(const step *s, lt_mem_class c, size_t off) { return s->m->block[c] + off; }
static float *wsf(const step *s, size_t off) { return (float *)blk(s, LT_MEM_WORKSPACE, off); }
/* The final norm's input (N, C) and output (N, C). */
static float *xf_of(const step *s) { return (float *)blk(s, s->m->lay.final_class, s->m->lay.xf); }
static float *hf_of(const step *s) { return (float *)blk(s, s->m->lay.final_class, s->m->lay.hf); }

/* Store j (0-based among LoRA layers; stores of one recompute segment are slots). */
static lt_store store_slot(const step *s, int64_t j) {
    const lt_layout *y = &s->m->lay;
    lt_store st;
    if (y->n_act_stores)
        lt_model_store_at(y, blk(s, LT_MEM_ACTIVATIONS, y->act_stores + (size_t)j * y->store_bytes), &st);
    else
        lt_model_store_at(y, blk(s, LT_MEM_TRANSIENTS, y->tr_stores + (size_t)j * y->store_bytes), &st);
    return st;
}

/* Checkpoint seg: an (N, C) layer input of the layout's saved dtype; under offload, its slot
 * (which holds it only between the ckpt_* calls below that say so). */
static void *ckpt(const step *s, int64_t seg) {
    if (s->m->lay.offload) seg %= 2;
    return blk(s, LT_MEM_ACTIVATIONS, s->m->lay.ckpt + (size_t)seg * s->m->lay.ckpt_stride);
}

void lt_model_release_offload(lt_ctx *ctx, lt_model *m) {
    /* The copy queue first: closing it waits for copies that may still touch the host block. */
    if (m->xfer) m->be->xfer_close(ctx, m->xfer);
    m->xfer = NULL;
    if (m->offload) {
        if (m->opt.device == LT_DEVICE_CPU)
            lt_free(ctx, LT_DEVICE_CPU, m->offload, m->lay.offload_bytes);
        else
            lt_free_pinned(ctx, m->offload, m->lay.offload_bytes);
    }
    m->offload = NULL;
}

/* ---- checkpoint offload: two device slots, the host block, and the order of the copies ----
 * Forward: checkpoint i goes into slot i % 2 once the copy out of its previous tenant, i - 2, is
 * done (ckpt_will_write), and is copied out as soon as its writer is queued (ckpt_written), so the
 * copy runs while the next layer computes. Backward: when checkpoint i is first needed
 * (ckpt_need), the other slot's tenant, i + 1, has been read by everything queued, so checkpoint
 * i - 1 is copied into it then, overlapping layer i's recompute and backward; i itself was
 * copied in the same way one layer earlier, and only the wait for it is queued now. The two
 * newest checkpoints never leave their slots. Without offload these are no-ops. */

static uint8_t *ckpt_host(const step *s, int64_t i) {
    LT_ASSERT(i >= 0 && i + 2 < s->m->lay.n_ckpt);
    return s->m->offload + (size_t)i * s->m->lay.ckpt_stride;
}

static size_t ckpt_bytes(const step *s) {
    return (size_t)(s->N * s->m->cfg.C) * (s->m->lay.saved_dtype == LT_DTYPE_BF16 ? 2 : 4);
}

static lt_status ckpt_will_write(const step *s, int64_t i) {
    if (!s->m->lay.offload || i < 2) return LT_OK;
    return s->be->xfer_wait(s->ctx, s->m->xfer, (int)(i % 2));
}

static lt_status ckpt_written(step *s, int64_t i) {
    if (!s->m->lay.offload) return LT_OK;
    s->slot_has[i % 2] = i;
    s->slot_pending[i % 2] = 0;
    if (i + 2 >= s->m->lay.n_ckpt) return LT_OK; /* stays in its slot through the backward */
    return s->be->xfer_copy(s->ctx, s->m->xfer, (int)(i % 2), ckpt_host(s, i), ckpt(s, i), ckpt_bytes(s));
}

static lt_status ckpt_fetch(step *s, int64_t i) {
    if (s->slot_has[i % 2] == i) return LT_OK;
    LT_TRY(s->be->xfer_copy(s->ctx, s->m->xfer, (int)(i % 2), ckpt(s, i), ckpt_host(s, i), ckpt_bytes(s)));
    s->slot_has[i % 2] = i;
    s->slot_pending[i % 2] = 1;
    return LT_OK;
}

static lt_status ckpt_need(step *s, int64_t i) {
    if (!s->m->lay.offload) return LT_OK;
    if (i > 0) LT_TRY(ckpt_fetch(s, i - 1));
    LT_TRY(ckpt_fetch(s, i)); /* already there but for the first use after an odd start */
    if (!s->slot_pending[i % 2]) return LT_OK;
    s->slot_pending[i % 2] = 0;
    return s->be->xfer_wait(s->ctx, s->m->xfer, (int)(i % 2));
}

/* Copies the f32 x (n elements) into `saved` (a checkpoint of the layout's saved dtype, rounded
 * when bf16), or back = 1: `saved` into x. */
static lt_status saved_copy(const step *s, void *saved, float *x, int64_t n, int back) {
    if (s->m->lay.saved_dtype == LT_DTYPE_F32)
        return back ? s->be->copy_to_device(s->ctx, x, saved, (size_t)n * 4)
                    : s->be->copy_to_device(s->ctx, saved, x, (size_t)n * 4);
    if (back)
        s->be->from_bf16(s->ctx, (const uint16_t *)saved, x, n);
    else
        s->be->to_bf16(s->ctx, x, (uint16_t *)saved, n);
    return LT_OK;
}

/* The projection groups that share an input. */
static const lt_proj QKV[3] = {LT_PROJ_Q, LT_PROJ_K, LT_PROJ_V}, GATE_UP[2] = {LT_PROJ_GATE, LT_PROJ_UP};
static const lt_proj O_PROJ = LT_PROJ_O, DOWN_PROJ = LT_PROJ_DOWN;

static uint64_t drop_offset(int64_t layer, int p) { return ((uint64_t)layer * LT_PROJ_COUNT_ + (uint64_t)p) << 40; }
/* Counter base of the mask on projection p's input (in features per token) from row r0 on: the
 * projection's stream plus this batch's place in the whole batch, so a data-parallel share (and
 * every chunk of rows) draws the same masks. */
static uint64_t drop_at(const step *s, int64_t l, int p, int64_t in, int64_t r0) {
    return drop_offset(l, p) + (s->drop_row0 + (uint64_t)r0) * (uint64_t)in;
}

/* Rows of the position-wise chunk starting at row r0 (the layout's chunk rows, fewer at the end). */
static int64_t chunk_rows(const step *s, int64_t r0) {
    int64_t ch = s->m->lay.chunk;
    return s->N - r0 < ch ? s->N - r0 : ch;
}

/* Row r0 of the (N, r) LoRA product of projection p in st (NULL when p carries no LoRA). */
static float *lu_at(const step *s, const lt_store *st, lt_proj p, int64_t r0) {
    return st->lu[p] ? st->lu[p] + r0 * s->m->lora.rank : NULL;
}

/* Over the n rows from row r0 (x, y, lu point at that row): y (n, out) = beta·y + x·Wᵀ (+ bias)
 * (+ s·(drop(x)·Aᵀ)·Bᵀ), saving lu = drop(x)·Aᵀ. beta = 1 adds the projection onto a residual
 * already in y. y = NULL computes only lu (a recompute that needs the saved LoRA product but not
 * the output). */
static void proj_fwd_mode(const step *s, int64_t l, lt_proj p, int64_t r0, int64_t n, const float *x, float *y,
                          float *lu, const float *bias, float beta, lt_matmul_mode mode) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    const lt_tensor *w = &L->w[p];
    int64_t out = w->shape[0], in = w->shape[1], r = m->lora.rank;
    if (y) s->be->matmul(s->ctx, mode, w, x, n, beta, y, wsf(s, m->lay.mm_ws));
    if (y && bias) s->be->add_bias(s->ctx, y, bias, n, out);
    if (!L->lora_a[p]) return;
    const float *src = x;
    if (s->train && m->lora.dropout > 0) {
        float *scr = wsf(s, m->lay.scratch);
        s->be->dropout(s->ctx, x, scr, n * in, m->lora.dropout, s->drop_seed, drop_at(s, l, p, in, r0));
        src = scr;
    }
    s->be->gemm(s->ctx, 0, 1, n, r, in, 1.0f, src, in, L->lora_a[p], in, 0.0f, lu, r);
    if (y) s->be->gemm(s->ctx, 0, 1, n, out, r, m->lora_scale, lu, r, L->lora_b[p], r, 1.0f, y, out);
}

/* The projections ps[0..G) of one input x over the n rows from row r0 (q, k, v; gate, up; or one
 * alone), each into y[g] as proj_fwd (beta, the layer's q/k/v biases; y = NULL: lu only), through
 * the backend's fused lora_fwd — or proj_fwd one by one under LoRA dropout, which masks x. */
static void group_fwd(const step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0, int64_t n,
                      const float *x, float *const *y, float beta) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    if (s->train && m->lora.dropout > 0) {
        for (int g = 0; g < G; g++) {
            const float *bias = ps[g] <= LT_PROJ_V ? L->bias[ps[g]] : NULL;
            proj_fwd_mode(s, l, ps[g], r0, n, x, y[g], lu_at(s, st, ps[g], r0), bias, beta,
                          g && y[g - 1] ? LT_MATMUL_NT_SAME_X : LT_MATMUL_NT);
        }
        return;
    }
    lt_lora_proj pp[3];
    memset(pp, 0, sizeof pp);
    for (int g = 0; g < G; g++) {
        lt_proj p = ps[g];
        pp[g].w = &L->w[p];
        pp[g].a = L->lora_a[p], pp[g].b = L->lora_b[p];
        pp[g].bias = p <= LT_PROJ_V ? L->bias[p] : NULL;
        pp[g].y = y[g];
        pp[g].lu = lu_at(s, st, p, r0);
    }
    s->be->lora_fwd(s->ctx, pp, G, x, n, m->lora.rank, m->lora_scale, beta, wsf(s, m->lay.mm_ws));
}

/* Over the n rows from row r0, given dy (n, out) of projection p with input x: accumulates LoRA
 * grads and adds the input gradient into dx (n, in) (beta: 0 overwrites with the base part
 * first, 1 accumulates). dx = NULL skips the input gradient (nobody below needs it). */
static void proj_bwd(const step *s, int64_t l, lt_proj p, int64_t r0, int64_t n, const float *x, const float *dy,
                     const float *lu, float *dx, float beta) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    const lt_tensor *w = &L->w[p];
    int64_t out = w->shape[0], in = w->shape[1], r = m->lora.rank;
    if (dx) s->be->matmul(s->ctx, LT_MATMUL_NN, w, dy, n, beta, dx, wsf(s, m->lay.mm_ws));
    if (!L->lora_a[p]) return;
    float sc = m->lora_scale, *dlu = wsf(s, m->lay.dlu), *scr = wsf(s, m->lay.scratch);
    int drop = m->lora.dropout > 0;
    uint64_t doff = drop_at(s, l, p, in, r0);
    /* dB += s·dyᵀ·lu ; dlu = s·dy·B ; dA += dluᵀ·drop(x) ; dx += drop'(dlu·A) */
    s->be->gemm(s->ctx, 1, 0, out, r, n, sc, dy, out, lu, r, 1.0f, L->grad_b[p], r);
    s->be->gemm(s->ctx, 0, 0, n, r, out, sc, dy, out, L->lora_b[p], r, 0.0f, dlu, r);
    const float *src = x;
    if (drop) {
        s->be->dropout(s->ctx, x, scr, n * in, m->lora.dropout, s->drop_seed, doff);
        src = scr;
    }
    s->be->gemm(s->ctx, 1, 0, r, in, n, 1.0f, dlu, r, src, in, 1.0f, L->grad_a[p], in);
    if (!dx) return;
    if (!drop) {
        s->be->gemm(s->ctx, 0, 0, n, in, r, 1.0f, dlu, r, L->lora_a[p], in, 1.0f, dx, in);
    } else {
        s->be->gemm(s->ctx, 0, 0, n, in, r, 1.0f, dlu, r, L->lora_a[p], in, 0.0f, scr, in);
        s->be->dropout(s->ctx, scr, scr, n * in, m->lora.dropout, s->drop_seed, doff);
        s->be->add(s->ctx, dx, scr, 1.0f, n * in);
    }
}

/* The backward of group_fwd: dy[g] for each projection; dx (n, in) = beta·dx + the group's input
 * gradient (NULL: skipped), LoRA grads accumulated. The backend's fused lora_bwd, or proj_bwd one
 * by one under LoRA dropout. */
static void group_bwd(const step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0, int64_t n,
                      const float *x, const float *const *dy, float *dx, float beta) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    if (m->lora.dropout > 0) {
        for (int g = 0; g < G; g++) proj_bwd(s, l, ps[g], r0, n, x, dy[g], lu_at(s, st, ps[g], r0), dx, g ? 1.0f : beta);
        return;
    }
    lt_lora_proj pp[3];
    memset(pp, 0, sizeof pp);
    for (int g = 0; g < G; g++) {
        lt_proj p = ps[g];
        pp[g].w = &L->w[p];
        pp[g].a = L->lora_a[p], pp[g].b = L->lora_b[p];
        pp[g].ga = L->grad_a[p], pp[g].gb = L->grad_b[p];
        pp[g].dy = dy[g];
        pp[g].lu = lu_at(s, st, p, r0);
    }
    s->be->lora_bwd(s->ctx, pp, G, x, n, m->lora.rank, m->lora_scale, dx, beta, wsf(s, m->lay.dlu),
                    wsf(s, m->lay.mm_ws));
}

/* Row r0 of a whole-batch tensor t (N, width) held in the layout's attention dtype (attention's
 * inputs, output and gradients, q_raw, k_raw, x_mid): bf16 under attn_bf16, else f32. */
static void *at_row(const step *s, void *t, int64_t r0, int64_t width) {
    return (uint8_t *)t + (size_t)(r0 * width) * (s->m->lay.attn_bf16 ? 2 : 4);
}

/* Rows [r0, r0 + n) of such a tensor as f32: in place for f32, widened into `buf` for bf16. */
static float *att_rows_f32(const step *s, void *t, int64_t r0, int64_t n, int64_t width, float *buf) {
    if (!s->m->lay.attn_bf16) return (float *)at_row(s, t, r0, width);
    s->be->from_bf16(s->ctx, (const uint16_t *)at_row(s, t, r0, width), buf, n * width);
    return buf;
}

/* Per-head norm (Qwen3) and RoPE of the q and k rows [r0, r0 + n): q, k (n rows) hold the
 * projections on entry (f32 rows of the stores or of the chunk buffer) and
 * qo, ko receive the result (may alias q, k). */
static void qk_finish(const step *s, const lt_layer *L, const lt_store *st, int64_t r0, int64_t n, float *q, float *k,
                      float *qo, float *ko) {
    const lt_model_config *c = &s->m->cfg;
    const lt_backend *be = s->be;
    if (c->qk_norm) {
        be->rmsnorm_fwd(s->ctx, q, L->q_norm, c->rms_eps, n * c->H, c->D, qo, st->rstd_q + r0 * c->H);
        be->rmsnorm_fwd(s->ctx, k, L->k_norm, c->rms_eps, n * c->Hkv, c->D, ko, st->rstd_k + r0 * c->Hkv);
    }
    be->rope(s->ctx, qo, s->pos + r0, s->m->inv_freq, n, c->H, c->D, 0);
    be->rope(s->ctx, ko, s->pos + r0, s->m->inv_freq, n, c->Hkv, c->D, 0);
}

/* The backward of qk_finish over rows [r0, r0 + n): dq, dk (n rows, f32) in place. The norm's
 * inputs are the stores' q_raw, k_raw rows, widened into buf (n, H·D + Hkv·D) when bf16. */
static void qk_finish_bwd(const step *s, const lt_layer *L, const lt_store *st, int64_t r0, int64_t n, float *dq,
                          float *dk, float *buf) {
    const lt_model_config *c = &s->m->cfg;
    const lt_backend *be = s->be;
    int64_t qd = c->H * c->D, kvd = c->Hkv * c->D;
    be->rope(s->ctx, dq, s->pos + r0, s->m->inv_freq, n, c->H, c->D, 1);
    be->rope(s->ctx, dk, s->pos + r0, s->m->inv_freq, n, c->Hkv, c->D, 1);
    if (!c->qk_norm) return;
    const float *qr = att_rows_f32(s, st->q_raw, r0, n, qd, buf);
    const float *kr = att_rows_f32(s, st->k_raw, r0, n, kvd, buf ? buf + n * qd : NULL);
    be->rmsnorm_bwd(s->ctx, dq, qr, L->q_norm, st->rstd_q + r0 * c->H, n * c->H, c->D, dq, NULL);
    be->rmsnorm_bwd(s->ctx, dk, kr, L->k_norm, st->rstd_k + r0 * c->Hkv, n * c->Hkv, c->D, dk, NULL);
}

static lt_attention_params attn_params(const step *s) {
    const lt_model_config *c = &s->m->cfg;
    lt_attention_params ap;
    memset(&ap, 0, sizeof ap);
    ap.B = s->B, ap.T = s->T, ap.H = c->H, ap.Hkv = c->Hkv, ap.D = c->D;
    ap.dtype = s->m->lay.attn_bf16 ? LT_DTYPE_BF16 : LT_DTYPE_F32;
    ap.device = s->m->opt.device;
    ap.impl = s->m->run.attention;
    ap.seq_offsets = s->seq_offsets;
    ap.seq_offsets_device = s->seq_offsets_dev;
    ap.S = s->S;
    return ap;
}

/* A layer's residual input or output (N, C): f32 rows, or a bf16 checkpoint read or written in
 * place (h). */
typedef struct resid {
    float *f;
    uint16_t *h;
} resid;

static resid resid_f32(float *f) {
    resid r = {f, NULL};
    return r;
}

/* Rows [r0, r0 + n) of x as f32: in place, or widened into buf. */
static const float *resid_rows(const step *s, resid x, int64_t r0, int64_t n, float *buf) {
    int64_t C = s->m->cfg.C;
    if (x.f) return x.f + r0 * C;
    s->be->from_bf16(s->ctx, x.h + r0 * C, buf, n * C);
    return buf;
}

/* Layer l: x_out = layer(x_in), filling st (whose x_in field is ignored: x_in is passed). An f32
 * x_out may alias x_in (a chunk of rows is read before the same rows are written, and no later
 * chunk reads them). The position-wise work runs a chunk of rows at a time through the chunk buffers;
 * only attention's tensors span the batch (in bf16 under attn_bf16: the q, k, v chunks are
 * normed, rotated and rounded into them). x_out = NULL is the recompute before the layer's own
 * backward, which needs the attention half's stores and x_mid but not the MLP: layer_bwd reruns
 * the MLP chunk by chunk. att_kept = 1: st->att and st->lse hold this layer's attention from the
 * first pass (kept with the checkpoints), so it is not rerun; with the layout's keep_qkv the whole
 * attention half is kept (x_mid included), and only the MLP runs, when x_out is wanted. */
static lt_status layer_fwd(const step *s, int64_t l, const lt_store *st, resid x_in, resid x_out, int att_kept) {
    lt_model *m = s->m;
    const lt_model_config *c = &m->cfg;
    const lt_layer *L = &m->layers[l];
    const lt_backend *be = s->be;
    const lt_layout *y = &m->lay;
    int64_t N = s->N, C = c->C, F = c->F, qd = c->H * c->D, kvd = c->Hkv * c->D;
    int ab = y->attn_bf16;
    float *h = wsf(s, y->h), *qc = ab ? wsf(s, y->qc) : NULL, *ac = ab ? wsf(s, y->ac) : NULL;
    float *xc = y->xc ? wsf(s, y->xc) : NULL;
    int half_kept = att_kept && y->keep_qkv;
    if (half_kept && !x_out.f && !x_out.h) return LT_OK;
    for (int64_t r0 = 0; !half_kept && r0 < N; r0 += y->chunk) {
        int64_t n = chunk_rows(s, r0);
        /* Projections into the stores' f32 pieces (q_raw, k_raw with the per-head norm, else q,
         * k; and v), or under attn_bf16 into the chunk buffer. */
        float *qp = ab ? qc : (c->qk_norm ? st->q_raw : st->q) + r0 * qd;
        float *kp = ab ? qc + n * qd : (c->qk_norm ? st->k_raw : st->k) + r0 * kvd;
        float *vp = ab ? qc + n * (qd + kvd) : st->v + r0 * kvd;
        be->rmsnorm_fwd(s->ctx, resid_rows(s, x_in, r0, n, xc), L->attn_norm, c->rms_eps, n, C, h, st->rstd1 + r0);
        float *qkv[3] = {qp, kp, vp};
        group_fwd(s, l, st, 3, QKV, r0, n, h, qkv, 0.0f);
        if (!ab) continue;
        if (c->qk_norm) { /* keep the norm's inputs (rounded) for its backward, then norm in place */
            be->to_bf16(s->ctx, qp, (uint16_t *)at_row(s, st->q_raw, r0, qd), n * qd);
            be->to_bf16(s->ctx, kp, (uint16_t *)at_row(s, st->k_raw, r0, kvd), n * kvd);
        }
        qk_finish(s, L, st, r0, n, qp, kp, qp, kp);
        be->to_bf16(s->ctx, qc, (uint16_t *)at_row(s, st->q, r0, qd), n * qd);
        be->to_bf16(s->ctx, qc + n * qd, (uint16_t *)at_row(s, st->k, r0, kvd), n * kvd);
        be->to_bf16(s->ctx, vp, (uint16_t *)at_row(s, st->v, r0, kvd), n * kvd);
    }
    if (!ab && !half_kept)
        qk_finish(s, L, st, 0, N, c->qk_norm ? st->q_raw : st->q, c->qk_norm ? st->k_raw : st->k, st->q, st->k);
    lt_attention_params ap = attn_params(s);
    lt_attention_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = st->q, aa.k = st->k, aa.v = st->v, aa.out = st->att, aa.lse = st->lse;
    aa.workspace = blk(s, LT_MEM_WORKSPACE, y->attn_ws);
    aa.workspace_size = y->attn_ws_bytes;
    if (att_kept) {
        /* A recompute whose first pass kept st->att and st->lse (bit-identical to a rerun). */
    } else if (m->cp) {
        lt_cp_attention_params cp = cp_params(m, s->T);
        if (m->cp_kind == LT_CP_ULYSSES)
            LT_TRY(lt_cp_ulysses_forward(s->ctx, m->cp, &cp, st->q, st->k, st->v, st->att, st->lse, m->cp_ws,
                                         m->cp_ws_bytes, m->lay.threads));
        else
            LT_TRY(lt_cp_attention_forward(s->ctx, m->cp, &cp, st->q, st->k, st->v, st->att, st->lse));
    } else {
        int ph = lt_prof_begin(m->opt.device, LT_PROF_ATTN_FWD);
        lt_status as = lt_attention_forward(s->ctx, &ap, &aa);
        lt_prof_end(ph);
        LT_TRY(as);
    }
    for (int64_t r0 = 0; r0 < N; r0 += y->chunk) {
        int64_t n = chunk_rows(s, r0);
        float *xm;
        if (half_kept) { /* x_mid kept from the first pass (rounded there under attn_bf16) */
            xm = att_rows_f32(s, st->x_mid, r0, n, C, ab ? wsf(s, y->mc) : NULL);
        } else { /* x_mid = x_in + o_proj(att) */
            xm = ab ? wsf(s, y->mc) : st->x_mid + r0 * C;
            float *att = att_rows_f32(s, st->att, r0, n, qd, ac);
            if (x_in.f)
                LT_TRY(be->copy_to_device(s->ctx, xm, x_in.f + r0 * C, (size_t)(n * C) * 4));
            else
                be->from_bf16(s->ctx, x_in.h + r0 * C, xm, n * C);
            group_fwd(s, l, st, 1, &O_PROJ, r0, n, att, &xm, 1.0f);
            if (ab) { /* keep x_mid rounded, and go on with the rounded values the backward will read */
                uint16_t *xm16 = (uint16_t *)at_row(s, st->x_mid, r0, C);
                be->to_bf16(s->ctx, xm, xm16, n * C);
                be->from_bf16(s->ctx, xm16, xm, n * C);
            }
            if (!x_out.f && !x_out.h) continue;
        }
        /* x_out = x_mid + down(swiglu(gate(h2), up(h2))), h2 = norm(x_mid) */
        be->rmsnorm_fwd(s->ctx, xm, L->mlp_norm, c->rms_eps, n, C, h, st->rstd2 + r0);
        float *g = st->g ? st->g + r0 * F : wsf(s, y->g), *u = st->u ? st->u + r0 * F : wsf(s, y->u);
        float *a = wsf(s, y->dg);
        float *gu[2] = {g, u};
        group_fwd(s, l, st, 2, GATE_UP, r0, n, h, gu, 0.0f);
        be->swiglu_fwd(s->ctx, g, u, n * F, a);
        float *xo = x_out.f ? x_out.f + r0 * C : xc;
        LT_TRY(be->copy_to_device(s->ctx, xo, xm, (size_t)(n * C) * 4));
        group_fwd(s, l, st, 1, &DOWN_PROJ, r0, n, a, &xo, 1.0f);
        if (!x_out.f) be->to_bf16(s->ctx, xo, x_out.h + r0 * C, n * C);
    }
    return LT_OK;
}

/* dx (N, C) holds ∂/∂x_out on entry and ∂/∂x_in on return. x_in is the layer's input. need_dx = 0
 * (the first LoRA layer: everything below it, the embedding included, is frozen) skips the
 * attention block's input gradient and leaves dx at ∂/∂x_mid. The MLP runs chunk by chunk: its
 * norm, gate and up projections (unless the store kept them) and SwiGLU are rerun from x_mid, then
 * differentiated, so nothing F-wide spans the batch. */
static lt_status layer_bwd(const step *s, int64_t l, const lt_store *st, resid x_in, float *dx, int need_dx) {
    lt_model *m = s->m;
    const lt_model_config *c = &m->cfg;
    const lt_layer *L = &m->layers[l];
    const lt_backend *be = s->be;
    const lt_layout *y = &m->lay;
    int64_t N = s->N, C = c->C, F = c->F, qd = c->H * c->D, kvd = c->Hkv * c->D;
    int ab = y->attn_bf16;
    float *h = wsf(s, y->h), *da = wsf(s, y->da), *dg = wsf(s, y->dg), *du = wsf(s, y->du), *dh = wsf(s, y->dh);
    float *qc = ab ? wsf(s, y->qc) : NULL, *ac = ab ? wsf(s, y->ac) : NULL, *xc = y->xc ? wsf(s, y->xc) : NULL;
    for (int64_t r0 = 0; r0 < N; r0 += y->chunk) {
        int64_t n = chunk_rows(s, r0);
        float *xm = att_rows_f32(s, st->x_mid, r0, n, C, ab ? wsf(s, y->mc) : NULL), *dxc = dx + r0 * C;
        be->rmsnorm_fwd(s->ctx, xm, L->mlp_norm, c->rms_eps, n, C, h, st->rstd2 + r0);
        float *g = st->g ? st->g + r0 * F : wsf(s, y->g), *u = st->u ? st->u + r0 * F : wsf(s, y->u);
        float *a = dg; /* the activation goes into dg's buffer, which swiglu_bwd then overwrites */
        if (!st->g) {
            float *gu[2] = {g, u};
            group_fwd(s, l, st, 2, GATE_UP, r0, n, h, gu, 0.0f);
        }
        be->swiglu_fwd(s->ctx, g, u, n * F, a);
        float *no_y = NULL;
        if (!st->g) group_fwd(s, l, st, 1, &DOWN_PROJ, r0, n, a, &no_y, 1.0f); /* its LoRA product */
        const float *dyc = dxc;
        group_bwd(s, l, st, 1, &DOWN_PROJ, r0, n, a, &dyc, da, 0.0f);
        be->swiglu_bwd(s->ctx, da, g, u, n * F, dg, du);
        const float *dgu[2] = {dg, du};
        group_bwd(s, l, st, 2, GATE_UP, r0, n, h, dgu, dh, 0.0f);
        be->rmsnorm_bwd(s->ctx, dh, xm, L->mlp_norm, st->rstd2 + r0, n, C, dh, NULL);
        be->add(s->ctx, dxc, dh, 1.0f, n * C); /* dx = ∂/∂x_mid on these rows */
    }
    /* Attention: x_mid = x_in + o(attn(rope(norm?(q(h1))), ...)), h1 = norm(x_in) */
    void *datt = wsf(s, y->datt), *dq = wsf(s, y->dq), *dk = wsf(s, y->dk), *dv = wsf(s, y->dv);
    for (int64_t r0 = 0; r0 < N; r0 += y->chunk) {
        int64_t n = chunk_rows(s, r0);
        float *att = att_rows_f32(s, st->att, r0, n, qd, ac), *dattc = ab ? qc : (float *)at_row(s, datt, r0, qd);
        const float *dyo = dx + r0 * C;
        group_bwd(s, l, st, 1, &O_PROJ, r0, n, att, &dyo, dattc, 0.0f);
        if (ab) be->to_bf16(s->ctx, dattc, (uint16_t *)at_row(s, datt, r0, qd), n * qd);
    }
    lt_attention_params ap = attn_params(s);
    lt_attention_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = st->q, aa.k = st->k, aa.v = st->v, aa.out = st->att, aa.lse = st->lse;
    aa.dout = datt, aa.dq = dq, aa.dk = dk, aa.dv = dv;
    aa.workspace = blk(s, LT_MEM_WORKSPACE, y->attn_ws);
    aa.workspace_size = y->attn_ws_bytes;
    if (m->cp) {
        lt_cp_attention_params cp = cp_params(m, s->T);
        if (m->cp_kind == LT_CP_ULYSSES)
            LT_TRY(lt_cp_ulysses_backward(s->ctx, m->cp, &cp, st->q, st->k, st->v, st->att, st->lse, datt, dq, dk, dv,
                                          m->cp_ws, m->cp_ws_bytes, m->lay.threads));
        else
            LT_TRY(lt_cp_attention_backward(s->ctx, m->cp, &cp, st->q, st->k, st->v, st->att, st->lse, datt, dq, dk,
                                            dv));
    } else {
        int ph = lt_prof_begin(m->opt.device, LT_PROF_ATTN_BWD);
        lt_status as = lt_attention_backward(s->ctx, &ap, &aa);
        lt_prof_end(ph);
        LT_TRY(as);
    }
    if (!ab) qk_finish_bwd(s, L, st, 0, N, dq, dk, NULL);
    float *dhx = need_dx ? dh : NULL;
    for (int64_t r0 = 0; r0 < N; r0 += y->chunk) {
        int64_t n = chunk_rows(s, r0);
        float *dqc = att_rows_f32(s, dq, r0, n, qd, qc), *dkc = att_rows_f32(s, dk, r0, n, kvd, ab ? qc + n * qd : NULL);
        float *dvc = att_rows_f32(s, dv, r0, n, kvd, ab ? qc + n * (qd + kvd) : NULL);
        if (ab) qk_finish_bwd(s, L, st, r0, n, dqc, dkc, ac);
        const float *xr = resid_rows(s, x_in, r0, n, xc);
        be->rmsnorm_fwd(s->ctx, xr, L->attn_norm, c->rms_eps, n, C, h, st->rstd1 + r0);
        const float *dqkv[3] = {dqc, dkc, dvc};
        group_bwd(s, l, st, 3, QKV, r0, n, h, dqkv, dhx, 0.0f);
        if (!need_dx) continue;
        be->rmsnorm_bwd(s->ctx, dh, xr, L->attn_norm, st->rstd1 + r0, n, C, dh, NULL);
        be->add(s->ctx, dx + r0 * C, dh, 1.0f, n * C);
    }
    return LT_OK;
}

/* Validates the batch on the host and makes its inputs visible to the backend: on the host the
 * caller's arrays are read in place; a device run stages tokens, targets, positions and dloss
 * into one host block laid out as the device's inputs piece and copies it in with one transfer. */
static lt_status check_batch(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, step *s, int train, float grad_scale,
                             int upload) {
    if (!m->prepared) return lt_error(ctx, LT_ERR_INVALID_ARG, "model: lt_model_prepare was not called");
    if (train && m->run.forward_only)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: prepared forward_only; backward needs a training prepare");
    if (!b || !b->tokens || b->B <= 0 || b->T <= 0 || b->B > m->run.B || b->T > m->run.T || b->B * b->T > m->run.B * m->run.T)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: batch (%lld, %lld) exceeds the prepared (%lld, %lld)",
                        b ? (long long)b->B : 0LL, b ? (long long)b->T : 0LL, (long long)m->run.B, (long long)m->run.T);
    if (lt_parallel_threads(lt_ctx_threads(ctx)) > lt_parallel_threads(m->lay.threads))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: context runs %d threads, workspaces were sized for %d",
                        lt_parallel_threads(lt_ctx_threads(ctx)), lt_parallel_threads(m->lay.threads));
    memset(s, 0, sizeof *s);
    s->ctx = ctx, s->m = m, s->be = m->be;
    s->B = b->B, s->T = b->T, s->N = b->B * b->T;
    s->seq_offsets = b->seq_offsets, s->S = b->seq_offsets ? b->S : 0;
    if (b->seq_offsets && (b->S < 1 || b->S > b->T))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: S = %lld sequences per row is outside 1..T = %lld",
                        (long long)b->S, (long long)b->T);
    s->train = train;
    s->drop_seed = m->lora.seed ^ ((b->step + 1) * 0x9e3779b97f4a7c15ULL);
    if (b->first_row < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: negative first_row %lld", (long long)b->first_row);
    s->drop_row0 = (uint64_t)(b->first_row * b->T);
    if (m->cp && m->cp_kind == LT_CP_RING && m->lay.attn_bf16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "model: context parallel ring attention takes f32 tensors; prepare "
                        "with saved_bf16 = -1");
    if (m->cp && (b->B != 1 || b->seq_offsets))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "model: context parallel steps take one row (B = 1) without seq_offsets");
    for (int64_t i = 0; i < s->N; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.V)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "model: token %d at position %lld is outside [0, %lld)",
                            (int)b->tokens[i], (long long)i, (long long)m->cfg.V);
    const lt_layout *y = &m->lay;
    uint8_t *stage = m->host_inputs;
    int32_t *pos = stage ? (int32_t *)(stage + y->in_pos) : (int32_t *)blk(s, LT_MEM_TRANSIENTS, y->pos);
    for (int64_t i = 0; i < s->N; i++) {
        int32_t p = b->positions ? b->positions[i] : (int32_t)(i % b->T);
        if (p < 0) return lt_error(ctx, LT_ERR_INVALID_ARG, "model: negative position %d at %lld", (int)p, (long long)i);
        pos[i] = p;
    }
    s->pos = pos;
    s->tokens = b->tokens;
    s->targets = b->targets;
    s->defer_loss = b->defer_loss;
    /* Targets are checked here, on the host, before the upload: the loss kernels then need no
     * check of their own on the device (which would wait for it). */
    if (b->targets)
        for (int64_t i = 0; i < s->N; i++) {
            int32_t t = b->targets[i];
            if (t == LT_IGNORE_INDEX) continue;
            if (t < 0 || t >= m->cfg.V)
                return lt_error(ctx, LT_ERR_INVALID_ARG, "model: target %d at position %lld is outside [0, %lld) "
                                "and is not the ignore index %d", (int)t, (long long)i, (long long)m->cfg.V,
                                LT_IGNORE_INDEX);
            s->n_tok++;
        }
    s->dloss = grad_scale != 0 ? grad_scale : (s->n_tok ? 1.0f / (float)s->n_tok : 0.0f);
    if (!stage) return LT_OK;
    size_t nb = (size_t)s->N * sizeof(int32_t);
    memcpy(stage + y->in_tokens, b->tokens, nb);
    if (b->targets) memcpy(stage + y->in_targets, b->targets, nb);
    float scal[4] = {0.0f, s->dloss, 0.0f, 0.0f};
    memcpy(stage + y->in_scalars, scal, sizeof scal);
    if (s->seq_offsets) memcpy(stage + y->in_offs, s->seq_offsets, (size_t)(s->B * (s->S + 1)) * sizeof(int32_t));
    uint8_t *dev = blk(s, LT_MEM_TRANSIENTS, y->inputs);
    if (upload) LT_TRY(m->be->copy_to_device(ctx, dev, stage, y->in_bytes));
    s->tokens = (const int32_t *)(dev + y->in_tokens);
    s->targets = b->targets ? (const int32_t *)(dev + y->in_targets) : NULL;
    s->pos = (const int32_t *)(dev + y->in_pos);
    s->scalars = (float *)(dev + y->in_scalars);
    if (s->seq_offsets) s->seq_offsets_dev = (const int32_t *)(dev + y->in_offs);
    return LT_OK;
}

/* Device runs: the loss (and per-token losses) come back to the host once, after the whole step
 * is queued. The one read inside a step. */
static lt_status read_loss(const step *s, lt_model_result *res, float *token_loss) {
    if (!s->scalars || s->defer_loss) return LT_OK;
    float loss = 0;
    LT_TRY(s->be->copy_to_host(s->ctx, &loss, s->scalars, sizeof loss));
    res->loss_sum = loss;
    if (token_loss)
        LT_TRY(s->be->copy_to_host(s->ctx, token_loss, blk(s, LT_MEM_TRANSIENTS, s->m->lay.tloss),
                                   (size_t)s->N * sizeof(float)));
    return LT_OK;
}

/* Embedding and the frozen layers below the first LoRA layer, into `out` (N, C), in place (the
 * layers take x_out = x_in). The LoRA-free layers use store slot 0 as scratch; `upto` is the
 * first layer not run. */
static lt_status run_plain(const step *s, int64_t upto, float *out) {
    lt_model *m = s->m;
    s->be->embedding(s->ctx, &m->embed, s->tokens, s->N, out);
    lt_store st = store_slot(s, 0);
    for (int64_t l = 0; l < upto; l++) LT_TRY(layer_fwd(s, l, &st, resid_f32(out), resid_f32(out), 0));
    return LT_OK;
}

static lt_status final_loss(const step *s, const lt_model_batch *b, int backward, float grad_scale,
                            lt_model_result *res, float *token_loss) {
    lt_model *m = s->m;
    const lt_model_config *c = &m->cfg;
    const lt_layout *y = &m->lay;
    float *xf = xf_of(s), *hf = hf_of(s);
    float *rstd = (float *)blk(s, LT_MEM_TRANSIENTS, y->rstd_f);
    s->be->rmsnorm_fwd(s->ctx, xf, m->final_norm, c->rms_eps, s->N, c->C, hf, rstd);
    if (!b->targets) return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: batch has no targets");
    int64_t n_tok = s->n_tok;
    lt_lce_options lo;
    memset(&lo, 0, sizeof lo);
    lo.impl = m->run.loss;
    lo.reduction = LT_REDUCTION_SUM;
    float loss = 0;
    int64_t hs[2] = {s->N, c->C};
    lt_lce_args la;
    memset(&la, 0, sizeof la);
    la.h = lt_tensor_view(hf, LT_DTYPE_F32, m->opt.device, 2, hs);
    la.w = m->head;
    la.targets = s->targets;
    la.loss = s->scalars ? s->scalars : &loss; /* a device loss is read back by read_loss */
    la.lse = (float *)blk(s, LT_MEM_TRANSIENTS, y->lse_f);
    la.token_loss = s->scalars && token_loss ? (float *)blk(s, LT_MEM_TRANSIENTS, y->tloss) : token_loss;
    la.workspace = blk(s, LT_MEM_WORKSPACE, y->lce_ws);
    la.targets_checked = 1; /* check_batch did, on the host */
    res->n_tokens = n_tok;
    if (!backward) {
        LT_TRY(lt_lce_forward(s->ctx, &lo, &la));
        res->loss_sum = loss;
        return LT_OK;
    }
    /* Training: the upstream gradient is known before the loss, so loss and grad h come from one
     * call (the fused loss makes the logits once: two GEMMs instead of three). */
    (void)grad_scale; /* s->dloss, which check_batch derived from it (and staged on a device) */
    float dloss = s->dloss;
    /* ∂/∂h goes into dx, which the final norm's backward then turns into ∂/∂x in place. */
    float *dx = wsf(s, y->dx);
    lt_tensor dht = lt_tensor_view(dx, LT_DTYPE_F32, m->opt.device, 2, hs);
    la.dloss = s->scalars ? s->scalars + 1 : &dloss;
    la.dh = &dht;
    int ph = lt_prof_begin(m->opt.device, LT_PROF_LCE);
    lt_status ls = lt_lce_forward_backward(s->ctx, &lo, &la);
    lt_prof_end(ph);
    LT_TRY(ls);
    res->loss_sum = loss;
    s->be->rmsnorm_bwd(s->ctx, dx, xf, m->final_norm, rstd, s->N, c->C, dx, NULL);
    return LT_OK;
}

/* LoRA layer j's residual input: checkpoint j under resid_ckpt, else its slot's x_in (for the first
 * layer of a segment, a copy of the segment's checkpoint). */
static resid lora_in(const step *s, int64_t j, const lt_store *st) {
    const lt_layout *y = &s->m->lay;
    if (!y->resid_ckpt) return resid_f32(st->x_in);
    resid r = {NULL, NULL};
    if (y->saved_dtype == LT_DTYPE_BF16)
        r.h = (uint16_t *)ckpt(s, j);
    else
        r.f = (float *)ckpt(s, j);
    return r;
}

/* Its output: xf for the last LoRA layer, else the next layer's input (the next slot's x_in, in
 * place when one slot serves the segment). */
static resid lora_out(const step *s, int64_t j) {
    const lt_layout *y = &s->m->lay;
    if (j + 1 == s->m->lora.num_layers) return resid_f32(xf_of(s));
    lt_store nx = store_slot(s, y->n_ckpt ? (j + 1) % y->n_tr_stores : j + 1);
    return lora_in(s, j + 1, &nx);
}

/* The store of LoRA layer j; with kept attention its att and lse point at the layer's kept ones,
 * and with kept q/k/v the rest of its attention half too. */
static lt_store slot_of(const step *s, int64_t j) {
    const lt_layout *y = &s->m->lay;
    lt_store st = store_slot(s, y->n_ckpt ? j % y->n_tr_stores : j);
    if (y->keep_attn) {
        st.att = (float *)blk(s, LT_MEM_ACTIVATIONS, y->keep_att + (size_t)j * y->att_stride);
        st.lse = (float *)blk(s, LT_MEM_ACTIVATIONS, y->keep_lse + (size_t)j * y->lse_stride);
    }
    if (y->keep_qkv) lt_model_kept_at(y, blk(s, LT_MEM_ACTIVATIONS, y->keep_store + (size_t)j * y->kept_stride), &st);
    return st;
}

lt_status lt_model_forward_backward(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float grad_scale,
                                    lt_model_result *res, float *token_loss) {
    step s;
    lt_model_result r = {0, 0};
    LT_TRY(check_batch(ctx, m, b, &s, 1, grad_scale, 1));
    const lt_layout *y = &m->lay;
    int64_t K = m->lora.num_layers, l0 = m->l0, NC = s.N * m->cfg.C;
    int64_t k = y->n_ckpt ? y->n_tr_stores : K;
    const lt_device dev = m->opt.device;
    lt_prof_set_phase(dev, LT_PROF_FORWARD);
    s.slot_has[0] = s.slot_has[1] = -1;
    lt_store st = slot_of(&s, 0);
    if (y->resid_ckpt) { /* the embedding and frozen layers run on xf, then become checkpoint 0 */
        LT_TRY(run_plain(&s, l0, xf_of(&s)));
        LT_TRY(ckpt_will_write(&s, 0));
        LT_TRY(saved_copy(&s, ckpt(&s, 0), xf_of(&s), NC, 0));
        LT_TRY(ckpt_written(&s, 0));
    } else {
        LT_TRY(run_plain(&s, l0, st.x_in));
    }
    for (int64_t j = 0; j < K; j++) {
        st = slot_of(&s, j);
        if (y->n_ckpt && !y->resid_ckpt && j % k == 0) {
            LT_TRY(ckpt_will_write(&s, j / k));
            LT_TRY(saved_copy(&s, ckpt(&s, j / k), st.x_in, NC, 0));
            LT_TRY(ckpt_written(&s, j / k));
        }
        /* under resid_ckpt the layer writes checkpoint j + 1 (xf after the last layer) */
        int writes = y->resid_ckpt && j + 1 < K;
        if (writes) LT_TRY(ckpt_will_write(&s, j + 1));
        LT_TRY(layer_fwd(&s, l0 + j, &st, lora_in(&s, j, &st), lora_out(&s, j), 0));
        if (writes) LT_TRY(ckpt_written(&s, j + 1));
    }
    lt_prof_set_phase(dev, LT_PROF_LOSS);
    LT_TRY(final_loss(&s, b, 1, grad_scale, &r, token_loss));
    float *dx = wsf(&s, y->dx);
    int64_t last_seg = (K - 1) / k;
    for (int64_t j = K - 1; j >= 0; j--) {
        int64_t seg = j / k;
        /* Checkpoint j is layer j's input under resid_ckpt, read by its recompute and backward. */
        if (y->resid_ckpt) LT_TRY(ckpt_need(&s, j));
        if (y->n_ckpt && seg != last_seg && j % k == k - 1) {
            /* Entering an earlier segment from the top: recompute its stores from its checkpoint. */
            lt_prof_set_phase(dev, LT_PROF_RECOMPUTE);
            st = slot_of(&s, seg * k);
            if (!y->resid_ckpt) {
                LT_TRY(ckpt_need(&s, seg));
                LT_TRY(saved_copy(&s, ckpt(&s, seg), st.x_in, NC, 1));
            }
            for (int64_t i = seg * k; i <= j; i++) {
                st = slot_of(&s, i);
                resid out = i == j ? resid_f32(NULL) : lora_out(&s, i); /* the last output is not needed */
                LT_TRY(layer_fwd(&s, l0 + i, &st, lora_in(&s, i, &st), out, y->keep_attn));
            }
        }
        lt_prof_set_phase(dev, LT_PROF_BACKWARD);
        st = slot_of(&s, j);
        LT_TRY(layer_bwd(&s, l0 + j, &st, lora_in(&s, j, &st), dx, j > 0));
        /* LoRA layers hold equal, consecutive slices of the flat buffer (load.c's init order). */
        if (m->grad_ready) LT_TRY(m->grad_ready(m->grad_ready_arg, j * (y->n_lora / K), y->n_lora / K));
    }
    lt_prof_set_phase(dev, LT_PROF_OTHER);
    LT_TRY(read_loss(&s, &r, token_loss));
    if (res) *res = r;
    return LT_OK;
}

lt_status lt_model_stage_batch(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float grad_scale,
                               lt_model_result *res) {
    if (!m->host_inputs)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: staging a batch needs a prepared device model");
    step s;
    LT_TRY(check_batch(ctx, m, b, &s, 1, grad_scale, 0));
    res->loss_sum = 0;
    res->n_tokens = s.n_tok;
    return LT_OK;
}

lt_status lt_model_read_loss(lt_ctx *ctx, lt_model *m, lt_model_result *res) {
    if (!m->host_inputs)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: the loss stays on the device only for a prepared device model");
    float loss = 0;
    LT_TRY(m->be->copy_to_host(ctx, &loss, m->block[LT_MEM_TRANSIENTS] + m->lay.inputs + m->lay.in_scalars, sizeof loss));
    res->loss_sum = loss;
    return LT_OK;
}

static lt_status forward_all(step *s) {
    lt_model *m = s->m;
    return run_plain(s, m->cfg.L, xf_of(s));
}

lt_status lt_model_forward(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, lt_model_result *res, float *token_loss) {
    step s;
    lt_model_result r = {0, 0};
    LT_TRY(check_batch(ctx, m, b, &s, 0, 0.0f, 1));
    LT_TRY(forward_all(&s));
    LT_TRY(final_loss(&s, b, 0, 0, &r, token_loss));
    LT_TRY(read_loss(&s, &r, token_loss));
    if (res) *res = r;
    return LT_OK;
}

static lt_status logits_rows(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits, int last_only) {
    step s;
    LT_TRY(check_batch(ctx, m, b, &s, 0, 0.0f, 1));
    LT_TRY(forward_all(&s));
    const lt_model_config *c = &m->cfg;
    float *xf = xf_of(&s), *hf = hf_of(&s);
    float *rstd = (float *)blk(&s, LT_MEM_TRANSIENTS, m->lay.rstd_f);
    m->be->rmsnorm_fwd(ctx, xf, m->final_norm, c->rms_eps, s.N, c->C, hf, rstd);
    /* A device model writes the logits into a device buffer of this call's own (tests and
     * generation, not the training step), then copies them out. */
    int64_t rows = last_only ? s.B : s.N;
    size_t bytes = (size_t)rows * (size_t)c->V * sizeof(float);
    float *out = logits;
    if (m->opt.device != LT_DEVICE_CPU && !(out = lt_alloc(ctx, m->opt.device, bytes, "logits"))) return lt_ctx_status(ctx);
    if (!last_only)
        m->be->matmul(ctx, LT_MATMUL_NT, &m->head, hf, s.N, 0.0f, out, wsf(&s, m->lay.mm_ws));
    else
        for (int64_t r = 0; r < s.B; r++)
            m->be->matmul(ctx, LT_MATMUL_NT, &m->head, hf + ((r + 1) * s.T - 1) * c->C, 1, 0.0f, out + r * c->V,
                          wsf(&s, m->lay.mm_ws));
    if (out == logits) return LT_OK;
    lt_status st = m->be->copy_to_host(ctx, logits, out, bytes);
    lt_free(ctx, m->opt.device, out, bytes);
    return st;
}

lt_status lt_model_logits(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits) {
    return logits_rows(ctx, m, b, logits, 0);
}

lt_status lt_model_logits_last(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits) {
    return logits_rows(ctx, m, b, logits, 1);
}
