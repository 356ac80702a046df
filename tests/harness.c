#include "tests/harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/config.h"
#include "common/fsutil.h"
#include "nn/model.h"
#include "nn/params.h"
#include "common/rng.h"
#include "transport/channel.h"

int mmp_test_failures = 0;
int mmp_test_checks = 0;

int mmp_test_close(const char *label, const float *got, const float *ref, size_t n, double atol,
                   double rtol)
{
    size_t bad = 0;
    double max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        double tol = atol + rtol * fabs((double)ref[i]);
        int nan = isnan(got[i]) != isnan(ref[i]);
        if (d > max_abs) {
            max_abs = d;
        }
        if (ref[i] != 0 && d / fabs((double)ref[i]) > max_rel) {
            max_rel = d / fabs((double)ref[i]);
        }
        if (nan || d > tol) {
            if (bad < 5) {
                fprintf(stderr, "  %s[%zu]: got %.9g want %.9g (diff %.3g, tol %.3g)\n", label, i,
                        (double)got[i], (double)ref[i], d, tol);
            }
            bad++;
        }
    }
    if (bad) {
        fprintf(stderr, "  %s: %zu/%zu mismatches, max_abs=%.3g max_rel=%.3g\n", label, bad, n,
                max_abs, max_rel);
    }
    return bad == 0;
}

void mmp_test_fill(float *x, size_t n, float lo, float hi, unsigned long long seed)
{
    mmp_rng r;
    mmp_rng_seed(&r, seed, 12345);
    for (size_t i = 0; i < n; i++) {
        x[i] = lo + (hi - lo) * mmp_rng_uniform(&r);
    }
}

int mmp_test_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = (char *)mmp_test_slurp(a, &na), *y = (char *)mmp_test_slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

int mmp_test_write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) {
        return 0;
    }
    fputs(text, f);
    fclose(f);
    return 1;
}

/* The directories mmp_test_tmpdir made, removed by mmp_test_finish when every
 * check passed (kept on a failure to look at, or with MMP_KEEP_TMP=1). */
static char tmpdirs[32][1024];
static int n_tmpdirs;

const char *mmp_test_tmpdir(const char *name)
{
    static char path[1024];
    const char *base = getenv("MMP_TMP");
    if (!base || !*base) {
        base = "/tmp/mmpipe-test";
    }
    snprintf(path, sizeof path, "%s/%s", base, name);
    /* MMP_TMP is the user's: no shell (common/fsutil.h). */
    if (mmp_fs_rmtree(path) != MMP_OK || mmp_mkdirs(path) != MMP_OK) {
        fprintf(stderr, "cannot make %s: %s\n", path, mmp_last_error());
        exit(1);
    }
    int known = 0;
    for (int i = 0; i < n_tmpdirs; i++) {
        known |= strcmp(tmpdirs[i], path) == 0;
    }
    if (!known && n_tmpdirs < (int)(sizeof tmpdirs / sizeof tmpdirs[0])) {
        snprintf(tmpdirs[n_tmpdirs++], sizeof tmpdirs[0], "%s", path);
    }
    return path;
}

int mmp_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

double mmp_test_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void mmp_test_gpu_channel_cfg(mmp_channel_cfg *c, const char *address, size_t slot_bytes, int slots,
                              int send, int timeout_ms)
{
    *c = (mmp_channel_cfg){.address = address,
                           .slot_bytes = slot_bytes,
                           .slots = slots,
                           .send = send,
                           .timeout_ms = timeout_ms,
                           .on_gpu = 1,
                           .device = 0,
                           .secret = MMP_TEST_SECRET};
}

const char *mmp_test_bin(void)
{
    const char *b = getenv("MMP_BIN");
    return b && *b ? b : "build/mmpipe";
}

int mmp_test_run(const char *cmd, char *out, size_t n)
{
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    if (!f) {
        return -1;
    }
    size_t len = 0;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        if (out && len + 1 < n) {
            size_t take = got < n - 1 - len ? got : n - 1 - len;
            memcpy(out + len, buf, take);
            len += take;
        }
    }
    if (out && n) {
        out[len] = 0;
    }
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

pid_t mmp_test_spawn_self(const char *self, const char *mode, const char *arg, int *out)
{
    int p[2];
    *out = -1;
    int piped = pipe(p) == 0;
    CHECK(piped);
    if (!piped) {
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        execl(self, self, mode, arg, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    CHECK(pid > 0);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    *out = p[0];
    return pid;
}

/* Reads fd into buf (NUL-terminated, past cap drained so the child never
 * blocks on a full pipe) until end of file, or until the clock passes end
 * (end <= 0: no bound); closes fd. Returns 1 at end of file (fd < 0: at
 * once), 0 at the bound or on a failed poll. */
static int drain(int fd, char *buf, size_t cap, double end)
{
    size_t n = 0;
    char sink[256];
    int done = fd < 0;
    while (!done) {
        if (end > 0) {
            int left_ms = (int)((end - mmp_test_now_s()) * 1000);
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            if (left_ms <= 0 || poll(&pf, 1, left_ms) <= 0) {
                break; /* the bound (or a failed poll) */
            }
        }
        int room = n + 1 < cap;
        ssize_t k = room ? read(fd, buf + n, cap - 1 - n) : read(fd, sink, sizeof sink);
        if (k <= 0) {
            done = 1; /* end of file: the child closed its stdout */
            break;
        }
        n += room ? (size_t)k : 0;
    }
    if (cap) {
        buf[n] = 0;
    }
    if (fd >= 0) {
        close(fd);
    }
    return done;
}

int mmp_test_child_output(pid_t pid, int fd, char *buf, size_t cap)
{
    drain(fd, buf, cap, 0);
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

int mmp_test_child_output_within(pid_t pid, int fd, char *buf, size_t cap, double timeout_s)
{
    double end = mmp_test_now_s() + timeout_s;
    int done = drain(fd, buf, cap, end);
    int status = 0;
    pid_t got = 0;
    while (pid > 0 && (got = waitpid(pid, &status, WNOHANG)) == 0 && mmp_test_now_s() < end) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    if (pid > 0 && got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return 0;
    }
    return done && got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int mmp_test_read_line(int fd, char *buf, size_t cap, int timeout_ms)
{
    size_t n = 0;
    double end = mmp_test_now_s() + timeout_ms / 1000.0;
    while (fd >= 0 && n + 1 < cap) {
        int left_ms = (int)((end - mmp_test_now_s()) * 1000);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        char c;
        if (left_ms <= 0 || poll(&pf, 1, left_ms) <= 0 || read(fd, &c, 1) != 1) {
            break;
        }
        if (c == '\n') {
            buf[n] = 0;
            return 1;
        }
        buf[n++] = c;
    }
    if (cap) {
        buf[n] = 0;
    }
    return 0;
}

void mmp_test_as_nccl_host(const char *hostid)
{
    setenv("NCCL_HOSTID", hostid, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1); /* bootstrap and data over loopback */
    setenv("NCCL_P2P_DISABLE", "1", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_IB_DISABLE", "1", 1);
    setenv("NCCL_NET", "Socket", 1);
}

int mmp_test_finish(const char *name)
{
    if (mmp_test_checks == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    fprintf(stderr, "%s: %d checks, %d failed\n", name, mmp_test_checks, mmp_test_failures);
    if (mmp_test_failures) {
        return 1;
    }
    const char *keep = getenv("MMP_KEEP_TMP");
    for (int i = 0; i < n_tmpdirs && !(keep && strcmp(keep, "1") == 0); i++) {
        mmp_fs_rmtree(tmpdirs[i]);
    }
    n_tmpdirs = 0;
    return 0;
}

int mmp_test_main(const char *suite, const mmp_test_case *cases, size_t n, int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < n; i++) {
            printf("%s\n", cases[i].name);
        }
        return 0;
    }
    for (int a = 1; a < argc; a++) {
        size_t i = 0;
        while (i < n && strcmp(cases[i].name, argv[a]) != 0) {
            i++;
        }
        if (i == n) {
            fprintf(stderr, "%s: no case '%s' (--list names them)\n", suite, argv[a]);
            return 2;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int wanted = argc <= 1;
        for (int a = 1; a < argc && !wanted; a++) {
            wanted = strcmp(cases[i].name, argv[a]) == 0;
        }
        if (wanted) {
            fprintf(stderr, "-- %s\n", cases[i].name);
            cases[i].run();
        }
    }
    return mmp_test_finish(suite);
}

int mmp_test_skip(const char *name, const char *why)
{
    fprintf(stderr, "%s: skipped: %s\n", name, why);
    return 77;
}

int mmp_test_skip_after_host_checks(const char *name, const char *why)
{
    if (mmp_test_failures > 0) {
        return mmp_test_finish(name);
    }
    fprintf(stderr, "%s: host checks passed (%d); the device checks need a GPU\n", name,
            mmp_test_checks);
    return mmp_test_skip(name, why);
}

double mmp_test_order_value(int rank, int round, size_t i)
{
    unsigned long long h = (unsigned long long)(i + 1) * 2654435761ull ^
                           (unsigned long long)(rank + 1) * 40503ull ^
                           (unsigned long long)(round + 1) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    double m = (double)(long long)(h % 2000001ull) - 1000000.0;
    return ldexp(m / 3.0, (int)((h >> 24) % 41) - 20);
}

int mmp_test_limit_address_space(size_t extra)
{
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) {
        return -1;
    }
    int got = fscanf(f, "%ld", &pages);
    fclose(f);
    if (got != 1) {
        return -1;
    }
    rlim_t cap = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (rlim_t)extra;
    struct rlimit rl = {.rlim_cur = cap, .rlim_max = cap};
    return setrlimit(RLIMIT_AS, &rl);
}

int mmp_test_shm_count(const char *p, int show)
{
    DIR *d = opendir("/dev/shm");
    if (!d) {
        return -1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, p + 1, strlen(p + 1)) == 0) {
            if (show) {
                fprintf(stderr, "  left in /dev/shm: %s\n", e->d_name);
            }
            n++;
        }
    }
    closedir(d);
    return n;
}

static void *zeros(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of host memory for %zu elements of %zu bytes\n", n, size);
        exit(1);
    }
    return p;
}

float *mmp_test_floats(size_t n)
{
    return zeros(n, sizeof(float));
}

double *mmp_test_doubles(size_t n)
{
    return zeros(n, sizeof(double));
}

unsigned char *mmp_test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

void mmp_test_small_plan(mmp_plan *p, mmp_test_net_dims d)
{
    memset(p, 0, sizeof *p);
    p->data.image_size = d.image_size;
    p->data.max_text_len = 5;
    p->model.width = 8;
    p->model.image.n_stages = d.n_stages;
    for (int s = 0; s < 2; s++) {
        p->model.image.channels[s] = d.channels[s];
        p->model.image.blocks[s] = d.channels[s] > 0;
    }
    p->model.image.stem_pool = d.stem_pool;
    p->model.text.layers = d.text_layers;
    p->model.text.heads = 2;
    p->model.text.ffn_mult = d.ffn_mult;
    p->model.fusion.layers = 1;
    p->model.fusion.heads = 2;
    p->train.init_temperature = 0.07f;
    p->train.optimizer.weight_decay = 0.05f;
    p->train.optimizer.beta1 = 0.9f;
    p->train.optimizer.beta2 = 0.999f;
    p->train.optimizer.eps = 1e-8f;
}

void mmp_test_image_step(mmp_image_net *net, mmp_image_acts *acts, const float *in,
                         const float *dout, int B, float *out, float *din)
{
    mmp_params *p = mmp_image_net_params(net);
    mmp_params_zero_grad(p);
    mmp_params_mb_begin(p);
    mmp_image_net_forward(net, acts, in, B, 1, out);
    mmp_image_net_backward(net, acts, dout, B, din);
    mmp_params_mb_end(p);
    mmp_params_grad_finish(p);
}

char *mmp_test_stderr_of(const char *name, void (*fn)(void *), void *arg)
{
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.txt", mmp_test_tmpdir(name));
    fflush(stderr);
    int saved = dup(2), f = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (saved < 0 || f < 0 || dup2(f, 2) < 0) {
        CHECK(!"stderr to a file");
        if (f >= 0) {
            close(f);
        }
        if (saved >= 0) {
            close(saved);
        }
        fn(arg);
        return NULL;
    }
    close(f);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n = 0;
    char *text = (char *)mmp_test_slurp(path, &n);
    if (text) {
        fputs(text, stderr);
    }
    return text;
}
