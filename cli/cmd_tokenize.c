/* `longtune tokenize`: encodes stdin records to token ids (or decodes ids back) with the
 * tokenizer of a GGUF model, a model folder or a tokenizer.json, so users can see exactly what the
 * trainer sees. Records are split by a delimiter (default newline). No chat templating here. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longtune/tokenizer.h"

static const char *usage =
    "longtune tokenize (--model M.gguf|DIR | --tokenizer tokenizer.json) [--delimiter D] [--json] "
    "[--decode] [--add-special] [--skip-special]";

static void print_help(void) {
    printf("usage: %s\n\n"
           "Reads text on stdin and prints one line of space-separated token ids per record.\n\n"
           "options:\n"
           "  --model M         a GGUF file (its tokenizer.ggml.* metadata) or a folder with tokenizer.json\n"
           "  --tokenizer FILE  a Hugging Face tokenizer.json (tokenizer_config.json beside it is read)\n"
           "  --delimiter D     record separator (default \"\\n\"; escapes \\n \\t \\r \\0 \\\\ understood)\n"
           "  --json            encode: one JSON array of ids per line; decode: one JSON string per line\n"
           "  --decode          the reverse: each record holds ids (spaces, commas or a JSON array)\n"
           "  --add-special     add the tokenizer's special tokens (e.g. BOS) as HF add_special_tokens\n"
           "  --skip-special    with --decode, drop special tokens\n",
           usage);
}

/* Unescapes the delimiter argument into buf; returns its length or -1. */
static long parse_delim(const char *s, char *buf, size_t cap) {
    size_t n = 0;
    for (; *s; s++) {
        if (n + 1 >= cap) return -1;
        if (*s != '\\') {
            buf[n++] = *s;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': buf[n++] = '\n'; break;
        case 't': buf[n++] = '\t'; break;
        case 'r': buf[n++] = '\r'; break;
        case '0': buf[n++] = '\0'; break;
        case '\\': buf[n++] = '\\'; break;
        default: return -1;
        }
    }
    return n ? (long)n : -1;
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) break;
    }
    *len = n;
    return b;
}

static void print_json_string(const char *s, size_t n) {
    /* cJSON wants NUL-terminated text; decoded text holds no NUL unless a token spells one. */
    char *z = malloc(n + 1);
    if (!z) return;
    memcpy(z, s, n);
    z[n] = '\0';
    cJSON *j = cJSON_CreateString(z);
    char *out = j ? cJSON_PrintUnformatted(j) : NULL;
    if (out) fputs(out, stdout);
    free(out);
    cJSON_Delete(j);
    free(z);
}

/* Parses ids from a record: integers separated by spaces, commas or brackets. */
static int parse_ids(const char *s, size_t n, int32_t **ids, size_t *n_ids, size_t *bad_at) {
    size_t cap = 64, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    size_t i = 0;
    while (i < n) {
        char c = s[i];
        if (c == ' ' || c == ',' || c == '[' || c == ']' || c == '\t' || c == '\r' || c == '\n') {
            i++;
            continue;
        }
        if (c < '0' || c > '9') {
            if (!(c == '-' && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '9')) {
                *bad_at = i;
                free(v);
                return 1;
            }
        }
        long long x = 0;
        int neg = c == '-';
        if (neg) i++;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            x = x * 10 + (s[i] - '0');
            if (x > INT32_MAX) {
                *bad_at = i;
                free(v);
                return 1;
            }
            i++;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, cap * 2 * sizeof *v);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
            cap *= 2;
        }
        v[k++] = (int32_t)(neg ? -x : x);
    }
    *ids = v;
    *n_ids = k;
    return 0;
}

int lt_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *tokfile = NULL;
    char delim[64] = "\n";
    long dlen = 1;
    int json = 0, decode = 0, add_special = 0, skip_special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help();
            return LT_EXIT_OK;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--tokenizer") || !strcmp(a, "--delimiter")) {
            if (i + 1 >= argc) return lt_cli_usage_error("tokenize", usage, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--model")) model = v;
            else if (!strcmp(a, "--tokenizer")) tokfile = v;
            else if ((dlen = parse_delim(v, delim, sizeof delim)) < 0)
                return lt_cli_usage_error("tokenize", usage, "bad --delimiter '%s'", v);
        } else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--add-special")) add_special = 1;
        else if (!strcmp(a, "--skip-special")) skip_special = 1;
        else return lt_cli_usage_error("tokenize", usage, "unknown option '%s'", a);
    }
    if (!model == !tokfile) return lt_cli_usage_error("tokenize", usage, "give exactly one of --model and --tokenizer");
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    lt_tokenizer *tok = NULL;
    lt_status s = tokfile ? lt_tokenizer_load_json(ctx, tokfile, &tok) : lt_tokenizer_load(ctx, model, &tok);
    if (s != LT_OK) {
        int rc = lt_cli_fail("tokenize", ctx, s);
        lt_ctx_free(ctx);
        return rc;
    }
    size_t len;
    char *in = read_stdin(&len);
    int rc = LT_EXIT_OK;
    if (!in) {
        fprintf(stderr, "longtune tokenize: cannot read stdin\n");
        rc = LT_EXIT_FAIL;
        goto done;
    }
    size_t pos = 0, rec = 0;
    while (pos < len) {
        const char *start = in + pos;
        size_t n = len - pos;
        for (size_t j = pos; j + (size_t)dlen <= len; j++)
            if (!memcmp(in + j, delim, (size_t)dlen)) {
                n = j - pos;
                break;
            }
        pos += n + (size_t)dlen;
        rec++;
        if (!decode) {
            int32_t *ids;
            size_t k;
            s = lt_tokenizer_encode(ctx, tok, start, n, add_special, &ids, &k);
            if (s != LT_OK) {
                rc = lt_cli_fail("tokenize", ctx, s);
                break;
            }
            if (json) putchar('[');
            for (size_t i = 0; i < k; i++) printf(json ? (i ? ", %d" : "%d") : (i ? " %d" : "%d"), ids[i]);
            puts(json ? "]" : "");
            free(ids);
        } else {
            int32_t *ids;
            size_t k, bad_at = 0;
            int pr = parse_ids(start, n, &ids, &k, &bad_at);
            if (pr) {
                if (pr < 0) fprintf(stderr, "longtune tokenize: out of memory\n");
                else fprintf(stderr, "longtune tokenize: record %zu, byte %zu: not a token id\n", rec, bad_at + 1);
                rc = LT_EXIT_FAIL;
                break;
            }
            char *text;
            size_t tl;
            s = lt_tokenizer_decode(ctx, tok, ids, k, skip_special, &text, &tl);
            free(ids);
            if (s != LT_OK) {
                fprintf(stderr, "longtune tokenize: %s: record %zu: %s\n", lt_status_str(s), rec, lt_ctx_error(ctx));
                rc = LT_EXIT_FAIL;
                break;
            }
            if (json) {
                print_json_string(text, tl);
                putchar('\n');
            } else {
                fwrite(text, 1, tl, stdout);
                fwrite(delim, 1, (size_t)dlen, stdout);
            }
            free(text);
        }
    }
    free(in);
done:
    if (fflush(stdout) != 0 && rc == LT_EXIT_OK) rc = LT_EXIT_FAIL;
    lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
    return rc;
}
