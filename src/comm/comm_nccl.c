/* The NCCL transport of lt_comm: CUDA device buffers on one non-blocking stream per communicator,
 * ordered with the backend's kernels on the calling context's stream (lt_backend.native_stream:
 * the legacy default stream until the backend makes the context its own) by events (the stream waits for
 * what the backend queued before a call; the backend waits for the call before what it queues
 * next), so a gradient bucket's all-reduce runs while the backward goes on. Blocking calls
 * synchronise before they return, the reducer's buckets when it finishes, the exchange,
 * transpose and queued all-reduce of context parallel never. NVLink multicast (NVLS) is kept off through
 * NCCL_NVLS_ENABLE=0 before the communicator exists, and nothing here creates multicast objects. Without NCCL in the build every entry point reports
 * LT_ERR_UNSUPPORTED. The unique id travels over MPI or through a rendezvous file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "longtune/alloc.h"
#include "longtune/log.h"

#if LT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "backend/backend.h"

/* The stream the backend's kernels of ctx run on, which a collective must follow and precede. */
static cudaStream_t backend_stream(lt_ctx *ctx) {
    const lt_backend *be = lt_backend_get(LT_DEVICE_CUDA);
    cudaStream_t s = be ? (cudaStream_t)be->native_stream(ctx) : NULL;
    return s ? s : cudaStreamLegacy;
}

typedef struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ev_in, ev_out; /* backend -> stream, stream -> backend */
    int device;
    float *scratch; /* STAGE bytes on the device: the barrier's float, staged host reductions */
} nccl_state;

/* Device staging area for host-buffer reductions (and the barrier). */
#define STAGE 4096

static lt_status nccl_fail(lt_ctx *ctx, lt_comm *c, ncclResult_t r, const char *what) {
    nccl_state *st = c ? c->nccl : NULL;
    const char *last = st && st->comm ? ncclGetLastError(st->comm) : NULL;
    return lt_error(ctx, LT_ERR_CUDA, "comm: %s failed: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
                    last ? last : "");
}

static lt_status cuda_fail(lt_ctx *ctx, cudaError_t e, const char *what) {
    (void)cudaGetLastError(); /* clear a sticky-free error so later calls start clean */
    return lt_error(ctx, LT_ERR_CUDA, "comm: %s failed: %s", what, cudaGetErrorString(e));
}

#define NCCL_TRY(call, what)                                       \
    do {                                                           \
        ncclResult_t r_ = (call);                                  \
        if (r_ != ncclSuccess) return nccl_fail(ctx, c, r_, what); \
    } while (0)
#define CUDA_TRY(call, what)                                    \
    do {                                                        \
        cudaError_t e_ = (call);                                \
        if (e_ != cudaSuccess) return cuda_fail(ctx, e_, what); \
    } while (0)

/* The communicator's stream waits for everything the backend queued so far. */
static lt_status enter(lt_ctx *ctx, nccl_state *st) {
    CUDA_TRY(cudaEventRecord(st->ev_in, backend_stream(ctx)), "cudaEventRecord (backend)");
    CUDA_TRY(cudaStreamWaitEvent(st->stream, st->ev_in, 0), "cudaStreamWaitEvent (comm)");
    return LT_OK;
}

/* What the backend queues from now on waits for everything queued on the stream. */
static lt_status leave(lt_ctx *ctx, nccl_state *st) {
    CUDA_TRY(cudaEventRecord(st->ev_out, st->stream), "cudaEventRecord (comm)");
    CUDA_TRY(cudaStreamWaitEvent(backend_stream(ctx), st->ev_out, 0), "cudaStreamWaitEvent (backend)");
    return LT_OK;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Rank 0 writes the id to a temporary and renames it over `path` (readers never see half a file);
 * the other ranks poll for it. The path must be fresh for each job, as a file:// rendezvous is. */
static lt_status rendezvous(lt_ctx *ctx, lt_comm *c, const lt_comm_options *o, ncclUniqueId *id) {
    char path[sizeof o->rendezvous];
    const char *env = getenv("LONGTUNE_RENDEZVOUS");
    snprintf(path, sizeof path, "%s", o->rendezvous[0] ? o->rendezvous : env ? env : "");
    if (!path[0])
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "comm: NCCL with %d ranks outside MPI needs a rendezvous file (LONGTUNE_RENDEZVOUS)", c->size);
    if (c->rank == 0) {
        char tmp[sizeof path + 32];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (!f) return lt_error(ctx, LT_ERR_IO, "comm: cannot write rendezvous file %s: %s", tmp, strerror(errno));
        int ok = fwrite(id, sizeof *id, 1, f) == 1;
        ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
        ok &= fclose(f) == 0;
        if (!ok || rename(tmp, path)) {
            remove(tmp);
            return lt_error(ctx, LT_ERR_IO, "comm: cannot write rendezvous file %s: %s", path, strerror(errno));
        }
        return LT_OK;
    }
    double limit = o->rendezvous_timeout_s > 0 ? o->rendezvous_timeout_s : 120, t0 = lt_time_now();
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return LT_OK;
        }
        if (lt_time_now() - t0 > limit)
            return lt_error(ctx, LT_ERR_IO, "comm: rank %d waited %.0f s for rendezvous file %s", c->rank, limit, path);
        sleep_ms(20);
    }
}

lt_status lt_comm_nccl_start(lt_ctx *ctx, lt_comm *c, const lt_comm_options *o) {
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    if (nvls && strcmp(nvls, "0")) LT_WARN("NCCL_NVLS_ENABLE=%s overridden to 0: NVLink multicast stays off", nvls);
    if (setenv("NCCL_NVLS_ENABLE", "0", 1))
        return lt_error(ctx, LT_ERR_IO, "comm: cannot set NCCL_NVLS_ENABLE=0: %s", strerror(errno));
    int ndev = 0;
    CUDA_TRY(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
    if (ndev < 1) return lt_error(ctx, LT_ERR_CUDA, "comm: NCCL needs a CUDA device and none is visible");
    int dev = o->set_device ? o->device : c->local_rank % ndev;
    if (dev < 0 || dev >= ndev) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: CUDA device %d of %d", dev, ndev);
    CUDA_TRY(cudaSetDevice(dev), "cudaSetDevice");
    nccl_state *st = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *st, "NCCL state");
    if (!st) return LT_ERR_OOM;
    st->device = dev;
    c->nccl = st;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (c->size > 1) {
        if (c->mpi_active) LT_TRY(lt_comm_mpi_broadcast(ctx, c, &id, sizeof id, 0));
        else LT_TRY(rendezvous(ctx, c, o, &id));
    }
    /* Non-blocking: ordered with the backend's stream only through enter/leave, so a
     * bucket's reduction (queued after its gradients, enter) overlaps the rest of the backward. */
    CUDA_TRY(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CUDA_TRY(cudaEventCreateWithFlags(&st->ev_in, cudaEventDisableTiming), "cudaEventCreate");
    CUDA_TRY(cudaEventCreateWithFlags(&st->ev_out, cudaEventDisableTiming), "cudaEventCreate");
    NCCL_TRY(ncclCommInitRank(&st->comm, c->size, id, c->rank), "ncclCommInitRank");
    st->scratch = lt_calloc(ctx, LT_DEVICE_CUDA, STAGE, "NCCL staging buffer");
    if (!st->scratch) return LT_ERR_OOM;
    return LT_OK;
}

void lt_comm_nccl_stop(lt_ctx *ctx, lt_comm *c) {
    nccl_state *st = c->nccl;
    if (!st) return;
    if (st->comm) ncclCommDestroy(st->comm);
    if (st->stream) cudaStreamDestroy(st->stream);
    if (st->ev_in) cudaEventDestroy(st->ev_in);
    if (st->ev_out) cudaEventDestroy(st->ev_out);
    if (st->scratch) lt_free(ctx, LT_DEVICE_CUDA, st->scratch, STAGE);
    lt_free(ctx, LT_DEVICE_CPU, st, sizeof *st);
    c->nccl = NULL;
}

static lt_status sync(lt_ctx *ctx, lt_comm *c, const char *what) {
    nccl_state *st = c->nccl;
    cudaError_t e = cudaStreamSynchronize(st->stream);
    if (e != cudaSuccess) return cuda_fail(ctx, e, what);
    return LT_OK;
}

static ncclDataType_t nccl_type(lt_comm_dtype dt) { return dt == LT_COMM_F64 ? ncclFloat64 : ncclFloat32; }

lt_status lt_comm_nccl_allreduce(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)count, nccl_type(dt), ncclSum, st->comm, st->stream), "ncclAllReduce");
    return sync(ctx, c, "all-reduce");
}

lt_status lt_comm_nccl_allreduce_queued(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)count, nccl_type(dt), ncclSum, st->comm, st->stream),
             "ncclAllReduce (queued)");
    return leave(ctx, st);
}

lt_status lt_comm_nccl_allreduce_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    for (int64_t i = 0; i < count; i += bucket) {
        int64_t n = count - i < bucket ? count - i : bucket;
        ncclResult_t r = ncclAllReduce(buf + i, buf + i, (size_t)n, ncclFloat32, ncclSum, st->comm, st->stream);
        if (r != ncclSuccess) {
            ncclGroupEnd();
            return nccl_fail(ctx, c, r, "ncclAllReduce (bucket)");
        }
    }
    NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
    return sync(ctx, c, "bucketed all-reduce");
}

lt_status lt_comm_nccl_istart(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, st->comm, st->stream), "ncclAllReduce");
    return LT_OK;
}

lt_status lt_comm_nccl_wait(lt_ctx *ctx, lt_comm *c) {
    LT_TRY(leave(ctx, c->nccl));
    return sync(ctx, c, "all-reduce buckets");
}

lt_status lt_comm_nccl_exchange(lt_ctx *ctx, lt_comm *c, const void *send, const lt_comm_piece *sp, int ns, void *recv,
                                const lt_comm_piece *rp, int nr) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    /* Point-to-point operations between one pair of ranks are matched in the order they are
     * issued, which is the pieces' order on both sides. */
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < nr && r == ncclSuccess; i++)
        if (rp[i].bytes)
            r = ncclRecv((char *)recv + rp[i].offset, rp[i].bytes, ncclUint8, rp[i].peer, st->comm, st->stream);
    for (int i = 0; i < ns && r == ncclSuccess; i++)
        if (sp[i].bytes)
            r = ncclSend((const char *)send + sp[i].offset, sp[i].bytes, ncclUint8, sp[i].peer, st->comm, st->stream);
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_fail(ctx, c, r, "ncclSend/ncclRecv (exchange)");
    if (e != ncclSuccess) return nccl_fail(ctx, c, e, "ncclGroupEnd (exchange)");
    return leave(ctx, st);
}

lt_status lt_comm_nccl_transpose(lt_ctx *ctx, lt_comm *c, void *dst, const void *src, int64_t a, int64_t b, size_t w) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    /* One 2D copy per index of the shorter dimension, so both pitches stay small. */
    if (b <= a) {
        for (int64_t j = 0; j < b; j++)
            CUDA_TRY(cudaMemcpy2DAsync((char *)dst + (size_t)(j * a) * w, w, (const char *)src + (size_t)j * w,
                                       (size_t)b * w, w, (size_t)a, cudaMemcpyDeviceToDevice, st->stream),
                     "cudaMemcpy2DAsync (transpose)");
    } else {
        for (int64_t i = 0; i < a; i++)
            CUDA_TRY(cudaMemcpy2DAsync((char *)dst + (size_t)i * w, (size_t)a * w,
                                       (const char *)src + (size_t)(i * b) * w, w, w, (size_t)b,
                                       cudaMemcpyDeviceToDevice, st->stream),
                     "cudaMemcpy2DAsync (transpose)");
    }
    return leave(ctx, st);
}

lt_status lt_comm_nccl_allreduce_host(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    size_t es = dt == LT_COMM_F64 ? 8 : 4, per = STAGE / es;
    char *p = buf;
    for (int64_t i = 0; i < count; i += (int64_t)per) {
        size_t n = (size_t)(count - i) < per ? (size_t)(count - i) : per;
        CUDA_TRY(cudaMemcpyAsync(st->scratch, p + (size_t)i * es, n * es, cudaMemcpyHostToDevice, st->stream),
                 "cudaMemcpyAsync (stage in)");
        NCCL_TRY(ncclAllReduce(st->scratch, st->scratch, n, nccl_type(dt), ncclSum, st->comm, st->stream),
                 "ncclAllReduce (staged)");
        CUDA_TRY(cudaMemcpyAsync(p + (size_t)i * es, st->scratch, n * es, cudaMemcpyDeviceToHost, st->stream),
                 "cudaMemcpyAsync (stage out)");
        LT_TRY(sync(ctx, c, "staged all-reduce"));
    }
    return LT_OK;
}

lt_status lt_comm_nccl_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclBroadcast(buf, buf, bytes, ncclUint8, root, st->comm, st->stream), "ncclBroadcast");
    return sync(ctx, c, "broadcast");
}

lt_status lt_comm_nccl_barrier(lt_ctx *ctx, lt_comm *c) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclAllReduce(st->scratch, st->scratch, 1, ncclFloat32, ncclSum, st->comm, st->stream), "barrier");
    return sync(ctx, c, "barrier");
}

lt_status lt_comm_nccl_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sb, size_t sn, int dst, void *rb, size_t rn,
                                int src) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    if (sn) r = ncclSend(sb, sn, ncclUint8, dst, st->comm, st->stream);
    if (r == ncclSuccess && rn) r = ncclRecv(rb, rn, ncclUint8, src, st->comm, st->stream);
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_fail(ctx, c, r, "ncclSend/ncclRecv");
    if (e != ncclSuccess) return nccl_fail(ctx, c, e, "ncclGroupEnd (send/recv)");
    return sync(ctx, c, "send/recv");
}

lt_status lt_comm_nccl_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclSend(buf, bytes, ncclUint8, dst, st->comm, st->stream), "ncclSend");
    return sync(ctx, c, "send");
}

lt_status lt_comm_nccl_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src) {
    nccl_state *st = c->nccl;
    LT_TRY(enter(ctx, st));
    NCCL_TRY(ncclRecv(buf, bytes, ncclUint8, src, st->comm, st->stream), "ncclRecv");
    return sync(ctx, c, "recv");
}

#else /* no NCCL in this build */

static lt_status no_nccl(lt_ctx *ctx) {
    return lt_error(ctx, LT_ERR_UNSUPPORTED, "comm: this build has no NCCL (needs CUDA and libnccl)");
}

lt_status lt_comm_nccl_start(lt_ctx *ctx, lt_comm *c, const lt_comm_options *o) {
    (void)c, (void)o;
    return no_nccl(ctx);
}
void lt_comm_nccl_stop(lt_ctx *ctx, lt_comm *c) { (void)ctx, (void)c; }
lt_status lt_comm_nccl_allreduce(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    (void)c, (void)buf, (void)count, (void)dt;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_allreduce_queued(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    (void)c, (void)buf, (void)count, (void)dt;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_allreduce_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket) {
    (void)c, (void)buf, (void)count, (void)bucket;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_barrier(lt_ctx *ctx, lt_comm *c) {
    (void)c;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_istart(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count) {
    (void)c, (void)buf, (void)count;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_wait(lt_ctx *ctx, lt_comm *c) {
    (void)c;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_allreduce_host(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dt) {
    (void)c, (void)buf, (void)count, (void)dt;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sb, size_t sn, int dst, void *rb, size_t rn,
                                int src) {
    (void)c, (void)sb, (void)sn, (void)dst, (void)rb, (void)rn, (void)src;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst) {
    (void)c, (void)buf, (void)bytes, (void)dst;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src) {
    (void)c, (void)buf, (void)bytes, (void)src;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_exchange(lt_ctx *ctx, lt_comm *c, const void *send, const lt_comm_piece *sp, int ns, void *recv,
                                const lt_comm_piece *rp, int nr) {
    (void)c, (void)send, (void)sp, (void)ns, (void)recv, (void)rp, (void)nr;
    return no_nccl(ctx);
}
lt_status lt_comm_nccl_transpose(lt_ctx *ctx, lt_comm *c, void *dst, const void *src, int64_t a, int64_t b, size_t w) {
    (void)c, (void)dst, (void)src, (void)a, (void)b, (void)w;
    return no_nccl(ctx);
}
#endif
