/* The communicator: a world of ranks with the few collectives distributed training needs (sum
 * all-reduce, broadcast, barrier, paired send/receive for ring attention, a grouped exchange of
 * pieces for the all-to-all of Ulysses attention) over a standard
 * transport: MPI for host buffers, NCCL for CUDA device buffers. A world of one rank needs neither
 * (no mpirun, no MPI_Init). It is not a transport of its own and offers no other reductions. */
#ifndef LONGTUNE_COMM_H
#define LONGTUNE_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_comm_backend {
    LT_COMM_AUTO = 0, /* MPI when the process was started by an MPI launcher (and this build has
                         MPI), else a world of one */
    LT_COMM_SELF,     /* a world of one rank, host or device buffers; no library needed */
    LT_COMM_MPI,      /* host buffers over MPI_COMM_WORLD */
    LT_COMM_NCCL,     /* CUDA device buffers over NCCL; the unique id travels over MPI when MPI
                         launched the job, else through a rendezvous file */
} lt_comm_backend;

typedef enum lt_comm_dtype { LT_COMM_F32 = 0, LT_COMM_F64, LT_COMM_DTYPE_COUNT_ } lt_comm_dtype;

/* Zero-initialised = defaults. */
typedef struct lt_comm_options {
    lt_comm_backend backend;
    /* NCCL without MPI (one process per GPU started by some other launcher): rank and world size
     * (both 0 = from the environment: RANK/WORLD_SIZE as torchrun sets them, else a world of one)
     * and the rendezvous file rank 0 writes the NCCL unique id into (a path on a file system every
     * rank sees; "" = LONGTUNE_RENDEZVOUS from the environment). */
    int rank, size;
    char rendezvous[512];
    double rendezvous_timeout_s; /* how long ranks > 0 wait for the file [120] */
    int set_device;              /* NCCL: 1 = use `device`; 0 = local rank modulo the device count */
    int device;                  /* NCCL: CUDA device ordinal when set_device */
} lt_comm_options;

typedef struct lt_comm lt_comm;

/* Where an MPI launcher put this process: *rank and *size from OMPI_COMM_WORLD_RANK/SIZE, PMIX_RANK
 * with OMPI_COMM_WORLD_SIZE, or PMI_RANK/PMI_SIZE (MPICH, Slurm). Returns 1 when found, 0 when the
 * process was not launched by MPI (then *rank = 0, *size = 1). Reads the environment only. */
LT_API int lt_comm_env_world(int *rank, int *size, int *local_rank);

/* Creates the world. MPI is initialised here (thread level FUNNELED) unless the host program
 * already did; it is finalised by lt_comm_free only if initialised here. NCCL sets
 * NCCL_NVLS_ENABLE=0 in the environment when unset (NVLink multicast stays off) before creating
 * its communicator. Errors: LT_ERR_UNSUPPORTED (the backend is not in this build, named),
 * LT_ERR_INVALID_ARG (rank/size inconsistent), LT_ERR_IO (MPI or the rendezvous file failed, with
 * the library's message), LT_ERR_CUDA (NCCL or CUDA failed, with its message), LT_ERR_OOM. */
LT_API lt_status lt_comm_init(lt_ctx *ctx, const lt_comm_options *opt, lt_comm **out);
/* Tears down (NCCL communicator, MPI_Finalize when lt_comm_init called MPI_Init). NULL is a
 * no-op. */
LT_API void lt_comm_free(lt_ctx *ctx, lt_comm *c);
/* Ends the whole job at once after an unrecoverable error on one rank, so the others do not wait
 * forever in a collective (MPI_Abort under MPI); a world of one just returns. */
LT_API void lt_comm_abort(lt_comm *c, int code);

LT_API int lt_comm_rank(const lt_comm *c); /* 0 for NULL */
LT_API int lt_comm_size(const lt_comm *c); /* 1 for NULL */
LT_API lt_comm_backend lt_comm_get_backend(const lt_comm *c);
LT_API const char *lt_comm_backend_name(lt_comm_backend b); /* "auto", "self", "mpi", "nccl" */
/* Device of the buffers the collectives take: CPU for self and MPI, CUDA for NCCL. */
LT_API lt_device lt_comm_device(const lt_comm *c);

/* In-place sum over ranks of buf (count elements of dtype) on every rank. Every rank must call it
 * with the same count and dtype. Every rank receives the same bits (MPI_Allreduce / ncclAllReduce).
 * NULL comm or a world of one leaves buf as is. Returns when buf holds the result (NCCL: after a
 * stream synchronise). Errors: LT_ERR_INVALID_ARG (count < 0, dtype), LT_ERR_IO / LT_ERR_CUDA from
 * the transport. */
LT_API lt_status lt_comm_allreduce_sum(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dtype);
/* The same for a small host buffer whatever the transport: NCCL stages it through a device buffer
 * the communicator keeps (4 KiB at a time), so host-side statistics (loss sums, flags) can be
 * reduced over a device communicator. */
LT_API lt_status lt_comm_allreduce_sum_host(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dtype);
/* The same, ordered with the backend's queued work instead of waited for: NCCL enqueues the
 * reduction on the communicator's stream after what the backend queued and before what it queues
 * next (events, no host wait; capturable into a CUDA graph), as the exchange does; MPI and self
 * reduce the host buffer before returning, as lt_comm_allreduce_sum. For small step-internal
 * reductions (an MoE router's statistics under context parallel). Errors as lt_comm_allreduce_sum. */
LT_API lt_status lt_comm_allreduce_sum_queued(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dtype);
/* The same over a large f32 buffer cut into buckets of bucket_elems (0 = 4 Mi elements = 16 MiB):
 * every bucket's reduction is started before the first is waited on, so the transport pipelines
 * them (MPI_Iallreduce; NCCL groups them on its stream). Results equal lt_comm_allreduce_sum's. */
LT_API lt_status lt_comm_allreduce_sum_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count,
                                                int64_t bucket_elems);
/* A gradient reducer: the sum all-reduce of one f32 buffer, cut into fixed buckets of
 * bucket_elems (0 = 4 Mi), each started as soon as the caller has marked all of its elements final,
 * so the reduction of late layers' gradients overlaps the backward of earlier ones. Every rank must
 * mark the same ranges in the same order. MPI: nonblocking all-reduces, progressed whenever the
 * caller marks a range; NCCL: enqueued on the communicator's stream; a world of one: nothing. */
typedef struct lt_comm_reducer lt_comm_reducer;
/* buf (count f32) stays the caller's and must outlive the reducer. Errors: LT_ERR_INVALID_ARG,
 * LT_ERR_OOM. */
LT_API lt_status lt_comm_reducer_init(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket_elems,
                                      lt_comm_reducer **out);
/* Marks [offset, offset + n) final for this round (ranges of one round must not overlap) and
 * starts every bucket that is now complete, highest first. Mark ranges from the end of the buffer
 * towards its start (as a backward finishes layers): buckets then start in descending order on
 * every rank, also on ranks that mark fewer ranges, as collectives must. Errors:
 * LT_ERR_INVALID_ARG (range outside the buffer, marked twice), the transport's. */
LT_API lt_status lt_comm_reducer_ready(lt_ctx *ctx, lt_comm_reducer *r, int64_t offset, int64_t n);
/* Marks whatever is left final, waits for every bucket, and starts a new round: buf then holds the
 * sum over ranks (the same bits as lt_comm_allreduce_sum_bucketed with these buckets). */
LT_API lt_status lt_comm_reducer_finish(lt_ctx *ctx, lt_comm_reducer *r);
/* Buckets started before their round's finish, over all rounds (how much overlapped). */
LT_API int64_t lt_comm_reducer_early_buckets(const lt_comm_reducer *r);
LT_API void lt_comm_reducer_free(lt_ctx *ctx, lt_comm_reducer *r);

/* Copies root's `bytes` at buf to every rank's buf. Errors as above, LT_ERR_INVALID_ARG for a root
 * outside the world. */
LT_API lt_status lt_comm_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root);
LT_API lt_status lt_comm_barrier(lt_ctx *ctx, lt_comm *c);
/* Sends send_bytes at sendbuf to rank dst and receives recv_bytes into recvbuf from rank src in one
 * deadlock-free exchange (MPI_Sendrecv; ncclSend + ncclRecv in one group): the step of a ring.
 * dst == src == own rank copies. Buffers must not overlap. Errors as above, LT_ERR_INVALID_ARG for a
 * rank outside the world. */
LT_API lt_status lt_comm_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sendbuf, size_t send_bytes, int dst,
                                  void *recvbuf, size_t recv_bytes, int src);
/* One-sided halves of the above (blocking); a send must meet a recv of the same size. */
LT_API lt_status lt_comm_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst);
LT_API lt_status lt_comm_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src);

/* One piece of a grouped exchange: `bytes` at byte `offset` of the send (receive) buffer, going to
 * (coming from) rank `peer`. */
typedef struct lt_comm_piece {
    int peer;
    size_t offset, bytes;
} lt_comm_piece;

/* A grouped point-to-point exchange (an all-to-all whose chunks may land anywhere): every send
 * piece goes to its peer and every receive piece is filled from its peer; the k-th piece rank a
 * sends to rank b fills the k-th piece rank b receives from a, and the two must have the same size.
 * Peers may be the rank itself. Buffers on lt_comm_device(c); send and recv must not overlap.
 * MPI: nonblocking sends and receives, waited on; NCCL: ncclSend/ncclRecv in one group, ordered
 * after the backend's queued work and before what it queues next, without a host wait; self:
 * copies. Errors: LT_ERR_INVALID_ARG (a peer outside the world, a piece outside a buffer, sizes of
 * paired self pieces that differ), the transport's. Counts and order must agree across ranks or
 * the exchange hangs (as with any collective). */
LT_API lt_status lt_comm_exchange(lt_ctx *ctx, lt_comm *c, const void *send, size_t send_bytes, const lt_comm_piece *sp,
                                  int ns, void *recv, size_t recv_bytes, const lt_comm_piece *rp, int nr);
/* dst (b, a, w bytes) = src (a, b, w bytes) with its first two dimensions swapped, on the
 * communicator's device (host memcpy; NCCL: 2D copies on its stream, ordered like the exchange).
 * dst and src must not overlap. Errors: LT_ERR_INVALID_ARG (negative or overflowing sizes),
 * LT_ERR_CUDA. */
LT_API lt_status lt_comm_transpose(lt_ctx *ctx, lt_comm *c, void *dst, const void *src, int64_t a, int64_t b, size_t w);

#ifdef __cplusplus
}
#endif
#endif
