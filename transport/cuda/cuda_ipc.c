/* The `cuda_ipc` data channel: a ring of device-memory slots between two GPU
 * processes on one host, with the slot/credit protocol of transport/shm.c and
 * CUDA interprocess events, so neither end's host waits for the other's GPU.
 *
 * Run on an H100 (2026-11-24): the cuda_ipc cases of tests/test_transport.c
 * pass in both signalling modes, memcheck clean; bench/bench_cuda_ipc.c
 * measured a hand-off at 17-19 us with stream memory operations, 282 us with
 * events (README, Measured / GPU). scripts/gpu-check reruns all of it.
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
 *   control    a POSIX shm segment named cfg->address (transport/segment.h,
 *              as shm.c's): cipc_header (magic, geometry, the memory handle,
 *              the ring's shared words: pids, closed flags, head/tail
 *              counters and futex doorbells), then one mmp_msg_header per
 *              slot, then the ready and freed event handles.
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
 * The slot/credit protocol, peer death, timeouts and unlink-after-connect
 * are transport/ring.h's, shared with shm.c; this file gives the ring device
 * slots and its hooks (the event records and stream waits above). The
 * control segment's create, attach, publish and unlink are segment.h's.
 *
 * Must never: call a CUDA function from can_connect when cfg->on_gpu is 0
 * (host channels of a process that forks later must not initialise CUDA),
 * allocate, map or open a handle per message, synchronise the host on the
 * data path, or leave a name in /dev/shm behind on an error path. */
#include <assert.h>
#include <limits.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h> /* the stream memory operations' types; entry points come from the runtime */
#include <cuda_runtime_api.h>

#include "transport/channel.h"
#include "transport/ring.h"
#include "transport/segment.h"

#define CIPC_MAGIC 0x3143504943504d4dull /* "MMPCIPC1" */
#define CIPC_VERSION 3u                  /* 3: the creator names the sync mode (cipc_header.sync) */
#define CIPC_ALIGN 256                   /* slot stride: cudaMalloc's own alignment */
#define CIPC_LINE 64
#define CIPC_MAX_SLOTS 256

typedef struct cipc_header {
    mmp_ring_header g;                       /* magic (CIPC_MAGIC), version, geometry, directions */
    int32_t creator_device;                  /* for messages only */
    int32_t sync;                            /* CIPC_SYNC_*: the creator's choice */
    cudaIpcMemHandle_t mem;                  /* slot 0 of the creator's allocation */
    alignas(CIPC_LINE) mmp_ring_shared ring; /* pids, closed flags, counters, doorbells */
    /* Then: mmp_msg_header msg[slots]; cudaIpcEventHandle_t ready[slots],
     * freed[slots] (see check_cfg). */
} cipc_header;

static_assert(offsetof(cipc_header, g) == 0, "a segment's magic comes first (segment.h)");
static_assert(sizeof(cudaIpcMemHandle_t) == 64 && sizeof(cudaIpcEventHandle_t) == 64,
              "IPC handles are part of the segment layout");
static_assert(sizeof(cipc_header) == 320, "cipc_header is part of the segment layout");

/* How a slot's readiness and release are signalled on the devices:
 *   MEMOPS  (default where the driver has them) a flag word per slot and
 *           direction in the creator's device allocation, after the slots:
 *           ready[i] and freed[i] hold the last lap (1-based) posted or
 *           released; the waiting stream runs cuStreamWaitValue32(GEQ) on it
 *           and the signalling stream cuStreamWriteValue32 (ordered after its
 *           earlier work, with a memory barrier). Neither host waits.
 *   EVENTS  interprocess events (cudaEventRecord / cudaStreamWaitEvent).
 * bench_cuda_ipc measures both; MMP_CIPC_SYNC=events|memops in the
 * creator's environment picks one. */
enum { CIPC_SYNC_EVENTS = 1, CIPC_SYNC_MEMOPS = 2 };

typedef CUresult (*cipc_memop_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
/* cuMemGetAddressRange: the connector checks the creator's allocation */
typedef CUresult (*cipc_range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
static cipc_memop_fn cipc_wait32, cipc_write32;
static cipc_range_fn cipc_range;
static pthread_once_t cipc_driver_once = PTHREAD_ONCE_INIT;

/* A driver function through the runtime's entry point (no link to the
 * driver library: this module loads where there is none); NULL when the
 * driver lacks it. */
static void *driver_entry(const char *name)
{
    void *f = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return q == cudaDriverEntryPointSuccess ? f : NULL;
}

static void find_driver(void)
{
    cipc_memop_fn w = (cipc_memop_fn)driver_entry("cuStreamWaitValue32");
    cipc_memop_fn r = (cipc_memop_fn)driver_entry("cuStreamWriteValue32");
    if (w && r) { /* both or neither */
        cipc_wait32 = w;
        cipc_write32 = r;
    }
    cipc_range = (cipc_range_fn)driver_entry("cuMemGetAddressRange");
}

static int memops_available(void)
{
    pthread_once(&cipc_driver_once, find_driver);
    return cipc_wait32 && cipc_write32;
}

/* The creator's choice: MMP_CIPC_SYNC, else memops where available. */
static mmp_err choose_sync(const char *name, int32_t *sync)
{
    const char *env = getenv("MMP_CIPC_SYNC");
    if (env && strcmp(env, "events") == 0) {
        *sync = CIPC_SYNC_EVENTS;
    } else if (env && env[0] && strcmp(env, "memops") != 0) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: MMP_CIPC_SYNC=%s (want events or memops)",
                          name, env);
    } else if (memops_available()) {
        *sync = CIPC_SYNC_MEMOPS;
    } else if (env && env[0]) {
        return mmp_errorf(MMP_ERR_UNSUPPORTED,
                          "cuda_ipc %s: MMP_CIPC_SYNC=memops, but the driver has no stream "
                          "memory operations",
                          name);
    } else {
        *sync = CIPC_SYNC_EVENTS;
    }
    return MMP_OK;
}

typedef struct cipc_channel cipc_channel;
struct cipc_channel {
    mmp_ring ring; /* first: the protocol (transport/ring.h), which the table's
                    * ring entries take the channel as; its hooks are below */
    cipc_header *hdr;
    size_t map_bytes;
    cudaIpcEventHandle_t *ready_h; /* in the segment */
    cudaIpcEventHandle_t *freed_h; /* in the segment */
    unsigned char *dev;            /* slot 0: own allocation (creator) or mapping (connector) */
    cudaEvent_t *ready, *freed;    /* `slots` each; made (creator) or opened (connector) */
    int n_ready, n_freed;          /* how many of them exist */
    cudaStream_t stream;
    int device;
    int32_t sync;                /* CIPC_SYNC_* (the creator's, read from the header) */
    uint32_t *ready_f, *freed_f; /* MEMOPS: the flag words, device memory after the slots */
    size_t slot_bytes, stride;
    size_t dev_bytes;                     /* the slots and flags, as this end's geometry has them */
    size_t msg_off, ready_off, freed_off; /* in the control segment */
    uint32_t slots;
    int send;           /* this end sends */
    cipc_channel *next; /* graveyard link */
    char name[NAME_MAX + 1];
};

static_assert(offsetof(cipc_channel, ring) == 0, "mmp_ring_impl_* take the channel as its ring");

static cipc_channel *cipc_of(mmp_channel_impl *c)
{
    return (cipc_channel *)(void *)c;
}

static mmp_err cuda_fail(cudaError_t e, const char *name, const char *what)
{
    return mmp_errorf(MMP_ERR_CUDA, "cuda_ipc %s: %s: %s (%s)", name, what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

/* ---- the ring's hooks: what the device does at each step ----------------- */

/* MMP_OK, or the CUDA error of a hook's one call, named. */
static mmp_err step(const cipc_channel *ch, cudaError_t ce, const char *what)
{
    return ce == cudaSuccess ? MMP_OK : cuda_fail(ce, ch->name, what);
}

/* MEMOPS: this end's stream waits until flag >= lap / writes lap into flag. */
static mmp_err flag_wait(const cipc_channel *ch, uint32_t *flag, uint64_t lap, const char *what)
{
    CUresult r = cipc_wait32((CUstream)ch->stream, (CUdeviceptr)(uintptr_t)flag, (cuuint32_t)lap,
                             CU_STREAM_WAIT_VALUE_GEQ);
    return r == CUDA_SUCCESS ? MMP_OK
                             : mmp_errorf(MMP_ERR_CUDA, "cuda_ipc %s: %s: cuStreamWaitValue32: %d",
                                          ch->name, what, (int)r);
}

static mmp_err flag_write(const cipc_channel *ch, uint32_t *flag, uint64_t lap, const char *what)
{
    CUresult r = cipc_write32((CUstream)ch->stream, (CUdeviceptr)(uintptr_t)flag, (cuuint32_t)lap,
                              CU_STREAM_WRITE_VALUE_DEFAULT);
    return r == CUDA_SUCCESS ? MMP_OK
                             : mmp_errorf(MMP_ERR_CUDA, "cuda_ipc %s: %s: cuStreamWriteValue32: %d",
                                          ch->name, what, (int)r);
}

/* The credit says the receiver enqueued its last reads of slot i; this makes
 * our stream wait for them on the device, not the host. Laps are 1-based:
 * message k is lap k / slots + 1 of slot k % slots (the ring's counters are
 * read before it moves them). */
static mmp_err hook_acquire(void *ctx, uint32_t i, int reused)
{
    cipc_channel *ch = ctx;
    if (!reused) {
        return MMP_OK;
    }
    if (ch->sync == CIPC_SYNC_MEMOPS) {
        return flag_wait(ch, &ch->freed_f[i], ch->ring.count / ch->slots, "acquire");
    }
    return step(ch, cudaStreamWaitEvent(ch->stream, ch->freed[i], 0),
                "acquire: cudaStreamWaitEvent");
}

/* Recorded before head moves, so the receiver's wait (issued only after it
 * sees head) finds this record, not the previous lap's. */
static mmp_err hook_post(void *ctx, uint32_t i)
{
    cipc_channel *ch = ctx;
    if (ch->sync == CIPC_SYNC_MEMOPS) {
        return flag_write(ch, &ch->ready_f[i], ch->ring.count / ch->slots + 1, "post");
    }
    return step(ch, cudaEventRecord(ch->ready[i], ch->stream), "post: cudaEventRecord");
}

/* The device waits for the sender's writes; the host goes on at once. */
static mmp_err hook_recv(void *ctx, uint32_t i)
{
    cipc_channel *ch = ctx;
    if (ch->sync == CIPC_SYNC_MEMOPS) {
        return flag_wait(ch, &ch->ready_f[i], ch->ring.count / ch->slots + 1, "recv");
    }
    return step(ch, cudaStreamWaitEvent(ch->stream, ch->ready[i], 0), "recv: cudaStreamWaitEvent");
}

/* The receiver's reads of slot i were enqueued on its stream before this. */
static mmp_err hook_release(void *ctx, uint32_t i)
{
    cipc_channel *ch = ctx;
    if (ch->sync == CIPC_SYNC_MEMOPS) {
        return flag_write(ch, &ch->freed_f[i], ch->ring.released / ch->slots + 1, "release");
    }
    return step(ch, cudaEventRecord(ch->freed[i], ch->stream), "release: cudaEventRecord");
}

static const mmp_ring_hooks device_hooks = {
    .acquire = hook_acquire,
    .post = hook_post,
    .recv = hook_recv,
    .release = hook_release,
};

/* ---- geometry ----------------------------------------------------------- */

typedef struct cipc_geometry {
    size_t stride;  /* device bytes per slot */
    size_t device;  /* the creator's allocation: the slots, then the MEMOPS flags */
    size_t msg_off; /* control segment offsets */
    size_t ready_off;
    size_t freed_off;
    size_t total; /* control segment bytes */
} cipc_geometry;

static mmp_err check_cfg(const mmp_channel_cfg *cfg, cipc_geometry *g)
{
    MMP_TRY(mmp_ring_check_cfg("cuda_ipc", cfg, CIPC_MAX_SLOTS));
    if (cfg->device < 0) {
        return mmp_errorf(MMP_ERR_INVALID, "cuda_ipc %s: device %d", cfg->address, cfg->device);
    }
    size_t s = cfg->slot_bytes ? cfg->slot_bytes : 1;
    g->stride = (s + CIPC_ALIGN - 1) / CIPC_ALIGN * CIPC_ALIGN;
    size_t flags = 2 * (size_t)cfg->slots * sizeof(uint32_t);
    g->device = (size_t)cfg->slots * g->stride + (flags + CIPC_ALIGN - 1) / CIPC_ALIGN * CIPC_ALIGN;
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
    ch->map_bytes = g->total;
    ch->dev_bytes = g->device;
    ch->msg_off = g->msg_off;
    ch->ready_off = g->ready_off;
    ch->freed_off = g->freed_off;
    /* No spin before sleeping: the hand-off of a micro-batch is rare next to
     * shm's small messages. */
    mmp_ring_init(&ch->ring, "cuda_ipc", ch->name, cfg, me, 0, &device_hooks, ch);
    ch->sync = CIPC_SYNC_EVENTS; /* the creator chooses (setup), the connector reads it (import) */
    *out = ch;
    return MMP_OK;
}

/* Points ch at its mapped control segment. */
static void point_into(cipc_channel *ch, void *base)
{
    unsigned char *b = base;
    ch->hdr = base;
    ch->ready_h = (cudaIpcEventHandle_t *)(void *)(b + ch->ready_off);
    ch->freed_h = (cudaIpcEventHandle_t *)(void *)(b + ch->freed_off);
    mmp_ring_attach(&ch->ring, &ch->hdr->ring, (mmp_msg_header *)(void *)(b + ch->msg_off));
}

/* Points ch's flag words into its device allocation (after the slots). */
static void point_flags(cipc_channel *ch)
{
    ch->ready_f = (uint32_t *)(void *)(ch->dev + (size_t)ch->slots * ch->stride);
    ch->freed_f = ch->ready_f + ch->slots;
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
        e = ch->ring.me == MMP_RING_CREATOR ? cudaFree(ch->dev) : cudaIpcCloseMemHandle(ch->dev);
        if (e != cudaSuccess) {
            MMP_WARN("cuda_ipc %s: %s: %s", ch->name,
                     ch->ring.me == MMP_RING_CREATOR ? "cudaFree" : "cudaIpcCloseMemHandle",
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
        mmp_segment_unmap(ch->hdr, ch->map_bytes);
    }
    mmp_ring_fini(&ch->ring);
    free(ch->ready); /* ready and freed are one block */
    free(ch);
}

/* ---- the graveyard: closed creators whose connector may still map them --- */

static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;
static cipc_channel *graveyard;

/* 1 while the connector may still use the creator's memory or events. */
static int connector_may_use(cipc_channel *ch)
{
    mmp_ring_shared *sh = &ch->hdr->ring;
    if (atomic_load_explicit(&sh->pid[MMP_RING_CONNECTOR], memory_order_acquire) == 0) {
        return 0;
    }
    if (atomic_load_explicit(&sh->closed[MMP_RING_CONNECTOR], memory_order_acquire)) {
        return 0;
    }
    return !mmp_ring_peer_dead(&ch->ring);
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
    void *base = NULL;
    cudaError_t ce;
    *out = NULL;
    MMP_TRY(check_cfg(cfg, &g));
    sweep();
    MMP_TRY(new_channel(&ch, cfg, &g, MMP_RING_CREATOR));
    mmp_err ret = MMP_OK;
    /* Device resources first: they need no clean-up of a name if they fail. */
    if ((ce = cudaSetDevice(cfg->device)) != cudaSuccess) {
        ret = cuda_fail(ce, cfg->address, "cudaSetDevice");
        goto fail;
    }
    if ((ret = choose_sync(cfg->address, &ch->sync)) != MMP_OK) {
        goto fail;
    }
    if ((ce = cudaMalloc((void **)&ch->dev, g.device)) != cudaSuccess) {
        ch->dev = NULL;
        ret = cuda_fail(ce, cfg->address, "cudaMalloc of the slots");
        goto fail;
    }
    mmp_ring_slots(&ch->ring, ch->dev, ch->stride);
    point_flags(ch);
    /* the flags start at lap 0; the connector's first wait comes after the
     * segment is published, so this is done by then */
    if ((ce = cudaMemset(ch->ready_f, 0, 2 * (size_t)ch->slots * sizeof(uint32_t))) !=
            cudaSuccess ||
        (ce = cudaDeviceSynchronize()) != cudaSuccess) {
        ret = cuda_fail(ce, cfg->address, "cudaMemset of the flags");
        goto fail;
    }
    const unsigned flags = cudaEventDisableTiming | cudaEventInterprocess;
    for (; ch->sync == CIPC_SYNC_EVENTS && ch->n_ready < cfg->slots; ch->n_ready++) {
        if ((ce = cudaEventCreateWithFlags(&ch->ready[ch->n_ready], flags)) != cudaSuccess) {
            ret = cuda_fail(ce, cfg->address, "cudaEventCreateWithFlags");
            goto fail;
        }
    }
    for (; ch->sync == CIPC_SYNC_EVENTS && ch->n_freed < cfg->slots; ch->n_freed++) {
        if ((ce = cudaEventCreateWithFlags(&ch->freed[ch->n_freed], flags)) != cudaSuccess) {
            ret = cuda_fail(ce, cfg->address, "cudaEventCreateWithFlags");
            goto fail;
        }
    }
    ret = mmp_segment_create(&base, "cuda_ipc", ch->name, g.total);
    if (ret != MMP_OK) {
        goto fail;
    }
    point_into(ch, base);     /* ch owns the mapping (and the name) from here */
    cipc_header *h = ch->hdr; /* a fresh segment reads as zeros */
    if ((ce = cudaIpcGetMemHandle(&h->mem, ch->dev)) != cudaSuccess) {
        ret = cuda_fail(ce, cfg->address, "cudaIpcGetMemHandle");
        goto fail;
    }
    for (int i = 0; ch->sync == CIPC_SYNC_EVENTS && i < cfg->slots; i++) {
        if ((ce = cudaIpcGetEventHandle(&ch->ready_h[i], ch->ready[i])) != cudaSuccess ||
            (ce = cudaIpcGetEventHandle(&ch->freed_h[i], ch->freed[i])) != cudaSuccess) {
            ret = cuda_fail(ce, cfg->address, "cudaIpcGetEventHandle");
            goto fail;
        }
    }
    mmp_ring_header_init(&h->g, &ch->ring, CIPC_VERSION, g.stride, g.total);
    h->creator_device = cfg->device;
    h->sync = ch->sync;
    mmp_ring_take_creator(&ch->ring);
    mmp_segment_publish(base, CIPC_MAGIC);
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;

fail:
    if (ch->hdr) {
        /* Not published: nobody attached, so the name is ours to remove. */
        mmp_segment_unlink_once(&ch->hdr->ring.unlinked, ch->name);
    }
    free_channel(ch);
    return ret;
}

/* The creator's header against the connecting end ch (an mmp_segment_check):
 * magic, version, geometry and layout as ch computes them, and opposite
 * directions. */
static mmp_err check_header(void *ctx, const void *header, uint64_t magic, size_t file_bytes)
{
    const cipc_channel *ch = ctx;
    const cipc_header *h = header;
    if (magic != CIPC_MAGIC) {
        /* Most likely the other end picked shm: both ends must agree on
         * cfg.on_gpu and both must see a CUDA device. */
        return mmp_errorf(MMP_ERR_PROTO,
                          "cuda_ipc %s: not a cuda_ipc channel (magic %#llx, want %#llx); does "
                          "the creator set on_gpu and see a CUDA device?",
                          ch->name, (unsigned long long)magic, (unsigned long long)CIPC_MAGIC);
    }
    return mmp_ring_check_header(&ch->ring, &h->g, CIPC_VERSION, ch->stride, ch->map_bytes,
                                 file_bytes);
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
    /* The mapping is the creator's allocation: it must hold what this end's
     * geometry will address (the header's geometry was checked, the handle
     * is another process's word too). */
    pthread_once(&cipc_driver_once, find_driver);
    CUdeviceptr base = 0;
    size_t have = 0;
    if (cipc_range && cipc_range(&base, &have, (CUdeviceptr)(uintptr_t)dev) == CUDA_SUCCESS &&
        (base != (CUdeviceptr)(uintptr_t)dev || have < ch->dev_bytes)) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "cuda_ipc %s: the creator's device memory holds %zu bytes from the "
                          "mapping%s; the channel's geometry needs %zu",
                          ch->name, have,
                          base != (CUdeviceptr)(uintptr_t)dev ? " (not its start)" : "",
                          ch->dev_bytes);
    }
    mmp_ring_slots(&ch->ring, ch->dev, ch->stride);
    point_flags(ch);
    ch->sync = ch->hdr->sync; /* the creator's word: checked before use */
    if (ch->sync == CIPC_SYNC_MEMOPS && !memops_available()) {
        return mmp_errorf(MMP_ERR_UNSUPPORTED,
                          "cuda_ipc %s: the creator signals with stream memory operations, which "
                          "this process's driver lacks",
                          ch->name);
    }
    if (ch->sync != CIPC_SYNC_MEMOPS && ch->sync != CIPC_SYNC_EVENTS) {
        return mmp_errorf(MMP_ERR_PROTO, "cuda_ipc %s: header field sync = %d (want 1 or 2)",
                          ch->name, (int)ch->sync);
    }
    for (; ch->sync == CIPC_SYNC_EVENTS && ch->n_ready < (int)ch->slots; ch->n_ready++) {
        ce = cudaIpcOpenEventHandle(&ch->ready[ch->n_ready], ch->ready_h[ch->n_ready]);
        if (ce != cudaSuccess) {
            return cuda_fail(ce, ch->name, "cudaIpcOpenEventHandle");
        }
    }
    for (; ch->sync == CIPC_SYNC_EVENTS && ch->n_freed < (int)ch->slots; ch->n_freed++) {
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
    void *base = NULL;
    *out = NULL;
    MMP_TRY(check_cfg(cfg, &g));
    sweep();
    MMP_TRY(new_channel(&ch, cfg, &g, MMP_RING_CONNECTOR));
    mmp_err ret = mmp_segment_attach(&base, "cuda_ipc", ch->name, sizeof(cipc_header), g.total,
                                     cfg->timeout_ms, check_header, ch);
    if (ret == MMP_ERR_TIMEOUT) {
        ret = mmp_errorf(MMP_ERR_PEER, "cuda_ipc %s: no ready creator after %d ms", ch->name,
                         cfg->timeout_ms);
    }
    if (ret == MMP_OK) {
        int joined = 0;
        point_into(ch, base);
        ret = mmp_ring_join(&ch->ring, &joined);
        if (!joined) {
            /* Another connector holds the place: the mapping is not ours. */
            ch->hdr = NULL;
            mmp_ring_attach(&ch->ring, NULL, NULL);
            mmp_segment_unmap(base, g.total);
        }
    }
    if (ret == MMP_OK) {
        ret = import_device(ch);
    }
    if (ret != MMP_OK) {
        /* marks closed if joined; never unlinks a creator's name */
        cipc_close((mmp_channel_impl *)(void *)ch);
        return ret;
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

/* mmp_channel_send's copy: stream-ordered; src may be host or device memory
 * (unified addressing). A pageable host src may be reused when this returns
 * (the runtime stages it first); a device src must stay unchanged until the
 * stream has passed the copy. */
static mmp_err cipc_fill(mmp_channel_impl *c, void *slot, const void *src, size_t bytes)
{
    cipc_channel *ch = cipc_of(c);
    return step(ch, cudaMemcpyAsync(slot, src, bytes, cudaMemcpyDefault, ch->stream),
                "send: cudaMemcpyAsync into the slot");
}

/* mmp_channel_read's copy out of a received slot: stream-ordered, after the
 * recv's wait for the sender's writes. Into pageable host memory the runtime
 * returns only once the bytes are there; into device or pinned memory the
 * caller orders its use on the same stream. */
static mmp_err cipc_read(mmp_channel_impl *c, void *dst, const void *src, size_t bytes)
{
    cipc_channel *ch = cipc_of(c);
    return step(ch, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ch->stream),
                "read: cudaMemcpyAsync out of the slot");
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
        mmp_ring_close(&ch->ring);
        if (ch->ring.me == MMP_RING_CREATOR && connector_may_use(ch)) {
            pthread_mutex_lock(&graveyard_lock);
            ch->next = graveyard;
            graveyard = ch;
            pthread_mutex_unlock(&graveyard_lock);
            sweep(); /* others may be done by now */
            return;
        }
    }
    free_channel(ch);
    sweep();
}

const mmp_transport mmp_transport_cuda_ipc = {
    .name = "cuda_ipc",
    .caps = MMP_TRANSPORT_DEVICE_SLOTS,
    .can_connect = cipc_can_connect,
    .setup = cipc_setup,
    .connect = cipc_connect,
    .close = cipc_close,
    MMP_RING_TABLE_ENTRIES, /* acquire, post, recv, release, slot_bytes */
    .fill = cipc_fill,
    .read = cipc_read,
};
