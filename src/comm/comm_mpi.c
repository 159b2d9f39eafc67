/* The MPI transport of lt_comm: host buffers over MPI_COMM_WORLD, errors returned (not fatal) and
 * turned into lt_status with MPI's message. Counts above INT_MAX are sent in pieces. Without MPI in
 * the build every entry point reports LT_ERR_UNSUPPORTED; nothing here knows about CUDA. */
#include <limits.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "longtune/alloc.h"

#if LT_HAVE_MPI
#include <mpi.h>

/* Largest piece per MPI call, in elements or bytes (MPI counts are int). */
#define PIECE ((int64_t)1 << 30)
/* Reductions in flight at once in the bucketed all-reduce. */
#define WINDOW 32

static lt_status mpi_fail(lt_ctx *ctx, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    return lt_error(ctx, LT_ERR_IO, "comm: %s failed: %s", what, len ? msg : "unknown MPI error");
}

#define MPI_TRY(call, what)                                      \
    do {                                                         \
        int rc_ = (call);                                        \
        if (rc_ != MPI_SUCCESS) return mpi_fail(ctx, rc_, what); \
    } while (0)

static MPI_Datatype mpi_type(lt_comm_dtype dt) { return dt == LT_COMM_F64 ? MPI_DOUBLE : MPI_FLOAT; }
static size_t dt_size(lt_comm_dtype dt) { return dt == LT_COMM_F64 ? 8 : 4; }

lt_status lt_comm_mpi_start(lt_ctx *ctx, lt_comm *c) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: MPI was already finalised in this process");
    if (!inited) {
        /* FUNNELED: OpenMP threads compute, only the main thread talks to MPI. */
        int provided = 0;
        MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        c->mpi_owned = 1;
    }
    c->mpi_active = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), "MPI_Comm_rank");
    MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &c->size), "MPI_Comm_size");
    /* Ranks sharing a host, for picking a GPU: a communicator split by shared memory. */
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &c->local_rank);
        MPI_Comm_free(&node);
    } else {
        c->local_rank = c->rank;
    }
    return LT_OK;
}

void lt_comm_mpi_stop(lt_comm *c) {
    if (c->mpi_owned) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    }
    c->mpi_active = 0;
    c->mpi_owned = 0;
}

void lt_comm_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code ? code : 1); }

lt_status lt_comm_mpi_allreduce(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    (void)c;
    char *p = buf;
    for (int64_t i = 0; i < count; i += PIECE) {
        int64_t n = count - i < PIECE ? count - i : PIECE;
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, p + (size_t)i * dt_size(dt), (int)n, mpi_type(dt), MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
    }
    return LT_OK;
}

lt_status lt_comm_mpi_allreduce_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket) {
    (void)c;
    if (bucket > PIECE) bucket = PIECE;
    MPI_Request req[WINDOW];
    int64_t i = 0;
    while (i < count) {
        int nreq = 0;
        for (; nreq < WINDOW && i < count; nreq++, i += bucket) {
            int64_t n = count - i < bucket ? count - i : bucket;
            int rc = MPI_Iallreduce(MPI_IN_PLACE, buf + i, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req[nreq]);
            if (rc != MPI_SUCCESS) {
                MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
                return mpi_fail(ctx, rc, "MPI_Iallreduce");
            }
        }
        MPI_TRY(MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE), "MPI_Waitall (all-reduce buckets)");
    }
    return LT_OK;
}

size_t lt_comm_mpi_request_size(void) { return sizeof(MPI_Request); }

lt_status lt_comm_mpi_istart(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, void *req) {
    (void)c;
    if (count > PIECE) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: bucket of %lld elements", (long long)count);
    MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, (MPI_Request *)req),
            "MPI_Iallreduce");
    return LT_OK;
}

lt_status lt_comm_mpi_progress(lt_ctx *ctx, lt_comm *c, void *reqs, int n) {
    (void)c;
    int flag = 0;
    /* Open MPI moves nonblocking collectives forward only inside MPI calls: a test is that call. */
    if (n > 0) MPI_TRY(MPI_Testall(n, (MPI_Request *)reqs, &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    return LT_OK;
}

lt_status lt_comm_mpi_waitall(lt_ctx *ctx, lt_comm *c, void *reqs, int n) {
    (void)c;
    if (n > 0) MPI_TRY(MPI_Waitall(n, (MPI_Request *)reqs, MPI_STATUSES_IGNORE), "MPI_Waitall");
    return LT_OK;
}

lt_status lt_comm_mpi_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root) {
    (void)c;
    char *p = buf;
    for (size_t i = 0; i < bytes; i += (size_t)PIECE) {
        size_t n = bytes - i < (size_t)PIECE ? bytes - i : (size_t)PIECE;
        MPI_TRY(MPI_Bcast(p + i, (int)n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
    return LT_OK;
}

lt_status lt_comm_mpi_barrier(lt_ctx *ctx, lt_comm *c) {
    (void)c;
    MPI_TRY(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    return LT_OK;
}

lt_status lt_comm_mpi_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sb, size_t sn, int dst, void *rb, size_t rn,
                               int src) {
    (void)c;
    const char *s = sb;
    char *r = rb;
    /* Both sides cut their messages into the same pieces, so piece k meets piece k. */
    for (size_t i = 0; i < sn || i < rn; i += (size_t)PIECE) {
        int ns = (int)(i < sn ? (sn - i < (size_t)PIECE ? sn - i : (size_t)PIECE) : 0);
        int nr = (int)(i < rn ? (rn - i < (size_t)PIECE ? rn - i : (size_t)PIECE) : 0);
        MPI_TRY(MPI_Sendrecv(ns ? s + i : NULL, ns, MPI_BYTE, ns ? dst : MPI_PROC_NULL, 71, nr ? r + i : NULL, nr,
                             MPI_BYTE, nr ? src : MPI_PROC_NULL, 71, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
    }
    return LT_OK;
}

lt_status lt_comm_mpi_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst) {
    (void)c;
    const char *p = buf;
    size_t i = 0;
    do {
        size_t n = bytes - i < (size_t)PIECE ? bytes - i : (size_t)PIECE;
        MPI_TRY(MPI_Send(p + i, (int)n, MPI_BYTE, dst, 72, MPI_COMM_WORLD), "MPI_Send");
        i += n;
    } while (i < bytes);
    return LT_OK;
}

lt_status lt_comm_mpi_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src) {
    (void)c;
    char *p = buf;
    size_t i = 0;
    do {
        size_t n = bytes - i < (size_t)PIECE ? bytes - i : (size_t)PIECE;
        MPI_Status st;
        MPI_TRY(MPI_Recv(p + i, (int)n, MPI_BYTE, src, 72, MPI_COMM_WORLD, &st), "MPI_Recv");
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if ((size_t)got != n)
            return lt_error(ctx, LT_ERR_IO, "comm: received %d bytes from rank %d, expected %zu", got, src, n);
        i += n;
    } while (i < bytes);
    return LT_OK;
}

static int sub_messages(const lt_comm_piece *pc, int n) {
    int64_t k = 0;
    for (int i = 0; i < n; i++) k += pc[i].bytes ? (int64_t)((pc[i].bytes + (size_t)PIECE - 1) / (size_t)PIECE) : 0;
    return k > INT_MAX / 2 ? INT_MAX / 2 : (int)k;
}

/* Pieces of one peer pair are matched in order by MPI's non-overtaking rule (same source, tag and
 * communicator); both sides cut a piece above PIECE bytes the same way. Receives are posted first. */
lt_status lt_comm_mpi_exchange(lt_ctx *ctx, lt_comm *c, const void *send, const lt_comm_piece *sp, int ns, void *recv,
                               const lt_comm_piece *rp, int nr) {
    (void)c;
    int nreq = sub_messages(sp, ns) + sub_messages(rp, nr);
    MPI_Request stack[64], *req = stack;
    size_t rb = (size_t)nreq * sizeof(MPI_Request);
    if (nreq > 64 && !(req = lt_alloc(ctx, LT_DEVICE_CPU, rb, "MPI exchange requests"))) return LT_ERR_OOM;
    int k = 0, rc = MPI_SUCCESS;
    for (int pass = 0; pass < 2 && rc == MPI_SUCCESS; pass++) {
        const lt_comm_piece *pc = pass ? sp : rp;
        for (int i = 0; i < (pass ? ns : nr) && rc == MPI_SUCCESS; i++)
            for (size_t o = 0; o < pc[i].bytes && rc == MPI_SUCCESS; o += (size_t)PIECE) {
                int n = (int)(pc[i].bytes - o < (size_t)PIECE ? pc[i].bytes - o : (size_t)PIECE);
                if (pass)
                    rc = MPI_Isend((const char *)send + pc[i].offset + o, n, MPI_BYTE, pc[i].peer, 73, MPI_COMM_WORLD,
                                   &req[k++]);
                else
                    rc = MPI_Irecv((char *)recv + pc[i].offset + o, n, MPI_BYTE, pc[i].peer, 73, MPI_COMM_WORLD,
                                   &req[k++]);
            }
    }
    /* Whatever was posted is completed before returning, also after a failure (no request leaks). */
    int wrc = k ? MPI_Waitall(k, req, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    if (req != stack) lt_free(ctx, LT_DEVICE_CPU, req, rb);
    if (rc != MPI_SUCCESS) return mpi_fail(ctx, rc, "MPI_Isend/MPI_Irecv (exchange)");
    if (wrc != MPI_SUCCESS) return mpi_fail(ctx, wrc, "MPI_Waitall (exchange)");
    return LT_OK;
}

#else /* no MPI in this build */

static lt_status no_mpi(lt_ctx *ctx) {
    return lt_error(ctx, LT_ERR_UNSUPPORTED, "comm: this build has no MPI (install libopenmpi-dev and rebuild)");
}

lt_status lt_comm_mpi_start(lt_ctx *ctx, lt_comm *c) {
    (void)c;
    return no_mpi(ctx);
}
void lt_comm_mpi_stop(lt_comm *c) { c->mpi_active = 0; }
void lt_comm_mpi_abort(int code) { (void)code; }
lt_status lt_comm_mpi_allreduce(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    (void)c, (void)buf, (void)count, (void)dt;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_allreduce_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket) {
    (void)c, (void)buf, (void)count, (void)bucket;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_barrier(lt_ctx *ctx, lt_comm *c) {
    (void)c;
    return no_mpi(ctx);
}
size_t lt_comm_mpi_request_size(void) { return 1; }
lt_status lt_comm_mpi_istart(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, void *req) {
    (void)c, (void)buf, (void)count, (void)req;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_progress(lt_ctx *ctx, lt_comm *c, void *reqs, int n) {
    (void)c, (void)reqs, (void)n;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_waitall(lt_ctx *ctx, lt_comm *c, void *reqs, int n) {
    (void)c, (void)reqs, (void)n;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sb, size_t sn, int dst, void *rb, size_t rn,
                               int src) {
    (void)c, (void)sb, (void)sn, (void)dst, (void)rb, (void)rn, (void)src;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst) {
    (void)c, (void)buf, (void)bytes, (void)dst;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src) {
    (void)c, (void)buf, (void)bytes, (void)src;
    return no_mpi(ctx);
}
lt_status lt_comm_mpi_exchange(lt_ctx *ctx, lt_comm *c, const void *send, const lt_comm_piece *sp, int ns, void *recv,
                               const lt_comm_piece *rp, int nr) {
    (void)c, (void)send, (void)sp, (void)ns, (void)recv, (void)rp, (void)nr;
    return no_mpi(ctx);
}
#endif
