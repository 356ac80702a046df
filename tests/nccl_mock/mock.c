/* The stand-ins of cuda_runtime_api.h and nccl.h (this folder), for
 * test_nccl_mock: see those headers. A communicator is a star of unix stream
 * sockets to rank 0 (one socket for 2 ranks); the unique id names the
 * abstract socket the id's maker listens on (so rank 0 must be in the
 * process that made the id, as transport/cuda/nccl.c's creator and the
 * reduce's rank 0 are). Sends and receives move their bytes at once
 * (blocking I/O) and report ncclInProgress once, so the caller's settling is
 * exercised; an all-gather moves its bytes by non-blocking I/O while it is
 * polled (so a stalled peer leaves it in progress, as a real one would hang);
 * a peer gone mid-message is ncclRemoteError. Also the NCCL reduce's sum
 * kernel, on the host. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "nccl.h"
#include "transport/rank_sum.h"
#include "transport/reduce_nccl.h"

/* ---- CUDA --------------------------------------------------------------------- */
struct mock_stream {
    int unused;
};
struct mock_event {
    int unused;
};
cudaError_t cudaSetDevice(int device)
{
    return device == 0 ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = calloc(1, bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
/* Streams and events are zeroed blocks, made and freed alike. */
#define MOCK_HANDLE_API(T, CREATE, DESTROY)                                                        \
    cudaError_t CREATE(T *h, unsigned flags)                                                       \
    {                                                                                              \
        (void)flags;                                                                               \
        *h = calloc(1, sizeof **h);                                                                \
        return *h ? cudaSuccess : cudaErrorMemoryAllocation;                                       \
    }                                                                                              \
    cudaError_t DESTROY(T h)                                                                       \
    {                                                                                              \
        free(h);                                                                                   \
        return cudaSuccess;                                                                        \
    }
MOCK_HANDLE_API(cudaStream_t, cudaStreamCreateWithFlags, cudaStreamDestroy)
MOCK_HANDLE_API(cudaEvent_t, cudaEventCreateWithFlags, cudaEventDestroy)
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)s, (void)flags;
    return e ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)s;
    return e ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    return e ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s)
{
    (void)k, (void)s;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    (void)p;
    a->type = cudaMemoryTypeHost;
    a->device = -1;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "mock CUDA error";
}

/* The NCCL reduce's sum kernel (transport/cuda/rank_sum.cu) as the stream
 * would run it: at once, the same formula (transport/rank_sum.h). */
int mmp_rank_sum_f64_launch(double *out, const double *gathered, size_t n, size_t stride, int ranks,
                            void *stream)
{
    (void)stream;
    if (n > 0 && (ranks < 1 || stride < n || !out || !gathered)) {
        return (int)cudaErrorMemoryAllocation;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = mmp_rank_sum_f64(gathered, stride, ranks, i);
    }
    return (int)cudaSuccess;
}

/* ---- NCCL --------------------------------------------------------------------- */
#define MOCK_MAX_RANKS 8
struct mock_comm {
    int rank, nranks;
    int fd;                  /* a 2-rank communicator's peer (send, recv); -1 otherwise */
    int lfd;                 /* rank 0: the id's listening socket (made[]'s, not closed here) */
    int fds[MOCK_MAX_RANKS]; /* rank 0: fds[k] to rank k; rank k > 0: fds[0] to rank 0 */
    int joined;              /* rank 0: ranks connected */
    ncclResult_t state;      /* ncclInProgress while init or the last call settles */
    int init_done;
    struct sockaddr_un sa;
    socklen_t salen;
    /* The all-gather in progress (ag = 1): phase 0 every rank's bytes to
     * rank 0, phase 1 rank 0's whole buffer back to every rank; moved by
     * non-blocking I/O at each ncclCommGetAsyncError. */
    int finalizing; /* ncclCommFinalize was called */
    int ag, ag_phase;
    const char *ag_in;
    char *ag_out;
    size_t ag_bytes;                /* per rank */
    size_t ag_done[MOCK_MAX_RANKS]; /* bytes moved on each connection this phase */
};
static char last_error[256];
/* Test hooks: a process that sets one dies inside its next all-gather
 * (SIGKILL), or never moves a byte of it (a rank hung in NCCL), or has its
 * ncclCommFinalize never finish (what a real one does while a peer that
 * vanished still owes it a transfer). */
int mock_nccl_die_in_collective, mock_nccl_stall_collectives, mock_nccl_stall_finalize;

static socklen_t name_addr(struct sockaddr_un *sa, const char *name)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    size_t n = strnlen(name, sizeof sa->sun_path - 2);
    memcpy(sa->sun_path + 1, name, n); /* abstract: a leading NUL */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* The listening sockets of ids made in this process, by name. */
static struct {
    char name[64];
    int fd;
} made[64];

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static int count;
    memset(id, 0, sizeof *id);
    int k = count++;
    if (k >= 64) {
        return ncclInternalError;
    }
    snprintf(made[k].name, sizeof made[k].name, "mmp-nccl-mock-%d-%d-%d", (int)getpid(), k, rand());
    struct sockaddr_un sa;
    socklen_t len = name_addr(&sa, made[k].name);
    made[k].fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (made[k].fd < 0 || bind(made[k].fd, (struct sockaddr *)&sa, len) != 0 ||
        listen(made[k].fd, MOCK_MAX_RANKS) != 0) {
        return ncclSystemError;
    }
    memcpy(id->internal, made[k].name, strlen(made[k].name));
    return ncclSuccess;
}

static void make_blocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int big = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
}

/* Rank 0 accepts the others (each says its rank first); rank k connects. */
static void progress_init(ncclComm_t c)
{
    if (c->rank == 0) {
        int fd;
        while (c->joined < c->nranks - 1 && (fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
            make_blocking(fd);
            int k = -1;
            if (recv(fd, &k, sizeof k, MSG_WAITALL) != (ssize_t)sizeof k || k < 1 ||
                k >= c->nranks || c->fds[k] >= 0) {
                close(fd);
                continue;
            }
            c->fds[k] = fd;
            c->joined++;
        }
        if (c->joined < c->nranks - 1) {
            return;
        }
    } else {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&c->sa, c->salen) != 0) {
            if (fd >= 0) {
                close(fd);
            }
            return;
        }
        make_blocking(fd);
        if (send(fd, &c->rank, sizeof c->rank, MSG_NOSIGNAL) != (ssize_t)sizeof c->rank) {
            close(fd);
            return;
        }
        c->fds[0] = fd;
    }
    c->fd = c->nranks == 2 ? c->fds[1 - c->rank] : -1;
    c->init_done = 1;
    c->state = ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    if (nranks < 1 || nranks > MOCK_MAX_RANKS || rank < 0 || rank >= nranks || !config ||
        config->blocking != 0) {
        return ncclInvalidArgument;
    }
    ncclComm_t c = calloc(1, sizeof *c);
    c->rank = rank;
    c->nranks = nranks;
    c->fd = c->lfd = -1;
    for (int k = 0; k < MOCK_MAX_RANKS; k++) {
        c->fds[k] = -1;
    }
    char name[NCCL_UNIQUE_ID_BYTES + 1] = {0};
    memcpy(name, id.internal, NCCL_UNIQUE_ID_BYTES);
    if (rank == 0) {
        for (int k = 0; k < 64 && c->lfd < 0; k++) {
            c->lfd = strcmp(made[k].name, name) == 0 ? made[k].fd : -1;
        }
        if (c->lfd < 0) {
            snprintf(last_error, sizeof last_error, "mock: rank 0 of an id made elsewhere");
            free(c);
            return ncclInvalidUsage;
        }
    }
    c->salen = name_addr(&c->sa, name);
    c->state = ncclInProgress;
    *comm = c;
    return ncclInProgress;
}

static void ag_gone(ncclComm_t c, int k, ssize_t got)
{
    snprintf(last_error, sizeof last_error, "mock: all-gather: connection to rank %d ended (%s)", k,
             got < 0 ? strerror(errno) : "end of stream");
    c->state = ncclRemoteError;
    c->ag = 0;
}

/* Moves what it can of want bytes at p over fd without blocking; 0 done,
 * 1 more to come, -1 the peer is gone. */
static int ag_move(int fd, char *p, size_t want, size_t *done, int out, ssize_t *got)
{
    while (*done < want) {
        ssize_t k = out ? send(fd, p + *done, want - *done, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(fd, p + *done, want - *done, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 1;
        }
        if (k <= 0) {
            *got = k;
            return -1;
        }
        *done += (size_t)k;
    }
    return 0;
}

static void progress_ag(ncclComm_t c)
{
    size_t b = c->ag_bytes, all = (size_t)c->nranks * b;
    int pending = 0;
    ssize_t got = 0;
    for (int k = c->rank == 0 ? 1 : 0; k < (c->rank == 0 ? c->nranks : 1); k++) {
        int st;
        if (c->ag_phase == 0) {
            st = c->rank == 0
                     ? ag_move(c->fds[k], c->ag_out + (size_t)k * b, b, &c->ag_done[k], 0, &got)
                     : ag_move(c->fds[0], (char *)c->ag_in, b, &c->ag_done[0], 1, &got);
        } else {
            st = ag_move(c->fds[k], c->ag_out, all, &c->ag_done[k], c->rank == 0, &got);
        }
        if (st < 0) {
            ag_gone(c, k, got);
            return;
        }
        pending |= st;
    }
    if (pending) {
        return;
    }
    if (c->ag_phase == 0) {
        c->ag_phase = 1;
        memset(c->ag_done, 0, sizeof c->ag_done);
        progress_ag(c);
        return;
    }
    c->ag = 0;
    c->state = ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s)
{
    (void)s;
    size_t size = t == ncclDouble ? sizeof(double) : t == ncclUint8 ? 1 : 0;
    if (size == 0) {
        return ncclInvalidArgument;
    }
    if (!c->init_done || c->state != ncclSuccess || c->ag) {
        return ncclInvalidUsage;
    }
    if (mock_nccl_die_in_collective) {
        raise(SIGKILL);
    }
    c->ag = 1;
    c->ag_phase = 0;
    c->ag_in = sendbuff;
    c->ag_out = recvbuff;
    c->ag_bytes = sendcount * size;
    memset(c->ag_done, 0, sizeof c->ag_done);
    memmove(c->ag_out + (size_t)c->rank * c->ag_bytes, sendbuff, c->ag_bytes);
    c->state = ncclInProgress;
    if (c->nranks == 1) {
        c->ag = 0; /* nothing to move; settles at the first poll */
    } else if (!mock_nccl_stall_collectives) {
        progress_ag(c);
    }
    return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state)
{
    if (!c->init_done && c->state == ncclInProgress) {
        progress_init(c);
        *state = c->state;
        return ncclSuccess;
    }
    if (c->finalizing && mock_nccl_stall_finalize) {
        *state = ncclInProgress;
        return ncclSuccess;
    }
    if (c->ag) {
        if (!mock_nccl_stall_collectives) {
            progress_ag(c);
        }
        *state = c->state;
        return ncclSuccess;
    }
    *state = c->state;
    if (c->state == ncclInProgress) {
        c->state = ncclSuccess; /* the call settles at its first poll */
    }
    return ncclSuccess;
}

static ncclResult_t io(ncclComm_t c, void *buf, size_t n, int out)
{
    if (!c->init_done || c->state != ncclSuccess || c->fd < 0) {
        return ncclInvalidUsage;
    }
    char *p = buf;
    while (n > 0) {
        ssize_t k = out ? send(c->fd, p, n, MSG_NOSIGNAL) : recv(c->fd, p, n, 0);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            snprintf(last_error, sizeof last_error, "mock: peer gone (%s)",
                     k < 0 ? strerror(errno) : "end of stream");
            c->state = ncclRemoteError;
            return ncclInProgress; /* the error shows when the call settles */
        }
        p += k;
        n -= (size_t)k;
    }
    c->state = ncclInProgress;
    return ncclInProgress;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s)
{
    (void)s;
    if (t != ncclUint8 || peer != 1 - c->rank) {
        return ncclInvalidArgument;
    }
    return io(c, (void *)buf, count, 1);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s)
{
    (void)s;
    if (t != ncclUint8 || peer != 1 - c->rank) {
        return ncclInvalidArgument;
    }
    return io(c, buf, count, 0);
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    c->finalizing = 1;
    c->state = ncclInProgress;
    return ncclInProgress;
}

int mock_nccl_aborts, mock_nccl_destroys;

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    mock_nccl_destroys++;
    for (int k = 0; k < MOCK_MAX_RANKS; k++) {
        if (c->fds[k] >= 0) {
            close(c->fds[k]);
        }
    }
    free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    mock_nccl_aborts++;
    mock_nccl_destroys--;
    return ncclCommDestroy(c);
}

const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess       ? "no error"
           : r == ncclRemoteError ? "remote process exited or there was a network error"
                                  : "mock NCCL error";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}
