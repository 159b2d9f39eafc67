/* A step's batches: the epoch's packing plan (rebuilt when the epoch changes), one batch filled
 * into the trainer's buffers, and this rank's share of it (rows for data parallel, zig-zag tokens
 * of the one row for context parallel). No model calls. */
#include <string.h>

#include "longtune/context_parallel.h"
#include "longtune/log.h"
#include "train/trainer.h"

/* Trained targets (not LT_PACK_IGNORE) among n. */
static int64_t count_targets(const int32_t *tgt, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += tgt[i] != LT_PACK_IGNORE;
    return k;
}

lt_status lt_trainer_fill(lt_trainer *t, const lt_pack_plan *plan, const lt_pack_input *in, int64_t index,
                          lt_model_batch *b, int64_t *ntok, int64_t *nreal) {
    int64_t B, T, S;
    lt_pack_batch_shape(plan, index, &B, &T, &S);
    if (B > t->B || T > t->T || S > T || S < 1)
        return lt_error(t->ctx, LT_ERR_INVALID_ARG, "batch %lld has shape B=%lld T=%lld S=%lld beyond B=%lld T=%lld",
                        (long long)index, (long long)B, (long long)T, (long long)S, (long long)t->B, (long long)t->T);
    lt_pack_batch pb = {t->ids, t->tgt, t->pos, t->offs, t->pieces};
    LT_TRY(lt_pack_fill(t->ctx, plan, in, index, &pb));
    *ntok = count_targets(t->tgt, B * T);
    if (nreal) {
        /* Real sequences come first in a row; the padding tail is its own trailing segment. */
        int64_t r = 0;
        for (int64_t row = 0; row < B; row++) {
            int32_t k = t->pieces[row];
            if (k < 0 || k > S)
                return lt_error(t->ctx, LT_ERR_INVALID_ARG, "row %lld has %d pieces", (long long)row, k);
            r += t->offs[row * (S + 1) + k];
        }
        *nreal = r;
    }
    memset(b, 0, sizeof *b);
    b->B = B;
    b->T = T;
    b->tokens = t->ids;
    b->targets = t->tgt;
    b->positions = t->pos;
    b->seq_offsets = t->offs;
    b->S = S;
    b->real_seqs = t->pieces; /* the padding tail stays out of an MoE router's statistics */
    return LT_OK;
}

lt_status lt_trainer_shard(lt_trainer *t, const lt_model_batch *b, lt_model_batch *out, int64_t *ntok) {
    if (t->cp) {
        if (b->B != 1 || b->T % (2 * t->world))
            return lt_error(t->ctx, LT_ERR_INVALID_ARG,
                            "context parallel: batch of %lld x %lld tokens is not one row "
                            "of a multiple of %d",
                            (long long)b->B, (long long)b->T, 2 * t->world);
        int64_t Tl = b->T / t->world, n = 0;
        for (int64_t i = 0; i < Tl; i++) {
            int64_t g = lt_cp_zigzag_position(b->T, t->world, t->rank, i);
            t->cp_ids[i] = b->tokens[g];
            t->cp_tgt[i] = b->targets[g];
            t->cp_pos[i] = b->positions ? b->positions[g] : (int32_t)g;
            n += t->cp_tgt[i] != LT_PACK_IGNORE;
        }
        memset(out, 0, sizeof *out);
        out->B = 1, out->T = Tl, out->step = b->step;
        out->tokens = t->cp_ids, out->targets = t->cp_tgt, out->positions = t->cp_pos;
        if (b->real_seqs && b->seq_offsets) out->cp_real = b->seq_offsets[b->real_seqs[0]]; /* the padding tail */
        *ntok = n;
        return LT_OK;
    }
    int64_t lo = b->B * t->rank / t->world, hi = b->B * (t->rank + 1) / t->world;
    *out = *b;
    out->B = hi - lo;
    out->first_row = lo;
    *ntok = 0;
    if (out->B == 0) return LT_OK;
    out->tokens = b->tokens + lo * b->T;
    out->targets = b->targets + lo * b->T;
    if (b->positions) out->positions = b->positions + lo * b->T;
    if (b->seq_offsets) out->seq_offsets = b->seq_offsets + lo * (b->S + 1);
    if (b->real_seqs) out->real_seqs = b->real_seqs + lo;
    *ntok = count_targets(out->targets, out->B * b->T);
    return LT_OK;
}

/* Builds the training plan of the data cursor's epoch with rows of `row_len`. */
static lt_status build_plan(lt_trainer *t, int64_t row_len) {
    lt_pack_plan_free(t->ctx, t->plan);
    t->plan = NULL;
    t->popt.epoch = (uint64_t)t->st.data_epoch;
    t->popt.row_len = row_len;
    LT_TRY(lt_pack_plan_build(t->ctx, t->train, &t->popt, &t->plan));
    t->plan_epoch = t->st.data_epoch;
    return LT_OK;
}

lt_status lt_trainer_next_batch(lt_trainer *t, lt_model_batch *b, int64_t *ntok, int64_t *nreal) {
    /* A curriculum stage change starts a new pass over the data packed at the stage's length. The
     * cursor always belongs to the plan of the previous step's stage, so a resumed run (which has
     * no plan yet) rebuilds the same plan and makes the same switch as the run it continues. */
    int64_t step = t->st.step, len = lt_train_seq_len_at(t->o, step);
    if (t->o->n_stages > 0) {
        if (!t->plan || t->plan_epoch != t->st.data_epoch)
            LT_TRY(build_plan(t, lt_train_seq_len_at(t->o, step > 0 ? step - 1 : 0)));
        if (t->popt.row_len != len) {
            if (t->rank == 0)
                LT_INFO("step %lld: the sequence-length curriculum moves to rows of %lld tokens", (long long)step + 1,
                        (long long)len);
            t->st.data_epoch++;
            t->st.data_cursor = 0;
            LT_TRY(build_plan(t, len));
        }
    }
    for (int tries = 0;; tries++) {
        if (!t->plan || t->plan_epoch != t->st.data_epoch) LT_TRY(build_plan(t, len));
        if (t->st.data_cursor < lt_pack_plan_batches(t->plan)) break;
        if (tries > 1) return lt_error(t->ctx, LT_ERR_INVALID_ARG, "the training set yields no batches");
        t->st.data_epoch++;
        t->st.data_cursor = 0;
    }
    LT_TRY(lt_trainer_fill(t, t->plan, t->train, t->st.data_cursor, b, ntok, nreal));
    t->st.data_cursor++;
    return LT_OK;
}
