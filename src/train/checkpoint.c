/* Training checkpoints: LoRA tensors, AdamW moments, step, RNG and data position in one
 * little-endian binary file closed by a checksum, written atomically. Loading checks every size,
 * the checksum and the run options before touching the caller's tensors, so a bad file changes
 * nothing. The format is ours (not safetensors): it is a resume file, the adapter is exported
 * separately in PEFT's format.
 *
 * Layout: "LTCKPT01" | u32 version | u32 n_params | u64 step | u64 rng[4] | i64 epoch | i64 cursor
 * | i64 tokens_seen | f64 elapsed_s | u32 options_len | options text | per param { u32 name_len |
 * name | u32 ndim | i64 shape[ndim] | f32 data[numel] | f32 m[numel] | f32 v[numel] } | u64 fnv1a
 * of everything before it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "longtune/alloc.h"
#include "train/train_internal.h"

#define CKPT_MAGIC "LTCKPT01"
#define CKPT_VERSION 1u

/* The options that shape the trajectory, as "key=value\n" text; a resume must reproduce it. */
static int options_text(const lt_train_options *o, char *buf, size_t cap) {
    int n = snprintf(buf, cap,
                     "lora_rank=%lld\nlora_alpha=%.17g\nlora_dropout=%.17g\nlora_targets=%s\nnum_layers=%lld\n"
                     "seed=%llu\nbatch_size=%lld\nmax_seq_length=%lld\ngrad_accum=%lld\niters=%lld\n"
                     "learning_rate=%.17g\nmin_lr=%.17g\nlr_schedule=%d\nwarmup=%lld\nweight_decay=%.17g\n"
                     "beta1=%.17g\nbeta2=%.17g\neps=%.17g\ngrad_clip=%.17g\nmask_prompt=%d\nno_pack=%d\n"
                     "pack_algorithm=%s\n",
                     (long long)o->lora_rank, o->lora_alpha, o->lora_dropout, o->lora_targets, (long long)o->num_layers,
                     (unsigned long long)o->seed, (long long)o->batch_size, (long long)o->max_seq_length,
                     (long long)o->grad_accum, (long long)o->iters, o->learning_rate, o->min_lr, (int)o->lr_schedule,
                     (long long)o->warmup, o->weight_decay, o->beta1, o->beta2, o->eps, o->grad_clip, o->mask_prompt,
                     o->no_pack, o->pack_algorithm);
    /* Only runs with a curriculum carry its line, so checkpoints of runs without one keep their text. */
    if (n >= 0 && (size_t)n < cap && o->seq_len_curriculum[0])
        n += snprintf(buf + n, cap - (size_t)n, "seq_len_curriculum=%s\n", o->seq_len_curriculum);
    return n;
}

int64_t lt_train_param_numel(const lt_train_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

typedef struct {
    lt_atomic_file af;
    uint64_t h;
} writer;

static lt_status put(lt_ctx *ctx, writer *w, const void *p, size_t n) {
    w->h = lt_fnv64(w->h, p, n);
    return lt_atomic_write(ctx, &w->af, p, n);
}
static lt_status put_u32(lt_ctx *ctx, writer *w, uint32_t v) { return put(ctx, w, &v, 4); }
static lt_status put_u64(lt_ctx *ctx, writer *w, uint64_t v) { return put(ctx, w, &v, 8); }

static lt_status save_body(lt_ctx *ctx, writer *w, const lt_train_options *opt, const lt_train_state *st,
                           const lt_train_param *params, int n_params) {
    char text[2048];
    int tn = options_text(opt, text, sizeof text);
    LT_ASSERT(tn > 0 && (size_t)tn < sizeof text);
    LT_TRY(put(ctx, w, CKPT_MAGIC, 8));
    LT_TRY(put_u32(ctx, w, CKPT_VERSION));
    LT_TRY(put_u32(ctx, w, (uint32_t)n_params));
    LT_TRY(put_u64(ctx, w, (uint64_t)st->step));
    for (int i = 0; i < 4; i++) LT_TRY(put_u64(ctx, w, st->rng[i]));
    LT_TRY(put_u64(ctx, w, (uint64_t)st->data_epoch));
    LT_TRY(put_u64(ctx, w, (uint64_t)st->data_cursor));
    LT_TRY(put_u64(ctx, w, (uint64_t)st->tokens_seen));
    LT_TRY(put(ctx, w, &st->elapsed_s, 8));
    LT_TRY(put_u32(ctx, w, (uint32_t)tn));
    LT_TRY(put(ctx, w, text, (size_t)tn));
    for (int i = 0; i < n_params; i++) {
        const lt_train_param *p = &params[i];
        size_t nl = strlen(p->name);
        size_t bytes = (size_t)lt_train_param_numel(p) * sizeof(float);
        LT_TRY(put_u32(ctx, w, (uint32_t)nl));
        LT_TRY(put(ctx, w, p->name, nl));
        LT_TRY(put_u32(ctx, w, (uint32_t)p->ndim));
        for (int d = 0; d < p->ndim; d++) LT_TRY(put_u64(ctx, w, (uint64_t)p->shape[d]));
        LT_TRY(put(ctx, w, p->data, bytes));
        LT_TRY(put(ctx, w, p->m, bytes));
        LT_TRY(put(ctx, w, p->v, bytes));
    }
    uint64_t h = w->h;
    return lt_atomic_write(ctx, &w->af, &h, 8);
}

lt_status lt_checkpoint_save(lt_ctx *ctx, const char *path, const lt_train_options *opt, const lt_train_state *st,
                             const lt_train_param *params, int n_params) {
    if (n_params < 0) return lt_error(ctx, LT_ERR_INVALID_ARG, "checkpoint: %d params", n_params);
    for (int i = 0; i < n_params; i++) {
        const lt_train_param *p = &params[i];
        if (!p->data || !p->m || !p->v || p->ndim < 1 || p->ndim > 2)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "checkpoint: param %d ('%s') lacks data/m/v or has ndim %d", i,
                            p->name, p->ndim);
    }
    writer w = {.h = LT_FNV64_INIT};
    LT_TRY(lt_atomic_open(ctx, &w.af, path));
    lt_status s = save_body(ctx, &w, opt, st, params, n_params);
    if (s != LT_OK) {
        lt_atomic_abort(&w.af);
        return s;
    }
    return lt_atomic_commit(ctx, &w.af);
}

/* Bounds-checked cursor over the loaded file. */
typedef struct {
    const unsigned char *b;
    size_t n, at;
    const char *path;
} reader;

static lt_status take(lt_ctx *ctx, reader *r, void *out, size_t n, const char *what) {
    if (n > r->n - r->at)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: truncated checkpoint: %s at byte %zu needs %zu bytes, %zu left",
                        r->path, what, r->at, n, r->n - r->at);
    if (out) memcpy(out, r->b + r->at, n);
    r->at += n;
    return LT_OK;
}

/* Walks the params section; with `params_out` NULL it only validates against `params`. */
static lt_status walk_params(lt_ctx *ctx, reader *r, lt_train_param *params, int n_params, int copy) {
    for (int i = 0; i < n_params; i++) {
        lt_train_param *p = &params[i];
        uint32_t nl = 0, ndim = 0;
        char name[LT_TRAIN_NAME_MAX];
        LT_TRY(take(ctx, r, &nl, 4, "name length"));
        if (nl == 0 || nl >= sizeof name)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor %d: name length %u out of range", r->path, i, nl);
        LT_TRY(take(ctx, r, name, nl, "name"));
        name[nl] = '\0';
        if (strcmp(name, p->name))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "%s: tensor %d is '%s' but this run's tensor %d is '%s' (different LoRA layout)", r->path,
                            i, name, i, p->name);
        LT_TRY(take(ctx, r, &ndim, 4, "ndim"));
        if ((int)ndim != p->ndim)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: tensor '%s' has %u dims, this run expects %d", r->path, name,
                            ndim, p->ndim);
        for (uint32_t d = 0; d < ndim; d++) {
            int64_t dim = 0;
            LT_TRY(take(ctx, r, &dim, 8, "shape"));
            if (dim != p->shape[d])
                return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: tensor '%s' dim %u is %lld, this run expects %lld",
                                r->path, name, d, (long long)dim, (long long)p->shape[d]);
        }
        size_t bytes = (size_t)lt_train_param_numel(p) * sizeof(float);
        LT_TRY(take(ctx, r, copy ? p->data : NULL, bytes, name));
        LT_TRY(take(ctx, r, copy ? p->m : NULL, bytes, name));
        LT_TRY(take(ctx, r, copy ? p->v : NULL, bytes, name));
    }
    return LT_OK;
}

static lt_status parse(lt_ctx *ctx, reader *r, const lt_train_options *opt, lt_train_state *st, lt_train_param *params,
                       int n_params) {
    char magic[8];
    uint32_t version = 0, np = 0, tn = 0;
    if (r->n < 8 + 8 || memcmp(r->b, CKPT_MAGIC, 8))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: not a longtune checkpoint (bad magic or empty)", r->path);
    uint64_t want, got = lt_fnv64(LT_FNV64_INIT, r->b, r->n - 8);
    memcpy(&want, r->b + r->n - 8, 8);
    if (want != got)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: checksum mismatch (file truncated or corrupted)", r->path);
    r->n -= 8;
    LT_TRY(take(ctx, r, magic, 8, "magic"));
    LT_TRY(take(ctx, r, &version, 4, "version"));
    if (version != CKPT_VERSION)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: checkpoint version %u, this build reads %u", r->path, version,
                        CKPT_VERSION);
    LT_TRY(take(ctx, r, &np, 4, "tensor count"));
    if ((int64_t)np != n_params)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: %u LoRA tensors, this run has %d", r->path, np, n_params);
    lt_train_state s;
    uint64_t u = 0;
    LT_TRY(take(ctx, r, &u, 8, "step"));
    s.step = (int64_t)u;
    LT_TRY(take(ctx, r, s.rng, 32, "rng"));
    LT_TRY(take(ctx, r, &u, 8, "data epoch"));
    s.data_epoch = (int64_t)u;
    LT_TRY(take(ctx, r, &u, 8, "data cursor"));
    s.data_cursor = (int64_t)u;
    LT_TRY(take(ctx, r, &u, 8, "tokens seen"));
    s.tokens_seen = (int64_t)u;
    LT_TRY(take(ctx, r, &s.elapsed_s, 8, "elapsed"));
    if (s.step < 0 || s.data_epoch < 0 || s.data_cursor < 0 || s.tokens_seen < 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: negative step, data position or token count", r->path);
    if (s.step > opt->iters)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: checkpoint is at step %lld, past iters %lld", r->path,
                        (long long)s.step, (long long)opt->iters);
    LT_TRY(take(ctx, r, &tn, 4, "options length"));
    char text[2048], mine[2048];
    if (tn >= sizeof text) return lt_error(ctx, LT_ERR_FORMAT, "%s: options block of %u bytes", r->path, tn);
    LT_TRY(take(ctx, r, text, tn, "options"));
    text[tn] = '\0';
    options_text(opt, mine, sizeof mine);
    if (strcmp(text, mine)) {
        /* Name the first option that differs, with both values. */
        const char *a = text, *b = mine;
        while (*a && *b) {
            const char *ea = strchr(a, '\n'), *eb = strchr(b, '\n');
            size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
            if (la != lb || strncmp(a, b, la))
                return lt_error(ctx, LT_ERR_INVALID_ARG,
                                "%s: resume needs the checkpoint's options: it has '%.*s', this run '%.*s'", r->path,
                                (int)la, a, (int)lb, b);
            a += la + (ea != NULL);
            b += lb + (eb != NULL);
        }
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: run options differ from the checkpoint's", r->path);
    }
    size_t params_at = r->at;
    LT_TRY(walk_params(ctx, r, params, n_params, 0));
    if (r->at != r->n)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %zu unexpected bytes after the last tensor", r->path, r->n - r->at);
    r->at = params_at;
    LT_TRY(walk_params(ctx, r, params, n_params, 1));
    *st = s;
    return LT_OK;
}

lt_status lt_checkpoint_load(lt_ctx *ctx, const char *path, const lt_train_options *opt, lt_train_state *st,
                             lt_train_param *params, int n_params) {
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, LT_ERR_IO, "%s: cannot open checkpoint: %s", path, strerror(errno));
    lt_status s = LT_OK;
    unsigned char *buf = NULL;
    size_t size = 0;
    if (fseek(f, 0, SEEK_END) != 0) {
        s = lt_error(ctx, LT_ERR_IO, "%s: cannot seek", path);
        goto done;
    }
    long sz = ftell(f);
    if (sz < 16) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: truncated checkpoint (%ld bytes)", path, sz);
        goto done;
    }
    size = (size_t)sz;
    rewind(f);
    buf = lt_alloc(ctx, LT_DEVICE_CPU, size, "checkpoint file");
    if (!buf) {
        s = LT_ERR_OOM;
        goto done;
    }
    if (fread(buf, 1, size, f) != size) {
        s = lt_error(ctx, LT_ERR_IO, "%s: short read", path);
        goto done;
    }
    reader r = {buf, size, 0, path};
    s = parse(ctx, &r, opt, st, params, n_params);
done:
    if (buf) lt_free(ctx, LT_DEVICE_CPU, buf, size);
    fclose(f);
    return s;
}
