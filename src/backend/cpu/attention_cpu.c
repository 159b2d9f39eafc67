/* CPU attention entry points (naive oracle or flash, by params.impl) and the helpers the two
 * kernels share: bf16 row conversion, packed-sequence lookup and the dynamic scheduler. The
 * kernels themselves are in attention_naive.c and attention_flash.c. */
#include <stdatomic.h>
#if LT_HAVE_OPENMP
#include <omp.h>
#endif

#include "backend/cpu/attention_cpu.h"
#include "core/parallel.h"

void lt_attn_load(float *dst, const void *src, lt_dtype dt, int64_t ld, int64_t rows, int64_t D) {
    for (int64_t i = 0; i < rows; i++) {
        float *d = dst + i * D;
        if (dt == LT_DTYPE_F32) {
            memcpy(d, (const float *)src + i * ld, (size_t)D * sizeof(float));
        } else {
            const uint16_t *s = (const uint16_t *)src + i * ld;
            for (int64_t j = 0; j < D; j++) d[j] = lt_attn_bf16(s[j]);
        }
    }
}

void lt_attn_store(void *dst, lt_dtype dt, int64_t ld, const float *src, int64_t rows, int64_t D, float mul) {
    for (int64_t i = 0; i < rows; i++) {
        const float *s = src + i * D;
        if (dt == LT_DTYPE_F32) {
            float *d = (float *)dst + i * ld;
            for (int64_t j = 0; j < D; j++) d[j] = s[j] * mul;
        } else {
            uint16_t *d = (uint16_t *)dst + i * ld;
            for (int64_t j = 0; j < D; j++) d[j] = lt_f32_to_bf16(s[j] * mul);
        }
    }
}

void lt_attn_seq(const lt_attention_params *p, int64_t b, int64_t x, int64_t *start, int64_t *end) {
    if (!p->seq_offsets) {
        *start = 0;
        *end = p->T;
        return;
    }
    const int32_t *o = p->seq_offsets + b * (p->S + 1);
    /* First index with o[i] > x; o[0] = 0 <= x < T = o[S] so it lies in 1..S. */
    int64_t lo = 1, hi = p->S;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (o[mid] > x) hi = mid;
        else lo = mid + 1;
    }
    *start = o[lo - 1];
    *end = o[lo];
}

typedef struct {
    atomic_int_fast64_t next;
    int64_t n;
    lt_attn_item_fn item;
    void *ctx;
} sched;

static void sched_worker(void *arg, int64_t begin, int64_t end, int thread) {
    (void)begin;
    (void)end;
    sched *s = arg;
    for (;;) {
        int64_t i = atomic_fetch_add(&s->next, 1);
        if (i >= s->n) break;
        s->item(s->ctx, i, thread);
    }
}

void lt_attn_schedule(int slots, int64_t n, lt_attn_item_fn item, void *ctx) {
    sched s = {.n = n, .item = item, .ctx = ctx};
    atomic_init(&s.next, 0);
    if (slots > 1) {
        /* Inside the region OpenBLAS runs each tile product on its calling thread. */
        lt_parallel_for(slots, slots, 1, sched_worker, &s);
        return;
    }
#if LT_HAVE_OPENMP
    /* One slot runs on the calling thread outside any parallel region, where OpenBLAS would split a
     * large enough tile product over omp_get_max_threads() threads, and its generic kernels then
     * round differently than one thread does (measured: dQ/dK/dV of G = 2, D = 96 tiles differed
     * between 1 and 4 threads). Lowering this task's default thread count reaches only OpenBLAS;
     * it is restored after. (Not around a region of several slots: OpenMP would then size the
     * region's team below its default, and libgomp ends and restarts pooled threads whenever team
     * sizes change; see lt_parallel_for.) */
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    sched_worker(&s, 0, 1, 0);
#if LT_HAVE_OPENMP
    omp_set_num_threads(saved);
#endif
}

int lt_attn_slots(int threads, int64_t items) {
    int nt = lt_parallel_threads(threads);
    if (items < nt) nt = (int)(items > 0 ? items : 1);
    return nt < 1 ? 1 : nt;
}

size_t lt_attention_cpu_workspace_bytes(const lt_attention_params *p, int backward, int threads) {
    return p->impl == LT_ATTENTION_NAIVE ? lt_attention_naive_workspace_bytes(p, backward, threads)
                                         : lt_attention_flash_workspace_bytes(p, backward, threads);
}

lt_status lt_attention_cpu_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return p->impl == LT_ATTENTION_NAIVE ? lt_attention_naive_forward(ctx, p, a)
                                         : lt_attention_flash_forward(ctx, p, a);
}

lt_status lt_attention_cpu_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return p->impl == LT_ATTENTION_NAIVE ? lt_attention_naive_backward(ctx, p, a)
                                         : lt_attention_flash_backward(ctx, p, a);
}
