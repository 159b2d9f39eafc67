/* The communicator's front: world detection from the launcher's environment, argument checks, and
 * dispatch to the transport (comm_mpi.c, comm_nccl.c). A world of one rank is served here without
 * any library, so a plain `longtune train` never touches MPI. No transport code lives here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "longtune/alloc.h"

static int env_int(const char *name, int *out) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > (1 << 24)) return 0;
    *out = (int)v;
    return 1;
}

int lt_comm_env_world(int *rank, int *size, int *local_rank) {
    int r = 0, n = 1, lr = -1;
    int found =
        (env_int("OMPI_COMM_WORLD_RANK", &r) || env_int("PMIX_RANK", &r)) && env_int("OMPI_COMM_WORLD_SIZE", &n);
    if (found) env_int("OMPI_COMM_WORLD_LOCAL_RANK", &lr);
    if (!found) {
        r = 0, n = 1;
        found = env_int("PMI_RANK", &r) && env_int("PMI_SIZE", &n);
        if (found) env_int("MPI_LOCALRANKID", &lr);
    }
    if (!found || n < 1 || r >= n) r = 0, n = 1, found = 0;
    if (rank) *rank = r;
    if (size) *size = n;
    if (local_rank) *local_rank = lr >= 0 ? lr : r;
    return found;
}

const char *lt_comm_backend_name(lt_comm_backend b) {
    switch (b) {
    case LT_COMM_AUTO: return "auto";
    case LT_COMM_SELF: return "self";
    case LT_COMM_MPI: return "mpi";
    case LT_COMM_NCCL: return "nccl";
    }
    return "unknown";
}

lt_status lt_comm_init(lt_ctx *ctx, const lt_comm_options *opt, lt_comm **out) {
    *out = NULL;
    lt_comm_options o;
    if (opt) o = *opt;
    else memset(&o, 0, sizeof o);
    int er = 0, en = 1, elr = 0;
    int launched = lt_comm_env_world(&er, &en, &elr);
    lt_comm_backend b = o.backend;
    if (b == LT_COMM_AUTO) {
        if (launched && en > 1) {
            if (!LT_HAVE_MPI)
                return lt_error(ctx, LT_ERR_UNSUPPORTED,
                                "comm: launched by an MPI launcher with %d ranks, but this build has no MPI "
                                "(install libopenmpi-dev and rebuild)",
                                en);
            b = LT_COMM_MPI;
        } else {
            b = LT_COMM_SELF;
        }
    }
    if (b == LT_COMM_MPI && !LT_HAVE_MPI)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "comm: this build has no MPI (install libopenmpi-dev and rebuild)");
    if (b == LT_COMM_NCCL && !LT_HAVE_NCCL)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "comm: this build has no NCCL (needs CUDA and libnccl)");
    if (b != LT_COMM_SELF && b != LT_COMM_MPI && b != LT_COMM_NCCL)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: unknown backend %d", (int)b);
    lt_comm *c = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *c, "communicator");
    if (!c) return LT_ERR_OOM;
    c->backend = b;
    c->rank = 0, c->size = 1, c->local_rank = 0;
    lt_status s = LT_OK;
    if (b == LT_COMM_MPI) {
        s = lt_comm_mpi_start(ctx, c);
    } else if (b == LT_COMM_NCCL) {
        /* The unique id travels over MPI when an MPI launcher started us; otherwise the options
         * (or RANK/WORLD_SIZE) give the world and a rendezvous file carries the id. */
        if (launched && LT_HAVE_MPI) {
            s = lt_comm_mpi_start(ctx, c);
        } else {
            int r = o.rank, n = o.size, lr = -1;
            if (!r && !n) {
                if (!env_int("WORLD_SIZE", &n)) n = 1;
                if (!env_int("RANK", &r)) r = 0;
            }
            if (!env_int("LOCAL_RANK", &lr)) lr = r;
            if (n < 1 || r < 0 || r >= n) {
                lt_free(ctx, LT_DEVICE_CPU, c, sizeof *c);
                return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: rank %d outside a world of %d", r, n);
            }
            c->rank = r, c->size = n, c->local_rank = lr;
        }
        if (s == LT_OK) s = lt_comm_nccl_start(ctx, c, &o);
    }
    if (s != LT_OK) {
        lt_comm_free(ctx, c);
        return s;
    }
    *out = c;
    return LT_OK;
}

void lt_comm_free(lt_ctx *ctx, lt_comm *c) {
    if (!c) return;
    if (c->nccl) lt_comm_nccl_stop(ctx, c);
    if (c->mpi_active) lt_comm_mpi_stop(c);
    lt_free(ctx, LT_DEVICE_CPU, c, sizeof *c);
}

void lt_comm_abort(lt_comm *c, int code) {
    if (c && c->mpi_active) lt_comm_mpi_abort(code);
}

int lt_comm_rank(const lt_comm *c) { return c ? c->rank : 0; }
int lt_comm_size(const lt_comm *c) { return c ? c->size : 1; }
lt_comm_backend lt_comm_get_backend(const lt_comm *c) { return c ? c->backend : LT_COMM_SELF; }
lt_device lt_comm_device(const lt_comm *c) { return c && c->backend == LT_COMM_NCCL ? LT_DEVICE_CUDA : LT_DEVICE_CPU; }

static lt_status check_peer(lt_ctx *ctx, const lt_comm *c, int peer, const char *what) {
    int n = lt_comm_size(c);
    if (peer < 0 || peer >= n)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: %s rank %d outside a world of %d", what, peer, n);
    return LT_OK;
}

lt_status lt_comm_allreduce_sum(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dtype) {
    if (count < 0 || (unsigned)dtype >= LT_COMM_DTYPE_COUNT_ || (count > 0 && !buf))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: all-reduce of %lld elements of dtype %d", (long long)count,
                        (int)dtype);
    if (!c || c->size == 1 || count == 0) {
        /* NCCL with one rank still runs the collective: that is the path the device test checks. */
        if (!c || c->backend != LT_COMM_NCCL || count == 0) return LT_OK;
    }
    if (c->backend == LT_COMM_NCCL) return lt_comm_nccl_allreduce(ctx, c, buf, count, dtype);
    return lt_comm_mpi_allreduce(ctx, c, buf, count, dtype);
}

lt_status lt_comm_allreduce_sum_host(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dtype) {
    if (c && c->backend == LT_COMM_NCCL) {
        if (count < 0 || (unsigned)dtype >= LT_COMM_DTYPE_COUNT_ || (count > 0 && !buf))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: all-reduce of %lld elements of dtype %d", (long long)count,
                            (int)dtype);
        return count ? lt_comm_nccl_allreduce_host(ctx, c, buf, count, dtype) : LT_OK;
    }
    return lt_comm_allreduce_sum(ctx, c, buf, count, dtype);
}

lt_status lt_comm_allreduce_sum_queued(lt_ctx *ctx, lt_comm *c, void *buf, int64_t count, lt_comm_dtype dtype) {
    if (c && c->backend == LT_COMM_NCCL) {
        if (count < 0 || (unsigned)dtype >= LT_COMM_DTYPE_COUNT_ || (count > 0 && !buf))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: all-reduce of %lld elements of dtype %d", (long long)count,
                            (int)dtype);
        return count ? lt_comm_nccl_allreduce_queued(ctx, c, buf, count, dtype) : LT_OK;
    }
    return lt_comm_allreduce_sum(ctx, c, buf, count, dtype);
}

lt_status lt_comm_allreduce_sum_bucketed(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket_elems) {
    if (count < 0 || bucket_elems < 0 || (count > 0 && !buf))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: bucketed all-reduce of %lld elements in buckets of %lld",
                        (long long)count, (long long)bucket_elems);
    if (bucket_elems == 0) bucket_elems = (int64_t)4 << 20;
    if (!c || count == 0 || (c->size == 1 && c->backend != LT_COMM_NCCL)) return LT_OK;
    if (c->backend == LT_COMM_NCCL) return lt_comm_nccl_allreduce_bucketed(ctx, c, buf, count, bucket_elems);
    return lt_comm_mpi_allreduce_bucketed(ctx, c, buf, count, bucket_elems);
}

lt_status lt_comm_broadcast(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int root) {
    LT_TRY(check_peer(ctx, c, root, "broadcast root"));
    if (bytes && !buf) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: broadcast of %zu bytes from NULL", bytes);
    if (!c || bytes == 0 || (c->size == 1 && c->backend != LT_COMM_NCCL)) return LT_OK;
    if (c->backend == LT_COMM_NCCL) return lt_comm_nccl_broadcast(ctx, c, buf, bytes, root);
    return lt_comm_mpi_broadcast(ctx, c, buf, bytes, root);
}

lt_status lt_comm_barrier(lt_ctx *ctx, lt_comm *c) {
    if (!c || (c->size == 1 && c->backend != LT_COMM_NCCL)) return LT_OK;
    if (c->backend == LT_COMM_NCCL) return lt_comm_nccl_barrier(ctx, c);
    return lt_comm_mpi_barrier(ctx, c);
}

lt_status lt_comm_sendrecv(lt_ctx *ctx, lt_comm *c, const void *sendbuf, size_t send_bytes, int dst, void *recvbuf,
                           size_t recv_bytes, int src) {
    LT_TRY(check_peer(ctx, c, dst, "send to"));
    LT_TRY(check_peer(ctx, c, src, "receive from"));
    if ((send_bytes && !sendbuf) || (recv_bytes && !recvbuf))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: send/receive with a NULL buffer");
    if (!c || c->backend == LT_COMM_SELF) {
        if (send_bytes != recv_bytes)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: sending %zu bytes to itself but receiving %zu", send_bytes,
                            recv_bytes);
        if (send_bytes) memcpy(recvbuf, sendbuf, send_bytes);
        return LT_OK;
    }
    if (c->backend == LT_COMM_NCCL)
        return lt_comm_nccl_sendrecv(ctx, c, sendbuf, send_bytes, dst, recvbuf, recv_bytes, src);
    return lt_comm_mpi_sendrecv(ctx, c, sendbuf, send_bytes, dst, recvbuf, recv_bytes, src);
}

lt_status lt_comm_send(lt_ctx *ctx, lt_comm *c, const void *buf, size_t bytes, int dst) {
    LT_TRY(check_peer(ctx, c, dst, "send to"));
    if (bytes && !buf) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: send from a NULL buffer");
    if (!c || c->backend == LT_COMM_SELF)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: a blocking send to itself would never complete (use sendrecv)");
    if (c->backend == LT_COMM_NCCL) return lt_comm_nccl_send(ctx, c, buf, bytes, dst);
    return lt_comm_mpi_send(ctx, c, buf, bytes, dst);
}

lt_status lt_comm_recv(lt_ctx *ctx, lt_comm *c, void *buf, size_t bytes, int src) {
    LT_TRY(check_peer(ctx, c, src, "receive from"));
    if (bytes && !buf) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: receive into a NULL buffer");
    if (!c || c->backend == LT_COMM_SELF)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "comm: a blocking receive from itself would never complete (use sendrecv)");
    if (c->backend == LT_COMM_NCCL) return lt_comm_nccl_recv(ctx, c, buf, bytes, src);
    return lt_comm_mpi_recv(ctx, c, buf, bytes, src);
}

static lt_status check_pieces(lt_ctx *ctx, const lt_comm *c, const lt_comm_piece *pc, int n, size_t total,
                              const void *buf, const char *what) {
    if (n < 0 || (n > 0 && !pc)) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: exchange with %d %s pieces", n, what);
    for (int i = 0; i < n; i++) {
        LT_TRY(check_peer(ctx, c, pc[i].peer, what));
        if (pc[i].offset > total || pc[i].bytes > total - pc[i].offset || (pc[i].bytes && !buf))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: %s piece %d [%zu, +%zu) outside a buffer of %zu bytes",
                            what, i, pc[i].offset, pc[i].bytes, total);
    }
    return LT_OK;
}

lt_status lt_comm_exchange(lt_ctx *ctx, lt_comm *c, const void *send, size_t send_bytes, const lt_comm_piece *sp,
                           int ns, void *recv, size_t recv_bytes, const lt_comm_piece *rp, int nr) {
    LT_TRY(check_pieces(ctx, c, sp, ns, send_bytes, send, "send"));
    LT_TRY(check_pieces(ctx, c, rp, nr, recv_bytes, recv, "receive"));
    if (c && c->backend == LT_COMM_NCCL) return lt_comm_nccl_exchange(ctx, c, send, sp, ns, recv, rp, nr);
    if (c && c->backend == LT_COMM_MPI && c->size > 1) return lt_comm_mpi_exchange(ctx, c, send, sp, ns, recv, rp, nr);
    /* A world of one: the k-th piece sent fills the k-th piece received. */
    if (ns != nr) return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: %d pieces sent to itself, %d received", ns, nr);
    for (int i = 0; i < ns; i++) {
        if (sp[i].bytes != rp[i].bytes)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: piece %d of %zu bytes sent to itself lands in %zu", i,
                            sp[i].bytes, rp[i].bytes);
        if (sp[i].bytes) memcpy((char *)recv + rp[i].offset, (const char *)send + sp[i].offset, sp[i].bytes);
    }
    return LT_OK;
}

lt_status lt_comm_transpose(lt_ctx *ctx, lt_comm *c, void *dst, const void *src, int64_t a, int64_t b, size_t w) {
    if (a < 0 || b < 0 || (a && b > INT64_MAX / a) || (w && (uint64_t)(a * b) > SIZE_MAX / w) ||
        (a && b && w && (!dst || !src)))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: transpose of (%lld, %lld) pieces of %zu bytes", (long long)a,
                        (long long)b, w);
    if (!a || !b || !w) return LT_OK;
    if (c && c->backend == LT_COMM_NCCL) return lt_comm_nccl_transpose(ctx, c, dst, src, a, b, w);
    for (int64_t i = 0; i < a; i++)
        for (int64_t j = 0; j < b; j++)
            memcpy((char *)dst + (size_t)(j * a + i) * w, (const char *)src + (size_t)(i * b + j) * w, w);
    return LT_OK;
}

/* ---- the gradient reducer ------------------------------------------------------------------ */

struct lt_comm_reducer {
    lt_comm *c;
    float *buf;
    int64_t count, bucket, nb;
    int64_t *ready;   /* (nb) elements marked final this round */
    uint8_t *started; /* (nb) */
    void *reqs;       /* (nb) MPI requests, in start order */
    int nreq;
    int64_t early; /* buckets started before a finish, all rounds */
    size_t bytes;  /* of the one block holding ready, started and reqs */
};

static int transported(const lt_comm *c) { return c && (c->size > 1 || c->backend == LT_COMM_NCCL); }

lt_status lt_comm_reducer_init(lt_ctx *ctx, lt_comm *c, float *buf, int64_t count, int64_t bucket_elems,
                               lt_comm_reducer **out) {
    *out = NULL;
    if (count < 1 || bucket_elems < 0 || !buf)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: reducer over %lld elements in buckets of %lld",
                        (long long)count, (long long)bucket_elems);
    lt_comm_reducer *r = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *r, "gradient reducer");
    if (!r) return LT_ERR_OOM;
    r->c = c, r->buf = buf, r->count = count;
    r->bucket = bucket_elems ? bucket_elems : (int64_t)4 << 20;
    r->nb = (count + r->bucket - 1) / r->bucket;
    size_t rq = c && c->backend == LT_COMM_MPI ? lt_comm_mpi_request_size() : 1;
    r->bytes = (size_t)r->nb * (sizeof(int64_t) + 1 + rq) + sizeof(int64_t);
    uint8_t *blk = lt_calloc(ctx, LT_DEVICE_CPU, r->bytes, "gradient reducer buckets");
    if (!blk) {
        lt_free(ctx, LT_DEVICE_CPU, r, sizeof *r);
        return LT_ERR_OOM;
    }
    r->ready = (int64_t *)blk;
    r->reqs = blk + (size_t)r->nb * sizeof(int64_t); /* 8-aligned: MPI requests are handles or pointers */
    r->started = (uint8_t *)r->reqs + (size_t)r->nb * rq;
    *out = r;
    return LT_OK;
}

static int64_t bucket_size(const lt_comm_reducer *r, int64_t b) {
    return r->count - b * r->bucket < r->bucket ? r->count - b * r->bucket : r->bucket;
}

static lt_status start_bucket(lt_ctx *ctx, lt_comm_reducer *r, int64_t b) {
    int64_t off = b * r->bucket, n = r->count - off < r->bucket ? r->count - off : r->bucket;
    r->started[b] = 1;
    if (!transported(r->c)) return LT_OK;
    if (r->c->backend == LT_COMM_NCCL) return lt_comm_nccl_istart(ctx, r->c, r->buf + off, n);
    size_t rq = lt_comm_mpi_request_size();
    LT_TRY(lt_comm_mpi_istart(ctx, r->c, r->buf + off, n, (uint8_t *)r->reqs + (size_t)r->nreq * rq));
    r->nreq++;
    return LT_OK;
}

lt_status lt_comm_reducer_ready(lt_ctx *ctx, lt_comm_reducer *r, int64_t offset, int64_t n) {
    if (offset < 0 || n < 0 || offset > r->count - n)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: reducer range [%lld, +%lld) outside %lld elements",
                        (long long)offset, (long long)n, (long long)r->count);
    if (n == 0) return LT_OK;
    for (int64_t i = offset; i < offset + n;) {
        int64_t b = i / r->bucket, end = (b + 1) * r->bucket < offset + n ? (b + 1) * r->bucket : offset + n;
        r->ready[b] += end - i;
        if (r->ready[b] > bucket_size(r, b))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "comm: reducer bucket %lld marked ready twice", (long long)b);
        i = end;
    }
    /* Highest bucket first, as finish does: every rank then issues the same sequence of
     * collectives whether or not it marked ranges (a data-parallel rank without rows marks none). */
    for (int64_t b = (offset + n - 1) / r->bucket; b >= offset / r->bucket; b--)
        if (r->ready[b] == bucket_size(r, b) && !r->started[b]) {
            LT_TRY(start_bucket(ctx, r, b));
            r->early++;
        }
    if (transported(r->c) && r->c->backend == LT_COMM_MPI) LT_TRY(lt_comm_mpi_progress(ctx, r->c, r->reqs, r->nreq));
    return LT_OK;
}

lt_status lt_comm_reducer_finish(lt_ctx *ctx, lt_comm_reducer *r) {
    lt_status s = LT_OK;
    for (int64_t b = r->nb - 1; b >= 0 && s == LT_OK; b--)
        if (!r->started[b]) s = start_bucket(ctx, r, b);
    if (transported(r->c)) {
        lt_status w = r->c->backend == LT_COMM_NCCL ? lt_comm_nccl_wait(ctx, r->c)
                                                    : lt_comm_mpi_waitall(ctx, r->c, r->reqs, r->nreq);
        if (s == LT_OK) s = w;
    }
    memset(r->ready, 0, (size_t)r->nb * sizeof(int64_t));
    memset(r->started, 0, (size_t)r->nb);
    r->nreq = 0;
    return s;
}

int64_t lt_comm_reducer_early_buckets(const lt_comm_reducer *r) { return r ? r->early : 0; }

void lt_comm_reducer_free(lt_ctx *ctx, lt_comm_reducer *r) {
    if (!r) return;
    lt_free(ctx, LT_DEVICE_CPU, r->ready, r->bytes);
    lt_free(ctx, LT_DEVICE_CPU, r, sizeof *r);
}
