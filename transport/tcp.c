/* The `tcp` data channel: the shm channel's contract (credits, in-order
 * delivery, checked headers, STOP, peer death and timeouts as MMP_ERR_PEER)
 * over one TCP connection, for two processes on different hosts (or forced
 * on one host for tests and benchmarks). The wire is transport/tcp.h's.
 *
 * Rendezvous: the creator listens on cfg->address ("host:port"; port 0 binds
 * a free port) and mmp_channel_address() reports where (host as given, the
 * real port): whoever placed the two ends forwards that to the connector,
 * which connects, retrying a refused port until timeout_ms. setup never
 * blocks: a thread of the creator accepts and checks connectors (a refused
 * one is told why and the creator listens on), so a connector is answered
 * even while its creator's process waits elsewhere; it serves every pending
 * connection at once (transport/auth.h's gate), so connections that open the
 * port and say nothing do not hold up the real one. Before its hello, every
 * connector proves it holds the job's secret and checks that the creator
 * does (transport/auth.h): a process of another job, or none, is refused
 * and logged before a byte of the channel crosses.
 *
 * Both ends own `slots` payload buffers of slot_bytes (64-byte aligned); a
 * message travels from the sender's slot (writev of header and payload: no
 * copy in user space) into the receiver's slot k % slots (recv straight into
 * it). The receiving end has a thread that reads messages as they arrive,
 * whatever the receiver's process is doing: a sender therefore never waits on
 * a busy receiver beyond its credits, and two stages sending to each other
 * cannot block each other in the socket. The credits (one uint64 per
 * release) flow back on the same connection and are read by the sender in
 * acquire.
 *
 * A dead or closed peer is an EOF or a reset on the socket; a silent one (a
 * host gone) is the channel's timeout, and keepalive (sock.c) for ends that
 * wait forever. Messages that arrived before the sender closed or died are
 * delivered before MMP_ERR_PEER. A protocol error (a forged header, a message
 * without a credit) breaks the stream: every later call reports it.
 *
 * Must never: trust a byte from the socket before checking it, let a
 * message land in a slot the receiver still holds, block without a deadline
 * check, or close a sending socket with bytes unsent (sock.c closes it
 * gracefully). */

#include "transport/tcp.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "transport/auth.h"
#include "transport/channel.h"
#include "transport/sock.h"

#define TCP_ALIGN 64
#define TCP_MAX_SLOTS 4096
#define MMP_TCP_SECRET_MAX 256
/* How long the creator waits for a connector's handshake and hello before
 * dropping it (each connector its own wait, transport/auth.h's gate). */
#define HELLO_MS 5000
/* A receiver polls for the next message this long before sleeping (ns), as
 * the shm channel does (transport/shm.c has the measurements). Measured here
 * (bench_transport --only tcp, 64-byte ping-pong, loaded 2-core VM): 2 µs
 * 10.5 µs one way, 30 µs 22 µs (the spinning stage takes the core its own
 * receiving thread needs). Build with -DMMP_TCP_SPIN_NS=... to try another. */
#ifndef MMP_TCP_SPIN_NS
#define MMP_TCP_SPIN_NS 2000
#endif

typedef struct tcp_channel {
    char address[MMP_SOCK_ADDR_MAX]; /* creator: where it listens (real port); else cfg's */
    char peer[MMP_SOCK_ADDR_MAX];    /* the other end, once connected */
    char what[2 * MMP_SOCK_ADDR_MAX + 32];
    char secret[MMP_TCP_SECRET_MAX]; /* the job's (cfg's, copied: the creator's thread uses it) */
    int creator, send, timeout_ms;
    uint32_t slots;
    size_t slot_bytes, stride;
    unsigned char *buf; /* slots * stride */
    int lfd, fd, stop_fd;
    pthread_t thread;
    int has_thread;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Under mu (the thread writes them). */
    _Atomic int connected; /* set once (release) after fd, peer and what are final */
    int failed;            /* the thread stopped on an error, delivered after err_at messages */
    mmp_err err;           /* its code */
    uint64_t err_at;       /* receiver: messages that arrived before the error */
    char err_msg[1024];
    /* Receiver. */
    _Atomic uint64_t head;     /* messages fully arrived (the thread) */
    _Atomic uint64_t released; /* messages released (the app) */
    mmp_msg_header *hdr;       /* one per slot, written by the thread before head moves */
    /* The app's own. */
    uint64_t count; /* sender: posted; receiver: received */
    uint64_t tail;  /* sender: the credit count received */
    int acquired;
    unsigned char credit[8];
    size_t credit_have;
} tcp_channel;

static tcp_channel *tcp_of(mmp_channel_impl *c)
{
    return (tcp_channel *)(void *)c;
}

static const char *who(const tcp_channel *ch)
{
    return ch->send ? "receiving" : "sending";
}

/* ---- set-up --------------------------------------------------------------- */

static int tcp_can_connect(const mmp_channel_cfg *cfg, const char **why_not)
{
    char host[256];
    int port = 0;
    if (!cfg || !cfg->address || cfg->address[0] == '/' ||
        mmp_sock_parse("tcp", cfg->address, host, sizeof host, &port) != MMP_OK) {
        if (why_not) {
            *why_not = "address is not host:port";
        }
        return 0;
    }
    if (cfg->on_gpu) {
        if (why_not) {
            *why_not = "the slots are device memory (tcp carries host memory)";
        }
        return 0;
    }
    return 1;
}

static void set_what(tcp_channel *ch)
{
    if (ch->peer[0] && ch->creator) {
        /* a connector's peer is its address */
        snprintf(ch->what, sizeof ch->what, "tcp %s (its %s end at %s)", ch->address, who(ch),
                 ch->peer);
    } else {
        snprintf(ch->what, sizeof ch->what, "tcp %s", ch->address);
    }
}

static mmp_err new_channel(tcp_channel **out, const mmp_channel_cfg *cfg, int creator)
{
    *out = NULL;
    const char *a = cfg && cfg->address ? cfg->address : "(null)";
    char host[256];
    int port = 0;
    MMP_TRY(mmp_sock_parse("tcp", a, host, sizeof host, &port));
    if (cfg->slots < 1 || cfg->slots > TCP_MAX_SLOTS) {
        return mmp_errorf(MMP_ERR_INVALID, "tcp %s: slots %d not in 1..%d", a, cfg->slots,
                          TCP_MAX_SLOTS);
    }
    if (cfg->slot_bytes > ((size_t)1 << 40)) {
        return mmp_errorf(MMP_ERR_INVALID, "tcp %s: slot_bytes %zu is absurd", a, cfg->slot_bytes);
    }
    if (!cfg->secret || !cfg->secret[0] || strlen(cfg->secret) >= MMP_TCP_SECRET_MAX) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "tcp %s: the job's secret is missing or longer than %d bytes (every "
                          "tcp connection is authenticated with it)",
                          a, MMP_TCP_SECRET_MAX - 1);
    }
    tcp_channel *ch = calloc(1, sizeof *ch);
    if (!ch) {
        return mmp_errorf(MMP_ERR_NOMEM, "tcp %s: channel", a);
    }
    snprintf(ch->address, sizeof ch->address, "%s", a);
    snprintf(ch->secret, sizeof ch->secret, "%s", cfg->secret);
    ch->creator = creator;
    ch->send = cfg->send != 0;
    ch->timeout_ms = cfg->timeout_ms;
    ch->slots = (uint32_t)cfg->slots;
    ch->slot_bytes = cfg->slot_bytes;
    ch->stride = (cfg->slot_bytes + TCP_ALIGN - 1) / TCP_ALIGN * TCP_ALIGN;
    ch->lfd = ch->fd = ch->stop_fd = -1;
    pthread_mutex_init(&ch->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ch->cv, &ca);
    pthread_condattr_destroy(&ca);
    set_what(ch);
    size_t total = (size_t)ch->slots * (ch->stride ? ch->stride : TCP_ALIGN);
    ch->buf = aligned_alloc(TCP_ALIGN, total);
    ch->hdr = calloc(ch->slots, sizeof *ch->hdr);
    ch->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    *out = ch;
    if (!ch->buf || !ch->hdr) {
        return mmp_errorf(MMP_ERR_NOMEM, "tcp %s: %u slots of %zu bytes", a, ch->slots,
                          ch->slot_bytes);
    }
    if (ch->stop_fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "tcp %s: eventfd: %s", a, strerror(errno));
    }
    return MMP_OK;
}

static void tcp_close(mmp_channel_impl *c);

/* The thread's failure: kept for the app, which reports it once the
 * messages before it are delivered. */
static void fail(tcp_channel *ch, mmp_err e, uint64_t at)
{
    pthread_mutex_lock(&ch->mu);
    if (!ch->failed) {
        ch->failed = 1;
        ch->err = e;
        ch->err_at = at;
        snprintf(ch->err_msg, sizeof ch->err_msg, "%s", mmp_last_error());
    }
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
}

/* The receiving loop (the thread of a receiving end): message k into slot
 * k % slots, checked, then head = k + 1. */
static void receive_loop(tcp_channel *ch)
{
    for (uint64_t k = 0;; k++) {
        mmp_msg_header h;
        size_t got = 0;
        mmp_err e = mmp_sock_read(ch->fd, ch->what, &h, sizeof h, 0, ch->stop_fd, &got);
        if (e == MMP_ERR_TIMEOUT) {
            return; /* stopped by close */
        }
        if (e != MMP_OK) {
            if (got == 0 && e == MMP_ERR_PEER && strstr(mmp_last_error(), "closed")) {
                mmp_errorf(MMP_ERR_PEER,
                           "%s: the sending end closed the connection (it exited or died)",
                           ch->what);
            }
            fail(ch, e, k);
            return;
        }
        char what[sizeof ch->what + 32];
        snprintf(what, sizeof what, "%s message %llu", ch->what, (unsigned long long)k);
        e = mmp_msg_check(what, &h, ch->slot_bytes);
        uint64_t released = atomic_load_explicit(&ch->released, memory_order_acquire);
        if (e == MMP_OK && k >= released + ch->slots) {
            e = mmp_errorf(
                MMP_ERR_PROTO, "%s: message %llu came without a credit (%u slots, %llu released)",
                ch->what, (unsigned long long)k, ch->slots, (unsigned long long)released);
        }
        if (e != MMP_OK) {
            fail(ch, e, k);
            return;
        }
        uint32_t i = (uint32_t)(k % ch->slots);
        e = mmp_sock_read(ch->fd, what, ch->buf + (size_t)i * ch->stride, (size_t)h.bytes, 0,
                          ch->stop_fd, NULL);
        if (e == MMP_ERR_TIMEOUT) {
            return;
        }
        if (e != MMP_OK) {
            fail(ch, e, k);
            return;
        }
        ch->hdr[i] = h;
        pthread_mutex_lock(&ch->mu);
        atomic_store_explicit(&ch->head, k + 1, memory_order_release);
        pthread_cond_broadcast(&ch->cv);
        pthread_mutex_unlock(&ch->mu);
    }
}

/* A connector's hello against this creator: MMP_TCP_OK or the reason. */
static int judge(const tcp_channel *ch, const mmp_tcp_hello *h)
{
    if (h->version != MMP_TCP_VERSION) {
        return MMP_TCP_VERSION_MISMATCH;
    }
    if (h->slots != ch->slots || h->slot_bytes != ch->slot_bytes) {
        return MMP_TCP_GEOMETRY;
    }
    if ((h->sends != 0) == ch->send) {
        return MMP_TCP_DIRECTION;
    }
    return MMP_TCP_OK;
}

static mmp_tcp_hello my_hello(const tcp_channel *ch, int status)
{
    return (mmp_tcp_hello){.magic = MMP_TCP_MAGIC,
                           .version = MMP_TCP_VERSION,
                           .slots = ch->slots,
                           .slot_bytes = ch->slot_bytes,
                           .sends = ch->send,
                           .status = status};
}

/* The gate's judge (transport/auth.h) of an authenticated connector's hello. */
static int judge_hello(void *ctx, const void *hello, void *reply, const char **why)
{
    const tcp_channel *ch = ctx;
    mmp_tcp_hello h;
    memcpy(&h, hello, sizeof h);
    if (h.magic != MMP_TCP_MAGIC) {
        *why = "not an mmpipe tcp channel (magic)";
        return -1;
    }
    int status = judge(ch, &h);
    mmp_tcp_hello mine = my_hello(ch, status);
    memcpy(reply, &mine, sizeof mine);
    *why = status == MMP_TCP_GEOMETRY    ? "geometry differs"
           : status == MMP_TCP_DIRECTION ? "both ends have the same direction"
                                         : "version differs";
    return status;
}

/* The creator's thread: takes connectors through the job-key gate (all of
 * them at once, each with its own HELLO_MS: a silent stranger does not hold
 * up the real connector behind it) until one's hello fits, answering every
 * one; then, on a receiving end, receives. */
static void *creator_thread(void *arg)
{
    tcp_channel *ch = arg;
    mmp_auth_gate *gate = NULL;
    mmp_err e = mmp_auth_gate_create(&gate, ch->lfd, ch->what, ch->secret, sizeof(mmp_tcp_hello),
                                     sizeof(mmp_tcp_hello), HELLO_MS, judge_hello, ch);
    int fd = -1;
    char peer[MMP_SOCK_ADDR_MAX];
    mmp_tcp_hello h;
    if (e == MMP_OK) {
        e = mmp_auth_gate_next(gate, ch->stop_fd, &fd, peer, sizeof peer, &h);
    }
    if (e != MMP_OK) {
        mmp_auth_gate_destroy(gate, NULL);
        if (e != MMP_ERR_TIMEOUT) { /* MMP_ERR_TIMEOUT: stopped by close */
            fail(ch, e, 0);
        }
        return NULL;
    }
    /* One connector per channel: later ones are refused by the kernel, and
     * those still in the handshake now. */
    mmp_auth_gate_destroy(gate, "the channel has its connector");
    close(ch->lfd);
    ch->lfd = -1;
    pthread_mutex_lock(&ch->mu);
    ch->fd = fd;
    snprintf(ch->peer, sizeof ch->peer, "%s", peer);
    set_what(ch);
    atomic_store_explicit(&ch->connected, 1, memory_order_release);
    pthread_cond_broadcast(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
    if (!ch->send) {
        receive_loop(ch);
    }
    return NULL;
}

static void *receiver_thread(void *arg)
{
    receive_loop(arg);
    return NULL;
}

static mmp_err start_thread(tcp_channel *ch, void *(*fn)(void *))
{
    int r = pthread_create(&ch->thread, NULL, fn, ch);
    if (r != 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: thread: %s", ch->what, strerror(r));
    }
    ch->has_thread = 1;
    return MMP_OK;
}

static mmp_err tcp_setup(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    tcp_channel *ch = NULL;
    *out = NULL;
    mmp_err ret = new_channel(&ch, cfg, 1);
    if (ret == MMP_OK) {
        char bound[MMP_SOCK_ADDR_MAX];
        ret = mmp_sock_listen(&ch->lfd, "tcp", cfg->address, bound, sizeof bound);
        if (ret == MMP_OK) {
            snprintf(ch->address, sizeof ch->address, "%s", bound);
            set_what(ch);
            ret = start_thread(ch, creator_thread);
        }
    }
    if (ret != MMP_OK) {
        tcp_close((mmp_channel_impl *)(void *)ch);
        return ret;
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

static const char *status_text(int s)
{
    switch (s) {
    case MMP_TCP_GEOMETRY:
        return "geometry mismatch";
    case MMP_TCP_DIRECTION:
        return "direction mismatch";
    case MMP_TCP_VERSION_MISMATCH:
        return "version mismatch";
    default:
        return "refused";
    }
}

static mmp_err handshake(tcp_channel *ch, double deadline)
{
    mmp_tcp_hello mine = my_hello(ch, 0), theirs;
    mmp_err e = mmp_auth_handshake(ch->fd, ch->what, ch->secret, 1, deadline, -1);
    if (e == MMP_ERR_TIMEOUT) {
        return mmp_errorf(MMP_ERR_PEER, "%s: the creator did not answer in %d ms", ch->what,
                          ch->timeout_ms);
    }
    if (e == MMP_ERR_PEER) {
        return mmp_errorf(MMP_ERR_PEER,
                          "%s: the creator closed the connection during the job-key handshake "
                          "(it refused this end: see its log)",
                          ch->what);
    }
    MMP_TRY(e);
    struct iovec iov = {&mine, sizeof mine};
    MMP_TRY(mmp_sock_writev(ch->fd, ch->what, &iov, 1, deadline, -1));
    e = mmp_sock_read(ch->fd, ch->what, &theirs, sizeof theirs, deadline, -1, NULL);
    if (e == MMP_ERR_TIMEOUT) {
        return mmp_errorf(MMP_ERR_PEER, "%s: the creator did not answer in %d ms", ch->what,
                          ch->timeout_ms);
    }
    MMP_TRY(e);
    if (theirs.magic != MMP_TCP_MAGIC) {
        return mmp_errorf(MMP_ERR_PROTO, "%s: not an mmpipe tcp channel (magic %#llx, want %#llx)",
                          ch->what, (unsigned long long)theirs.magic,
                          (unsigned long long)MMP_TCP_MAGIC);
    }
    if (theirs.status != MMP_TCP_OK || theirs.version != MMP_TCP_VERSION ||
        theirs.slots != ch->slots || theirs.slot_bytes != ch->slot_bytes ||
        (theirs.sends != 0) == ch->send) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "%s: %s: the creator has version %u, %u slots of %llu bytes and %s; "
                          "this end has version %u, expects %u slots of %zu bytes and %s",
                          ch->what, status_text(theirs.status), theirs.version, theirs.slots,
                          (unsigned long long)theirs.slot_bytes,
                          theirs.sends ? "sends" : "receives", MMP_TCP_VERSION, ch->slots,
                          ch->slot_bytes, ch->send ? "sends" : "receives");
    }
    return MMP_OK;
}

static mmp_err tcp_connect(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    tcp_channel *ch = NULL;
    *out = NULL;
    mmp_err ret = new_channel(&ch, cfg, 0);
    double deadline = mmp_sock_deadline(cfg->timeout_ms);
    if (ret == MMP_OK) {
        ret = mmp_sock_connect(&ch->fd, ch->what, cfg->address, deadline);
    }
    if (ret == MMP_OK) {
        snprintf(ch->peer, sizeof ch->peer, "%s", cfg->address);
        ret = handshake(ch, deadline);
    }
    if (ret == MMP_OK) {
        atomic_store_explicit(&ch->connected, 1, memory_order_release);
        set_what(ch);
        if (!ch->send) {
            ret = start_thread(ch, receiver_thread);
        }
    }
    if (ret != MMP_OK) {
        tcp_close((mmp_channel_impl *)(void *)ch);
        return ret;
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

/* ---- waiting -------------------------------------------------------------- */

static void abs_time(struct timespec *ts, double deadline_ms)
{
    ts->tv_sec = (time_t)(deadline_ms / 1e3);
    ts->tv_nsec = (long)((deadline_ms - (double)ts->tv_sec * 1e3) * 1e6);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* One wait on cv (under mu) that ends by deadline (<= 0: none); 0 once the
 * deadline passed. */
static int cv_wait(tcp_channel *ch, double deadline)
{
    if (deadline <= 0) {
        pthread_cond_wait(&ch->cv, &ch->mu);
        return 1;
    }
    struct timespec ts;
    abs_time(&ts, deadline);
    return pthread_cond_timedwait(&ch->cv, &ch->mu, &ts) != ETIMEDOUT;
}

/* Waits (under mu) for the creator's connector; MMP_ERR_PEER at the deadline
 * or when the accepting thread failed. */
static mmp_err wait_connected(tcp_channel *ch, double deadline)
{
    if (atomic_load_explicit(&ch->connected, memory_order_acquire)) {
        return MMP_OK;
    }
    mmp_err e = MMP_OK;
    pthread_mutex_lock(&ch->mu);
    while (!atomic_load(&ch->connected) && !ch->failed && cv_wait(ch, deadline)) {
    }
    if (!atomic_load(&ch->connected)) {
        e = ch->failed
                ? mmp_errorf(ch->err, "%s", ch->err_msg)
                : mmp_errorf(MMP_ERR_PEER, "%s: no connector in %d ms", ch->what, ch->timeout_ms);
    }
    pthread_mutex_unlock(&ch->mu);
    return e;
}

/* ---- the sending half ----------------------------------------------------- */

/* Reads the credits that arrived (waiting until the deadline when `want` is
 * more than the credits so far; deadline < 0: no wait at all). */
static mmp_err take_credits(tcp_channel *ch, uint64_t want, double deadline)
{
    for (;;) {
        size_t n = 0;
        mmp_err e = mmp_sock_read_some(ch->fd, ch->what, ch->credit + ch->credit_have,
                                       sizeof ch->credit - ch->credit_have, &n);
        if (e != MMP_OK) {
            if (strstr(mmp_last_error(), "closed")) {
                return mmp_errorf(MMP_ERR_PEER,
                                  "%s: the receiving end closed the connection (it exited or "
                                  "died)",
                                  ch->what);
            }
            return e;
        }
        ch->credit_have += n;
        if (ch->credit_have == sizeof ch->credit) {
            uint64_t v;
            memcpy(&v, ch->credit, sizeof v);
            ch->credit_have = 0;
            if (v <= ch->tail || v > ch->count) {
                return mmp_errorf(MMP_ERR_PROTO,
                                  "%s: header field tail = %llu, not between the %llu messages "
                                  "released before and the %llu posted",
                                  ch->what, (unsigned long long)v, (unsigned long long)ch->tail,
                                  (unsigned long long)ch->count);
            }
            ch->tail = v;
            continue;
        }
        if (n > 0) {
            continue;
        }
        if (ch->tail >= want || deadline < 0) {
            return MMP_OK;
        }
        /* Nothing more now: wait for the socket. */
        double left = deadline > 0 ? deadline - mmp_sock_now_ms() : 100;
        if (left <= 0) {
            return mmp_errorf(MMP_ERR_PEER,
                              "%s: waiting for a credit: nothing from the receiving end in %d ms",
                              ch->what, ch->timeout_ms);
        }
        struct pollfd p = {.fd = ch->fd, .events = POLLIN};
        (void)poll(&p, 1, left < 100 ? (int)left + 1 : 100);
    }
}

static mmp_err tcp_acquire(mmp_channel_impl *c, void **payload)
{
    tcp_channel *ch = tcp_of(c);
    *payload = NULL;
    if (!ch->send) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: acquire on the receiving end", ch->what);
    }
    if (ch->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: acquire twice without a post", ch->what);
    }
    double deadline = mmp_sock_deadline(ch->timeout_ms);
    int reused = ch->count >= ch->slots;
    if (reused) {
        MMP_TRY(wait_connected(ch, deadline));
    }
    if (atomic_load_explicit(&ch->connected, memory_order_acquire)) {
        /* A closed receiver fails the acquire at once, credits or not. */
        MMP_TRY(take_credits(ch, reused ? ch->count - ch->slots + 1 : 0, reused ? deadline : -1));
    }
    ch->acquired = 1;
    *payload = ch->buf + (size_t)(ch->count % ch->slots) * ch->stride;
    return MMP_OK;
}

/* acquire without waiting: the credits that arrived already (read without
 * blocking), or MMP_ERR_TIMEOUT. */
static mmp_err tcp_try_acquire(mmp_channel_impl *c, void **payload)
{
    tcp_channel *ch = tcp_of(c);
    *payload = NULL;
    if (!ch->send || ch->acquired) {
        return tcp_acquire(c, payload); /* its misuse errors */
    }
    int reused = ch->count >= ch->slots;
    int connected = atomic_load_explicit(&ch->connected, memory_order_acquire);
    if (connected) {
        MMP_TRY(take_credits(ch, 0, -1));
    }
    if (reused && (!connected || ch->tail < ch->count - ch->slots + 1)) {
        return MMP_ERR_TIMEOUT;
    }
    ch->acquired = 1;
    *payload = ch->buf + (size_t)(ch->count % ch->slots) * ch->stride;
    return MMP_OK;
}

static mmp_err tcp_post(mmp_channel_impl *c, const mmp_msg_header *h)
{
    tcp_channel *ch = tcp_of(c);
    if (!ch->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: post without an acquired slot", ch->what);
    }
    if (h->bytes > ch->slot_bytes) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: post of %llu bytes into %zu-byte slots", ch->what,
                          (unsigned long long)h->bytes, ch->slot_bytes);
    }
    double deadline = mmp_sock_deadline(ch->timeout_ms);
    MMP_TRY(wait_connected(ch, deadline));
    mmp_msg_header copy = *h;
    struct iovec iov[2] = {
        {&copy, sizeof copy},
        {ch->buf + (size_t)(ch->count % ch->slots) * ch->stride, (size_t)h->bytes}};
    MMP_TRY(mmp_sock_writev(ch->fd, ch->what, iov, 2, deadline, -1));
    ch->count++;
    ch->acquired = 0;
    return MMP_OK;
}

/* ---- the receiving half --------------------------------------------------- */

static mmp_err tcp_recv(mmp_channel_impl *c, mmp_msg_header *h, const void **payload)
{
    tcp_channel *ch = tcp_of(c);
    *payload = NULL;
    if (ch->send) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: recv on the sending end", ch->what);
    }
    uint64_t k = ch->count;
    if (atomic_load_explicit(&ch->head, memory_order_acquire) <= k) {
        double t0 = mmp_sock_now_ms();
        while (atomic_load_explicit(&ch->head, memory_order_acquire) <= k &&
               (mmp_sock_now_ms() - t0) * 1e6 < MMP_TCP_SPIN_NS) {
        }
    }
    if (atomic_load_explicit(&ch->head, memory_order_acquire) <= k) {
        double deadline = mmp_sock_deadline(ch->timeout_ms);
        mmp_err e = MMP_OK;
        pthread_mutex_lock(&ch->mu);
        while (atomic_load_explicit(&ch->head, memory_order_acquire) <= k &&
               !(ch->failed && ch->err_at <= k) && cv_wait(ch, deadline)) {
        }
        if (atomic_load_explicit(&ch->head, memory_order_acquire) <= k) {
            if (ch->failed && ch->err_at <= k) {
                e = mmp_errorf(ch->err, "%s", ch->err_msg);
            } else if (!atomic_load(&ch->connected)) {
                e = mmp_errorf(MMP_ERR_PEER, "%s: no connector in %d ms", ch->what, ch->timeout_ms);
            } else {
                e = mmp_errorf(MMP_ERR_PEER,
                               "%s: waiting for a message: nothing from the sending end in %d ms",
                               ch->what, ch->timeout_ms);
            }
        }
        pthread_mutex_unlock(&ch->mu);
        MMP_TRY(e);
    }
    uint32_t i = (uint32_t)(k % ch->slots);
    *h = ch->hdr[i]; /* checked by the thread before head moved */
    *payload = ch->buf + (size_t)i * ch->stride;
    ch->count++;
    return MMP_OK;
}

static mmp_err tcp_release(mmp_channel_impl *c)
{
    tcp_channel *ch = tcp_of(c);
    uint64_t released = atomic_load_explicit(&ch->released, memory_order_relaxed);
    if (ch->send || released == ch->count) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: release with no received slot held", ch->what);
    }
    released++;
    atomic_store_explicit(&ch->released, released, memory_order_release);
    struct iovec iov = {&released, sizeof released};
    if (mmp_sock_writev(ch->fd, ch->what, &iov, 1, mmp_sock_deadline(ch->timeout_ms), -1) !=
        MMP_OK) {
        /* The sender is gone or stuck: its credit no longer matters, and
         * the next recv reports it once what arrived is delivered. */
        MMP_DEBUG("%s: credit not sent: %s", ch->what, mmp_last_error());
    }
    return MMP_OK;
}

static size_t tcp_slot_bytes(const mmp_channel_impl *c)
{
    return ((const tcp_channel *)(const void *)c)->slot_bytes;
}

static const char *tcp_address(const mmp_channel_impl *c)
{
    return ((const tcp_channel *)(const void *)c)->address;
}

/* Stops the thread, closes the sockets (a sender's gracefully, so what it
 * posted still arrives), frees ch. NULL is a no-op. */
static void tcp_close(mmp_channel_impl *c)
{
    tcp_channel *ch = tcp_of(c);
    if (!ch) {
        return;
    }
    if (ch->has_thread) {
        mmp_sock_stop(ch->stop_fd, ch->what);
        pthread_join(ch->thread, NULL);
    }
    if (ch->send) {
        mmp_sock_close_graceful(ch->fd, mmp_sock_deadline(ch->timeout_ms));
    } else if (ch->fd >= 0) {
        close(ch->fd);
    }
    if (ch->lfd >= 0) {
        close(ch->lfd);
    }
    if (ch->stop_fd >= 0) {
        close(ch->stop_fd);
    }
    pthread_cond_destroy(&ch->cv);
    pthread_mutex_destroy(&ch->mu);
    free(ch->buf);
    free(ch->hdr);
    free(ch);
}

const mmp_transport mmp_transport_tcp = {
    .name = "tcp",
    .caps = MMP_TRANSPORT_NETWORK,
    .can_connect = tcp_can_connect,
    .setup = tcp_setup,
    .connect = tcp_connect,
    .acquire = tcp_acquire,
    .try_acquire = tcp_try_acquire,
    .post = tcp_post,
    .recv = tcp_recv,
    .release = tcp_release,
    .close = tcp_close,
    .slot_bytes = tcp_slot_bytes,
    .address = tcp_address,
};
