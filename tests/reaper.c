/* tests/reaper.c: runs one test and fails it when the test leaves something
 * behind (the house rule: processes you start, you stop; no /dev/shm left).
 *
 *   reaper NAME CMD [ARG...]
 *
 * Every ctest runs under it (CMakeLists.txt, MMP_REAPER). It becomes a child
 * subreaper, so whatever the test starts and abandons (a `cmd &` the script
 * never waits for, a double-forking daemon such as sshd or slurmd, a process
 * started in another network namespace) is re-parented to it rather than to
 * init, and stays findable as its descendant. Where it may (root: CI and
 * the test machines), it also gives the test a mount namespace of its own
 * with a private, empty /dev/shm of the same size, so whatever is in there
 * when the test ends is the test's (ctest -j runs tests side by side; a
 * shared /dev/shm could not tell their segments apart), and the network
 * namespaces mounted under /run/netns that it sees appear are the test's.
 *
 * After the test's own process exits: descendants still running get a grace
 * period (they may be on their way out), then each is named on stderr
 * ("left behind: pid N: its command line"), sent SIGTERM, then SIGKILL, and
 * reaped; entries of the private /dev/shm named mmpipe-* (every segment
 * mmpipe and its tests make) and network namespaces still mounted under
 * /run/netns are named and removed.
 *
 * Exit status: the test's own when it failed (a signal is raised again, 77,
 * ctest's skip, passes through); else 1 when it left anything behind; else 0.
 * MMP_REAPER_PRIVATE_SHM=0 leaves the test in this mount namespace (only
 * processes are checked then): for a machine where a private /dev/shm or
 * mount namespace gets in the way of something (not seen: the GPU tests have
 * not run under the guard yet). MMP_REAPER_LOG=FILE appends one line per test ("NAME: N left
 * behind") for scripts/test's summary (the test does not inherit it: scripts/gpu-check's ctest
 * inside cli_gpu_check adds no lines). SIGTERM, SIGINT, SIGHUP and SIGQUIT (ctest's timeout, ^C)
 * are passed on to the test's process group.
 *
 * It must never kill what is not the test's: only descendants of its own
 * process are touched, and only the private /dev/shm is cleaned (without one,
 * /dev/shm is not checked and it says so). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GRACE_MS 3000 /* for descendants already on their way out */
#define TERM_MS 2000  /* SIGTERM to SIGKILL */
#define KILL_MS 5000  /* SIGKILL to giving up */
#define NETNS_DIR "/run/netns/"
#define MAX_NETNS 256

static const char *name;
static volatile sig_atomic_t test_pgid;
static int test_status = -1; /* waitpid status of the test's own process */
static int left;             /* things named as left behind */

static void say(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "reaper: %s: %s\n", name, line);
}

static void forward(int sig)
{
    if (test_pgid > 0) {
        kill(-test_pgid, sig);
    }
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void nap(void)
{
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
}

/* Reaps every child that has exited (the test's own process included); the
 * others are orphans re-parented here. */
static void reap(int block_for_test, pid_t test)
{
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, block_for_test && test_status < 0 ? 0 : WNOHANG);
        if (p < 0 && errno == EINTR) {
            continue;
        }
        if (p <= 0) {
            return;
        }
        if (p == test) {
            test_status = st;
        }
    }
}

/* ---- descendants: /proc/<pid>/stat, parents followed down from here -------- */

struct proc {
    pid_t pid, ppid;
    char state;
    int mine;
};

/* The processes that descend from this one (zombies included); *n of them. */
static struct proc *descendants(size_t *n)
{
    struct proc *all = NULL;
    size_t cnt = 0, cap = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], buf[512];
        if (e->d_name[0] < '1' || e->d_name[0] > '9') {
            continue;
        }
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) {
            continue; /* gone meanwhile */
        }
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        char *rp = strrchr(buf, ')'); /* the command name may hold ')' */
        int ppid;
        char state;
        if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2) {
            continue;
        }
        if (cnt == cap) {
            cap = cap ? 2 * cap : 512;
            struct proc *grown = realloc(all, cap * sizeof *all);
            if (!grown) {
                break;
            }
            all = grown;
        }
        all[cnt++] = (struct proc){atoi(e->d_name), ppid, state, 0};
    }
    if (d) {
        closedir(d);
    }
    pid_t self = getpid();
    for (int grew = 1; grew;) {
        grew = 0;
        for (size_t i = 0; i < cnt; i++) {
            if (all[i].mine) {
                continue;
            }
            int up = all[i].ppid == self;
            for (size_t j = 0; j < cnt && !up; j++) {
                up = all[j].mine && all[j].pid == all[i].ppid;
            }
            if (up) {
                all[i].mine = grew = 1;
            }
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < cnt; i++) {
        if (all[i].mine) {
            all[k++] = all[i];
        }
    }
    *n = k;
    return all;
}

/* Descendants, zombies included (one of ours not reaped yet still shows in
 * /proc: kill -0 finds it); with sig, each live one is sent sig. */
static size_t below(int sig)
{
    size_t n;
    struct proc *p = descendants(&n);
    for (size_t i = 0; i < n && sig; i++) {
        if (p[i].state != 'Z' && p[i].state != 'X') {
            kill(p[i].pid, sig);
        }
    }
    free(p);
    return n;
}

static void describe(pid_t pid, char *out, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY);
    ssize_t len = fd >= 0 ? read(fd, out, size - 1) : -1;
    if (fd >= 0) {
        close(fd);
    }
    if (len <= 0) {
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        fd = open(path, O_RDONLY);
        len = fd >= 0 ? read(fd, out, size - 1) : -1;
        if (fd >= 0) {
            close(fd);
        }
    }
    if (len <= 0) {
        snprintf(out, size, "(exited)");
        return;
    }
    out[len] = 0;
    while (len > 0 && (out[len - 1] == 0 || out[len - 1] == '\n')) {
        out[--len] = 0;
    }
    for (ssize_t i = 0; i < len; i++) {
        if (out[i] == 0 || out[i] == '\n') {
            out[i] = ' ';
        }
    }
}

/* The test has exited: what still runs below gets GRACE_MS, then is named,
 * terminated, killed and reaped. */
static void stop_descendants(pid_t test)
{
    long t0 = now_ms();
    for (;;) {
        reap(0, test);
        if (below(0) == 0) {
            return;
        }
        if (now_ms() - t0 > GRACE_MS) {
            break;
        }
        nap();
    }
    size_t n;
    struct proc *p = descendants(&n);
    for (size_t i = 0; i < n; i++) {
        if (p[i].state != 'Z' && p[i].state != 'X') {
            char cmd[400];
            describe(p[i].pid, cmd, sizeof cmd);
            say("left behind: pid %d: %s", (int)p[i].pid, cmd);
            left++;
        }
    }
    free(p);
    t0 = now_ms();
    below(SIGTERM);
    while (now_ms() - t0 < TERM_MS) {
        reap(0, test);
        if (below(0) == 0) {
            return;
        }
        nap();
    }
    t0 = now_ms();
    while (now_ms() - t0 < KILL_MS) {
        below(SIGKILL);
        reap(0, test);
        if (below(0) == 0) {
            return;
        }
        nap();
    }
    say("%zu processes did not die on SIGKILL", below(0));
}

/* ---- a private /dev/shm and /run/netns mounts -------------------------------- */

/* A mount namespace of this process's own with an empty tmpfs on /dev/shm as
 * large as the machine's. Private, not a slave: mounts made here do not reach
 * the rest of the machine, and those made elsewhere while the test runs (the
 * network namespaces of a test run outside a guard) do not reach here, where
 * they would be taken for the test's. 0, or -1 saying why not. */
static int private_shm(void)
{
    struct statvfs sv;
    char opts[64];
    const char *off = getenv("MMP_REAPER_PRIVATE_SHM");
    if (off && strcmp(off, "0") == 0) { /* an escape hatch, for a device where it misbehaves */
        say("/dev/shm not checked (MMP_REAPER_PRIVATE_SHM=0)");
        return -1;
    }
    if (statvfs("/dev/shm", &sv) != 0) {
        say("/dev/shm not checked: %s", strerror(errno));
        return -1;
    }
    snprintf(opts, sizeof opts, "mode=1777,size=%llu",
             (unsigned long long)sv.f_blocks * (unsigned long long)sv.f_frsize);
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
        say("/dev/shm not checked (no private one here: %s)", strerror(errno));
        return -1;
    }
    return 0;
}

/* Mount points under /run/netns/ (network namespaces `ip netns add` made),
 * up to max of them, as /proc/self/mountinfo writes them. */
static int netns_mounts(char (*out)[256], int max)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096];
    int n = 0;
    while (f && n < max && fgets(line, sizeof line, f)) {
        char point[256];
        /* id parent major:minor root mountpoint ... */
        if (sscanf(line, "%*s %*s %*s %*s %255s", point) == 1 &&
            strncmp(point, NETNS_DIR, strlen(NETNS_DIR)) == 0) {
            snprintf(out[n++], 256, "%s", point);
        }
    }
    if (f) {
        fclose(f);
    }
    return n;
}

static void check_netns(char (*before)[256], int nbefore)
{
    static char now[MAX_NETNS][256];
    int n = netns_mounts(now, MAX_NETNS);
    for (int i = 0; i < n; i++) {
        int old = 0;
        for (int j = 0; j < nbefore && !old; j++) {
            old = strcmp(now[i], before[j]) == 0;
        }
        for (int j = 0; j < i && !old; j++) {
            old = strcmp(now[i], now[j]) == 0; /* mounted twice */
        }
        if (old) {
            continue;
        }
        say("left behind: network namespace %s (ip netns)", now[i] + strlen(NETNS_DIR));
        left++;
        umount2(now[i], MNT_DETACH);
        unlink(now[i]);
    }
}

static void check_shm(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
            continue;
        }
        if (strncmp(e->d_name, "mmpipe-", 7) == 0) {
            say("left in /dev/shm: %s", e->d_name);
            left++;
        } else {
            say("note: /dev/shm/%s remained (not an mmpipe name, not counted)", e->d_name);
        }
        unlinkat(dirfd(d), e->d_name, 0);
    }
    if (d) {
        closedir(d);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: reaper NAME CMD [ARG...]: runs CMD, fails when it leaves a "
                        "process, a /dev/shm entry or a network namespace behind\n");
        return 2;
    }
    name = argv[1];
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        say("cannot become a child subreaper: %s", strerror(errno));
        return 2;
    }
    int shm = private_shm() == 0;
    static char netns_before[MAX_NETNS][256];
    int nnetns = shm ? netns_mounts(netns_before, MAX_NETNS) : 0;

    int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    sigset_t block, old;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        sigaddset(&block, sigs[i]);
    }
    sigprocmask(SIG_BLOCK, &block, &old);
    fflush(NULL);
    pid_t test = fork();
    if (test < 0) {
        say("fork: %s", strerror(errno));
        return 2;
    }
    if (test == 0) {
        setpgid(0, 0);              /* its own group: a `kill 0` in the test stays in the test */
        unsetenv("MMP_REAPER_LOG"); /* one line per test, not per ctest run inside it */
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(argv[2], argv + 2);
        say("cannot run %s: %s", argv[2], strerror(errno));
        _exit(127);
    }
    setpgid(test, test); /* whichever of the two runs first */
    test_pgid = test;
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        sigaction(sigs[i], &sa, NULL);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);

    reap(1, test);
    stop_descendants(test);
    if (shm) {
        check_shm();
        check_netns(netns_before, nnetns);
    }

    const char *log = getenv("MMP_REAPER_LOG");
    FILE *lf = log && *log ? fopen(log, "a") : NULL;
    if (lf) {
        fprintf(lf, "%s: %d left behind\n", name, left);
        fclose(lf);
    }
    if (WIFSIGNALED(test_status)) {
        int sig = WTERMSIG(test_status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none); /* the test's own core is the one that matters */
        signal(sig, SIG_DFL);
        sigset_t only;
        sigemptyset(&only);
        sigaddset(&only, sig);
        sigprocmask(SIG_UNBLOCK, &only, NULL);
        raise(sig);
        return 128 + sig;
    }
    int rc = WIFEXITED(test_status) ? WEXITSTATUS(test_status) : 1;
    if (rc != 0) {
        return rc;
    }
    return left ? 1 : 0;
}
