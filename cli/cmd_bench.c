/* `longtune bench <name>`: runs one of the benchmarks in bench/ (list in bench/benches.h). */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} bench_entry;

static const bench_entry benches[] = {
#define LT_BENCH(name, fn, summary) {#name, fn, summary},
#include "benches.h"
#undef LT_BENCH
};
static const char *usage = "longtune bench <name> [options] | longtune bench --tier quick|full|smoke";

int lt_cmd_bench(int argc, char **argv) {
    if (argc < 2) return lt_cli_usage_error("bench", usage, "missing benchmark name");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: %s\n\nbenchmarks (each takes --help):\n", usage);
        for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
            printf("  %-10s %s\n", benches[i].name, benches[i].summary);
        return LT_EXIT_OK;
    }
    /* `bench --tier T` is the community suite (bench_suite.c) */
    if (!strncmp(argv[1], "--tier", 6)) return lt_bench_suite(argc, argv);
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].fn(argc - 1, argv + 1);
    return lt_cli_usage_error("bench", usage, "unknown benchmark '%s'", argv[1]);
}
