/* Checkpoint offload: two device slots, the host block, and the order of the copies between them,
 * plus the copies of checkpoints into and out of the f32 layer inputs. Without offload the slot
 * calls are no-ops and checkpoint i is simply the i-th of the activation block's. The schedule
 * runs the same on the CPU (between two host blocks), where it is the reference. */
#include <string.h>

#include "longtune/alloc.h"
#include "model/step.h"

void lt_model_release_offload(lt_ctx *ctx, lt_model *m) {
    /* The copy queue first: closing it waits for copies that may still touch the host block. */
    if (m->xfer) m->be->xfer_close(ctx, m->xfer);
    m->xfer = NULL;
    if (m->offload) {
        if (m->opt.device == LT_DEVICE_CPU) lt_free(ctx, LT_DEVICE_CPU, m->offload, m->lay.offload_bytes);
        else lt_free_pinned(ctx, m->offload, m->lay.offload_bytes);
    }
    m->offload = NULL;
}

void *lt_step_ckpt(const lt_step *s, int64_t seg) {
    if (s->m->lay.offload) seg %= 2;
    return lt_step_blk(s, LT_MEM_ACTIVATIONS, s->m->lay.ckpt + (size_t)seg * s->m->lay.ckpt_stride);
}

/* Forward: checkpoint i goes into slot i % 2 once the copy out of its previous tenant, i - 2, is
 * done (will_write), and is copied out as soon as its writer is queued (written), so the copy runs
 * while the next layer computes. Backward: when checkpoint i is first needed (need), the other
 * slot's tenant, i + 1, has been read by everything queued, so checkpoint i - 1 is copied into it
 * then, overlapping layer i's recompute and backward; i itself was copied in the same way one
 * layer earlier, and only the wait for it is queued now. The two newest checkpoints never leave
 * their slots. */

static uint8_t *ckpt_host(const lt_step *s, int64_t i) {
    LT_ASSERT(i >= 0 && i + 2 < s->m->lay.n_ckpt);
    return s->m->offload + (size_t)i * s->m->lay.ckpt_stride;
}

static size_t ckpt_bytes(const lt_step *s) {
    return (size_t)(s->N * s->m->cfg.C) * (s->m->lay.saved_dtype == LT_DTYPE_BF16 ? 2 : 4);
}

lt_status lt_step_ckpt_will_write(const lt_step *s, int64_t i) {
    if (!s->m->lay.offload || i < 2) return LT_OK;
    return s->be->xfer_wait(s->ctx, s->m->xfer, (int)(i % 2));
}

lt_status lt_step_ckpt_written(lt_step *s, int64_t i) {
    if (!s->m->lay.offload) return LT_OK;
    s->slot_has[i % 2] = i;
    s->slot_pending[i % 2] = 0;
    if (i + 2 >= s->m->lay.n_ckpt) return LT_OK; /* stays in its slot through the backward */
    return s->be->xfer_copy(s->ctx, s->m->xfer, (int)(i % 2), ckpt_host(s, i), lt_step_ckpt(s, i), ckpt_bytes(s));
}

static lt_status ckpt_fetch(lt_step *s, int64_t i) {
    if (s->slot_has[i % 2] == i) return LT_OK;
    LT_TRY(s->be->xfer_copy(s->ctx, s->m->xfer, (int)(i % 2), lt_step_ckpt(s, i), ckpt_host(s, i), ckpt_bytes(s)));
    s->slot_has[i % 2] = i;
    s->slot_pending[i % 2] = 1;
    return LT_OK;
}

lt_status lt_step_ckpt_need(lt_step *s, int64_t i) {
    if (!s->m->lay.offload) return LT_OK;
    if (i > 0) LT_TRY(ckpt_fetch(s, i - 1));
    LT_TRY(ckpt_fetch(s, i)); /* already there but for the first use after an odd start */
    if (!s->slot_pending[i % 2]) return LT_OK;
    s->slot_pending[i % 2] = 0;
    return s->be->xfer_wait(s->ctx, s->m->xfer, (int)(i % 2));
}

lt_status lt_step_saved_copy(const lt_step *s, void *saved, float *x, int64_t n, int back) {
    if (s->m->lay.saved_dtype == LT_DTYPE_F32)
        return back ? s->be->copy_to_device(s->ctx, x, saved, (size_t)n * 4)
                    : s->be->copy_to_device(s->ctx, saved, x, (size_t)n * 4);
    if (back) s->be->from_bf16(s->ctx, (const uint16_t *)saved, x, n);
    else s->be->to_bf16(s->ctx, x, (uint16_t *)saved, n);
    return LT_OK;
}
