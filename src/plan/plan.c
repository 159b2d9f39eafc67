/* The memory planner (see plan.h): the model's size table plus the trainer's optimizer state,
 * the largest-value search and the JSON form. Pure functions; the budget (what the machine has)
 * is the caller's business (guard.h measures it). */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "longtune/alloc.h"
#include "longtune/context_parallel.h"
#include "longtune/plan.h"

static const char *const class_names[LT_PLAN_CLASS_COUNT_] = {
    "frozen_weights", "lora_params", "lora_grads", "activations", "transients", "workspace", "optimizer_state", "held",
};

const char *lt_plan_class_name(lt_plan_class c) {
    return (unsigned)c < LT_PLAN_CLASS_COUNT_ ? class_names[c] : "unknown";
}

const char *lt_plan_attention_name(lt_attention_impl a) { return a == LT_ATTENTION_NAIVE ? "naive" : "flash"; }

const char *lt_plan_loss_name(lt_lce_impl l) {
    switch (l) {
    case LT_LCE_NAIVE: return "naive";
    case LT_LCE_CHUNKED: return "chunked";
    default: return "fused";
    }
}

const char *lt_plan_recompute_name(lt_recompute r, int64_t k, char *buf, size_t n) {
    if (r == LT_RECOMPUTE_EVERY) snprintf(buf, n, "all");
    else if (r == LT_RECOMPUTE_EVERY_K) snprintf(buf, n, "every:%lld", (long long)(k > 0 ? k : 2));
    else if (r == LT_RECOMPUTE_SLIDING || r == LT_RECOMPUTE_GLOBAL) {
        const char *kind = r == LT_RECOMPUTE_SLIDING ? "sliding" : "global";
        if (k > 1) snprintf(buf, n, "%s:%lld", kind, (long long)k);
        else snprintf(buf, n, "%s", kind);
    } else snprintf(buf, n, "none");
    return buf;
}

/* "K" after a policy's colon: 1 .. 999999. */
static int parse_k(const char *p, int64_t *k) {
    long long v = 0;
    if (!*p) return 0;
    for (; *p >= '0' && *p <= '9' && v < 1000000; p++) v = v * 10 + (*p - '0');
    if (*p || v < 1) return 0;
    *k = v;
    return 1;
}

lt_status lt_plan_recompute_parse(lt_ctx *ctx, const char *s, lt_recompute *r, int64_t *k) {
    *k = 0;
    if (!s) s = "";
    if (!strcmp(s, "none")) {
        *r = LT_RECOMPUTE_NONE;
        return LT_OK;
    }
    if (!strcmp(s, "all") || !strcmp(s, "every")) {
        *r = LT_RECOMPUTE_EVERY;
        return LT_OK;
    }
    if (!strncmp(s, "every:", 6) && parse_k(s + 6, k)) {
        *r = LT_RECOMPUTE_EVERY_K;
        return LT_OK;
    }
    for (int i = 0; i < 2; i++) {
        const char *kind = i ? "global" : "sliding";
        size_t n = strlen(kind);
        if (strncmp(s, kind, n) || (s[n] && (s[n] != ':' || !parse_k(s + n + 1, k)))) continue;
        *r = i ? LT_RECOMPUTE_GLOBAL : LT_RECOMPUTE_SLIDING;
        return LT_OK;
    }
    *k = 0;
    return lt_error(ctx, LT_ERR_INVALID_ARG,
                    "recompute policy '%s': expected none, all, every:K, sliding[:K] or global[:K] with K >= 1", s);
}

size_t lt_plan_optimizer_bytes(lt_device dev, int64_t n_params) {
    if (n_params <= 0) return 0;
    if ((uint64_t)n_params > SIZE_MAX / 8) return SIZE_MAX;
    size_t one = lt_alloc_accounted_size(dev, (size_t)n_params * sizeof(float));
    return one > SIZE_MAX / 2 ? SIZE_MAX : 2 * one;
}

lt_status lt_plan_compute(lt_ctx *ctx, const lt_model_config *cfg, const lt_plan_options *opt, lt_plan *out) {
    memset(out, 0, sizeof *out);
    if (!cfg || !opt) return lt_error(ctx, LT_ERR_INVALID_ARG, "plan: NULL config or options");
    if ((unsigned)opt->device >= LT_DEVICE_COUNT_)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "plan: unknown device %d", (int)opt->device);
    if (opt->run.B < 1 || opt->run.T < 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "plan: batch %lld and sequence length %lld must be >= 1",
                        (long long)opt->run.B, (long long)opt->run.T);
    lt_plan_options o = *opt;
    if (!o.lora.rank) o.lora.rank = 8;
    if (o.lora.alpha == 0.0f) o.lora.alpha = 16;
    /* targets 0: the model's default (lt_model_size_table: every projection, the attention's on MoE layers) */
    if (o.run.attention == LT_ATTENTION_AUTO) o.run.attention = LT_ATTENTION_FLASH;
    if (o.run.loss == LT_LCE_AUTO) o.run.loss = LT_LCE_FUSED;
    if (o.run.recompute == LT_RECOMPUTE_EVERY_K && !o.run.recompute_k) o.run.recompute_k = 2;
    if (!o.run.threads) o.run.threads = lt_ctx_threads(ctx);
    o.run.device = o.device;
    if (o.dp_size <= 0) o.dp_size = 1;
    if (o.cp_size <= 0) o.cp_size = 1;
    if (o.dp_size > (1 << 20) || o.cp_size > (1 << 20))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "plan: %lld data-parallel or %lld context-parallel ranks",
                        (long long)o.dp_size, (long long)o.cp_size);
    if (o.run.T > ((int64_t)1 << 40))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "plan: sequence length %lld", (long long)o.run.T);

    /* One rank's share: its rows of the batch and its tokens of each (padded) row. */
    lt_model_run_options rr = o.run;
    rr.B = (o.run.B + o.dp_size - 1) / o.dp_size;
    if (o.cp_size > 1) {
        int64_t c2 = 2 * o.cp_size, Tp = (o.run.T + c2 - 1) / c2 * c2;
        rr.T = Tp / o.cp_size;
    }
    /* The model's classes map one to one onto the first six of the plan. Its size table for the
     * device carries that device's kernel workspaces (a CUDA run: the CUDA attention, loss and
     * matmul workspaces) and rounds each block as that device's allocator does; the model's host
     * bookkeeping counts only in a CPU plan. */
    lt_model_sizes ms;
    LT_TRY(lt_model_size_table(ctx, cfg, &o.lora, &rr, &ms));
    for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) out->bytes[c] = ms.bytes[c];
    if (o.cp_size > 1) {
        /* Ulysses: the head-layout buffers and the kernel's workspace at the per-rank shape,
         * allocated with the run. Ring: the key/value blocks and their travelling gradients (the
         * backward holds more than the forward), one row at a time. */
        int64_t c2 = 2 * o.cp_size;
        /* Attention's tensors are in the saved dtype (the layout's rule: bf16 on CUDA by default). */
        const lt_backend *be = lt_backend_get(o.device);
        lt_dtype adt = o.run.saved_bf16 > 0 ? LT_DTYPE_BF16
            : o.run.saved_bf16 < 0          ? LT_DTYPE_F32
            : be                            ? be->saved_dtype
                                            : LT_DTYPE_F32;
        lt_cp_attention_params cp = {(o.run.T + c2 - 1) / c2 * c2, cfg->H, cfg->Hkv, cfg->D, 0, o.run.attention, adt};
        int kind = lt_cp_choose(&cp, (int)o.cp_size, o.device);
        if (kind < 0)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "plan: context parallel over %lld ranks on this device splits "
                            "Hkv = %lld key/value heads over them (not a multiple)",
                            (long long)o.cp_size, (long long)cfg->Hkv);
        size_t ws = kind == LT_CP_ULYSSES ? lt_cp_ulysses_workspace_bytes(&cp, (int)o.cp_size, o.device, o.run.threads)
                                          : lt_cp_attention_workspace_bytes(&cp, (int)o.cp_size, 1);
        if (ws == SIZE_MAX || ws > SIZE_MAX - out->bytes[LT_PLAN_WORKSPACE])
            return lt_error(ctx, LT_ERR_OOM, "plan: the context-parallel buffers overflow the address space");
        if (kind == LT_CP_ULYSSES || o.device == LT_DEVICE_CUDA) ws = lt_alloc_accounted_size(o.device, ws);
        out->bytes[LT_PLAN_WORKSPACE] += ws;
    }
    out->bytes[LT_PLAN_OPTIMIZER] = lt_plan_optimizer_bytes(o.device, ms.n_lora_params);
    out->bytes[LT_PLAN_HELD] = o.held_bytes;
    size_t total = 0;
    for (int c = 0; c < LT_PLAN_CLASS_COUNT_; c++) {
        if (out->bytes[c] > SIZE_MAX - total)
            return lt_error(ctx, LT_ERR_OOM, "plan: the %s class overflows the address space", class_names[c]);
        total += out->bytes[c];
    }
    out->peak_bytes = total;
    out->n_lora_params = ms.n_lora_params;
    out->offload_bytes = ms.offload_bytes;
    out->device = o.device;
    out->options = o;
    return LT_OK;
}

static int fits_at(lt_ctx *ctx, const lt_model_config *cfg, const lt_plan_options *opt, lt_plan_search what, int64_t v,
                   size_t budget) {
    lt_plan_options o = *opt;
    if (what == LT_PLAN_SEARCH_SEQ) o.run.T = v;
    else o.run.B = v;
    lt_plan p;
    if (lt_plan_compute(ctx, cfg, &o, &p) != LT_OK) {
        lt_ctx_clear_error(ctx); /* too large to plan counts as too large to fit */
        return 0;
    }
    return p.peak_bytes <= budget && (!o.host_budget_bytes || p.offload_bytes <= o.host_budget_bytes);
}

lt_status lt_plan_search_max(lt_ctx *ctx, const lt_model_config *cfg, const lt_plan_options *opt, lt_plan_search what,
                             int64_t hi, size_t budget_bytes, int64_t *out, int *found) {
    *out = 0;
    *found = 0;
    if (hi < 1) return lt_error(ctx, LT_ERR_INVALID_ARG, "plan search: upper bound %lld < 1", (long long)hi);
    lt_plan_options o = *opt;
    if (what == LT_PLAN_SEARCH_SEQ) o.run.T = 1;
    else o.run.B = 1;
    lt_plan p;
    LT_TRY(lt_plan_compute(ctx, cfg, &o, &p)); /* a config that cannot plan at all is an error */
    if (p.peak_bytes > budget_bytes || (o.host_budget_bytes && p.offload_bytes > o.host_budget_bytes)) return LT_OK;
    int64_t lo = 1, top = hi; /* invariant: lo fits; everything above top does not */
    while (lo < top) {
        int64_t mid = lo + (top - lo + 1) / 2;
        if (fits_at(ctx, cfg, &o, what, mid, budget_bytes)) lo = mid;
        else top = mid - 1;
    }
    *out = lo;
    *found = 1;
    return LT_OK;
}

lt_status lt_plan_to_json(lt_ctx *ctx, const lt_plan *p, char *buf, size_t n) {
    if (!buf || n < 1024) return lt_error(ctx, LT_ERR_INVALID_ARG, "plan json: buffer of %zu bytes", n);
    const lt_plan_options *o = &p->options;
    char rec[32];
    size_t used = 0;
    int w =
        snprintf(buf, n,
                 "{\"device\": \"%s\", \"batch\": %lld, \"seq_len\": %lld, \"lora_rank\": %lld, "
                 "\"recompute\": \"%s\", \"recompute_attention\": %s, \"recompute_attention_layers\": %lld, "
                 "\"chunk_rows\": %lld, \"attention\": \"%s\", "
                 "\"loss\": \"%s\", \"n_lora_params\": %lld, \"dp_size\": %lld, \"cp_size\": %lld, \"classes\": {",
                 p->device == LT_DEVICE_CUDA ? "cuda" : "cpu", (long long)o->run.B, (long long)o->run.T,
                 (long long)o->lora.rank, lt_plan_recompute_name(o->run.recompute, o->run.recompute_k, rec, sizeof rec),
                 o->run.recompute_attention && o->run.recompute != LT_RECOMPUTE_NONE ? "true" : "false",
                 (long long)(o->run.recompute != LT_RECOMPUTE_NONE && !o->run.recompute_attention
                                 ? o->run.recompute_attention_layers
                                 : 0),
                 (long long)(o->run.chunk_rows > 0 ? o->run.chunk_rows : LT_MODEL_CHUNK_ROWS),
                 lt_plan_attention_name(o->run.attention), lt_plan_loss_name(o->run.loss), (long long)p->n_lora_params,
                 (long long)(o->dp_size > 0 ? o->dp_size : 1), (long long)(o->cp_size > 0 ? o->cp_size : 1));
    if (w < 0 || (size_t)w >= n) goto small;
    used = (size_t)w;
    for (int c = 0; c < LT_PLAN_CLASS_COUNT_; c++) {
        w = snprintf(buf + used, n - used, "%s\"%s\": %zu", c ? ", " : "", class_names[c], p->bytes[c]);
        if (w < 0 || (size_t)w >= n - used) goto small;
        used += (size_t)w;
    }
    w = snprintf(buf + used, n - used,
                 "}, \"peak_bytes\": %zu, \"offload_checkpoints\": %s, \"host_offload_bytes\": %zu}", p->peak_bytes,
                 o->run.offload_ckpt ? "true" : "false", p->offload_bytes);
    if (w < 0 || (size_t)w >= n - used) goto small;
    return LT_OK;
small:
    buf[0] = '\0';
    return lt_error(ctx, LT_ERR_INVALID_ARG, "plan json: buffer of %zu bytes is too small", n);
}
