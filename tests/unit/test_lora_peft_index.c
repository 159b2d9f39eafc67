/* lt_lora_tensor_peft_index against a brute-force walk of longtune's storage: for hand-built
 * tensors (plain A and B, expert A, gate_up B, down B over several E, r, moe_F, C) the walk visits
 * the storage in order (stack, expert, row, column) and records which PEFT element each storage
 * slot holds, PEFT's B being (out, r·E) with expert e's column j at j·E + e; every PEFT index must
 * map to exactly that slot, and the map must be a permutation of [0, numel). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "longtune/model.h"

static lt_lora_tensor make(lt_proj proj, int is_b, int64_t E, int64_t rows, int64_t cols) {
    lt_lora_tensor t;
    memset(&t, 0, sizeof t);
    t.proj = proj;
    t.is_b = is_b;
    t.experts = E;
    t.peft_rows = rows;
    t.peft_cols = cols;
    t.value.ndim = 2;
    t.value.shape[0] = rows * cols;
    t.value.shape[1] = 1;
    return t;
}

/* want[peft index] = storage slot, by walking the storage in its own order. */
static void walk_expert_b(int64_t E, int64_t r, int64_t out, int gate_up, int64_t *want) {
    int64_t slot = 0;
    int stacks = gate_up ? 2 : 1;
    int64_t rows = gate_up ? out / 2 : out; /* rows of one expert in one stack */
    for (int s = 0; s < stacks; s++)
        for (int64_t e = 0; e < E; e++)
            for (int64_t o = 0; o < rows; o++)
                for (int64_t j = 0; j < r; j++) {
                    int64_t po = s * rows + o, pc = j * E + e;
                    want[po * (r * E) + pc] = slot++;
                }
}

static void check_perm(const lt_lora_tensor *t, const int64_t *want, int64_t n) {
    char *seen = calloc((size_t)n, 1);
    assert_non_null(seen);
    for (int64_t i = 0; i < n; i++) {
        int64_t got = lt_lora_tensor_peft_index(t, i);
        if (want) assert_int_equal(got, want[i]);
        assert_true(got >= 0 && got < n);
        assert_int_equal(seen[got], 0);
        seen[got] = 1;
    }
    free(seen);
}

static void plain_and_expert_a_are_identity(void **state) {
    (void)state;
    const int64_t r = 3, in = 7, out = 5, E = 4;
    lt_lora_tensor ts[4] = {make(LT_PROJ_Q, 0, 0, r, in), make(LT_PROJ_Q, 1, 0, out, r),
                            make(LT_PROJ_GATE, 0, E, r * E, in), make(LT_PROJ_DOWN, 0, E, r * E, out)};
    for (int k = 0; k < 4; k++) {
        int64_t n = ts[k].peft_rows * ts[k].peft_cols;
        for (int64_t i = 0; i < n; i++) assert_int_equal(lt_lora_tensor_peft_index(&ts[k], i), i);
    }
}

static void expert_b_matches_the_storage_walk(void **state) {
    (void)state;
    const int64_t Es[] = {1, 2, 3, 8}, rs[] = {1, 2, 4}, Fs[] = {1, 3, 16}, Cs[] = {2, 5, 32};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t c = 0; c < 3; c++) {
                int64_t E = Es[a], r = rs[b], F = Fs[c], C = Cs[c];
                /* gate_up: PEFT (2·moe_F, r·E). */
                int64_t n = 2 * F * r * E;
                int64_t *want = malloc((size_t)n * sizeof *want);
                assert_non_null(want);
                walk_expert_b(E, r, 2 * F, 1, want);
                lt_lora_tensor t = make(LT_PROJ_GATE, 1, E, 2 * F, r * E);
                check_perm(&t, want, n);
                free(want);
                /* down: PEFT (C, r·E). */
                n = C * r * E;
                want = malloc((size_t)n * sizeof *want);
                assert_non_null(want);
                walk_expert_b(E, r, C, 0, want);
                t = make(LT_PROJ_DOWN, 1, E, C, r * E);
                check_perm(&t, want, n);
                free(want);
            }
}

/* A few elements by hand (E = 2, r = 2, moe_F = 2, C = 3), so the walk itself is pinned. */
static void expert_b_by_hand(void **state) {
    (void)state;
    lt_lora_tensor g = make(LT_PROJ_GATE, 1, 2, 4, 4);
    /* Slot = (e·moe_F + row)·r + j, plus E·moe_F·r in the up stack. */
    assert_int_equal(lt_lora_tensor_peft_index(&g, 0), 0);
    assert_int_equal(lt_lora_tensor_peft_index(&g, 1), 4); /* e 1, row 0, j 0: (1·2 + 0)·2 + 0 */
    assert_int_equal(lt_lora_tensor_peft_index(&g, 2), 1); /* e 0, j 1 */
    assert_int_equal(lt_lora_tensor_peft_index(&g, 3), 5); /* e 1, j 1 */
    assert_int_equal(lt_lora_tensor_peft_index(&g, 8), 8); /* up row 0 (PEFT row 2), e 0, j 0 */
    assert_int_equal(lt_lora_tensor_peft_index(&g, 15), 15);
    assert_int_equal(lt_lora_tensor_peft_index(&g, 13), 14); /* PEFT row 3 = up row 1, e 1, j 0: 8 + 3·2 */
    lt_lora_tensor d = make(LT_PROJ_DOWN, 1, 2, 3, 4);
    assert_int_equal(lt_lora_tensor_peft_index(&d, 1), 6);   /* row 0, e 1, j 0: (1·3 + 0)·2 */
    assert_int_equal(lt_lora_tensor_peft_index(&d, 11), 11); /* row 2, e 1, j 1: (3 + 2)·2 + 1 */
    assert_int_equal(lt_lora_tensor_peft_index(&d, 10), 5);  /* row 2, e 0, j 1 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_and_expert_a_are_identity),
        cmocka_unit_test(expert_b_matches_the_storage_walk),
        cmocka_unit_test(expert_b_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
