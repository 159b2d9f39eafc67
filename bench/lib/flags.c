/* The flags every bench takes (see bench_lib.h). */
#include <stdlib.h>
#include <string.h>

#include "bench_lib.h"

void lt_bench_common_init(lt_bench_common *c) {
    memset(c, 0, sizeof *c);
    c->out = "bench/results";
    c->repeats = 5;
    c->warmup = 1;
    c->backend = "cpu";
}

int lt_bench_common_flag(lt_bench_common *c, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--json")) {
        c->json = 1;
        return 1;
    }
    const char *names[] = {"--out", "--repeats", "--warmup", "--backend"};
    for (int k = 0; k < 4; k++) {
        if (strcmp(a, names[k])) continue;
        if (*i + 1 >= argc) return -1;
        const char *v = argv[++*i];
        if (k == 0) c->out = v;
        if (k == 3) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) return -1;
            c->backend = v;
        }
        if (k == 1 || k == 2) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < (k == 1 ? 1 : 0) || n > 100000) return -1;
            if (k == 1) c->repeats = (int)n;
            else c->warmup = (int)n;
        }
        return 1;
    }
    return 0;
}
