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
 * rows' sequence count (attention's plan depends on it), and for an MoE model with the router's
 * load-balancing loss each row's end of real tokens (the routing ops' calls split there, padding
 * staying out of the statistics). The offsets themselves, like tokens, targets, positions and the
 * loss's scales, reach the kernels through the model's staged inputs. */
typedef struct shape_key {
    int64_t B, T, S;
    int valid;
    int32_t *ends; /* (B rows of the graph's capacity) when the model has the aux loss, else NULL */
} shape_key;

struct lt_step_graph {
    lt_model *m;
    const lt_backend *be;
    lt_step_optim o;
    int64_t B, T;
    int32_t *offs; /* the batch's offsets padded to a power-of-two S (B_max·(T_max+1) capacity) */
    size_t offs_bytes, ends_bytes;
    shape_key prev, cap; /* the last step's shape; the captured graph's */
    lt_graph *graph;
    lt_step_graph_stats st;
    double *sumsq;    /* with clip_norm: the gradients' Σ g², pinned, written by the step's own copy */
    double grad_norm; /* the last step's (lt_step_graph_grad_norm) */
};

/* Row r's end of real tokens as the model reads it (T without real_seqs; -1 for a count the model
 * refuses). */
static int32_t real_end(const lt_model_batch *b, int64_t r) {
    if (!b->real_seqs || !b->seq_offsets) return (int32_t)b->T;
    int32_t n = b->real_seqs[r];
    return n < 0 || n > b->S ? -1 : b->seq_offsets[r * (b->S + 1) + n];
}

static int key_equal(const shape_key *k, const lt_model_batch *b) {
    if (!(k->valid && k->B == b->B && k->T == b->T && k->S == (b->seq_offsets ? b->S : 0))) return 0;
    if (k->ends)
        for (int64_t r = 0; r < b->B; r++)
            if (k->ends[r] != real_end(b, r)) return 0;
    return 1;
}

static void key_set(shape_key *k, const lt_model_batch *b) {
    k->B = b->B, k->T = b->T, k->S = b->seq_offsets ? b->S : 0;
    if (k->ends)
        for (int64_t r = 0; r < b->B; r++) k->ends[r] = real_end(b, r);
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
    if (g->offs && lt_model_get_config(m)->moe_aux_coef > 0) {
        g->ends_bytes = (size_t)B * sizeof(int32_t);
        g->prev.ends = lt_alloc(ctx, LT_DEVICE_CPU, g->ends_bytes, "step graph real-token ends");
        g->cap.ends = g->prev.ends ? lt_alloc(ctx, LT_DEVICE_CPU, g->ends_bytes, "step graph real-token ends") : NULL;
        if (!g->cap.ends) {
            lt_status s = lt_ctx_status(ctx);
            lt_step_graph_free(ctx, g);
            return s;
        }
    }
    if (g->offs && g->be && g->be->clip_norm)
        g->sumsq = lt_alloc_pinned(ctx, sizeof *g->sumsq, "step graph gradient sum of squares");
    if (!g->offs || (g->be && g->be->clip_norm && !g->sumsq)) {
        lt_status s = lt_ctx_status(ctx);
        lt_step_graph_free(ctx, g);
        return s;
    }
    g->grad_norm = NAN;
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
    }
    *out = g;
    return LT_OK;
}

void lt_step_graph_free(lt_ctx *ctx, lt_step_graph *g) {
    if (!g) return;
    if (g->graph) g->be->graph_free(g->graph);
    if (g->offs) lt_free(ctx, LT_DEVICE_CPU, g->offs, g->offs_bytes);
    if (g->prev.ends) lt_free(ctx, LT_DEVICE_CPU, g->prev.ends, g->ends_bytes);
    if (g->cap.ends) lt_free(ctx, LT_DEVICE_CPU, g->cap.ends, g->ends_bytes);
    if (g->sumsq) lt_free_pinned(ctx, g->sumsq, sizeof *g->sumsq);
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
    if (be->clip_norm) { /* the norm measured (and clipped to) on the device, its copy read with the loss */
        be->clip_norm(ctx, g->o.grads, g->o.n, g->o.grad_clip > 0 ? g->o.grad_clip : INFINITY, g->sumsq);
    } else if (g->o.grad_clip > 0) { /* a device backend without it waits for the norm, as the CPU path does */
        double norm = sqrt((double)be->sumsq(ctx, g->o.grads, g->o.n));
        if (norm > g->o.grad_clip) be->scale(ctx, g->o.grads, (float)(g->o.grad_clip / norm), g->o.n);
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
    LT_TRY(lt_model_read_loss(ctx, g->m, &r)); /* the step's one wait; it also lands *g->sumsq */
    g->grad_norm = g->sumsq ? sqrt((double)(float)*g->sumsq) : sqrt((double)g->be->sumsq(ctx, g->o.grads, g->o.n));
    if (res) *res = r;
    return LT_OK;
}

double lt_step_graph_grad_norm(const lt_step_graph *g) { return g->grad_norm; }

lt_step_graph_stats lt_step_graph_get_stats(const lt_step_graph *g) { return g->st; }
