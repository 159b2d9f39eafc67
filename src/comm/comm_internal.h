/* Private layout of lt_comm and the entry points of each transport, shared by the files of
 * src/comm. comm.c dispatches; comm_mpi.c and comm_nccl.c hold the library calls and compile to
 * nothing when their library is absent from the build (LT_HAVE_MPI / LT_HAVE_NCCL = 0). */
#ifndef LT_COMM_INTERNAL_H
#define LT_COMM_INTERNAL_H

#include "longtune/comm.h"

struct lt_comm {
    lt_comm_backend backend;
    int rank, size, local_rank;
    int mpi_owned;  /* 1: lt_comm_init called MPI_Init, lt_comm_free finalises */
    int mpi_active; /* 1: MPI is initialised and usable (also under NCCL when launched by MPI) */
    void *nccl;     /* comm_nccl.c's state (communicator, stream, device) */
};

/* MPI (comm_mpi.c). Host buffers. */
lt_status lt_comm_mpi_start(lt_ctx *ctx, lt_comm *c);
void lt_comm_mpi_stop(lt_comm *c);
void lt_comm_mpi_abort(int code);
lt_status lt_comm_mpi_allreduce(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt);
lt_status lt_comm_mpi_allreduce_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket);
lt_status lt_comm_mpi_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root);
lt_status lt_comm_mpi_barrier(lt_ctx *ctx, lt_comm *c);
lt_status lt_comm_mpi_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sb, size_t sn, int dst, void *rb, size_t rn,
                               int src);
/* Nonblocking pieces of the reducer: req points at lt_comm_mpi_request_size() bytes. */
size_t lt_comm_mpi_request_size(void);
lt_status lt_comm_mpi_istart(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, void *req);
/* Progresses the n requests at reqs (MPI_Testsome); LT_OK whether or not they completed. */
lt_status lt_comm_mpi_progress(lt_ctx *ctx, lt_comm *c, void *reqs, int n);
lt_status lt_comm_mpi_waitall(lt_ctx *ctx, lt_comm *c, void *reqs, int n);
lt_status lt_comm_mpi_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst);
lt_status lt_comm_mpi_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src);
lt_status lt_comm_mpi_exchange(lt_ctx *ctx, lt_comm *c, const void *send, const lt_comm_piece *sp, int ns, void *recv,
                               const lt_comm_piece *rp, int nr);

/* NCCL (comm_nccl.c). Device buffers; every call synchronises its stream before returning. */
lt_status lt_comm_nccl_start(lt_ctx *ctx, lt_comm *c, const lt_comm_options *opt);
void lt_comm_nccl_stop(lt_ctx *ctx, lt_comm *c);
lt_status lt_comm_nccl_allreduce(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt);
/* Enqueued between enter and leave: ordered with the backend's stream, never waited for. */
lt_status lt_comm_nccl_allreduce_queued(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt);
lt_status lt_comm_nccl_allreduce_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket);
/* Enqueues one f32 sum all-reduce on the stream and returns; lt_comm_nccl_wait synchronises. */
lt_status lt_comm_nccl_istart(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count);
lt_status lt_comm_nccl_wait(lt_ctx *ctx, lt_comm *c);
/* Host buffer through the staging area: copy in, all-reduce, copy out, in pieces. */
lt_status lt_comm_nccl_allreduce_host(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt);
lt_status lt_comm_nccl_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root);
lt_status lt_comm_nccl_barrier(lt_ctx *ctx, lt_comm *c);
lt_status lt_comm_nccl_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sb, size_t sn, int dst, void *rb, size_t rn,
                                int src);
lt_status lt_comm_nccl_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst);
lt_status lt_comm_nccl_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src);
/* Exchange and transpose: queued on the stream after the backend's work, which then waits for
 * them (events, no host synchronisation). */
lt_status lt_comm_nccl_exchange(lt_ctx *ctx, lt_comm *c, const void *send, const lt_comm_piece *sp, int ns, void *recv,
                                const lt_comm_piece *rp, int nr);
lt_status lt_comm_nccl_transpose(lt_ctx *ctx, lt_comm *c, void *dst, const void *src, int64_t a, int64_t b, size_t w);

#endif
