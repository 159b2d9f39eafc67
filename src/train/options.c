/* Run options: one table of keys drives argv flags and the JSON config file alike, then
 * lt_train_options_resolve fills defaults and checks ranges. Nothing here opens models or data;
 * whether the paths exist is found out by the loaders. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "longtune/train.h"
#include "io/json_nul.h"
#include "train/train_internal.h"

typedef enum { K_STR, K_I64, K_U64, K_F64, K_BOOL, K_INT, K_SCHED, K_RECOMP, K_ATTN, K_LOSS, K_DEVICE, K_ROPE } kind;

typedef struct {
    const char *key; /* with '_' */
    kind k;
    size_t off;
    size_t cap;    /* K_STR: buffer size */
    double lo, hi; /* numeric range (inclusive) */
} option;

#define O(f) offsetof(lt_train_options, f)
#define S(f) sizeof(((lt_train_options *)0)->f)
static const option options[] = {
    {"model", K_STR, O(model), S(model), 0, 0},
    {"data", K_STR, O(data), S(data), 0, 0},
    {"adapter_path", K_STR, O(adapter_path), S(adapter_path), 0, 0},
    {"resume_adapter_file", K_STR, O(resume_adapter_file), S(resume_adapter_file), 0, 0},
    {"iters", K_I64, O(iters), 0, 1, 1e12},
    {"batch_size", K_I64, O(batch_size), 0, 1, 1 << 20},
    {"max_seq_length", K_I64, O(max_seq_length), 0, 2, 1 << 24},
    {"seq_len_curriculum", K_STR, O(seq_len_curriculum), S(seq_len_curriculum), 0, 0},
    {"learning_rate", K_F64, O(learning_rate), 0, 0, 10},
    {"min_lr", K_F64, O(min_lr), 0, 0, 10},
    {"num_layers", K_I64, O(num_layers), 0, -1, 1 << 16},
    {"mask_prompt", K_BOOL, O(mask_prompt), 0, 0, 1},
    {"grad_checkpoint", K_BOOL, O(grad_checkpoint), 0, 0, 1},
    {"save_every", K_I64, O(save_every), 0, 1, 1e12},
    {"steps_per_eval", K_I64, O(steps_per_eval), 0, 1, 1e12},
    {"steps_per_report", K_I64, O(steps_per_report), 0, 1, 1e12},
    {"val_batches", K_I64, O(val_batches), 0, -1, 1e12},
    {"seed", K_U64, O(seed), 0, 0, 0},
    {"lora_rank", K_I64, O(lora_rank), 0, 1, 4096},
    {"lora_alpha", K_F64, O(lora_alpha), 0, 0, 1e6},
    {"lora_dropout", K_F64, O(lora_dropout), 0, 0, 0.999},
    {"lora_targets", K_STR, O(lora_targets), S(lora_targets), 0, 0},
    {"lr_schedule", K_SCHED, O(lr_schedule), 0, 0, 0},
    {"warmup", K_I64, O(warmup), 0, 0, 1e12},
    {"weight_decay", K_F64, O(weight_decay), 0, 0, 10},
    {"beta1", K_F64, O(beta1), 0, 0, 0.999999},
    {"beta2", K_F64, O(beta2), 0, 0, 0.999999999},
    {"eps", K_F64, O(eps), 0, 0, 1},
    {"grad_accum", K_I64, O(grad_accum), 0, 1, 1 << 20},
    {"grad_clip", K_F64, O(grad_clip), 0, 0, 1e9},
    {"recompute", K_RECOMP, O(recompute), 0, 0, 0},
    {"recompute_attention", K_BOOL, O(recompute_attention), 0, 0, 1},
    {"recompute_attention_layers", K_I64, O(recompute_attention_layers), 0, 0, 1 << 16},
    {"offload_checkpoints", K_BOOL, O(offload_checkpoints), 0, 0, 1},
    {"attention", K_ATTN, O(attention), 0, 0, 0},
    {"loss", K_LOSS, O(loss), 0, 0, 0},
    {"no_pack", K_BOOL, O(no_pack), 0, 0, 1},
    {"pack_algorithm", K_STR, O(pack_algorithm), S(pack_algorithm), 0, 0},
    {"quantize", K_STR, O(quantize), S(quantize), 0, 0},
    {"base_dtype", K_STR, O(base_dtype), S(base_dtype), 0, 0},
    {"fp8_skip", K_STR, O(fp8_skip), S(fp8_skip), 0, 0},
    {"threads", K_INT, O(threads), 0, 0, 4096},
    {"device", K_DEVICE, O(device), 0, 0, 0},
    {"distributed", K_STR, O(distributed), S(distributed), 0, 0},
    {"context_parallel", K_BOOL, O(context_parallel), 0, 0, 1},
    {"cuda_graph", K_STR, O(cuda_graph), S(cuda_graph), 0, 0},
    {"rope_scaling", K_ROPE, O(rope_scaling), 0, 0, 0},
    {"rope_factor", K_F64, O(rope_factor), 0, -1e300, 1e300}, /* > 0 checked by resolve, named */
    {"original_max_position", K_I64, O(original_max_position), 0, 1, 1e15},
    {"yarn_beta_fast", K_F64, O(yarn_beta_fast), 0, 0, 1e6},
    {"yarn_beta_slow", K_F64, O(yarn_beta_slow), 0, 0, 1e6},
    {"rope_attn_factor", K_F64, O(rope_attn_factor), 0, 0, 1e6},
    {"chat_template", K_STR, O(chat_template), S(chat_template), 0, 0},
    {"test", K_BOOL, O(test), 0, 0, 1},
    {"test_batches", K_I64, O(test_batches), 0, -1, 1e12},
    {"overwrite", K_BOOL, O(overwrite), 0, 0, 1},
    {"memory_ceiling", K_STR, O(memory_ceiling), S(memory_ceiling), 0, 0},
    {"allow_low_memory", K_BOOL, O(allow_low_memory), 0, 0, 1},
    {"no_memory_guard", K_BOOL, O(no_memory_guard), 0, 0, 1},
    {"moe_chunk_tokens", K_I64, O(moe_chunk_tokens), 0, 1, INT32_MAX},
    {"chunk_rows", K_I64, O(chunk_rows), 0, 1, INT32_MAX},
    {"bf16_products", K_BOOL, O(bf16_products), 0, 0, 1},
};
/* lt_train_options.given has one bit per option. */
_Static_assert(sizeof options / sizeof options[0] <= 64, "more options than bits in lt_train_options.given");
_Static_assert(sizeof options / sizeof options[0] <= 64, "lt_train_options.given has a bit per option");
#undef S

static const option *find(const char *key) {
    char k[64];
    size_t n = strlen(key);
    if (n >= sizeof k) return NULL;
    for (size_t i = 0; i <= n; i++) k[i] = key[i] == '-' ? '_' : key[i];
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (!strcmp(options[i].key, k)) return &options[i];
    return NULL;
}

lt_train_option_kind lt_train_option_kind_of(const char *key) {
    const option *o = key ? find(key) : NULL;
    if (!o) return LT_TRAIN_OPTION_UNKNOWN;
    return o->k == K_BOOL ? LT_TRAIN_OPTION_BOOL : LT_TRAIN_OPTION_VALUE;
}

/* Numbers are plain decimal text: digits, sign, point and exponent only -- no spaces (strtod and
 * strtoll skip leading ones), no hex ("0x2"), no inf/nan. */
static int plain_decimal(const char *s) {
    if (!*s) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '-' || *p == '+' || *p == '.' || *p == 'e' || *p == 'E')) return 0;
    return 1;
}

static int parse_f64(const char *s, double *out) {
    char *end;
    if (!plain_decimal(s)) return -1;
    errno = 0;
    double v = strtod(s, &end);
    /* An underflow (1e-320: subnormal or 0) is still the number written; an overflow is not. */
    if (end == s || *end || (errno == ERANGE && fabs(v) >= 1) || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    if (!plain_decimal(s)) return -1;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE) {
        /* Accept integral floats such as "1e3" from config files and habits. */
        double d;
        if (parse_f64(s, &d) || d != floor(d) || fabs(d) > 9e15) return -1;
        *out = (int64_t)d;
        return 0;
    }
    *out = v;
    return 0;
}

static lt_status set_value(lt_ctx *ctx, lt_train_options *opt, const option *o, const char *key, const char *value);

lt_status lt_train_options_set(lt_ctx *ctx, lt_train_options *opt, const char *key, const char *value) {
    const option *o = key ? find(key) : NULL;
    if (!o) return lt_error(ctx, LT_ERR_NOT_FOUND, "unknown training option '%s'", key ? key : "(null)");
    if (!value) return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s' needs a value", key);
    LT_TRY(set_value(ctx, opt, o, key, value));
    opt->given |= 1ull << (o - options); /* so a given 0 is honoured or refused, never defaulted */
    return LT_OK;
}

/* Whether the option stored at offset `off` was given (lt_train_options_set). */
static int given(const lt_train_options *opt, size_t off) {
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (options[i].off == off) return (int)((opt->given >> i) & 1);
    return 0;
}

static lt_status set_value(lt_ctx *ctx, lt_train_options *opt, const option *o, const char *key, const char *value) {
    char *field = (char *)opt + o->off;
    switch (o->k) {
    case K_STR: {
        size_t n = strlen(value);
        if (n >= o->cap)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': value is %zu bytes, at most %zu", key, n,
                            o->cap - 1);
        memcpy(field, value, n + 1);
        return LT_OK;
    }
    case K_I64:
    case K_INT: {
        int64_t v;
        if (parse_i64(value, &v) || (double)v < o->lo || (double)v > o->hi)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not an integer in [%.0f, %.0f]", key, value,
                            o->lo, o->hi);
        if (o->k == K_INT) {
            int iv = (int)v;
            memcpy(field, &iv, sizeof iv);
        } else {
            memcpy(field, &v, sizeof v);
        }
        return LT_OK;
    }
    case K_U64: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(value, &end, 10);
        if (!plain_decimal(value) || strpbrk(value, "-+.eE") || end == value || *end || errno == ERANGE)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not a non-negative integer", key, value);
        uint64_t u = v;
        memcpy(field, &u, sizeof u);
        return LT_OK;
    }
    case K_F64: {
        double v;
        if (parse_f64(value, &v) || v < o->lo || v > o->hi)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not a number in [%g, %g]", key, value, o->lo,
                            o->hi);
        memcpy(field, &v, sizeof v);
        return LT_OK;
    }
    case K_BOOL: {
        int v;
        if (!strcmp(value, "1") || !strcmp(value, "true")) v = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false")) v = 0;
        else return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not true/false", key, value);
        memcpy(field, &v, sizeof v);
        return LT_OK;
    }
    case K_SCHED: {
        lt_lr_schedule v;
        if (!strcmp(value, "constant")) v = LT_LR_SCHEDULE_CONSTANT;
        else if (!strcmp(value, "cosine")) v = LT_LR_SCHEDULE_COSINE;
        else return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not constant|cosine", key, value);
        memcpy(field, &v, sizeof v);
        return LT_OK;
    }
    case K_RECOMP: {
        lt_recompute v;
        int64_t every = 0;
        opt->recompute_auto = !strcmp(value, "auto");
        if (!strcmp(value, "none") || opt->recompute_auto) v = LT_RECOMPUTE_NONE;
        else if (!strcmp(value, "all")) v = LT_RECOMPUTE_EVERY;
        else if (!strncmp(value, "every:", 6) && !parse_i64(value + 6, &every) && every >= 1 && every <= 65536)
            v = LT_RECOMPUTE_EVERY_K;
        else if (!strcmp(value, "sliding") || !strcmp(value, "global"))
            v = value[0] == 's' ? LT_RECOMPUTE_SLIDING : LT_RECOMPUTE_GLOBAL;
        else if ((!strncmp(value, "sliding:", 8) || !strncmp(value, "global:", 7)) &&
                 !parse_i64(strchr(value, ':') + 1, &every) && every >= 1 && every <= 65536)
            v = value[0] == 's' ? LT_RECOMPUTE_SLIDING : LT_RECOMPUTE_GLOBAL;
        else
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option '%s': '%s' is not none|all|every:K|sliding[:K]|global[:K] (K >= 1)|auto", key,
                            value);
        opt->recompute = v;
        opt->recompute_every = every;
        return LT_OK;
    }
    case K_ATTN: {
        lt_attention_impl v;
        if (!strcmp(value, "flash")) v = LT_ATTENTION_FLASH;
        else if (!strcmp(value, "naive")) v = LT_ATTENTION_NAIVE;
        else return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not flash|naive", key, value);
        memcpy(field, &v, sizeof v);
        return LT_OK;
    }
    case K_LOSS: {
        lt_lce_impl v;
        if (!strcmp(value, "fused")) v = LT_LCE_FUSED;
        else if (!strcmp(value, "chunked")) v = LT_LCE_CHUNKED;
        else if (!strcmp(value, "naive")) v = LT_LCE_NAIVE;
        else return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not fused|chunked|naive", key, value);
        memcpy(field, &v, sizeof v);
        return LT_OK;
    }
    case K_ROPE: {
        lt_rope_scaling v;
        if (!strcmp(value, "default") || lt_rope_scaling_parse(ctx, value, &v) != LT_OK)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not linear|dynamic|yarn|llama3|longrope",
                            key, value);
        memcpy(field, &v, sizeof v);
        return LT_OK;
    }
    case K_DEVICE: {
        /* Whether this build and machine have the device is the loader's question (a typed
         * LT_ERR_UNSUPPORTED), not a parse error. */
        lt_device v;
        if (!strcmp(value, "cpu")) v = LT_DEVICE_CPU;
        else if (!strcmp(value, "cuda")) v = LT_DEVICE_CUDA;
        else return lt_error(ctx, LT_ERR_INVALID_ARG, "option '%s': '%s' is not cpu|cuda", key, value);
        memcpy(field, &v, sizeof v);
        return LT_OK;
    }
    }
    LT_ABORT("option kind %d", (int)o->k);
}

/* JSON value → the text form lt_train_options_set parses. */
static lt_status json_value_text(lt_ctx *ctx, const char *path, const cJSON *item, char *buf, size_t cap) {
    if (cJSON_IsString(item)) {
        if (strlen(item->valuestring) >= cap)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: key '%s': string too long", path, item->string);
        snprintf(buf, cap, "%s", item->valuestring);
    } else if (cJSON_IsBool(item)) {
        snprintf(buf, cap, "%s", cJSON_IsTrue(item) ? "true" : "false");
    } else if (cJSON_IsNumber(item)) {
        double d = item->valuedouble;
        if (d == floor(d) && fabs(d) < 9e15) snprintf(buf, cap, "%lld", (long long)d);
        else snprintf(buf, cap, "%.17g", d);
    } else if (cJSON_IsArray(item)) {
        size_t used = 0;
        buf[0] = '\0';
        const cJSON *e;
        cJSON_ArrayForEach(e, item) {
            if (!cJSON_IsString(e))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%s': array elements must be strings", path, item->string);
            int w = snprintf(buf + used, cap - used, "%s%s", used ? "," : "", e->valuestring);
            if (w < 0 || (size_t)w >= cap - used)
                return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: key '%s': list too long", path, item->string);
            used += (size_t)w;
        }
    } else {
        return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%s': expected a string, number, boolean or list", path,
                        item->string);
    }
    return LT_OK;
}

lt_status lt_train_options_load_json(lt_ctx *ctx, lt_train_options *opt, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, LT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    lt_status s = LT_OK;
    cJSON *root = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: is %s, not a JSON config file", path,
                     S_ISDIR(sb.st_mode) ? "a folder" : "not a regular file");
        goto done;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        s = lt_error(ctx, LT_ERR_IO, "%s: cannot seek", path);
        goto done;
    }
    long size = ftell(f);
    if (size < 0 || size > (1L << 24)) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: config file of %ld bytes (at most 16 MiB)", path, size);
        goto done;
    }
    rewind(f);
    /* Tiny transient host scratch for parsing (as in the CLI): not accounted. */
    text = malloc((size_t)size + 1);
    if (!text) {
        s = lt_error(ctx, LT_ERR_OOM, "%s: cannot buffer the config", path);
        goto done;
    }
    if (fread(text, 1, (size_t)size, f) != (size_t)size) {
        s = lt_error(ctx, LT_ERR_IO, "%s: short read", path);
        goto done;
    }
    text[size] = '\0';
    int64_t nul = lt_json_nul_line(text, (size_t)size);
    if (nul) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: line %lld: string contains U+0000", path, (long long)nul);
        goto done;
    }
    root = cJSON_ParseWithLength(text, (size_t)size);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= text && at <= text + size ? (long)(at - text) : -1;
        int line = 1;
        for (long i = 0; i < off; i++) line += text[i] == '\n';
        s = lt_error(ctx, LT_ERR_FORMAT, "%s:%d: invalid JSON", path, line);
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: the config must be a JSON object of options", path);
        goto done;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        char buf[LT_TRAIN_PATH_MAX];
        if (!find(item->string)) {
            s = lt_error(ctx, LT_ERR_NOT_FOUND, "%s: unknown option '%s'", path, item->string);
            goto done;
        }
        if ((s = json_value_text(ctx, path, item, buf, sizeof buf)) != LT_OK) goto done;
        if ((s = lt_train_options_set(ctx, opt, item->string, buf)) != LT_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", lt_ctx_error(ctx));
            s = lt_error(ctx, s, "%s: %s", path, msg);
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    free(text);
    fclose(f);
    return s;
}

/* "p:len,p:len,...": stage k from step ceil(p_k · iters) on. The first p is 0, p rises strictly
 * below 1, lengths do not fall; max_seq_length is the last stage's (an explicit other value is
 * refused, so the planner and the buffers size the longest stage). */
static lt_status parse_curriculum(lt_ctx *ctx, lt_train_options *o, int max_seq_given) {
    const char *p = o->seq_len_curriculum;
    int n = 0;
    double prev_p = -1;
    while (*p) {
        if (n == LT_TRAIN_MAX_STAGES)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'seq_len_curriculum': more than %d stages",
                            LT_TRAIN_MAX_STAGES);
        char *end;
        errno = 0;
        double prog = strtod(p, &end);
        if (end == p || *end != ':' || errno || !isfinite(prog))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'seq_len_curriculum': stage %d is not progress:length (\"%.40s\")", n + 1, p);
        const char *q = end + 1;
        if (*q < '0' || *q > '9')
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'seq_len_curriculum': stage %d has no length", n + 1);
        errno = 0;
        long long len = strtoll(q, &end, 10);
        if (errno || (*end && *end != ','))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'seq_len_curriculum': stage %d: length \"%.20s\" is not an integer", n + 1, q);
        if (n == 0 && prog != 0)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'seq_len_curriculum': the first stage must start at progress 0 (got %g)", prog);
        if (prog < 0 || prog >= 1 || prog <= prev_p)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'seq_len_curriculum': stage %d starts at progress %g; progress must rise "
                            "strictly within [0, 1)",
                            n + 1, prog);
        if (len < 2 || len > (1 << 24))
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'seq_len_curriculum': stage %d length %lld is outside [2, %d]", n + 1, len,
                            1 << 24);
        if (n > 0 && len < o->stage_len[n - 1])
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'seq_len_curriculum': stage %d length %lld is shorter than stage %d's %lld "
                            "(lengths must not fall)",
                            n + 1, len, n, (long long)o->stage_len[n - 1]);
        o->stage_step[n] = (int64_t)ceil(prog * (double)o->iters);
        o->stage_len[n] = len;
        prev_p = prog;
        n++;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'seq_len_curriculum': trailing ','");
    }
    if (n == 0) return LT_OK;
    o->n_stages = n;
    int64_t last = o->stage_len[n - 1];
    if (max_seq_given && o->max_seq_length != last)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'max_seq_length' (%lld) disagrees with 'seq_len_curriculum', whose longest stage is "
                        "%lld tokens (leave max_seq_length out or set it to %lld)",
                        (long long)o->max_seq_length, (long long)last, (long long)last);
    o->max_seq_length = last;
    if (o->context_parallel)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'seq_len_curriculum' cannot be combined with 'context_parallel' (its rows have "
                        "one fixed length)");
    return LT_OK;
}

int64_t lt_train_seq_len_at(const lt_train_options *opt, int64_t step) {
    int64_t len = opt->max_seq_length;
    for (int k = 0; k < opt->n_stages; k++)
        if (step >= opt->stage_step[k]) len = opt->stage_len[k];
    return len;
}

static const char *const default_targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";

int lt_train_targets_defaulted(const lt_train_options *opt) {
    return !given(opt, O(lora_targets)) && !strcmp(opt->lora_targets, default_targets);
}

/* Canonical target name of a token ("q" → "q_proj"; the experts' stacks of MoE layers by their
 * full names "experts.gate_up_proj", "experts.down_proj"); NULL if unknown. */
static const char *canonical_target(const char *t, size_t n) {
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    static const char *const experts[] = {"experts.gate_up_proj", "experts.down_proj"};
    for (size_t i = 0; i < 2; i++)
        if (n == strlen(experts[i]) && !strncmp(t, experts[i], n)) return experts[i];
    for (size_t i = 0; i < 7; i++) {
        size_t ln = strlen(names[i]), sn = ln - 5; /* short form without "_proj" */
        if ((n == ln && !strncmp(t, names[i], n)) || (n == sn && !strncmp(t, names[i], n))) return names[i];
    }
    return NULL;
}

/* 1 when the comma-separated list holds the token t whole ("experts.down_proj" holds no "down_proj"). */
static int has_token(const char *list, const char *t) {
    size_t n = strlen(t);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, t, n)) return 1;
        p = e ? e + 1 : p + len;
    }
    return 0;
}

/* The projection mask of an fp8_skip list (bit p: lt_proj p); its names as lora_targets takes them. */
static lt_status fp8_skip_mask(lt_ctx *ctx, const char *list, unsigned *mask) {
    *mask = 0;
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *t = p;
        while (n && t[0] == ' ') t++, n--;
        while (n && t[n - 1] == ' ') n--;
        const char *c = canonical_target(t, n);
        int k = -1;
        for (int i = 0; c && i < LT_PROJ_COUNT_; i++) /* the canonical names are lt_proj_name's */
            if (!strcmp(c, lt_proj_name((lt_proj)i))) k = i;
        if (k < 0)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'fp8_skip': '%.*s' is not one of q,k,v,o,gate,up,down",
                            (int)n, t);
        *mask |= 1u << k;
        p = e ? e + 1 : p + strlen(p);
    }
    return LT_OK;
}

lt_status lt_train_model_options(lt_ctx *ctx, const lt_train_options *opt, lt_model_options *out) {
    memset(out, 0, sizeof *out);
    out->device = opt->device;
    out->quantize_dtype = LT_DTYPE_F32;
    if (opt->base_dtype[0] && strcmp(opt->base_dtype, "file") && strcmp(opt->base_dtype, "fp8"))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'base_dtype': '%s' is not file|fp8", opt->base_dtype);
    if (opt->fp8_skip[0] && strcmp(opt->base_dtype, "fp8"))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'fp8_skip' %s needs 'base_dtype' fp8", opt->fp8_skip);
    if (!strcmp(opt->base_dtype, "fp8")) {
        LT_TRY(fp8_skip_mask(ctx, opt->fp8_skip, &out->fp8_skip));
        if (out->fp8_skip == (1u << LT_PROJ_COUNT_) - 1u)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'fp8_skip' %s skips every projection: drop 'base_dtype' fp8", opt->fp8_skip);
        out->quantize_dtype = LT_DTYPE_FP8;
        return LT_OK;
    }
    if (opt->quantize[0] && lt_dtype_parse(opt->quantize, &out->quantize_dtype) != LT_OK) {
        out->quantize_dtype = LT_DTYPE_F32;
        return lt_error(ctx, LT_ERR_INVALID_ARG, "--quantize %s: not a dtype", opt->quantize);
    }
    return LT_OK;
}

lt_status lt_train_options_resolve(lt_ctx *ctx, const lt_train_options *in, lt_train_options *out) {
    lt_train_options o = *in;
    if (!o.model[0]) return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'model' is required");
    if (!o.data[0]) return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'data' is required");
    if (!o.adapter_path[0]) snprintf(o.adapter_path, sizeof o.adapter_path, "adapters");
    LT_TRY(lt_train_check_out_paths(ctx, o.adapter_path));
    if (o.iters <= 0) o.iters = 1000;
    if (o.batch_size <= 0) o.batch_size = 4;
    int max_seq_given = o.max_seq_length > 0;
    if (o.max_seq_length <= 0) o.max_seq_length = 2048;
    o.n_stages = 0;
    LT_TRY(parse_curriculum(ctx, &o, max_seq_given));
    /* Defaults fill what was not given; a given value of 0 is honoured where it means something
     * (learning rate, beta1, beta2) and refused where it does not. */
    if (given(in, O(eps)) && o.eps <= 0) return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'eps': 0 is not in (0, 1]");
    if (given(in, O(lora_alpha)) && o.lora_alpha <= 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'lora_alpha': 0 is not in (0, 1e+06] (it would scale LoRA to 0)");
    if (given(in, O(num_layers)) && o.num_layers == 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'num_layers': 0 is not in [1, 65536] or -1 (all)");
    if (given(in, O(val_batches)) && o.val_batches == 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'val_batches': 0 is not in [1, 1e12] or -1 (all)");
    if (given(in, O(lora_targets)) && !o.lora_targets[0])
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'lora_targets' is empty");
    if (o.learning_rate <= 0 && !given(in, O(learning_rate))) o.learning_rate = 1e-5;
    if (o.num_layers == 0) o.num_layers = -1;
    if (o.save_every <= 0) o.save_every = 100;
    if (o.steps_per_eval <= 0) o.steps_per_eval = 200;
    if (o.steps_per_report <= 0) o.steps_per_report = 10;
    if (o.val_batches == 0) o.val_batches = 25;
    if (o.lora_rank <= 0) o.lora_rank = 8;
    if (o.lora_alpha <= 0) o.lora_alpha = 16;
    if (o.beta1 <= 0 && !given(in, O(beta1))) o.beta1 = 0.9;
    if (o.beta2 <= 0 && !given(in, O(beta2))) o.beta2 = 0.999;
    if (o.eps <= 0) o.eps = 1e-8;
    if (o.grad_accum <= 0) o.grad_accum = 1;
    if (o.attention == LT_ATTENTION_AUTO) o.attention = LT_ATTENTION_FLASH;
    if (o.loss == LT_LCE_AUTO) o.loss = LT_LCE_FUSED;
    if (o.recompute_auto && (o.grad_checkpoint || o.offload_checkpoints))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'recompute' auto chooses the policy itself: drop '%s'",
                        o.grad_checkpoint ? "grad_checkpoint" : "offload_checkpoints");
    if (o.grad_checkpoint && o.recompute == LT_RECOMPUTE_NONE) o.recompute = LT_RECOMPUTE_EVERY;
    if (o.recompute == LT_RECOMPUTE_EVERY_K && o.recompute_every < 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'recompute': every:K needs K >= 1");
    if (o.recompute != LT_RECOMPUTE_EVERY_K && o.recompute != LT_RECOMPUTE_SLIDING &&
        o.recompute != LT_RECOMPUTE_GLOBAL)
        o.recompute_every = 0;
    if (o.recompute_attention_layers > 0 && o.recompute_auto)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'recompute' auto chooses how many layers rerun attention itself: drop "
                        "'recompute_attention_layers'");
    if (o.recompute_attention_layers > 0 && o.recompute == LT_RECOMPUTE_NONE)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'recompute_attention_layers' needs a recompute policy (recompute all, every:K, "
                        "sliding or global): only recomputed layers rerun attention");
    if (o.recompute_attention_layers > 0 && o.recompute_attention)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "options 'recompute_attention' and 'recompute_attention_layers': the first reruns "
                        "attention in every recomputed layer, give one of them");
    if (o.offload_checkpoints && o.recompute == LT_RECOMPUTE_NONE)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'offload_checkpoints' needs a recompute policy (recompute all, "
                        "every:K, sliding or global, or grad_checkpoint): without one there are no "
                        "checkpoints to offload");
    if (o.min_lr > o.learning_rate)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'min_lr' (%g) exceeds 'learning_rate' (%g)", o.min_lr,
                        o.learning_rate);
    if (o.warmup > o.iters)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'warmup' (%lld) exceeds 'iters' (%lld)", (long long)o.warmup,
                        (long long)o.iters);
    if (o.test_batches == 0) o.test_batches = 500;
    if (!o.cuda_graph[0]) snprintf(o.cuda_graph, sizeof o.cuda_graph, "on");
    if (strcmp(o.cuda_graph, "on") && strcmp(o.cuda_graph, "off"))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'cuda_graph': '%s' is not on|off", o.cuda_graph);
    if (!o.distributed[0]) snprintf(o.distributed, sizeof o.distributed, "auto");
    if (strcmp(o.distributed, "auto") && strcmp(o.distributed, "off") && strcmp(o.distributed, "nccl"))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'distributed': '%s' is not auto|off|nccl", o.distributed);
    if (o.lora_dropout < 0 || o.lora_dropout >= 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'lora_dropout' must be in [0, 1)");
    if (o.quantize[0] && strcmp(o.quantize, "int4_g64") && strcmp(o.quantize, "q4_0") && strcmp(o.quantize, "q4_1") &&
        strcmp(o.quantize, "q8_0") && strcmp(o.quantize, "q4_k") && strcmp(o.quantize, "q5_k") &&
        strcmp(o.quantize, "q6_k"))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'quantize': '%s' is not int4_g64|q4_0|q4_1|q8_0|q4_k|q5_k|q6_k", o.quantize);
    if (!strcmp(o.base_dtype, "fp8") && o.quantize[0])
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'base_dtype' fp8 holds the base in fp8 itself: drop 'quantize' %s", o.quantize);
    {
        lt_model_options mo; /* base_dtype and fp8_skip, as the model takes them */
        LT_TRY(lt_train_model_options(ctx, &o, &mo));
    }
    if (o.rope_scaling == LT_ROPE_SCALING_NONE &&
        (o.rope_factor != 0 || o.original_max_position != 0 || o.yarn_beta_fast != 0 || o.yarn_beta_slow != 0 ||
         o.rope_attn_factor != 0))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "options 'rope_factor', 'original_max_position', 'yarn_beta_*' and 'rope_attn_factor' need "
                        "'rope_scaling'");
    if (o.rope_scaling != LT_ROPE_SCALING_NONE && !(o.rope_factor > 0))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'rope_scaling' %s needs 'rope_factor' > 0 (got %g)",
                        lt_rope_scaling_name(o.rope_scaling), o.rope_factor);
    if ((o.yarn_beta_fast != 0 || o.yarn_beta_slow != 0) && o.rope_scaling != LT_ROPE_SCALING_YARN)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "options 'yarn_beta_fast'/'yarn_beta_slow' need 'rope_scaling' yarn");
    /* Normalise the target list to canonical names, each once, in the order given. */
    const char *src = o.lora_targets[0] ? in->lora_targets : default_targets;
    char norm[sizeof o.lora_targets];
    size_t used = 0;
    norm[0] = '\0';
    for (const char *p = src; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && p[0] == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        const char *c = canonical_target(p, n);
        if (!c)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'lora_targets': '%.*s' is not one of q,k,v,o,gate,up,down (or *_proj), "
                            "experts.gate_up_proj, experts.down_proj",
                            (int)n, p);
        if (!has_token(norm, c)) used += (size_t)snprintf(norm + used, sizeof norm - used, "%s%s", used ? "," : "", c);
        p = e ? e + 1 : p + strlen(p);
    }
    if (!used) return lt_error(ctx, LT_ERR_INVALID_ARG, "option 'lora_targets' is empty");
    memcpy(o.lora_targets, norm, used + 1);
    *out = o;
    return LT_OK;
}

double lt_train_lr(const lt_train_options *opt, int64_t step) {
    double lr = opt->learning_rate;
    if (step < 0) step = 0;
    if (opt->warmup > 0 && step < opt->warmup) return lr * (double)(step + 1) / (double)opt->warmup;
    if (opt->lr_schedule == LT_LR_SCHEDULE_CONSTANT) return lr;
    int64_t span = opt->iters - opt->warmup;
    if (span <= 0) return opt->min_lr;
    double progress = (double)(step - opt->warmup) / (double)span;
    if (progress > 1) progress = 1;
    return opt->min_lr + 0.5 * (lr - opt->min_lr) * (1 + cos(3.14159265358979323846 * progress));
}

lt_rope_override lt_train_rope_override(const lt_train_options *opt) {
    lt_rope_override r;
    memset(&r, 0, sizeof r);
    r.scaling = opt->rope_scaling;
    r.factor = opt->rope_factor;
    r.original_ctx = opt->original_max_position;
    r.beta_fast = opt->yarn_beta_fast;
    r.beta_slow = opt->yarn_beta_slow;
    r.attn_factor = opt->rope_attn_factor;
    return r;
}
