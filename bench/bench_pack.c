/* `longtune bench pack`: time to plan the packing of N sequences (default 1,000,000, lengths drawn
 * log-normally around a median of 150 tokens, as instruction data) with each algorithm, plus the
 * fill rate of fixed-shape batches in tokens/s. Planning reads only the offsets, so the million
 * sequences need no token memory; the fill arm packs a materialised 20,000-sequence corpus. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "longtune/log.h"
#include "longtune/pack.h"

/* CPU seconds of this process: on a shared machine wall time includes waiting for a core. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double bench_uniform(uint64_t *s) { return ((double)(lt_bench_rand_u64(s) >> 11) + 0.5) * 0x1.0p-53; }

/* Offsets of n sequences with log-normal lengths (median 150, sigma 1), at least 1 token. */
static int64_t *make_offsets(int64_t n, uint64_t seed) {
    int64_t *off = malloc((size_t)(n + 1) * sizeof *off);
    if (!off) return NULL;
    off[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        double z = sqrt(-2.0 * log(bench_uniform(&seed))) * cos(6.283185307179586 * bench_uniform(&seed));
        int64_t len = (int64_t)(150.0 * exp(z));
        off[i + 1] = off[i] + (len < 1 ? 1 : len);
    }
    return off;
}

int lt_bench_pack(int argc, char **argv) {
    static const char *usage = "longtune bench pack [--sequences N] [--max-seq-length L] [--batch-size B] [options]";
    lt_bench_common c;
    lt_bench_common_init(&c);
    int64_t n = 1000000, L = 2048, B = 4;
    const lt_bench_arg flags[] = {
        LT_BENCH_I64("--sequences", &n, 1, 1000000000),
        LT_BENCH_I64("--max-seq-length", &L, 2, 1000000000),
        LT_BENCH_I64("--batch-size", &B, 1, 1000000000),
    };
    const int parsed =
        lt_bench_parse_args("pack", usage, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: %s\n\nPlanning time of first-fit, best-fit-decreasing and unpacked batching for N "
               "log-normal sequence lengths (median 150 tokens), and the batch fill rate.\n\noptions:\n"
               "  --sequences N      sequences to plan (default 1000000)\n"
               "  --max-seq-length L row length (default 2048)\n"
               "  --batch-size B     rows per batch (default 4)\n" LT_BENCH_COMMON_HELP,
               usage);
        return 0;
    }
    if (parsed) return parsed;
    lt_ctx *ctx = lt_ctx_new();
    int64_t *off = make_offsets(n, 42);
    if (!ctx || !off) {
        fprintf(stderr, "longtune bench pack: out of memory\n");
        free(off);
        lt_ctx_free(ctx);
        return 1;
    }
    int32_t dummy = 0; /* planning never reads tokens */
    lt_pack_input in = {&dummy, NULL, off, n};
    cJSON *r = lt_bench_result_new("pack");
    cJSON *cfg = cJSON_AddObjectToObject(r, "config");
    cJSON_AddNumberToObject(cfg, "sequences", (double)n);
    cJSON_AddNumberToObject(cfg, "max_seq_length", (double)L);
    cJSON_AddNumberToObject(cfg, "batch_size", (double)B);
    cJSON_AddNumberToObject(cfg, "tokens", (double)off[n]);
    cJSON_AddStringToObject(cfg, "lengths", "log-normal, median 150, sigma 1, seed 42");
    cJSON *arms = cJSON_AddArrayToObject(r, "arms");
    double *t = malloc(sizeof(double) * (size_t)(c.repeats + c.warmup + 1));
    double *tc = malloc(sizeof(double) * (size_t)(c.repeats + c.warmup + 1));
    int rc = 0;
    for (int a = 0; a < 3 && !rc; a++) {
        lt_pack_options opt = {0};
        opt.row_len = L;
        opt.batch_size = B;
        opt.algorithm = (lt_pack_algorithm)a;
        lt_pack_stats st;
        memset(&st, 0, sizeof st);
        int nt = 0;
        for (int rep = 0; rep < c.warmup + c.repeats; rep++) {
            opt.epoch = (uint64_t)rep;
            lt_pack_plan *plan = NULL;
            double t0 = lt_time_now(), c0 = cpu_now();
            lt_status s = lt_pack_plan_build(ctx, &in, &opt, &plan);
            double dt = lt_time_now() - t0, dc = cpu_now() - c0;
            if (s != LT_OK) {
                fprintf(stderr, "longtune bench pack: %s\n", lt_ctx_error(ctx));
                rc = 1;
                break;
            }
            st = lt_pack_plan_stats(plan);
            lt_pack_plan_free(ctx, plan);
            if (rep >= c.warmup) {
                tc[nt] = dc;
                t[nt++] = dt;
            }
        }
        if (rc) break;
        double med = lt_bench_median(t, nt), med_cpu = lt_bench_median(tc, nt);
        cJSON *arm = cJSON_CreateObject();
        char name[48];
        snprintf(name, sizeof name, "plan-%s", lt_pack_algorithm_name(opt.algorithm));
        cJSON_AddStringToObject(arm, "name", name);
        cJSON_AddNumberToObject(arm, "median_ms", med * 1e3);
        cJSON_AddNumberToObject(arm, "median_cpu_ms", med_cpu * 1e3);
        cJSON_AddNumberToObject(arm, "sequences_per_s", (double)n / med);
        cJSON_AddNumberToObject(arm, "rows", (double)st.rows);
        cJSON_AddNumberToObject(arm, "seqs_per_row", st.seqs_per_row);
        cJSON_AddNumberToObject(arm, "utilisation", st.utilisation);
        cJSON_AddNumberToObject(arm, "truncated", (double)st.truncated);
        cJSON_AddItemToArray(arms, arm);
        fprintf(stderr,
                "pack %-9s %lld sequences: %.1f ms wall, %.1f ms cpu (medians of %d), %lld rows, %.2f seq/row, "
                "utilisation %.4f\n",
                lt_pack_algorithm_name(opt.algorithm), (long long)n, med * 1e3, med_cpu * 1e3, nt, (long long)st.rows,
                st.seqs_per_row, st.utilisation);
    }
    /* Fill rate: a real corpus of 20,000 sequences, every batch filled. */
    if (!rc) {
        int64_t nf = n < 20000 ? n : 20000;
        int32_t *tok = malloc((size_t)off[nf] * sizeof *tok);
        uint8_t *mask = malloc((size_t)off[nf]);
        int32_t *bufs = malloc((size_t)(3 * B * L) * sizeof *bufs);
        lt_pack_plan *plan = NULL;
        lt_pack_options opt = {0};
        opt.row_len = L;
        opt.batch_size = B;
        opt.algorithm = LT_PACK_BFD;
        lt_pack_input fin = {tok, mask, off, nf};
        if (!tok || !mask || !bufs || lt_pack_plan_build(ctx, &fin, &opt, &plan) != LT_OK) {
            fprintf(stderr, "longtune bench pack: fill arm: %s\n", lt_ctx_error(ctx));
            rc = 1;
        } else {
            for (int64_t j = 0; j < off[nf]; j++) {
                tok[j] = (int32_t)(j % 50000);
                mask[j] = (uint8_t)(j % 3 != 0);
            }
            int64_t Bq, T, S;
            lt_pack_batch_shape(plan, 0, &Bq, &T, &S);
            int32_t *so = malloc((size_t)(B * (S + 1)) * sizeof *so);
            lt_pack_batch out = {bufs, bufs + B * L, bufs + 2 * B * L, so, NULL};
            int nt = 0;
            for (int rep = 0; rep < c.warmup + c.repeats && so; rep++) {
                double t0 = lt_time_now();
                for (int64_t b = 0; b < lt_pack_plan_batches(plan); b++) lt_pack_fill(ctx, plan, &fin, b, &out);
                double dt = lt_time_now() - t0;
                if (rep >= c.warmup) t[nt++] = dt;
            }
            lt_pack_stats st = lt_pack_plan_stats(plan);
            double med = lt_bench_median(t, nt);
            cJSON *arm = cJSON_CreateObject();
            cJSON_AddStringToObject(arm, "name", "fill-bfd");
            cJSON_AddNumberToObject(arm, "median_ms", med * 1e3);
            cJSON_AddNumberToObject(arm, "sequences", (double)nf);
            cJSON_AddNumberToObject(arm, "tokens_per_s", (double)st.capacity_tokens / med);
            cJSON_AddItemToArray(arms, arm);
            fprintf(stderr, "fill (bfd, %lld sequences, %lld batches): %.2f ms, %.3g tokens/s\n", (long long)nf,
                    (long long)st.batches, med * 1e3, (double)st.capacity_tokens / med);
            free(so);
        }
        lt_pack_plan_free(ctx, plan);
        free(tok);
        free(mask);
        free(bufs);
    }
    free(t);
    free(tc);
    free(off);
    lt_ctx_free(ctx);
    if (rc) {
        cJSON_Delete(r);
        return rc;
    }
    return lt_bench_write(&c, r, NULL);
}
