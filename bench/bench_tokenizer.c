/* `longtune bench tokenizer`: single-thread encoding throughput (MB/s) of lt_tokenizer_encode over
 * a set of real documents, and in the same run the Hugging Face `tokenizers` library on the same
 * documents (bench/peers/tokenizers_peer.py, when Python can import `tokenizers`); reports the
 * ratio and whether both produced the same ids. Does not measure loading or decoding. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

static const char *usage =
    "longtune bench tokenizer [--model M.gguf | --tokenizer FILE] [--text DIR|FILE] [--mb N] [options]";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct docs {
    char *buf; /* documents separated by NUL */
    size_t len, cap;
    size_t *off; /* start of each document; n+1 entries */
    size_t n, off_cap;
} docs;

static int add_doc(docs *d, const char *s, size_t n) {
    if (d->len + n + 1 > d->cap) {
        size_t nc = (d->len + n + 1) * 2;
        char *nb = realloc(d->buf, nc);
        if (!nb) return -1;
        d->buf = nb;
        d->cap = nc;
    }
    if (d->n + 2 > d->off_cap) {
        size_t nc = d->off_cap ? d->off_cap * 2 : 64;
        size_t *no = realloc(d->off, nc * sizeof *no);
        if (!no) return -1;
        d->off = no;
        d->off_cap = nc;
    }
    if (!d->n) d->off[0] = 0;
    memcpy(d->buf + d->len, s, n);
    d->len += n;
    d->buf[d->len++] = '\0';
    d->off[++d->n] = d->len;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Adds files (sorted, recursing into folders) until `limit` bytes; NULs inside files are dropped. */
static void add_path(docs *d, const char *path, size_t limit) {
    if (d->len >= limit) return;
    struct stat st;
    if (stat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        if (!dir) return;
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (e->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                names = realloc(names, cap * sizeof *names);
            }
            size_t l = strlen(path) + strlen(e->d_name) + 2;
            names[n] = malloc(l);
            snprintf(names[n], l, "%s/%s", path, e->d_name);
            n++;
        }
        closedir(dir);
        if (n) qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n; i++) {
            add_path(d, names[i], limit);
            free(names[i]);
        }
        free(names);
        return;
    }
    if (!S_ISREG(st.st_mode) || st.st_size == 0) return;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t n = (size_t)st.st_size;
    if (n > limit - d->len) n = limit - d->len;
    char *b = malloc(n);
    size_t r = b ? fread(b, 1, n, f) : 0;
    fclose(f);
    size_t w = 0;
    for (size_t i = 0; i < r; i++)
        if (b[i]) b[w++] = b[i];
    if (w) add_doc(d, b, w);
    free(b);
}

static uint64_t fnv_ids(uint64_t h, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int k = 0; k < 4; k++) h = (h ^ ((v >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
    }
    return h;
}

static int python_has_tokenizers(void) { return system("python3 -c 'import tokenizers' >/dev/null 2>&1") == 0; }

/* --mb: megabytes of text, above 0 and at most 1024. */
static const char *parse_mb(const char *v, void *dst) {
    char *end;
    const double x = strtod(v, &end);
    if (end == v || *end || !(x > 0 && x <= 1024)) return "megabytes above 0, at most 1024";
    *(double *)dst = x;
    return NULL;
}

int lt_bench_tokenizer(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    const char *model = NULL, *tokfile = NULL, *text = "/usr/share/doc/python3.11-doc/html/_sources";
    double mb = 4;
    const lt_bench_arg flags[] = {
        LT_BENCH_STR("--model", &model),
        LT_BENCH_STR("--tokenizer", &tokfile),
        LT_BENCH_STR("--text", &text),
        LT_BENCH_FN("--mb", &mb, parse_mb),
    };
    const int parsed =
        lt_bench_parse_args("tokenizer", usage, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: %s\n\nEncodes documents (default: the Python docs' reST sources, the first --mb MB, one "
               "document per file) on one thread with longtune and with HF tokenizers, reporting MB/s and the "
               "ratio.\n\noptions:\n"
               "  --model M.gguf    tokenizer from a GGUF (default: the installed SmolLM2)\n"
               "  --tokenizer FILE  a tokenizer.json instead (the peer loads the same file)\n"
               "  --text PATH       a file or folder of text files (default %s)\n"
               "  --mb N            megabytes of text to use (default 4)\n" LT_BENCH_COMMON_HELP,
               usage, text);
        return 0;
    }
    if (parsed) return parsed;
    char default_model[1024];
    if (!model && !tokfile) {
        const char *cache = getenv("LONGTUNE_CACHE"), *home = getenv("HOME");
        if (cache) snprintf(default_model, sizeof default_model, "%s/smollm2-135m-instruct-q4_1.gguf", cache);
        else
            snprintf(default_model, sizeof default_model, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf",
                     home ? home : "");
        model = default_model;
    }
    lt_ctx *ctx = lt_ctx_new();
    lt_tokenizer *tok = NULL;
    lt_status s;
    if (tokfile) {
        s = lt_tokenizer_load_json(ctx, tokfile, &tok);
    } else {
        lt_gguf *g = NULL;
        s = lt_gguf_open(ctx, model, &g);
        if (s == LT_OK) s = lt_tokenizer_load_gguf(ctx, g, &tok);
        lt_gguf_close(g);
    }
    if (s != LT_OK) {
        fprintf(stderr, "longtune bench tokenizer: %s: %s\n", lt_status_str(s), lt_ctx_error(ctx));
        lt_ctx_free(ctx);
        return 1;
    }
    docs d = {0};
    add_path(&d, text, (size_t)(mb * 1048576.0));
    if (!d.n) {
        fprintf(stderr, "longtune bench tokenizer: no text under %s (install python3.11-doc or pass --text)\n", text);
        lt_tokenizer_free(tok);
        lt_ctx_free(ctx);
        return 1;
    }
    size_t bytes = d.len - d.n; /* without the separators */
    fprintf(stderr, "tokenizer bench: %zu documents, %.2f MB from %s\n", d.n, (double)bytes / 1048576.0, text);

    int runs = c.warmup + c.repeats;
    double *times = calloc((size_t)c.repeats, sizeof *times);
    size_t n_tokens = 0;
    uint64_t hash = 0;
    for (int r = 0; r < runs; r++) {
        double t0 = now_s();
        size_t nt = 0;
        uint64_t h = 0xCBF29CE484222325ull;
        for (size_t i = 0; i < d.n; i++) {
            int32_t *ids;
            size_t k;
            s = lt_tokenizer_encode(ctx, tok, d.buf + d.off[i], d.off[i + 1] - d.off[i] - 1, 0, &ids, &k);
            if (s != LT_OK) {
                fprintf(stderr, "longtune bench tokenizer: %s\n", lt_ctx_error(ctx));
                return 1;
            }
            nt += k;
            if (r == runs - 1) h = fnv_ids(h, ids, k); /* outside the timing would be fairer; cheap */
            free(ids);
        }
        double dt = now_s() - t0;
        if (r >= c.warmup) times[r - c.warmup] = dt;
        n_tokens = nt;
        hash = h;
    }
    double med = lt_bench_median(times, c.repeats);
    double mbps = (double)bytes / 1048576.0 / med;
    fprintf(stderr, "longtune: %.3f s, %.2f MB/s, %zu tokens\n", med, mbps, n_tokens);

    cJSON *res = lt_bench_result_new("tokenizer");
    cJSON *cfg = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(cfg, "tokenizer", tokfile ? tokfile : model);
    cJSON_AddStringToObject(cfg, "text", text);
    cJSON_AddNumberToObject(cfg, "documents", (double)d.n);
    cJSON_AddNumberToObject(cfg, "bytes", (double)bytes);
    cJSON_AddNumberToObject(cfg, "threads", 1);
    cJSON_AddNumberToObject(cfg, "repeats", c.repeats);
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "name", "longtune");
    cJSON_AddNumberToObject(a, "median_ms", med * 1e3);
    cJSON_AddNumberToObject(a, "mb_per_s", mbps);
    cJSON_AddNumberToObject(a, "tokens", (double)n_tokens);
    cJSON_AddNumberToObject(a, "tokens_per_s", (double)n_tokens / med);
    char hex[24];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    cJSON_AddStringToObject(a, "ids_fnv1a", hex);
    cJSON_AddItemToArray(arms, a);

    /* The peer, on the same documents. */
    if (python_has_tokenizers()) {
        char docpath[] = "/tmp/lt_bench_tok_XXXXXX";
        int fd = mkstemp(docpath);
        FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        int ok = f && fwrite(d.buf, 1, d.len, f) == d.len;
        if (f) fclose(f);
        const char *src = getenv("LONGTUNE_SOURCE_DIR");
        char peer[1024], cmd[4096];
        snprintf(peer, sizeof peer, "%s/bench/peers/tokenizers_peer.py", src ? src : ".");
        snprintf(cmd, sizeof cmd, "python3 '%s' %s '%s' --docs '%s' --repeats %d --warmup %d", peer,
                 tokfile ? "--tokenizer" : "--gguf", tokfile ? tokfile : model, docpath, c.repeats, c.warmup);
        FILE *p = ok ? popen(cmd, "r") : NULL;
        char line[4096] = "";
        if (p) {
            if (!fgets(line, sizeof line, p)) line[0] = '\0';
            pclose(p);
        }
        unlink(docpath);
        cJSON *pj = cJSON_Parse(line);
        const cJSON *ms = cJSON_GetObjectItem(pj, "median_s");
        if (cJSON_IsNumber(ms)) {
            double pmed = ms->valuedouble, pmbps = (double)bytes / 1048576.0 / pmed;
            const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(pj, "ids_fnv1a"));
            double ptok = cJSON_GetNumberValue(cJSON_GetObjectItem(pj, "tokens"));
            int same = ph && !strcmp(ph, hex) && (size_t)ptok == n_tokens;
            cJSON *b = cJSON_CreateObject();
            cJSON_AddStringToObject(b, "name", "hf-tokenizers");
            const char *ver = cJSON_GetStringValue(cJSON_GetObjectItem(pj, "tokenizers_version"));
            cJSON_AddStringToObject(b, "version", ver ? ver : "?");
            cJSON_AddNumberToObject(b, "median_ms", pmed * 1e3);
            cJSON_AddNumberToObject(b, "mb_per_s", pmbps);
            cJSON_AddNumberToObject(b, "tokens", ptok);
            cJSON_AddNumberToObject(b, "tokens_per_s", ptok / pmed);
            cJSON_AddStringToObject(b, "ids_fnv1a", ph ? ph : "?");
            cJSON_AddItemToArray(arms, b);
            cJSON_AddNumberToObject(res, "ratio_vs_hf", pmed / med);
            cJSON_AddBoolToObject(res, "same_ids_as_hf", same);
            fprintf(stderr, "hf tokenizers %s: %.3f s, %.2f MB/s; longtune/hf = %.2fx; ids %s\n", ver ? ver : "?", pmed,
                    pmbps, pmed / med, same ? "identical" : "DIFFER");
        } else {
            fprintf(stderr, "peer failed (%s); reporting longtune only\n", cmd);
            cJSON_AddStringToObject(res, "peer", "failed");
        }
        cJSON_Delete(pj);
    } else {
        fprintf(stderr, "python3 cannot import tokenizers: reporting longtune only\n");
        cJSON_AddStringToObject(res, "peer", "tokenizers not importable");
    }
    free(times);
    free(d.buf);
    free(d.off);
    lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
    return lt_bench_write(&c, res, NULL);
}
