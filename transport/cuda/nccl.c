/* The `nccl` data channel: device-memory slots between two GPU processes on
 * different hosts, the payloads moved by ncclSend/ncclRecv on a 2-rank NCCL
 * communicator of the channel's own, the headers, true payload sizes and
 * credits over a tcp channel (transport/tcp.c) beside it.
 *
 * Rendezvous. The creator (the sending end, as for tcp) listens as a tcp
 * creator on cfg->address ("host:0" from the coordinator), makes an
 * ncclUniqueId and starts its rank's init (rank 0). Its address
 * (mmp_channel_address) is the tcp creator's "host:port" followed by
 * "#nccl:" and the id in hex, and travels as a tcp port does: the
 * Endpoints message to the coordinator, which forwards it to the connector
 * (coord_forward_endpoints). The connector parses and checks it (untrusted:
 * exact length, hex digits), connects the side channel, then inits rank 1.
 * Both communicators are non-blocking (ncclCommInitRankConfig with
 * config.blocking = 0): every NCCL call that returns ncclInProgress is
 * followed by polling ncclCommGetAsyncError until it settles, bounded by
 * cfg->timeout_ms; an error or the bound ends in ncclCommAbort and
 * MMP_ERR_PEER naming what NCCL said. The creator's init completes at its
 * first acquire (it cannot finish before the connector joins). Close waits
 * NC_CLOSE_MS at most in all, then aborts (a dead peer's transfers and
 * ncclCommFinalize never finish).
 *
 * The data path, message k in slot i = k % slots of this end's device slots
 * (cudaMalloc'd once, `slots` x slot_bytes rounded up to 256). The NCCL
 * calls go on a stream of the channel's own ("nccl stream"), never on the
 * caller's cfg->cuda_stream: a send waits on the GPU until its receiver's
 * ncclRecv runs, and on one shared stream two stages sending to each other
 * (activations one way, gradients the other) would each block the stream
 * the other's receive sits behind. Events order the two streams, as
 * cuda_ipc's do across processes:
 *   acquire  the side channel's acquire (blocks for a credit); the caller's
 *            stream waits for sent[i] (lap k - slots' ncclSend out of slot
 *            i done); the slot's device pointer.
 *   fill     cudaMemcpyAsync on the caller's stream (as cuda_ipc).
 *   post     the header with the true size (8 bytes of side-channel payload)
 *            on the side channel, then: the nccl stream waits for the
 *            caller's stream (filled), ncclSend(slot i) on it. The receiver
 *            matches sends in order (one peer, one communicator per channel).
 *            The header goes first: NCCL connects a peer pair at its first
 *            send/recv, and that needs both ends' calls.
 *   recv     the side channel's recv: the header, its size checked against
 *            slot_bytes; the nccl stream waits for freed[i] (the caller's
 *            release of lap k - slots), ncclRecv(slot i), recvd[i] recorded;
 *            the caller's stream waits for recvd[i]: work the caller enqueues
 *            afterwards sees the payload. The host waits only for NCCL to
 *            accept the call (ncclInProgress settling; the first one also
 *            connects), never for the transfer.
 *   read     cudaMemcpyAsync out on the caller's stream; into host memory it
 *            first waits for recvd[i] polling the communicator's error and
 *            the bound (a peer that died mid-transfer must not hang the host).
 *   release  freed[i] recorded on the caller's stream, then the side
 *            channel's release (the credit).
 * A sender's ncclSend is settled (accepted by NCCL, so sent[i] can be
 * recorded after it) at its next acquire or close, not in post: the host
 * moves on while NCCL connects. Ordering, credits, header geometry, peer
 * death and timeouts are the side channel's (tcp.c's contract); a
 * side-channel error aborts the communicator at once, so no NCCL kernel
 * waits on a dead peer.
 *
 * NCCL picks its bootstrap and data interfaces itself (NCCL_SOCKET_IFNAME,
 * NCCL_IB_HCA: the usual environment); the side channel goes where the
 * coordinator's address says.
 *
 * Tested: tests/nccl_mock/test_nccl_mock.c runs this file against
 * stand-ins of the CUDA runtime and NCCL (host memory, a unix socket per
 * communicator): 300 messages each way through 3 slots (bytes, headers,
 * order, STOP), a sender SIGKILLed, a forged size, a creator alone.
 * tests/gpu_nccl.c: address parsing and the connector's timeout (host), the
 * 1-rank communicator's non-blocking init/poll/abort, a creator alone, and
 * two ranks on one GPU refused by NCCL with a named error on both ends.
 * Untested until two GPUs (one host or two): real NCCL moving a payload,
 * the stream/event ordering on devices, peer death mid-transfer (README,
 * Launching on several hosts).
 *
 * Must never: call CUDA or NCCL from can_connect, use an id it did not check,
 * wait on NCCL without a bound, or leave a communicator un-aborted on an
 * error path. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "transport/channel.h"
#include "transport/sock.h"

#define NC_ALIGN 256
#define NC_MAX_SLOTS 256
#define NC_TAG "#nccl:"
/* Close waits this long at most in all (less when cfg.timeout_ms is less)
 * for the channel's NCCL calls to drain and ncclCommFinalize to finish,
 * then aborts the communicator: after a peer died they never finish, and a
 * stage's shutdown or restart must not wait a whole timeout (or forever,
 * timeout_ms 0) per channel. In a clean close there is nothing in flight
 * (the step that sent the last message completed at its receiver). */
#define NC_CLOSE_MS 5000

typedef struct nccl_channel {
    mmp_channel_impl *side; /* the tcp end: headers, sizes, credits */
    ncclComm_t comm;
    int comm_ready; /* init completed */
    int aborted;
    int rank, send, device, slots, timeout_ms;
    size_t slot_bytes, stride;
    char *dev;           /* slots x stride device bytes */
    cudaStream_t stream; /* the caller's (cfg->cuda_stream; NULL: legacy default) */
    cudaStream_t ns;     /* the channel's own, for its NCCL calls */
    cudaEvent_t filled;  /* sender: the caller's writes, recorded in post */
    cudaEvent_t *done;   /* [slots]: sender sent[i], receiver recvd[i] */
    cudaEvent_t *freed;  /* [slots]: receiver, recorded in release */
    int pending;         /* sender: an ncclSend not settled yet, out of slot pending - 1 */
    uint64_t seq;        /* messages acquired (sender) or received (receiver) */
    uint64_t released;   /* receiver: messages released */
    void *side_slot;     /* sender: the side channel's acquired slot */
    double close_by;     /* in close: every wait ends by then (monotonic ms) */
    char address[MMP_ENDPOINT_MAX];
} nccl_channel;

static nccl_channel *nc_of(mmp_channel_impl *c)
{
    return (nccl_channel *)(void *)c;
}

static void nap(void)
{
    struct timespec ts = {0, 100000}; /* 0.1 ms */
    nanosleep(&ts, NULL);
}

/* Aborts and forgets the communicator (no NCCL call touches it after). */
static void nc_abort(nccl_channel *ch)
{
    if (ch->comm && !ch->aborted) {
        ncclCommAbort(ch->comm);
        ch->aborted = 1;
        ch->comm = NULL;
    }
}

static mmp_err gone(const nccl_channel *ch)
{
    return mmp_errorf(MMP_ERR_PEER, "nccl %s: communicator aborted earlier", ch->address);
}

/* An NCCL error as MMP_ERR_PEER, the communicator aborted. */
static mmp_err nccl_fail(nccl_channel *ch, ncclResult_t r, const char *what)
{
    const char *last = ch->comm ? ncclGetLastError(ch->comm) : ncclGetLastError(NULL);
    nc_abort(ch);
    return mmp_errorf(MMP_ERR_PEER, "nccl %s: %s: %s%s%s", ch->address, what, ncclGetErrorString(r),
                      last && *last ? ": " : "", last ? last : "");
}

static mmp_err cuda_fail(const nccl_channel *ch, cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return mmp_errorf(MMP_ERR_IO, "nccl %s: %s: %s", ch->address, what, cudaGetErrorString(e));
}

/* A wait's deadline: cfg.timeout_ms from now (<= 0: none, as channel.h
 * says), and in close no later than close_by. */
static double deadline_of(const nccl_channel *ch)
{
    double d = ch->timeout_ms > 0 ? mmp_sock_now_ms() + ch->timeout_ms : 0;
    return ch->close_by > 0 && (d <= 0 || ch->close_by < d) ? ch->close_by : d;
}

/* The bound a wait that ended at its deadline had, for its message. */
static int bound_ms(const nccl_channel *ch)
{
    return ch->close_by > 0 && (ch->timeout_ms <= 0 || ch->timeout_ms > NC_CLOSE_MS)
               ? NC_CLOSE_MS
               : ch->timeout_ms;
}

/* Polls the communicator until the last call settles (ncclInProgress gone),
 * for at most cfg.timeout_ms (<= 0: no bound, as channel.h says; in close,
 * NC_CLOSE_MS at most). */
static mmp_err settle(nccl_channel *ch, ncclResult_t r, const char *what)
{
    double deadline = deadline_of(ch);
    while (r == ncclInProgress) {
        if (!ch->comm) {
            return gone(ch);
        }
        if (deadline > 0 && mmp_sock_now_ms() > deadline) {
            nc_abort(ch);
            return mmp_errorf(MMP_ERR_PEER, "nccl %s: %s: no progress after %d ms (peer gone?)",
                              ch->address, what, bound_ms(ch));
        }
        nap();
        ncclResult_t st = ncclInProgress;
        ncclResult_t q = ncclCommGetAsyncError(ch->comm, &st);
        r = q != ncclSuccess ? q : st;
    }
    return r == ncclSuccess ? MMP_OK : nccl_fail(ch, r, what);
}

/* The creator's init finishes once the connector joined: first use waits. */
static mmp_err ready(nccl_channel *ch)
{
    if (!ch->comm) {
        return gone(ch);
    }
    if (!ch->comm_ready) {
        MMP_TRY(settle(ch, ncclInProgress, "communicator init"));
        ch->comm_ready = 1;
    }
    return MMP_OK;
}

/* A side-channel error: the peer is gone (or the stream broke): abort so no
 * NCCL kernel waits for it. */
static mmp_err side(nccl_channel *ch, mmp_err e)
{
    if (e != MMP_OK) {
        nc_abort(ch);
    }
    return e;
}

static int nc_can_connect(const mmp_channel_cfg *cfg, const char **why_not)
{
    const char *why = NULL;
    if (!cfg || !cfg->on_gpu) {
        why = "the edge's payloads are in host memory (cfg.on_gpu is 0)";
    } else if (!cfg->address || cfg->address[0] == '/' || !strchr(cfg->address, ':')) {
        why = "address is not \"host:port\" (a POSIX shm name is cuda_ipc's)";
    }
    if (why && why_not) {
        *why_not = why;
    }
    return why == NULL;
}

static mmp_err check_cfg(const mmp_channel_cfg *cfg)
{
    if (!cfg->on_gpu) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl %s: cfg.on_gpu is 0", cfg->address);
    }
    if (cfg->slots < 1 || cfg->slots > NC_MAX_SLOTS || cfg->slot_bytes == 0 ||
        cfg->slot_bytes > ((size_t)1 << 40)) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "nccl %s: %d slots of %zu bytes (1..%d slots, > 0 bytes)", cfg->address,
                          cfg->slots, cfg->slot_bytes, NC_MAX_SLOTS);
    }
    return MMP_OK;
}

static mmp_err new_channel(nccl_channel **out, const mmp_channel_cfg *cfg)
{
    MMP_TRY(check_cfg(cfg));
    nccl_channel *ch = calloc(1, sizeof *ch);
    if (!ch) {
        return mmp_errorf(MMP_ERR_NOMEM, "nccl channel");
    }
    ch->send = cfg->send;
    ch->device = cfg->device;
    ch->slots = cfg->slots;
    ch->timeout_ms = cfg->timeout_ms;
    ch->slot_bytes = cfg->slot_bytes;
    ch->stride = (cfg->slot_bytes + NC_ALIGN - 1) / NC_ALIGN * NC_ALIGN;
    ch->stream = (cudaStream_t)cfg->cuda_stream;
    snprintf(ch->address, sizeof ch->address, "%s", cfg->address);
    *out = ch;
    return MMP_OK;
}

static void nc_close(mmp_channel_impl *c);

/* The side channel's cfg: cfg's address, host memory, one size word a slot. */
static mmp_channel_cfg side_cfg(const mmp_channel_cfg *cfg, const char *address)
{
    mmp_channel_cfg s = *cfg;
    s.address = address;
    s.slot_bytes = sizeof(uint64_t);
    s.on_gpu = 0;
    s.cuda_stream = NULL;
    return s;
}

static mmp_err device_and_slots(nccl_channel *ch)
{
    cudaError_t ce = cudaSetDevice(ch->device);
    if (ce != cudaSuccess) {
        return cuda_fail(ch, ce, "cudaSetDevice");
    }
    ce = cudaMalloc((void **)&ch->dev, ch->stride * (size_t)ch->slots);
    if (ce != cudaSuccess) {
        ch->dev = NULL; /* not cudaFree'd by nc_close, whatever the call left there */
        return cuda_fail(ch, ce, "cudaMalloc of the slots");
    }
    ce = cudaStreamCreateWithFlags(&ch->ns, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        ch->ns = NULL;
        return cuda_fail(ch, ce, "cudaStreamCreate");
    }
    ch->done = calloc((size_t)ch->slots, sizeof *ch->done);
    ch->freed = calloc((size_t)ch->slots, sizeof *ch->freed);
    if (!ch->done || !ch->freed) {
        return mmp_errorf(MMP_ERR_NOMEM, "nccl %s: events", ch->address);
    }
    unsigned fl = cudaEventDisableTiming;
    ce = cudaEventCreateWithFlags(&ch->filled, fl);
    for (int i = 0; ce == cudaSuccess && i < ch->slots; i++) {
        ce = cudaEventCreateWithFlags(&ch->done[i], fl);
        ce = ce == cudaSuccess ? cudaEventCreateWithFlags(&ch->freed[i], fl) : ce;
    }
    return ce == cudaSuccess ? MMP_OK : cuda_fail(ch, ce, "cudaEventCreate");
}

static mmp_err cuda_step(nccl_channel *ch, cudaError_t ce, const char *what)
{
    return ce == cudaSuccess ? MMP_OK : cuda_fail(ch, ce, what);
}

static size_t slot_index(const nccl_channel *ch, uint64_t k)
{
    return (size_t)(k % (uint64_t)ch->slots);
}

/* Sender: the last ncclSend accepted by NCCL (its kernel on the nccl
 * stream), then sent[its slot] recorded after it. */
static mmp_err settle_send(nccl_channel *ch)
{
    if (!ch->pending) {
        return MMP_OK;
    }
    size_t i = (size_t)ch->pending - 1;
    ch->pending = 0;
    MMP_TRY(settle(ch, ncclInProgress, "ncclSend"));
    return cuda_step(ch, cudaEventRecord(ch->done[i], ch->ns), "cudaEventRecord after ncclSend");
}

static mmp_err init_rank(nccl_channel *ch, const ncclUniqueId *id)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&ch->comm, 2, *id, ch->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        return nccl_fail(ch, r, "ncclCommInitRankConfig");
    }
    ch->comm_ready = r == ncclSuccess;
    return MMP_OK;
}

static mmp_err nc_setup(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    *out = NULL;
    nccl_channel *ch;
    MMP_TRY(new_channel(&ch, cfg));
    ch->rank = 0;
    mmp_channel_cfg s = side_cfg(cfg, cfg->address);
    mmp_err e = mmp_transport_tcp.setup(&ch->side, &s);
    e = e == MMP_OK ? device_and_slots(ch) : e;
    ncclUniqueId id;
    if (e == MMP_OK) {
        ncclResult_t r = ncclGetUniqueId(&id);
        e = r == ncclSuccess ? MMP_OK : nccl_fail(ch, r, "ncclGetUniqueId");
    }
    if (e == MMP_OK) {
        const char *where = mmp_transport_tcp.address(ch->side);
        size_t n = (size_t)snprintf(ch->address, sizeof ch->address, "%s%s", where, NC_TAG);
        if (n + 2 * sizeof id.internal >= sizeof ch->address) {
            e = mmp_errorf(MMP_ERR_INVALID, "nccl: address '%s' too long", where);
        }
        for (size_t i = 0; e == MMP_OK && i < sizeof id.internal; i++) {
            snprintf(ch->address + n + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
        }
    }
    e = e == MMP_OK ? init_rank(ch, &id) : e;
    if (e != MMP_OK) {
        nc_close((mmp_channel_impl *)(void *)ch);
        return mmp_error_prefix(e, "nccl %s", cfg->address);
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

static mmp_err nc_connect(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    *out = NULL;
    char host_port[MMP_ENDPOINT_MAX];
    ncclUniqueId id;
    MMP_TRY(mmp_nccl_parse_address(cfg->address, host_port, sizeof host_port, id.internal));
    nccl_channel *ch;
    MMP_TRY(new_channel(&ch, cfg));
    snprintf(ch->address, sizeof ch->address, "%s", host_port);
    ch->rank = 1;
    mmp_channel_cfg s = side_cfg(cfg, host_port);
    mmp_err e = mmp_transport_tcp.connect(&ch->side, &s);
    e = e == MMP_OK ? device_and_slots(ch) : e;
    e = e == MMP_OK ? init_rank(ch, &id) : e;
    e = e == MMP_OK ? ready(ch) : e;
    if (e != MMP_OK) {
        nc_close((mmp_channel_impl *)(void *)ch);
        return e;
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

static void *slot_at(const nccl_channel *ch, uint64_t k)
{
    return ch->dev + slot_index(ch, k) * ch->stride;
}

static mmp_err nc_acquire(mmp_channel_impl *c, void **payload)
{
    nccl_channel *ch = nc_of(c);
    MMP_TRY(ready(ch));
    MMP_TRY(settle_send(ch));
    MMP_TRY(side(ch, mmp_transport_tcp.acquire(ch->side, &ch->side_slot)));
    MMP_TRY(cuda_step(ch, cudaStreamWaitEvent(ch->stream, ch->done[slot_index(ch, ch->seq)], 0),
                      "acquire: cudaStreamWaitEvent on the slot's last send"));
    *payload = slot_at(ch, ch->seq);
    return MMP_OK;
}

static mmp_err nc_post(mmp_channel_impl *c, const mmp_msg_header *h)
{
    nccl_channel *ch = nc_of(c);
    int stop = (h->flags & MMP_MSG_STOP) != 0;
    uint64_t bytes = stop ? 0 : h->bytes;
    /* As ring.c's and tcp.c's post: the side channel carries a size word,
     * not the payload, so its own checks see neither of these. */
    if (!ch->side_slot) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl %s: post without an acquired slot", ch->address);
    }
    if (bytes > ch->slot_bytes) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl %s: post of %llu bytes into %zu-byte slots",
                          ch->address, (unsigned long long)bytes, ch->slot_bytes);
    }
    mmp_msg_header s = *h;
    s.bytes = 0; /* STOP: no size word (a STOP carries no payload, tcp checks it) */
    if (!stop) {
        memcpy(ch->side_slot, &bytes, sizeof bytes);
        s.bytes = sizeof bytes;
    }
    MMP_TRY(side(ch, mmp_transport_tcp.post(ch->side, &s)));
    ch->side_slot = NULL;
    uint64_t k = ch->seq++;
    if (bytes == 0) {
        return MMP_OK;
    }
    MMP_TRY(settle_send(ch)); /* one NCCL call in flight per communicator */
    if (!ch->comm) {
        return gone(ch);
    }
    MMP_TRY(cuda_step(ch, cudaEventRecord(ch->filled, ch->stream), "post: cudaEventRecord"));
    MMP_TRY(cuda_step(ch, cudaStreamWaitEvent(ch->ns, ch->filled, 0), "post: cudaStreamWaitEvent"));
    ncclResult_t r =
        ncclSend(slot_at(ch, k), (size_t)bytes, ncclUint8, 1 - ch->rank, ch->comm, ch->ns);
    if (r == ncclInProgress) {
        ch->pending = (int)slot_index(ch, k) + 1; /* settled at the next acquire or close */
        return MMP_OK;
    }
    if (r != ncclSuccess) {
        return nccl_fail(ch, r, "ncclSend");
    }
    return cuda_step(ch, cudaEventRecord(ch->done[slot_index(ch, k)], ch->ns),
                     "cudaEventRecord after ncclSend");
}

static mmp_err nc_recv(mmp_channel_impl *c, mmp_msg_header *h, const void **payload)
{
    nccl_channel *ch = nc_of(c);
    MMP_TRY(ready(ch));
    const void *p;
    MMP_TRY(side(ch, mmp_transport_tcp.recv(ch->side, h, &p)));
    uint64_t bytes;
    if (h->flags & MMP_MSG_STOP) {
        *payload = p; /* no payload (tcp checked bytes = 0) */
        ch->seq++;
        return MMP_OK;
    }
    if (h->bytes != sizeof bytes) {
        return side(ch, mmp_errorf(MMP_ERR_PROTO,
                                   "nccl %s: side-channel message of %llu bytes, not the %zu of "
                                   "a size word",
                                   ch->address, (unsigned long long)h->bytes, sizeof bytes));
    }
    memcpy(&bytes, p, sizeof bytes);
    if (bytes > ch->slot_bytes) {
        return side(ch,
                    mmp_errorf(MMP_ERR_PROTO, "nccl %s: message of %llu bytes in %zu-byte slots",
                               ch->address, (unsigned long long)bytes, ch->slot_bytes));
    }
    h->bytes = bytes;
    uint64_t k = ch->seq++;
    size_t i = slot_index(ch, k);
    if (bytes > 0) {
        if (!ch->comm) {
            return gone(ch);
        }
        MMP_TRY(cuda_step(ch, cudaStreamWaitEvent(ch->ns, ch->freed[i], 0),
                          "recv: cudaStreamWaitEvent on the slot's release"));
        ncclResult_t r =
            ncclRecv(slot_at(ch, k), (size_t)bytes, ncclUint8, 1 - ch->rank, ch->comm, ch->ns);
        MMP_TRY(settle(ch, r, "ncclRecv"));
        MMP_TRY(cuda_step(ch, cudaEventRecord(ch->done[i], ch->ns), "recv: cudaEventRecord"));
        MMP_TRY(cuda_step(ch, cudaStreamWaitEvent(ch->stream, ch->done[i], 0),
                          "recv: cudaStreamWaitEvent on the ncclRecv"));
    }
    *payload = slot_at(ch, k);
    return MMP_OK;
}

static mmp_err nc_release(mmp_channel_impl *c)
{
    nccl_channel *ch = nc_of(c);
    size_t i = slot_index(ch, ch->released++);
    MMP_TRY(cuda_step(ch, cudaEventRecord(ch->freed[i], ch->stream), "release: cudaEventRecord"));
    return side(ch, mmp_transport_tcp.release(ch->side));
}

static size_t nc_slot_bytes(const mmp_channel_impl *c)
{
    return ((const nccl_channel *)(const void *)c)->slot_bytes;
}

static mmp_err nc_fill(mmp_channel_impl *c, void *dst, const void *src, size_t bytes)
{
    nccl_channel *ch = nc_of(c);
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ch->stream);
    return ce == cudaSuccess ? MMP_OK : cuda_fail(ch, ce, "send: cudaMemcpyAsync into the slot");
}

/* Waits for event ev (an NCCL call on the nccl stream before it), polling
 * the communicator: bounded, so a peer that died mid-transfer ends in
 * MMP_ERR_PEER rather than a hung host. */
static mmp_err wait_event(nccl_channel *ch, cudaEvent_t ev, const char *what)
{
    double deadline = deadline_of(ch);
    for (;;) {
        if (!ch->comm) {
            return gone(ch);
        }
        cudaError_t ce = ev ? cudaEventQuery(ev) : cudaStreamQuery(ch->ns);
        if (ce == cudaSuccess) {
            return MMP_OK;
        }
        if (ce != cudaErrorNotReady) {
            return cuda_fail(ch, ce, what);
        }
        ncclResult_t st = ncclSuccess, q = ncclCommGetAsyncError(ch->comm, &st);
        if (q != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            return nccl_fail(ch, q != ncclSuccess ? q : st, what);
        }
        if (deadline > 0 && mmp_sock_now_ms() > deadline) {
            nc_abort(ch);
            return mmp_errorf(MMP_ERR_PEER, "nccl %s: %s: not done after %d ms", ch->address, what,
                              bound_ms(ch));
        }
        nap();
    }
}

static mmp_err nc_read(mmp_channel_impl *c, void *dst, const void *src, size_t bytes)
{
    nccl_channel *ch = nc_of(c);
    struct cudaPointerAttributes at;
    int host = cudaPointerGetAttributes(&at, dst) != cudaSuccess || at.type != cudaMemoryTypeDevice;
    (void)cudaGetLastError();
    size_t off = (size_t)((const char *)src - ch->dev);
    if (host && off < ch->stride * (size_t)ch->slots) {
        MMP_TRY(wait_event(ch, ch->done[off / ch->stride], "read: the payload's ncclRecv"));
    }
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ch->stream);
    return ce == cudaSuccess ? MMP_OK : cuda_fail(ch, ce, "read: cudaMemcpyAsync out of the slot");
}

static const char *nc_address(const mmp_channel_impl *c)
{
    return ((const nccl_channel *)(const void *)c)->address;
}

/* Closes the side channel (the peer sees MMP_ERR_PEER once drained), ends
 * the communicator (finalize and destroy when its stream drained and the
 * finalize finished within NC_CLOSE_MS in all, else abort, logged) and
 * frees the slots, events and stream. NULL is a no-op. */
static void nc_close(mmp_channel_impl *c)
{
    nccl_channel *ch = nc_of(c);
    if (!ch) {
        return;
    }
    if (ch->comm && !ch->aborted) {
        ch->close_by = mmp_sock_now_ms() + NC_CLOSE_MS;
        if (!ch->comm_ready || settle_send(ch) != MMP_OK ||
            wait_event(ch, NULL, "close: the channel's NCCL calls") != MMP_OK ||
            settle(ch, ncclCommFinalize(ch->comm), "ncclCommFinalize") != MMP_OK) {
            if (ch->comm_ready) {
                MMP_WARN("%s; communicator aborted at close", mmp_last_error());
            }
            nc_abort(ch);
        } else {
            ncclCommDestroy(ch->comm);
        }
    }
    mmp_transport_tcp.close(ch->side);
    if (ch->ns) {
        cudaStreamSynchronize(ch->stream); /* the caller's copies out of the slots */
        cudaStreamSynchronize(ch->ns);     /* returns at once after an abort or a drain */
        cudaStreamDestroy(ch->ns);
    }
    for (int i = 0; i < ch->slots; i++) {
        if (ch->done && ch->done[i]) {
            cudaEventDestroy(ch->done[i]);
        }
        if (ch->freed && ch->freed[i]) {
            cudaEventDestroy(ch->freed[i]);
        }
    }
    if (ch->filled) {
        cudaEventDestroy(ch->filled);
    }
    free(ch->done);
    free(ch->freed);
    if (ch->dev) {
        cudaFree(ch->dev);
    }
    (void)cudaGetLastError();
    free(ch);
}

const mmp_transport mmp_transport_nccl = {
    .name = "nccl",
    .caps = MMP_TRANSPORT_DEVICE_SLOTS | MMP_TRANSPORT_NETWORK,
    .can_connect = nc_can_connect,
    .setup = nc_setup,
    .connect = nc_connect,
    .acquire = nc_acquire,
    .post = nc_post,
    .recv = nc_recv,
    .release = nc_release,
    .close = nc_close,
    .slot_bytes = nc_slot_bytes,
    .fill = nc_fill,
    .read = nc_read,
    .address = nc_address,
};
