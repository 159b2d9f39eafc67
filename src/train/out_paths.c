/* The output paths of a run, checked in full before anything is loaded: a run must not train for
 * hours and then fail at its first save because a path is too long. Every file a run writes into
 * the adapter folder (and its NAME.tmp.PID temporary) must fit the trainer's path buffers
 * (LT_TRAIN_PATH_MAX) and PATH_MAX, and every component NAME_MAX. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "train/train_internal.h"

#ifndef NAME_MAX
#define NAME_MAX 255
#endif
#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Every file a run writes into adapter_path; the temporary adds ".tmp." and a pid (at most 20
 * digits are allowed for). */
static const char *const out_files[] = {"adapter_config.json",        "adapter_model.safetensors",
                                        LT_TRAIN_CHECKPOINT_FILE,     "metrics.jsonl",
                                        LT_TRAIN_DIVERGED_FILE,       LT_TRAIN_LOCK_FILE,
                                        "aborted_memory_ceiling.json"};
#define TMP_SUFFIX_MAX (sizeof ".tmp." - 1 + 20)

lt_status lt_train_check_out_paths(lt_ctx *ctx, const char *dir) {
    size_t n = strlen(dir);
    /* Components of the folder itself. */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && dir[j] != '/') j++;
        if (j - i > NAME_MAX)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "option 'adapter_path': component %zu bytes long at byte %zu ('%.16s...') is longer than "
                            "NAME_MAX (%d)",
                            j - i, i, dir + i, NAME_MAX);
        i = j + 1;
    }
    size_t limit = LT_TRAIN_PATH_MAX - 1 < PATH_MAX - 1 ? LT_TRAIN_PATH_MAX - 1 : PATH_MAX - 1, longest = 0;
    const char *name = "";
    for (size_t k = 0; k < sizeof out_files / sizeof out_files[0]; k++)
        if (strlen(out_files[k]) > longest) longest = strlen(out_files[k]), name = out_files[k];
    if (longest + TMP_SUFFIX_MAX > NAME_MAX)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "output file name %s.tmp.PID is longer than NAME_MAX (%d)", name,
                        NAME_MAX);
    size_t max_dir = limit - 1 - longest - TMP_SUFFIX_MAX;
    if (n > max_dir)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "option 'adapter_path': %zu bytes leaves no room for its outputs (%s and its temporary "
                        "%s.tmp.PID): a folder path of at most %zu bytes",
                        n, name, name, max_dir);
    return LT_OK;
}
