/* The stand-ins of cuda_runtime_api.h and nccl.h (this folder), for
 * test_nccl_mock: see those headers. A communicator is one unix stream
 * socket between the two ranks; the unique id names the abstract socket the
 * id's maker listens on (so rank 0 must be in the process that made the id,
 * as transport/cuda/nccl.c's creator is). Sends and receives move their
 * bytes at once (blocking I/O) and report ncclInProgress once, so the
 * caller's settling is exercised; a peer gone mid-message is ncclRemoteError. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "nccl.h"

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

/* ---- NCCL --------------------------------------------------------------------- */
struct mock_comm {
    int rank, fd, lfd;
    ncclResult_t state; /* ncclInProgress while init or the last call settles */
    int init_done;
    struct sockaddr_un sa;
    socklen_t salen;
};
static char last_error[256];

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
        listen(made[k].fd, 1) != 0) {
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

static void progress_init(ncclComm_t c)
{
    if (c->rank == 0) {
        int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            c->fd = fd;
        }
    } else {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&c->sa, c->salen) == 0) {
            c->fd = fd;
        } else if (fd >= 0) {
            close(fd);
        }
    }
    if (c->fd >= 0) {
        make_blocking(c->fd);
        c->init_done = 1;
        c->state = ncclSuccess;
    }
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    if (nranks != 2 || rank < 0 || rank > 1 || !config || config->blocking != 0) {
        return ncclInvalidArgument;
    }
    ncclComm_t c = calloc(1, sizeof *c);
    c->rank = rank;
    c->fd = c->lfd = -1;
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

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state)
{
    if (!c->init_done && c->state == ncclInProgress) {
        progress_init(c);
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
    if (!c->init_done || c->state != ncclSuccess) {
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
    c->state = ncclInProgress;
    return ncclInProgress;
}

int mock_nccl_aborts, mock_nccl_destroys;

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    mock_nccl_destroys++;
    if (c->fd >= 0) {
        close(c->fd);
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
