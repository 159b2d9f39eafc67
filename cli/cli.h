/* Shared helpers of the CLI: declarations of the subcommand handlers, strict number parsing for
 * flags, and the usage-error convention (message + usage line on stderr, exit status 2). */
#ifndef LT_CLI_H
#define LT_CLI_H

#include <stddef.h>
#include <stdint.h>
#include "longtune/model.h"
#include "longtune/status.h"

#define LT_CMD(name, fn, summary) int fn(int argc, char **argv);
#include "commands.h"
#undef LT_CMD

#define LT_EXIT_OK 0
#define LT_EXIT_FAIL 1
#define LT_EXIT_USAGE 2
#define LT_EXIT_DIVERGED 4 /* train: a non-finite loss or gradient norm stopped the run */

/* Prints "longtune <cmd>: <message>" and "usage: <usage>" to stderr; returns LT_EXIT_USAGE. */
int lt_cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Prints "longtune <cmd>: <status>: <ctx message>" to stderr; returns LT_EXIT_FAIL. */
int lt_cli_fail(const char *cmd, lt_ctx *ctx, lt_status s);

/* Strict parsers: the whole string must be a number in range; return 0 on success. */
int lt_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int lt_cli_parse_f64(const char *s, double lo, double hi, double *out);
/* Byte sizes: "123", "512M", "8G", "1.5GiB", "2T" (binary units). */
int lt_cli_parse_bytes(const char *s, uint64_t *out);
/* Human-readable bytes into buf ("1.23 GiB"). */
const char *lt_cli_fmt_bytes(uint64_t bytes, char *buf, int n);
/* A recompute choice for messages: "every:2", "all + recompute_attention", "all + attention rerun
 * in 12 layers", with ", chunks of N rows" when its chunk differs from `asked_chunk`. */
const char *lt_cli_recompute_desc(lt_recompute policy, int64_t k, int recompute_attention, int64_t attention_layers,
                                  int64_t chunk, int64_t asked_chunk, char *buf, size_t n);

#endif
