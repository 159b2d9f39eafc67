/* `longtune bench lora`: the backend's LoRA projection ops (lt_backend.lora_fwd and lora_bwd) as a
 * training step calls them, on the four projection groups of one layer of a model shape (q, k, v
 * sharing x; gate, up sharing x; o; down) over the n rows of one chunk. Each group runs with its
 * rank-r adapters and again without them (a = NULL: the base products alone, through the same op
 * and buffers), in the same run; the difference is what the LoRA products cost on top of the base
 * GEMMs, which is where the fused paths of a backend win or lose. W is bf16 (how train holds a bf16
 * file), x, y, dy and dx f32, LoRA scale 2; the forward writes y (beta 0) and the backward dx
 * (beta 0). Medians over repeats, the calls with and without adapters alternating, the device
 * synchronised around each call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench.h"
#include "bench_buffers.h"
#include "bench_model.h"
#include "longtune/alloc.h"
#include "longtune/log.h"
#include "longtune/tensor.h"
#include "model/model_internal.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define LORA_G_MAX 3

/* One projection group of a layer: its members' (out, in). */
typedef struct lora_group {
    const char *name;
    int G;
    int64_t out[LORA_G_MAX], in;
} lora_group;

/* The buffers of one group, in the backend's memory. */
typedef struct lora_bufs {
    lt_tensor w[LORA_G_MAX];
    void *wd[LORA_G_MAX];
    float *a[LORA_G_MAX], *b[LORA_G_MAX], *ga[LORA_G_MAX], *gb[LORA_G_MAX], *y[LORA_G_MAX], *dy[LORA_G_MAX];
    float *lu[LORA_G_MAX], *x, *dx, *dlu;
    void *ws;
    size_t ws_bytes;
} lora_bufs;

static void free_bufs(lt_ctx *ctx, const lt_backend *be, const lora_group *g, int64_t n, int64_t r, lora_bufs *b) {
    const lt_device dev = be->device;
    for (int k = 0; k < g->G; k++) {
        const int64_t out = g->out[k];
        if (b->wd[k]) lt_free(ctx, dev, b->wd[k], (size_t)(out * g->in) * 2);
        if (b->a[k]) lt_free(ctx, dev, b->a[k], (size_t)(r * g->in) * 4);
        if (b->ga[k]) lt_free(ctx, dev, b->ga[k], (size_t)(r * g->in) * 4);
        if (b->b[k]) lt_free(ctx, dev, b->b[k], (size_t)(out * r) * 4);
        if (b->gb[k]) lt_free(ctx, dev, b->gb[k], (size_t)(out * r) * 4);
        if (b->y[k]) lt_free(ctx, dev, b->y[k], (size_t)(n * out) * 4);
        if (b->dy[k]) lt_free(ctx, dev, b->dy[k], (size_t)(n * out) * 4);
        if (b->lu[k]) lt_free(ctx, dev, b->lu[k], (size_t)(n * r) * 4);
    }
    if (b->x) lt_free(ctx, dev, b->x, (size_t)(n * g->in) * 4);
    if (b->dx) lt_free(ctx, dev, b->dx, (size_t)(n * g->in) * 4);
    if (b->dlu) lt_free(ctx, dev, b->dlu, (size_t)(n * LORA_G_MAX * r) * 4);
    if (b->ws) lt_free(ctx, dev, b->ws, b->ws_bytes);
    memset(b, 0, sizeof *b);
}

/* Allocates and fills the group's buffers; 0, or -1 with the context's error. */
static int make_bufs(lt_ctx *ctx, const lt_backend *be, const lora_group *g, int64_t n, int64_t r, uint64_t *s,
                     lora_bufs *b) {
    memset(b, 0, sizeof *b);
    const int threads = lt_ctx_threads(ctx);
    int64_t out_max = 0;
#define F32(count, amp) lt_bench_rand_buf(ctx, be, (count), LT_DTYPE_F32, (amp), s, "bench lora buffer")
    for (int k = 0; k < g->G; k++) {
        const int64_t out = g->out[k], shape[2] = {out, g->in};
        out_max = out > out_max ? out : out_max;
        b->wd[k] = lt_bench_rand_buf(ctx, be, out * g->in, LT_DTYPE_BF16, 0.02f, s, "bench lora buffer");
        b->a[k] = F32(r * g->in, 0.02f), b->ga[k] = F32(r * g->in, 0.0f);
        b->b[k] = F32(out * r, 0.02f), b->gb[k] = F32(out * r, 0.0f);
        b->y[k] = F32(n * out, 0.0f), b->dy[k] = F32(n * out, 1.0f);
        b->lu[k] = F32(n * r, 0.0f);
        if (!b->wd[k] || !b->a[k] || !b->ga[k] || !b->b[k] || !b->gb[k] || !b->y[k] || !b->dy[k] || !b->lu[k])
            return -1;
        b->w[k] = lt_tensor_view(b->wd[k], LT_DTYPE_BF16, be->device, 2, shape);
        const size_t w = be->matmul_workspace_bytes(LT_DTYPE_BF16, out, g->in, n, threads);
        b->ws_bytes = w > b->ws_bytes ? w : b->ws_bytes;
    }
    if (be->lora_workspace_bytes) {
        const size_t w = be->lora_workspace_bytes(g->G, r, g->in, out_max, threads);
        b->ws_bytes = w > b->ws_bytes ? w : b->ws_bytes;
    }
    b->x = F32(n * g->in, 1.0f), b->dx = F32(n * g->in, 0.0f);
    b->dlu = F32(n * LORA_G_MAX * r, 0.0f);
    if (b->ws_bytes) b->ws = lt_alloc(ctx, be->device, b->ws_bytes, "bench lora workspace");
    return b->x && b->dx && b->dlu && (b->ws || !b->ws_bytes) ? 0 : -1;
#undef F32
}

/* The op's member table, with the adapters (lora = 1) or without them. */
static void members(const lora_group *g, const lora_bufs *b, int lora, lt_lora_proj *p) {
    memset(p, 0, sizeof(lt_lora_proj) * LORA_G_MAX);
    for (int k = 0; k < g->G; k++) {
        p[k].w = &b->w[k];
        p[k].a = lora ? b->a[k] : NULL, p[k].b = b->b[k];
        p[k].ga = b->ga[k], p[k].gb = b->gb[k];
        p[k].y = b->y[k], p[k].dy = b->dy[k], p[k].lu = b->lu[k];
    }
}

/* Median ms of the group's forward (bwd = 0) or backward without its adapters (*base) and with
 * them (*with): the two calls alternate, one of each per repeat, after `warmup` pairs, so a drift
 * of the machine's speed falls on both. */
static void time_pair(lt_ctx *ctx, const lt_backend *be, const lora_group *g, lora_bufs *b, int64_t n, int64_t r,
                      int bwd, const lt_bench_common *c, double *tb, double *tw, double *base, double *with) {
    lt_lora_proj p[2][LORA_G_MAX];
    members(g, b, 0, p[0]), members(g, b, 1, p[1]);
    const float scale = 2.0f;
    for (int rep = -c->warmup; rep < c->repeats; rep++)
        for (int lora = 0; lora < 2; lora++) {
            be->synchronize(ctx);
            const double t0 = lt_time_now();
            if (bwd) be->lora_bwd(ctx, p[lora], g->G, b->x, n, r, scale, b->dx, 0.0f, b->dlu, b->ws);
            else be->lora_fwd(ctx, p[lora], g->G, b->x, n, r, scale, 0.0f, b->ws);
            be->synchronize(ctx);
            if (rep >= 0) (lora ? tw : tb)[rep] = (lt_time_now() - t0) * 1e3;
        }
    *base = lt_bench_median(tb, c->repeats), *with = lt_bench_median(tw, c->repeats);
}

int lt_bench_lora(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    const char *shape = NULL;
    int64_t n = 0, r = 8;
    const lt_bench_arg flags[] = {
        LT_BENCH_FN("--shape", &shape, lt_bench_parse_shape),
        LT_BENCH_I64("--n", &n, 1, 1 << 20),
        LT_BENCH_I64("--rank", &r, 1, 64),
    };
    const int parsed =
        lt_bench_parse_args("lora", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench lora [options]\n\n"
               "The backend's LoRA projection ops (lora_fwd, lora_bwd) on one layer's groups (q,k,v;\n"
               "gate,up; o; down) of a model shape over n rows, with rank-r adapters and without them\n"
               "(the base products alone, same op and buffers): median ms of each, and the difference,\n"
               "what the LoRA products add. W bf16; x, y, dy, dx f32.\n\n"
               "options:\n"
               "  --shape S        %s (default smollm2-135m)\n"
               "  --n N            rows, one chunk of the position-wise work (default: cuda 8192, cpu 256)\n"
               "  --rank R         LoRA rank, 1..64 (default 8)\n" LT_BENCH_COMMON_HELP,
               lt_bench_shape_names());
        return 0;
    }
    if (parsed) return parsed;
    const lt_bench_shape *sh = lt_bench_shape_find(shape ? shape : "smollm2-135m");
    if (sh->E > 0)
        return lt_bench_usage_error("lora", NULL, "--shape %s is a mixture of experts (bench grouped_lora times those)",
                                    sh->name);
    const int cuda = !strcmp(c.backend, "cuda"); /* the parser took cpu or cuda */
    const lt_backend *be = lt_backend_get(cuda ? LT_DEVICE_CUDA : LT_DEVICE_CPU);
    if (!be) {
        fprintf(stderr, "longtune bench lora: this build has no %s backend\n", c.backend);
        return 1;
    }
#if LT_HAVE_CUDA
    int ndev = 0;
    if (cuda && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)) {
        fprintf(stderr, "longtune bench lora: no CUDA device\n");
        return 1;
    }
#endif
    if (!n) n = cuda ? 8192 : 256;
    /* The groups the step runs (q, k, v and gate, up share an input; o and down alone), their
     * shapes as the model's layout has them. */
    static const lt_proj o_alone = LT_PROJ_O, down_alone = LT_PROJ_DOWN;
    const struct {
        const char *name;
        int G;
        const lt_proj *p;
    } kinds[4] = {{"qkv", 3, lt_proj_group_qkv},
                  {"gate_up", 2, lt_proj_group_gate_up},
                  {"o", 1, &o_alone},
                  {"down", 1, &down_alone}};
    const lt_model_config mc = lt_bench_shape_config(sh, LT_DTYPE_BF16);
    lora_group groups[4];
    memset(groups, 0, sizeof groups);
    for (int gi = 0; gi < 4; gi++) {
        groups[gi].name = kinds[gi].name, groups[gi].G = kinds[gi].G;
        for (int k = 0; k < kinds[gi].G; k++)
            lt_model_proj_shape(&mc, kinds[gi].p[k], &groups[gi].out[k], &groups[gi].in);
    }
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    int rc = 1;
    uint64_t s = 0x2545f4914f6cdd1dULL;
    double *t = malloc(sizeof(double) * 2 * (size_t)c.repeats);
    cJSON *res = lt_bench_result_new("lora");
    if (!t || !res) goto done;
    cJSON *cfg = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(cfg, "backend", c.backend);
    cJSON_AddStringToObject(cfg, "shape", sh->name);
    cJSON_AddNumberToObject(cfg, "n", (double)n);
    cJSON_AddNumberToObject(cfg, "rank", (double)r);
    cJSON_AddNumberToObject(cfg, "repeats", c.repeats);
    cJSON_AddStringToObject(
        cfg, "measures",
        "lt_backend.lora_fwd / lora_bwd of each group with adapters (median_ms) and without "
        "(base_ms), the two alternating; lora_ms = median_ms - base_ms; W bf16, f32 activations, beta 0");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    double sum[2][2] = {{0, 0}, {0, 0}}; /* [bwd][lora] */
    for (int gi = 0; gi < 4; gi++) {
        const lora_group *g = &groups[gi];
        lora_bufs b;
        if (make_bufs(ctx, be, g, n, r, &s, &b)) {
            free_bufs(ctx, be, g, n, r, &b);
            goto done;
        }
        /* the forward first: the backward reads the lu it writes */
        for (int bwd = 0; bwd < 2; bwd++) {
            double base, with;
            time_pair(ctx, be, g, &b, n, r, bwd, &c, t, t + c.repeats, &base, &with);
            sum[bwd][0] += base, sum[bwd][1] += with;
            char name[48];
            snprintf(name, sizeof name, "%s-%s", g->name, bwd ? "bwd" : "fwd");
            cJSON *arm = cJSON_CreateObject();
            cJSON_AddStringToObject(arm, "name", name);
            cJSON_AddNumberToObject(arm, "median_ms", with);
            cJSON_AddNumberToObject(arm, "base_ms", base);
            cJSON_AddNumberToObject(arm, "lora_ms", with - base);
            cJSON_AddNumberToObject(arm, "in", (double)g->in);
            cJSON *outs = cJSON_AddArrayToObject(arm, "out");
            for (int k = 0; k < g->G; k++) cJSON_AddItemToArray(outs, cJSON_CreateNumber((double)g->out[k]));
            cJSON_AddNumberToObject(arm, "workspace_bytes", (double)b.ws_bytes);
            cJSON_AddItemToArray(arms, arm);
            fprintf(stderr, "%-12s with LoRA %9.3f ms  base %9.3f ms  LoRA adds %8.3f ms (%5.1f %%)\n", name, with,
                    base, with - base, with > 0 ? 100.0 * (with - base) / with : 0.0);
        }
        free_bufs(ctx, be, g, n, r, &b);
        if (be->synchronize(ctx) != LT_OK) goto done;
    }
    for (int bwd = 0; bwd < 2; bwd++) {
        cJSON *arm = cJSON_CreateObject();
        cJSON_AddStringToObject(arm, "name", bwd ? "layer-bwd" : "layer-fwd");
        cJSON_AddNumberToObject(arm, "median_ms", sum[bwd][1]);
        cJSON_AddNumberToObject(arm, "base_ms", sum[bwd][0]);
        cJSON_AddNumberToObject(arm, "lora_ms", sum[bwd][1] - sum[bwd][0]);
        cJSON_AddItemToArray(arms, arm);
        fprintf(stderr, "%-12s with LoRA %9.3f ms  base %9.3f ms  LoRA adds %8.3f ms (sum of the medians)\n",
                bwd ? "layer-bwd" : "layer-fwd", sum[bwd][1], sum[bwd][0], sum[bwd][1] - sum[bwd][0]);
    }
    rc = 0;
done:
    if (rc) {
        lt_log(LT_LOG_ERROR, "bench lora failed: %s", lt_ctx_error(ctx));
        cJSON_Delete(res);
    }
    free(t);
    lt_ctx_free(ctx);
    if (rc) return 1;
    char tag[64];
    snprintf(tag, sizeof tag, "%s-%s", c.backend, sh->name);
    return lt_bench_write(&c, res, tag);
}
