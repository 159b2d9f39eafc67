/* A device training step queued without host waits, and its CUDA graph: capture on the second
 * consecutive batch of one shape, replay while the shape holds, eager otherwise (step_graph.h).
 * The per-step values a replay needs travel as data: the batch through the model's pinned staging
 * block (its captured upload reads it afresh), the loss scale in that block, and AdamW's learning
 * rate and step as new parameters of the captured optimizer node. It does not decide the training
 * schedule and never allocates on the device. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/prof.h"
#include "longtune/alloc.h"
#include "longtune/log.h"
#include "train/step_graph.h"

/* The host values a captured step bakes into kernel arguments: the batch shape, with the packed
 * rows' sequence count (attention's plan depends on it). The offsets themselves, like tokens,
 * targets and positions, reach the kernels through the model's staged inputs. */
typedef struct shape_key {
    int64_t B, T, S;
    int valid;
} shape_key;

struct lt_step_graph {
    lt_model *m;
    const lt_backend *be;
    lt_step_optim o;
    int64_t B, T;
    int32_t *offs; /* the batch's offsets padded to a power-of-two S (B_max·(T_max+1) capacity) */
    size_t offs_bytes;
    shape_key prev, cap; /* the last step's shape; the captured graph's */
    lt_graph *graph;
    lt_step_graph_stats st;
};

static int key_equal(const shape_key *k, const lt_model_batch *b) {
    return k->valid && k->B == b->B && k->T == b->T && k->S == (b->seq_offsets ? b->S : 0);
}

static void key_set(shape_key *k, const lt_model_batch *b) {
    k->B = b->B, k->T = b->T, k->S = b->seq_offsets ? b->S : 0;
    k->valid = 1;
}

/* Packed rows hold a varying number of sequences; padding each row's offsets with empty ones (T
 * repeated) up to the next power of two keeps S -- and with it the captured step -- the same for
 * most batches of a run. The rows' tokens are unchanged; eager and replayed steps see the same
 * padded batch, so their results agree. */
static lt_model_batch padded(lt_step_graph *g, const lt_model_batch *b) {
    lt_model_batch p = *b;
    if (!b->seq_offsets || b->S < 1 || b->S > b->T || b->B > g->B || b->T > g->T) return p; /* the model refuses */
    int64_t S = 1;
    while (S < b->S) S *= 2;
    if (S > b->T) S = b->T;
    if (S == b->S) return p;
    for (int64_t r = 0; r < b->B; r++) {
        const int32_t *src = b->seq_offsets + r * (b->S + 1);
        int32_t *dst = g->offs + r * (S + 1);
        memcpy(dst, src, (size_t)(b->S + 1) * sizeof(int32_t));
        for (int64_t k = b->S + 1; k <= S; k++) dst[k] = src[b->S];
    }
    p.seq_offsets = g->offs;
    p.S = S;
    return p;
}

static void give_up(lt_step_graph *g, const char *why) {
    if (!g->st.enabled) return;
    g->st.enabled = 0;
    snprintf(g->st.why_off, sizeof g->st.why_off, "%s", why);
    LT_INFO("cuda graph: off for this run, steps run eagerly: %s", why);
}

lt_status lt_step_graph_init(lt_ctx *ctx, lt_model *m, const lt_step_optim *o, int64_t B, int64_t T, int enable,
                             lt_step_graph **out) {
    *out = NULL;
    if (lt_model_get_device(m) == LT_DEVICE_CPU)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "step graph: the model lives on the host (CPU steps never wait)");
    if (B <= 0 || T <= 0 || B > INT32_MAX / (T + 1))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "step graph: batch %lld x %lld out of range", (long long)B,
                        (long long)T);
    lt_step_graph *g = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *g, "step graph");
    if (!g) return lt_ctx_status(ctx);
    g->m = m;
    g->be = lt_backend_get(lt_model_get_device(m));
    g->o = *o;
    g->B = B, g->T = T;
    g->offs_bytes = (size_t)(B * (T + 1)) * sizeof(int32_t);
    g->offs = lt_alloc(ctx, LT_DEVICE_CPU, g->offs_bytes, "step graph padded offsets");
    if (!g->offs) {
        lt_status s = lt_ctx_status(ctx);
        lt_step_graph_free(ctx, g);
        return s;
    }
    g->st.enabled = 1;
    if (!enable) {
        g->st.enabled = 0;
        snprintf(g->st.why_off, sizeof g->st.why_off, "turned off (--cuda-graph off)");
    } else if (!g->be || !g->be->graph_begin) {
        give_up(g, "this backend has no graphs");
    } else if (lt_prof_active) {
        give_up(g, "the op profiler times every op with its own events and waits");
    } else if (lt_model_get_lora(m)->dropout > 0) {
        give_up(g, "LoRA dropout draws its masks from a per-step seed passed to the kernels by value");
    } else if (lt_model_get_config(m)->moe_aux_coef > 0) {
        give_up(g, "the MoE router's load-balancing loss reads its statistics back on the host mid-step");
    }
    *out = g;
    return LT_OK;
}

void lt_step_graph_free(lt_ctx *ctx, lt_step_graph *g) {
    if (!g) return;
    if (g->graph) g->be->graph_free(g->graph);
    if (g->offs) lt_free(ctx, LT_DEVICE_CPU, g->offs, g->offs_bytes);
    lt_free(ctx, LT_DEVICE_CPU, g, sizeof *g);
}

/* The step's device work in order, nothing waited for: what a capture records and an eager step
 * runs. */
static lt_status queue_step(lt_ctx *ctx, lt_step_graph *g, const lt_model_batch *b, float grad_scale,
                            const lt_adamw_params *hp, lt_model_result *res) {
    const lt_backend *be = g->be;
    be->zero(ctx, g->o.grads, (size_t)g->o.n * sizeof(float));
    lt_model_batch lb = *b;
    lb.defer_loss = 1;
    LT_TRY(lt_model_forward_backward(ctx, g->m, &lb, grad_scale, res, NULL));
    if (g->o.grad_clip > 0) {
        if (be->clip_norm) {
            be->clip_norm(ctx, g->o.grads, g->o.n, g->o.grad_clip);
        } else { /* a device backend without it waits for the norm, as the CPU path does */
            double norm = sqrt((double)be->sumsq(ctx, g->o.grads, g->o.n));
            if (norm > g->o.grad_clip) be->scale(ctx, g->o.grads, (float)(g->o.grad_clip / norm), g->o.n);
        }
    }
    be->adamw(ctx, g->o.params, g->o.grads, g->o.mom_m, g->o.mom_v, g->o.n, hp);
    return LT_OK;
}

/* Captures the step on b and launches it; on failure the step has not run and capture is off. */
static lt_status capture(lt_ctx *ctx, lt_step_graph *g, const lt_model_batch *b, float grad_scale,
                         const lt_adamw_params *hp, lt_model_result *res, int *ran) {
    *ran = 0;
    const lt_backend *be = g->be;
    lt_graph *graph = NULL;
    size_t used = lt_mem_get_stats(ctx, lt_model_get_device(g->m)).used_bytes;
    LT_TRY(be->graph_begin(ctx));
    lt_status qs = queue_step(ctx, g, b, grad_scale, hp, res);
    char why[200] = "";
    if (qs != LT_OK) snprintf(why, sizeof why, "%s", lt_ctx_error(ctx));
    lt_status es = be->graph_end(ctx, &graph);
    if (qs == LT_OK && es != LT_OK) snprintf(why, sizeof why, "%s", lt_ctx_error(ctx));
    if (qs == LT_OK && es == LT_OK && lt_mem_get_stats(ctx, lt_model_get_device(g->m)).used_bytes != used)
        snprintf(why, sizeof why, "the step allocated device memory while it was captured");
    if (why[0]) {
        if (graph) be->graph_free(graph);
        give_up(g, why);
        return LT_OK;
    }
    if (g->graph) be->graph_free(g->graph);
    g->graph = graph;
    key_set(&g->cap, b);
    g->st.captures++;
    if (g->st.captures == 1)
        LT_INFO("cuda graph: captured the step of %lld x %lld tokens; replaying it while the shape holds",
                (long long)b->B, (long long)b->T);
    LT_TRY(be->graph_launch(ctx, g->graph, hp));
    *ran = 1;
    return LT_OK;
}

lt_status lt_step_graph_run(lt_ctx *ctx, lt_step_graph *g, const lt_model_batch *bin, float grad_scale,
                            const lt_adamw_params *hp, lt_model_result *res) {
    lt_model_result r = {0, 0, 0};
    int ran = 0;
    if (bin->B > g->B || bin->T > g->T)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "step graph: batch %lld x %lld beyond %lld x %lld", (long long)bin->B,
                        (long long)bin->T, (long long)g->B, (long long)g->T);
    const lt_model_batch pb = padded(g, bin), *b = &pb;
    if (g->st.enabled && g->graph && key_equal(&g->cap, b)) {
        LT_TRY(lt_model_stage_batch(ctx, g->m, b, grad_scale, &r));
        LT_TRY(g->be->graph_launch(ctx, g->graph, hp));
        g->st.replays++;
        ran = 1;
    } else if (g->st.enabled && key_equal(&g->prev, b)) {
        /* A bad batch fails here, before the capture, as it would eagerly. */
        LT_TRY(lt_model_stage_batch(ctx, g->m, b, grad_scale, &r));
        LT_TRY(capture(ctx, g, b, grad_scale, hp, &r, &ran));
    }
    if (!ran) {
        LT_TRY(queue_step(ctx, g, b, grad_scale, hp, &r));
        g->st.eager++;
    }
    key_set(&g->prev, b);
    LT_TRY(lt_model_read_loss(ctx, g->m, &r));
    if (res) *res = r;
    return LT_OK;
}

lt_step_graph_stats lt_step_graph_get_stats(const lt_step_graph *g) { return g->st; }
