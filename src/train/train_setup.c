/* Everything before the first step of a run. lt_train_run loads the tokenizer, the dataset folder
 * (train and valid splits) and the model, then calls lt_train_fit; the trainer's setup binds the
 * LoRA parameters and AdamW moments, allocates the batch buffers, the gradient reducer and the
 * context-parallel share, computes the run's plan, prepares the model (and the step graph),
 * resumes a checkpoint and opens the metrics log; lt_trainer_free undoes it. No steps run here
 * (train_loop.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "longtune/alloc.h"
#include "longtune/context_parallel.h"
#include "longtune/dataset.h"
#include "longtune/log.h"
#include "longtune/plan.h"
#include "train/trainer.h"

#define PEFT_KEY_PREFIX "base_model.model."

static void log_split(const char *name, const lt_dataset *ds) {
    lt_dataset_stats s = lt_dataset_get_stats(ds);
    LT_INFO("%s: %lld records, %lld tokens (%lld supervised), %lld..%lld tokens per record%s%s", name,
            (long long)s.records, (long long)s.tokens, (long long)s.supervised, (long long)s.min_len,
            (long long)s.max_len, s.chat_format != LT_CHAT_NONE ? ", chat template " : "",
            s.chat_format != LT_CHAT_NONE ? lt_chat_format_name(s.chat_format) : "");
}

/* --chat-template: a format name, else a file holding a Jinja template recognised as one. */
static lt_status chat_template_option(lt_ctx *ctx, const char *arg, lt_chat_format *out) {
    if (lt_chat_format_parse(ctx, arg, out) == LT_OK) return LT_OK;
    char name_err[512];
    snprintf(name_err, sizeof name_err, "%s", lt_ctx_error(ctx));
    FILE *f = fopen(arg, "rb");
    if (!f) return lt_error(ctx, LT_ERR_INVALID_ARG, "--chat-template %s: no such file, and %s", arg, name_err);
    char *text = malloc((size_t)1 << 20); /* transient: a template is a few KB */
    size_t n = text ? fread(text, 1, ((size_t)1 << 20) - 1, f) : 0;
    int big = text && !feof(f);
    fclose(f);
    if (!text) return lt_error(ctx, LT_ERR_OOM, "--chat-template %s: read buffer", arg);
    text[n] = 0;
    lt_status s = big ? lt_error(ctx, LT_ERR_FORMAT, "--chat-template %s: larger than 1 MiB", arg)
                      : lt_chat_detect(ctx, text, out);
    free(text);
    if (s != LT_OK && !big) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", lt_ctx_error(ctx));
        s = lt_error(ctx, s, "--chat-template %s: %s", arg, msg);
    }
    return s;
}

/* train --test: the test split, read and evaluated as the validation split is. */
static lt_status test_split(lt_ctx *ctx, const lt_train_options *opt, const lt_tokenizer *tok,
                            const lt_dataset_options *dopt, lt_model *m, lt_train_result *res) {
    lt_dataset *test = NULL;
    LT_TRY(lt_dataset_load_split(ctx, opt->data, "test", tok, dopt, &test));
    log_split("test", test);
    lt_pack_input in = lt_dataset_input(test);
    lt_eval_result ev;
    lt_status s = lt_train_evaluate(ctx, opt, m, &in, opt->test_batches, &ev);
    if (s == LT_OK) {
        res->test_loss = ev.mean_loss;
        res->test_tokens = ev.n_tokens;
        LT_INFO("Test loss %.3f, Test ppl %.3f (%lld tokens)", ev.mean_loss, ev.ppl, (long long)ev.n_tokens);
    }
    lt_dataset_free(ctx, test);
    return s;
}

lt_status lt_train_run(lt_ctx *ctx, const lt_train_options *opt, FILE *progress, lt_train_result *res) {
    lt_tokenizer *tok = NULL;
    lt_dataset *train = NULL, *valid = NULL;
    lt_model *m = NULL;
    lt_status s;
    lt_model_options mo;
    LT_TRY(lt_train_model_options(ctx, opt, &mo));
    if (mo.quantize_dtype == LT_DTYPE_FP8 && opt->device == LT_DEVICE_CPU)
        LT_WARN("--base-dtype fp8 on the CPU emulates the FP8 products (the reference for the CUDA ones): "
                "slower than the file's dtypes here; it is for Hopper GPUs' FP8 tensor cores");
    if (opt->threads > 0) lt_ctx_set_threads(ctx, opt->threads);
    LT_TRY(lt_model_device_available(ctx, opt->device)); /* before tokenising a whole data set */
    if (!opt->resume_adapter_file[0] && !opt->overwrite) {
        char ap[LT_TRAIN_PATH_MAX + 32];
        struct stat sb;
        snprintf(ap, sizeof ap, "%s/adapter_model.safetensors", opt->adapter_path);
        if (stat(ap, &sb) == 0)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "%s already holds an adapter (adapter_model.safetensors): --overwrite replaces it, "
                            "--resume-adapter-file %s continues its run",
                            opt->adapter_path, opt->adapter_path);
    }
    if ((s = lt_tokenizer_load(ctx, opt->model, &tok)) != LT_OK) goto done;
    lt_dataset_options dopt;
    memset(&dopt, 0, sizeof dopt);
    dopt.mask_prompt = opt->mask_prompt;
    if (opt->chat_template[0] && (s = chat_template_option(ctx, opt->chat_template, &dopt.chat_format)) != LT_OK)
        goto done;
    if ((s = lt_dataset_load_split(ctx, opt->data, "train", tok, &dopt, &train)) != LT_OK) goto done;
    log_split("train", train);
    s = lt_dataset_load_split(ctx, opt->data, "valid", tok, &dopt, &valid);
    if (s == LT_ERR_NOT_FOUND) {
        LT_WARN("%s has no valid.jsonl: no validation loss", opt->data);
        lt_ctx_clear_error(ctx);
        valid = NULL;
    } else if (s != LT_OK) {
        goto done;
    } else {
        log_split("valid", valid);
    }
    /* The host high-water so far: the data's loading, before the model allocates anything. */
    const size_t load_peak = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes;
    lt_lora_options lora;
    if ((s = lt_train_lora_options(ctx, opt, &lora)) != LT_OK) goto done;
    if ((s = lt_model_load(ctx, opt->model, &mo, &lora, &m)) != LT_OK) goto done;
    lt_rope_override rope = lt_train_rope_override(opt);
    if ((s = lt_model_set_rope(ctx, m, &rope)) != LT_OK) goto done;
    const lt_model_config *cfg = lt_model_get_config(m);
    lt_model_sizes sz = lt_model_get_sizes(m);
    char held[160]; /* q's dtype, then each projection held otherwise (layer 0's: --fp8-skip, _K_M files) */
    size_t u = (size_t)snprintf(held, sizeof held, "%s", lt_dtype_name(cfg->proj_dtype[LT_PROJ_Q]));
    for (int p = 1, n = 0; p < LT_PROJ_COUNT_ && u < sizeof held; p++)
        if (cfg->proj_dtype[p] != cfg->proj_dtype[LT_PROJ_Q])
            u += (size_t)snprintf(held + u, sizeof held - u, "%s%s %s", n++ ? ", " : " (", lt_proj_name((lt_proj)p),
                                  lt_dtype_name(cfg->proj_dtype[p]));
    if (strchr(held, '(') && u < sizeof held - 1) held[u] = ')', held[u + 1] = 0;
    LT_INFO("model: %lld layers, width %lld, vocab %lld, projections %s; LoRA r=%lld on %lld layers: %lld parameters",
            (long long)cfg->L, (long long)cfg->C, (long long)cfg->V, held, (long long)opt->lora_rank,
            (long long)(opt->num_layers > 0 && opt->num_layers < cfg->L ? opt->num_layers : cfg->L),
            (long long)sz.n_lora_params);
    lt_pack_input tin = lt_dataset_input(train), vin;
    if (valid) vin = lt_dataset_input(valid);
    s = lt_train_fit_loaded(ctx, opt, m, &tin, valid ? &vin : NULL, load_peak, progress, res);
    res->test_loss = NAN;
    if (s == LT_OK && opt->test) s = test_split(ctx, opt, tok, &dopt, m, res);
done:
    if (m) lt_model_free(ctx, m);
    if (valid) lt_dataset_free(ctx, valid);
    if (train) lt_dataset_free(ctx, train);
    if (tok) lt_tokenizer_free(tok);
    return s;
}

lt_status lt_train_lora_options(lt_ctx *ctx, const lt_train_options *opt, lt_lora_options *out) {
    memset(out, 0, sizeof *out);
    /* the default list: the model's default (its MoE layers' experts take no LoRA) */
    for (const char *p = lt_train_targets_defaulted(opt) ? "" : opt->lora_targets; *p;) {
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
        if (len == strlen("experts.gate_up_proj") && !strncmp(p, "experts.gate_up_proj", len))
            out->targets |= LT_LORA_EXPERTS_GATE_UP, found = 1;
        if (len == strlen("experts.down_proj") && !strncmp(p, "experts.down_proj", len))
            out->targets |= LT_LORA_EXPERTS_DOWN, found = 1;
        if (!found)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "lora target '%.*s' is not a projection (resolve the options first)", (int)len, p);
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
static lt_status bind_params(lt_trainer *t) {
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

static lt_status state_from_host(lt_trainer *t) {
    if (!t->host) return LT_OK;
    size_t nb = (size_t)t->n * sizeof(float);
    LT_TRY(lt_model_lora_set(t->ctx, t->m, 0, t->n, t->host));
    LT_TRY(t->be->copy_to_device(t->ctx, t->mom_m, t->host + t->n, nb));
    return t->be->copy_to_device(t->ctx, t->mom_v, t->host + 2 * t->n, nb);
}

static lt_status alloc_batch(lt_trainer *t) {
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

/* Packing options: rows of max_seq_length, the algorithm, and for context parallel one row split
 * into 2·world equal chunks (which needs batch_size 1 and no_pack). */
static lt_status setup_packing(lt_trainer *t) {
    lt_ctx *ctx = t->ctx;
    const lt_train_options *o = t->o;
    if (o->context_parallel && (t->world > 1 || (t->comm && lt_cp_env_forced()))) {
        if (o->batch_size != 1 || !o->no_pack || o->max_seq_length % (2 * t->world))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "context parallel over %d ranks needs batch_size 1, no_pack and max_seq_length a multiple "
                            "of %d (got %lld, %s, %lld)",
                            t->world, 2 * t->world, (long long)o->batch_size, o->no_pack ? "no_pack" : "packing",
                            (long long)o->max_seq_length);
        t->cp = 1;
    }
    if (o->n_stages > 0) {
        /* The curriculum may not outgrow the model's context: max_position_embeddings, or the
         * original context times the RoPE scaling factor where that is longer. */
        const lt_model_config *c = lt_model_get_config(t->m);
        double ctx_len = (double)c->max_positions;
        if (c->rope_scaling != LT_ROPE_SCALING_NONE && c->rope_original_ctx > 0 && c->rope_factor > 0 &&
            (double)c->rope_original_ctx * c->rope_factor > ctx_len)
            ctx_len = (double)c->rope_original_ctx * c->rope_factor;
        if (ctx_len > 0 && (double)o->max_seq_length > ctx_len)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'seq_len_curriculum': its longest stage (%lld tokens) exceeds the model's "
                            "context of %.0f tokens (extend it with RoPE scaling first)",
                            (long long)o->max_seq_length, ctx_len);
    }
    LT_TRY(lt_train_pack_options(ctx, o, t->cp ? t->world : 1, &t->popt));
    LT_TRY(lt_pack_input_check(ctx, t->train));
    if (t->valid) LT_TRY(lt_pack_input_check(ctx, t->valid));
    return LT_OK;
}

/* Gradient buckets of whole layers where possible (about 4 MiB); LONGTUNE_DP_BUCKET (elements)
 * overrides it, for tests that want many small buckets. */
static lt_status setup_reducer(lt_trainer *t) {
    int64_t layers = 0, prev = -1, bucket = 0;
    for (int64_t i = 0; i < lt_model_lora_count(t->m); i++) {
        lt_lora_tensor lt;
        LT_TRY(lt_model_lora_tensor(t->ctx, t->m, i, &lt));
        layers += lt.layer != prev;
        prev = lt.layer;
    }
    int64_t per = layers > 0 ? t->n / layers : 0;
    const char *env = getenv("LONGTUNE_DP_BUCKET");
    if (env && atoll(env) > 0) bucket = atoll(env);
    else if (per > 0) bucket = per * ((1 << 20) / per > 0 ? (1 << 20) / per : 1);
    return lt_comm_reducer_init(t->ctx, t->comm, t->grads, t->n, bucket, &t->reducer);
}

/* This rank's tokens, targets and positions of the one row, and the model's ring/Ulysses attention. */
static lt_status setup_context_parallel(lt_trainer *t) {
    int64_t Tl = t->T / t->world;
    t->cp_bytes = (size_t)(3 * Tl) * sizeof(int32_t);
    t->cp_ids = lt_alloc(t->ctx, LT_DEVICE_CPU, t->cp_bytes, "context-parallel row share");
    if (!t->cp_ids) return LT_ERR_OOM;
    t->cp_tgt = t->cp_ids + Tl;
    t->cp_pos = t->cp_ids + 2 * Tl;
    return lt_model_set_context_parallel(t->ctx, t->m, t->comm);
}

/* Batch buffers, the step's loss sums, the reducer and the context-parallel share. */
static lt_status setup_buffers(lt_trainer *t) {
    const lt_train_options *o = t->o;
    t->B = o->batch_size;
    t->T = o->max_seq_length;
    LT_TRY(alloc_batch(t));
    t->red_bytes = (size_t)(o->grad_accum + 1) * (sizeof(double) + sizeof(int64_t));
    t->red = lt_alloc(t->ctx, LT_DEVICE_CPU, t->red_bytes, "step loss sums");
    if (!t->red) return LT_ERR_OOM;
    if (t->dist) LT_TRY(setup_reducer(t));
    if (t->cp) LT_TRY(setup_context_parallel(t));
    return LT_OK;
}

/* The run's plan (lt_train_plan, as `longtune plan` and the guard compute it). What the caller
 * holds on the device besides the model -- on the host: tokenizer, data set, the CLI's guard; on a
 * GPU: nothing -- is known exactly at this point: what is in use less the model, the optimizer
 * state and the trainer's buffers allocated so far. */
static lt_status compute_plan(lt_trainer *t, lt_train_result *res) {
    const lt_train_options *o = t->o;
    lt_model_sizes loaded = lt_model_get_sizes(t->m);
    size_t in_use = lt_mem_get_stats(t->ctx, t->dev).used_bytes;
    size_t known = loaded.bytes[LT_MEM_WEIGHTS] + loaded.bytes[LT_MEM_LORA] + loaded.bytes[LT_MEM_GRADS] +
        lt_plan_optimizer_bytes(t->dev, t->n) +
        (t->dev == LT_DEVICE_CPU ? lt_train_buffer_bytes(o, t->B, t->T, t->n_tp, t->cp ? t->world : 1) : 0);
    lt_train_held held = {.caller_bytes = in_use > known ? in_use - known : 0,
                          .load_peak_bytes = t->dev == LT_DEVICE_CPU ? t->load_peak : 0};
    LT_TRY(lt_train_packing_bytes(t->ctx, o, &t->popt, t->train, t->valid, &held));
    lt_plan_options popt;
    LT_TRY(lt_train_plan_options(t->ctx, o, t->cp ? 1 : t->world, t->cp ? t->world : 1, &popt));
    lt_plan plan;
    LT_TRY(lt_train_plan(t->ctx, o, lt_model_get_config(t->m), &popt, &held, &plan));
    res->plan_bytes = plan.peak_bytes;
    return LT_OK;
}

/* Prepares the model for this rank's share, as planned: ceil(B / world) rows, or (context
 * parallel) T / world tokens of the one row; then the step graph of a device run that can use it. */
static lt_status prepare_model(lt_trainer *t, lt_model_run_options run) {
    const lt_train_options *o = t->o;
    if (t->cp) run.T = t->T / t->world;
    else run.B = (t->B + t->world - 1) / t->world;
    LT_TRY(lt_model_prepare(t->ctx, t->m, &run));
    if (t->dev != LT_DEVICE_CPU && o->grad_accum == 1 && !t->dist && !t->cp) {
        lt_step_optim so = {t->params, t->grads, t->mom_m, t->mom_v, t->n, o->grad_clip};
        LT_TRY(lt_step_graph_init(t->ctx, t->m, &so, t->B, t->T, strcmp(o->cuda_graph, "off") != 0, &t->sg));
    } else if (t->dev != LT_DEVICE_CPU && strcmp(o->cuda_graph, "off")) {
        LT_INFO("cuda graph: off for this run, steps run eagerly: %s",
                o->grad_accum > 1 ? "gradient accumulation (grad_accum > 1)"
                                  : "several ranks (gradients are reduced during the backward)");
    }
    return LT_OK;
}

void lt_trainer_set_rng_keys(lt_trainer *t) {
    t->st.rng[0] = t->o->seed;
    t->st.rng[1] = (uint64_t)(t->st.step * t->o->grad_accum);
    t->st.rng[2] = (uint64_t)t->st.data_epoch;
    t->st.rng[3] = 0;
}

/* The checkpoint of resume_adapter_file (a folder means the checkpoint a run saved into it): state,
 * parameters and moments, with its RNG keys checked against seed, step and epoch. */
static lt_status resume(lt_trainer *t) {
    lt_ctx *ctx = t->ctx;
    const lt_train_options *o = t->o;
    char rpath[LT_TRAIN_PATH_MAX + 32];
    struct stat sb;
    snprintf(rpath, sizeof rpath, "%s", o->resume_adapter_file);
    if (stat(rpath, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(rpath, sizeof rpath, "%s/" LT_TRAIN_CHECKPOINT_FILE, o->resume_adapter_file);
    LT_TRY(lt_checkpoint_load(ctx, rpath, o, &t->st, t->tp, t->n_tp));
    LT_TRY(state_from_host(t));
    uint64_t keys[4];
    memcpy(keys, t->st.rng, sizeof keys);
    lt_trainer_set_rng_keys(t);
    if (memcmp(keys, t->st.rng, sizeof keys))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: RNG keys {%llu, %llu, %llu} disagree with seed, step and epoch", rpath,
                        (unsigned long long)keys[0], (unsigned long long)keys[1], (unsigned long long)keys[2]);
    LT_INFO("resumed from %s at step %lld", rpath, (long long)t->st.step);
    return LT_OK;
}

/* How the run is spread over the world, when it is. */
static void log_layout(const lt_trainer *t) {
    if (t->cp)
        LT_INFO("context parallel: rank %d of %d holds %lld of every row's %lld tokens (zig-zag), %s attention",
                t->rank, t->world, (long long)(t->T / t->world), (long long)t->T,
                lt_model_cp_kind(t->m) == LT_CP_ULYSSES ? "Ulysses (all-to-all over heads)" : "ring");
    else if (t->world > 1)
        LT_INFO("data parallel: rank %d of %d trains rows [%lld, %lld) of every micro-batch of %lld", t->rank, t->world,
                (long long)(t->B * t->rank / t->world), (long long)(t->B * (t->rank + 1) / t->world), (long long)t->B);
}

lt_status lt_trainer_init(lt_trainer *t, lt_ctx *ctx, const lt_train_options *opt, lt_model *m,
                          const lt_pack_input *train, const lt_pack_input *valid, lt_comm *comm) {
    t->ctx = ctx;
    t->lock_fd = -1;
    t->o = opt;
    t->m = m;
    t->train = train;
    t->valid = valid;
    t->dev = lt_model_get_device(m);
    t->be = lt_backend_get(t->dev);
    if (!t->be) return lt_error(ctx, LT_ERR_UNSUPPORTED, "the model's device has no backend in this build");
    t->comm = comm;
    t->rank = lt_comm_rank(comm);
    t->world = lt_comm_size(comm);
    t->dist = t->world > 1 || lt_comm_get_backend(comm) == LT_COMM_NCCL;
    /* Gradients are reduced where they live: a host model's over MPI, a CUDA model's over NCCL. */
    if (t->dist && lt_comm_device(comm) != t->dev)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "data parallel: a %s model's gradients cannot be reduced over a %s "
                        "communicator (host models: MPI; CUDA models: NCCL)",
                        t->dev == LT_DEVICE_CPU ? "CPU" : "CUDA", lt_comm_backend_name(lt_comm_get_backend(comm)));
    return LT_OK;
}

lt_status lt_trainer_setup(lt_trainer *t, lt_train_result *res) {
    lt_ctx *ctx = t->ctx;
    const lt_train_options *o = t->o;
    LT_TRY(bind_params(t));
    LT_TRY(lt_train_mkdir(ctx, o->adapter_path));
    if (t->rank == 0) LT_TRY(lt_train_lock_dir(ctx, o->adapter_path, &t->lock_fd));
    if (t->rank == 0) lt_train_clean_stale_tmp(o->adapter_path);
    snprintf(t->ckpt_path, sizeof t->ckpt_path, "%s/" LT_TRAIN_CHECKPOINT_FILE, o->adapter_path);
    /* before the plan's measurement: reading a GGUF base's metadata is setup's transient, not a save's */
    t->base_name = lt_peft_base_model_name(ctx, o->model, t->base_repo, sizeof t->base_repo);
    LT_TRY(setup_packing(t));
    LT_TRY(setup_buffers(t));
    if (o->threads > 0) lt_ctx_set_threads(ctx, o->threads); /* the model sizes workspaces per thread */
    lt_model_run_options run = {.B = t->B,
                                .T = t->T,
                                .device = t->dev,
                                .recompute = o->recompute,
                                .recompute_k = o->recompute_every,
                                .attention = o->attention,
                                .loss = o->loss,
                                .threads = o->threads,
                                .offload_ckpt = o->offload_checkpoints,
                                .moe_chunk_tokens = o->moe_chunk_tokens,
                                .chunk_rows = o->chunk_rows,
                                .bf16_products = o->bf16_products,
                                .recompute_attention = o->recompute_attention,
                                .recompute_attention_layers = o->recompute_attention_layers};
    LT_TRY(compute_plan(t, res));
    LT_TRY(prepare_model(t, run));
    memset(&t->st, 0, sizeof t->st);
    t->plan_epoch = -1;
    if (o->resume_adapter_file[0]) LT_TRY(resume(t));
    res->start_step = t->st.step;
    res->start_tokens = t->st.tokens_seen;
    char mpath[LT_TRAIN_PATH_MAX + 32];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", o->adapter_path);
    if (t->rank == 0) LT_TRY(lt_metrics_open(ctx, mpath, o->resume_adapter_file[0] ? t->st.step : -1, &t->metrics));
    log_layout(t);
    return LT_OK;
}

void lt_trainer_free(lt_trainer *t) {
    lt_ctx *ctx = t->ctx;
    lt_metrics_close(ctx, t->metrics);
    lt_train_unlock_dir(t->lock_fd);
    t->lock_fd = -1;
    lt_pack_plan_free(ctx, t->plan);
    lt_pack_plan_free(ctx, t->vplan);
    if (t->ids) lt_free(ctx, LT_DEVICE_CPU, t->ids, t->batch_bytes);
    if (t->red) lt_free(ctx, LT_DEVICE_CPU, t->red, t->red_bytes);
    if (t->cp_ids) lt_free(ctx, LT_DEVICE_CPU, t->cp_ids, t->cp_bytes);
    if (t->reducer) {
        LT_INFO("gradient buckets started during the backward: %lld",
                (long long)lt_comm_reducer_early_buckets(t->reducer));
        lt_comm_reducer_free(ctx, t->reducer);
    }
    if (t->cp) lt_model_set_context_parallel(ctx, t->m, NULL);
    if (t->sg) {
        lt_step_graph_stats gs = lt_step_graph_get_stats(t->sg);
        LT_INFO("cuda graph: %lld steps replayed, %lld captured, %lld eager", (long long)gs.replays,
                (long long)gs.captures, (long long)gs.eager);
        lt_step_graph_free(ctx, t->sg);
    }
    if (t->tp) lt_free(ctx, LT_DEVICE_CPU, t->tp, (size_t)t->n_tp * sizeof *t->tp);
    if (t->mom_m) lt_free(ctx, t->dev, t->mom_m, (size_t)t->n * sizeof(float));
    if (t->mom_v) lt_free(ctx, t->dev, t->mom_v, (size_t)t->n * sizeof(float));
    if (t->host) lt_free(ctx, LT_DEVICE_CPU, t->host, 3 * (size_t)t->n * sizeof(float));
}
