/* The training loop: packed batches → model forward/backward (gradient accumulation) → global-norm
 * clipping → AdamW, all through the model's backend ops (so the optimizer state lives where the
 * model does, host or GPU), with evaluation, metrics, checkpoints and PEFT export on their
 * schedules, and a clean stop on request. Data parallel over a communicator: every rank packs the
 * same global batches and trains its share of their rows (or, context parallel, its share of each
 * row's tokens); gradient buckets are summed over the ranks as the last backward completes them.
 * Nothing allocates inside a step except packing plans, once per epoch; a device run copies the
 * trainable state to a host mirror only to save it. Setup and teardown are train_setup.c's. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "longtune/alloc.h"
#include "longtune/log.h"
#include "train/trainer.h"

/* The model finished a layer's gradients during the step's last backward: hand them to the
 * reducer, which starts every bucket they complete. */
static lt_status grads_ready(void *arg, int64_t offset, int64_t count) {
    lt_trainer *t = arg;
    return lt_comm_reducer_ready(t->ctx, t->reducer, offset, count);
}

/* Mean token loss over the validation batches (NAN without a validation set). */
static lt_status evaluate(lt_trainer *t, double *out) {
    *out = NAN;
    if (!t->valid || t->valid->n_seqs == 0) return LT_OK;
    if (!t->vplan) {
        lt_pack_options v = t->popt;
        v.epoch = 0;
        v.row_len = t->o->max_seq_length; /* the longest stage's rows under a curriculum */
        LT_TRY(lt_pack_plan_build(t->ctx, t->valid, &v, &t->vplan));
    }
    int64_t nb = lt_pack_plan_batches(t->vplan);
    if (t->o->val_batches > 0 && nb > t->o->val_batches) nb = t->o->val_batches;
    double sum = 0;
    int64_t tokens = 0;
    for (int64_t i = 0; i < nb; i++) {
        /* A stop request ends the validation early (one rank alone: every rank must run the
         * same batches, so a distributed run finishes it); the loss is then not reported. */
        if (!t->dist && lt_train_stop_requested()) return LT_OK;
        lt_model_batch b, lb;
        int64_t ntok = 0;
        LT_TRY(lt_trainer_fill(t, t->vplan, t->valid, i, &b, &ntok, NULL));
        if (!ntok) continue;
        /* Context parallel ranks run every step, tokens or not: attention is a collective. */
        int64_t local = 0;
        LT_TRY(lt_trainer_shard(t, &b, &lb, &local));
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

/* AdamW's values for the step about to complete. */
static lt_adamw_params adamw_params(const lt_trainer *t) {
    const lt_train_options *o = t->o;
    return (lt_adamw_params){(float)lt_train_lr(o, t->st.step),
                             (float)o->beta1,
                             (float)o->beta2,
                             (float)o->eps,
                             (float)o->weight_decay,
                             t->st.step + 1};
}

/* Counts a completed step and reports its loss, trained targets and real input tokens. */
static void step_done(lt_trainer *t, double l, int64_t tok, int64_t rtok, double *loss, int64_t *tokens,
                      int64_t *real) {
    t->st.step++;
    t->st.tokens_seen += tok;
    *loss = l;
    *tokens = tok;
    *real = rtok;
}

/* train_step through the step graph (one micro-batch, one rank, a device model): the batch, the
 * loss scale and AdamW's values go in, the loss comes back with the step's only wait. */
static lt_status graph_step(lt_trainer *t, double *loss, int64_t *tokens, int64_t *real) {
    lt_model_batch b;
    int64_t ntok = 0, nreal = 0;
    LT_TRY(lt_trainer_next_batch(t, &b, &ntok, &nreal));
    lt_adamw_params hp = adamw_params(t);
    double l = 0;
    t->step_aux = 0;
    if (ntok) {
        b.step = (uint64_t)(t->st.step * t->o->grad_accum);
        lt_model_result r;
        LT_TRY(lt_step_graph_run(t->ctx, t->sg, &b, (float)(1.0 / (double)ntok), &hp, &r));
        l = r.loss_sum / (double)ntok;
        t->step_aux = r.aux_loss;
        /* AdamW ran inside the graph: a non-finite step is caught after it, and its parameters
         * are never saved (the run stops here). The norm came back with the loss (no wait of
         * its own where the backend clips on the device). */
        double gn = lt_step_graph_grad_norm(t->sg);
        if (!isfinite(l)) t->bad_what = "train_loss", t->bad_value = l;
        else if (!isfinite(gn)) t->bad_what = "grad_norm", t->bad_value = gn;
    } else { /* nothing to train on: zero gradients, the moments still decay (as train_step does) */
        t->be->zero(t->ctx, t->grads, (size_t)t->n * sizeof(float));
        t->be->adamw(t->ctx, t->params, t->grads, t->mom_m, t->mom_v, t->n, &hp);
    }
    step_done(t, l, ntok, nreal, loss, tokens, real);
    return LT_OK;
}

/* The step's grad_accum micro-batches, forward and backward, gradients accumulating. Every rank
 * packs the whole micro-batch, so the trained-token count that scales the mean loss is the global
 * one without communication; each rank runs only its rows. red[k] collects micro-batch k's loss
 * sum and the int64 array after red[grad_accum] its trained targets. */
static lt_status micro_batches(lt_trainer *t, int64_t *tok, int64_t *rtok) {
    const lt_train_options *o = t->o;
    double *lsum = t->red;
    int64_t *ntoks = (int64_t *)(lsum + o->grad_accum + 1);
    memset(lsum, 0, t->red_bytes);
    double aux = 0;
    int64_t n_aux = 0;
    t->step_aux = 0;
    for (int64_t k = 0; k < o->grad_accum; k++) {
        lt_model_batch b, lb;
        int64_t ntok = 0, nreal = 0;
        LT_TRY(lt_trainer_next_batch(t, &b, &ntok, &nreal));
        *rtok += nreal;
        ntoks[k] = ntok;
        if (!ntok) continue;
        /* Dropout masks are a function of the micro-step, so a resumed run draws the same ones. */
        b.step = (uint64_t)(t->st.step * o->grad_accum + k);
        *tok += ntok;
        int64_t local = 0;
        LT_TRY(lt_trainer_shard(t, &b, &lb, &local));
        if (!local && !t->cp) continue;
        lt_model_result r;
        /* The last micro-batch finishes each layer's gradients: reduce them as they come. */
        if (t->reducer && k == o->grad_accum - 1) lt_model_set_grad_ready(t->m, grads_ready, t);
        float scale = (float)(1.0 / ((double)ntok * (double)o->grad_accum));
        lt_status s = lt_model_forward_backward(t->ctx, t->m, &lb, scale, &r, NULL);
        lt_model_set_grad_ready(t->m, NULL, NULL);
        LT_TRY(s);
        lsum[k] = r.loss_sum;
        aux += r.aux_loss, n_aux++;
    }
    if (n_aux) t->step_aux = aux / (double)n_aux; /* this rank's micro-batches */
    return LT_OK;
}

/* Over the world: the gradient buckets the backward did not start, then the loss sums with the
 * stop flag in red[grad_accum], so all ranks agree on the loss and on stopping. */
static lt_status reduce_step(lt_trainer *t) {
    int64_t ga = t->o->grad_accum;
    /* Buckets the backward completed are in flight already; the rest start now (all ranks issue
     * them in the same order, see lt_comm_reducer_ready). */
    LT_TRY(lt_comm_reducer_finish(t->ctx, t->reducer));
    t->red[ga] = lt_train_stop_requested() ? 1 : 0;
    LT_TRY(lt_comm_allreduce_sum_host(t->ctx, t->comm, t->red, ga + 1, LT_COMM_F64));
    t->stop_world = t->red[ga] > 0;
    return LT_OK;
}

/* Global L2 norm clipping of the gradients (whose norm is `norm`) to grad_clip (when set). */
static void clip(lt_trainer *t, double norm) {
    double c = t->o->grad_clip;
    if (c > 0 && t->be->clip_norm) {
        t->be->clip_norm(t->ctx, t->grads, t->n, c, NULL); /* decided on the device */
    } else if (c > 0) {
        if (norm > c) t->be->scale(t->ctx, t->grads, (float)(c / norm), t->n);
    }
}

/* One optimizer step: grad_accum micro-batches, clipping, AdamW. *loss: mean over micro-batches
 * of their token-mean loss; *tokens: trained targets; *real: real (non-padding) input tokens. */
static lt_status train_step(lt_trainer *t, double *loss, int64_t *tokens, int64_t *real) {
    const lt_train_options *o = t->o;
    if (t->sg) return graph_step(t, loss, tokens, real);
    t->be->zero(t->ctx, t->grads, (size_t)t->n * sizeof(float));
    int64_t tok = 0, rtok = 0;
    LT_TRY(micro_batches(t, &tok, &rtok));
    if (t->dist) LT_TRY(reduce_step(t));
    const double *lsum = t->red;
    const int64_t *ntoks = (const int64_t *)(lsum + o->grad_accum + 1);
    double l = 0;
    for (int64_t k = 0; k < o->grad_accum; k++)
        if (ntoks[k]) l += lsum[k] / (double)ntoks[k] / (double)o->grad_accum;
    /* A non-finite loss or gradient norm stops the run before AdamW touches the parameters (the
     * step waited for its loss already; the norm is one more reduction over the LoRA gradients). */
    double norm = sqrt((double)t->be->sumsq(t->ctx, t->grads, t->n));
    if (!isfinite(l) || !isfinite(norm)) {
        t->bad_what = !isfinite(l) ? "train_loss" : "grad_norm";
        t->bad_value = !isfinite(l) ? l : norm;
        *loss = l;
        *tokens = tok;
        *real = rtok;
        return LT_OK;
    }
    clip(t, norm);
    lt_adamw_params hp = adamw_params(t);
    t->be->adamw(t->ctx, t->params, t->grads, t->mom_m, t->mom_v, t->n, &hp);
    step_done(t, l, tok, rtok, loss, tokens, real);
    return LT_OK;
}

/* Device runs: the state into the host mirror before a save. */
static lt_status state_to_host(lt_trainer *t) {
    if (!t->host) return LT_OK;
    size_t nb = (size_t)t->n * sizeof(float);
    LT_TRY(lt_model_lora_get(t->ctx, t->m, 0, 0, t->n, t->host));
    LT_TRY(t->be->copy_to_host(t->ctx, t->host + t->n, t->mom_m, nb));
    return t->be->copy_to_host(t->ctx, t->host + 2 * t->n, t->mom_v, nb);
}

/* Checkpoint and adapter. Rank 0 writes (all ranks hold the same parameters); the others learn
 * whether it succeeded, so a failed save stops every rank instead of leaving them waiting in the
 * next collective. */
static lt_status save(lt_trainer *t) {
    t->st.elapsed_s = t->elapsed0 + lt_time_now() - t->t0;
    lt_trainer_set_rng_keys(t);
    /* Non-finite parameters never replace the last good checkpoint and adapter. */
    double pn = (double)t->be->sumsq(t->ctx, t->params, t->n);
    if (!isfinite(pn))
        return lt_error(t->ctx, LT_ERR_DIVERGED,
                        "the LoRA parameters are not finite after step %lld: nothing saved; the last good "
                        "checkpoint and adapter in %s are kept",
                        (long long)t->st.step, t->o->adapter_path);
    lt_status s = LT_OK;
    if (t->rank == 0) {
        s = state_to_host(t);
        if (s == LT_OK) s = lt_checkpoint_save(t->ctx, t->ckpt_path, t->o, &t->st, t->tp, t->n_tp);
        if (s == LT_OK) s = lt_peft_save_named(t->ctx, t->o->adapter_path, t->base_name, t->o, t->tp, t->n_tp, t->m);
        if (s == LT_OK) {
            char rec[LT_TRAIN_PATH_MAX + 32];
            snprintf(rec, sizeof rec, "%s/" LT_TRAIN_DIVERGED_FILE, t->o->adapter_path);
            (void)unlink(rec); /* a record of an earlier divergence no longer describes the folder */
            snprintf(rec, sizeof rec, "%s/aborted_memory_ceiling.json", t->o->adapter_path);
            (void)unlink(rec); /* nor one of an earlier stop at the memory ceiling */
        }
    }
    if (s == LT_OK) t->saved_step = t->st.step;
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
static int64_t host_peak(const lt_trainer *t) {
    return t->dev == LT_DEVICE_CPU ? 0 : (int64_t)lt_mem_get_stats(t->ctx, LT_DEVICE_CPU).peak_bytes;
}

/* The report window: the steps since the last metrics line, their summed loss and real tokens. */
typedef struct window {
    double loss, since;
    int64_t steps, tok;
    double aux; /* summed MoE aux losses of the steps */
} window;

/* A stop before the next step: a signal here, one on another rank (the flag was summed over the
 * world with the last step's losses, so ranks stop together), or res->stop_at reached. Returns the
 * signal, -2 for another rank's, -1 for stop_at, 0 to go on. */
static int stop_reason(const lt_trainer *t, const lt_train_result *res) {
    int sig = lt_train_stop_requested();
    if (t->dist) sig = t->stop_world ? (sig ? sig : -2) : 0;
    if (!sig && res->stop_at > 0 && t->st.step >= res->stop_at) sig = -1;
    return sig;
}

/* Saves a checkpoint and returns LT_ERR_INTERRUPTED naming the reason and the path. */
static lt_status stop(lt_trainer *t, lt_progress *pg, int sig, lt_train_result *res) {
    LT_TRY(save(t));
    lt_progress_end(pg, "stopped");
    res->steps = t->st.step; /* the checkpoint's step, for the caller's report */
    res->tokens = t->st.tokens_seen;
    return lt_error(t->ctx, LT_ERR_INTERRUPTED, "stopped (%s %d) at step %lld; checkpoint saved to %s",
                    sig > 0         ? "signal"
                        : sig == -2 ? "stop on another rank"
                                    : "stop_at",
                    sig > 0 ? sig : (int)t->st.step, (long long)t->st.step, t->ckpt_path);
}

/* Validation before the first step of a fresh run, recorded as step 0. */
static lt_status first_eval(lt_trainer *t, lt_train_result *res) {
    double val;
    LT_TRY(evaluate(t, &val));
    res->first_val_loss = res->last_val_loss = val;
    lt_metrics_record r = {0,
                           NAN,
                           val,
                           NAN,
                           NAN,
                           0,
                           0,
                           (int64_t)lt_mem_get_stats(t->ctx, t->dev).peak_bytes,
                           (int64_t)res->plan_bytes,
                           host_peak(t),
                           0,
                           0,
                           0,
                           0};
    if (isfinite(val) && t->metrics) LT_TRY(lt_metrics_write(t->ctx, t->metrics, &r));
    return LT_OK;
}

/* The metrics line of the window ending at step s (and its loss line when validation ran), then
 * a new window. */
static lt_status report(lt_trainer *t, lt_progress *pg, window *w, double val, double lr, double tps, double now,
                        size_t peak, const lt_train_result *res) {
    int64_t s = t->st.step;
    lt_metrics_record r = {s,
                           w->loss / (double)w->steps,
                           val,
                           lr,
                           tps,
                           t->st.tokens_seen,
                           t->elapsed0 + now - t->t0,
                           (int64_t)peak,
                           (int64_t)res->plan_bytes,
                           host_peak(t),
                           0,
                           0,
                           1,
                           w->aux / (double)w->steps};
    if (t->o->n_stages > 0) {
        r.seq_len = lt_train_seq_len_at(t->o, s - 1);
        for (int k = 0; k < t->o->n_stages; k++)
            if (s - 1 >= t->o->stage_step[k]) r.stage = k + 1;
    }
    if (t->metrics) LT_TRY(lt_metrics_write(t->ctx, t->metrics, &r));
    if (isfinite(val)) {
        char line[200], aux[48] = "";
        if (r.aux_loss > 0) snprintf(aux, sizeof aux, " (aux loss %.4f)", r.aux_loss);
        snprintf(line, sizeof line, "step %lld: train loss %.4f%s, val loss %.4f", (long long)s,
                 w->loss / (double)w->steps, aux, val);
        lt_progress_println(pg, line);
    }
    *w = (window){0, now, 0, 0, 0};
    return LT_OK;
}

/* After step s (loss `loss` at learning rate lr): validation, the metrics line and the checkpoint
 * when their schedules say so, and the status line. */
static lt_status after_step(lt_trainer *t, lt_progress *pg, window *w, double loss, double lr, lt_train_result *res) {
    const lt_train_options *o = t->o;
    int64_t s = t->st.step;
    int eval_now = s % o->steps_per_eval == 0 || s == o->iters;
    double val = NAN;
    if (eval_now) {
        LT_TRY(evaluate(t, &val));
        if (!isfinite(res->first_val_loss)) res->first_val_loss = val;
        res->last_val_loss = val;
    }
    double now = lt_time_now();
    size_t peak = lt_mem_get_stats(t->ctx, t->dev).peak_bytes;
    double tps = (double)w->tok / (now - w->since > 0 ? now - w->since : 1e-9);
    if (s % o->steps_per_report == 0 || eval_now) LT_TRY(report(t, pg, w, val, lr, tps, now, peak, res));
    char status[200], pb[32], aux[32] = "";
    if (t->step_aux > 0) snprintf(aux, sizeof aux, " aux %.3f", t->step_aux);
    snprintf(status, sizeof status, "step %lld loss %.3f%s lr %.2e %.0f tok/s peak %s", (long long)s, loss, aux, lr,
             tps, fmt_bytes(peak, pb, sizeof pb));
    lt_progress_update(pg, s - res->start_step, status);
    if (s % o->save_every == 0 || s == o->iters) LT_TRY(save(t));
    return LT_OK;
}

static const char *nonfinite_text(double v) { return isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

/* The divergence record beside the adapter: what went non-finite at which step, and the last good
 * checkpoint kept (written atomically, as the memory guard's artifact). */
static lt_status write_divergence(lt_trainer *t, int64_t step, const char *what, double v) {
    char path[LT_TRAIN_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/" LT_TRAIN_DIVERGED_FILE, t->o->adapter_path);
    cJSON *o = cJSON_CreateObject();
    if (!o) return lt_error(t->ctx, LT_ERR_OOM, "divergence record: out of memory");
    cJSON_AddStringToObject(o, "status", "diverged");
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddStringToObject(o, "quantity", what);
    cJSON_AddStringToObject(o, "value", nonfinite_text(v));
    cJSON_AddNumberToObject(o, "learning_rate", lt_train_lr(t->o, step - 1));
    if (t->saved_step >= 0) {
        cJSON_AddNumberToObject(o, "last_good_step", (double)t->saved_step);
        cJSON_AddStringToObject(o, "checkpoint", t->ckpt_path);
    } else {
        cJSON_AddNullToObject(o, "last_good_step");
        cJSON_AddNullToObject(o, "checkpoint");
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return lt_error(t->ctx, LT_ERR_OOM, "divergence record: out of memory");
    lt_atomic_file af;
    lt_status s = lt_atomic_open(t->ctx, &af, path);
    if (s == LT_OK) s = lt_atomic_write(t->ctx, &af, text, strlen(text));
    if (s == LT_OK) s = lt_atomic_write(t->ctx, &af, "\n", 1);
    if (s == LT_OK) s = lt_atomic_commit(t->ctx, &af);
    else lt_atomic_abort(&af);
    cJSON_free(text);
    return s;
}

/* Step `step` produced a non-finite t->bad_what: its metrics line (the value as null with a
 * flag), the divergence record, and LT_ERR_DIVERGED. Nothing is saved. */
static lt_status diverged(lt_trainer *t, lt_progress *pg, int64_t step, double loss, double lr, lt_train_result *res) {
    lt_metrics_record r = {step,
                           loss,
                           NAN,
                           lr,
                           NAN,
                           t->st.tokens_seen,
                           t->elapsed0 + lt_time_now() - t->t0,
                           (int64_t)lt_mem_get_stats(t->ctx, t->dev).peak_bytes,
                           (int64_t)res->plan_bytes,
                           host_peak(t),
                           lt_train_seq_len_at(t->o, step - 1),
                           0,
                           1,
                           t->step_aux};
    if (t->o->n_stages == 0) r.seq_len = 0;
    for (int k = 0; k < t->o->n_stages; k++)
        if (step - 1 >= t->o->stage_step[k]) r.stage = k + 1;
    if (t->metrics && t->rank == 0) LT_TRY(lt_metrics_write(t->ctx, t->metrics, &r));
    if (t->rank == 0) LT_TRY(write_divergence(t, step, t->bad_what, t->bad_value));
    lt_progress_end(pg, "diverged");
    res->steps = t->saved_step >= 0 ? t->saved_step : 0;
    res->tokens = t->st.tokens_seen;
    char kept[LT_TRAIN_PATH_MAX + 96];
    if (t->saved_step >= 0)
        snprintf(kept, sizeof kept, "the checkpoint and adapter of step %lld in %s are kept", (long long)t->saved_step,
                 t->o->adapter_path);
    else snprintf(kept, sizeof kept, "no adapter was saved");
    return lt_error(t->ctx, LT_ERR_DIVERGED,
                    "training diverged at step %lld: %s is %s (learning rate %g); %s; see %s/%s", (long long)step,
                    t->bad_what, nonfinite_text(t->bad_value), lr, kept, t->o->adapter_path, LT_TRAIN_DIVERGED_FILE);
}

static lt_status run_loop(lt_trainer *t, FILE *progress, lt_train_result *res);

/* The steps from the resumed (or first) one to iters, or to a stop. */
static lt_status run_steps(lt_trainer *t, FILE *progress, lt_train_result *res) {
    t->t0 = lt_time_now();
    t->elapsed0 = t->st.elapsed_s;
    t->saved_step = t->st.step > 0 ? t->st.step : -1; /* a resumed run starts from its checkpoint */
    lt_train_set_stop_saves(1);
    lt_status s = run_loop(t, progress, res);
    lt_train_set_stop_saves(0);
    return s;
}

static lt_status run_loop(lt_trainer *t, FILE *progress, lt_train_result *res) {
    const lt_train_options *o = t->o;
    if (t->st.step == 0) LT_TRY(first_eval(t, res));
    lt_progress pg;
    lt_progress_begin(&pg, progress, "train", o->iters - t->st.step);
    window w = {0, lt_time_now(), 0, 0, 0};
    while (t->st.step < o->iters) {
        int sig = stop_reason(t, res);
        if (sig) return stop(t, &pg, sig, res);
        double loss;
        int64_t tok, real;
        double lr = lt_train_lr(o, t->st.step);
        int64_t step = t->st.step + 1;
        LT_TRY(train_step(t, &loss, &tok, &real));
        if (t->bad_what) return diverged(t, &pg, step, loss, lr, res);
        if (res->step_loss) res->step_loss[t->st.step - 1] = loss;
        res->last_train_loss = loss;
        w.loss += loss;
        w.tok += real;
        w.aux += t->step_aux;
        w.steps++;
        LT_TRY(after_step(t, &pg, &w, loss, lr, res));
    }
    lt_progress_end(&pg, "done");
    res->steps = t->st.step;
    res->tokens = t->st.tokens_seen;
    res->elapsed_s = lt_time_now() - t->t0;
    res->peak_bytes = lt_mem_get_stats(t->ctx, t->dev).peak_bytes;
    res->host_peak_bytes = lt_mem_get_stats(t->ctx, LT_DEVICE_CPU).peak_bytes;
    return LT_OK;
}

lt_status lt_train_fit(lt_ctx *ctx, const lt_train_options *opt, lt_model *m, const lt_pack_input *train,
                       const lt_pack_input *valid, FILE *progress, lt_train_result *res) {
    return lt_train_fit_loaded(ctx, opt, m, train, valid, 0, progress, res);
}

lt_status lt_train_fit_loaded(lt_ctx *ctx, const lt_train_options *opt, lt_model *m, const lt_pack_input *train,
                              const lt_pack_input *valid, size_t load_peak, FILE *progress, lt_train_result *res) {
    double *step_loss = res->step_loss;
    int64_t stop_at = res->stop_at;
    lt_comm *comm = res->comm;
    memset(res, 0, sizeof *res);
    res->step_loss = step_loss;
    res->stop_at = stop_at;
    res->comm = comm;
    res->first_val_loss = res->last_val_loss = res->last_train_loss = NAN;
    if (opt->recompute_auto)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "recompute auto is chosen before the run: pass the options through "
                        "lt_train_choose_recompute with the memory budget first");
    lt_trainer t;
    memset(&t, 0, sizeof t);
    LT_TRY(lt_trainer_init(&t, ctx, opt, m, train, valid, comm));
    t.load_peak = load_peak;
    lt_status s = lt_trainer_setup(&t, res);
    if (s == LT_OK) s = run_steps(&t, progress, res);
    lt_trainer_free(&t);
    return s;
}
