/* Errors and logging.
 *
 * Every fallible function returns an mmp_err and writes its results through
 * pointers. The human-readable reason for the most recent failure on this
 * thread is kept by mmp_errorf() and read back with mmp_last_error(), so the
 * caller that finally reports the error can say what and where without every
 * layer formatting its own message. Library code never calls exit(). */
#ifndef MMP_COMMON_ERR_H
#define MMP_COMMON_ERR_H

#include <stdarg.h>

typedef enum mmp_err {
    MMP_OK = 0,
    MMP_ERR_INVALID, /* a bad argument or value (caller's or user's input) */
    MMP_ERR_CONFIG,  /* a plan / config problem: file:line:column in the message */
    MMP_ERR_IO,      /* a file or system call failed */
    MMP_ERR_NOMEM,   /* an allocation failed */
    MMP_ERR_DATA,    /* bad data: manifest line, image, caption, checkpoint */
    MMP_ERR_CUDA,    /* a CUDA / cuBLAS / cuDNN / NCCL call failed */
    MMP_ERR_PROTO,   /* a control or data message that is not what it must be */
    MMP_ERR_PEER,    /* a peer process died or went silent */
    MMP_ERR_TIMEOUT, /* nothing arrived in time (not always a failure) */
    MMP_ERR_UNSUPPORTED,
    MMP_ERR_INTERNAL, /* a broken invariant */
} mmp_err;

/* Name of an error code ("invalid", "config", ...). Never NULL. */
const char *mmp_err_name(mmp_err e);

/* Records a formatted reason for error e on this thread and returns e, so
 * `return mmp_errorf(MMP_ERR_IO, "open %s: %s", path, strerror(errno));`
 * both reports and propagates. The first error of a failure chain is the
 * useful one, so callers that add context use mmp_error_prefix(). */
mmp_err mmp_errorf(mmp_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "<context>: " to this thread's last error message; returns e. */
mmp_err mmp_error_prefix(mmp_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* For static analyzers only (scripts/analyze): they read one file at a time
 * and cannot see that the two calls above return their e, so to them every
 * `return mmp_errorf(MMP_ERR_..., ...)` after a cleanup may be MMP_OK, and
 * the caller's use of what was cleaned up a bug. This states the contract
 * where they look; builds never define it. */
#if defined(__clang_analyzer__) || defined(MMP_ANALYZER)
#define mmp_errorf(e, ...)                                                                         \
    __extension__({                                                                                \
        mmp_err mmp_model_e_ = (e);                                                                \
        (void)mmp_errorf(mmp_model_e_, __VA_ARGS__);                                               \
        mmp_model_e_;                                                                              \
    })
#define mmp_error_prefix(e, ...)                                                                   \
    __extension__({                                                                                \
        mmp_err mmp_model_e_ = (e);                                                                \
        (void)mmp_error_prefix(mmp_model_e_, __VA_ARGS__);                                         \
        mmp_model_e_;                                                                              \
    })
#endif

/* This thread's last error message ("" if none). Valid until the next call. */
const char *mmp_last_error(void);

/* ---- logging ----------------------------------------------------------- */

typedef enum mmp_log_level {
    MMP_LOG_DEBUG = 0,
    MMP_LOG_INFO,
    MMP_LOG_WARN,
    MMP_LOG_ERROR
} mmp_log_level;

/* The process's role in log lines ("coordinator", "image.0", ...). */
void mmp_log_set_name(const char *name);
void mmp_log_set_level(mmp_log_level level);

void mmp_log_at(mmp_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define MMP_DEBUG(...) mmp_log_at(MMP_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define MMP_INFO(...) mmp_log_at(MMP_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define MMP_WARN(...) mmp_log_at(MMP_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define MMP_ERROR(...) mmp_log_at(MMP_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

/* Propagates a failure: `MMP_TRY(f(x));` returns f's error from the caller. */
#define MMP_TRY(expr)                                                                              \
    do {                                                                                           \
        mmp_err mmp_try_e_ = (expr);                                                               \
        if (mmp_try_e_ != MMP_OK) {                                                                \
            return mmp_try_e_;                                                                     \
        }                                                                                          \
    } while (0)

/* The same inside a function with one cleanup path (NCCL's NCCLCHECKGOTO):
 * `MMP_TRY_GOTO(f(x), ret, fail);` keeps f's error in ret and jumps to the
 * label, where the function undoes what it did and returns ret. */
#define MMP_TRY_GOTO(expr, ret, label)                                                             \
    do {                                                                                           \
        if (((ret) = (expr)) != MMP_OK) {                                                          \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* For broken invariants only (never for input the outside world controls). */
#define MMP_ASSERT(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            mmp_panic(__FILE__, __LINE__, #cond);                                                  \
        }                                                                                          \
    } while (0)

_Noreturn void mmp_panic(const char *file, int line, const char *what);

#endif
