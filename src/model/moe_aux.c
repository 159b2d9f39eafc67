/* The MoE load-balancing loss over a context-parallel group: each rank routes its share of the
 * sequence, so the statistics (2, E) and the aux gradient's scale are summed over the group after
 * the forward of every layer and before any backward, and M counts the group's real tokens; the
 * aux loss and its gradient are then those of the whole sequence on one device. The reductions are
 * queued on the device with the step (no host wait). Data parallel ranks keep their own. */
#include "longtune/comm.h"
#include "model/step.h"

int64_t lt_step_moe_group_real(const lt_step *s) { return s->n_real * (int64_t)lt_comm_size(s->m->cp); }

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
