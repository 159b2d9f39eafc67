/* The training loop: packed batches → model forward/backward (gradient accumulation) → global-norm
 * clipping → AdamW, all through the model's backend ops (so the optimizer state lives where the
 * model does, host or GPU), with evaluation, metrics, checkpoints and PEFT export on their
 * schedules, and a clean stop on request. Data parallel over a communicator (host models): every
 * rank packs the same global batches and trains its share of their rows (or, context parallel, its
 * share of each row's tokens); gradient buckets are summed over the ranks as the last backward
 * completes them. Every buffer is allocated before the first step; nothing allocates inside it
 * except packing plans, once per epoch. A device run copies the trainable state to a host mirror
 * only to save it. It does not load models or read datasets (lt_train_run and the CLI do) and it
 * never exits the process. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "longtune/alloc.h"
#include "longtune/context_parallel.h"
#include "longtune/log.h"
#include "longtune/plan.h"
#include "train/step_graph.h"
#include "train/train_internal.h"

#define PEFT_KEY_PREFIX "base_model.model."

typedef struct trainer {
    lt_ctx *ctx;
    const lt_train_options *o;
    lt_model *m;
    const lt_backend *be;   /* the model's */
    lt_device dev;
    /* LoRA parameters, gradients (the model's) and AdamW moments (ours), flat, n floats each, in
     * the model's memory; a device run's host mirror of params, m and v (3n) for checkpoints. */
    int64_t n;
    float *params, *grads, *mom_m, *mom_v;
    float *host;
    lt_train_param *tp;
    int n_tp;
    /* Data: the epoch's packing plan, the validation plan, one batch's buffers (B, T_cap). */
    const lt_pack_input *train, *valid;
    lt_pack_options popt;
    lt_pack_plan *plan;
    int64_t plan_epoch;
    lt_pack_plan *vplan;
    int64_t B, T;
    int32_t *ids, *tgt, *pos, *offs, *pieces;
    size_t batch_bytes;
    lt_train_state st;
    lt_metrics *metrics;
    char ckpt_path[LT_TRAIN_PATH_MAX + 32];
    /* Data parallel: this rank of `world`; red holds one step's per-micro-batch loss sums and the
     * stop flag for their all-reduce (grad_accum + 1 doubles). stop_world: some rank was asked to
     * stop during the last step (all ranks agree on it, so all stop after the same step). */
    lt_comm *comm;
    int rank, world;
    /* Context parallel: one row split over the world; this rank's tokens, targets and positions
     * (T / world each) are gathered here from the filled row. */
    int cp;
    int32_t *cp_ids, *cp_tgt, *cp_pos;
    size_t cp_bytes;
    double *red;
    size_t red_bytes;
    int stop_world;
    lt_comm_reducer *reducer; /* gradient buckets, started from the model's grad-ready hook */
    int dist;                 /* reductions run: a world of several ranks, or NCCL even for one (its
                                 transport path, exercised on a single GPU) */
    lt_step_graph *sg;        /* device runs of one micro-batch per step on one rank: the step
                                 queued without waits, captured into a CUDA graph when its shape
                                 repeats (step_graph.h) */
} trainer;

lt_status lt_train_lora_options(lt_ctx *ctx, const lt_train_options *opt, lt_lora_options *out) {
    memset(out, 0, sizeof *out);
    for (const char *p = opt->lora_targets; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int found = 0;
        for (int k = 0; k < LT_PROJ_COUNT_; k++) {
            const char *name = lt_proj_name((lt_proj)k);
            if (strlen(name) == len && !strncmp(name, p, len)) {
                out->targets |= 1u << k;
                found = 1;
            }
        }
        if (!found)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "lora target '%.*s' is not a projection (resolve the options first)",
                            (int)len, p);
        p = e ? e + 1 : p + len;
    }
    out->num_layers = opt->num_layers > 0 ? opt->num_layers : 0;
    out->rank = opt->lora_rank;
    out->alpha = (float)opt->lora_alpha;
    out->dropout = (float)opt->lora_dropout;
    out->seed = opt->seed;
    return LT_OK;
}

/* The trainer's view of the model's LoRA tensors, with our moments beside them. */
static lt_status bind_params(trainer *t) {
    lt_ctx *ctx = t->ctx;
    int64_t ng = 0;
    t->params = lt_model_lora_params(t->m, &t->n);
    t->grads = lt_model_lora_grads(t->m, &ng);
    int64_t count = lt_model_lora_count(t->m);
    if (!t->params || !t->grads || ng != t->n || t->n <= 0 || count <= 0 || count > (1 << 20))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model has no LoRA parameters to train (targets/layers empty?)");
    size_t nb = (size_t)t->n * sizeof(float);
    t->mom_m = lt_alloc(ctx, t->dev, nb, "AdamW first moments");
    t->mom_v = lt_alloc(ctx, t->dev, nb, "AdamW second moments");
    t->tp = lt_calloc(ctx, LT_DEVICE_CPU, (size_t)count * sizeof *t->tp, "LoRA tensor index");
    if (t->tp) t->n_tp = (int)count;
    if (!t->mom_m || !t->mom_v || !t->tp) return LT_ERR_OOM;
    t->be->zero(ctx, t->mom_m, nb);
    t->be->zero(ctx, t->mom_v, nb);
    if (t->dev != LT_DEVICE_CPU && !(t->host = lt_alloc(ctx, LT_DEVICE_CPU, 3 * nb, "optimizer state host mirror")))
        return LT_ERR_OOM;
    /* What checkpoints and the adapter read and write: the state itself on the host, else the mirror. */
    float *hp = t->host ? t->host : t->params, *hm = t->host ? t->host + t->n : t->mom_m,
          *hv = t->host ? t->host + 2 * t->n : t->mom_v;
    size_t pl = strlen(PEFT_KEY_PREFIX), sl = strlen(".weight");
    for (int64_t i = 0; i < count; i++) {
        lt_lora_tensor lt;
        LT_TRY(lt_model_lora_tensor(ctx, t->m, i, &lt));
        size_t len = strlen(lt.name);
        if (len <= pl + sl || strncmp(lt.name, PEFT_KEY_PREFIX, pl) || strcmp(lt.name + len - sl, ".weight") ||
            len - pl - sl >= LT_TRAIN_NAME_MAX || lt.value.ndim != 2 || lt.offset < 0 ||
            lt.offset + lt_tensor_numel(&lt.value) > t->n)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "LoRA tensor %lld ('%s') has an unexpected name or layout",
                            (long long)i, lt.name);
        lt_train_param *p = &t->tp[i];
        memcpy(p->name, lt.name + pl, len - pl - sl);
        p->name[len - pl - sl] = '\0';
        p->ndim = 2;
        p->shape[0] = lt.value.shape[0];
        p->shape[1] = lt.value.shape[1];
        p->data = hp + lt.offset;
        p->grad = t->host ? NULL : t->grads + lt.offset;
        p->m = hm + lt.offset;
        p->v = hv + lt.offset;
    }
    return LT_OK;
}

/* Device runs: the state into the host mirror (before a save) and back (after a resume). */
static lt_status state_to_host(trainer *t) {
    if (!t->host) return LT_OK;
    size_t nb = (size_t)t->n * sizeof(float);
    LT_TRY(lt_model_lora_get(t->ctx, t->m, 0, 0, t->n, t->host));
    LT_TRY(t->be->copy_to_host(t->ctx, t->host + t->n, t->mom_m, nb));
    return t->be->copy_to_host(t->ctx, t->host + 2 * t->n, t->mom_v, nb);
}

static lt_status state_from_host(trainer *t) {
    if (!t->host) return LT_OK;
    size_t nb = (size_t)t->n * sizeof(float);
    LT_TRY(lt_model_lora_set(t->ctx, t->m, 0, t->n, t->host));
    LT_TRY(t->be->copy_to_device(t->ctx, t->mom_m, t->host + t->n, nb));
    return t->be->copy_to_device(t->ctx, t->mom_v, t->host + 2 * t->n, nb);
}

static lt_status alloc_batch(trainer *t) {
    /* seq_offsets holds up to T+1 entries per row (S <= T); pieces one count per row. */
    size_t bt = (size_t)(t->B * t->T), bo = (size_t)(t->B * (t->T + 1));
    t->batch_bytes = (3 * bt + bo + (size_t)t->B) * sizeof(int32_t);
    int32_t *buf = lt_alloc(t->ctx, LT_DEVICE_CPU, t->batch_bytes, "batch buffers");
    if (!buf) return LT_ERR_OOM;
    t->ids = buf;
    t->tgt = buf + bt;
    t->pos = buf + 2 * bt;
    t->offs = buf + 3 * bt;
    t->pieces = buf + 3 * bt + bo;
    return LT_OK;
}

/* Fills batch `index` of `plan` into the buffers and describes it in *b; *ntok = trained targets,
 * *nreal (optional) = positions holding real tokens (the throughput count, as mlx-lm's). */
static lt_status fill(trainer *t, const lt_pack_plan *plan, const lt_pack_input *in, int64_t index,
                      lt_model_batch *b, int64_t *ntok, int64_t *nreal) {
    int64_t B, T, S;
    lt_pack_batch_shape(plan, index, &B, &T, &S);
    if (B > t->B || T > t->T || S > T || S < 1)
        return lt_error(t->ctx, LT_ERR_INVALID_ARG, "batch %lld has shape B=%lld T=%lld S=%lld beyond B=%lld T=%lld",
                        (long long)index, (long long)B, (long long)T, (long long)S, (long long)t->B, (long long)t->T);
    lt_pack_batch pb = {t->ids, t->tgt, t->pos, t->offs, t->pieces};
    LT_TRY(lt_pack_fill(t->ctx, plan, in, index, &pb));
    int64_t n = 0;
    for (int64_t i = 0; i < B * T; i++) n += t->tgt[i] != LT_PACK_IGNORE;
    *ntok = n;
    if (nreal) {
        /* Real sequences come first in a row; the padding tail is its own trailing segment. */
        int64_t r = 0;
        for (int64_t row = 0; row < B; row++) {
            int32_t k = t->pieces[row];
            if (k < 0 || k > S) return lt_error(t->ctx, LT_ERR_INVALID_ARG, "row %lld has %d pieces", (long long)row, k);
            r += t->offs[row * (S + 1) + k];
        }
        *nreal = r;
    }
    memset(b, 0, sizeof *b);
    b->B = B;
    b->T = T;
    b->tokens = t->ids;
    b->targets = t->tgt;
    b->positions = t->pos;
    b->seq_offsets = t->offs;
    b->S = S;
    return LT_OK;
}

/* This rank's share of batch b: data parallel, rows [B·rank/world, B·(rank+1)/world) as views into
 * b's buffers; context parallel, its zig-zag tokens of the one row, gathered into the cp buffers.
 * *ntok: the trained targets in the share (0 when it has no rows). */
static lt_status shard(trainer *t, const lt_model_batch *b, lt_model_batch *out, int64_t *ntok) {
    if (t->cp) {
        if (b->B != 1 || b->T % (2 * t->world))
            return lt_error(t->ctx, LT_ERR_INVALID_ARG, "context parallel: batch of %lld x %lld tokens is not one row "
                            "of a multiple of %d", (long long)b->B, (long long)b->T, 2 * t->world);
        int64_t Tl = b->T / t->world, n = 0;
        for (int64_t i = 0; i < Tl; i++) {
            int64_t g = lt_cp_zigzag_position(b->T, t->world, t->rank, i);
            t->cp_ids[i] = b->tokens[g];
            t->cp_tgt[i] = b->targets[g];
            t->cp_pos[i] = b->positions ? b->positions[g] : (int32_t)g;
            n += t->cp_tgt[i] != LT_PACK_IGNORE;
        }
        memset(out, 0, sizeof *out);
        out->B = 1, out->T = Tl, out->step = b->step;
        out->tokens = t->cp_ids, out->targets = t->cp_tgt, out->positions = t->cp_pos;
        *ntok = n;
        return LT_OK;
    }
    int64_t lo = b->B * t->rank / t->world, hi = b->B * (t->rank + 1) / t->world;
    *out = *b;
    out->B = hi - lo;
    out->first_row = lo;
    *ntok = 0;
    if (out->B == 0) return LT_OK;
    out->tokens = b->tokens + lo * b->T;
    out->targets = b->targets + lo * b->T;
    if (b->positions) out->positions = b->positions + lo * b->T;
    if (b->seq_offsets) out->seq_offsets = b->seq_offsets + lo * (b->S + 1);
    int64_t n = 0;
    for (int64_t i = 0; i < out->B * b->T; i++) n += out->targets[i] != LT_PACK_IGNORE;
    *ntok = n;
    return LT_OK;
}

static lt_status next_train_batch(trainer *t, lt_model_batch *b, int64_t *ntok, int64_t *nreal) {
    for (int tries = 0;; tries++) {
        if (!t->plan || t->plan_epoch != t->st.data_epoch) {
            lt_pack_plan_free(t->ctx, t->plan);
            t->plan = NULL;
            t->popt.epoch = (uint64_t)t->st.data_epoch;
            LT_TRY(lt_pack_plan_build(t->ctx, t->train, &t->popt, &t->plan));
            t->plan_epoch = t->st.data_epoch;
        }
        if (t->st.data_cursor < lt_pack_plan_batches(t->plan)) break;
        if (tries > 1) return lt_error(t->ctx, LT_ERR_INVALID_ARG, "the training set yields no batches");
        t->st.data_epoch++;
        t->st.data_cursor = 0;
    }
    LT_TRY(fill(t, t->plan, t->train, t->st.data_cursor, b, ntok, nreal));
    t->st.data_cursor++;
    return LT_OK;
}

/* The model finished a layer's gradients during the step's last backward: hand them to the
 * reducer, which starts every bucket they complete. */
static lt_status grads_ready(void *arg, int64_t offset, int64_t count) {
    trainer *t = arg;
    return lt_comm_reducer_ready(t->ctx, t->reducer, offset, count);
}

/* Mean token loss over the validation batches (NAN without a validation set). */
static lt_status evaluate(trainer *t, double *out) {
    *out = NAN;
    if (!t->valid || t->valid->n_seqs == 0) return LT_OK;
    if (!t->vplan) {
        lt_pack_options v = t->popt;
        v.epoch = 0;
        LT_TRY(lt_pack_plan_build(t->ctx, t->valid, &v, &t->vplan));
    }
    int64_t nb = lt_pack_plan_batches(t->vplan);
    if (t->o->val_batches > 0 && nb > t->o->val_batches) nb = t->o->val_batches;
    double sum = 0;
    int64_t tokens = 0;
    for (int64_t i = 0; i < nb; i++) {
        lt_model_batch b, lb;
        int64_t ntok = 0;
        LT_TRY(fill(t, t->vplan, t->valid, i, &b, &ntok, NULL));
        if (!ntok) continue;
        /* Context parallel ranks run every step, tokens or not: attention is a collective. */
        int64_t local = 0;
        LT_TRY(shard(t, &b, &lb, &local));
        if (!local && !t->cp) continue;
        lt_model_result r;
        LT_TRY(lt_model_forward(t->ctx, t->m, &lb, &r, NULL));
        sum += r.loss_sum;
        tokens += r.n_tokens;
    }
    if (t->dist) {
        double v[2] = {sum, (double)tokens};
        LT_TRY(lt_comm_allreduce_sum_host(t->ctx, t->comm, v, 2, LT_COMM_F64));
        sum = v[0];
        tokens = (int64_t)v[1];
    }
    if (tokens) *out = sum / (double)tokens;
    return LT_OK;
}

/* train_step through the step graph (one micro-batch, one rank, a device model): the batch, the
 * loss scale and AdamW's values go in, the loss comes back with the step's only wait. */
static lt_status graph_step(trainer *t, double *loss, int64_t *tokens, int64_t *real) {
    const lt_train_options *o = t->o;
    lt_model_batch b;
    int64_t ntok = 0, nreal = 0;
    LT_TRY(next_train_batch(t, &b, &ntok, &nreal));
    lt_adamw_params hp = {(float)lt_train_lr(o, t->st.step), (float)o->beta1, (float)o->beta2, (float)o->eps,
                          (float)o->weight_decay, t->st.step + 1};
    double l = 0;
    if (ntok) {
        b.step = (uint64_t)(t->st.step * o->grad_accum);
        lt_model_result r;
        LT_TRY(lt_step_graph_run(t->ctx, t->sg, &b, (float)(1.0 / (double)ntok), &hp, &r));
        l = r.loss_sum / (double)ntok;
    } else { /* nothing to train on: zero gradients, the moments still decay (as train_step does) */
        t->be->zero(t->ctx, t->grads, (size_t)t->n * sizeof(float));
        t->be->adamw(t->ctx, t->params, t->grads, t->mom_m, t->mom_v, t->n, &hp);
    }
    t->st.step++;
    t->st.tokens_seen += ntok;
    *loss = l;
    *tokens = ntok;
    *real = nreal;
    return LT_OK;
}

/* One optimizer step: grad_accum micro-batches, clipping, AdamW. *loss: mean over micro-batches
 * of their token-mean loss; *tokens: trained targets; *real: real (non-padding) input tokens. */
static lt_status train_step(trainer *t, double *loss, int64_t *tokens, int64_t *real) {
    const lt_train_options *o = t->o;
    if (t->sg) return graph_step(t, loss, tokens, real);
    t->be->zero(t->ctx, t->grads, (size_t)t->n * sizeof(float));
    double l = 0;
    int64_t tok = 0, rtok = 0;
    /* Every rank packs the whole micro-batch, so the trained-token count that scales the mean loss
     * is the global one without communication; each rank runs only its rows. red[k] collects the
     * micro-batch's loss sum, red[grad_accum] the stop flag, for one all-reduce after the loop. */
    double *lsum = t->red;
    memset(lsum, 0, t->red_bytes);
    int64_t *ntoks = (int64_t *)(lsum + o->grad_accum + 1);
    for (int64_t k = 0; k < o->grad_accum; k++) {
        lt_model_batch b, lb;
        int64_t ntok = 0, nreal = 0;
        LT_TRY(next_train_batch(t, &b, &ntok, &nreal));
        rtok += nreal;
        ntoks[k] = ntok;
        if (!ntok) continue;
        /* Dropout masks are a function of the micro-step, so a resumed run draws the same ones. */
        b.step = (uint64_t)(t->st.step * o->grad_accum + k);
        tok += ntok;
        int64_t local = 0;
        LT_TRY(shard(t, &b, &lb, &local));
        if (!local && !t->cp) continue;
        lt_model_result r;
        /* The last micro-batch finishes each layer's gradients: reduce them as they come. */
        if (t->reducer && k == o->grad_accum - 1) lt_model_set_grad_ready(t->m, grads_ready, t);
        float scale = (float)(1.0 / ((double)ntok * (double)o->grad_accum));
        lt_status s = lt_model_forward_backward(t->ctx, t->m, &lb, scale, &r, NULL);
        lt_model_set_grad_ready(t->m, NULL, NULL);
        LT_TRY(s);
        lsum[k] = r.loss_sum;
    }
    if (t->dist) {
        /* Buckets the backward completed are in flight already; the rest start now (all ranks
         * issue them in the same order, see lt_comm_reducer_ready). */
        LT_TRY(lt_comm_reducer_finish(t->ctx, t->reducer));
        lsum[o->grad_accum] = lt_train_stop_requested() ? 1 : 0;
        LT_TRY(lt_comm_allreduce_sum_host(t->ctx, t->comm, lsum, o->grad_accum + 1, LT_COMM_F64));
        t->stop_world = lsum[o->grad_accum] > 0;
    }
    for (int64_t k = 0; k < o->grad_accum; k++)
        if (ntoks[k]) l += lsum[k] / (double)ntoks[k] / (double)o->grad_accum;
    if (o->grad_clip > 0 && t->be->clip_norm) {
        t->be->clip_norm(t->ctx, t->grads, t->n, o->grad_clip); /* decided on the device: no wait */
    } else if (o->grad_clip > 0) {
        /* The host reads the norm to decide whether to scale (a CPU step never waits anyway). */
        double norm = sqrt((double)t->be->sumsq(t->ctx, t->grads, t->n));
        if (norm > o->grad_clip) t->be->scale(t->ctx, t->grads, (float)(o->grad_clip / norm), t->n);
    }
    lt_adamw_params hp = {(float)lt_train_lr(o, t->st.step), (float)o->beta1, (float)o->beta2, (float)o->eps,
                          (float)o->weight_decay, t->st.step + 1};
    t->be->adamw(t->ctx, t->params, t->grads, t->mom_m, t->mom_v, t->n, &hp);
    t->st.step++;
    t->st.tokens_seen += tok;
    *loss = l;
    *tokens = tok;
    *real = rtok;
    return LT_OK;
}

static void set_rng_keys(trainer *t) {
    t->st.rng[0] = t->o->seed;
    t->st.rng[1] = (uint64_t)(t->st.step * t->o->grad_accum);
    t->st.rng[2] = (uint64_t)t->st.data_epoch;
    t->st.rng[3] = 0;
}

/* Rank 0 writes (all ranks hold the same parameters); the others learn whether it succeeded, so a
 * failed save stops every rank instead of leaving them waiting in the next collective. */
static lt_status save(trainer *t) {
    set_rng_keys(t);
    lt_status s = LT_OK;
    if (t->rank == 0) {
        s = state_to_host(t);
        if (s == LT_OK) s = lt_checkpoint_save(t->ctx, t->ckpt_path, t->o, &t->st, t->tp, t->n_tp);
        if (s == LT_OK) s = lt_peft_save(t->ctx, t->o->adapter_path, t->o->model, t->o, t->tp, t->n_tp);
    }
    if (t->dist) {
        double failed = s != LT_OK;
        LT_TRY(lt_comm_allreduce_sum_host(t->ctx, t->comm, &failed, 1, LT_COMM_F64));
        if (failed > 0 && s == LT_OK)
            return lt_error(t->ctx, LT_ERR_IO, "rank 0 failed to save the checkpoint or adapter into %s",
                            t->o->adapter_path);
    }
    return s;
}

static const char *fmt_bytes(size_t b, char *buf, size_t n) {
    double v = (double)b;
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    snprintf(buf, n, "%.1f %s", v, u[i]);
    return buf;
}

/* The metrics' host_peak_bytes: the host high-water of a device run, 0 (left out) on the host. */
static int64_t host_peak(const trainer *t) {
    return t->dev == LT_DEVICE_CPU ? 0 : (int64_t)lt_mem_get_stats(t->ctx, LT_DEVICE_CPU).peak_bytes;
}

static lt_status run(trainer *t, FILE *progress, lt_train_result *res) {
    lt_ctx *ctx = t->ctx;
    const lt_train_options *o = t->o;
    LT_TRY(bind_params(t));
    LT_TRY(lt_train_mkdir(ctx, o->adapter_path));
    snprintf(t->ckpt_path, sizeof t->ckpt_path, "%s/" LT_TRAIN_CHECKPOINT_FILE, o->adapter_path);

    if (o->context_parallel && (t->world > 1 || (t->comm && lt_cp_env_forced()))) {
        if (o->batch_size != 1 || !o->no_pack || o->max_seq_length % (2 * t->world))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "context parallel over %d ranks needs batch_size 1, no_pack and max_seq_length a multiple "
                            "of %d (got %lld, %s, %lld)", t->world, 2 * t->world, (long long)o->batch_size,
                            o->no_pack ? "no_pack" : "packing", (long long)o->max_seq_length);
        t->cp = 1;
    }
    LT_TRY(lt_train_pack_options(ctx, o, t->cp ? t->world : 1, &t->popt));
    LT_TRY(lt_pack_input_check(ctx, t->train));
    if (t->valid) LT_TRY(lt_pack_input_check(ctx, t->valid));
    t->B = o->batch_size;
    t->T = o->max_seq_length;
    LT_TRY(alloc_batch(t));
    t->red_bytes = (size_t)(o->grad_accum + 1) * (sizeof(double) + sizeof(int64_t));
    t->red = lt_alloc(ctx, LT_DEVICE_CPU, t->red_bytes, "step loss sums");
    if (!t->red) return LT_ERR_OOM;
    if (t->dist) {
        /* Buckets of whole layers where possible (about 4 MiB); LONGTUNE_DP_BUCKET (elements)
         * overrides it, for tests that want many small buckets. */
        int64_t layers = 0, prev = -1, bucket = 0;
        for (int64_t i = 0; i < lt_model_lora_count(t->m); i++) {
            lt_lora_tensor lt;
            LT_TRY(lt_model_lora_tensor(ctx, t->m, i, &lt));
            layers += lt.layer != prev;
            prev = lt.layer;
        }
        int64_t per = layers > 0 ? t->n / layers : 0;
        const char *env = getenv("LONGTUNE_DP_BUCKET");
        if (env && atoll(env) > 0) bucket = atoll(env);
        else if (per > 0) bucket = per * ((1 << 20) / per > 0 ? (1 << 20) / per : 1);
        LT_TRY(lt_comm_reducer_init(ctx, t->comm, t->grads, t->n, bucket, &t->reducer));
    }
    if (t->cp) {
        int64_t Tl = t->T / t->world;
        t->cp_bytes = (size_t)(3 * Tl) * sizeof(int32_t);
        t->cp_ids = lt_alloc(ctx, LT_DEVICE_CPU, t->cp_bytes, "context-parallel row share");
        if (!t->cp_ids) return LT_ERR_OOM;
        t->cp_tgt = t->cp_ids + Tl;
        t->cp_pos = t->cp_ids + 2 * Tl;
        LT_TRY(lt_model_set_context_parallel(ctx, t->m, t->comm));
    }
    if (o->threads > 0) lt_ctx_set_threads(ctx, o->threads); /* the model sizes workspaces per thread */
    lt_model_run_options run = {.B = t->B, .T = t->T, .device = t->dev, .recompute = o->recompute,
                                .recompute_k = o->recompute_every, .attention = o->attention, .loss = o->loss,
                                .threads = o->threads, .offload_ckpt = o->offload_checkpoints,
                                .recompute_attention = o->recompute_attention};
    /* The run's plan (lt_train_plan, as `longtune plan` and the guard compute it). What the caller
     * holds on the device besides the model -- on the host: tokenizer, data set, the CLI's guard;
     * on a GPU: nothing -- is known exactly at this point: what is in use less the model, the
     * optimizer state and the trainer's buffers allocated so far. */
    lt_model_sizes loaded = lt_model_get_sizes(t->m);
    size_t in_use = lt_mem_get_stats(ctx, t->dev).used_bytes;
    size_t known = loaded.bytes[LT_MEM_WEIGHTS] + loaded.bytes[LT_MEM_LORA] + loaded.bytes[LT_MEM_GRADS] +
                   lt_plan_optimizer_bytes(t->dev, t->n) +
                   (t->dev == LT_DEVICE_CPU ? lt_train_buffer_bytes(o, t->B, t->T, t->n_tp, t->cp ? t->world : 1) : 0);
    lt_train_held held = {.caller_bytes = in_use > known ? in_use - known : 0};
    LT_TRY(lt_train_packing_bytes(ctx, &t->popt, t->train, t->valid, &held));
    lt_plan_options popt;
    LT_TRY(lt_train_plan_options(ctx, o, t->cp ? 1 : t->world, t->cp ? t->world : 1, &popt));
    lt_plan plan;
    LT_TRY(lt_train_plan(ctx, o, lt_model_get_config(t->m), &popt, &held, &plan));
    res->plan_bytes = plan.peak_bytes;
    /* A rank holds activations for its share only, as planned: ceil(B / world) rows, or (context
     * parallel) T / world tokens of the one row. */
    if (t->cp) run.T = t->T / t->world;
    else run.B = (t->B + t->world - 1) / t->world;
    LT_TRY(lt_model_prepare(ctx, t->m, &run));
    if (t->dev != LT_DEVICE_CPU && o->grad_accum == 1 && !t->dist && !t->cp) {
        lt_step_optim so = {t->params, t->grads, t->mom_m, t->mom_v, t->n, o->grad_clip};
        LT_TRY(lt_step_graph_init(ctx, t->m, &so, t->B, t->T, strcmp(o->cuda_graph, "off") != 0, &t->sg));
    } else if (t->dev != LT_DEVICE_CPU && strcmp(o->cuda_graph, "off")) {
        LT_INFO("cuda graph: off for this run, steps run eagerly: %s",
                o->grad_accum > 1 ? "gradient accumulation (grad_accum > 1)"
                                  : "several ranks (gradients are reduced during the backward)");
    }

    memset(&t->st, 0, sizeof t->st);
    t->plan_epoch = -1;
    if (o->resume_adapter_file[0]) {
        /* A folder means the checkpoint a run saved into it. */
        char rpath[LT_TRAIN_PATH_MAX + 32];
        struct stat sb;
        snprintf(rpath, sizeof rpath, "%s", o->resume_adapter_file);
        if (stat(rpath, &sb) == 0 && S_ISDIR(sb.st_mode))
            snprintf(rpath, sizeof rpath, "%s/" LT_TRAIN_CHECKPOINT_FILE, o->resume_adapter_file);
        LT_TRY(lt_checkpoint_load(ctx, rpath, o, &t->st, t->tp, t->n_tp));
        LT_TRY(state_from_host(t));
        uint64_t keys[4];
        memcpy(keys, t->st.rng, sizeof keys);
        set_rng_keys(t);
        if (memcmp(keys, t->st.rng, sizeof keys))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: RNG keys {%llu, %llu, %llu} disagree with seed, step and epoch",
                            rpath, (unsigned long long)keys[0], (unsigned long long)keys[1],
                            (unsigned long long)keys[2]);
        LT_INFO("resumed from %s at step %lld", rpath, (long long)t->st.step);
    }
    res->start_step = t->st.step;
    char mpath[LT_TRAIN_PATH_MAX + 32];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", o->adapter_path);
    if (t->rank == 0) LT_TRY(lt_metrics_open(ctx, mpath, o->resume_adapter_file[0] ? t->st.step : -1, &t->metrics));
    if (t->cp)
        LT_INFO("context parallel: rank %d of %d holds %lld of every row's %lld tokens (zig-zag), %s attention",
                t->rank, t->world, (long long)(t->T / t->world), (long long)t->T,
                lt_model_cp_kind(t->m) == LT_CP_ULYSSES ? "Ulysses (all-to-all over heads)" : "ring");
    else if (t->world > 1)
        LT_INFO("data parallel: rank %d of %d trains rows [%lld, %lld) of every micro-batch of %lld", t->rank, t->world,
                (long long)(t->B * t->rank / t->world), (long long)(t->B * (t->rank + 1) / t->world), (long long)t->B);

    double t0 = lt_time_now(), elapsed0 = t->st.elapsed_s, val = NAN;
    if (t->st.step == 0) {
        LT_TRY(evaluate(t, &val));
        res->first_val_loss = res->last_val_loss = val;
        lt_metrics_record r = {0, NAN, val, NAN, NAN, 0, 0, (int64_t)lt_mem_get_stats(ctx, t->dev).peak_bytes,
                               (int64_t)res->plan_bytes, host_peak(t)};
        if (isfinite(val) && t->metrics) LT_TRY(lt_metrics_write(ctx, t->metrics, &r));
    }
    lt_progress pg;
    lt_progress_begin(&pg, progress, "train", o->iters - t->st.step);
    double win_loss = 0, win_t = lt_time_now();
    int64_t win_steps = 0, win_tok = 0;
    while (t->st.step < o->iters) {
        /* Ranks stop together: the flag was summed over the world with the last step's losses. */
        int sig = lt_train_stop_requested();
        if (t->dist) sig = t->stop_world ? (sig ? sig : -2) : 0;
        if (!sig && res->stop_at > 0 && t->st.step >= res->stop_at) sig = -1;
        if (sig) {
            t->st.elapsed_s = elapsed0 + lt_time_now() - t0;
            LT_TRY(save(t));
            lt_progress_end(&pg, "stopped");
            res->steps = t->st.step; /* the checkpoint's step, for the caller's report */
            res->tokens = t->st.tokens_seen;
            return lt_error(ctx, LT_ERR_INTERRUPTED, "stopped (%s %d) at step %lld; checkpoint saved to %s",
                            sig > 0 ? "signal" : sig == -2 ? "stop on another rank" : "stop_at",
                            sig > 0 ? sig : (int)t->st.step, (long long)t->st.step, t->ckpt_path);
        }
        double loss;
        int64_t tok, real;
        double lr = lt_train_lr(o, t->st.step);
        LT_TRY(train_step(t, &loss, &tok, &real));
        int64_t s = t->st.step;
        if (res->step_loss) res->step_loss[s - 1] = loss;
        res->last_train_loss = loss;
        win_loss += loss;
        win_tok += real;
        win_steps++;
        int eval_now = s % o->steps_per_eval == 0 || s == o->iters;
        val = NAN;
        if (eval_now) {
            LT_TRY(evaluate(t, &val));
            if (!isfinite(res->first_val_loss)) res->first_val_loss = val;
            res->last_val_loss = val;
        }
        double now = lt_time_now();
        size_t peak = lt_mem_get_stats(ctx, t->dev).peak_bytes;
        double tps = (double)win_tok / (now - win_t > 0 ? now - win_t : 1e-9);
        if (s % o->steps_per_report == 0 || eval_now) {
            lt_metrics_record r = {s, win_loss / (double)win_steps, val, lr, tps, t->st.tokens_seen,
                                   elapsed0 + now - t0, (int64_t)peak, (int64_t)res->plan_bytes, host_peak(t)};
            if (t->metrics) LT_TRY(lt_metrics_write(ctx, t->metrics, &r));
            if (isfinite(val)) {
                char line[160];
                snprintf(line, sizeof line, "step %lld: train loss %.4f, val loss %.4f", (long long)s,
                         win_loss / (double)win_steps, val);
                lt_progress_println(&pg, line);
            }
            win_loss = 0;
            win_tok = 0;
            win_steps = 0;
            win_t = now;
        }
        char status[160], pb[32];
        snprintf(status, sizeof status, "step %lld loss %.3f lr %.2e %.0f tok/s peak %s", (long long)s, loss, lr, tps,
                 fmt_bytes(peak, pb, sizeof pb));
        lt_progress_update(&pg, s - res->start_step, status);
        if (s % o->save_every == 0 || s == o->iters) {
            t->st.elapsed_s = elapsed0 + lt_time_now() - t0;
            LT_TRY(save(t));
        }
    }
    lt_progress_end(&pg, "done");
    res->steps = t->st.step;
    res->tokens = t->st.tokens_seen;
    res->elapsed_s = lt_time_now() - t0;
    res->peak_bytes = lt_mem_get_stats(ctx, t->dev).peak_bytes;
    res->host_peak_bytes = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes;
    return LT_OK;
}

lt_status lt_train_fit(lt_ctx *ctx, const lt_train_options *opt, lt_model *m, const lt_pack_input *train,
                       const lt_pack_input *valid, FILE *progress, lt_train_result *res) {
    double *step_loss = res->step_loss;
    int64_t stop_at = res->stop_at;
    lt_comm *comm = res->comm;
    memset(res, 0, sizeof *res);
    res->step_loss = step_loss;
    res->stop_at = stop_at;
    res->comm = comm;
    res->first_val_loss = res->last_val_loss = res->last_train_loss = NAN;
    trainer t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    t.o = opt;
    t.m = m;
    t.train = train;
    t.valid = valid;
    t.dev = lt_model_get_device(m);
    t.be = lt_backend_get(t.dev);
    if (!t.be) return lt_error(ctx, LT_ERR_UNSUPPORTED, "the model's device has no backend in this build");
    t.comm = comm;
    t.rank = lt_comm_rank(comm);
    t.world = lt_comm_size(comm);
    t.dist = t.world > 1 || lt_comm_get_backend(comm) == LT_COMM_NCCL;
    /* Gradients are reduced where they live: a host model's over MPI, a CUDA model's over NCCL. */
    if (t.dist && lt_comm_device(comm) != t.dev)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "data parallel: a %s model's gradients cannot be reduced over a %s "
                        "communicator (host models: MPI; CUDA models: NCCL)", t.dev == LT_DEVICE_CPU ? "CPU" : "CUDA",
                        lt_comm_backend_name(lt_comm_get_backend(comm)));
    lt_status s = run(&t, progress, res);
    lt_metrics_close(ctx, t.metrics);
    lt_pack_plan_free(ctx, t.plan);
    lt_pack_plan_free(ctx, t.vplan);
    if (t.ids) lt_free(ctx, LT_DEVICE_CPU, t.ids, t.batch_bytes);
    if (t.red) lt_free(ctx, LT_DEVICE_CPU, t.red, t.red_bytes);
    if (t.cp_ids) lt_free(ctx, LT_DEVICE_CPU, t.cp_ids, t.cp_bytes);
    if (t.reducer) {
        LT_INFO("gradient buckets started during the backward: %lld",
                (long long)lt_comm_reducer_early_buckets(t.reducer));
        lt_comm_reducer_free(ctx, t.reducer);
    }
    if (t.cp) lt_model_set_context_parallel(ctx, m, NULL);
    if (t.sg) {
        lt_step_graph_stats gs = lt_step_graph_get_stats(t.sg);
        LT_INFO("cuda graph: %lld steps replayed, %lld captured, %lld eager", (long long)gs.replays,
                (long long)gs.captures, (long long)gs.eager);
        lt_step_graph_free(ctx, t.sg);
    }
    if (t.tp) lt_free(ctx, LT_DEVICE_CPU, t.tp, (size_t)t.n_tp * sizeof *t.tp);
    if (t.mom_m) lt_free(ctx, t.dev, t.mom_m, (size_t)t.n * sizeof(float));
    if (t.mom_v) lt_free(ctx, t.dev, t.mom_v, (size_t)t.n * sizeof(float));
    if (t.host) lt_free(ctx, LT_DEVICE_CPU, t.host, 3 * (size_t)t.n * sizeof(float));
    return s;
}
