/* Sequence packing: turns tokenised sequences (with per-token supervision masks) into fixed-shape
 * training batches. Several sequences share a row of T = L tokens; each keeps its own positions
 * (restarting at 0) and its own attention segment (seq_offsets, as attention.h takes them), and no
 * token is trained to predict the first token of the next sequence. Also offers unpacked batching
 * (one sequence per row, padded to the longest in the batch) for comparisons. It does not read
 * files or tokenise: dataset.h produces its input. */
#ifndef LONGTUNE_PACK_H
#define LONGTUNE_PACK_H

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Target value of positions that contribute no loss (PyTorch's CrossEntropyLoss ignore_index). */
#define LT_PACK_IGNORE (-100)

/* Input: n_seqs sequences laid end to end. Sequence i is tokens[offsets[i] .. offsets[i+1]).
 * supervised[j] != 0 means token j is a training target, i.e. the loss includes predicting token j
 * from the tokens before it in the same sequence. The first token of a sequence has no predecessor
 * and is never a target, whatever its flag. supervised may be NULL (every token supervised). */
typedef struct lt_pack_input {
    const int32_t *tokens;     /* (N) */
    const uint8_t *supervised; /* (N) or NULL */
    const int64_t *offsets;    /* (n_seqs + 1), offsets[0] = 0, non-decreasing, offsets[n_seqs] = N */
    int64_t n_seqs;
} lt_pack_input;

typedef enum lt_pack_algorithm {
    LT_PACK_FIRST_FIT = 0, /* first fit over the (seed, epoch) shuffle: keeps data order random */
    LT_PACK_BFD,           /* best-fit decreasing (fewest rows); row order shuffled by (seed, epoch) */
    LT_PACK_NONE,          /* unpacked: one sequence per row, rows sorted by length, batches padded
                              to their longest row rounded up to pad_multiple; batch order shuffled */
} lt_pack_algorithm;

typedef enum lt_pack_overflow {
    LT_PACK_TRUNCATE = 0, /* keep the first L tokens of a longer sequence, drop the rest (counted) */
    LT_PACK_SPLIT,        /* cut it into pieces of L tokens that overlap by one token, so every
                             target of the sequence is still trained exactly once; each piece is
                             its own attention segment starting at position 0 */
} lt_pack_overflow;

/* Zero-initialised fields take the defaults noted. */
typedef struct lt_pack_options {
    int64_t row_len;    /* L = T of packed rows, >= 2 (required) */
    int64_t batch_size; /* rows per batch, 0 = 1 */
    lt_pack_algorithm algorithm;
    lt_pack_overflow overflow;
    uint64_t seed, epoch; /* the shuffle is a pure function of (seed, epoch) */
    int64_t pad_multiple; /* LT_PACK_NONE: batch width rounded up to this, 0 = 32 */
    int32_t pad_id;       /* input id written in padding (its targets are LT_PACK_IGNORE) */
} lt_pack_options;

/* What a plan holds, for humans and for the trainer's tokens/s. Token counts are input positions. */
typedef struct lt_pack_stats {
    int64_t input_sequences; /* n_seqs of the input, empty ones included */
    int64_t empty_sequences; /* zero-length inputs, skipped */
    int64_t pieces;          /* segments placed in rows (a split sequence gives several) */
    int64_t truncated;       /* sequences longer than L that were truncated */
    int64_t split;           /* sequences longer than L that were split */
    int64_t dropped_tokens;  /* tokens lost to truncation */
    int64_t rows;            /* rows holding at least one piece */
    int64_t empty_rows;      /* all-padding rows completing the last batch */
    int64_t batches;
    int64_t max_segments;    /* S: the most segments in a row (the padding tail counts as one) */
    int64_t real_tokens;     /* positions holding a real token */
    int64_t capacity_tokens; /* sum over batches of B * T */
    int64_t padding_tokens;  /* capacity - real */
    int64_t targets;         /* positions with a target other than LT_PACK_IGNORE */
    double seqs_per_row;     /* pieces / rows */
    double utilisation;      /* real / capacity */
    double padding_waste;    /* padding / capacity */
} lt_pack_stats;

typedef struct lt_pack_plan lt_pack_plan;

/* Decides which piece of which sequence goes where. O(n log n); memory O(n_seqs + pieces), all
 * accounted on the CPU. The plan keeps no pointer into `in`: pass the same input to lt_pack_fill.
 * Errors: LT_ERR_INVALID_ARG (L < 2, L > INT32_MAX, negative batch size, bad offsets, naming the
 * index), LT_ERR_OOM. */
LT_API lt_status lt_pack_plan_build(lt_ctx *ctx, const lt_pack_input *in, const lt_pack_options *opt,
                                    lt_pack_plan **out);
LT_API void lt_pack_plan_free(lt_ctx *ctx, lt_pack_plan *plan);

LT_API lt_pack_stats lt_pack_plan_stats(const lt_pack_plan *plan);
LT_API int64_t lt_pack_plan_batches(const lt_pack_plan *plan);
/* Shape of batch `batch`: B rows of T tokens with S segments per row (seq_offsets has S+1 entries
 * per row). Packed plans: T = L for every batch; S is the plan's max_segments for every batch, so
 * the shapes are fixed. Unpacked: T varies per batch. */
LT_API void lt_pack_batch_shape(const lt_pack_plan *plan, int64_t batch, int64_t *B, int64_t *T, int64_t *S);

/* One batch, caller-owned buffers sized by lt_pack_batch_shape (or larger: rows are written at the
 * reported T and S, densely). */
typedef struct lt_pack_batch {
    int32_t *input_ids;    /* (B, T) token ids; pad_id in padding */
    int32_t *targets;      /* (B, T) the next token of the same sequence when it is supervised,
                              else LT_PACK_IGNORE (always at each sequence's last position) */
    int32_t *position_ids; /* (B, T) 0, 1, ... restarting at each segment (padding included) */
    int32_t *seq_offsets;  /* (B, S+1) 0 = o[0] <= o[1] <= ... <= o[S] = T; the padding tail is its
                              own segment; unused trailing entries repeat T */
    int32_t *n_pieces;     /* (B) real sequences in the row; may be NULL */
} lt_pack_batch;

/* Fills batch `batch` (0 <= batch < lt_pack_plan_batches). Allocates nothing.
 * Errors: LT_ERR_INVALID_ARG (batch out of range, input not the one planned: sequence count
 * differs). */
LT_API lt_status lt_pack_fill(lt_ctx *ctx, const lt_pack_plan *plan, const lt_pack_input *in, int64_t batch,
                              lt_pack_batch *out);

/* Validates an input (offsets start at 0, non-decreasing, within int64). Errors: LT_ERR_INVALID_ARG
 * naming the first bad index. */
LT_API lt_status lt_pack_input_check(lt_ctx *ctx, const lt_pack_input *in);

LT_API const char *lt_pack_algorithm_name(lt_pack_algorithm a);
/* "first-fit" | "bfd" | "none"; LT_ERR_INVALID_ARG naming the choices otherwise. */
LT_API lt_status lt_pack_algorithm_parse(lt_ctx *ctx, const char *name, lt_pack_algorithm *out);

#ifdef __cplusplus
}
#endif
#endif
