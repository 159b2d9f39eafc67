/* The plan of a training run (see train.h, "The plan of a training run"): the one place that
 * turns resolved run options into the planner's options and adds what the trainer holds on its
 * device besides the model and the optimizer state. `longtune plan`, the memory guard and the
 * trainer all call lt_train_plan, so the three give the same number for the same flags. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "longtune/alloc.h"
#include "longtune/dataset.h"
#include "longtune/safetensors.h"
#include "train/train_internal.h"

/* recompute auto's costs beyond the recompute FLOPs, as fractions of the step, measured on the H200
 * (Qwen3-8B shape, 8k tokens, one call each): a chunk of c rows against the run's c0 costs
 * CHUNK_COST·(c0/c - 1) (4,096, 2,048 and 1,024 rows against 8,192: +2.6 %, +8.3 %, +23.2 %, i.e.
 * 0.026, 0.028, 0.033 a unit; 1,024 is the smallest tried), and segments of k > 1 layers
 * SEGMENT_COST·log2(k) (every:2 against all: +8.6 % keeping attention, +8.1 % rerunning it; larger
 * k extrapolated). */
#define LT_TRAIN_AUTO_CHUNK_MIN 1024
#define LT_TRAIN_AUTO_CHUNK_COST 0.03
#define LT_TRAIN_AUTO_SEGMENT_COST 0.08

lt_status lt_train_pack_options(lt_ctx *ctx, const lt_train_options *opt, int64_t cp_size, lt_pack_options *out) {
    memset(out, 0, sizeof *out);
    out->row_len = opt->max_seq_length;
    out->batch_size = opt->batch_size;
    out->overflow = LT_PACK_TRUNCATE;
    out->seed = opt->seed;
    /* Unpacked rows never pass max_seq_length; context parallel rows split into 2·K equal chunks. */
    out->pad_multiple = cp_size > 1 ? 2 * cp_size : 1;
    out->algorithm = LT_PACK_FIRST_FIT;
    if (opt->pack_algorithm[0]) LT_TRY(lt_pack_algorithm_parse(ctx, opt->pack_algorithm, &out->algorithm));
    if (opt->no_pack) out->algorithm = LT_PACK_NONE;
    return LT_OK;
}

lt_status lt_train_packing_bytes(lt_ctx *ctx, const lt_train_options *opt, const lt_pack_options *popt,
                                 const lt_pack_input *train, const lt_pack_input *valid, lt_train_held *held) {
    held->packing_peak_bytes = held->packing_held_bytes = 0;
    lt_ctx *scratch = lt_ctx_new();
    if (!scratch) return lt_error(ctx, LT_ERR_OOM, "plan: no scratch context to size the packing plans");
    lt_pack_plan *vp = NULL, *tp = NULL;
    lt_status s = LT_OK;
    /* The trainer's order: the validation plan first (the evaluation before step 1), then the
     * first epoch's training plan beside it. */
    if (valid && valid->n_seqs > 0) {
        lt_pack_options v = *popt;
        v.epoch = 0;
        if ((s = lt_pack_plan_build(scratch, valid, &v, &vp)) != LT_OK) goto done;
    }
    size_t used = lt_mem_get_stats(scratch, LT_DEVICE_CPU).used_bytes;
    for (int k = 0; k < (opt && opt->n_stages > 0 ? opt->n_stages : 1) && train && train->n_seqs > 0; k++) {
        lt_pack_options e = *popt;
        e.epoch = 0;
        if (opt && opt->n_stages > 0) e.row_len = opt->stage_len[k];
        lt_pack_plan_free(scratch, tp);
        tp = NULL;
        if ((s = lt_pack_plan_build(scratch, train, &e, &tp)) != LT_OK) goto done;
        size_t u = lt_mem_get_stats(scratch, LT_DEVICE_CPU).used_bytes;
        if (u > used || k == 0) used = u;
    }
    held->packing_peak_bytes = lt_mem_get_stats(scratch, LT_DEVICE_CPU).peak_bytes;
    held->packing_held_bytes = used;
done:
    if (s != LT_OK) lt_error(ctx, s, "plan: packing the data set: %s", lt_ctx_error(scratch));
    lt_pack_plan_free(scratch, tp);
    lt_pack_plan_free(scratch, vp);
    lt_ctx_free(scratch);
    return s;
}

lt_status lt_train_measure_data(lt_ctx *ctx, const lt_train_options *opt, int64_t cp_size, lt_train_held *held) {
    memset(held, 0, sizeof *held);
    lt_ctx *scratch = lt_ctx_new();
    if (!scratch) return lt_error(ctx, LT_ERR_OOM, "plan: no scratch context to load the data set");
    lt_tokenizer *tok = NULL;
    lt_dataset *train = NULL, *valid = NULL;
    lt_dataset_options dopt;
    memset(&dopt, 0, sizeof dopt);
    dopt.mask_prompt = opt->mask_prompt;
    /* As lt_train_run loads them: the tokenizer, train.jsonl and valid.jsonl when present. */
    lt_status s = lt_tokenizer_load(scratch, opt->model, &tok);
    if (s == LT_OK) s = lt_dataset_load_split(scratch, opt->data, "train", tok, &dopt, &train);
    if (s == LT_OK) {
        s = lt_dataset_load_split(scratch, opt->data, "valid", tok, &dopt, &valid);
        if (s == LT_ERR_NOT_FOUND) {
            lt_ctx_clear_error(scratch);
            valid = NULL;
            s = LT_OK;
        }
    }
    if (s != LT_OK) {
        lt_error(ctx, s, "%s", lt_ctx_error(scratch));
        goto done;
    }
    held->caller_bytes = lt_mem_get_stats(scratch, LT_DEVICE_CPU).used_bytes;
    held->load_peak_bytes = lt_mem_get_stats(scratch, LT_DEVICE_CPU).peak_bytes;
    lt_pack_options popt;
    if ((s = lt_train_pack_options(ctx, opt, cp_size, &popt)) != LT_OK) goto done;
    lt_pack_input tin = lt_dataset_input(train), vin;
    if (valid) vin = lt_dataset_input(valid);
    size_t caller = held->caller_bytes, load = held->load_peak_bytes;
    s = lt_train_packing_bytes(ctx, opt, &popt, &tin, valid ? &vin : NULL, held);
    held->caller_bytes = caller;
    held->load_peak_bytes = load;
done:
    if (valid) lt_dataset_free(scratch, valid);
    if (train) lt_dataset_free(scratch, train);
    if (tok) lt_tokenizer_free(tok);
    lt_ctx_free(scratch);
    return s;
}

static size_t add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* A resumed run reads its whole checkpoint file into one block after the model is prepared. */
static size_t resume_bytes(const lt_train_options *opt) {
    if (!opt->resume_adapter_file[0]) return 0;
    char path[LT_TRAIN_PATH_MAX + 32];
    struct stat sb;
    snprintf(path, sizeof path, "%s", opt->resume_adapter_file);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(path, sizeof path, "%s/" LT_TRAIN_CHECKPOINT_FILE, opt->resume_adapter_file);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0) return 0;
    return lt_alloc_accounted_size(LT_DEVICE_CPU, (size_t)sb.st_size);
}

size_t lt_train_buffer_bytes(const lt_train_options *opt, int64_t B, int64_t T, int64_t n_lora_tensors,
                             int64_t cp_size) {
    const lt_device h = LT_DEVICE_CPU;
    /* bind_params: one lt_train_param per LoRA tensor. */
    size_t n = lt_alloc_accounted_size(h, (size_t)(n_lora_tensors > 0 ? n_lora_tensors : 1) * sizeof(lt_train_param));
    /* One batch's ids, targets, positions (B·T each), seq_offsets (B·(T+1)) and pieces (B). */
    n = add(n, lt_alloc_accounted_size(h, (size_t)(3 * B * T + B * (T + 1) + B) * sizeof(int32_t)));
    /* The step's loss sums and token counts, one per micro-batch, plus the stop flag. */
    n = add(n, lt_alloc_accounted_size(h, (size_t)(opt->grad_accum + 1) * (sizeof(double) + sizeof(int64_t))));
    /* Context parallel: this rank's tokens, targets and positions of the row. */
    if (cp_size > 1) n = add(n, lt_alloc_accounted_size(h, (size_t)(3 * (T / cp_size)) * sizeof(int32_t)));
    return n;
}

lt_status lt_train_plan_options(lt_ctx *ctx, const lt_train_options *opt, int64_t dp_size, int64_t cp_size,
                                lt_plan_options *out) {
    memset(out, 0, sizeof *out);
    LT_TRY(lt_train_lora_options(ctx, opt, &out->lora));
    out->device = opt->device;
    out->run.device = opt->device;
    out->run.B = opt->batch_size;
    out->run.T = opt->max_seq_length;
    out->run.recompute = opt->recompute;
    out->run.recompute_k = opt->recompute_every;
    out->run.recompute_attention = opt->recompute_attention;
    out->run.recompute_attention_layers = opt->recompute_attention_layers;
    out->run.offload_ckpt = opt->offload_checkpoints;
    out->run.moe_chunk_tokens = opt->moe_chunk_tokens;
    out->run.chunk_rows = opt->chunk_rows;
    out->run.bf16_products = opt->bf16_products;
    out->run.attention = opt->attention;
    out->run.loss = opt->loss;
    out->run.threads = opt->threads;
    out->dp_size = dp_size > 0 ? dp_size : 1;
    out->cp_size = cp_size > 0 ? cp_size : 1;
    return LT_OK;
}

lt_status lt_train_plan(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                        const lt_plan_options *popt, const lt_train_held *held, lt_plan *out) {
    lt_plan_options po = *popt;
    po.held_bytes = held ? held->caller_bytes : 0;
    if (po.device == LT_DEVICE_CPU) {
        /* The trainer's host buffers are on the run's device only when that is the host. Its
         * LoRA tensor index has one entry per A and B of every target of every LoRA layer. */
        int64_t targets = 0,
                layers = po.lora.num_layers > 0 && po.lora.num_layers < cfg->L ? po.lora.num_layers : cfg->L;
        uint32_t mask =
            po.lora.targets & LT_LORA_ALL_TARGETS ? po.lora.targets & LT_LORA_ALL_TARGETS : LT_LORA_ALL_TARGETS;
        for (int64_t l = cfg->L - layers; !(po.lora.targets & LT_LORA_ALL_TARGETS) && l < cfg->L; l++) {
            lt_layer_desc d;
            lt_model_describe_layer(cfg, l, &d);
            if (d.mlp == LT_MLP_KIND_MOE) mask = 0xfu; /* attention only on MoE layers */
        }
        for (int p = 0; p < LT_PROJ_COUNT_; p++) targets += (mask >> p) & 1u;
        int64_t n_tensors = 2 * targets * layers;
        for (int64_t l = cfg->L - layers; l < cfg->L; l++) { /* the experts' stacks: MoE layers only */
            lt_layer_desc d;
            lt_model_describe_layer(cfg, l, &d);
            if (d.mlp == LT_MLP_KIND_MOE)
                n_tensors += 2 *
                    (((po.lora.targets & LT_LORA_EXPERTS_GATE_UP) != 0) +
                     ((po.lora.targets & LT_LORA_EXPERTS_DOWN) != 0));
        }
        size_t own = lt_train_buffer_bytes(opt, po.run.B, po.run.T, n_tensors, po.cp_size);
        /* After the plan, one at a time: a resumed run's checkpoint file; then, beside the metrics
         * log, the packing plans as they are built, and the adapter's export index while it is
         * saved (both packing plans held). */
        size_t pk = held ? held->packing_peak_bytes : 0, ph = held ? held->packing_held_bytes : 0;
        size_t metrics = lt_alloc_accounted_size(LT_DEVICE_CPU, lt_metrics_bytes());
        size_t save = add(ph, lt_alloc_accounted_size(LT_DEVICE_CPU, lt_peft_export_bytes((int)n_tensors)));
        size_t late = add(metrics, pk > save ? pk : save), resume = resume_bytes(opt);
        own = add(own, late > resume ? late : resume);
        po.held_bytes = add(po.held_bytes, own);
    }
    LT_TRY(lt_plan_compute(ctx, cfg, &po, out));
    /* The data are read before the model and the trainer allocate anything: that high-water
     * stands alone, and only a step smaller than it (a tiny model) leaves it the run's peak. */
    if (po.device == LT_DEVICE_CPU && held && held->load_peak_bytes > out->peak_bytes)
        out->peak_bytes = held->load_peak_bytes;
    return LT_OK;
}

/* Does the run fit at B or T = v (the held class follows the shape; what was measured stays)? */
static int fits_at(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg, const lt_plan_options *popt,
                   const lt_train_held *held, lt_plan_search what, int64_t v, size_t budget, lt_status *err) {
    lt_plan_options o = *popt;
    if (what == LT_PLAN_SEARCH_SEQ) o.run.T = v;
    else o.run.B = v;
    lt_plan p;
    if (opt->recompute_auto) { /* fits when one of recompute auto's candidates does */
        lt_train_options chosen;
        lt_status s = lt_train_choose_recompute(ctx, opt, cfg, &o, held, budget, &chosen, &p);
        if (s == LT_OK) return 1;
        if (s != LT_ERR_OOM && err) *err = s;
        else lt_ctx_clear_error(ctx);
        return 0;
    }
    lt_status s = lt_train_plan(ctx, opt, cfg, &o, held, &p);
    if (s != LT_OK) {
        if (err) *err = s;
        else lt_ctx_clear_error(ctx); /* too large to plan counts as too large to fit */
        return 0;
    }
    return p.peak_bytes <= budget && (!o.host_budget_bytes || p.offload_bytes <= o.host_budget_bytes);
}

lt_status lt_train_plan_search(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                               const lt_plan_options *popt, const lt_train_held *held, lt_plan_search what, int64_t hi,
                               size_t budget_bytes, int64_t *out, int *found) {
    *out = 0;
    *found = 0;
    if (hi < 1) return lt_error(ctx, LT_ERR_INVALID_ARG, "plan search: upper bound %lld < 1", (long long)hi);
    lt_status err = LT_OK;
    if (!fits_at(ctx, opt, cfg, popt, held, what, 1, budget_bytes, &err)) return err; /* error, or nothing fits */
    int64_t lo = 1, top = hi; /* invariant: lo fits; everything above top does not */
    while (lo < top) {
        int64_t mid = lo + (top - lo + 1) / 2;
        if (fits_at(ctx, opt, cfg, popt, held, what, mid, budget_bytes, NULL)) lo = mid;
        else top = mid - 1;
    }
    *out = lo;
    *found = 1;
    return LT_OK;
}

/* Keys one row's queries see in all at T tokens: T(T+1)/2 causal, fewer under a window of W. */
static double keys_seen(int64_t T, int64_t W) {
    double t = (double)T, w = (double)W;
    if (W <= 0 || W >= T) return t * (t + 1) / 2;
    return w * (w + 1) / 2 + (t - w) * w;
}

/* The weights of one layer's seven projections (q, k, v, o, gate, up, down). */
static double proj_weights(const lt_model_config *cfg) {
    return (double)cfg->C * (double)(2 * cfg->H * cfg->D + 2 * cfg->Hkv * cfg->D) +
        3.0 * (double)cfg->C * (double)cfg->F;
}

/* The recompute work of a policy per row of T tokens, which orders the candidates of recompute
 * auto: per recomputed LoRA layer its projections' forward (2·T·P FLOPs, P the weights of its seven
 * projections) and, in the layers that rerun attention, attention's forward (4·H·D per key a query
 * sees). `rerun` of the recomputed layers rerun it (negative: all), split between the kinds by
 * lt_model_attention_rerun_split, each kind's from the bottom as the step takes them (the last
 * segment, whose stores survive from the forward, reruns none). */
static double recompute_flops(const lt_model_config *cfg, lt_recompute pol, int64_t k, int64_t layers, int64_t rerun,
                              int64_t T) {
    const double P = proj_weights(cfg);
    int64_t left_sl, left_full;
    lt_model_attention_rerun_split(cfg, pol, lt_model_recompute_cap(pol, k), layers, rerun, &left_sl, &left_full);
    double f = 0;
    for (int64_t l = cfg->L - layers; l < cfg->L; l++) {
        if (!lt_model_recomputes_layer(cfg, pol, l)) continue;
        f += 2.0 * (double)T * P;
        lt_layer_desc d;
        lt_model_describe_layer(cfg, l, &d);
        int64_t *left = d.attn == LT_ATTN_KIND_SLIDING ? &left_sl : &left_full;
        if (*left > 0) {
            (*left)--;
            f += 4.0 * (double)(cfg->H * d.D) * keys_seen(T, d.window);
        }
    }
    return f;
}

/* The longest run of consecutive LoRA layers policy pol recomputes, and how many it recomputes. */
static int64_t longest_run(const lt_model_config *cfg, lt_recompute pol, int64_t layers, int64_t *n) {
    int64_t best = 0, run = 0;
    *n = 0;
    for (int64_t l = cfg->L - layers; l < cfg->L; l++) {
        int r = lt_model_recomputes_layer(cfg, pol, l);
        *n += r;
        run = r ? run + 1 : 0;
        if (run > best) best = run;
    }
    return best;
}

/* The step's own work per row of T tokens, against which recompute auto weighs a candidate's: per
 * layer the frozen projections' forward and input gradient (4·T·P) and attention's forward and
 * backward (3.5 times its forward), and the head's forward and input gradient (4·V·C·T). */
static double step_flops(const lt_model_config *cfg, int64_t T) {
    const double P = proj_weights(cfg);
    double f = 4.0 * (double)cfg->V * (double)cfg->C * (double)T;
    for (int64_t l = 0; l < cfg->L; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(cfg, l, &d);
        f += 4.0 * (double)T * P + 3.5 * 4.0 * (double)(cfg->H * d.D) * keys_seen(T, d.window);
    }
    return f;
}

/* The candidates of recompute auto with their estimated cost, a fraction of the step (see train.h);
 * an explicit recompute_attention keeps only the candidates that rerun attention, an explicit
 * chunk_rows only that chunk. */
/* c reruns attention in all of its n recomputed layers and its plan p fits budget_bytes: the
 * fewest layers m < n that still fit (plans shrink as m grows), into c (recompute_attention 0,
 * recompute_attention_layers m), po and p; c stays as it is when only all of them fit. */
static lt_status fewest_reruns(lt_ctx *ctx, const lt_model_config *cfg, const lt_train_held *held, size_t budget_bytes,
                               int64_t layers, lt_train_options *c, lt_plan_options *po, lt_plan *p) {
    int64_t n;
    (void)longest_run(cfg, c->recompute, layers, &n);
    int64_t lo = 0, hi = n; /* lo: known not to fit (0: attention kept everywhere), hi: fits */
    lt_train_options best = *c;
    lt_plan_options best_po = *po;
    lt_plan best_p = *p;
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        lt_train_options t = *c;
        t.recompute_attention = 0;
        t.recompute_attention_layers = mid;
        lt_plan_options to = *po;
        to.run.recompute_attention = 0;
        to.run.recompute_attention_layers = mid;
        lt_plan tp;
        LT_TRY(lt_train_plan(ctx, &t, cfg, &to, held, &tp));
        if (tp.peak_bytes <= budget_bytes) hi = mid, best = t, best_po = to, best_p = tp;
        else lo = mid;
    }
    *c = best, *po = best_po, *p = best_p;
    return LT_OK;
}

lt_status lt_train_choose_recompute(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                                    const lt_plan_options *popt, const lt_train_held *held, size_t budget_bytes,
                                    lt_train_options *out, lt_plan *plan) {
    *out = *opt;
    if (!opt->recompute_auto) return plan ? lt_train_plan(ctx, opt, cfg, popt, held, plan) : LT_OK;
    int64_t layers = opt->num_layers > 0 && opt->num_layers < cfg->L ? opt->num_layers : cfg->L;
    enum { MAX_POLICIES = 2 * 3 * 12 + 1, MAX_CHUNKS = 8 }; /* halvings of LT_MODEL_CHUNK_ROWS to the minimum */
    struct {
        lt_recompute policy;
        int64_t k, chunk;
        int rerun;
        double cost;
    } cand[MAX_POLICIES * MAX_CHUNKS], t;
    struct {
        lt_recompute policy;
        int64_t k;
        int rerun;
        double flops;
    } pol[MAX_POLICIES];
    int np = 0, n = 0;
    if (!opt->recompute_attention) {
        memset(&pol[0], 0, sizeof pol[0]);
        pol[np++].policy = LT_RECOMPUTE_NONE;
    }
    /* The by-kind policies where the LoRA layers mix kinds (else one is all and the other nothing),
     * then every layer; each over segments of k = 1, 2, 4, ... layers below its longest run (the
     * same work with fewer checkpoints and more slots). */
    static const lt_recompute pols[3] = {LT_RECOMPUTE_GLOBAL, LT_RECOMPUTE_SLIDING, LT_RECOMPUTE_EVERY};
    for (int rerun = opt->recompute_attention ? 1 : 0; rerun <= 1; rerun++)
        for (int pi = 0; pi < 3; pi++) {
            int64_t n_rec, span = longest_run(cfg, pols[pi], layers, &n_rec);
            if (pols[pi] != LT_RECOMPUTE_EVERY && (n_rec == 0 || n_rec == layers)) continue;
            for (int64_t k = 1; k == 1 || (k < span && k < 2048); k *= 2) {
                pol[np].policy = pols[pi] == LT_RECOMPUTE_EVERY && k > 1 ? LT_RECOMPUTE_EVERY_K : pols[pi];
                pol[np].k = k;
                pol[np].rerun = rerun;
                pol[np].flops = recompute_flops(cfg, pol[np].policy, k, layers, rerun ? -1 : 0, popt->run.T);
                np++;
            }
        }
    /* The chunks: the run's, and unless chunk_rows was given, halvings down to
     * LT_TRAIN_AUTO_CHUNK_MIN rows (chunks of all the rows or more plan alike: the first below
     * B·T follows the run's). */
    const int64_t rows = popt->run.B * popt->run.T,
                  chunk0 = opt->chunk_rows > 0 ? opt->chunk_rows : LT_MODEL_CHUNK_ROWS;
    int64_t chunks[MAX_CHUNKS];
    int nc = 0;
    chunks[nc++] = chunk0;
    for (int64_t ch = chunk0 / 2; !opt->chunk_rows && ch >= LT_TRAIN_AUTO_CHUNK_MIN && nc < MAX_CHUNKS; ch /= 2)
        if (ch < rows) chunks[nc++] = ch;
    const double work = step_flops(cfg, popt->run.T), eff0 = (double)(chunk0 < rows ? chunk0 : rows);
    for (int i = 0; i < np; i++)
        for (int j = 0; j < nc; j++) {
            cand[n].policy = pol[i].policy;
            cand[n].k = pol[i].k;
            cand[n].rerun = pol[i].rerun;
            cand[n].chunk = j ? chunks[j] : opt->chunk_rows;
            cand[n].cost = (work > 0 ? pol[i].flops / work : 0) +
                (pol[i].k > 1 ? LT_TRAIN_AUTO_SEGMENT_COST * log2((double)pol[i].k) : 0) +
                LT_TRAIN_AUTO_CHUNK_COST * (eff0 / (double)(chunks[j] < rows ? chunks[j] : rows) - 1.0);
            n++;
        }
    for (int i = 1; i < n; i++) /* stable: equal cost keeps the order above */
        for (int j = i; j > 0 && cand[j].cost < cand[j - 1].cost; j--)
            t = cand[j], cand[j] = cand[j - 1], cand[j - 1] = t;
    /* A candidate that keeps attention and does not fit may fit rerunning it in some of its
     * recomputed layers: that partial rerun costs the candidate's estimate plus those layers'
     * attention forward, and competes with the candidates after it. The cheapest found is taken
     * once no candidate left is estimated cheaper (or a cheaper one fits first). */
    size_t smallest = SIZE_MAX;
    int best = 0, have = 0;
    double have_cost = 0;
    lt_train_options have_c = *opt;
    lt_plan have_p;
    memset(&have_p, 0, sizeof have_p);
    const int64_t T = popt->run.T;
    for (int i = 0; i < n; i++) {
        if (have && cand[i].cost >= have_cost) break;
        lt_train_options c = *opt;
        c.recompute_auto = 0;
        c.recompute = cand[i].policy;
        c.recompute_every = cand[i].k > 1 ? cand[i].k : 0;
        c.recompute_attention = cand[i].rerun;
        c.chunk_rows = cand[i].chunk;
        lt_plan_options po = *popt;
        po.run.recompute = c.recompute;
        po.run.recompute_k = c.recompute_every;
        po.run.recompute_attention = c.recompute_attention;
        po.run.chunk_rows = c.chunk_rows;
        lt_plan p;
        LT_TRY(lt_train_plan(ctx, &c, cfg, &po, held, &p));
        if (p.peak_bytes <= budget_bytes) {
            /* Rerunning attention in every recomputed layer fits (and keeping it everywhere did
             * not, being cheaper): rerun it in as few of them as fit, bisecting the count. */
            if (c.recompute_attention && !opt->recompute_attention)
                LT_TRY(fewest_reruns(ctx, cfg, held, budget_bytes, layers, &c, &po, &p));
            *out = c;
            if (plan) *plan = p;
            return LT_OK;
        }
        if (p.peak_bytes < smallest) smallest = p.peak_bytes, best = i;
        if (c.recompute_attention || opt->recompute_attention || c.recompute == LT_RECOMPUTE_NONE) continue;
        lt_train_options r = c;
        lt_plan_options rpo = po;
        r.recompute_attention = rpo.run.recompute_attention = 1;
        lt_plan rp;
        LT_TRY(lt_train_plan(ctx, &r, cfg, &rpo, held, &rp));
        if (rp.peak_bytes > budget_bytes) continue;
        LT_TRY(fewest_reruns(ctx, cfg, held, budget_bytes, layers, &r, &rpo, &rp));
        const int64_t m = r.recompute_attention ? -1 : r.recompute_attention_layers;
        const double cost = cand[i].cost +
            (work > 0 ? (recompute_flops(cfg, c.recompute, c.recompute_every, layers, m, T) -
                         recompute_flops(cfg, c.recompute, c.recompute_every, layers, 0, T)) /
                     work
                      : 0);
        if (!have || cost < have_cost) have = 1, have_cost = cost, have_c = r, have_p = rp;
    }
    if (have) {
        *out = have_c;
        if (plan) *plan = have_p;
        return LT_OK;
    }
    const int64_t best_chunk = cand[best].chunk;
    char name[32], chunk[48] = "";
    lt_plan_recompute_name(cand[best].policy, cand[best].k, name, sizeof name);
    if (best_chunk != opt->chunk_rows) snprintf(chunk, sizeof chunk, ", chunk_rows %lld", (long long)best_chunk);
    return lt_error(ctx, LT_ERR_OOM,
                    "recompute auto: no policy fits the memory budget of %zu bytes; the smallest plan (recompute "
                    "%s%s%s) needs %zu bytes (shorten max_seq_length or batch_size, or offload checkpoints)",
                    budget_bytes, name, cand[best].rerun ? " + recompute_attention" : "", chunk, smallest);
}
