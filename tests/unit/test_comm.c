/* The communicator: a world of one without MPI (collectives are identities, send/receive to itself
 * copies, typed errors for bad ranks, counts and backends), launcher detection from the
 * environment, and the MPI transport over real processes: the test re-runs itself under
 * `mpirun -np 2` and `-np 3`, whose ranks check sum all-reduce (f32, f64, bucketed) against a float64
 * reference and bit-equality across ranks, broadcast, ring send/receive, send/recv and barrier. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/comm.h"
#include "longtune/sysinfo.h"

/* ---- world of one ------------------------------------------------------------------------ */

static void test_world_of_one(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_comm *c = NULL;
    assert_int_equal(lt_comm_init(ctx, NULL, &c), LT_OK);
    assert_int_equal(lt_comm_get_backend(c), LT_COMM_SELF);
    assert_int_equal(lt_comm_rank(c), 0);
    assert_int_equal(lt_comm_size(c), 1);
    assert_int_equal(lt_comm_device(c), LT_DEVICE_CPU);
    uint64_t rng = lt_test_seed();
    float x[37], y[37];
    lt_test_fill_normal(&rng, x, 37, 1.0f);
    memcpy(y, x, sizeof x);
    assert_int_equal(lt_comm_allreduce_sum(ctx, c, x, 37, LT_COMM_F32), LT_OK);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(lt_comm_allreduce_sum_bucketed(ctx, c, x, 37, 5), LT_OK);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(lt_comm_broadcast(ctx, c, x, sizeof x, 0), LT_OK);
    assert_int_equal(lt_comm_barrier(ctx, c), LT_OK);
    /* Send/receive to itself copies every byte. */
    float z[37];
    for (int i = 0; i < 37; i++) z[i] = LT_TEST_POISON;
    assert_int_equal(lt_comm_sendrecv(ctx, c, x, sizeof x, 0, z, sizeof z, 0), LT_OK);
    assert_memory_equal(x, z, sizeof x);
    /* A NULL communicator is the same world of one. */
    assert_int_equal(lt_comm_size(NULL), 1);
    assert_int_equal(lt_comm_allreduce_sum(ctx, NULL, x, 37, LT_COMM_F32), LT_OK);
    assert_memory_equal(x, y, sizeof x);
    lt_comm_free(ctx, c);
    lt_ctx_free(ctx);
}

/* Transpose and the exchange in a world of one (NULL communicator): pieces land in order. */
static void test_transpose_exchange_self(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    int32_t src[3 * 5 * 2], dst[5 * 3 * 2];
    for (int i = 0; i < 30; i++) src[i] = i, dst[i] = -1;
    assert_int_equal(lt_comm_transpose(ctx, NULL, dst, src, 3, 5, 8), LT_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++)
            for (int e = 0; e < 2; e++) assert_int_equal(dst[(j * 3 + i) * 2 + e], (i * 5 + j) * 2 + e);
    assert_int_equal(lt_comm_transpose(ctx, NULL, dst, src, -1, 5, 8), LT_ERR_INVALID_ARG);
    int32_t back[30];
    lt_comm_piece sp[2] = {{0, 0, 40}, {0, 40, 80}}, rp[2] = {{0, 80, 40}, {0, 0, 80}};
    assert_int_equal(lt_comm_exchange(ctx, NULL, src, sizeof src, sp, 2, back, sizeof back, rp, 2), LT_OK);
    assert_memory_equal(back + 20, src, 40);
    assert_memory_equal(back, src + 10, 80);
    rp[1].bytes = 40;
    assert_int_equal(lt_comm_exchange(ctx, NULL, src, sizeof src, sp, 2, back, sizeof back, rp, 2), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_exchange(ctx, NULL, src, sizeof src, sp, 2, back, sizeof back, rp, 1), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

static void test_errors(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_comm *c = NULL;
    assert_int_equal(lt_comm_init(ctx, NULL, &c), LT_OK);
    float x[4] = {1, 2, 3, 4}, y[8];
    assert_int_equal(lt_comm_allreduce_sum(ctx, c, x, -1, LT_COMM_F32), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_allreduce_sum(ctx, c, x, 4, (lt_comm_dtype)9), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_allreduce_sum(ctx, c, NULL, 4, LT_COMM_F32), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_broadcast(ctx, c, x, sizeof x, 1), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "root rank 1 outside a world of 1"));
    assert_int_equal(lt_comm_sendrecv(ctx, c, x, sizeof x, 1, y, sizeof x, 0), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_sendrecv(ctx, c, x, sizeof x, 0, y, sizeof y, 0), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_sendrecv(ctx, c, x, sizeof x, 0, y, sizeof x, -1), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_send(ctx, c, x, sizeof x, 0), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_comm_recv(ctx, c, x, sizeof x, 0), LT_ERR_INVALID_ARG);
    lt_comm_free(ctx, c);
    /* Backends this build lacks are refused by name; an unknown backend is a bad argument. */
    lt_comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = (lt_comm_backend)42;
    assert_int_equal(lt_comm_init(ctx, &o, &c), LT_ERR_INVALID_ARG);
    assert_null(c);
    if (!LT_HAVE_MPI) {
        o.backend = LT_COMM_MPI;
        assert_int_equal(lt_comm_init(ctx, &o, &c), LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), "no MPI"));
    }
    o.backend = LT_COMM_NCCL;
    if (!LT_HAVE_NCCL) {
        assert_int_equal(lt_comm_init(ctx, &o, &c), LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), "no NCCL"));
    } else if (lt_sys_cuda().count == 0) {
        /* NCCL built in but no GPU: a CUDA error with the runtime's words, nothing left allocated. */
        assert_int_equal(lt_comm_init(ctx, &o, &c), LT_ERR_CUDA);
        assert_null(c);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    }
    assert_string_equal(lt_comm_backend_name(LT_COMM_NCCL), "nccl");
    lt_comm_free(ctx, NULL);
    lt_ctx_free(ctx);
}

static void test_env_world(void **state) {
    (void)state;
    int r = -1, n = -1, lr = -1;
    unsetenv("OMPI_COMM_WORLD_RANK"), unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("PMIX_RANK");
    unsetenv("PMI_RANK"), unsetenv("PMI_SIZE");
    assert_int_equal(lt_comm_env_world(&r, &n, &lr), 0);
    assert_int_equal(r, 0);
    assert_int_equal(n, 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1), setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    assert_int_equal(lt_comm_env_world(&r, &n, &lr), 1);
    assert_int_equal(r, 2);
    assert_int_equal(n, 3);
    assert_int_equal(lr, 1);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1); /* rank outside the world: not a launch we trust */
    assert_int_equal(lt_comm_env_world(&r, &n, &lr), 0);
    setenv("OMPI_COMM_WORLD_RANK", "x1", 1);
    assert_int_equal(lt_comm_env_world(&r, &n, &lr), 0);
    unsetenv("OMPI_COMM_WORLD_RANK"), unsetenv("OMPI_COMM_WORLD_SIZE"), unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    setenv("PMI_RANK", "1", 1), setenv("PMI_SIZE", "4", 1);
    assert_int_equal(lt_comm_env_world(&r, &n, &lr), 1);
    assert_int_equal(r, 1);
    assert_int_equal(n, 4);
    assert_int_equal(lr, 1);
    unsetenv("PMI_RANK"), unsetenv("PMI_SIZE");
}

/* ---- over MPI ---------------------------------------------------------------------------- */

static void run_world(int np) {
    if (!LT_HAVE_MPI) {
        printf("skipped: this build has no MPI\n");
        skip();
    }
    int rc = lt_test_mpirun(np, "--mpi-worker");
    if (rc == -1) {
        printf("skipped: mpirun not found (scripts/setup.sh installs openmpi-bin)\n");
        skip();
    }
    if (rc != 0) fail_msg("mpirun -np %d worker exited with %d", np, rc);
}
static void test_mpi_two(void **state) {
    (void)state;
    run_world(2);
}
static void test_mpi_three(void **state) {
    (void)state;
    run_world(3);
}

static int fails;
#define WCHECK(cond, ...)                                                  \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            fails++;                                                       \
        }                                                                  \
    } while (0)

/* Rank r's contribution: normal values from the shared seed and r (every rank can rebuild all). */
static void contribution(int r, float *x, int64_t n) {
    uint64_t s = lt_test_seed() ^ (0x51ed27u * (uint64_t)(r + 1));
    lt_test_fill_normal(&s, x, n, 1.0f);
}

static int worker(void) {
    lt_ctx *ctx = lt_ctx_new();
    lt_comm *c = NULL;
    int rank = -1, envn = 0;
    lt_comm_env_world(NULL, &envn, NULL);
    lt_status s = lt_comm_init(ctx, NULL, &c);
    if (s != LT_OK) {
        fprintf(stderr, "worker: lt_comm_init: %s\n", lt_ctx_error(ctx));
        return 1;
    }
    rank = lt_comm_rank(c);
    const int n = lt_comm_size(c);
    WCHECK(lt_comm_get_backend(c) == LT_COMM_MPI, "backend %s", lt_comm_backend_name(lt_comm_get_backend(c)));
    WCHECK(n == envn && n > 1, "world %d, launcher says %d", n, envn);

    /* Sum all-reduce, f32 and bucketed: within fp32 of the float64 sum, the same bits everywhere. */
    enum { N = 1031 };
    float *x = malloc(N * sizeof *x), *xb = malloc(N * sizeof *xb), *t = malloc(N * sizeof *t);
    double *ref = calloc(N, sizeof *ref), *mag = calloc(N, sizeof *mag), *x64 = malloc(N * sizeof *x64);
    for (int r = 0; r < n; r++) {
        contribution(r, t, N);
        for (int i = 0; i < N; i++) ref[i] += t[i], mag[i] += fabs(t[i]);
    }
    contribution(rank, x, N);
    memcpy(xb, x, N * sizeof *x);
    for (int i = 0; i < N; i++) x64[i] = (double)x[i] * 3.0;
    WCHECK(lt_comm_allreduce_sum(ctx, c, x, N, LT_COMM_F32) == LT_OK, "%s", lt_ctx_error(ctx));
    WCHECK(lt_comm_allreduce_sum_bucketed(ctx, c, xb, N, 64) == LT_OK, "%s", lt_ctx_error(ctx));
    WCHECK(lt_comm_allreduce_sum(ctx, c, x64, N, LT_COMM_F64) == LT_OK, "%s", lt_ctx_error(ctx));
    double e32 = 0, eb = 0, e64 = 0;
    for (int i = 0; i < N; i++) {
        double tol = LT_TOL_F32_REL * mag[i] + LT_TOL_F32_ABS;
        e32 = fmax(e32, fabs(x[i] - ref[i]) / tol);
        eb = fmax(eb, fabs(xb[i] - ref[i]) / tol);
        e64 = fmax(e64, fabs(x64[i] - 3.0 * ref[i]) / tol);
    }
    WCHECK(e32 <= 1 && eb <= 1 && e64 <= 1, "all-reduce error / tolerance: f32 %.3g bucketed %.3g f64 %.3g", e32, eb,
           e64);
    memcpy(t, x, N * sizeof *x);
    WCHECK(lt_comm_broadcast(ctx, c, t, N * sizeof *t, 0) == LT_OK, "%s", lt_ctx_error(ctx));
    WCHECK(!memcmp(t, x, N * sizeof *x), "all-reduce results differ from rank 0's bits");

    /* The gradient reducer with buckets of 64: every rank but 0 marks ranges from the end of the
     * buffer downwards (as a backward does), rank 0 marks none (a data-parallel rank without rows);
     * finish then gives the sum on every rank, in the same bits as the bucketed all-reduce. */
    float *xr = malloc(N * sizeof *xr);
    contribution(rank, xr, N);
    lt_comm_reducer *red = NULL;
    WCHECK(lt_comm_reducer_init(ctx, c, xr, N, 64, &red) == LT_OK, "%s", lt_ctx_error(ctx));
    for (int round = 0; round < 2 && red; round++) {
        if (round == 1) contribution(rank, xr, N);
        if (rank != 0)
            for (int64_t end = N; end > 0; end -= 100)
                WCHECK(lt_comm_reducer_ready(ctx, red, end >= 100 ? end - 100 : 0, end >= 100 ? 100 : end) == LT_OK,
                       "%s", lt_ctx_error(ctx));
        WCHECK(lt_comm_reducer_finish(ctx, red) == LT_OK, "%s", lt_ctx_error(ctx));
        WCHECK(!memcmp(xr, xb, N * sizeof *xr), "round %d: reducer differs from the bucketed all-reduce", round);
    }
    WCHECK(rank == 0 || lt_comm_reducer_early_buckets(red) > 0, "no bucket started before finish");
    WCHECK(lt_comm_reducer_ready(ctx, red, N - 5, 10) == LT_ERR_INVALID_ARG, "range past the end accepted");
    lt_comm_reducer_free(ctx, red);
    free(xr);

    /* Broadcast of an odd byte count from the last rank. */
    unsigned char bb[777];
    for (int i = 0; i < 777; i++) bb[i] = (unsigned char)(rank == n - 1 ? (i * 7 + 3) & 0xff : 0xee);
    WCHECK(lt_comm_broadcast(ctx, c, bb, sizeof bb, n - 1) == LT_OK, "%s", lt_ctx_error(ctx));
    int bad = 0;
    for (int i = 0; i < 777; i++) bad += bb[i] != (unsigned char)((i * 7 + 3) & 0xff);
    WCHECK(!bad, "broadcast: %d bytes differ", bad);

    /* One step of a ring: each rank passes its values to the right and gets its left's. */
    int32_t snd[100], rcv[100];
    for (int i = 0; i < 100; i++) snd[i] = rank * 1000 + i, rcv[i] = -1;
    WCHECK(lt_comm_sendrecv(ctx, c, snd, sizeof snd, (rank + 1) % n, rcv, sizeof rcv, (rank + n - 1) % n) == LT_OK,
           "%s", lt_ctx_error(ctx));
    bad = 0;
    for (int i = 0; i < 100; i++) bad += rcv[i] != ((rank + n - 1) % n) * 1000 + i;
    WCHECK(!bad, "ring sendrecv: %d values wrong", bad);

    /* Send/recv between ranks 0 and 1. */
    double msg[3] = {rank + 0.5, 2.0, 3.0};
    if (rank == 0) WCHECK(lt_comm_send(ctx, c, msg, sizeof msg, 1) == LT_OK, "%s", lt_ctx_error(ctx));
    if (rank == 1) {
        WCHECK(lt_comm_recv(ctx, c, msg, sizeof msg, 0) == LT_OK, "%s", lt_ctx_error(ctx));
        WCHECK(msg[0] == 0.5 && msg[2] == 3.0, "recv got %g %g", msg[0], msg[2]);
    }
    WCHECK(lt_comm_broadcast(ctx, c, msg, sizeof msg, n) == LT_ERR_INVALID_ARG, "root outside the world accepted");
    WCHECK(lt_comm_barrier(ctx, c) == LT_OK, "%s", lt_ctx_error(ctx));

    /* A grouped exchange of uneven pieces, two per peer (itself included), landing in reversed
     * order: piece k from rank a to b is (a + 1) * 3 + k values tagged with (a, b, k, index). */
    {
        int32_t sb[4096], rb[4096];
        lt_comm_piece sp[64], rp[64];
        size_t so = 0, ro = 0;
        for (int j = 0; j < n && j < 32; j++)
            for (int k = 0; k < 2; k++) {
                size_t cnt = (size_t)((rank + 1) * 3 + k);
                for (size_t i = 0; i < cnt; i++) sb[so / 4 + i] = ((rank * 10 + j) * 10 + k) * 100 + (int32_t)i;
                sp[2 * j + k] = (lt_comm_piece){j, so, cnt * 4};
                so += cnt * 4;
            }
        for (int j = 0; j < n && j < 32; j++)
            for (int k = 0; k < 2; k++) ro += (size_t)((j + 1) * 3 + k) * 4;
        size_t at = ro;
        for (int j = 0; j < n && j < 32; j++)
            for (int k = 0; k < 2; k++) {
                size_t b = (size_t)((j + 1) * 3 + k) * 4;
                at -= b;
                rp[2 * j + k] = (lt_comm_piece){j, at, b};
            }
        for (int i = 0; i < 4096; i++) rb[i] = -7;
        WCHECK(lt_comm_exchange(ctx, c, sb, so, sp, 2 * n, rb, ro, rp, 2 * n) == LT_OK, "%s", lt_ctx_error(ctx));
        bad = 0;
        for (int j = 0; j < n && j < 32; j++)
            for (int k = 0; k < 2; k++)
                for (size_t i = 0; i < rp[2 * j + k].bytes / 4; i++)
                    bad += rb[rp[2 * j + k].offset / 4 + i] != ((j * 10 + rank) * 10 + k) * 100 + (int32_t)i;
        WCHECK(!bad, "exchange: %d values wrong", bad);
        lt_comm_piece out = {n, 0, 4};
        WCHECK(lt_comm_exchange(ctx, c, sb, so, &out, 1, rb, ro, rp, 0) == LT_ERR_INVALID_ARG, "peer %d accepted", n);
        out = (lt_comm_piece){0, so - 2, 4};
        WCHECK(lt_comm_exchange(ctx, c, sb, so, &out, 1, rb, ro, rp, 0) == LT_ERR_INVALID_ARG, "overrun accepted");
    }

    /* Every rank learns whether any failed, so the exit status is the world's. */
    double f = fails;
    lt_comm_allreduce_sum(ctx, c, &f, 1, LT_COMM_F64);
    free(x), free(xb), free(t), free(ref), free(mag), free(x64);
    lt_comm_free(ctx, c);
    lt_ctx_free(ctx);
    return f > 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--mpi-worker")) return worker();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_of_one), cmocka_unit_test(test_transpose_exchange_self),
        cmocka_unit_test(test_errors),       cmocka_unit_test(test_env_world),
        cmocka_unit_test(test_mpi_two),      cmocka_unit_test(test_mpi_three),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
