/* The per-batch attention preparation (lt_attention_batch_prepare): forward and backward with a
 * prepared batch give bit for bit what the same calls without one give (CPU: flash and naive, f32
 * and bf16, packed rows, window, softcap; CUDA when a device is present: host and device offsets),
 * a batch that does not match the call is refused with a typed error naming it, and the
 * preparation validates what the call would have. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/tensor.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static uint64_t rng;

/* The five outputs of one forward + backward. */
typedef struct outs {
    void *out, *dq, *dk, *dv;
    float *lse;
} outs;

typedef struct bcase {
    int64_t B, T, H, Hkv, D, window, S;
    float softcap;
    lt_dtype dtype;
    lt_attention_impl impl;
    const int32_t *offs; /* (B, S+1) or NULL */
} bcase;

static size_t esize(lt_dtype dt) { return dt == LT_DTYPE_F32 ? 4 : 2; }

static void fill(void *x, lt_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = (float)lt_test_normal(&rng);
        if (dt == LT_DTYPE_F32) ((float *)x)[i] = v;
        else ((uint16_t *)x)[i] = lt_f32_to_bf16(v);
    }
}

static lt_attention_params params_of(const bcase *c, lt_device dev) {
    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = c->B, p.T = c->T, p.H = c->H, p.Hkv = c->Hkv, p.D = c->D;
    p.dtype = c->dtype, p.device = dev, p.impl = c->impl;
    p.window = c->window, p.softcap = c->softcap;
    p.seq_offsets = c->offs, p.S = c->offs ? c->S : 0;
    return p;
}

/* Host inputs q, k, v, dout of c, filled once. */
typedef struct inputs {
    void *q, *k, *v, *dout;
    size_t nq, nkv; /* elements */
} inputs;

static inputs inputs_new(const bcase *c) {
    inputs in;
    in.nq = (size_t)(c->B * c->T * c->H * c->D);
    in.nkv = (size_t)(c->B * c->T * c->Hkv * c->D);
    const size_t es = esize(c->dtype);
    in.q = malloc(in.nq * es), in.dout = malloc(in.nq * es);
    in.k = malloc(in.nkv * es), in.v = malloc(in.nkv * es);
    assert_true(in.q && in.dout && in.k && in.v);
    fill(in.q, c->dtype, in.nq), fill(in.dout, c->dtype, in.nq);
    fill(in.k, c->dtype, in.nkv), fill(in.v, c->dtype, in.nkv);
    return in;
}

static void inputs_free(inputs *in) { free(in->q), free(in->k), free(in->v), free(in->dout); }

static outs outs_new(const bcase *c, const inputs *in) {
    const size_t es = esize(c->dtype);
    outs o = {malloc(in->nq * es), malloc(in->nq * es), malloc(in->nkv * es), malloc(in->nkv * es),
              malloc((size_t)(c->B * c->H * c->T) * sizeof(float))};
    assert_true(o.out && o.dq && o.dk && o.dv && o.lse);
    return o;
}

static void outs_free(outs *o) { free(o->out), free(o->dq), free(o->dk), free(o->dv), free(o->lse); }

static void assert_same(const bcase *c, const inputs *in, const outs *a, const outs *b) {
    const size_t es = esize(c->dtype);
    assert_memory_equal(a->out, b->out, in->nq * es);
    assert_memory_equal(a->lse, b->lse, (size_t)(c->B * c->H * c->T) * sizeof(float));
    assert_memory_equal(a->dq, b->dq, in->nq * es);
    assert_memory_equal(a->dk, b->dk, in->nkv * es);
    assert_memory_equal(a->dv, b->dv, in->nkv * es);
}

/* ---- CPU ------------------------------------------------------------------------------- */

static void cpu_run(lt_ctx *ctx, const lt_attention_params *p, const inputs *in, outs *o) {
    lt_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = in->q, a.k = in->k, a.v = in->v, a.out = o->out, a.lse = o->lse;
    assert_int_equal(lt_attention_forward(ctx, p, &a), LT_OK);
    a.dout = in->dout, a.dq = o->dq, a.dk = o->dk, a.dv = o->dv;
    assert_int_equal(lt_attention_backward(ctx, p, &a), LT_OK);
}

static void cpu_case(const bcase *c) {
    lt_ctx *ctx = lt_ctx_new();
    assert_non_null(ctx);
    inputs in = inputs_new(c);
    outs plain = outs_new(c, &in), prep = outs_new(c, &in);
    lt_attention_params p = params_of(c, LT_DEVICE_CPU);
    cpu_run(ctx, &p, &in, &plain);
    assert_int_equal(lt_attention_batch_bytes(&p), 0);
    lt_attention_batch batch;
    assert_int_equal(lt_attention_batch_prepare(ctx, &p, NULL, 0, &batch), LT_OK);
    assert_null(batch.bounds);
    p.batch = &batch;
    cpu_run(ctx, &p, &in, &prep);
    assert_same(c, &in, &plain, &prep);
    outs_free(&plain), outs_free(&prep), inputs_free(&in);
    lt_ctx_free(ctx);
}

static const int32_t offs3[] = {0, 5, 5, 17, 24, /* row 1 */ 0, 1, 9, 24, 24};

static void cpu_packed_window_f32(void **s) {
    (void)s;
    const bcase c =
        {.B = 2, .T = 24, .H = 4, .Hkv = 2, .D = 16, .window = 6, .S = 4, .dtype = LT_DTYPE_F32, .offs = offs3};
    cpu_case(&c);
}

static void cpu_packed_softcap_bf16(void **s) {
    (void)s;
    const bcase c =
        {.B = 2, .T = 24, .H = 6, .Hkv = 2, .D = 32, .S = 4, .softcap = 20.0f, .dtype = LT_DTYPE_BF16, .offs = offs3};
    cpu_case(&c);
}

static void cpu_unpacked_naive(void **s) {
    (void)s;
    const bcase c =
        {.B = 3, .T = 19, .H = 2, .Hkv = 1, .D = 8, .window = 4, .dtype = LT_DTYPE_F32, .impl = LT_ATTENTION_NAIVE};
    cpu_case(&c);
}

static void expect_refused(lt_ctx *ctx, const lt_attention_params *p, const char *substr) {
    assert_int_equal(lt_attention_check(ctx, p), LT_ERR_INVALID_ARG);
    const char *msg = lt_ctx_error(ctx);
    if (!strstr(msg, substr)) fail_msg("error \"%s\" lacks \"%s\"", msg, substr);
}

static void mismatched_batch_is_refused(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    assert_non_null(ctx);
    const bcase c =
        {.B = 2, .T = 24, .H = 4, .Hkv = 2, .D = 16, .window = 6, .S = 4, .dtype = LT_DTYPE_F32, .offs = offs3};
    lt_attention_params p = params_of(&c, LT_DEVICE_CPU);
    lt_attention_batch batch;
    assert_int_equal(lt_attention_batch_prepare(ctx, &p, NULL, 0, &batch), LT_OK);
    p.batch = &batch;
    assert_int_equal(lt_attention_check(ctx, &p), LT_OK);

    int32_t copy[sizeof offs3 / sizeof offs3[0]];
    memcpy(copy, offs3, sizeof copy);
    lt_attention_params q = p;
    q.seq_offsets = copy; /* equal values, another array */
    expect_refused(ctx, &q, "other seq_offsets");
    q = p;
    q.T = 23;
    expect_refused(ctx, &q, "does not match");
    q = p;
    q.window = 0;
    expect_refused(ctx, &q, "does not match");
    q = p;
    q.B = 1;
    expect_refused(ctx, &q, "does not match");

    /* The refusal comes before any work: the call writes nothing. */
    inputs in = inputs_new(&c);
    outs o = outs_new(&c, &in);
    memset(o.out, 0, in.nq * 4);
    lt_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = in.q, a.k = in.k, a.v = in.v, a.out = o.out, a.lse = o.lse;
    q = p;
    q.seq_offsets = copy;
    assert_int_equal(lt_attention_forward(ctx, &q, &a), LT_ERR_INVALID_ARG);
    for (size_t i = 0; i < in.nq; i++) assert_true(((float *)o.out)[i] == 0.0f);
    outs_free(&o), inputs_free(&in);
    lt_ctx_free(ctx);
}

static void prepare_validates_offsets(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    assert_non_null(ctx);
    const int32_t bad[] = {0, 9, 4, 24};
    const bcase c = {.B = 1, .T = 24, .H = 2, .Hkv = 2, .D = 16, .S = 3, .dtype = LT_DTYPE_F32, .offs = bad};
    lt_attention_params p = params_of(&c, LT_DEVICE_CPU);
    lt_attention_batch batch;
    assert_int_equal(lt_attention_batch_prepare(ctx, &p, NULL, 0, &batch), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "not monotone"));
    assert_int_equal(lt_attention_batch_prepare(ctx, NULL, NULL, 0, &batch), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_attention_batch_prepare(ctx, &p, NULL, 0, NULL), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

/* ---- CUDA: prepared key bounds against the per-call ones -------------------------------- */

#if LT_HAVE_CUDA
static int cuda_present(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0;
}

static void *to_dev(lt_ctx *ctx, const void *h, size_t bytes) {
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, bytes, "test input");
    assert_non_null(d);
    assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* Forward + backward on the device from host inputs; outputs copied back into o. */
static void cuda_run(lt_ctx *ctx, const bcase *c, const lt_attention_params *p, const inputs *in, outs *o) {
    const size_t es = esize(c->dtype), nl = (size_t)(c->B * c->H * c->T) * sizeof(float);
    void *q = to_dev(ctx, in->q, in->nq * es), *k = to_dev(ctx, in->k, in->nkv * es);
    void *v = to_dev(ctx, in->v, in->nkv * es), *dout = to_dev(ctx, in->dout, in->nq * es);
    void *out = lt_alloc(ctx, LT_DEVICE_CUDA, in->nq * es, "out"),
         *dq = lt_alloc(ctx, LT_DEVICE_CUDA, in->nq * es, "dq");
    void *dk = lt_alloc(ctx, LT_DEVICE_CUDA, in->nkv * es, "dk"),
         *dv = lt_alloc(ctx, LT_DEVICE_CUDA, in->nkv * es, "dv");
    float *lse = lt_alloc(ctx, LT_DEVICE_CUDA, nl, "lse");
    assert_true(out && dq && dk && dv && lse);
    lt_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse;
    assert_int_equal(lt_attention_forward(ctx, p, &a), LT_OK);
    a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    assert_int_equal(lt_attention_backward(ctx, p, &a), LT_OK);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(o->out, out, in->nq * es, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(o->dq, dq, in->nq * es, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(o->dk, dk, in->nkv * es, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(o->dv, dv, in->nkv * es, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(o->lse, lse, nl, cudaMemcpyDeviceToHost), cudaSuccess);
    lt_free(ctx, LT_DEVICE_CUDA, q, in->nq * es), lt_free(ctx, LT_DEVICE_CUDA, k, in->nkv * es);
    lt_free(ctx, LT_DEVICE_CUDA, v, in->nkv * es), lt_free(ctx, LT_DEVICE_CUDA, dout, in->nq * es);
    lt_free(ctx, LT_DEVICE_CUDA, out, in->nq * es), lt_free(ctx, LT_DEVICE_CUDA, dq, in->nq * es);
    lt_free(ctx, LT_DEVICE_CUDA, dk, in->nkv * es), lt_free(ctx, LT_DEVICE_CUDA, dv, in->nkv * es);
    lt_free(ctx, LT_DEVICE_CUDA, lse, nl);
}

/* The first key each token may see, on the host: the start of its sequence raised by the window. */
static int32_t key_bound(const bcase *c, int64_t b, int64_t t) {
    int64_t start = 0;
    if (c->offs) {
        const int32_t *o = c->offs + b * (c->S + 1);
        for (int64_t s = 0; s < c->S; s++)
            if (o[s] <= t) start = o[s];
    }
    if (c->window > 0 && t - c->window + 1 > start) start = t - c->window + 1;
    return (int32_t)start;
}

/* Bit for bit where the kernels are deterministic: the forward always; a backward output when
 * two runs without a batch agree (fp32 atomics may order sums differently between runs). */
static void assert_same_where_deterministic(const bcase *c, const inputs *in, const outs *a, const outs *a2,
                                            const outs *b) {
    const size_t es = esize(c->dtype);
    assert_memory_equal(a->out, b->out, in->nq * es);
    assert_memory_equal(a->lse, b->lse, (size_t)(c->B * c->H * c->T) * sizeof(float));
    if (!memcmp(a->dq, a2->dq, in->nq * es)) assert_memory_equal(a->dq, b->dq, in->nq * es);
    if (!memcmp(a->dk, a2->dk, in->nkv * es)) assert_memory_equal(a->dk, b->dk, in->nkv * es);
    if (!memcmp(a->dv, a2->dv, in->nkv * es)) assert_memory_equal(a->dv, b->dv, in->nkv * es);
}

static void cuda_case(const bcase *c, int device_offsets) {
    lt_ctx *ctx = lt_ctx_new();
    assert_non_null(ctx);
    inputs in = inputs_new(c);
    outs plain = outs_new(c, &in), plain2 = outs_new(c, &in), prep = outs_new(c, &in);
    lt_attention_params p = params_of(c, LT_DEVICE_CUDA);
    const size_t ob = c->offs ? (size_t)(c->B * (c->S + 1)) * sizeof(int32_t) : 0;
    void *doffs = device_offsets && c->offs ? to_dev(ctx, c->offs, ob) : NULL;
    p.seq_offsets_device = doffs;
    cuda_run(ctx, c, &p, &in, &plain);
    cuda_run(ctx, c, &p, &in, &plain2);
    const size_t bytes = lt_attention_batch_bytes(&p);
    assert_true(bytes >= (size_t)(c->B * c->T) * sizeof(int32_t));
    void *buf = lt_alloc(ctx, LT_DEVICE_CUDA, bytes, "batch bounds");
    assert_non_null(buf);
    lt_attention_batch batch;
    assert_int_equal(lt_attention_batch_prepare(ctx, &p, buf, bytes, &batch), LT_OK);
    assert_ptr_equal(batch.bounds, buf);
    int32_t *lo = malloc((size_t)(c->B * c->T) * sizeof(int32_t));
    assert_non_null(lo);
    assert_int_equal(cudaMemcpy(lo, buf, (size_t)(c->B * c->T) * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++) assert_int_equal(lo[b * c->T + t], key_bound(c, b, t));
    free(lo);
    p.batch = &batch;
    cuda_run(ctx, c, &p, &in, &prep);
    assert_same_where_deterministic(c, &in, &plain, &plain2, &prep);
    assert_int_equal(lt_attention_batch_prepare(ctx, &p, buf, bytes - 1, &batch), LT_ERR_INVALID_ARG);
    lt_free(ctx, LT_DEVICE_CUDA, buf, bytes);
    if (doffs) lt_free(ctx, LT_DEVICE_CUDA, doffs, ob);
    outs_free(&plain), outs_free(&plain2), outs_free(&prep), inputs_free(&in);
    lt_ctx_free(ctx);
}

static const int32_t offs_long[] = {0, 100, 101, 300, 512, /* row 1 */ 0, 7, 260, 512, 512};

static void cuda_prepared_matches_unprepared(void **s) {
    (void)s;
    if (!cuda_present()) skip();
    const bcase cases[] = {
        {.B = 2, .T = 512, .H = 8, .Hkv = 2, .D = 128, .S = 4, .dtype = LT_DTYPE_BF16, .offs = offs_long},
        {.B = 2,
         .T = 512,
         .H = 4,
         .Hkv = 4,
         .D = 64,
         .window = 96,
         .S = 4,
         .softcap = 30.0f,
         .dtype = LT_DTYPE_BF16,
         .offs = offs_long},
        {.B = 1, .T = 384, .H = 4, .Hkv = 2, .D = 64, .window = 128, .dtype = LT_DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cuda_case(&cases[i], 0);
        cuda_case(&cases[i], 1);
    }
}
#endif

int main(void) {
    rng = lt_test_seed();
    const struct CMUnitTest tests[] =
    { cmocka_unit_test(cpu_packed_window_f32),
      cmocka_unit_test(cpu_packed_softcap_bf16),
      cmocka_unit_test(cpu_unpacked_naive),
      cmocka_unit_test(mismatched_batch_is_refused),
      cmocka_unit_test(prepare_validates_offsets),
#if LT_HAVE_CUDA
      cmocka_unit_test(cuda_prepared_matches_unprepared),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
