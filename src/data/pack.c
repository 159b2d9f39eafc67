/* Sequence packing (pack.h): plans which piece of which sequence lands in which row, then fills
 * fixed-shape batches from the plan. First fit uses a max segment tree over rows (O(log n) per
 * piece); best-fit decreasing keeps rows in buckets by remaining capacity with a count tree over
 * capacities (O(log L) per piece). The plan holds indices only, never token data, so it is small
 * and the same plan can be filled from any copy of the input. */
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/pack.h"
#include "core/rng.h"

typedef struct lt_pack_piece {
    int64_t seq;   /* input sequence */
    int32_t start; /* first token within the sequence */
    int32_t len;   /* tokens, 1..L */
} lt_pack_piece;

struct lt_pack_plan {
    lt_pack_options opt;
    int64_t n_seqs;
    int64_t n_pieces, n_rows, n_batches, B, S;
    lt_pack_piece *pieces; /* (n_pieces) grouped by row in final row order */
    int64_t *row_begin;    /* (n_rows + 1) */
    int32_t *batch_T;      /* (n_batches) */
    lt_pack_stats stats;
};

/* ---- deterministic randomness: splitmix64, seeded from (seed, epoch) ---- */

/* Uniform in [0, n) without modulo bias (rejection of the short top range). */
static uint64_t rand_below(uint64_t *s, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = lt_splitmix64(s);
    while (r >= limit);
    return r % n;
}

static uint64_t rng_init(uint64_t seed, uint64_t epoch, uint64_t stream) {
    uint64_t s = seed ^ 0x6C6F6E6774756E65ull; /* "longtune" */
    uint64_t a = lt_splitmix64(&s);
    s = a ^ (epoch * 0xD1B54A32D192ED03ull) ^ (stream << 56);
    (void)lt_splitmix64(&s);
    return s;
}

static void shuffle_i32(int32_t *v, int64_t n, uint64_t *rng) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rand_below(rng, (uint64_t)i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* ---- helpers ---- */

#define PACK_ALLOC(ptr, count, what)                                    \
    do {                                                                \
        size_t n_ = (size_t)((count) > 0 ? (count) : 1);                \
        (ptr) = lt_alloc(ctx, LT_DEVICE_CPU, n_ * sizeof *(ptr), what); \
        if (!(ptr)) goto fail;                                          \
    } while (0)
#define PACK_FREE(ptr, count)                                                                             \
    do {                                                                                                  \
        if (ptr) lt_free(ctx, LT_DEVICE_CPU, (ptr), (size_t)((count) > 0 ? (count) : 1) * sizeof *(ptr)); \
        (ptr) = NULL;                                                                                     \
    } while (0)

static int64_t next_pow2(int64_t n) {
    int64_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

lt_status lt_pack_input_check(lt_ctx *ctx, const lt_pack_input *in) {
    if (!in || in->n_seqs < 0 || (in->n_seqs > 0 && (!in->offsets || !in->tokens)))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack input: missing tokens/offsets or negative n_seqs");
    if (in->n_seqs == 0) return LT_OK;
    if (in->offsets[0] != 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack input: offsets[0] = %lld, expected 0",
                        (long long)in->offsets[0]);
    for (int64_t i = 0; i < in->n_seqs; i++)
        if (in->offsets[i + 1] < in->offsets[i])
            return lt_error(ctx, LT_ERR_INVALID_ARG, "pack input: offsets decrease at index %lld (%lld -> %lld)",
                            (long long)(i + 1), (long long)in->offsets[i], (long long)in->offsets[i + 1]);
    return LT_OK;
}

const char *lt_pack_algorithm_name(lt_pack_algorithm a) {
    switch (a) {
    case LT_PACK_FIRST_FIT: return "first-fit";
    case LT_PACK_BFD: return "bfd";
    case LT_PACK_NONE: return "none";
    }
    return "unknown";
}

lt_status lt_pack_algorithm_parse(lt_ctx *ctx, const char *name, lt_pack_algorithm *out) {
    static const lt_pack_algorithm all[] = {LT_PACK_FIRST_FIT, LT_PACK_BFD, LT_PACK_NONE};
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, lt_pack_algorithm_name(all[i]))) {
            *out = all[i];
            return LT_OK;
        }
    return lt_error(ctx, LT_ERR_INVALID_ARG, "unknown packing algorithm '%s' (first-fit | bfd | none)",
                    name ? name : "(null)");
}

/* Leftmost leaf >= lo whose count is non-zero in a sum tree of `size` leaves; -1 if none. */
static int64_t count_tree_first_from(const int32_t *t, int64_t size, int64_t lo) {
    int64_t i = lo + size;
    if (t[i] > 0) return lo;
    while (i > 1) {
        if (!(i & 1) && t[i + 1] > 0) {
            i = i + 1;
            while (i < size) i = t[2 * i] > 0 ? 2 * i : 2 * i + 1;
            return i - size;
        }
        i >>= 1;
    }
    return -1;
}

static void count_tree_add(int32_t *t, int64_t size, int64_t leaf, int32_t delta) {
    for (int64_t i = leaf + size; i >= 1; i >>= 1) t[i] += delta;
}

/* First fit: rows are leaves of a max tree of remaining capacity; unopened rows hold L, so the
 * leftmost leaf that fits is exactly the first-fit row (an open row if one fits, else a new one).
 * First fit never leaves two rows at most half full (the later one's first piece would have fit in
 * the earlier), so rows < 2*total/L + 1 and 2*(total/L + 1) leaves always suffice: a tree that
 * small stays in cache. row_at[k]: row of the k-th placed piece. */
static lt_status assign_first_fit(lt_ctx *ctx, const lt_pack_piece *p, const int32_t *order, int64_t n, int32_t L,
                                  int32_t *row_at, int64_t *n_rows) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += p[i].len;
    int64_t size = next_pow2(2 * (total / L + 1));
    int32_t *t = NULL;
    PACK_ALLOC(t, 2 * size, "first-fit tree");
    for (int64_t i = 0; i < size; i++) t[size + i] = L;
    for (int64_t i = size - 1; i >= 1; i--) t[i] = L;
    int64_t rows = 0;
    for (int64_t k = 0; k < n; k++) {
        int32_t len = p[order[k]].len;
        LT_ASSERT(t[1] >= len);
        int64_t i = 1;
        while (i < size) i = t[2 * i] >= len ? 2 * i : 2 * i + 1;
        int64_t row = i - size;
        row_at[k] = (int32_t)row;
        if (row + 1 > rows) rows = row + 1;
        t[i] -= len;
        for (i >>= 1; i >= 1; i >>= 1) {
            int32_t m = t[2 * i] > t[2 * i + 1] ? t[2 * i] : t[2 * i + 1];
            if (t[i] == m) break;
            t[i] = m;
        }
    }
    *n_rows = rows;
    PACK_FREE(t, 2 * size);
    return LT_OK;
fail:
    return lt_ctx_status(ctx);
}

/* Best-fit decreasing: pieces longest first; each goes to the open row with the least remaining
 * room that still fits (bucket stacks by remaining capacity), else to a new row. */
static lt_status assign_bfd(lt_ctx *ctx, const lt_pack_piece *p, const int32_t *order, int64_t n, int32_t L,
                            int32_t *row_at, int64_t *n_rows) {
    int64_t size = next_pow2((int64_t)L + 1);
    int32_t *t = NULL;
    int32_t *head = NULL, *next = NULL;
    int32_t *rem = NULL;
    PACK_ALLOC(t, 2 * size, "bfd capacity tree");
    PACK_ALLOC(head, (int64_t)L + 1, "bfd buckets");
    PACK_ALLOC(next, n, "bfd bucket links");
    PACK_ALLOC(rem, n, "bfd remaining");
    memset(t, 0, (size_t)(2 * size) * sizeof *t);
    for (int64_t r = 0; r <= L; r++) head[r] = -1;
    int64_t rows = 0;
    for (int64_t k = 0; k < n; k++) {
        int32_t len = p[order[k]].len;
        int64_t cap = count_tree_first_from(t, size, len);
        int32_t row;
        if (cap < 0) {
            row = (int32_t)rows++;
            rem[row] = L;
        } else {
            row = head[cap];
            head[cap] = next[row];
            count_tree_add(t, size, cap, -1);
        }
        rem[row] -= len;
        row_at[k] = row;
        if (rem[row] > 0) {
            next[row] = head[rem[row]];
            head[rem[row]] = row;
            count_tree_add(t, size, rem[row], 1);
        }
    }
    *n_rows = rows;
    PACK_FREE(t, 2 * size);
    PACK_FREE(head, (int64_t)L + 1);
    PACK_FREE(next, n);
    PACK_FREE(rem, n);
    return LT_OK;
fail:
    PACK_FREE(t, 2 * size);
    PACK_FREE(head, (int64_t)L + 1);
    PACK_FREE(next, n);
    PACK_FREE(rem, n);
    return lt_ctx_status(ctx);
}

/* Stable counting sort of piece indices by length (ascending, or descending when desc). */
static lt_status order_by_length(lt_ctx *ctx, const lt_pack_piece *p, int64_t n, int32_t L, int desc, int32_t *order) {
    int64_t *cnt = NULL;
    PACK_ALLOC(cnt, (int64_t)L + 2, "length histogram");
    memset(cnt, 0, (size_t)(L + 2) * sizeof *cnt);
    for (int64_t i = 0; i < n; i++) {
        int32_t key = desc ? L - p[i].len : p[i].len;
        cnt[key + 1]++;
    }
    for (int32_t k = 1; k <= L + 1; k++) cnt[k] += cnt[k - 1];
    for (int64_t i = 0; i < n; i++) {
        int32_t key = desc ? L - p[i].len : p[i].len;
        order[cnt[key]++] = (int32_t)i;
    }
    PACK_FREE(cnt, (int64_t)L + 2);
    return LT_OK;
fail:
    return lt_ctx_status(ctx);
}

void lt_pack_plan_free(lt_ctx *ctx, lt_pack_plan *plan) {
    if (!plan) return;
    PACK_FREE(plan->pieces, plan->n_pieces);
    PACK_FREE(plan->row_begin, plan->n_rows + 1);
    PACK_FREE(plan->batch_T, plan->n_batches);
    lt_free(ctx, LT_DEVICE_CPU, plan, sizeof *plan);
}

lt_status lt_pack_plan_build(lt_ctx *ctx, const lt_pack_input *in, const lt_pack_options *opt_in, lt_pack_plan **out) {
    *out = NULL;
    if (!opt_in) return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: options are required");
    lt_pack_options opt = *opt_in;
    if (opt.row_len < 2 || opt.row_len > INT32_MAX / 2)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: row length %lld out of range [2, %d]", (long long)opt.row_len,
                        INT32_MAX / 2);
    if (opt.batch_size < 0) return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: negative batch size");
    if (opt.batch_size == 0) opt.batch_size = 1;
    if (opt.pad_multiple < 0) return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: negative pad multiple");
    if (opt.pad_multiple == 0) opt.pad_multiple = 32;
    if ((unsigned)opt.algorithm > LT_PACK_NONE || (unsigned)opt.overflow > LT_PACK_SPLIT)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: unknown algorithm or overflow policy");
    LT_TRY(lt_pack_input_check(ctx, in));

    const int32_t L = (int32_t)opt.row_len;
    const int64_t n_seqs = in->n_seqs;
    lt_pack_stats st;
    memset(&st, 0, sizeof st);
    st.input_sequences = n_seqs;

    lt_pack_plan *plan = NULL;
    lt_pack_piece *pc = NULL, *final_pc = NULL;
    int32_t *order = NULL, *row_at = NULL, *row_order = NULL;
    int64_t *row_count = NULL, *cursor = NULL;
    int64_t n_pieces = 0, n_rows = 0;

    /* 1. Pieces: one per non-empty sequence, several for a split one. */
    for (int64_t i = 0; i < n_seqs; i++) {
        int64_t len = in->offsets[i + 1] - in->offsets[i];
        if (len == 0) st.empty_sequences++;
        else if (len <= L || opt.overflow == LT_PACK_TRUNCATE) n_pieces++;
        else n_pieces += (len - 1 + (L - 1) - 1) / (L - 1);
    }
    if (n_pieces > INT32_MAX)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: %lld pieces exceed the supported %d", (long long)n_pieces,
                        INT32_MAX);
    PACK_ALLOC(pc, n_pieces, "pack pieces");
    {
        int64_t k = 0;
        for (int64_t i = 0; i < n_seqs; i++) {
            int64_t len = in->offsets[i + 1] - in->offsets[i];
            if (len == 0) continue;
            if (len <= L) {
                pc[k++] = (lt_pack_piece){i, 0, (int32_t)len};
            } else if (opt.overflow == LT_PACK_TRUNCATE) {
                pc[k++] = (lt_pack_piece){i, 0, L};
                st.truncated++;
                st.dropped_tokens += len - L;
            } else {
                st.split++;
                /* Stride L-1: piece j+1 starts on piece j's last token, which piece j cannot use
                 * as an input with a target, so every token from 1 on is a target exactly once. */
                for (int64_t s = 0;; s += L - 1) {
                    if (s > INT32_MAX) {
                        lt_error(ctx, LT_ERR_INVALID_ARG, "pack: sequence %lld longer than %d tokens", (long long)i,
                                 INT32_MAX);
                        goto fail;
                    }
                    int64_t e = s + L < len ? s + L : len;
                    pc[k++] = (lt_pack_piece){i, (int32_t)s, (int32_t)(e - s)};
                    if (e == len) break;
                }
            }
        }
        LT_ASSERT(k == n_pieces);
    }

    /* 2. Order and 3. rows. */
    PACK_ALLOC(order, n_pieces, "pack order");
    PACK_ALLOC(row_at, n_pieces, "pack row of placement");
    uint64_t rng = rng_init(opt.seed, opt.epoch, (uint64_t)opt.algorithm);
    if (opt.algorithm == LT_PACK_FIRST_FIT) {
        for (int64_t i = 0; i < n_pieces; i++) order[i] = (int32_t)i;
        shuffle_i32(order, n_pieces, &rng);
        if (assign_first_fit(ctx, pc, order, n_pieces, L, row_at, &n_rows) != LT_OK) goto fail;
    } else if (opt.algorithm == LT_PACK_BFD) {
        if (order_by_length(ctx, pc, n_pieces, L, 1, order) != LT_OK) goto fail;
        if (assign_bfd(ctx, pc, order, n_pieces, L, row_at, &n_rows) != LT_OK) goto fail;
    } else {
        if (order_by_length(ctx, pc, n_pieces, L, 0, order) != LT_OK) goto fail;
        for (int64_t k = 0; k < n_pieces; k++) row_at[k] = (int32_t)k;
        n_rows = n_pieces;
    }

    /* 4. Final row order: first fit keeps creation order (already random); BFD shuffles rows;
     * unpacked keeps length-sorted rows together per batch and shuffles the batches. */
    const int64_t B = opt.batch_size;
    const int64_t n_batches = (n_rows + B - 1) / B;
    PACK_ALLOC(row_order, n_rows, "pack row order");
    for (int64_t r = 0; r < n_rows; r++) row_order[r] = (int32_t)r;
    if (opt.algorithm == LT_PACK_BFD) {
        shuffle_i32(row_order, n_rows, &rng);
    } else if (opt.algorithm == LT_PACK_NONE && n_batches > 1) {
        int32_t *bperm = NULL;
        PACK_ALLOC(bperm, n_batches, "batch order");
        for (int64_t b = 0; b < n_batches; b++) bperm[b] = (int32_t)b;
        shuffle_i32(bperm, n_batches, &rng);
        int64_t k = 0;
        for (int64_t b = 0; b < n_batches; b++)
            for (int64_t r = bperm[b] * B; r < (bperm[b] + 1) * B && r < n_rows; r++) row_order[k++] = (int32_t)r;
        PACK_FREE(bperm, n_batches);
    }

    /* 5. Group pieces by row (stable in placement order), rows in final order. */
    PACK_ALLOC(plan, 1, "pack plan");
    memset(plan, 0, sizeof *plan);
    plan->opt = opt;
    plan->n_seqs = n_seqs;
    plan->n_pieces = n_pieces;
    plan->n_rows = n_rows;
    plan->n_batches = n_batches;
    plan->B = B;
    PACK_ALLOC(row_count, n_rows + 1, "pack row counts");
    memset(row_count, 0, (size_t)(n_rows + 1) * sizeof *row_count);
    for (int64_t k = 0; k < n_pieces; k++) row_count[row_at[k]]++;
    PACK_ALLOC(plan->row_begin, n_rows + 1, "pack row index");
    PACK_ALLOC(cursor, n_rows, "pack row cursor");
    plan->row_begin[0] = 0;
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t orig = row_order[r];
        plan->row_begin[r + 1] = plan->row_begin[r] + row_count[orig];
        cursor[orig] = plan->row_begin[r];
    }
    PACK_ALLOC(final_pc, n_pieces, "pack plan pieces");
    for (int64_t k = 0; k < n_pieces; k++) final_pc[cursor[row_at[k]]++] = pc[order[k]];
    plan->pieces = final_pc;
    final_pc = NULL;

    /* 6. Batch widths, segments and statistics. */
    PACK_ALLOC(plan->batch_T, n_batches, "pack batch widths");
    int64_t S = 1, targets = 0, real = 0, cap = 0;
    for (int64_t b = 0; b < n_batches; b++) {
        int64_t T = L;
        if (opt.algorithm == LT_PACK_NONE) {
            int64_t longest = 0;
            for (int64_t r = b * B; r < (b + 1) * B && r < n_rows; r++) {
                int64_t used = 0;
                for (int64_t k = plan->row_begin[r]; k < plan->row_begin[r + 1]; k++) used += plan->pieces[k].len;
                if (used > longest) longest = used;
            }
            T = (longest + opt.pad_multiple - 1) / opt.pad_multiple * opt.pad_multiple;
            if (T > L) T = L;
            if (T < longest) T = longest;
        }
        plan->batch_T[b] = (int32_t)T;
        cap += B * T;
        for (int64_t r = b * B; r < (b + 1) * B; r++) {
            if (r >= n_rows) {
                st.empty_rows++;
                continue;
            }
            int64_t used = 0, segs = plan->row_begin[r + 1] - plan->row_begin[r];
            for (int64_t k = plan->row_begin[r]; k < plan->row_begin[r + 1]; k++) used += plan->pieces[k].len;
            real += used;
            if (used < T) segs++;
            if (segs > S) S = segs;
        }
    }
    for (int64_t k = 0; k < n_pieces; k++) {
        const lt_pack_piece *p = &plan->pieces[k];
        if (!in->supervised) {
            targets += p->len - 1;
            continue;
        }
        const uint8_t *m = in->supervised + in->offsets[p->seq] + p->start;
        for (int32_t j = 1; j < p->len; j++) targets += m[j] != 0;
    }
    plan->S = S;
    st.pieces = n_pieces;
    st.rows = n_rows;
    st.batches = n_batches;
    st.max_segments = S;
    st.real_tokens = real;
    st.capacity_tokens = cap;
    st.padding_tokens = cap - real;
    st.targets = targets;
    st.seqs_per_row = n_rows ? (double)n_pieces / (double)n_rows : 0.0;
    st.utilisation = cap ? (double)real / (double)cap : 0.0;
    st.padding_waste = cap ? (double)(cap - real) / (double)cap : 0.0;
    plan->stats = st;

    PACK_FREE(pc, n_pieces);
    PACK_FREE(order, n_pieces);
    PACK_FREE(row_at, n_pieces);
    PACK_FREE(row_count, n_rows + 1);
    PACK_FREE(row_order, n_rows);
    PACK_FREE(cursor, n_rows);
    *out = plan;
    return LT_OK;

fail : {
    lt_status s = lt_ctx_status(ctx);
    if (s == LT_OK) s = LT_ERR_OOM;
    PACK_FREE(pc, n_pieces);
    PACK_FREE(final_pc, n_pieces);
    PACK_FREE(order, n_pieces);
    PACK_FREE(row_at, n_pieces);
    PACK_FREE(row_count, n_rows + 1);
    PACK_FREE(row_order, n_rows);
    PACK_FREE(cursor, n_rows);
    lt_pack_plan_free(ctx, plan);
    return s;
}
}

lt_pack_stats lt_pack_plan_stats(const lt_pack_plan *plan) { return plan->stats; }
int64_t lt_pack_plan_batches(const lt_pack_plan *plan) { return plan->n_batches; }

void lt_pack_batch_shape(const lt_pack_plan *plan, int64_t batch, int64_t *B, int64_t *T, int64_t *S) {
    *B = plan->B;
    *T = (batch >= 0 && batch < plan->n_batches) ? plan->batch_T[batch] : plan->opt.row_len;
    *S = plan->S;
}

lt_status lt_pack_fill(lt_ctx *ctx, const lt_pack_plan *plan, const lt_pack_input *in, int64_t batch,
                       lt_pack_batch *out) {
    if (batch < 0 || batch >= plan->n_batches)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: batch %lld out of range [0, %lld)", (long long)batch,
                        (long long)plan->n_batches);
    if (!in || in->n_seqs != plan->n_seqs)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: input has %lld sequences, the plan was built for %lld",
                        in ? (long long)in->n_seqs : -1LL, (long long)plan->n_seqs);
    if (!out || !out->input_ids || !out->targets || !out->position_ids || !out->seq_offsets)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "pack: batch buffers missing");
    const int64_t B = plan->B, T = plan->batch_T[batch], S = plan->S;
    const int32_t pad = plan->opt.pad_id;
    for (int64_t b = 0; b < B; b++) {
        int64_t r = batch * B + b;
        int32_t *ids = out->input_ids + b * T, *tg = out->targets + b * T, *pos = out->position_ids + b * T;
        int32_t *so = out->seq_offsets + b * (S + 1);
        int64_t used = 0, seg = 0;
        so[0] = 0;
        if (r < plan->n_rows) {
            for (int64_t k = plan->row_begin[r]; k < plan->row_begin[r + 1]; k++) {
                const lt_pack_piece *p = &plan->pieces[k];
                int64_t base = in->offsets[p->seq] + p->start;
                LT_ASSERT(in->offsets[p->seq] + p->start + p->len <= in->offsets[p->seq + 1]);
                const int32_t *tok = in->tokens + base;
                const uint8_t *m = in->supervised ? in->supervised + base : NULL;
                memcpy(ids + used, tok, (size_t)p->len * sizeof *tok);
                for (int32_t j = 0; j + 1 < p->len; j++) {
                    tg[used + j] = (!m || m[j + 1]) ? tok[j + 1] : LT_PACK_IGNORE;
                    pos[used + j] = j;
                }
                tg[used + p->len - 1] = LT_PACK_IGNORE;
                pos[used + p->len - 1] = p->len - 1;
                used += p->len;
                so[++seg] = (int32_t)used;
            }
        }
        if (out->n_pieces) out->n_pieces[b] = (int32_t)seg;
        if (used < T) {
            for (int64_t j = used; j < T; j++) {
                ids[j] = pad;
                tg[j] = LT_PACK_IGNORE;
                pos[j] = (int32_t)(j - used);
            }
            so[++seg] = (int32_t)T;
        }
        LT_ASSERT(seg <= S);
        for (int64_t k = seg + 1; k <= S; k++) so[k] = (int32_t)T;
    }
    return LT_OK;
}
