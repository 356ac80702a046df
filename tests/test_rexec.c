/* transport/rexec.h: the agent key's checks, and the agent's side of a
 * connection driven by hand over a socket pair: a command runs with its
 * output and status relayed; whatever is not the protocol (no key, another
 * frame first, a control character in the command, a length past the
 * limit) runs nothing; a connection that ends mid-command stops it. */
#include "transport/rexec.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

static char dir[] = "/tmp/mmp-test-rexec-XXXXXX";
static const char KEY[] = "0123456789abcdef0123456789ABCDEF01";

static void write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
        fchmod(fd, mode);
        close(fd);
    }
}

static void test_key(void)
{
    char path[256], key[MMP_REXEC_KEY_MAX + 1];
    snprintf(path, sizeof path, "%s/k", dir);
    CHECK(mmp_rexec_key_load(path, key, sizeof key) == MMP_ERR_CONFIG); /* missing */
    write_file(path, "0123456789abcdef0123456789abcdef\n", 0600);
    CHECK_OK(mmp_rexec_key_load(path, key, sizeof key));
    CHECK(strcmp(key, "0123456789abcdef0123456789abcdef") == 0);
    write_file(path, "0123456789abcdef0123456789abcdef\n", 0640);
    CHECK(mmp_rexec_key_load(path, key, sizeof key) == MMP_ERR_CONFIG);
    CHECK(strstr(mmp_last_error(), "mode 640") != NULL);
    write_file(path, "short\n", 0600);
    CHECK(mmp_rexec_key_load(path, key, sizeof key) == MMP_ERR_CONFIG);
    write_file(path, "0123456789abcdef0123456789abcdef $(x)\n", 0600);
    CHECK(mmp_rexec_key_load(path, key, sizeof key) == MMP_ERR_CONFIG);
    char made[256];
    snprintf(made, sizeof made, "%s/new", dir);
    CHECK_OK(mmp_rexec_key_new(made));
    struct stat st;
    CHECK(stat(made, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK_OK(mmp_rexec_key_load(made, key, sizeof key));
    CHECK(strlen(key) == 64);
    CHECK(mmp_rexec_key_new(made) == MMP_ERR_IO); /* never over an existing file */
    unlink(made);
    unlink(path);
}

/* ---- a hand-driven connection ---------------------------------------------------------- */

static pid_t server;

/* The agent's side on one end of a socket pair, in a child; the other end. */
static int serve(void)
{
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    server = fork();
    if (server == 0) {
        close(sv[0]);
        _exit(mmp_rexec_serve(sv[1], "test", KEY, 0));
    }
    close(sv[1]);
    return sv[0];
}

static int served(void) /* the serving process's status */
{
    int st = 0;
    waitpid(server, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Frames until EXIT: stdout collected into out; the status, or -1 when the
 * connection ends without one. */
static int until_exit(mmp_rexec_conn *c, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = 0;
    for (;;) {
        uint32_t type, len;
        static char buf[MMP_REXEC_FRAME_MAX];
        if (mmp_rexec_recv(c, &type, buf, sizeof buf, &len, 10000) != MMP_OK) {
            return -1;
        }
        if (type == MMP_REXEC_STDOUT && o + len < cap) {
            memcpy(out + o, buf, len);
            o += len;
            out[o] = 0;
        }
        if (type == MMP_REXEC_EXIT && len == 4) {
            int32_t code;
            memcpy(&code, buf, 4);
            return (int)ntohl((uint32_t)code);
        }
    }
}

static void test_serve(void)
{
    char out[256], flag[256], cmd[512];
    mmp_rexec_conn c;
    snprintf(flag, sizeof flag, "%s/ran", dir);
    /* a command, its input, output and status */
    int fd = serve();
    CHECK_OK(mmp_rexec_open(&c, fd, "test", KEY, 1, 5000));
    const char *echo = "read x; echo \"got $x\"; exit 4";
    CHECK_OK(mmp_rexec_send(&c, MMP_REXEC_EXEC, echo, (uint32_t)strlen(echo)));
    CHECK_OK(mmp_rexec_send(&c, MMP_REXEC_STDIN, "abc\n", 4));
    CHECK(until_exit(&c, out, sizeof out) == 4);
    CHECK(strcmp(out, "got abc\n") == 0);
    close(fd);
    CHECK(served() == 0);

    /* another key: refused in the handshake, nothing runs */
    fd = serve();
    CHECK(mmp_rexec_open(&c, fd, "test", "another-key-another-key-another-key", 1, 5000) != MMP_OK);
    close(fd);
    CHECK(served() == 1);

    /* a frame other than EXEC first; a control character in the command; a
     * length past the limit; a frame that does not open (bytes flipped, or
     * one sealed twice under the same counter: a replay): nothing runs */
    snprintf(cmd, sizeof cmd, "touch %s", flag);
    for (int k = 0; k < 5; k++) {
        fd = serve();
        CHECK_OK(mmp_rexec_open(&c, fd, "test", KEY, 1, 5000));
        if (k == 0) {
            CHECK_OK(mmp_rexec_send(&c, MMP_REXEC_STDIN, cmd, (uint32_t)strlen(cmd)));
        } else if (k == 1) {
            char bad[1200];
            snprintf(bad, sizeof bad, "%s\ntouch %s", cmd, flag);
            CHECK_OK(mmp_rexec_send(&c, MMP_REXEC_EXEC, bad, (uint32_t)strlen(bad)));
        } else if (k == 2) {
            uint32_t huge = htonl(1u << 30);
            CHECK(write(fd, &huge, 4) == 4);
        } else if (k == 3) {
            unsigned char junk[64];
            uint32_t n = htonl(sizeof junk);
            memset(junk, 0x5a, sizeof junk);
            CHECK(write(fd, &n, 4) == 4 && write(fd, junk, sizeof junk) == sizeof junk);
        } else {
            c.ntx = 7; /* a counter the agent does not expect: replayed or reordered */
            CHECK_OK(mmp_rexec_send(&c, MMP_REXEC_EXEC, cmd, (uint32_t)strlen(cmd)));
        }
        CHECK(until_exit(&c, out, sizeof out) == -1);
        close(fd);
        CHECK(served() == 1);
        CHECK(access(flag, F_OK) != 0);
    }

    /* the connection ends mid-command: the command's input ends (a stage
     * leaves then), and one that does not read it is stopped */
    fd = serve();
    CHECK_OK(mmp_rexec_open(&c, fd, "test", KEY, 1, 5000));
    snprintf(cmd, sizeof cmd, "echo $$ > %s.pid; exec sleep 100", flag);
    CHECK_OK(mmp_rexec_send(&c, MMP_REXEC_EXEC, cmd, (uint32_t)strlen(cmd)));
    char pidfile[300];
    snprintf(pidfile, sizeof pidfile, "%s.pid", flag);
    for (int i = 0; i < 100 && access(pidfile, F_OK) != 0; i++) {
        usleep(20000);
    }
    usleep(50000);
    FILE *f = fopen(pidfile, "r");
    int pid = 0;
    CHECK(f && fscanf(f, "%d", &pid) == 1);
    if (f) {
        fclose(f);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    close(fd);
    CHECK(served() == 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    CHECK(pid > 0 && kill(pid, 0) != 0); /* gone */
    CHECK(s < 2.0 * MMP_REXEC_GRACE_MS / 1000 + 1);
    printf("  a command that ignores its input stopped %.1f s after its connection ended\n", s);
    unlink(pidfile);
}

static void setup(void)
{
    CHECK(mkdtemp(dir) != NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void test_all(void)
{
    setup();
    test_key();
    test_serve();
    rmdir(dir);
}

MMP_TEST_LIST("test_rexec", MMP_TEST_CASE(test_all))
