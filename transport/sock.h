/* TCP socket plumbing shared by the tcp data channel (transport/tcp.c) and
 * the replica reduce over tcp (transport/reduce_tcp.c). Internal to
 * transport/.
 *
 * Addresses are "host:port" (an IPv6 literal in brackets: "[::1]:4000"); host
 * is a name or a numeric address, port 0..65535 (0: a listener binds any free
 * port and reports it). Every blocking call takes an absolute deadline on the
 * monotonic clock (mmp_sock_now_ms() + timeout; <= 0: none) and an optional
 * stop fd (an eventfd another thread writes to end the wait; -1: none).
 *
 * Errors: MMP_ERR_INVALID for a malformed address, MMP_ERR_IO for a local
 * socket failure, MMP_ERR_PEER for everything the other end or the network
 * causes (refused until the deadline, closed, reset, silent past the
 * deadline), each message starting with `what` (the caller's channel and
 * peer). Must never: block without a deadline check every SLICE, raise
 * SIGPIPE, or trust a length it did not get from its caller. */
#ifndef MMP_TRANSPORT_SOCK_H
#define MMP_TRANSPORT_SOCK_H

#include <stddef.h>
#include <sys/uio.h>

#include "common/err.h"

#define MMP_SOCK_ADDR_MAX 300 /* "host:port" as text, host up to 255 */
/* A connected peer that answers nothing at the TCP level (its host gone)
 * for this long is lost (keepalive and TCP_USER_TIMEOUT, sock.c). */
#define MMP_SOCK_LOST_MS 20000

double mmp_sock_now_ms(void);
/* now + timeout_ms, or 0 (no deadline) when timeout_ms <= 0. */
double mmp_sock_deadline(int timeout_ms);

/* Splits "host:port": host (brackets removed) into host[host_n], *port.
 * A host is made of [A-Za-z0-9._-]; in brackets, an IPv6 literal (':' and
 * '%' also, at least one ':').
 * MMP_ERR_INVALID naming `what` and the address when it is not one. */
mmp_err mmp_sock_parse(const char *what, const char *address, char *host, size_t host_n, int *port);

/* A listening socket on address (port 0: a free one), non-blocking, and the
 * address it listens on with the real port in bound[bound_n]. */
mmp_err mmp_sock_listen(int *fd, const char *what, const char *address, char *bound,
                        size_t bound_n);

/* Accepts one connection (waits until the deadline or the stop fd):
 * MMP_ERR_TIMEOUT when neither came, else *out (non-blocking, tuned) and the
 * peer's "host:port" in peer[peer_n]. A deadline already past (e.g. 1.0)
 * takes a connection that is waiting, or returns MMP_ERR_TIMEOUT at once.
 * A listener's backlog holds MMP_AUTH_PENDING connections (transport/auth.h). */
mmp_err mmp_sock_accept(int lfd, int *out, char *peer, size_t peer_n, double deadline, int stop_fd);

/* Connects to address, retrying a refused or unreachable one every few ms
 * until the deadline (MMP_ERR_PEER then). *fd is non-blocking and tuned. */
mmp_err mmp_sock_connect(int *fd, const char *what, const char *address, double deadline);

/* Writes every byte of iov[0..n) (the array is consumed). */
mmp_err mmp_sock_writev(int fd, const char *what, struct iovec *iov, int n, double deadline,
                        int stop_fd);
/* Reads exactly bytes into buf. A clean EOF before the first byte is
 * MMP_ERR_PEER with "closed" in the message; *got (may be NULL) says how many
 * bytes arrived before a failure. */
mmp_err mmp_sock_read(int fd, const char *what, void *buf, size_t bytes, double deadline,
                      int stop_fd, size_t *got);
/* Whatever is readable now, without waiting: *n bytes (0: none). EOF or a
 * reset is MMP_ERR_PEER. */
mmp_err mmp_sock_read_some(int fd, const char *what, void *buf, size_t cap, size_t *n);

/* Ends the waits given stop_fd: adds 1 to the eventfd, which stays readable
 * until someone reads it. A failure is logged with `what`, not returned (the
 * caller is closing). */
void mmp_sock_stop(int stop_fd, const char *what);

/* Sender's orderly close: FIN after the queued bytes, then waits (draining
 * and discarding whatever arrives) until the peer acknowledged every byte,
 * at most until the deadline, so closing never turns into a reset that would
 * throw away data not yet sent. Then closes fd. fd < 0: a no-op. */
void mmp_sock_close_graceful(int fd, double deadline);

#endif
