/* Private helpers shared by the files of src/train: atomic file writes (temp + fsync + rename),
 * the sizes of the buffers the trainer's plan counts, and the 64-bit FNV-1a checksum checkpoints
 * carry. Not part of the public API. */
#ifndef LT_TRAIN_INTERNAL_H
#define LT_TRAIN_INTERNAL_H

#include <stdio.h>
#include "longtune/train.h"

/* A file being written next to its final path; nothing appears at `path` until commit. */
typedef struct lt_atomic_file {
    FILE *f;
    char path[LT_TRAIN_PATH_MAX];
    char tmp[LT_TRAIN_PATH_MAX + 32];
} lt_atomic_file;

/* Opens "<path>.tmp.<pid>" for writing. Errors: LT_ERR_IO naming the path. */
lt_status lt_atomic_open(lt_ctx *ctx, lt_atomic_file *af, const char *path);
/* Writes n bytes; LT_ERR_IO on a short write. */
lt_status lt_atomic_write(lt_ctx *ctx, lt_atomic_file *af, const void *p, size_t n);
/* Flushes, fsyncs, closes and renames over `path`, then fsyncs the folder. On failure the temp
 * file is removed and LT_ERR_IO returned. */
lt_status lt_atomic_commit(lt_ctx *ctx, lt_atomic_file *af);
/* Closes and removes the temp file (after an error elsewhere). Safe to call twice. */
void lt_atomic_abort(lt_atomic_file *af);

/* Creates folder `dir` and its parents if absent (as mkdir -p). LT_ERR_IO otherwise. */
lt_status lt_train_mkdir(lt_ctx *ctx, const char *dir);
/* Takes the adapter folder's lock (lock.c) for this process; *fd (-1 on failure) holds it until
 * lt_train_unlock_dir. LT_ERR_INVALID_ARG names the pid of a run holding it already. */
#define LT_TRAIN_LOCK_FILE ".longtune.lock"
lt_status lt_train_lock_dir(lt_ctx *ctx, const char *dir, int *fd);
void lt_train_unlock_dir(int fd);
/* Removes NAME.tmp.PID files of saves killed midway (their pid no longer runs) from dir; the
 * lock is held, so no live run of this folder is writing one. Best effort. */
void lt_train_clean_stale_tmp(const char *dir);
/* Every output path of a run into dir (out_paths.c) fits PATH_MAX, LT_TRAIN_PATH_MAX and
 * NAME_MAX; LT_ERR_INVALID_ARG names the file and the longest folder path allowed. */
lt_status lt_train_check_out_paths(lt_ctx *ctx, const char *dir);

/* lt_peft_save with base_model written as given (already resolved by lt_peft_base_model_name):
 * the trainer resolves the name once at setup, so a save opens nothing but its own files. m (may
 * be NULL without expert stacks) gives the expert stacks' PEFT shape and element order. */
lt_status lt_peft_save_named(lt_ctx *ctx, const char *dir, const char *base_model, const lt_train_options *opt,
                             const lt_train_param *params, int n_params, const lt_model *m);

/* 1 when opt's lora_targets is the default list, not given through lt_train_options_set: the
 * LoRA options then leave the choice to the model (every projection of a dense model, the
 * attention's on mixture-of-experts layers). */
int lt_train_targets_defaulted(const lt_train_options *opt);

/* Bytes the metrics log holds while open (lt_metrics_open's one block). */
size_t lt_metrics_bytes(void);
/* Bytes the adapter export holds while it writes n tensors (its safetensors index and key names). */
size_t lt_peft_export_bytes(int n);

#define LT_FNV64_INIT 0xcbf29ce484222325ull
uint64_t lt_fnv64(uint64_t h, const void *p, size_t n);

#endif
