/* The control channel: ZeroMQ ROUTER/DEALER sockets carrying protobuf-c
 * Envelopes (the contract is in control.h).
 *
 * Everything that arrives is untrusted. A message reaches the caller only
 * after the framing, size, decoding, version, token and body checks in
 * check(); a message failing one is logged, counted and dropped, and must
 * never end the run, be acted on, or restart the caller's wait. This file
 * must never log the job token. */
#include "transport/control.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "transport/channel.h"

/* ZeroMQ disconnects a peer whose frame is bigger than this before buffering
 * it whole. It sits a little above our own limit so that messages just over
 * the limit still reach check() and are logged and counted. */
#define ZMQ_MAX_FRAME ((int64_t)MMP_CTL_MAX_BYTES + 4096)
#define HEARTBEAT_IVL_MS 1000
#define HEARTBEAT_TIMEOUT_MS (MMP_CTL_HEARTBEAT_TIMEOUT_S * 1000)
#define SEND_TIMEOUT_MS 5000
#define TOKEN_MAX 128
#define PEER_TEXT_MAX 256

#define ZAP_ENDPOINT "inproc://zeromq.zap.01" /* where libzmq asks (RFC 27) */
#define MONITOR_ENDPOINT "inproc://mmpipe-control-monitor"

typedef struct ctl_peer {
    char id[2 * MMP_CTL_ID_MAX + 8]; /* as id_text writes it */
    int fd;                          /* -1 once dropped */
    double dropped_ms;               /* 0: its connection stands */
} ctl_peer;

struct mmp_ctl {
    void *ctx, *sock;
    int router;
    char token[TOKEN_MAX + 1];
    size_t token_len;
    char peer[PEER_TEXT_MAX]; /* DEALER: the endpoint, to name the sender in log lines */
    mmp_ctl_stats stats;
    /* CURVE: the helper thread (ZAP, socket events, the watched fd) */
    int curve;
    unsigned char client_public[32]; /* the one client key the ZAP handler admits */
    void *zap, *mon;                 /* owned by the helper once it runs */
    pthread_t helper;
    int have_helper;
    atomic_int stop;
    atomic_long refused;
    pthread_mutex_t refused_lock; /* guards refused_text (helper thread writes) */
    char refused_text[PEER_TEXT_MAX + 128];
    int watch_fd;
    void (*lost)(const char *why, void *arg);
    void *lost_arg;
    /* CURVE ROUTER: each peer's connection (the descriptor its last valid
     * message came on) and when ZeroMQ dropped it; guarded by peers_lock
     * (the helper thread marks drops, mmp_ctl_recv records descriptors). */
    pthread_mutex_t peers_lock;
    ctl_peer *peers;
    int n_peers, cap_peers;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static mmp_err set_int(void *sock, int opt, int v, const char *name)
{
    if (zmq_setsockopt(sock, opt, &v, sizeof v) != 0) {
        return mmp_errorf(MMP_ERR_IO, "control: zmq_setsockopt %s: %s", name, zmq_strerror(errno));
    }
    return MMP_OK;
}

#define SET_INT(sock, opt, v) set_int(sock, opt, v, #opt)

/* A routing id as text: as is when every byte is printable ASCII, else "0x"
 * and hex (ZeroMQ's own ids for peers that set none start with a zero byte).
 * Cut to fit n. */
static void id_text(char *out, size_t n, const unsigned char *id, size_t len)
{
    if (n == 0) {
        return;
    }
    int printable = len > 0;
    for (size_t i = 0; i < len; i++) {
        printable &= id[i] >= 0x20 && id[i] < 0x7f;
    }
    if (printable) {
        snprintf(out, n, "%.*s", (int)len, (const char *)id);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    out[0] = 0;
    if (n < 3) {
        return;
    }
    out[o++] = '0';
    out[o++] = 'x';
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        out[o++] = hex[id[i] >> 4];
        out[o++] = hex[id[i] & 15];
    }
    out[o] = 0;
}

/* Constant time in the received token's bytes (up to our length): no
 * timing tells a peer how much of a guess was right. */
static int token_equal(const char *ours, const char *t)
{
    if (!t || !ours) {
        return 0;
    }
    size_t len = strnlen(ours, TOKEN_MAX + 1);
    size_t n = strnlen(t, TOKEN_MAX + 1);
    unsigned diff = n != len;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = i < n ? (unsigned char)t[i] : 0;
        diff |= (unsigned char)ours[i] ^ b;
    }
    return diff == 0;
}

/* Opens the context and socket with the options every control socket has. */
static mmp_err set_key(void *sock, int opt, const char *z85, const char *name)
{
    if (!z85 || strlen(z85) != 40 || zmq_setsockopt(sock, opt, z85, 41) != 0) {
        return mmp_errorf(MMP_ERR_INVALID, "control: CURVE %s: not a 40-character Z85 key", name);
    }
    return MMP_OK;
}

/* The socket's CURVE role, the ZAP handler's socket (server) and the event
 * monitor the helper thread reads. */
static mmp_err curve_setup(mmp_ctl *c, const mmp_ctl_opts *o)
{
    const mmp_ctl_keys *k = o->curve;
    c->curve = 1;
    if (c->router) {
        if (!zmq_z85_decode(c->client_public, k->client_public) || strlen(k->client_public) != 40) {
            return mmp_errorf(MMP_ERR_INVALID, "control: CURVE client public key: not Z85");
        }
        /* ZAP first: libzmq asks the handler bound in this context */
        c->zap = zmq_socket(c->ctx, ZMQ_REP);
        if (!c->zap || zmq_bind(c->zap, ZAP_ENDPOINT) != 0) {
            return mmp_errorf(MMP_ERR_IO, "control: ZAP handler: %s", zmq_strerror(errno));
        }
        int one = 1;
        MMP_TRY(SET_INT(c->sock, ZMQ_CURVE_SERVER, one));
        MMP_TRY(set_key(c->sock, ZMQ_CURVE_SECRETKEY, k->server_secret, "server secret key"));
        if (zmq_setsockopt(c->sock, ZMQ_ZAP_DOMAIN, "mmpipe", 6) != 0) {
            return mmp_errorf(MMP_ERR_IO, "control: ZMQ_ZAP_DOMAIN: %s", zmq_strerror(errno));
        }
    } else {
        MMP_TRY(set_key(c->sock, ZMQ_CURVE_SERVERKEY, k->server_public, "server public key"));
        MMP_TRY(set_key(c->sock, ZMQ_CURVE_PUBLICKEY, k->client_public, "client public key"));
        MMP_TRY(set_key(c->sock, ZMQ_CURVE_SECRETKEY, k->client_secret, "client secret key"));
    }
    int events = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                 ZMQ_EVENT_DISCONNECTED;
    if (zmq_socket_monitor(c->sock, MONITOR_ENDPOINT, events) != 0 ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || zmq_connect(c->mon, MONITOR_ENDPOINT) != 0) {
        return mmp_errorf(MMP_ERR_IO, "control: socket monitor: %s", zmq_strerror(errno));
    }
    c->watch_fd = o->watch_fd;
    c->lost = o->lost;
    c->lost_arg = o->lost_arg;
    return MMP_OK;
}

/* One ZAP request (RFC 27): admits the CURVE client whose public key is the
 * job's; anything else is refused and logged with the peer's address. */
static void serve_zap(mmp_ctl *c)
{
    zmq_msg_t part[7];
    int n = 0, more = 1;
    while (more && n < 7) {
        zmq_msg_init(&part[n]);
        if (zmq_msg_recv(&part[n], c->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part[n]);
            break;
        }
        more = zmq_msg_more(&part[n]);
        n++;
    }
    if (more) {
        int m = 1;
        size_t ml = sizeof m;
        while (zmq_getsockopt(c->zap, ZMQ_RCVMORE, &m, &ml) == 0 && m) {
            zmq_msg_t x;
            zmq_msg_init(&x);
            zmq_msg_recv(&x, c->zap, ZMQ_DONTWAIT);
            zmq_msg_close(&x);
        }
    }
    char addr[64] = "?", mech[16] = "?";
    if (n > 3) {
        snprintf(addr, sizeof addr, "%.*s", (int)zmq_msg_size(&part[3]),
                 (const char *)zmq_msg_data(&part[3]));
    }
    if (n > 5) {
        snprintf(mech, sizeof mech, "%.*s", (int)zmq_msg_size(&part[5]),
                 (const char *)zmq_msg_data(&part[5]));
    }
    int ok = n == 7 && strcmp(mech, "CURVE") == 0 && zmq_msg_size(&part[6]) == 32 &&
             memcmp(zmq_msg_data(&part[6]), c->client_public, 32) == 0;
    if (!ok) {
        pthread_mutex_lock(&c->refused_lock);
        snprintf(c->refused_text, sizeof c->refused_text,
                 "refused a %s client from %s: not this job's key", mech, addr);
        MMP_WARN("control: %s", c->refused_text);
        pthread_mutex_unlock(&c->refused_lock);
    }
    /* reply: version, request id, status code, text, user id, metadata */
    if (n >= 2) {
        zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(c->zap, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), ZMQ_SNDMORE);
        zmq_send(c->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
        zmq_send(c->zap, ok ? "OK" : "unknown key", ok ? 2 : 11, ZMQ_SNDMORE);
        zmq_send(c->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(c->zap, "", 0, 0);
    }
    for (int i = 0; i < n; i++) {
        zmq_msg_close(&part[i]);
    }
}

static void fire_lost(mmp_ctl *c, int *fired, const char *why)
{
    if (!*fired && c->lost) {
        *fired = 1;
        c->lost(why, c->lost_arg);
    }
}

/* One socket event: counts and logs refused handshakes; on a stage, a drop
 * after the handshake means the coordinator is gone. */
static void on_event(mmp_ctl *c, int *connected, int *fired)
{
    zmq_msg_t head, where;
    zmq_msg_init(&head);
    zmq_msg_init(&where);
    if (zmq_msg_recv(&head, c->mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&head);
        return;
    }
    if (zmq_msg_more(&head)) {
        zmq_msg_recv(&where, c->mon, ZMQ_DONTWAIT);
    }
    uint16_t event = 0;
    uint32_t value = 0;
    if (zmq_msg_size(&head) >= 6) {
        memcpy(&event, zmq_msg_data(&head), 2);
        memcpy(&value, (char *)zmq_msg_data(&head) + 2, 4);
    }
    char ep[PEER_TEXT_MAX];
    snprintf(ep, sizeof ep, "%.*s", (int)zmq_msg_size(&where), (const char *)zmq_msg_data(&where));
    switch (event) {
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        *connected = 1;
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: /* the ZAP handler logged it with the address */
        atomic_fetch_add(&c->refused, 1);
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        pthread_mutex_lock(&c->refused_lock);
        snprintf(c->refused_text, sizeof c->refused_text,
                 "refused a connection on %s: handshake failed (%s, ZeroMQ code 0x%x; a peer "
                 "without this job's CURVE keys)",
                 ep, event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "protocol" : "no detail",
                 value);
        MMP_WARN("control: %s", c->refused_text);
        pthread_mutex_unlock(&c->refused_lock);
        atomic_fetch_add(&c->refused, 1);
        break;
    case ZMQ_EVENT_DISCONNECTED:
        if (c->router) {
            /* the descriptor is the event's value: the peer whose messages
             * came on it has lost its connection. It forgets the number: a
             * process started in its place (a restart, a re-placement) may
             * well connect on the same one, and stands again once heard. */
            pthread_mutex_lock(&c->peers_lock);
            for (int i = 0; i < c->n_peers; i++) {
                if (c->peers[i].fd == (int)value) {
                    c->peers[i].fd = -1;
                    c->peers[i].dropped_ms = now_ms();
                }
            }
            pthread_mutex_unlock(&c->peers_lock);
        } else if (*connected) {
            char why[PEER_TEXT_MAX + 96];
            snprintf(why, sizeof why,
                     "lost the coordinator at %s (no heartbeat answer within %d s, or it closed)",
                     ep, HEARTBEAT_TIMEOUT_MS / 1000);
            fire_lost(c, fired, why);
        }
        break;
    default:
        break;
    }
    zmq_msg_close(&head);
    zmq_msg_close(&where);
}

static void *helper_main(void *arg)
{
    mmp_ctl *c = arg;
    int connected = 0, fired = 0, watching = c->watch_fd >= 0;
    while (!atomic_load(&c->stop)) {
        zmq_pollitem_t items[3];
        int n = 0, i_zap = -1, i_mon, i_fd = -1;
        if (c->zap) {
            i_zap = n;
            items[n++] = (zmq_pollitem_t){.socket = c->zap, .events = ZMQ_POLLIN};
        }
        i_mon = n;
        items[n++] = (zmq_pollitem_t){.socket = c->mon, .events = ZMQ_POLLIN};
        if (watching) {
            i_fd = n;
            items[n++] = (zmq_pollitem_t){.fd = c->watch_fd, .events = ZMQ_POLLIN};
        }
        if (zmq_poll(items, n, 100) < 0) {
            if (errno == EINTR) {
                continue;
            }
            break; /* the context is ending */
        }
        if (i_zap >= 0 && (items[i_zap].revents & ZMQ_POLLIN)) {
            serve_zap(c);
        }
        if (items[i_mon].revents & ZMQ_POLLIN) {
            on_event(c, &connected, &fired);
        }
        if (i_fd >= 0 && (items[i_fd].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) {
            char junk[256];
            ssize_t r = read(c->watch_fd, junk, sizeof junk);
            if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
                watching = 0;
                fire_lost(c, &fired,
                          "the launcher's pipe closed (the coordinator or its ssh ended)");
            }
        }
    }
    return NULL;
}

static mmp_err ctl_open(mmp_ctl **out, int type, const char *job_token)
{
    mmp_err ret = MMP_OK;
    mmp_ctl *c = NULL;
    size_t n = job_token ? strlen(job_token) : 0;
    *out = NULL;
    if (n == 0 || n > TOKEN_MAX) {
        ret = mmp_errorf(MMP_ERR_INVALID, "control: job token must be 1..%d characters, got %zu",
                         TOKEN_MAX, n);
        goto fail;
    }
    c = calloc(1, sizeof *c);
    if (!c) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "control: %zu bytes", sizeof *c);
        goto fail;
    }
    memcpy(c->token, job_token, n + 1);
    c->token_len = n;
    pthread_mutex_init(&c->refused_lock, NULL);
    pthread_mutex_init(&c->peers_lock, NULL);
    c->router = type == ZMQ_ROUTER;
    c->ctx = zmq_ctx_new();
    if (!c->ctx) {
        ret = mmp_errorf(MMP_ERR_IO, "control: zmq_ctx_new: %s", zmq_strerror(errno));
        goto fail;
    }
    c->sock = zmq_socket(c->ctx, type);
    if (!c->sock) {
        ret = mmp_errorf(MMP_ERR_IO, "control: zmq_socket: %s", zmq_strerror(errno));
        goto fail;
    }
    /* HANDOVER: a stage whose connection ZeroMQ dropped (heartbeat timeout,
     * oversized frame) reconnects under the same id. Without it the ROUTER
     * may still hold the dead connection's id when the new one arrives, and
     * then ignores the new connection for good (seen with libzmq 4.3.4). */
    if ((ret = SET_INT(c->sock, ZMQ_LINGER, 0)) != MMP_OK ||
        (ret = SET_INT(c->sock, ZMQ_SNDTIMEO, SEND_TIMEOUT_MS)) != MMP_OK ||
        (c->router && (ret = SET_INT(c->sock, ZMQ_ROUTER_MANDATORY, 1)) != MMP_OK) ||
        (c->router && (ret = SET_INT(c->sock, ZMQ_ROUTER_HANDOVER, 1)) != MMP_OK)) {
        goto fail;
    }
    int64_t max_frame = ZMQ_MAX_FRAME;
    if (zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "control: zmq_setsockopt ZMQ_MAXMSGSIZE: %s",
                         zmq_strerror(errno));
        goto fail;
    }
    *out = c;
exit:
    return ret;
fail:
    mmp_ctl_close(c);
    goto exit;
}

/* Starts the helper thread of a CURVE socket (after bind/connect). */
static mmp_err start_helper(mmp_ctl *c)
{
    if (!c->curve) {
        return MMP_OK;
    }
    int rc = pthread_create(&c->helper, NULL, helper_main, c);
    if (rc != 0) {
        return mmp_errorf(MMP_ERR_IO, "control: helper thread: %s", strerror(rc));
    }
    c->have_helper = 1;
    return MMP_OK;
}

/* The common first half of bind and connect: the socket, the peer's
 * endpoint (a DEALER's, for messages) and CURVE when the options ask for it. */
static mmp_err ctl_prepare(mmp_ctl **c, int type, const char *job_token, const char *peer,
                           const mmp_ctl_opts *opts)
{
    mmp_err ret = ctl_open(c, type, job_token);
    if (ret != MMP_OK) {
        return ret;
    }
    if (peer) {
        snprintf((*c)->peer, sizeof(*c)->peer, "%s", peer);
    }
    if (opts && opts->curve) {
        ret = curve_setup(*c, opts);
    }
    return ret;
}

/* The common second half: the helper thread, then *out, or c closed on any
 * earlier failure (ret). */
static mmp_err ctl_finish(mmp_ctl *c, mmp_err ret, mmp_ctl **out)
{
    if (ret == MMP_OK) {
        ret = start_helper(c);
    }
    if (ret != MMP_OK) {
        mmp_ctl_close(c);
        return ret;
    }
    *out = c;
    return MMP_OK;
}

/* ZMTP heartbeats, on tcp only: they tell a host or link that vanished,
 * which over ipc (one host) the kernel tells at once, and there they would
 * drop the connections of a coordinator merely paused (Ctrl-Z, a debugger)
 * for longer than the timeout, losing the messages in flight. */
static mmp_err set_heartbeat(mmp_ctl *c, const char *endpoint)
{
    if (strncmp(endpoint, "ipc://", 6) == 0) {
        return MMP_OK;
    }
    mmp_err ret = SET_INT(c->sock, ZMQ_HEARTBEAT_IVL, HEARTBEAT_IVL_MS);
    return ret == MMP_OK ? SET_INT(c->sock, ZMQ_HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS) : ret;
}

/* Over ipc only processes of this user may connect. The socket lives in
 * the abstract namespace, which has no file permissions: without this any
 * local user could connect under a stage's routing id, and ROUTER_HANDOVER
 * hands a routing id to its newest connection before a single message (and
 * its job token) is read, so the coordinator's messages to that stage would
 * go to the stranger and the run would stall. ZeroMQ checks the peer's
 * credentials (SO_PEERCRED) as it accepts and closes any other user's
 * connection unseen. A process of the same user could still do it, as it
 * could signal the stages; over tcp CURVE keeps every stranger out. */
static mmp_err set_ipc_owner_only(mmp_ctl *c, const char *endpoint)
{
    if (strncmp(endpoint, "ipc://", 6) != 0) {
        return MMP_OK;
    }
    return SET_INT(c->sock, ZMQ_IPC_FILTER_UID, (int)geteuid());
}

mmp_err mmp_ctl_bind(mmp_ctl **out, const char *endpoint, const char *job_token)
{
    return mmp_ctl_bind_opts(out, endpoint, job_token, NULL);
}

mmp_err mmp_ctl_bind_opts(mmp_ctl **out, const char *endpoint, const char *job_token,
                          const mmp_ctl_opts *opts)
{
    mmp_ctl *c = NULL;
    *out = NULL;
    if (!endpoint) {
        return mmp_errorf(MMP_ERR_INVALID, "control: bind: no endpoint");
    }
    mmp_err ret = ctl_prepare(&c, ZMQ_ROUTER, job_token, NULL, opts);
    if (ret == MMP_OK) {
        ret = set_heartbeat(c, endpoint);
    }
    if (ret == MMP_OK) {
        ret = set_ipc_owner_only(c, endpoint);
    }
    if (ret == MMP_OK && zmq_bind(c->sock, endpoint) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "control: bind %s: %s", endpoint, zmq_strerror(errno));
    }
    return ctl_finish(c, ret, out);
}

mmp_err mmp_ctl_connect(mmp_ctl **out, const char *endpoint, const char *identity,
                        const char *job_token)
{
    return mmp_ctl_connect_opts(out, endpoint, identity, job_token, NULL);
}

mmp_err mmp_ctl_connect_opts(mmp_ctl **out, const char *endpoint, const char *identity,
                             const char *job_token, const mmp_ctl_opts *opts)
{
    mmp_ctl *c = NULL;
    *out = NULL;
    size_t n = identity ? strlen(identity) : 0;
    int printable = n > 0 && n < MMP_CTL_ID_MAX;
    for (size_t i = 0; printable && i < n; i++) {
        printable = identity[i] >= 0x20 && identity[i] < 0x7f;
    }
    if (!endpoint || !printable) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "control: connect needs an endpoint and a routing id of 1..%d printable "
                          "characters, got '%s'",
                          MMP_CTL_ID_MAX - 1, identity ? identity : "(null)");
    }
    mmp_err ret = ctl_prepare(&c, ZMQ_DEALER, job_token, endpoint, opts);
    if (ret == MMP_OK) {
        ret = set_heartbeat(c, endpoint);
    }
    if (ret == MMP_OK && zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, identity, n) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "control: routing id '%s': %s", identity, zmq_strerror(errno));
    }
    if (ret == MMP_OK && zmq_connect(c->sock, endpoint) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "control: connect %s: %s", endpoint, zmq_strerror(errno));
    }
    return ctl_finish(c, ret, out);
}

void mmp_ctl_close(mmp_ctl *c)
{
    if (!c) {
        return;
    }
    if (c->have_helper) {
        atomic_store(&c->stop, 1);
        pthread_join(c->helper, NULL);
    }
    if (c->sock && c->mon) {
        zmq_socket_monitor(c->sock, NULL, 0);
    }
    if (c->mon) {
        zmq_close(c->mon);
    }
    if (c->zap) {
        zmq_close(c->zap);
    }
    if (c->sock) {
        zmq_close(c->sock);
    }
    /* LINGER 0 on the only socket: term does not wait on any peer. */
    while (c->ctx && zmq_ctx_term(c->ctx) != 0 && errno == EINTR) {
    }
    explicit_bzero(c->token, sizeof c->token);
    pthread_mutex_destroy(&c->refused_lock);
    pthread_mutex_destroy(&c->peers_lock);
    free(c->peers);
    free(c);
}

/* zmq_send, retried when a signal interrupts the wait for queue room. */
static int send_retry(void *sock, zmq_msg_t *msg, const void *buf, size_t n, int flags)
{
    for (;;) {
        int r = msg ? zmq_msg_send(msg, sock, flags) : zmq_send(sock, buf, n, flags);
        if (r >= 0 || errno != EINTR) {
            return r;
        }
    }
}

static mmp_err send_error(const mmp_ctl *c, const char *to)
{
    const char *who = c->router ? to : c->peer;
    if (errno == EHOSTUNREACH) {
        return mmp_errorf(MMP_ERR_PEER, "control: no peer '%s' is connected", who);
    }
    if (errno == EAGAIN) {
        return mmp_errorf(MMP_ERR_PEER, "control: peer '%s' is not reading (queue full for %d ms)",
                          who, SEND_TIMEOUT_MS);
    }
    return mmp_errorf(MMP_ERR_IO, "control: send to '%s': %s", who, zmq_strerror(errno));
}

mmp_err mmp_ctl_send(mmp_ctl *c, const char *to, Mmpipe__Envelope *env)
{
    if (!c || !env) {
        return mmp_errorf(MMP_ERR_INVALID, "control: send: no channel or envelope");
    }
    if (c->router ? !to || !*to : to != NULL) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "control: send: a ROUTER needs a peer id, a DEALER none");
    }
    if (env->body_case == MMPIPE__ENVELOPE__BODY__NOT_SET) {
        return mmp_errorf(MMP_ERR_INVALID, "control: send: the envelope has no body");
    }
    /* Packed straight into the zmq message: no staging buffer, no copy. */
    char *callers_token = env->job_token;
    env->version = MMP_CTL_VERSION;
    env->job_token = c->token;
    size_t n = mmpipe__envelope__get_packed_size(env);
    if (n > MMP_CTL_MAX_BYTES) {
        env->job_token = callers_token;
        return mmp_errorf(MMP_ERR_INVALID,
                          "control: send: envelope (body %d) packs to %zu bytes, over the %u limit",
                          (int)env->body_case, n, MMP_CTL_MAX_BYTES);
    }
    zmq_msg_t msg;
    if (zmq_msg_init_size(&msg, n) != 0) {
        env->job_token = callers_token;
        return mmp_errorf(MMP_ERR_NOMEM, "control: send: %zu bytes", n);
    }
    size_t packed = mmpipe__envelope__pack(env, zmq_msg_data(&msg));
    env->job_token = callers_token;
    MMP_ASSERT(packed == n);
    if (c->router && send_retry(c->sock, NULL, to, strlen(to), ZMQ_SNDMORE) < 0) {
        zmq_msg_close(&msg);
        return send_error(c, to);
    }
    if (send_retry(c->sock, &msg, NULL, 0, 0) < 0) {
        mmp_err e = send_error(c, to);
        zmq_msg_close(&msg); /* only a failed send leaves msg ours */
        return e;
    }
    return MMP_OK;
}

/* Receives and throws away the rest of a multi-frame message; returns how
 * many frames that was. ZeroMQ delivers all frames of a message at once, so
 * this never waits. */
static size_t drain(void *sock)
{
    size_t frames = 0;
    int more = 1;
    size_t len = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int r = zmq_msg_recv(&m, sock, ZMQ_DONTWAIT);
        zmq_msg_close(&m);
        if (r < 0) {
            break;
        }
        frames++;
    }
    return frames;
}

static int finite_nonneg(double x)
{
    return isfinite(x) && x >= 0;
}

/* A string field shown to the user: NULL or empty, or at most max bytes
 * with no control character (a terminal's escape sequences among them). */
static int plain_text(const char *s, size_t max)
{
    size_t n = 0;
    for (; s && s[n]; n++) {
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f || n >= max) {
            return 0;
        }
    }
    return 1;
}

/* A text field the receiver prints (an error, a reason, a name), made
 * harmless in place: a control character (a terminal's escape sequences,
 * a line break that would forge a line of the coordinator's own) becomes
 * '?', tab and line breaks a space. The text is kept: a stage's error
 * must reach the user even when it holds such a byte. */
static void plain_in_place(char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n' || c == '\r' || c == '\t') {
            *s = ' ';
        } else if (c < 0x20 || c == 0x7f) {
            *s = '?';
        }
    }
}

/* The printed text fields of an envelope that passed body_ok. */
static void plain_fields(Mmpipe__Envelope *env)
{
    switch (env->body_case) {
    case MMPIPE__ENVELOPE__BODY_HELLO:
        plain_in_place(env->hello->name);
        plain_in_place(env->hello->blas);
        break;
    case MMPIPE__ENVELOPE__BODY_CHECKPOINT_ACK:
        plain_in_place(env->checkpoint_ack->error);
        break;
    case MMPIPE__ENVELOPE__BODY_ABORT:
        plain_in_place(env->abort ? env->abort->reason : NULL);
        break;
    case MMPIPE__ENVELOPE__BODY_ERROR:
        plain_in_place(env->error ? env->error->message : NULL);
        break;
    default:
        break;
    }
}

/* The body's fields that no sender may write, whatever the receiver's
 * geometry; 0 with why set when one is out of range. */
static int body_ok(const Mmpipe__Envelope *env, char *why, size_t why_n)
{
#define BAD(...) (snprintf(why, why_n, __VA_ARGS__), 0)
    switch (env->body_case) {
    case MMPIPE__ENVELOPE__BODY_HELLO:
        return env->hello ? 1 : BAD("hello: missing");
    case MMPIPE__ENVELOPE__BODY_ASSIGNMENT: {
        const Mmpipe__Assignment *a = env->assignment;
        if (!a) {
            return BAD("assignment: missing");
        }
        for (size_t i = 0; i < a->n_channels; i++) {
            if (!a->channels[i]) {
                return BAD("assignment: channel %zu missing", i);
            }
        }
        for (size_t i = 0; i < a->n_program; i++) {
            if (!a->program[i]) {
                return BAD("assignment: instruction %zu missing", i);
            }
        }
        return 1;
    }
    case MMPIPE__ENVELOPE__BODY_PROGRAM: {
        const Mmpipe__Program *p = env->program;
        if (!p || p->first_step < 0) {
            return BAD("program: field first_step = %d, below 0", p ? p->first_step : -1);
        }
        for (size_t i = 0; i < p->n_program; i++) {
            if (!p->program[i]) {
                return BAD("program: instruction %zu missing", i);
            }
        }
        return 1;
    }
    case MMPIPE__ENVELOPE__BODY_START:
        if (!env->start || env->start->first_step < 0 || env->start->steps < 0) {
            return BAD("start: fields first_step = %d, steps = %d, below 0",
                       env->start ? env->start->first_step : -1,
                       env->start ? env->start->steps : -1);
        }
        return 1;
    case MMPIPE__ENVELOPE__BODY_GRAD_NORM:
        /* sumsq may be NaN: a diverging model's norm is news, not forgery. */
        return env->grad_norm && env->grad_norm->step >= 0 ? 1
                                                           : BAD("grad_norm: field step below 0");
    case MMPIPE__ENVELOPE__BODY_CLIP:
        return env->clip && env->clip->step >= 0 ? 1 : BAD("clip: field step below 0");
    case MMPIPE__ENVELOPE__BODY_STEP_DONE: {
        const Mmpipe__StepDone *d = env->step_done;
        if (!d || d->step < 0) {
            return BAD("step_done: field step = %d, below 0", d ? d->step : -1);
        }
        if (!finite_nonneg(d->busy_ms) || !isfinite(d->idle_ms) || !finite_nonneg(d->wall_ms) ||
            !finite_nonneg(d->data_ms) || !finite_nonneg(d->cpu_ms)) {
            return BAD("step_done: step %d: a timing that is negative or not finite", d->step);
        }
        if (d->max_inflight < 0 || d->skipped < 0 || d->n_mbs > 65536) {
            return BAD("step_done: step %d: fields max_inflight = %d, skipped = %d, %zu "
                       "micro-batch timings (limit 65536)",
                       d->step, d->max_inflight, d->skipped, d->n_mbs);
        }
        for (size_t k = 0; k < d->n_mbs; k++) {
            const Mmpipe__MbTiming *t = d->mbs[k];
            if (!t || t->mb < 0 || !finite_nonneg(t->fwd_ms) || !finite_nonneg(t->bwd_ms) ||
                !finite_nonneg(t->wgt_ms) || t->wgt_ms > t->bwd_ms) {
                return BAD("step_done: step %d: micro-batch timing %zu: field mb = %d or its "
                           "times out of range",
                           d->step, k, t ? t->mb : -1);
            }
        }
        return 1;
    }
    case MMPIPE__ENVELOPE__BODY_EVAL_REQUEST:
        return env->eval_request && env->eval_request->step >= 0
                   ? 1
                   : BAD("eval_request: field step below 0");
    case MMPIPE__ENVELOPE__BODY_EVAL_DONE: {
        const Mmpipe__EvalDone *d = env->eval_done;
        if (!d || d->step < 0 || !(d->i2t_r1 >= 0 && d->i2t_r1 <= 1) ||
            !(d->t2i_r1 >= 0 && d->t2i_r1 <= 1)) {
            return BAD("eval_done: field step below 0 or a recall outside 0..1");
        }
        return 1;
    }
    case MMPIPE__ENVELOPE__BODY_HEARTBEAT: {
        const Mmpipe__Heartbeat *h = env->heartbeat;
        if (!h || h->step < 0 || h->instr < 0) {
            return BAD("heartbeat: field step or instr below 0");
        }
        /* start-up progress: text the coordinator prints */
        if (!plain_text(h->phase, 255) || !plain_text(h->unit, 31) ||
            (h->total > 0 && h->done > h->total)) {
            return BAD("heartbeat: field phase or unit too long or with control characters, or "
                       "done %llu over total %llu",
                       (unsigned long long)h->done, (unsigned long long)h->total);
        }
        return 1;
    }
    case MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST:
        return env->checkpoint_request && env->checkpoint_request->step >= 0 &&
                       env->checkpoint_request->writer >= 0
                   ? 1
                   : BAD("checkpoint_request: field step or writer below 0");
    case MMPIPE__ENVELOPE__BODY_CHECKPOINT_ACK:
        return env->checkpoint_ack && env->checkpoint_ack->step >= 0
                   ? 1
                   : BAD("checkpoint_ack: field step below 0");
    case MMPIPE__ENVELOPE__BODY_ERROR:
        return !env->error || !env->error->holding || env->error->held_steps >= 0
                   ? 1
                   : BAD("error: field held_steps = %d, below 0", env->error->held_steps);
    case MMPIPE__ENVELOPE__BODY_ENDPOINTS: {
        const Mmpipe__Endpoints *e = env->endpoints;
        for (size_t i = 0; e && i < e->n_endpoints; i++) {
            const Mmpipe__Endpoint *p = e->endpoints[i];
            if (!p || p->channel < -1) {
                return BAD("endpoints: endpoint %zu: %s", i,
                           p ? "field channel below -1" : "missing");
            }
            if (!p->address || !p->address[0] || !plain_text(p->address, MMP_ENDPOINT_MAX - 1)) {
                return BAD("endpoints: endpoint %zu (channel %d): address missing, over %d "
                           "characters or with control characters",
                           i, p->channel, MMP_ENDPOINT_MAX - 1);
            }
        }
        return e ? 1 : BAD("endpoints: missing");
    }
    default:
        return 1; /* bodies without numbers: Ready, Abort, Shutdown, Error */
    }
#undef BAD
}

mmp_ctl_verdict mmp_ctl_decode(const void *data, size_t size, const char *job_token,
                               Mmpipe__Envelope **out, char *why, size_t why_n)
{
    Mmpipe__Envelope *env = NULL;
    mmp_ctl_verdict v;
    *out = NULL;
    if (size > MMP_CTL_MAX_BYTES) {
        v = MMP_CTL_TOO_BIG;
        snprintf(why, why_n, "%zu bytes, over the %u limit", size, MMP_CTL_MAX_BYTES);
    } else if (!(env = mmpipe__envelope__unpack(NULL, size, data))) {
        v = MMP_CTL_UNDECODABLE;
        snprintf(why, why_n, "%zu bytes that do not decode as an Envelope", size);
    } else if (env->version != MMP_CTL_VERSION) {
        v = MMP_CTL_BAD_VERSION;
        snprintf(why, why_n, "version %u, want %d", env->version, MMP_CTL_VERSION);
    } else if (!token_equal(job_token, env->job_token)) {
        v = MMP_CTL_BAD_TOKEN;
        snprintf(why, why_n, "wrong job token");
    } else if (env->body_case == MMPIPE__ENVELOPE__BODY__NOT_SET) {
        v = MMP_CTL_NO_BODY;
        snprintf(why, why_n, "no known body (none set, or a message type newer than this build)");
    } else if (!body_ok(env, why, why_n)) {
        v = MMP_CTL_BAD_BODY;
    } else {
        plain_fields(env);
        *out = env;
        return MMP_CTL_OK;
    }
    if (env) {
        mmpipe__envelope__free_unpacked(env, NULL);
    }
    return v;
}

/* Applies the checks, in the contract's order, to one payload that came with
 * `extra` frames after it. Returns the envelope, or NULL after counting the
 * rejection and writing its reason. */
static Mmpipe__Envelope *check(mmp_ctl *c, zmq_msg_t *payload, size_t extra, char *why,
                               size_t why_n)
{
    Mmpipe__Envelope *env = NULL;
    long *counter = &c->stats.bad_frames;
    if (extra > 0) {
        snprintf(why, why_n, "%zu payload frames, want 1", extra + 1);
    } else {
        mmp_ctl_verdict v = mmp_ctl_decode(zmq_msg_data(payload), zmq_msg_size(payload), c->token,
                                           &env, why, why_n);
        if (v == MMP_CTL_OK) {
            return env;
        }
        /* Each refusal's counter in mmp_ctl_stats, by verdict. */
        static const size_t counter_at[] = {
            [MMP_CTL_TOO_BIG] = offsetof(mmp_ctl_stats, too_big),
            [MMP_CTL_UNDECODABLE] = offsetof(mmp_ctl_stats, undecodable),
            [MMP_CTL_BAD_VERSION] = offsetof(mmp_ctl_stats, bad_version),
            [MMP_CTL_BAD_TOKEN] = offsetof(mmp_ctl_stats, bad_token),
            [MMP_CTL_NO_BODY] = offsetof(mmp_ctl_stats, no_body),
            [MMP_CTL_BAD_BODY] = offsetof(mmp_ctl_stats, bad_body),
        };
        counter = (long *)((char *)&c->stats + counter_at[v]);
    }
    (*counter)++;
    c->stats.rejected++;
    return NULL;
}

/* A CURVE ROUTER: peer id's messages come on descriptor fd (a new one after
 * a reconnect: its connection stands again). Peers past what memory allows
 * are not tracked (mmp_ctl_peer_dropped_s then says -1 for them). */
static void note_peer(mmp_ctl *c, const char *id, int fd)
{
    if (fd < 0) {
        return;
    }
    pthread_mutex_lock(&c->peers_lock);
    int i = 0;
    while (i < c->n_peers && strcmp(c->peers[i].id, id) != 0) {
        i++;
    }
    if (i == c->n_peers && c->n_peers == c->cap_peers) {
        int cap = c->cap_peers ? 2 * c->cap_peers : 16;
        ctl_peer *more = realloc(c->peers, (size_t)cap * sizeof *more);
        if (more) {
            c->peers = more;
            c->cap_peers = cap;
        }
    }
    if (i == c->n_peers && i < c->cap_peers) {
        snprintf(c->peers[i].id, sizeof c->peers[i].id, "%s", id);
        c->peers[i].fd = fd;
        c->peers[i].dropped_ms = 0;
        c->n_peers++;
    } else if (i < c->n_peers && c->peers[i].fd != fd) {
        /* a new connection: reconnected (ZMQ_ROUTER_HANDOVER), or a new
         * process under the same name */
        c->peers[i].fd = fd;
        c->peers[i].dropped_ms = 0;
    }
    pthread_mutex_unlock(&c->peers_lock);
}

double mmp_ctl_peer_dropped_s(mmp_ctl *c, const char *id)
{
    double t = -1;
    if (!c || !c->router || !c->curve) {
        return t;
    }
    pthread_mutex_lock(&c->peers_lock);
    for (int i = 0; i < c->n_peers; i++) {
        if (strcmp(c->peers[i].id, id) == 0 && c->peers[i].dropped_ms > 0) {
            t = (now_ms() - c->peers[i].dropped_ms) / 1e3;
        }
    }
    pthread_mutex_unlock(&c->peers_lock);
    return t;
}

/* Takes one message off the socket without waiting. 1: a valid envelope in
 * *env; 0: a message came and was rejected; -1: nothing queued, or a signal
 * (errno says which). `from` gets the sender's routing id on a ROUTER. */
static int take_one(mmp_ctl *c, Mmpipe__Envelope **env, char *from, size_t from_n)
{
    zmq_msg_t id, payload;
    char who[2 * MMP_CTL_ID_MAX + 8];
    char why[160];
    size_t extra = 0;
    int ret = 0, err = 0;
    zmq_msg_init(&id);
    zmq_msg_init(&payload);
    if (c->router) {
        if (zmq_msg_recv(&id, c->sock, ZMQ_DONTWAIT) < 0) {
            err = errno;
            ret = -1;
            goto exit;
        }
        id_text(who, sizeof who, zmq_msg_data(&id), zmq_msg_size(&id));
        /* A ROUTER always prepends the id; a peer cannot send zero frames.
         * Guard anyway rather than read the next message as this payload. */
        if (!zmq_msg_more(&id)) {
            c->stats.bad_frames++;
            c->stats.rejected++;
            MMP_WARN("control: rejected a message from %s: no payload frame", who);
            goto exit;
        }
        zmq_msg_recv(&payload, c->sock, ZMQ_DONTWAIT);
    } else {
        if (zmq_msg_recv(&payload, c->sock, ZMQ_DONTWAIT) < 0) {
            err = errno;
            ret = -1;
            goto exit;
        }
        snprintf(who, sizeof who, "%.*s", (int)sizeof who - 1, c->peer);
    }
    if (zmq_msg_more(&payload)) {
        extra = drain(c->sock);
    }
    *env = check(c, &payload, extra, why, sizeof why);
    if (!*env) {
        MMP_WARN("control: rejected a message from %s: %s", who, why);
        goto exit;
    }
    c->stats.received++;
    if (c->router && c->curve) {
        note_peer(c, who, zmq_msg_get(&payload, ZMQ_SRCFD));
    }
    if (from && from_n > 0) {
        if (c->router) {
            id_text(from, from_n, zmq_msg_data(&id), zmq_msg_size(&id));
        } else {
            from[0] = 0;
        }
    }
    ret = 1;
exit:
    zmq_msg_close(&id);
    zmq_msg_close(&payload);
    errno = err; /* the caller tells EAGAIN from EINTR */
    return ret;
}

mmp_err mmp_ctl_recv(mmp_ctl *c, int timeout_ms, Mmpipe__Envelope **env, char *from, size_t from_n)
{
    *env = NULL;
    if (from && from_n > 0) {
        from[0] = 0;
    }
    if (!c) {
        return mmp_errorf(MMP_ERR_INVALID, "control: recv: no channel");
    }
    double deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        int got = take_one(c, env, from, from_n);
        if (got == 1) {
            return MMP_OK;
        }
        if (got == 0) {
            continue; /* rejected: whatever else is queued, within the same deadline */
        }
        if (errno == EINTR) {
            return mmp_errorf(MMP_ERR_TIMEOUT, "control: wait interrupted by a signal");
        }
        if (errno != EAGAIN) {
            return mmp_errorf(MMP_ERR_IO, "control: recv: %s", zmq_strerror(errno));
        }
        long wait = -1;
        if (timeout_ms >= 0) {
            double left = deadline - now_ms();
            if (left <= 0) {
                return mmp_errorf(MMP_ERR_TIMEOUT, "control: no message within %d ms", timeout_ms);
            }
            wait = (long)left + 1; /* round up: never return before the deadline */
        }
        zmq_pollitem_t item = {.socket = c->sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, wait) < 0) {
            if (errno == EINTR) {
                return mmp_errorf(MMP_ERR_TIMEOUT, "control: wait interrupted by a signal");
            }
            return mmp_errorf(MMP_ERR_IO, "control: zmq_poll: %s", zmq_strerror(errno));
        }
        /* Ready or not, loop: take_one finds out, and the deadline is rechecked. */
    }
}

void mmp_ctl_free(Mmpipe__Envelope *env)
{
    if (env) {
        mmpipe__envelope__free_unpacked(env, NULL);
    }
}

void *mmp_ctl_socket(mmp_ctl *c)
{
    return c ? c->sock : NULL;
}

mmp_ctl_stats mmp_ctl_get_stats(const mmp_ctl *c)
{
    mmp_ctl_stats zero = {0};
    if (!c) {
        return zero;
    }
    mmp_ctl_stats s = c->stats;
    s.refused = atomic_load(&((mmp_ctl *)c)->refused);
    return s;
}

void mmp_ctl_last_refused(mmp_ctl *c, char *buf, size_t n)
{
    if (n == 0) {
        return;
    }
    buf[0] = 0;
    if (c) {
        pthread_mutex_lock(&c->refused_lock);
        snprintf(buf, n, "%s", c->refused_text);
        pthread_mutex_unlock(&c->refused_lock);
    }
}

mmp_err mmp_ctl_last_endpoint(mmp_ctl *c, char *buf, size_t n)
{
    size_t len = n;
    if (!c || n == 0 || zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, buf, &len) != 0) {
        return mmp_errorf(MMP_ERR_IO, "control: last endpoint: %s", zmq_strerror(errno));
    }
    return MMP_OK;
}

mmp_err mmp_ctl_new_keys(mmp_ctl_keys *k)
{
    memset(k, 0, sizeof *k);
    if (!zmq_has("curve")) {
        return mmp_errorf(MMP_ERR_UNSUPPORTED,
                          "control: this libzmq has no CURVE (build it with libsodium); the "
                          "control plane over tcp needs it");
    }
    if (zmq_curve_keypair(k->server_public, k->server_secret) != 0 ||
        zmq_curve_keypair(k->client_public, k->client_secret) != 0) {
        return mmp_errorf(MMP_ERR_IO, "control: zmq_curve_keypair: %s", zmq_strerror(errno));
    }
    return MMP_OK;
}

static mmp_err urandom(unsigned char *buf, size_t n)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "open /dev/urandom: %s", strerror(errno));
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            close(fd);
            return mmp_errorf(MMP_ERR_IO, "read /dev/urandom: %s",
                              r < 0 ? strerror(errno) : "end of file");
        }
        got += (size_t)r;
    }
    close(fd);
    return MMP_OK;
}

mmp_err mmp_ctl_new_token(char tok[33])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 && errno == ENOSYS) {
            MMP_TRY(urandom(raw + got, sizeof raw - got));
            break;
        }
        if (r < 0) {
            return mmp_errorf(MMP_ERR_IO, "getrandom: %s", strerror(errno));
        }
        got += (size_t)r;
    }
    for (size_t i = 0; i < sizeof raw; i++) {
        tok[2 * i] = hex[raw[i] >> 4];
        tok[2 * i + 1] = hex[raw[i] & 15];
    }
    tok[32] = 0;
    explicit_bzero(raw, sizeof raw);
    return MMP_OK;
}

mmp_err mmp_ctl_reserve_fds(long need, const char *what)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: getrlimit(RLIMIT_NOFILE): %s", what, strerror(errno));
    }
    if (rl.rlim_cur == RLIM_INFINITY || (rlim_t)need <= rl.rlim_cur) {
        return MMP_OK;
    }
    if (rl.rlim_max != RLIM_INFINITY && (rlim_t)need > rl.rlim_max) {
        return mmp_errorf(MMP_ERR_CONFIG,
                          "%s need about %ld open files, more than this process may have "
                          "(RLIMIT_NOFILE: soft %llu, hard %llu; raise the hard limit, e.g. "
                          "ulimit -Hn, or run fewer processes)",
                          what, need, (unsigned long long)rl.rlim_cur,
                          (unsigned long long)rl.rlim_max);
    }
    struct rlimit up = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &up) != 0) {
        return mmp_errorf(MMP_ERR_IO,
                          "%s need about %ld open files: raising RLIMIT_NOFILE from %llu "
                          "to %llu: %s",
                          what, need, (unsigned long long)rl.rlim_cur,
                          (unsigned long long)rl.rlim_max, strerror(errno));
    }
    return MMP_OK;
}
