/* Test helper: re-runs the calling test program under mpirun as a world of np ranks, so a cmocka
 * test can check collectives over real MPI processes. The workers get the parent's seed, so every
 * rank draws the same inputs. It does not start MPI in the calling process. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

int lt_test_mpirun(int np, const char *worker_arg) {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) return -1;
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -2;
    self[n] = '\0';
    char seed[32], lsan[1400];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)lt_test_seed());
    setenv("LONGTUNE_TEST_SEED", seed, 1);
    /* Containers often deny the ptrace-based single copy; shared memory and self suffice here. */
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    setenv("OMPI_MCA_btl", "self,vader", 1);
    /* Under ASan, Open MPI's allocations that outlive MPI_Finalize are suppressed by library: its
     * components stay loaded (no dlclose) so their frames keep names, and stacks are unwound
     * without frame pointers, which Open MPI's libraries lack. */
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
    const char *old = getenv("LSAN_OPTIONS");
    snprintf(lsan, sizeof lsan, "suppressions=%s/tests/lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0%s%s",
             lt_test_source_dir(), old ? ":" : "", old ? old : "");
    setenv("LSAN_OPTIONS", lsan, 1);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe --bind-to none -np %d '%s' %s", np, self,
             worker_arg);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc)) return 128;
    return WEXITSTATUS(rc);
}
