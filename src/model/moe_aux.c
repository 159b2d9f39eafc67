/* The MoE load-balancing loss over a context-parallel group: each rank routes its share of the
 * sequence, so the statistics (2, E) and the aux gradient's scale are summed over the group after
 * the forward of every layer and before any backward, and M counts the group's real tokens (a
 * padded row's tail left out by its zig-zag places); the aux loss and its gradient are then those
 * of the whole sequence on one device. The reductions are queued on the device with the step (no
 * host wait). Data parallel ranks keep their own statistics, as DDP does. */
#include "longtune/comm.h"
#include "longtune/context_parallel.h"
#include "model/step.h"

static int is_real(const lt_step *s, int world, int rank, int64_t i) {
    return lt_cp_zigzag_position(s->T * world, world, rank, i) < s->cp_real;
}

lt_status lt_step_moe_group_real(lt_step *s, const lt_model_batch *b, int64_t *group) {
    const lt_comm *c = s->m->cp;
    const int world = lt_comm_size(c), rank = lt_comm_rank(c);
    s->cp_real = b->cp_real;
    *group = s->n_real;
    if (!c) {
        if (b->cp_real)
            return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: cp_real = %lld without context parallel",
                            (long long)b->cp_real);
        return LT_OK;
    }
    /* begin_step holds a context-parallel step to one row without seq_offsets: all real but cp_real's tail */
    if (b->cp_real < 0 || b->cp_real > s->T * world)
        return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: cp_real = %lld is outside 0..%lld (the whole row)",
                        (long long)b->cp_real, (long long)(s->T * world));
    if (b->cp_real == s->T * world) s->cp_real = 0;
    if (!s->cp_real) {
        *group = s->n_real * world;
        return LT_OK;
    }
    s->n_real = 0;
    for (int64_t i = 0; i < s->N; i++) s->n_real += is_real(s, world, rank, i);
    *group = s->cp_real;
    return LT_OK;
}

int64_t lt_step_moe_cp_run(const lt_step *s, int64_t g, int64_t end, int *real) {
    const int world = lt_comm_size(s->m->cp), rank = lt_comm_rank(s->m->cp);
    *real = is_real(s, world, rank, g);
    int64_t e = g + 1;
    while (e < end && is_real(s, world, rank, e) == *real) e++;
    return e;
}

lt_status lt_step_moe_reduce(lt_step *s) {
    const lt_moe_layout *o = &s->m->lay.moe;
    if (!s->m->cp || !o->stats) return LT_OK;
    /* Σ over ranks of the counts (exact in f32 below 2^24 picks) and of Σp */
    LT_TRY(
        lt_comm_allreduce_sum_queued(s->ctx, s->m->cp, lt_step_ws(s, o->stats), 2 * s->m->cfg.n_experts, LT_COMM_F32));
    /* Each rank's scale carries its own targets (coef·dloss·n_tok·E/M²); the loss's weight of the
     * aux term is dloss times the group's targets, their sum. */
    if (s->train) LT_TRY(lt_comm_allreduce_sum_queued(s->ctx, s->m->cp, s->moe_scale, 1, LT_COMM_F32));
    return LT_OK;
}
