/* Thread-local last-error message and the process's log lines. */
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* err.h's analyzer model of these two would rename their definitions. */
#undef mmp_errorf
#undef mmp_error_prefix

static _Thread_local char last_error[2048];
static char log_name[64] = "mmpipe";
static mmp_log_level log_level = MMP_LOG_INFO;

const char *mmp_err_name(mmp_err e)
{
    switch (e) {
    case MMP_OK:
        return "ok";
    case MMP_ERR_INVALID:
        return "invalid";
    case MMP_ERR_CONFIG:
        return "config";
    case MMP_ERR_IO:
        return "io";
    case MMP_ERR_NOMEM:
        return "out of memory";
    case MMP_ERR_DATA:
        return "data";
    case MMP_ERR_CUDA:
        return "cuda";
    case MMP_ERR_PROTO:
        return "protocol";
    case MMP_ERR_PEER:
        return "peer";
    case MMP_ERR_TIMEOUT:
        return "timeout";
    case MMP_ERR_UNSUPPORTED:
        return "unsupported";
    case MMP_ERR_INTERNAL:
        return "internal";
    }
    return "unknown";
}

mmp_err mmp_errorf(mmp_err e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return e;
}

mmp_err mmp_error_prefix(mmp_err e, const char *fmt, ...)
{
    char prefix[512];
    char old[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    /* "<prefix>: <old>", cut at the buffer's end (the start is the useful part). */
    size_t n = strlen(prefix);
    if (n > sizeof last_error - 3) {
        n = sizeof last_error - 3;
    }
    memcpy(last_error, prefix, n);
    memcpy(last_error + n, ": ", 2);
    size_t room = sizeof last_error - n - 3, m = strlen(old);
    memcpy(last_error + n + 2, old, m < room ? m : room);
    last_error[n + 2 + (m < room ? m : room)] = 0;
    return e;
}

const char *mmp_last_error(void)
{
    return last_error;
}

void mmp_log_set_name(const char *name)
{
    snprintf(log_name, sizeof log_name, "%s", name);
}

void mmp_log_set_level(mmp_log_level level)
{
    log_level = level;
}

void mmp_log_at(mmp_log_level level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (level < log_level) {
        return;
    }
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One fprintf per line so lines of concurrent processes do not interleave. */
    fprintf(stderr, "[%s] %s %s:%d: %s\n", log_name, names[level], base, line, msg);
}

void mmp_panic(const char *file, int line, const char *what)
{
    fprintf(stderr, "[%s] panic %s:%d: invariant broken: %s\n", log_name, file, line, what);
    abort();
}
