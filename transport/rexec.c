/* Remote execution for launcher: agent (transport/rexec.h). */
#include "transport/rexec.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include "common/progress.h"
#include "common/test_hooks.h"
#include "transport/auth.h"
#include "transport/sock.h"

#define HANDSHAKE_MS 5000
#define FRAME_MS 10000 /* the rest of a frame whose first byte has come */

/* ---- the key ------------------------------------------------------------------------- */

mmp_err mmp_rexec_key_load(const char *path, char *key, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_CONFIG, "agent key %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mmp_errorf(MMP_ERR_CONFIG, "agent key %s: not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return mmp_errorf(MMP_ERR_CONFIG,
                          "agent key %s: mode %03o lets its group or others read it (chmod 600 %s)",
                          path, (unsigned)(st.st_mode & 0777), path);
    }
    char buf[MMP_REXEC_KEY_MAX + 3];
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    size_t len = got > 0 ? (size_t)got : 0;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) {
        len--;
    }
    buf[len] = 0;
    size_t ok = strspn(buf, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ");
    if (ok != len || len < MMP_REXEC_KEY_MIN || len > MMP_REXEC_KEY_MAX || len + 1 > n) {
        return mmp_errorf(MMP_ERR_CONFIG,
                          "agent key %s: want one line of %d to %d characters of [0-9A-Za-z] "
                          "(mmpipe agent --new-key FILE makes one)",
                          path, MMP_REXEC_KEY_MIN, MMP_REXEC_KEY_MAX);
    }
    memcpy(key, buf, len + 1);
    return MMP_OK;
}

mmp_err mmp_rexec_key_new(const char *path)
{
    unsigned char raw[32];
    size_t have = 0;
    while (have < sizeof raw) {
        ssize_t r = getrandom(raw + have, sizeof raw - have, 0);
        if (r < 0 && errno != EINTR) {
            return mmp_errorf(MMP_ERR_IO, "getrandom: %s", strerror(errno));
        }
        have += r > 0 ? (size_t)r : 0;
    }
    char text[2 * sizeof raw + 2];
    for (size_t i = 0; i < sizeof raw; i++) {
        snprintf(text + 2 * i, 3, "%02x", raw[i]);
    }
    text[2 * sizeof raw] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "agent key %s: %s", path, strerror(errno));
    }
    ssize_t w = write(fd, text, 2 * sizeof raw + 1);
    if (w != (ssize_t)(2 * sizeof raw + 1) || close(fd) != 0) {
        unlink(path);
        return mmp_errorf(MMP_ERR_IO, "agent key %s: cannot write it", path);
    }
    return MMP_OK;
}

/* ---- the sealed connection ----------------------------------------------------------- */

#define SALT 32
#define SEALED_MAX (crypto_secretbox_MACBYTES + 4 + MMP_REXEC_FRAME_MAX)

static void direction_key(unsigned char out[32], const char *key, const char *dir,
                          const unsigned char *relay_salt, const unsigned char *agent_salt)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, (const unsigned char *)key, strlen(key));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)dir, strlen(dir) + 1);
    crypto_auth_hmacsha256_update(&st, relay_salt, SALT);
    crypto_auth_hmacsha256_update(&st, agent_salt, SALT);
    crypto_auth_hmacsha256_final(&st, out);
}

/* The hello after the handshake: the relay's 8 bytes, the agent's answer
 * (the same bytes: taken; anything else: refused). */
static const char HELLO[8] = {'M', 'M', 'P', 'R', 'X', '0', '0', '1'};
static const char REFUSED[8] = {'M', 'M', 'P', 'R', 'X', 'N', 'O', '!'};

static int judge(void *ctx, const void *hello, void *reply, const char **why)
{
    (void)ctx;
    if (memcmp(hello, HELLO, sizeof HELLO) != 0) {
        *why = "not an mmpipe rexec relay of this version";
        memcpy(reply, REFUSED, sizeof REFUSED);
        return 1;
    }
    memcpy(reply, HELLO, sizeof HELLO);
    return 0;
}

mmp_err mmp_rexec_gate_create(mmp_auth_gate **gate, int lfd, const char *key)
{
    return mmp_auth_gate_create(gate, lfd, "mmpipe agent", key, sizeof HELLO, sizeof HELLO,
                                HANDSHAKE_MS, judge, NULL);
}

mmp_err mmp_rexec_open(mmp_rexec_conn *c, int fd, const char *what, const char *key, int side,
                       int timeout_ms)
{
    memset(c, 0, sizeof *c);
    c->fd = fd;
    snprintf(c->what, sizeof c->what, "%s", what);
    if (sodium_init() < 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: libsodium does not start", what);
    }
    int relay = side == MMP_REXEC_RELAY;
    char hello[sizeof HELLO];
    struct iovec hv = {hello, sizeof hello};
    if (side != MMP_REXEC_AGENT_GATED) {
        MMP_TRY(mmp_auth_handshake(fd, c->what, key, relay, mmp_sock_deadline(timeout_ms), -1));
        if (relay) {
            memcpy(hello, HELLO, sizeof HELLO);
            MMP_TRY(mmp_sock_writev(fd, c->what, &hv, 1, mmp_sock_deadline(timeout_ms), -1));
            MMP_TRY(mmp_sock_read(fd, c->what, hello, sizeof hello, mmp_sock_deadline(timeout_ms),
                                  -1, NULL));
            if (memcmp(hello, HELLO, sizeof HELLO) != 0) {
                return mmp_errorf(MMP_ERR_PROTO, "%s: refused this relay (another mmpipe version?)",
                                  c->what);
            }
        } else {
            const char *why = NULL;
            char reply[sizeof HELLO];
            MMP_TRY(mmp_sock_read(fd, c->what, hello, sizeof hello, mmp_sock_deadline(timeout_ms),
                                  -1, NULL));
            int refused = judge(NULL, hello, reply, &why);
            struct iovec rv = {reply, sizeof reply};
            MMP_TRY(mmp_sock_writev(fd, c->what, &rv, 1, mmp_sock_deadline(timeout_ms), -1));
            if (refused) {
                return mmp_errorf(MMP_ERR_PROTO, "%s: %s", c->what, why);
            }
        }
    }
    unsigned char mine[SALT], theirs[SALT];
    randombytes_buf(mine, SALT);
    struct iovec iov = {mine, SALT};
    MMP_TRY(mmp_sock_writev(fd, c->what, &iov, 1, mmp_sock_deadline(timeout_ms), -1));
    MMP_TRY(mmp_sock_read(fd, c->what, theirs, SALT, mmp_sock_deadline(timeout_ms), -1, NULL));
    const unsigned char *rs = relay ? mine : theirs, *as = relay ? theirs : mine;
    direction_key(relay ? c->tx : c->rx, key, "mmpipe-rexec relay to agent", rs, as);
    direction_key(relay ? c->rx : c->tx, key, "mmpipe-rexec agent to relay", rs, as);
    sodium_memzero(mine, SALT);
    return MMP_OK;
}

static void nonce_of(unsigned char n[crypto_secretbox_NONCEBYTES], unsigned long long k)
{
    memset(n, 0, crypto_secretbox_NONCEBYTES);
    for (int i = 0; i < 8; i++) {
        n[i] = (unsigned char)(k >> (8 * i));
    }
}

mmp_err mmp_rexec_send(mmp_rexec_conn *c, uint32_t type, const void *buf, uint32_t len)
{
    static unsigned char plain[4 + MMP_REXEC_FRAME_MAX], sealed[4 + SEALED_MAX];
    if (len > MMP_REXEC_FRAME_MAX) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: a frame of %u bytes", c->what, len);
    }
    uint32_t t = htonl(type);
    memcpy(plain, &t, 4);
    if (len) {
        memcpy(plain + 4, buf, len);
    }
    unsigned char n[crypto_secretbox_NONCEBYTES];
    nonce_of(n, c->ntx++);
    uint32_t clen = crypto_secretbox_MACBYTES + 4 + len;
    uint32_t be = htonl(clen);
    memcpy(sealed, &be, 4);
    crypto_secretbox_easy(sealed + 4, plain, 4 + len, n, c->tx);
    struct iovec iov = {sealed, 4 + clen};
    return mmp_sock_writev(c->fd, c->what, &iov, 1, mmp_sock_deadline(FRAME_MS), -1);
}

mmp_err mmp_rexec_recv(mmp_rexec_conn *c, uint32_t *type, void *buf, uint32_t cap, uint32_t *len,
                       int timeout_ms)
{
    static unsigned char sealed[SEALED_MAX], plain[4 + MMP_REXEC_FRAME_MAX];
    uint32_t be;
    MMP_TRY(mmp_sock_read(c->fd, c->what, &be, 4, mmp_sock_deadline(timeout_ms), -1, NULL));
    uint32_t clen = ntohl(be);
    if (cap > MMP_REXEC_FRAME_MAX || clen < crypto_secretbox_MACBYTES + 4 ||
        clen > crypto_secretbox_MACBYTES + 4 + cap) {
        return mmp_errorf(MMP_ERR_PROTO, "%s: a frame of %u bytes (at most %u)", c->what, clen,
                          (unsigned)(crypto_secretbox_MACBYTES + 4 + cap));
    }
    MMP_TRY(mmp_sock_read(c->fd, c->what, sealed, clen, mmp_sock_deadline(FRAME_MS), -1, NULL));
    unsigned char n[crypto_secretbox_NONCEBYTES];
    nonce_of(n, c->nrx++);
    if (crypto_secretbox_open_easy(plain, sealed, clen, n, c->rx) != 0) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "%s: a frame that does not open (altered, replayed or "
                          "sealed under another key)",
                          c->what);
    }
    uint32_t t;
    memcpy(&t, plain, 4);
    *type = ntohl(t);
    *len = clen - crypto_secretbox_MACBYTES - 4;
    if (*len) {
        memcpy(buf, plain + 4, *len);
    }
    return MMP_OK;
}

static void write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            (void)poll(&p, 1, 100);
            continue;
        }
        if (w <= 0) {
            return; /* the reader is gone: what it would have read is lost with it */
        }
        buf += w;
        n -= (size_t)w;
    }
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* ---- the agent's side ---------------------------------------------------------------- */

/* The command's bytes: printable (UTF-8 allowed), no control characters. */
static int command_ok(const char *cmd, uint32_t len)
{
    for (uint32_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)cmd[i];
        if (c < 0x20 || c == 0x7f) {
            return 0;
        }
    }
    return len > 0;
}

/* `sh -c cmd` in a process group of its own, its stdio on pipes. */
static pid_t spawn(const char *cmd, int *in, int *out, int *err)
{
    int pp[3][2]; /* the command's stdin, stdout, stderr */
    for (int k = 0; k < 3; k++) {
        if (pipe2(pp[k], O_CLOEXEC) != 0) {
            for (int j = 0; j < k; j++) {
                close(pp[j][0]);
                close(pp[j][1]);
            }
            return -1;
        }
    }
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        /* the serving process killed outright: the command is told to stop */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        for (int k = 0; k < 3; k++) {
            dup2(pp[k][k == 0 ? 0 : 1], k);
        }
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int sigs[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
            signal(sigs[i], SIG_DFL);
        }
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int k = 0; k < 3; k++) {
        close(pp[k][k == 0 ? 0 : 1]); /* the command's ends */
    }
    if (pid < 0) {
        for (int k = 0; k < 3; k++) {
            close(pp[k][k == 0 ? 1 : 0]);
        }
        return -1;
    }
    *in = pp[0][1];
    *out = pp[1][0];
    *err = pp[2][0];
    fcntl(*out, F_SETFL, O_NONBLOCK);
    fcntl(*err, F_SETFL, O_NONBLOCK);
    return pid;
}

static int exit_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static volatile sig_atomic_t serve_stop;

static void on_serve_stop(int sig)
{
    (void)sig;
    serve_stop = 1;
}

int mmp_rexec_serve(int fd, const char *peer, const char *key, int gated)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_serve_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGHUP, SIG_IGN); /* a terminal's hangup is the agent's to judge (nohup) */
    signal(SIGPIPE, SIG_IGN);
    char what[MMP_SOCK_ADDR_MAX + 32];
    snprintf(what, sizeof what, "agent: %s", peer);
    static mmp_rexec_conn conn;
    if (mmp_rexec_open(&conn, fd, what, key, gated ? MMP_REXEC_AGENT_GATED : MMP_REXEC_AGENT,
                       HANDSHAKE_MS) != MMP_OK) {
        MMP_WARN("agent: refused %s: %s", peer, mmp_last_error());
        close(fd);
        return 1;
    }
    static char buf[MMP_REXEC_FRAME_MAX + 1];
    uint32_t type = 0, len = 0;
    mmp_err e = mmp_rexec_recv(&conn, &type, buf, MMP_REXEC_CMD_MAX, &len, HANDSHAKE_MS);
    if (e != MMP_OK || type != MMP_REXEC_EXEC || !command_ok(buf, len)) {
        MMP_WARN("agent: %s: no command (%s)", peer,
                 e != MMP_OK              ? mmp_last_error()
                 : type != MMP_REXEC_EXEC ? "another frame first"
                                          : "an empty command, or a control character in it");
        close(fd);
        return 1;
    }
    buf[len] = 0;
    int in = -1, out = -1, err = -1;
    pid_t pid = spawn(buf, &in, &out, &err);
    if (pid < 0) {
        MMP_WARN("agent: %s: cannot start a shell: %s", peer, strerror(errno));
        int32_t code = htonl(127);
        (void)mmp_rexec_send(&conn, MMP_REXEC_EXIT, &code, 4);
        close(fd);
        return 1;
    }
    MMP_INFO("agent: %s: pid %d: %.300s", peer, (int)pid, buf);
    int status = 0, exited = 0, sock_ok = 1, termed = 0, killed = 0;
    double exit_at = 0, lost_at = 0;
    for (;;) {
        double now = mmp_sock_now_ms();
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
            exited = 1;
            exit_at = now;
        }
        /* done: the command ended and its output drained (its pipes may stay
         * open in something it left running: a second at most) */
        if (exited && ((out < 0 && err < 0) || now - exit_at > 1000 || !sock_ok)) {
            break;
        }
        if (serve_stop && sock_ok) {
            MMP_WARN("agent: %s: stopping: ending pid %d", peer, (int)pid);
            sock_ok = 0;
            lost_at = now;
            close_fd(&in);
            close(fd);
            fd = -1;
        }
        if (!sock_ok && !termed && now - lost_at > MMP_REXEC_GRACE_MS) {
            kill(-pid, SIGTERM);
            termed = 1;
        }
        if (!sock_ok && !killed && now - lost_at > 2 * MMP_REXEC_GRACE_MS) {
            MMP_WARN("agent: %s: pid %d still there %d ms after its connection ended: SIGKILL",
                     peer, (int)pid, 2 * MMP_REXEC_GRACE_MS);
            kill(-pid, SIGKILL);
            killed = 1;
        }
        struct pollfd pf[3];
        int np = 0, at_sock = -1, at_out = -1, at_err = -1;
        if (sock_ok) {
            at_sock = np;
            pf[np++] = (struct pollfd){.fd = fd, .events = POLLIN};
        }
        if (out >= 0) {
            at_out = np;
            pf[np++] = (struct pollfd){.fd = out, .events = POLLIN};
        }
        if (err >= 0) {
            at_err = np;
            pf[np++] = (struct pollfd){.fd = err, .events = POLLIN};
        }
        /* its output closed: it is ending, and nothing here wakes at its
         * exit: look again soon, so that its status goes out at once */
        int wait_ms = !exited && out < 0 && err < 0 ? 5 : 100;
        if (poll(pf, (nfds_t)np, wait_ms) < 0 && errno != EINTR) {
            break;
        }
        if (at_sock >= 0 && pf[at_sock].revents) {
            e = mmp_rexec_recv(&conn, &type, buf, MMP_REXEC_FRAME_MAX, &len, FRAME_MS);
            if (e == MMP_OK && type == MMP_REXEC_STDIN) {
                if (in >= 0) {
                    write_all(in, buf, len);
                }
            } else if (e == MMP_OK && type == MMP_REXEC_STDIN_EOF) {
                close_fd(&in);
            } else if (e == MMP_OK && type == MMP_REXEC_SIGNAL && len == 4) {
                int32_t sig;
                memcpy(&sig, buf, 4);
                sig = (int32_t)ntohl((uint32_t)sig);
                if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGKILL) {
                    kill(-pid, sig);
                }
            } else {
                if (e == MMP_OK) {
                    MMP_WARN("agent: %s: frame type %u of %u bytes out of place", peer, type, len);
                } else {
                    MMP_WARN("agent: %s: connection lost (%s): ending pid %d", peer,
                             mmp_last_error(), (int)pid);
                }
                sock_ok = 0;
                lost_at = now;
                close_fd(&in); /* a stage takes the end of its input as the coordinator's */
            }
        }
        int *fds[2] = {&out, &err};
        int at[2] = {at_out, at_err};
        for (int k = 0; k < 2; k++) {
            if (at[k] < 0 || !pf[at[k]].revents) {
                continue;
            }
            ssize_t r = read(*fds[k], buf, MMP_REXEC_FRAME_MAX);
            if (r > 0 && sock_ok &&
                mmp_rexec_send(&conn, k ? MMP_REXEC_STDERR : MMP_REXEC_STDOUT, buf, (uint32_t)r) !=
                    MMP_OK) {
                sock_ok = 0;
                lost_at = now;
                close_fd(&in);
            } else if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                close_fd(fds[k]);
            }
        }
    }
    close_fd(&in);
    close_fd(&out);
    close_fd(&err);
    if (!exited) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    mmp_sleep_ms(mmp_test_hook_value(MMP_HOOK_AGENT_STATUS_DELAY_MS)); /* a slow host, for tests */
    int code = exit_code(status);
    kill(-pid, SIGTERM); /* whatever it left running in its group ends with it */
    int delivered = 0;
    if (sock_ok) {
        int32_t c = (int32_t)htonl((uint32_t)code);
        delivered = mmp_rexec_send(&conn, MMP_REXEC_EXIT, &c, 4) == MMP_OK;
        mmp_sock_close_graceful(fd, mmp_sock_deadline(HANDSHAKE_MS));
    } else if (fd >= 0) {
        close(fd);
    }
    MMP_INFO("agent: %s: pid %d ended with status %d%s", peer, (int)pid, code,
             delivered ? "" : " (not delivered: the connection is gone)");
    return delivered ? 0 : 1;
}

/* ---- the relay ----------------------------------------------------------------------- */

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    (void)!write(sig_pipe[1], &b, 1);
    errno = saved;
}

int mmp_rexec_run(const char *address, const char *key, const char *command, int connect_ms)
{
    size_t clen = strlen(command);
    if (!command_ok(command, (uint32_t)clen) || clen > MMP_REXEC_CMD_MAX) {
        fprintf(stderr,
                "mmpipe rexec: the command must be 1 to %d bytes without control "
                "characters\n",
                MMP_REXEC_CMD_MAX);
        return 255;
    }
    char what[MMP_SOCK_ADDR_MAX + 32];
    snprintf(what, sizeof what, "agent at %s", address);
    signal(SIGPIPE, SIG_IGN);
    int fd = -1;
    static mmp_rexec_conn conn;
    if (mmp_sock_connect(&fd, what, address, mmp_sock_deadline(connect_ms)) != MMP_OK ||
        mmp_rexec_open(&conn, fd, what, key, MMP_REXEC_RELAY, HANDSHAKE_MS) != MMP_OK ||
        mmp_rexec_send(&conn, MMP_REXEC_EXEC, command, (uint32_t)clen) != MMP_OK) {
        fprintf(stderr, "mmpipe rexec: %s\n", mmp_last_error());
        if (fd >= 0) {
            close(fd);
        }
        return 255;
    }
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        close(fd);
        return 255;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    static char buf[MMP_REXEC_FRAME_MAX];
    int in_open = 1;
    double signalled_at = 0;
    for (;;) {
        struct pollfd pf[3] = {{.fd = fd, .events = POLLIN},
                               {.fd = sig_pipe[0], .events = POLLIN},
                               {.fd = in_open ? 0 : -1, .events = POLLIN}};
        if (poll(pf, 3, 200) < 0 && errno != EINTR) {
            break;
        }
        if (signalled_at > 0 && mmp_sock_now_ms() - signalled_at > 4 * MMP_REXEC_GRACE_MS) {
            fprintf(stderr, "mmpipe rexec: %s: no end of the command %d ms after the signal\n",
                    what, 4 * MMP_REXEC_GRACE_MS);
            break;
        }
        if (pf[1].revents) {
            unsigned char s;
            while (read(sig_pipe[0], &s, 1) == 1) {
                int32_t v = (int32_t)htonl((uint32_t)s);
                signalled_at = signalled_at > 0 ? signalled_at : mmp_sock_now_ms();
                if (mmp_rexec_send(&conn, MMP_REXEC_SIGNAL, &v, 4) != MMP_OK) {
                    break;
                }
            }
        }
        if (pf[2].revents) {
            ssize_t r = read(0, buf, sizeof buf);
            if (r > 0) {
                if (mmp_rexec_send(&conn, MMP_REXEC_STDIN, buf, (uint32_t)r) != MMP_OK) {
                    fprintf(stderr, "mmpipe rexec: lost the %s: %s\n", what, mmp_last_error());
                    break;
                }
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                in_open = 0;
                if (mmp_rexec_send(&conn, MMP_REXEC_STDIN_EOF, NULL, 0) != MMP_OK) {
                    fprintf(stderr, "mmpipe rexec: lost the %s: %s\n", what, mmp_last_error());
                    break;
                }
            }
        }
        if (pf[0].revents) {
            uint32_t type = 0, len = 0;
            if (mmp_rexec_recv(&conn, &type, buf, sizeof buf, &len, FRAME_MS) != MMP_OK) {
                fprintf(stderr, "mmpipe rexec: lost the %s: %s\n", what, mmp_last_error());
                break;
            }
            if (type == MMP_REXEC_STDOUT || type == MMP_REXEC_STDERR) {
                write_all(type == MMP_REXEC_STDOUT ? 1 : 2, buf, len);
            } else if (type == MMP_REXEC_EXIT && len == 4) {
                int32_t code;
                memcpy(&code, buf, 4);
                close(fd);
                code = (int32_t)ntohl((uint32_t)code);
                return code >= 0 && code <= 255 ? code : 255;
            } else {
                fprintf(stderr, "mmpipe rexec: %s: frame type %u out of place\n", what, type);
                break;
            }
        }
    }
    close(fd);
    return 255;
}
