/* A small test harness shared by every ctest executable.
 *
 * CHECK(cond) records a failure with file:line and goes on; a test's main
 * returns mmp_test_finish(), which prints a summary and returns 0 or 1.
 * mmp_test_close() compares arrays with |a-b| <= atol + rtol*|ref| and prints
 * the first few mismatches and the max difference. mmp_test_skip() returns 77,
 * which ctest reports as skipped (GPU tests without a device). */
#ifndef MMP_TESTS_HARNESS_H
#define MMP_TESTS_HARNESS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* MMP_TEST_UNDER_ASAN: defined in an AddressSanitizer build (whose shadow
 * memory rules out RLIMIT_AS checks). */
#if defined(__SANITIZE_ADDRESS__)
#define MMP_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MMP_TEST_UNDER_ASAN 1
#endif
#endif

extern int mmp_test_failures;
extern int mmp_test_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        mmp_test_checks++;                                                                         \
        if (!(cond)) {                                                                             \
            mmp_test_failures++;                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
        }                                                                                          \
    } while (0)

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        mmp_test_checks++;                                                                         \
        mmp_err e_ = (expr);                                                                       \
        if (e_ != MMP_OK) {                                                                        \
            mmp_test_failures++;                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,               \
                    mmp_err_name(e_), mmp_last_error());                                           \
        }                                                                                          \
    } while (0)

/* For checks in forked children and threads: prints the problem (the first
 * five per counter, with file:line) and counts it in the caller's counter,
 * which the child reports to its parent. */
#define PROBLEM(count, ...)                                                                        \
    do {                                                                                           \
        if ((count)++ < 5) {                                                                       \
            fprintf(stderr, "  FAIL %s:%d: ", __FILE__, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* Returns 1 when all n values are close; prints up to 5 mismatches under label. */
int mmp_test_close(const char *label, const float *got, const float *ref, size_t n, double atol,
                   double rtol);
#define CHECK_CLOSE(label, got, ref, n, atol, rtol)                                                \
    do {                                                                                           \
        mmp_test_checks++;                                                                         \
        if (!mmp_test_close(label, got, ref, n, atol, rtol)) {                                     \
            mmp_test_failures++;                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s not close\n", __FILE__, __LINE__, label);              \
        }                                                                                          \
    } while (0)

/* Limits this process's address space (RLIMIT_AS) to what it maps now plus
 * extra bytes: for a forked child that must show an algorithm fits in less
 * memory (not under ASan, whose shadow maps terabytes). 0, or -1. */
int mmp_test_limit_address_space(size_t extra);

/* Entries of /dev/shm whose name starts with the shm name prefix p (given
 * with its leading '/'); prints each on stderr when show. -1 when /dev/shm
 * cannot be read. Tests use it to prove nothing was left behind. */
int mmp_test_shm_count(const char *p, int show);

/* Fills x with uniform values in [lo, hi) from a fixed seed. */
void mmp_test_fill(float *x, size_t n, float lo, float hi, unsigned long long seed);

/* n zeroed floats (doubles), never NULL: out of memory ends the test
 * (exit 1). The caller frees them. */
float *mmp_test_floats(size_t n);
double *mmp_test_doubles(size_t n);

/* A whole file, NUL-terminated (*len excludes the NUL); NULL when it cannot
 * be read. The caller frees it. */
unsigned char *mmp_test_slurp(const char *path, size_t *len);

/* 1 when the files at a and b both read and hold the same bytes. */
int mmp_test_same_file(const char *a, const char *b);

/* Writes text to path (created or truncated); CHECKs that it could be
 * opened and returns 1, else 0. */
int mmp_test_write_text(const char *path, const char *text);

/* Runs fn with stderr going to a file of mmp_test_tmpdir(name); returns that
 * output (the caller frees it; NULL when it cannot be had), also shown on the
 * real stderr. */
char *mmp_test_stderr_of(const char *name, void (*fn)(void *), void *arg);

/* A fresh empty directory under $MMP_TMP (or /tmp) for this test; returns its
 * path. mmp_test_finish removes it when every check passed (MMP_KEEP_TMP=1 keeps it). */
const char *mmp_test_tmpdir(const char *name);

/* A loopback tcp port nobody listens on right now (the kernel's pick:
 * bound, then closed); -1 when none could be had. */
int mmp_test_free_port(void);

/* Seconds on the monotonic clock. */
double mmp_test_now_s(void);

/* The job secret the tests' network channels and reduces prove they hold
 * (transport/auth.h): both ends of a test are the test. */
#define MMP_TEST_SECRET "mmpipe-test-secret"

/* *C = a device channel's settings (on_gpu, device 0, no stream), as the
 * nccl channel tests (gpu_nccl, test_nccl_mock) open theirs. */
struct mmp_channel_cfg;
void mmp_test_gpu_channel_cfg(struct mmp_channel_cfg *c, const char *address, size_t slot_bytes,
                              int slots, int send, int timeout_ms);

/* A second process of this test's own binary self (argv[0]): `self mode
 * arg`, its stdout on a pipe whose read end is *out, while the caller goes
 * on as the other side; mmp_test_child_output then collects it. Returns the
 * pid, or -1 (a failed CHECK) when pipe or fork failed. */
pid_t mmp_test_spawn_self(const char *self, const char *mode, const char *arg, int *out);
/* What the mmp_test_spawn_self child printed, read to its end into
 * buf[cap] (NUL-terminated, cut at cap - 1); closes fd, reaps pid. Returns 1
 * when the child exited with status 0. */
int mmp_test_child_output(pid_t pid, int fd, char *buf, size_t cap);
/* The same, but bounded: a child still running after timeout_s seconds is
 * killed (SIGKILL) and the call returns 0, its output so far in buf. */
int mmp_test_child_output_within(pid_t pid, int fd, char *buf, size_t cap, double timeout_s);
/* One line of a spawned child's stdout (fd), without its '\n', into
 * buf[cap]; 0 at end of file, an error or after timeout_ms. */
int mmp_test_read_line(int fd, char *buf, size_t cap, int timeout_ms);
/* Makes this process look like a host of its own to NCCL (NCCL_HOSTID =
 * hostid, loopback sockets, no P2P/SHM/IB): NCCL then takes two processes
 * on one GPU for two hosts and moves their bytes over its socket transport,
 * where it would refuse a duplicate GPU. Call before any NCCL call. */
void mmp_test_as_nccl_host(const char *hostid);

/* Path of the mmpipe binary ($MMP_BIN, else build/mmpipe). */
const char *mmp_test_bin(void);

/* Runs a shell command, returns its exit status (-1 if it did not exit). Output
 * (stdout+stderr) is stored in out (NUL-terminated, truncated to n) if out. */
int mmp_test_run(const char *cmd, char *out, size_t n);

int mmp_test_finish(const char *name);

/* A test file's cases, by name (as nng's TEST_LIST): main hands the table to
 * mmp_test_main, which runs every case in order, or only the ones named on
 * the command line (`tests/test_schedule test_route`), and lists them with
 * --list. Returns mmp_test_finish(suite), or 2 for an unknown case name. */
typedef struct {
    const char *name;
    void (*run)(void);
} mmp_test_case;
#define MMP_TEST_CASE(fn)                                                                          \
    {                                                                                              \
#fn, fn                                                                                    \
    }
int mmp_test_main(const char *suite, const mmp_test_case *cases, size_t n, int argc, char **argv);
#define MMP_TEST_MAIN(suite, table, argc, argv)                                                    \
    mmp_test_main(suite, table, sizeof(table) / sizeof((table)[0]), argc, argv)
/* A whole test file's main in one line, for files with no setup of their own:
 * MMP_TEST_LIST("test_formats", MMP_TEST_CASE(test_parity), MMP_TEST_CASE(test_sniff)). */
#define MMP_TEST_LIST(suite, ...)                                                                  \
    static const mmp_test_case mmp_test_cases_[] = {__VA_ARGS__};                                  \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        return MMP_TEST_MAIN(suite, mmp_test_cases_, argc, argv);                                  \
    }
int mmp_test_skip(const char *name, const char *why);
/* For a GPU test whose host-side checks ran first: their failures end the
 * test (mmp_test_finish) even without a device; else it says they passed
 * and skips (77) for why. */
int mmp_test_skip_after_host_checks(const char *name, const char *why);
/* Rank k's element i of round t for order-sensitive sum tests: magnitudes
 * 2^-20 to 2^20, both signs, so the order of the additions shows in the bits. */
double mmp_test_order_value(int rank, int round, size_t i);

/* A tiny three-branch model for the nn tests (common/config.h's mmp_plan):
 * width 8, texts of 5 tokens, 2 heads, one fusion layer, init_temperature
 * 0.07, AdamW's weight decay 0.05 and betas/eps (0.9, 0.999, 1e-8); lr stays
 * 0. Image stage s has channels[s] channels and one block when channels[s] > 0. */
struct mmp_plan;
typedef struct mmp_test_net_dims { /* in this order */
    int image_size, n_stages, channels[2], stem_pool;
    int text_layers, ffn_mult;
} mmp_test_net_dims;
void mmp_test_small_plan(struct mmp_plan *p, mmp_test_net_dims d);

/* One training step of the image branch (nn/model.h) on B samples:
 * gradients zeroed, one micro-batch's forward (batch statistics) and
 * backward into din (may be NULL), gradients finished (nn/params.h). */
struct mmp_image_net;
struct mmp_image_acts;
void mmp_test_image_step(struct mmp_image_net *net, struct mmp_image_acts *acts, const float *in,
                         const float *dout, int B, float *out, float *din);

#endif
