/* PEFT's element order of a LoRA tensor against longtune's storage (include/longtune/model.h).
 * A plain matrix and an expert stack's A are stored as PEFT saves them. An expert B is PEFT's
 * (out, r·E) matrix whose column j·E + e belongs to expert e; longtune keeps each expert's (out, r)
 * block contiguous: down as (E·C, r), gate_up as the gate stack (E·moe_F, r) then the up stack. */
#include "longtune/model.h"

int64_t lt_lora_tensor_peft_index(const lt_lora_tensor *t, int64_t i) {
    if (!t->experts || !t->is_b || t->peft_rows < 1 || t->peft_cols < 1) return i;
    int64_t E = t->experts, r = t->peft_cols / E;
    int64_t o = i / t->peft_cols, col = i % t->peft_cols;
    int64_t j = col / E, e = col % E;
    if (t->proj == LT_PROJ_GATE) {
        /* peft_rows = 2·moe_F: the gate rows, then the up rows; numel = 2·E·moe_F·r. */
        int64_t F = t->peft_rows / 2, half = E * F * r;
        if (o < F) return (e * F + o) * r + j;
        return half + (e * F + (o - F)) * r + j;
    }
    /* down: peft_rows = C; storage (E·C, r). */
    return (e * t->peft_rows + o) * r + j;
}
