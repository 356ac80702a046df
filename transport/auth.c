/* The job-key handshake (transport/auth.h): HMAC-SHA256 challenge and
 * response with libsodium's primitives (randombytes_buf, crypto_auth_
 * hmacsha256, sodium_memcmp), never a home-made one; and the listener's
 * gate, the same steps driven for every pending connection at once from
 * one poll, so that no connection can make the next one wait.
 *
 * Must never: let one connection's silence delay another's handshake, keep
 * a connection past its own deadline, or hand the caller a connection whose
 * hello the judge did not take. */
#include "transport/auth.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "transport/sock.h"

#define AUTH_MAGIC "MMPAUTH1"
#define NONCE 32

static const char ROLE_CONNECTOR[] = "mmpipe connector";
static const char ROLE_LISTENER[] = "mmpipe listener";

/* HMAC-SHA256(secret, role || a || b) into mac. */
static void mac_of(unsigned char mac[crypto_auth_hmacsha256_BYTES], const char *secret,
                   const char *role, const unsigned char a[NONCE], const unsigned char b[NONCE])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, (const unsigned char *)secret, strlen(secret));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)role, strlen(role) + 1);
    crypto_auth_hmacsha256_update(&st, a, NONCE);
    crypto_auth_hmacsha256_update(&st, b, NONCE);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
}

/* This end's first part: the magic and a fresh nonce. */
static void first_part(unsigned char mine[8 + NONCE])
{
    memcpy(mine, AUTH_MAGIC, 8);
    randombytes_buf(mine + 8, NONCE);
}

/* Checks the other end's first part and computes this end's HMAC (my_mac)
 * and the one the other end must send (want). */
static mmp_err answer(const char *what, const char *secret, int connector,
                      const unsigned char mine[8 + NONCE], const unsigned char theirs[8 + NONCE],
                      unsigned char my_mac[crypto_auth_hmacsha256_BYTES],
                      unsigned char want[crypto_auth_hmacsha256_BYTES])
{
    if (memcmp(theirs, AUTH_MAGIC, 8) != 0) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "%s: not an mmpipe peer (its first bytes are not the job-key handshake)",
                          what);
    }
    if (sodium_memcmp(theirs + 8, mine + 8, NONCE) == 0) {
        return mmp_errorf(MMP_ERR_PROTO, "%s: the peer sent this end's own nonce back", what);
    }
    mac_of(my_mac, secret, connector ? ROLE_CONNECTOR : ROLE_LISTENER, mine + 8, theirs + 8);
    mac_of(want, secret, connector ? ROLE_LISTENER : ROLE_CONNECTOR, theirs + 8, mine + 8);
    return MMP_OK;
}

static mmp_err check_mac(const char *what, const unsigned char got[crypto_auth_hmacsha256_BYTES],
                         const unsigned char want[crypto_auth_hmacsha256_BYTES])
{
    if (sodium_memcmp(got, want, crypto_auth_hmacsha256_BYTES) != 0) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "%s: the peer does not hold this job's key (its HMAC of the nonces is "
                          "wrong): a process of another job, or of none",
                          what);
    }
    return MMP_OK;
}

static mmp_err ready(const char *what, const char *secret)
{
    if (!secret || !secret[0]) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: no job secret to authenticate the connection",
                          what);
    }
    if (sodium_init() < 0) {
        return mmp_errorf(MMP_ERR_INTERNAL, "%s: libsodium failed to initialise", what);
    }
    return MMP_OK;
}

mmp_err mmp_auth_handshake(int fd, const char *what, const char *secret, int connector,
                           double deadline, int stop_fd)
{
    MMP_TRY(ready(what, secret));
    unsigned char mine[8 + NONCE], theirs[8 + NONCE];
    first_part(mine);
    struct iovec iov = {mine, sizeof mine};
    MMP_TRY(mmp_sock_writev(fd, what, &iov, 1, deadline, stop_fd));
    MMP_TRY(mmp_sock_read(fd, what, theirs, sizeof theirs, deadline, stop_fd, NULL));
    unsigned char my_mac[crypto_auth_hmacsha256_BYTES], want[crypto_auth_hmacsha256_BYTES],
        got[crypto_auth_hmacsha256_BYTES];
    mmp_err e = answer(what, secret, connector, mine, theirs, my_mac, want);
    if (e == MMP_OK) {
        iov = (struct iovec){my_mac, sizeof my_mac};
        e = mmp_sock_writev(fd, what, &iov, 1, deadline, stop_fd);
    }
    if (e == MMP_OK) {
        e = mmp_sock_read(fd, what, got, sizeof got, deadline, stop_fd, NULL);
    }
    if (e == MMP_OK) {
        e = check_mac(what, got, want);
    }
    sodium_memzero(want, sizeof want);
    return e;
}

/* ---- the gate ------------------------------------------------------------ */

enum { WANT_PART, WANT_MAC, WANT_HELLO };

typedef struct pending {
    int fd; /* -1: a free place */
    int stage;
    double deadline;
    double since; /* accepted at (the oldest goes first when the gate is full) */
    size_t have;  /* bytes of the stage's input so far */
    unsigned char in[MMP_AUTH_HELLO_MAX];
    unsigned char mine[8 + NONCE];
    unsigned char want[crypto_auth_hmacsha256_BYTES];
    char peer[MMP_SOCK_ADDR_MAX];
} pending;

_Static_assert(MMP_AUTH_HELLO_MAX >= 8 + NONCE, "the gate reads the first part into in");

struct mmp_auth_gate {
    int lfd, hello_ms;
    char what[700];
    const char *secret;
    size_t hello_bytes, reply_bytes;
    mmp_auth_judge_fn judge;
    void *ctx;
    pending p[MMP_AUTH_PENDING];
};

mmp_err mmp_auth_gate_create(mmp_auth_gate **out, int lfd, const char *what, const char *secret,
                             size_t hello_bytes, size_t reply_bytes, int hello_ms,
                             mmp_auth_judge_fn judge, void *ctx)
{
    *out = NULL;
    MMP_TRY(ready(what, secret));
    if (hello_bytes == 0 || hello_bytes > MMP_AUTH_HELLO_MAX || reply_bytes > MMP_AUTH_HELLO_MAX) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "%s: a hello of %zu bytes and an answer of %zu (at most %d)", what,
                          hello_bytes, reply_bytes, MMP_AUTH_HELLO_MAX);
    }
    mmp_auth_gate *g = calloc(1, sizeof *g);
    if (!g) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: the handshake gate", what);
    }
    g->lfd = lfd;
    g->hello_ms = hello_ms;
    snprintf(g->what, sizeof g->what, "%s", what);
    g->secret = secret;
    g->hello_bytes = hello_bytes;
    g->reply_bytes = reply_bytes;
    g->judge = judge;
    g->ctx = ctx;
    for (int i = 0; i < MMP_AUTH_PENDING; i++) {
        g->p[i].fd = -1;
    }
    *out = g;
    return MMP_OK;
}

/* Ends a pending connection: closed unless kept (handed to the caller),
 * logged as refused when why is not NULL (an error message that already
 * names the connection is logged as it is). */
static void drop(mmp_auth_gate *g, pending *c, const char *why, int keep)
{
    if (why) {
        char who[sizeof g->what + MMP_SOCK_ADDR_MAX + 16];
        size_t n = (size_t)snprintf(who, sizeof who, "%s: connector %s: ", g->what, c->peer);
        if (strncmp(why, who, n) == 0) {
            why += n;
        }
        MMP_WARN("%s%s; refused", who, why);
    }
    if (!keep) {
        close(c->fd);
    }
    sodium_memzero(c, sizeof *c);
    c->fd = -1;
}

static size_t stage_bytes(const mmp_auth_gate *g, int stage)
{
    return stage == WANT_PART  ? 8 + NONCE
           : stage == WANT_MAC ? crypto_auth_hmacsha256_BYTES
                               : g->hello_bytes;
}

/* A small write on a connection this end just accepted (nothing of ours
 * queued before it but a few dozen bytes): never waits past its deadline. */
static mmp_err say(pending *c, const char *what, const void *bytes, size_t n)
{
    struct iovec iov = {(void *)bytes, n};
    return mmp_sock_writev(c->fd, what, &iov, 1, c->deadline, -1);
}

/* Takes every connection waiting on the listening socket into a place. */
static mmp_err take_new(mmp_auth_gate *g)
{
    for (;;) {
        int fd = -1;
        char peer[MMP_SOCK_ADDR_MAX];
        /* a deadline already past: one waiting connection, or none at once */
        mmp_err e = mmp_sock_accept(g->lfd, &fd, peer, sizeof peer, 1.0, -1);
        if (e == MMP_ERR_TIMEOUT) {
            return MMP_OK;
        }
        if (e != MMP_OK) {
            return mmp_error_prefix(e, "%s", g->what);
        }
        pending *c = NULL, *oldest = NULL;
        for (int i = 0; i < MMP_AUTH_PENDING && !c; i++) {
            if (g->p[i].fd < 0) {
                c = &g->p[i];
            } else if (!oldest || g->p[i].since < oldest->since) {
                oldest = &g->p[i];
            }
        }
        if (!c) {
            char why[96];
            snprintf(why, sizeof why, "%d connections in the handshake at once, the oldest dropped",
                     MMP_AUTH_PENDING);
            drop(g, oldest, why, 0);
            c = oldest;
        }
        c->fd = fd;
        c->stage = WANT_PART;
        c->have = 0;
        c->since = mmp_sock_now_ms();
        c->deadline = c->since + g->hello_ms;
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        first_part(c->mine);
        char what[sizeof g->what + MMP_SOCK_ADDR_MAX + 16];
        snprintf(what, sizeof what, "%s: connector %s", g->what, peer);
        if (say(c, what, c->mine, sizeof c->mine) != MMP_OK) {
            drop(g, c, mmp_last_error(), 0);
        }
    }
}

/* Reads what arrived on c and moves it on; 1 when c passed (its hello is
 * in c->in and the judge took it), 0 otherwise (c may have been dropped). */
static int advance(mmp_auth_gate *g, pending *c)
{
    char what[sizeof g->what + MMP_SOCK_ADDR_MAX + 16];
    snprintf(what, sizeof what, "%s: connector %s", g->what, c->peer);
    for (;;) {
        size_t want = stage_bytes(g, c->stage), n = 0;
        if (mmp_sock_read_some(c->fd, what, c->in + c->have, want - c->have, &n) != MMP_OK) {
            drop(g, c,
                 c->stage == WANT_PART  ? "closed or reset before the handshake"
                 : c->stage == WANT_MAC ? "closed or reset during the handshake"
                                        : "closed or reset before its hello",
                 0);
            return 0;
        }
        c->have += n;
        if (c->have < want) {
            return 0; /* more later */
        }
        c->have = 0;
        if (c->stage == WANT_PART) {
            unsigned char my_mac[crypto_auth_hmacsha256_BYTES];
            mmp_err e = answer(what, g->secret, 0, c->mine, c->in, my_mac, c->want);
            if (e == MMP_OK) {
                e = say(c, what, my_mac, sizeof my_mac);
            }
            if (e != MMP_OK) {
                drop(g, c, mmp_last_error(), 0);
                return 0;
            }
            c->stage = WANT_MAC;
        } else if (c->stage == WANT_MAC) {
            if (check_mac(what, c->in, c->want) != MMP_OK) {
                drop(g, c, mmp_last_error(), 0);
                return 0;
            }
            c->stage = WANT_HELLO;
        } else {
            unsigned char reply[MMP_AUTH_HELLO_MAX] = {0};
            const char *why = "refused by the listener";
            int verdict = g->judge(g->ctx, c->in, reply, &why);
            if (verdict >= 0 && say(c, what, reply, g->reply_bytes) != MMP_OK) {
                drop(g, c, mmp_last_error(), 0);
                return 0;
            }
            if (verdict != 0) {
                drop(g, c, why, 0);
                return 0;
            }
            return 1;
        }
    }
}

mmp_err mmp_auth_gate_next(mmp_auth_gate *g, int stop_fd, int *fd, char *peer, size_t peer_n,
                           void *hello)
{
    *fd = -1;
    for (;;) {
        struct pollfd pf[2 + MMP_AUTH_PENDING];
        pending *of[2 + MMP_AUTH_PENDING];
        int n = 0;
        pf[n] = (struct pollfd){.fd = stop_fd, .events = POLLIN};
        of[n++] = NULL;
        pf[n] = (struct pollfd){.fd = g->lfd, .events = POLLIN};
        of[n++] = NULL;
        double now = mmp_sock_now_ms(), soonest = now + 100; /* re-check at least this often */
        for (int i = 0; i < MMP_AUTH_PENDING; i++) {
            pending *c = &g->p[i];
            if (c->fd < 0) {
                continue;
            }
            if (now >= c->deadline) {
                char why[64];
                snprintf(why, sizeof why, "nothing from it in %d ms", g->hello_ms);
                drop(g, c, why, 0);
                continue;
            }
            if (c->deadline < soonest) {
                soonest = c->deadline;
            }
            pf[n] = (struct pollfd){.fd = c->fd, .events = POLLIN};
            of[n++] = c;
        }
        int r = poll(pf, (nfds_t)n, (int)(soonest - now) + 1);
        if (r < 0 && errno != EINTR) {
            return mmp_errorf(MMP_ERR_IO, "%s: poll: %s", g->what, strerror(errno));
        }
        if (r <= 0) {
            continue;
        }
        if (pf[0].revents) {
            return MMP_ERR_TIMEOUT;
        }
        for (int k = 2; k < n; k++) {
            pending *c = of[k];
            if (pf[k].revents && c->fd == pf[k].fd && advance(g, c)) {
                *fd = c->fd;
                snprintf(peer, peer_n, "%s", c->peer);
                memcpy(hello, c->in, g->hello_bytes);
                drop(g, c, NULL, 1);
                return MMP_OK;
            }
        }
        if (pf[1].revents) {
            MMP_TRY(take_new(g));
        }
    }
}

void mmp_auth_gate_destroy(mmp_auth_gate *g, const char *why)
{
    if (!g) {
        return;
    }
    for (int i = 0; i < MMP_AUTH_PENDING; i++) {
        if (g->p[i].fd >= 0) {
            drop(g, &g->p[i], why, 0);
        }
    }
    sodium_memzero(g, sizeof *g);
    free(g);
}
