/* CPU pinning (common/pin.h). */
#include "common/pin.h"

#include "common/config.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

int mmp_pin_allowed(int *cores, int max)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE && n < max; c++) {
            if (CPU_ISSET(c, &set)) {
                cores[n++] = c;
            }
        }
    }
    if (n == 0 && max > 0) {
        cores[n++] = 0;
    }
    return n;
}

int mmp_pin_pick(const int *list, int n, int k, int threads, int *out)
{
    if (n <= 0 || k < 0) {
        return 0;
    }
    int want = threads < 1 ? 1 : threads > n ? n : threads;
    long long first = (long long)k * want;
    for (int j = 0; j < want; j++) {
        out[j] = list[(first + j) % n];
    }
    return want;
}

const char *mmp_pin_format(const int *cores, int n_cores, char *buf, size_t n)
{
    size_t len = 0;
    if (n == 0) {
        return buf;
    }
    buf[0] = 0;
    for (int i = 0; i < n_cores && len < n; i++) {
        len += (size_t)snprintf(buf + len, n - len, "%s%d", i ? "," : "", cores[i]);
    }
    return buf;
}

/* Calls set(tid, arg) for every thread of this process but the caller (whose
 * own call comes first, from the caller); a thread that ended after the
 * listing (ESRCH) is skipped. what names the setting in errors. */
static mmp_err each_other_thread(int (*set)(long tid, const void *arg), const void *arg,
                                 const char *what)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) {
        return mmp_errorf(MMP_ERR_IO, "%s: /proc/self/task: %s", what, strerror(errno));
    }
    mmp_err ret = MMP_OK;
    long self = (long)syscall(SYS_gettid);
    for (struct dirent *e; ret == MMP_OK && (e = readdir(d));) {
        char *end;
        long tid = strtol(e->d_name, &end, 10);
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end || tid == self) {
            continue;
        }
        if (set(tid, arg) != 0 && errno != ESRCH) {
            ret = mmp_errorf(MMP_ERR_INVALID, "%s for thread %ld: %s", what, tid, strerror(errno));
        }
    }
    closedir(d);
    return ret;
}

static int set_affinity(long tid, const void *set)
{
    return (int)syscall(SYS_sched_setaffinity, (pid_t)tid, sizeof(cpu_set_t), set);
}

mmp_err mmp_pin_self(const int *cores, int n)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < n; i++) {
        if (cores[i] < 0 || cores[i] >= CPU_SETSIZE) {
            return mmp_errorf(MMP_ERR_INVALID, "train.pin: core %d is not a core id", cores[i]);
        }
        CPU_SET(cores[i], &set);
    }
    char list[256], what[300];
    mmp_pin_format(cores, n, list, sizeof list);
    /* The calling thread first: a refusal is then about the cores, not a
     * thread that ended meanwhile. */
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "train.pin: cores %s: %s (cores this process may use: see "
                          "`taskset -p $$`)",
                          list, strerror(errno));
    }
    snprintf(what, sizeof what, "train.pin: cores %s", list);
    return each_other_thread(set_affinity, &set, what);
}

static int set_nice(long tid, const void *n)
{
    return setpriority(PRIO_PROCESS, (id_t)tid, *(const int *)n);
}

mmp_err mmp_nice_self(int n)
{
    if (n < 1 || n > 19) {
        return mmp_errorf(MMP_ERR_INVALID, "train.priority: nice %d is not 1 to 19", n);
    }
    char what[64];
    snprintf(what, sizeof what, "train.priority: nice %d", n);
    if (setpriority(PRIO_PROCESS, 0, n) != 0) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: %s", what, strerror(errno));
    }
    return each_other_thread(set_nice, &n, what);
}

int mmp_pin_list(const mmp_plan *p, int *cores)
{
    if (p->train.pin.mode == MMP_PIN_LIST) {
        int n = p->train.pin.n_cores < MMP_MAX_PIN_LIST ? p->train.pin.n_cores : MMP_MAX_PIN_LIST;
        memcpy(cores, p->train.pin.cores, (size_t)n * sizeof *cores);
        return n;
    }
    return p->train.pin.mode == MMP_PIN_AUTO ? mmp_pin_allowed(cores, MMP_PIN_MAX_CORES) : 0;
}

mmp_err mmp_pin_apply(const mmp_plan *p, int k, int *n, char *what, size_t what_n)
{
    static int list[MMP_PIN_MAX_CORES];
    int got[256];
    int n_list = mmp_pin_list(p, list);
    int threads = p->train.threads < 256 ? p->train.threads : 256;
    int n_got = mmp_pin_pick(list, n_list, k, threads, got);
    if (n) {
        *n = n_got;
    }
    if (what && what_n) {
        mmp_pin_format(got, n_got, what, what_n);
    }
    return n_got > 0 ? mmp_pin_self(got, n_got) : MMP_OK;
}
