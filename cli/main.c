/* Entry point of the `longtune` command: dispatches to one handler per subcommand (cli/cmd_*.c).
 * The CLI is the only place that exits the process. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/quant_internal.h"
#include "longtune/sysinfo.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
#define LT_CMD(name, fn, summary) {#name, fn, summary},
#include "commands.h"
#undef LT_CMD
};

static void print_help(FILE *f) {
    fprintf(f,
            "longtune %s: long-context LoRA/QLoRA fine-tuning of Llama-family models\n\n"
            "usage: longtune <command> [options]\n       longtune --version | --help\n\n"
            "commands:\n",
            LT_VERSION_STRING);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'longtune <command> --help' describes a command's options.\n");
}

/* Process-level settings the libraries read only at load time, so they need one re-execution:
 * - OPENBLAS_CORETYPE when OpenBLAS did not recognise this CPU and fell back to slow generic
 *   kernels (see lt_sys_blas_coretype_hint);
 * - how idle OpenMP threads wait between parallel regions (a step runs thousands of short ones).
 *   On a busy machine (1-minute load average at least half the cores) OMP_WAIT_POLICY=passive:
 *   they sleep at once (measured on a shared 2-core machine: a SmolLM2 step took 51 s with
 *   libgomp's default spinning and 9 s passive). Otherwise a short spin first,
 *   GOMP_SPINCOUNT=LT_SPINCOUNT (about 0.2 ms), then sleep: measured on an idle 16-core machine, a
 *   fork-join cost 42.5 us passive and 4.9 us with the spin, and a SmolLM2 step at T = 512 took
 *   1262 ms passive against 1107 ms.
 * A user's own setting of any of these wins; LONGTUNE_NO_REEXEC=1 turns this off. bench train's
 * peer (PyTorch) inherits the same settings. */
#define LT_SPINCOUNT "20000"

static int machine_busy(void) {
    double load[1];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (getloadavg(load, 1) != 1 || cores < 1) return 1;
    return load[0] >= 0.5 * (double)cores;
}

static void set_runtime_environment(char **argv) {
    if (getenv("LONGTUNE_NO_REEXEC")) return;
    int change = 0;
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : lt_sys_blas_coretype_hint();
    if (core) {
        setenv("OPENBLAS_CORETYPE", core, 1);
        change = 1;
    }
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        if (!machine_busy()) setenv("GOMP_SPINCOUNT", LT_SPINCOUNT, 1);
        change = 1;
    }
    if (!change) return;
    setenv("LONGTUNE_NO_REEXEC", "1", 1);
    execv("/proc/self/exe", argv); /* on failure, carry on with the settings already loaded */
}

int main(int argc, char **argv) {
    set_runtime_environment(argv);
    if (argc < 2) {
        print_help(stderr);
        return LT_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        print_help(stdout);
        return LT_EXIT_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("longtune %s (cuda %s)\n", LT_VERSION_STRING, LT_HAVE_CUDA ? "built" : "not built");
        return LT_EXIT_OK;
    }
    /* A bad LONGTUNE_CPU_ISA is refused here, before any command reads a quantized weight. */
    char msg[256];
    lt_cpu_isa isa;
    if (lt_cpu_isa_env(&isa, msg, sizeof msg) != LT_OK) {
        fprintf(stderr, "longtune: %s\n", msg);
        return LT_EXIT_USAGE;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr,
            "longtune: unknown command '%s'\nusage: longtune <command> [options] "
            "(see 'longtune --help')\n",
            cmd);
    return LT_EXIT_USAGE;
}
