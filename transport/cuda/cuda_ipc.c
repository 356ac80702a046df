/* The `cuda_ipc` data channel: a ring of device-memory slots between two GPU
 * processes on one host, with the slot/credit protocol of transport/shm.c and
 * CUDA interprocess events, so neither end's host waits for the other's GPU.
 *
 * UNVERIFIED ON A GPU: this file was written and compiled on a machine with
 * no CUDA device; the cuda_ipc cases of tests/test_transport.c and
 * bench/bench_cuda_ipc.c are the checks to run before trusting it (commands
 * in test_transport.c's header).
 *
 * Resources, all made once per channel, none per message:
 *   device     the creator cudaMallocs `slots` slots of slot_stride bytes
 *              (slot_bytes rounded up to 256) and exports them with
 *              cudaIpcGetMemHandle; the connector maps them once with
 *              cudaIpcOpenMemHandle (lazy peer access, so the two ends may sit
 *              on different GPUs of the host).
 *   events     two interprocess events per slot, made by the creator
 *              (cudaEventDisableTiming | cudaEventInterprocess), opened once by
 *              the connector: ready[i], recorded by the sender on post, and
 *              freed[i], recorded by the receiver on release.
 *   control    a POSIX shm segment named cfg->address: cipc_header (magic,
 *              geometry, pids, closed flags, the memory handle, the head/tail
 *              counters and futex doorbells, as in shm.c), then one
 *              mmp_msg_header per slot, then the ready and freed event handles.
 *
 * Ordering, per message k in slot i = k % slots ("stream" is each end's
 * cfg->cuda_stream, NULL meaning the legacy default stream):
 *   acquire    waits (futex, as shm) for the credit, then
 *              cudaStreamWaitEvent(stream, freed[i]): work the sender enqueues
 *              on its stream after acquire runs after the receiver's stream
 *              passed its release of lap k-slots. The host never waits for it.
 *   post       cudaEventRecord(ready[i], stream), then publishes the header and
 *              bumps head. The sender must have enqueued its writes to the slot
 *              on `stream` (or made `stream` wait for them) before post.
 *   recv       waits (futex) for head, then cudaStreamWaitEvent(stream,
 *              ready[i]) and returns the device pointer: work enqueued on the
 *              receiver's stream afterwards sees the payload. No
 *              cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize
 *              anywhere on the data path (acquire, post, recv, release, fill;
 *              read into host memory waits for its bytes by nature);
 *              tests/test_transport.c "cuda_ipc/no-host-sync" checks it.
 *   release    cudaEventRecord(freed[i], stream), then bumps tail. The receiver
 *              must have enqueued its reads of the slot on `stream`.
 * Event reuse is safe by the credit protocol: ready[i] is re-recorded only
 * after the receiver released lap k (so its wait on lap k was already
 * enqueued); freed[i] only after the receiver got lap k+slots (so the sender's
 * wait on it was already enqueued). A wait on a never-recorded event is a
 * no-op, which is what the first lap needs.
 *
 * Lifetime: legacy cudaIpc handles are only defined while the exporter's
 * allocation and events exist ("freeing before the importer closes is
 * undefined"). So a creator that closes while its connector is attached,
 * alive and not yet closed does not free them: the channel moves to a
 * process-wide list (`graveyard`) and its device memory and events are freed
 * by a later setup/connect/close of any cuda_ipc channel in this process once
 * the connector has closed or died, or by the process's exit. close never
 * waits for the peer (two processes closing each other's creators in opposite
 * orders would otherwise deadlock). Each end's close does wait for its own
 * stream (cudaStreamSynchronize; not the data path) so nothing it queued still
 * touches a slot it unmaps or frees.
 *
 * Known gap against channel.h's contract: when the CREATOR dies, slots it
 * posted before dying are still delivered (headers, order, then MMP_ERR_PEER),
 * but their device memory and events died with it, so their payloads must not
 * be read. The DESIGN's other export path (cuMem + a POSIX fd over
 * SCM_RIGHTS) would keep the memory alive in the importer; a coordinator
 * restart (DESIGN 9) follows any death anyway.
 *
 * Naming, peer death, timeouts and unlink-after-connect are exactly shm.c's;
 * the helpers below are copies of shm.c's static ones (kept static there).
 *
 * Must never: call a CUDA function from can_connect when cfg->on_gpu is 0
 * (host channels of a process that forks later must not initialise CUDA),
 * allocate, map or open a handle per message, synchronise the host on the
 * data path, or leave a name in /dev/shm behind on an error path. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "transport/channel.h"
#include "transport/segment.h"

#define CIPC_MAGIC 0x3143504943504d4dull /* "MMPCIPC1" */
#define CIPC_VERSION 1u
#define CIPC_ALIGN 256 /* slot stride: cudaMalloc's own alignment */
#define CIPC_LINE 64
#define CIPC_MAX_SLOTS 256
#define SLICE_MS 100 /* a blocked call checks on its peer this often */

enum { CREATOR = 0, CONNECTOR = 1 };

typedef struct cipc_header {
    _Atomic uint64_t magic; /* CIPC_MAGIC once the creator has set up the rest */
    uint32_t version;
    uint32_t slots;
    uint64_t slot_bytes;
    uint64_t slot_stride;       /* slot_bytes rounded up to CIPC_ALIGN */
    uint64_t total_bytes;       /* of this control segment */
    int32_t creator_sends;      /* 1: the creator is the sending end */
    int32_t creator_device;     /* for messages only */
    _Atomic uint32_t unlinked;  /* 1 once one end has claimed unlinking the name */
    _Atomic int32_t pid[2];     /* [CREATOR], [CONNECTOR]; 0 until attached */
    _Atomic uint32_t closed[2]; /* [CREATOR], [CONNECTOR] */
    cudaIpcMemHandle_t mem;     /* slot 0 of the creator's allocation */
    /* Written by the sender. */
    alignas(CIPC_LINE) _Atomic uint64_t head; /* messages posted */
    _Atomic uint32_t data_bell;               /* futex word: rung on post and close */
    _Atomic uint32_t data_sleepers;
    /* Written by the receiver. */
    alignas(CIPC_LINE) _Atomic uint64_t tail; /* messages released */
    _Atomic uint32_t credit_bell;             /* futex word: rung on release and close */
    _Atomic uint32_t credit_sleepers;
    /* Then: mmp_msg_header msg[slots]; cudaIpcEventHandle_t ready[slots],
     * freed[slots] (see layout()). */
} cipc_header;

static_assert(sizeof(_Atomic uint32_t) == 4 && ATOMIC_INT_LOCK_FREE == 2, /* also segment.h's */
              "futex words must be plain lock-free 32-bit integers");
static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "counters must be lock-free across processes");
static_assert(sizeof(mmp_msg_header) == 32, "mmp_msg_header is part of the segment layout");
static_assert(sizeof(cudaIpcMemHandle_t) == 64 && sizeof(cudaIpcEventHandle_t) == 64,
              "IPC handles are part of the segment layout");
static_assert(sizeof(cipc_header) == 320, "cipc_header is part of the segment layout");

typedef struct cipc_channel cipc_channel;
struct cipc_channel {
    cipc_header *hdr;
    size_t map_bytes;
    mmp_msg_header *msg;           /* in the segment: one per slot */
    cudaIpcEventHandle_t *ready_h; /* in the segment */
    cudaIpcEventHandle_t *freed_h; /* in the segment */
    unsigned char *dev;            /* slot 0: own allocation (creator) or mapping (connector) */
    cudaEvent_t *ready, *freed;    /* `slots` each; made (creator) or opened (connector) */
    int n_ready, n_freed;          /* how many of them exist */
    cudaStream_t stream;
    int device;
    size_t slot_bytes, stride;
    uint32_t slots;
    int send;           /* this end sends */
    int me, peer;       /* CREATOR / CONNECTOR */
    int timeout_ms;     /* <= 0: blocking calls wait for ever */
    uint64_t count;     /* sender: messages posted; receiver: messages received */
    uint64_t released;  /* receiver: messages released */
    int acquired;       /* sender: a slot is acquired and not yet posted */
    int peer_pidfd;     /* -1 until opened */
    cipc_channel *next; /* graveyard link */
    char name[NAME_MAX + 1];
};

static cipc_channel *cipc_of(mmp_channel_impl *c)
{
    return (cipc_channel *)(void *)c;
}

static mmp_err cuda_fail(cudaError_t e, const char *name, const char *what)
{
    return mmp_errorf(MMP_ERR_CUDA, "cuda_ipc %s: %s: %s (%s)", name, what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

/* ---- helpers copied from shm.c (no spin: a micro-batch takes ms) --------- */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static void sleep_ms(double ms)
{
    struct timespec t = {(time_t)(ms / 1e3), (long)((ms - (time_t)(ms / 1e3) * 1e3) * 1e6)};
    nanosleep(&t, NULL);
}

/* The doorbells, liveness and unlinking are transport/segment.h's, as shm.c's. */
static void ring(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers, int always)
{
    mmp_segment_bell_ring(bell, always ? NULL : sleepers);
}

/* 1 when the peer's process is known to have exited (a zombie counts). */
static int peer_dead(cipc_channel *ch)
{
    return mmp_segment_peer_dead(&ch->hdr->pid[ch->peer], &ch->peer_pidfd);
}

static const char *role_name(int role)
{
    return role == CREATOR ? "creator" : "connector";
}

/* Waits until *counter >= target; a closed or dead peer and the channel's
 * timeout are MMP_ERR_PEER. Sleeps on the futex at once: the hand-off of a
 * micro-batch is rare next to shm's small messages, so no spin. */
static mmp_err wait_counter(cipc_channel *ch, _Atomic uint64_t *counter, uint64_t target,
                            _Atomic uint32_t *bell, _Atomic uint32_t *sleepers, const char *what)
{
    double start = now_ms();
    for (;;) {
        uint32_t seen = atomic_load_explicit(bell, memory_order_acquire);
        if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
            return MMP_OK;
        }
        if (atomic_load_explicit(&ch->hdr->closed[ch->peer], memory_order_acquire)) {
            return mmp_errorf(MMP_ERR_PEER, "cuda_ipc %s: waiting for %s: the %s end closed",
                              ch->name, what, role_name(ch->peer));
        }
        int slice = SLICE_MS;
        if (ch->timeout_ms > 0) {
            double left = ch->timeout_ms - (now_ms() - start);
            if (left <= 0) {
                return mmp_errorf(MMP_ERR_PEER,
                                  "cuda_ipc %s: waiting for %s: nothing from the %s end in %d ms",
                                  ch->name, what, role_name(ch->peer), ch->timeout_ms);
            }
            slice = left < SLICE_MS ? (int)left + 1 : SLICE_MS;
        }
        int r = mmp_segment_bell_wait(bell, seen, sleepers, slice);
        if (r == ETIMEDOUT && peer_dead(ch)) {
            return mmp_errorf(MMP_ERR_PEER, "cuda_ipc %s: waiting for %s: the %s end (pid %d) died",
                              ch->name, what, role_name(ch->peer),
                              (int)atomic_load(&ch->hdr->pid[ch->peer]));
        }
    }
}

static int claim_unlink(cipc_channel *ch)
{
    return mmp_segment_unlink_once(&ch->hdr->unlinked, ch->name);
}

/* ---- geometry ----------------------------------------------------------- */

typedef struct cipc_geometry {
    size_t stride;  /* device bytes per slot */
    size_t msg_off; /* control segment offsets */
    size_t ready_off;
    size_t freed_off;
    size_t total; /* control segment bytes */
} cipc_geometry;

static mmp_err check_cfg(const mmp_channel_cfg *cfg, cipc_geometry *g)
{
    const char *a = cfg ? cfg->address : NULL;
    if (!a || a[0] != '/' || !a[1] || strchr(a + 1, '/') || strlen(a) > NAME_MAX) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "cuda_ipc: address '%s' is not a POSIX shm name ('/' then up to %d "
                          "characters, no other '/')",
                          a ? a : "(null)", NAME_MAX - 1);
    }
    if (cfg->slots < 1 || cfg->slots > CIPC_MAX_SLOTS) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: slots %d not in 1..%d", a, cfg->slots,
                          CIPC_MAX_SLOTS);
    }
    if (cfg->slot_bytes > ((size_t)1 << 40)) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: slot_bytes %zu is absurd", a,
                          cfg->slot_bytes);
    }
    if (cfg->device < 0) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: device %d", a, cfg->device);
    }
    size_t s = cfg->slot_bytes ? cfg->slot_bytes : 1;
    g->stride = (s + CIPC_ALIGN - 1) / CIPC_ALIGN * CIPC_ALIGN;
    g->msg_off = sizeof(cipc_header);
    g->ready_off = g->msg_off + (size_t)cfg->slots * sizeof(mmp_msg_header);
    g->freed_off = g->ready_off + (size_t)cfg->slots * sizeof(cudaIpcEventHandle_t);
    g->total = g->freed_off + (size_t)cfg->slots * sizeof(cudaIpcEventHandle_t);
    return MMP_OK;
}

static mmp_err new_channel(cipc_channel **out, const mmp_channel_cfg *cfg, const cipc_geometry *g,
                           int me)
{
    cipc_channel *ch = calloc(1, sizeof *ch);
    cudaEvent_t *ev = calloc(2 * (size_t)cfg->slots, sizeof *ev);
    if (!ch || !ev) {
        free(ch);
        free(ev);
        return mmp_errorf(MMP_ERR_NOMEM, "cuda_ipc %s: channel", cfg->address);
    }
    snprintf(ch->name, sizeof ch->name, "%s", cfg->address);
    ch->ready = ev;
    ch->freed = ev + cfg->slots;
    ch->stream = (cudaStream_t)cfg->cuda_stream;
    ch->device = cfg->device;
    ch->slot_bytes = cfg->slot_bytes;
    ch->stride = g->stride;
    ch->slots = (uint32_t)cfg->slots;
    ch->send = cfg->send != 0;
    ch->me = me;
    ch->peer = 1 - me;
    ch->timeout_ms = cfg->timeout_ms;
    ch->peer_pidfd = -1;
    ch->map_bytes = g->total;
    *out = ch;
    return MMP_OK;
}

static void point_into(cipc_channel *ch, void *base, const cipc_geometry *g)
{
    ch->hdr = base;
    ch->msg = (mmp_msg_header *)(void *)((unsigned char *)base + g->msg_off);
    ch->ready_h = (cudaIpcEventHandle_t *)(void *)((unsigned char *)base + g->ready_off);
    ch->freed_h = (cudaIpcEventHandle_t *)(void *)((unsigned char *)base + g->freed_off);
}

/* Destroys this end's events and frees or unmaps its device slots; NULL-safe
 * per resource, so valid after a partial setup or attach. Errors are logged:
 * a dead peer can leave this context with a sticky error, and clean-up must go
 * on regardless. */
static void release_device(cipc_channel *ch)
{
    if (!ch->dev && ch->n_ready == 0 && ch->n_freed == 0) {
        return;
    }
    cudaError_t e = cudaSetDevice(ch->device);
    /* Our own stream only, and not the data path: nothing this end queued may
     * still touch a slot once it is unmapped or freed. */
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(ch->stream);
    }
    if (e != cudaSuccess) {
        MMP_WARN("cuda_ipc %s: clean-up: %s", ch->name, cudaGetErrorString(e));
        (void)cudaGetLastError();
    }
    for (int i = 0; i < ch->n_ready; i++) {
        cudaEventDestroy(ch->ready[i]);
    }
    for (int i = 0; i < ch->n_freed; i++) {
        cudaEventDestroy(ch->freed[i]);
    }
    ch->n_ready = ch->n_freed = 0;
    if (ch->dev) {
        e = ch->me == CREATOR ? cudaFree(ch->dev) : cudaIpcCloseMemHandle(ch->dev);
        if (e != cudaSuccess) {
            MMP_WARN("cuda_ipc %s: %s: %s", ch->name,
                     ch->me == CREATOR ? "cudaFree" : "cudaIpcCloseMemHandle",
                     cudaGetErrorString(e));
            (void)cudaGetLastError();
        }
        ch->dev = NULL;
    }
}

static void free_channel(cipc_channel *ch)
{
    release_device(ch);
    if (ch->hdr) {
        munmap(ch->hdr, ch->map_bytes);
    }
    if (ch->peer_pidfd >= 0) {
        close(ch->peer_pidfd);
    }
    free(ch->ready); /* ready and freed are one block */
    free(ch);
}

/* ---- the graveyard: closed creators whose connector may still map them --- */

static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;
static cipc_channel *graveyard;

/* 1 while the connector may still use the creator's memory or events. */
static int connector_may_use(cipc_channel *ch)
{
    if (atomic_load_explicit(&ch->hdr->pid[CONNECTOR], memory_order_acquire) == 0) {
        return 0;
    }
    if (atomic_load_explicit(&ch->hdr->closed[CONNECTOR], memory_order_acquire)) {
        return 0;
    }
    return !peer_dead(ch);
}

/* Frees the buried channels whose connector is done with them. */
static void sweep(void)
{
    pthread_mutex_lock(&graveyard_lock);
    cipc_channel **p = &graveyard;
    while (*p) {
        cipc_channel *ch = *p;
        if (connector_may_use(ch)) {
            p = &ch->next;
            continue;
        }
        *p = ch->next;
        MMP_DEBUG("cuda_ipc %s: the connector is done; freeing the device ring", ch->name);
        free_channel(ch);
    }
    pthread_mutex_unlock(&graveyard_lock);
}

/* ---- the transport ------------------------------------------------------ */

static int cipc_can_connect(const mmp_channel_cfg *cfg, const char **why_not)
{
    const char *why = NULL;
    int n = 0;
    if (!cfg || !cfg->on_gpu) {
        why = "the edge's payloads are in host memory (cfg.on_gpu is 0)";
    } else if (!cfg->address || cfg->address[0] != '/') {
        why = "address is not a POSIX shm name (must start with '/')";
    } else if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        why = "no CUDA device is visible to this process";
    } else if (cfg->device < 0 || cfg->device >= n) {
        why = "cfg.device is not a visible CUDA device";
    }
    /* Same host is assumed, as for shm: the coordinator sets on_gpu only for
     * edges between GPU processes it placed on one machine. */
    if (why && why_not) {
        *why_not = why;
    }
    return why == NULL;
}

static mmp_err cipc_setup(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    cipc_geometry g = {0};
    cipc_channel *ch = NULL;
    int fd = -1, created = 0;
    void *base = MAP_FAILED;
    cudaError_t ce;
    *out = NULL;
    mmp_err ret = check_cfg(cfg, &g);
    if (ret != MMP_OK) {
        return ret;
    }
    sweep();
    ret = new_channel(&ch, cfg, &g, CREATOR);
    if (ret != MMP_OK) {
        return ret;
    }
    /* Device resources first: they need no clean-up of a name if they fail. */
    if ((ce = cudaSetDevice(cfg->device)) != cudaSuccess) {
        ret = cuda_fail(ce, cfg->address, "cudaSetDevice");
        goto fail;
    }
    if ((ce = cudaMalloc((void **)&ch->dev, (size_t)cfg->slots * g.stride)) != cudaSuccess) {
        ch->dev = NULL;
        ret = cuda_fail(ce, cfg->address, "cudaMalloc of the slots");
        goto fail;
    }
    const unsigned flags = cudaEventDisableTiming | cudaEventInterprocess;
    for (; ch->n_ready < cfg->slots; ch->n_ready++) {
        if ((ce = cudaEventCreateWithFlags(&ch->ready[ch->n_ready], flags)) != cudaSuccess) {
            ret = cuda_fail(ce, cfg->address, "cudaEventCreateWithFlags");
            goto fail;
        }
    }
    for (; ch->n_freed < cfg->slots; ch->n_freed++) {
        if ((ce = cudaEventCreateWithFlags(&ch->freed[ch->n_freed], flags)) != cudaSuccess) {
            ret = cuda_fail(ce, cfg->address, "cudaEventCreateWithFlags");
            goto fail;
        }
    }
    fd = shm_open(cfg->address, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        ret = mmp_errorf(MMP_ERR_IO, "cuda_ipc %s: create: %s%s", cfg->address, strerror(errno),
                         errno == EEXIST ? " (left by a crashed run? mmp_shm_unlink_prefix)" : "");
        goto fail;
    }
    created = 1;
    int e = posix_fallocate(fd, 0, (off_t)g.total);
    if (e != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "cuda_ipc %s: reserve %zu bytes: %s", cfg->address, g.total,
                         strerror(e));
        goto fail;
    }
    base = mmap(NULL, g.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        ret = mmp_errorf(MMP_ERR_IO, "cuda_ipc %s: map %zu bytes: %s", cfg->address, g.total,
                         strerror(errno));
        goto fail;
    }
    point_into(ch, base, &g); /* ch owns the mapping from here */
    base = MAP_FAILED;
    cipc_header *h = ch->hdr; /* a fresh segment reads as zeros */
    if ((ce = cudaIpcGetMemHandle(&h->mem, ch->dev)) != cudaSuccess) {
        ret = cuda_fail(ce, cfg->address, "cudaIpcGetMemHandle");
        goto fail;
    }
    for (int i = 0; i < cfg->slots; i++) {
        if ((ce = cudaIpcGetEventHandle(&ch->ready_h[i], ch->ready[i])) != cudaSuccess ||
            (ce = cudaIpcGetEventHandle(&ch->freed_h[i], ch->freed[i])) != cudaSuccess) {
            ret = cuda_fail(ce, cfg->address, "cudaIpcGetEventHandle");
            goto fail;
        }
    }
    h->version = CIPC_VERSION;
    h->slots = (uint32_t)cfg->slots;
    h->slot_bytes = cfg->slot_bytes;
    h->slot_stride = g.stride;
    h->total_bytes = g.total;
    h->creator_sends = ch->send;
    h->creator_device = cfg->device;
    atomic_store(&h->pid[CREATOR], (int32_t)getpid());
    atomic_store_explicit(&h->magic, CIPC_MAGIC, memory_order_release);
    close(fd);
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;

fail:
    if (base != MAP_FAILED) {
        munmap(base, g.total);
    }
    free_channel(ch);
    if (created) {
        shm_unlink(cfg->address);
    }
    if (fd >= 0) {
        close(fd);
    }
    return ret;
}

/* One attempt to attach the control segment: MMP_OK, MMP_ERR_TIMEOUT when it
 * is not there or not ready yet (try again), or a real error. */
static mmp_err try_attach(cipc_channel *ch, const mmp_channel_cfg *cfg, const cipc_geometry *g)
{
    mmp_err ret = MMP_OK;
    void *base = MAP_FAILED;
    size_t mapped = 0;
    int fd = shm_open(cfg->address, O_RDWR, 0);
    if (fd < 0) {
        if (errno == ENOENT) {
            return MMP_ERR_TIMEOUT;
        }
        return mmp_errorf(MMP_ERR_IO, "cuda_ipc %s: open: %s", cfg->address, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "cuda_ipc %s: stat: %s", cfg->address, strerror(errno));
        goto exit;
    }
    if ((size_t)st.st_size < sizeof(cipc_header)) {
        ret = MMP_ERR_TIMEOUT; /* created, not sized yet */
        goto exit;
    }
    mapped = sizeof(cipc_header);
    base = mmap(NULL, mapped, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        ret = mmp_errorf(MMP_ERR_IO, "cuda_ipc %s: map header: %s", cfg->address, strerror(errno));
        goto exit;
    }
    const cipc_header *h = base;
    uint64_t magic = atomic_load_explicit(&((cipc_header *)base)->magic, memory_order_acquire);
    if (magic == 0) {
        ret = MMP_ERR_TIMEOUT;
        goto exit;
    }
    if (magic != CIPC_MAGIC) {
        /* Most likely the other end picked shm: both ends must agree on
         * cfg.on_gpu and both must see a CUDA device. */
        ret = mmp_errorf(MMP_ERR_PROTO,
                         "cuda_ipc %s: not a cuda_ipc channel (magic %#llx, want %#llx); does "
                         "the creator set on_gpu and see a CUDA device?",
                         cfg->address, (unsigned long long)magic, (unsigned long long)CIPC_MAGIC);
        goto exit;
    }
    if (h->version != CIPC_VERSION) {
        ret = mmp_errorf(MMP_ERR_PROTO, "cuda_ipc %s: segment version %u, this end speaks %u",
                         cfg->address, h->version, CIPC_VERSION);
        goto exit;
    }
    if (h->slots != (uint32_t)cfg->slots || h->slot_bytes != cfg->slot_bytes) {
        ret = mmp_errorf(MMP_ERR_PROTO,
                         "cuda_ipc %s: geometry mismatch: segment has %u slots of %llu bytes, "
                         "this end expects %d slots of %zu bytes",
                         cfg->address, h->slots, (unsigned long long)h->slot_bytes, cfg->slots,
                         cfg->slot_bytes);
        goto exit;
    }
    if (h->slot_stride != g->stride || h->total_bytes != g->total ||
        (size_t)st.st_size != g->total) {
        ret = mmp_errorf(MMP_ERR_PROTO,
                         "cuda_ipc %s: layout mismatch: stride %llu size %lld, this end computes "
                         "stride %zu size %zu",
                         cfg->address, (unsigned long long)h->slot_stride, (long long)st.st_size,
                         g->stride, g->total);
        goto exit;
    }
    if ((h->creator_sends != 0) == (cfg->send != 0)) {
        ret = mmp_errorf(MMP_ERR_PROTO, "cuda_ipc %s: both ends %s", cfg->address,
                         cfg->send ? "send" : "receive");
        goto exit;
    }
    munmap(base, mapped);
    mapped = g->total;
    base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        ret = mmp_errorf(MMP_ERR_IO, "cuda_ipc %s: map %zu bytes: %s", cfg->address, mapped,
                         strerror(errno));
        goto exit;
    }
    int32_t none = 0;
    if (!atomic_compare_exchange_strong(&((cipc_header *)base)->pid[CONNECTOR], &none,
                                        (int32_t)getpid())) {
        ret = mmp_errorf(MMP_ERR_PROTO, "cuda_ipc %s: already has a connector (pid %d)",
                         cfg->address, (int)none);
        goto exit;
    }
    point_into(ch, base, g); /* attached: a failure from here closes like any close */
    base = MAP_FAILED;
    claim_unlink(ch);
    if (atomic_load(&ch->hdr->closed[CREATOR])) {
        ret = mmp_errorf(MMP_ERR_PEER, "cuda_ipc %s: the creator closed before the connect",
                         cfg->address);
        goto exit;
    }
    if (peer_dead(ch)) {
        ret = mmp_errorf(MMP_ERR_PEER, "cuda_ipc %s: the creator (pid %d) is dead", cfg->address,
                         (int)atomic_load(&ch->hdr->pid[CREATOR]));
        goto exit;
    }

exit:
    if (base != MAP_FAILED) {
        munmap(base, mapped);
    }
    close(fd);
    return ret;
}

/* Opens the creator's device slots and events in this process, once. */
static mmp_err import_device(cipc_channel *ch)
{
    cudaError_t ce;
    if ((ce = cudaSetDevice(ch->device)) != cudaSuccess) {
        return cuda_fail(ce, ch->name, "cudaSetDevice");
    }
    void *dev = NULL;
    ce = cudaIpcOpenMemHandle(&dev, ch->hdr->mem, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
        return cuda_fail(ce, ch->name, "cudaIpcOpenMemHandle");
    }
    ch->dev = dev;
    for (; ch->n_ready < (int)ch->slots; ch->n_ready++) {
        ce = cudaIpcOpenEventHandle(&ch->ready[ch->n_ready], ch->ready_h[ch->n_ready]);
        if (ce != cudaSuccess) {
            return cuda_fail(ce, ch->name, "cudaIpcOpenEventHandle");
        }
    }
    for (; ch->n_freed < (int)ch->slots; ch->n_freed++) {
        ce = cudaIpcOpenEventHandle(&ch->freed[ch->n_freed], ch->freed_h[ch->n_freed]);
        if (ce != cudaSuccess) {
            return cuda_fail(ce, ch->name, "cudaIpcOpenEventHandle");
        }
    }
    return MMP_OK;
}

static void cipc_close(mmp_channel_impl *c);

static mmp_err cipc_connect(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    cipc_geometry g = {0};
    cipc_channel *ch = NULL;
    *out = NULL;
    MMP_TRY(check_cfg(cfg, &g));
    sweep();
    MMP_TRY(new_channel(&ch, cfg, &g, CONNECTOR));
    double start = now_ms(), pause = 0.2;
    mmp_err ret;
    while ((ret = try_attach(ch, cfg, &g)) == MMP_ERR_TIMEOUT) {
        if (cfg->timeout_ms > 0 && now_ms() - start >= cfg->timeout_ms) {
            ret = mmp_errorf(MMP_ERR_PEER, "cuda_ipc %s: no ready creator after %d ms",
                             cfg->address, cfg->timeout_ms);
            break;
        }
        sleep_ms(pause);
        pause = pause * 2 < 10 ? pause * 2 : 10;
    }
    if (ret == MMP_OK) {
        ret = import_device(ch);
    }
    if (ret != MMP_OK) {
        cipc_close((mmp_channel_impl *)(void *)
                       ch); /* marks closed if attached; never unlinks a creator's name */
        return ret;
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

static mmp_err cipc_acquire(mmp_channel_impl *c, void **payload)
{
    cipc_channel *ch = cipc_of(c);
    if (!ch->send) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: acquire on the receiving end", ch->name);
    }
    if (ch->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: acquire twice without a post", ch->name);
    }
    if (atomic_load_explicit(&ch->hdr->closed[ch->peer], memory_order_acquire)) {
        return mmp_errorf(MMP_ERR_PEER, "cuda_ipc %s: the receiving %s end closed", ch->name,
                          role_name(ch->peer));
    }
    uint32_t i = (uint32_t)(ch->count % ch->slots);
    if (ch->count >= ch->slots) {
        MMP_TRY(wait_counter(ch, &ch->hdr->tail, ch->count - ch->slots + 1, &ch->hdr->credit_bell,
                             &ch->hdr->credit_sleepers, "a credit"));
        /* The credit says the receiver enqueued its last reads of slot i;
         * this makes our stream wait for them on the device, not the host. */
        cudaError_t ce = cudaStreamWaitEvent(ch->stream, ch->freed[i], 0);
        if (ce != cudaSuccess) {
            return cuda_fail(ce, ch->name, "acquire: cudaStreamWaitEvent");
        }
    }
    /* tail is the peer's word: a receiver cannot release what was never posted. */
    uint64_t tail = atomic_load_explicit(&ch->hdr->tail, memory_order_acquire);
    if (tail > ch->count) {
        return mmp_errorf(
            MMP_ERR_PROTO,
            "cuda_ipc %s: header field tail = %llu, more than the %llu messages posted", ch->name,
            (unsigned long long)tail, (unsigned long long)ch->count);
    }
    ch->acquired = 1;
    *payload = ch->dev + (size_t)i * ch->stride;
    return MMP_OK;
}

/* mmp_channel_send's copy: stream-ordered; src may be host or device memory
 * (unified addressing). A pageable host src may be reused when this returns
 * (the runtime stages it first); a device src must stay unchanged until the
 * stream has passed the copy. */
static mmp_err cipc_fill(mmp_channel_impl *c, void *slot, const void *src, size_t bytes)
{
    cipc_channel *ch = cipc_of(c);
    cudaError_t ce = cudaMemcpyAsync(slot, src, bytes, cudaMemcpyDefault, ch->stream);
    if (ce != cudaSuccess) {
        return cuda_fail(ce, ch->name, "send: cudaMemcpyAsync into the slot");
    }
    return MMP_OK;
}

/* mmp_channel_read's copy out of a received slot: stream-ordered, after the
 * recv's wait for the sender's writes. Into pageable host memory the runtime
 * returns only once the bytes are there; into device or pinned memory the
 * caller orders its use on the same stream. */
static mmp_err cipc_read(mmp_channel_impl *c, void *dst, const void *src, size_t bytes)
{
    cipc_channel *ch = cipc_of(c);
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ch->stream);
    if (ce != cudaSuccess) {
        return cuda_fail(ce, ch->name, "read: cudaMemcpyAsync out of the slot");
    }
    return MMP_OK;
}

static mmp_err cipc_post(mmp_channel_impl *c, const mmp_msg_header *h)
{
    cipc_channel *ch = cipc_of(c);
    if (!ch->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: post without an acquired slot", ch->name);
    }
    if (h->bytes > ch->slot_bytes) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: post of %llu bytes into %zu-byte slots",
                          ch->name, (unsigned long long)h->bytes, ch->slot_bytes);
    }
    uint32_t i = (uint32_t)(ch->count % ch->slots);
    /* Recorded before head moves, so the receiver's wait (issued only after
     * it sees head) finds this record, not the previous lap's. UNVERIFIED:
     * that a record issued by one process is the one another process's later
     * cudaStreamWaitEvent captures, once the host-side order is as here. */
    cudaError_t ce = cudaEventRecord(ch->ready[i], ch->stream);
    if (ce != cudaSuccess) {
        return cuda_fail(ce, ch->name, "post: cudaEventRecord");
    }
    ch->msg[i] = *h;
    ch->count++;
    ch->acquired = 0;
    atomic_store_explicit(&ch->hdr->head, ch->count, memory_order_release);
    ring(&ch->hdr->data_bell, &ch->hdr->data_sleepers, 0);
    return MMP_OK;
}

static mmp_err cipc_recv(mmp_channel_impl *c, mmp_msg_header *h, const void **payload)
{
    cipc_channel *ch = cipc_of(c);
    if (ch->send) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: recv on the sending end", ch->name);
    }
    MMP_TRY(wait_counter(ch, &ch->hdr->head, ch->count + 1, &ch->hdr->data_bell,
                         &ch->hdr->data_sleepers, "a message"));
    /* head is the peer's word: more than a ring ahead is forged or corrupt. */
    uint64_t head = atomic_load_explicit(&ch->hdr->head, memory_order_acquire);
    if (head - ch->count > ch->slots) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "cuda_ipc %s: header field head = %llu, more than the %u slots ahead of "
                          "the %llu messages received",
                          ch->name, (unsigned long long)head, (unsigned)ch->slots,
                          (unsigned long long)ch->count);
    }
    uint32_t i = (uint32_t)(ch->count % ch->slots);
    *h = ch->msg[i]; /* a copy: the checks hold whatever the peer writes next */
    char what[sizeof ch->name + 40];
    snprintf(what, sizeof what, "cuda_ipc %s message %llu", ch->name,
             (unsigned long long)ch->count);
    MMP_TRY(mmp_msg_check(what, h, ch->slot_bytes));
    /* The device waits for the sender's writes; the host goes on at once. */
    cudaError_t ce = cudaStreamWaitEvent(ch->stream, ch->ready[i], 0);
    if (ce != cudaSuccess) {
        return cuda_fail(ce, ch->name, "recv: cudaStreamWaitEvent");
    }
    ch->count++;
    *payload = ch->dev + (size_t)i * ch->stride;
    return MMP_OK;
}

static mmp_err cipc_release(mmp_channel_impl *c)
{
    cipc_channel *ch = cipc_of(c);
    if (ch->send || ch->released == ch->count) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: release with no received slot held",
                          ch->name);
    }
    uint32_t i = (uint32_t)(ch->released % ch->slots);
    cudaError_t ce = cudaEventRecord(ch->freed[i], ch->stream);
    if (ce != cudaSuccess) {
        return cuda_fail(ce, ch->name, "release: cudaEventRecord");
    }
    ch->released++;
    atomic_store_explicit(&ch->hdr->tail, ch->released, memory_order_release);
    ring(&ch->hdr->credit_bell, &ch->hdr->credit_sleepers, 0);
    return MMP_OK;
}

/* Marks this end closed and wakes the peer (its blocked call returns
 * MMP_ERR_PEER once it has drained what was posted). A connector unmaps the
 * creator's slots and closes its events; a creator frees its own, unless the
 * connector may still use them (then later: see `graveyard`). A creator no
 * one connected to unlinks the name. NULL is a no-op; ch is freed. */
static void cipc_close(mmp_channel_impl *c)
{
    cipc_channel *ch = cipc_of(c);
    if (!ch) {
        sweep();
        return;
    }
    if (ch->hdr) {
        atomic_store_explicit(&ch->hdr->closed[ch->me], 1, memory_order_release);
        ring(&ch->hdr->data_bell, &ch->hdr->data_sleepers, 1);
        ring(&ch->hdr->credit_bell, &ch->hdr->credit_sleepers, 1);
        if (ch->me == CREATOR) {
            claim_unlink(ch);
            if (connector_may_use(ch)) {
                pthread_mutex_lock(&graveyard_lock);
                ch->next = graveyard;
                graveyard = ch;
                pthread_mutex_unlock(&graveyard_lock);
                sweep(); /* others may be done by now */
                return;
            }
        }
    }
    free_channel(ch);
    sweep();
}

static size_t cipc_slot_bytes(const mmp_channel_impl *c)
{
    return ((const cipc_channel *)(const void *)c)->slot_bytes;
}

const mmp_transport mmp_transport_cuda_ipc = {
    .name = "cuda_ipc",
    .caps = MMP_TRANSPORT_DEVICE_SLOTS,
    .can_connect = cipc_can_connect,
    .setup = cipc_setup,
    .connect = cipc_connect,
    .acquire = cipc_acquire,
    .post = cipc_post,
    .recv = cipc_recv,
    .release = cipc_release,
    .close = cipc_close,
    .slot_bytes = cipc_slot_bytes,
    .fill = cipc_fill,
    .read = cipc_read,
};
