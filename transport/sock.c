/* TCP socket plumbing (the contract is in sock.h): parsing "host:port",
 * listening, accepting, connecting with retries, and full reads and writes
 * with deadlines on non-blocking sockets.
 *
 * Must never: block in a system call without poll's deadline, raise SIGPIPE
 * (MSG_NOSIGNAL), or leak a descriptor on an error path. */

#include "transport/sock.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "transport/auth.h"
#include "transport/channel.h"
#include "transport/reduce_nccl.h"

#define NCCL_TAG "#nccl:" /* as transport/cuda/nccl.c and reduce_nccl.c */

/* A wait re-checks its deadline at least this often (ms). */
#define SLICE_MS 100
/* A refused connect is retried this often (ms). */
#define RETRY_MS 10
/* Socket buffers asked for: a micro-batch's activations are MBs, and the
 * default (autotuned from 128 KiB) makes a loopback stream stall on acks.
 * The kernel caps them at net.core.[rw]mem_max. */
#define SOCK_BUF (4 << 20)

double mmp_sock_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

double mmp_sock_deadline(int timeout_ms)
{
    return timeout_ms > 0 ? mmp_sock_now_ms() + timeout_ms : 0;
}

/* The poll timeout for one slice before the deadline; -1 when it passed. */
static int slice_left(double deadline)
{
    if (deadline <= 0) {
        return SLICE_MS;
    }
    double left = deadline - mmp_sock_now_ms();
    if (left <= 0) {
        return -1;
    }
    return left < SLICE_MS ? (int)left + 1 : SLICE_MS;
}

mmp_err mmp_sock_parse(const char *what, const char *address, char *host, size_t host_n, int *port)
{
    const char *a = address ? address : "";
    const char *colon = strrchr(a, ':');
    const char *h = a;
    size_t hl = colon ? (size_t)(colon - a) : 0;
    if (colon && a[0] == '[') {
        /* "[v6]:port" */
        if (hl < 2 || a[hl - 1] != ']') {
            colon = NULL;
        } else {
            h = a + 1;
            hl -= 2;
        }
    } else if (colon && memchr(a, ':', hl)) {
        colon = NULL; /* a bare IPv6 literal needs brackets */
    }
    char *end = NULL;
    long p = -1;
    if (colon && colon[1] >= '0' && colon[1] <= '9') {
        errno = 0;
        p = strtol(colon + 1, &end, 10);
        if (errno || *end) {
            p = -1;
        }
    }
    /* A host is a name or a numeric address: nothing else reaches
     * getaddrinfo (nor reads as a shm name, '/'). */
    int bracket = h != a;
    if (bracket && !memchr(h, ':', hl)) {
        colon = NULL; /* brackets hold an IPv6 literal, nothing else */
    }
    for (size_t i = 0; colon && i < hl; i++) {
        char c = h[i];
        if (!(isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_' ||
              (bracket && (c == ':' || c == '%')))) {
            colon = NULL;
        }
    }
    if (!colon || hl == 0 || hl >= host_n || p < 0 || p > 65535) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "%s: address '%s' is not host:port (host of [A-Za-z0-9._-], port "
                          "0..65535; IPv6 as [addr]:port)",
                          what, a);
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return MMP_OK;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* "host:port#nccl:<2 x MMP_NCCL_ID_BYTES hex digits>" (what a nccl creator's
 * address says; from another process, so checked whole). Plain text: CPU
 * builds have it too (the stages' endpoint check, tests/fuzz/fuzz_endpoint.c). */
mmp_err mmp_nccl_parse_address(const char *address, char *host_port, size_t cap, void *id_out)
{
    const char *tag = address ? strstr(address, NCCL_TAG) : NULL;
    if (!tag) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "nccl address '%s': no '%s<id>' (the creator's address carries its "
                          "ncclUniqueId)",
                          address ? address : "(null)", NCCL_TAG);
    }
    size_t hp = (size_t)(tag - address);
    if (hp == 0 || hp >= cap || !memchr(address, ':', hp)) {
        return mmp_errorf(MMP_ERR_PROTO, "nccl address '%.*s': not \"host:port\"", (int)hp,
                          address);
    }
    const char *hex = tag + strlen(NCCL_TAG);
    size_t want = 2 * MMP_NCCL_ID_BYTES;
    if (strlen(hex) != want) {
        return mmp_errorf(MMP_ERR_PROTO, "nccl address: the id has %zu hex digits, not %zu",
                          strlen(hex), want);
    }
    unsigned char *id = id_out;
    for (size_t i = 0; i < MMP_NCCL_ID_BYTES; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return mmp_errorf(MMP_ERR_PROTO, "nccl address: id digit %zu is not hex",
                              hi < 0 ? 2 * i : 2 * i + 1);
        }
        id[i] = (unsigned char)(hi * 16 + lo);
    }
    memcpy(host_port, address, hp);
    host_port[hp] = 0;
    return MMP_OK;
}

static void format_addr(const struct sockaddr *sa, char *out, size_t n)
{
    char h[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const void *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, h, sizeof h);
        port = ntohs(s6->sin6_port);
        snprintf(out, n, "[%s]:%d", h, port);
        return;
    }
    const struct sockaddr_in *s4 = (const void *)sa;
    inet_ntop(AF_INET, &s4->sin_addr, h, sizeof h);
    port = ntohs(s4->sin_port);
    snprintf(out, n, "%s:%d", h, port);
}

static mmp_err resolve(const char *what, const char *address, struct addrinfo **res, int passive)
{
    char host[256];
    int port = 0;
    MMP_TRY(mmp_sock_parse(what, address, host, sizeof host, &port));
    char serv[8];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    int g = getaddrinfo(host, serv, &hints, res);
    if (g != 0) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: address '%s': host %s: %s", what, address, host,
                          gai_strerror(g));
    }
    return MMP_OK;
}

static void tune(int fd)
{
    int one = 1, buf = SOCK_BUF;
    /* Best effort: a refusal only costs speed. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    /* A peer host that vanishes (link down, power off) sends no FIN nor
     * reset: with nothing in flight keepalive notices it in ~20 s, with
     * bytes unacknowledged TCP_USER_TIMEOUT does in 20 s (instead of the
     * ~15 minutes of retransmissions), even for an end whose timeout is
     * forever. The connection then fails as ETIMEDOUT: MMP_ERR_PEER. */
    int idle = 10, intvl = 2, cnt = 5;
    unsigned user_ms = MMP_SOCK_LOST_MS;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

mmp_err mmp_sock_listen(int *fd, const char *what, const char *address, char *bound, size_t bound_n)
{
    *fd = -1;
    struct addrinfo *res = NULL;
    MMP_TRY(resolve(what, address, &res, 1));
    int err = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int s =
            socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (s < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        int buf = SOCK_BUF; /* inherited by accepted sockets, before the handshake */
        (void)setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        if (bind(s, ai->ai_addr, ai->ai_addrlen) != 0 || listen(s, MMP_AUTH_PENDING) != 0) {
            err = errno;
            close(s);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(s, (struct sockaddr *)&ss, &sl) != 0) {
            err = errno;
            close(s);
            continue;
        }
        /* The host as the caller named it (reachable by the peer as such),
         * the port the kernel gave. */
        char host[256];
        int port = 0;
        (void)mmp_sock_parse(what, address, host, sizeof host, &port);
        int real = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        snprintf(bound, bound_n, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, real);
        freeaddrinfo(res);
        *fd = s;
        return MMP_OK;
    }
    freeaddrinfo(res);
    return mmp_errorf(MMP_ERR_IO, "%s: listen on %s: %s", what, address, strerror(err));
}

mmp_err mmp_sock_accept(int lfd, int *out, char *peer, size_t peer_n, double deadline, int stop_fd)
{
    *out = -1;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int s = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (s >= 0) {
            tune(s);
            format_addr((struct sockaddr *)&ss, peer, peer_n);
            *out = s;
            return MMP_OK;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
            return mmp_errorf(MMP_ERR_IO, "accept: %s", strerror(errno));
        }
        int slice = slice_left(deadline);
        if (slice < 0) {
            return MMP_ERR_TIMEOUT;
        }
        struct pollfd p[2] = {{.fd = lfd, .events = POLLIN}, {.fd = stop_fd, .events = POLLIN}};
        if (poll(p, stop_fd >= 0 ? 2 : 1, slice) > 0 && stop_fd >= 0 && p[1].revents) {
            return MMP_ERR_TIMEOUT;
        }
    }
}

mmp_err mmp_sock_connect(int *fd, const char *what, const char *address, double deadline)
{
    *fd = -1;
    struct addrinfo *res = NULL;
    MMP_TRY(resolve(what, address, &res, 0));
    char host[256];
    int port = 0;
    (void)mmp_sock_parse(what, address, host, sizeof host, &port);
    if (port == 0) {
        freeaddrinfo(res);
        return mmp_errorf(MMP_ERR_INVALID, "%s: cannot connect to port 0 of %s", what, address);
    }
    int err = 0, tries = 0;
    for (;;) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                           ai->ai_protocol);
            if (s < 0) {
                err = errno;
                continue;
            }
            int buf = SOCK_BUF; /* before connect: the window scale is fixed at SYN */
            (void)setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
            int c = connect(s, ai->ai_addr, ai->ai_addrlen);
            if (c != 0 && errno == EINPROGRESS) {
                /* Wait for the handshake (an unreachable host: until the deadline). */
                for (;;) {
                    int slice = slice_left(deadline);
                    if (slice < 0) {
                        break;
                    }
                    struct pollfd p = {.fd = s, .events = POLLOUT};
                    if (poll(&p, 1, slice) > 0) {
                        int soerr = 0;
                        socklen_t l = sizeof soerr;
                        getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &l);
                        c = soerr ? -1 : 0;
                        errno = soerr;
                        break;
                    }
                }
                if (c != 0 && errno == EINPROGRESS) {
                    errno = ETIMEDOUT;
                }
            }
            if (c == 0) {
                tune(s);
                freeaddrinfo(res);
                *fd = s;
                return MMP_OK;
            }
            err = errno;
            close(s);
        }
        tries++;
        double left = deadline > 0 ? deadline - mmp_sock_now_ms() : RETRY_MS;
        if (left <= 0) {
            break;
        }
        struct timespec t = {0, (long)(left < RETRY_MS ? left : RETRY_MS) * 1000000L};
        nanosleep(&t, NULL);
    }
    freeaddrinfo(res);
    return mmp_errorf(MMP_ERR_PEER, "%s: no listener at %s (%d tries until the timeout, last: %s)",
                      what, address, tries, strerror(err));
}

/* errno of a failed read/write as the peer's doing. */
static mmp_err peer_error(const char *what, int err, const char *doing)
{
    if (err == ECONNRESET || err == EPIPE || err == ECONNABORTED) {
        return mmp_errorf(MMP_ERR_PEER, "%s: %s: connection lost (%s: the peer exited or died)",
                          what, doing, strerror(err));
    }
    if (err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH) {
        return mmp_errorf(MMP_ERR_PEER,
                          "%s: %s: connection lost (%s: the peer's host is unreachable or went "
                          "silent)",
                          what, doing, strerror(err));
    }
    return mmp_errorf(MMP_ERR_IO, "%s: %s: %s", what, doing, strerror(err));
}

/* Waits until fd is ready for `events`: 0, or -1 on the deadline or the stop fd. */
static int wait_ready(int fd, short events, double deadline, int stop_fd)
{
    for (;;) {
        int slice = slice_left(deadline);
        if (slice < 0) {
            return -1;
        }
        struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = stop_fd, .events = POLLIN}};
        int r = poll(p, stop_fd >= 0 ? 2 : 1, slice);
        if (r > 0) {
            if (stop_fd >= 0 && p[1].revents) {
                return -1;
            }
            return 0; /* ready, or an error the next call reports */
        }
    }
}

mmp_err mmp_sock_writev(int fd, const char *what, struct iovec *iov, int n, double deadline,
                        int stop_fd)
{
    int i = 0;
    while (i < n) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        struct msghdr m = {.msg_iov = iov + i, .msg_iovlen = (size_t)(n - i)};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                return peer_error(what, errno, "sending");
            }
            if (wait_ready(fd, POLLOUT, deadline, stop_fd) != 0) {
                return mmp_errorf(MMP_ERR_PEER, "%s: sending: the peer took nothing for %s", what,
                                  deadline > 0 ? "the channel's timeout" : "ever");
            }
            continue;
        }
        size_t done = (size_t)w;
        while (i < n && done >= iov[i].iov_len) {
            done -= iov[i].iov_len;
            i++;
        }
        if (i < n) {
            iov[i].iov_base = (char *)iov[i].iov_base + done;
            iov[i].iov_len -= done;
        }
    }
    return MMP_OK;
}

mmp_err mmp_sock_read(int fd, const char *what, void *buf, size_t bytes, double deadline,
                      int stop_fd, size_t *got)
{
    size_t have = 0;
    mmp_err ret = MMP_OK;
    while (have < bytes) {
        ssize_t r = recv(fd, (char *)buf + have, bytes - have, 0);
        if (r > 0) {
            have += (size_t)r;
            continue;
        }
        if (r == 0) {
            ret = mmp_errorf(MMP_ERR_PEER, "%s: the peer closed the connection%s", what,
                             have ? " in the middle of a message" : "");
            break;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            ret = peer_error(what, errno, "receiving");
            break;
        }
        if (wait_ready(fd, POLLIN, deadline, stop_fd) != 0) {
            ret = MMP_ERR_TIMEOUT;
            break;
        }
    }
    if (got) {
        *got = have;
    }
    return ret;
}

mmp_err mmp_sock_read_some(int fd, const char *what, void *buf, size_t cap, size_t *n)
{
    *n = 0;
    for (;;) {
        ssize_t r = recv(fd, buf, cap, 0);
        if (r > 0) {
            *n = (size_t)r;
            return MMP_OK;
        }
        if (r == 0) {
            return mmp_errorf(MMP_ERR_PEER, "%s: the peer closed the connection", what);
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return MMP_OK;
        }
        return peer_error(what, errno, "receiving");
    }
}

void mmp_sock_stop(int stop_fd, const char *what)
{
    uint64_t one = 1;
    if (write(stop_fd, &one, sizeof one) != (ssize_t)sizeof one) {
        MMP_WARN("%s: cannot stop the thread: %s", what, strerror(errno));
    }
}

void mmp_sock_close_graceful(int fd, double deadline)
{
    if (fd < 0) {
        return;
    }
    /* Never forever: a peer that stops acknowledging gets 10 s at most. */
    double cap = mmp_sock_now_ms() + 10000;
    if (deadline <= 0 || deadline > cap) {
        deadline = cap;
    }
    if (shutdown(fd, SHUT_WR) == 0) {
        for (;;) {
            char sink[256];
            ssize_t r = recv(fd, sink, sizeof sink, 0);
            if (r > 0 || (r < 0 && errno == EINTR)) {
                continue; /* unread bytes at close() would make it a reset */
            }
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                break; /* the peer closed too, or is gone: nothing more to wait for */
            }
            int outq = 0;
            if (ioctl(fd, SIOCOUTQ, &outq) != 0 || outq == 0 || mmp_sock_now_ms() >= deadline) {
                break; /* every byte acknowledged (or we give up) */
            }
            struct pollfd p = {.fd = fd, .events = POLLIN};
            (void)poll(&p, 1, 2); /* acks do not wake poll: look again soon */
        }
    }
    close(fd);
}
