/* File-system helpers that take user paths: whole-file reads, tree removal
 * and the run lock.
 *
 * No function here ever runs a shell or another program: a path is passed
 * to system calls as bytes, so quotes, spaces, newlines or a leading '-' in
 * it mean nothing special.
 *
 * The run lock keeps two writers out of one run directory. It is an
 * advisory fcntl write lock on <dir>/.mmpipe.lock, held by the process that
 * writes the run (the coordinator, or the single-process trainer) until it
 * releases it or exits; the kernel drops it when the holder dies, so a stale
 * lock file of a dead process never blocks. The descriptor is close-on-exec:
 * stage processes do not inherit it. */
#ifndef MMP_COMMON_FSUTIL_H
#define MMP_COMMON_FSUTIL_H

#include <stddef.h>
#include <sys/types.h>

#include "common/err.h"

#define MMP_RUN_LOCK_FILE ".mmpipe.lock"

/* Reads the whole regular file path into a new buffer. MMP_OK: *out (the
 * caller frees it) holds the *len bytes and one NUL byte after them, not
 * counted in *len, so that text can be parsed in place. Blocks. On failure
 * *out is NULL, *len 0, and the message names path: bad_path when path
 * cannot be opened or is not a regular file (MMP_ERR_DATA where a dataset
 * named the file, MMP_ERR_IO elsewhere); MMP_ERR_DATA when it holds more
 * than max_len bytes; MMP_ERR_IO when fstat or the read fails;
 * MMP_ERR_NOMEM. */
mmp_err mmp_fs_read_file(const char *path, mmp_err bad_path, size_t max_len, unsigned char **out,
                         size_t *len);

/* Removes path and, when it is a directory, everything under it (symlinks
 * are removed, never followed). A path that does not exist is not an error.
 * Blocks; on failure returns MMP_ERR_IO naming the entry that could not be
 * removed (what was removed before stays removed). */
mmp_err mmp_fs_rmtree(const char *path);

typedef struct mmp_run_lock {
    int held; /* 0 in a zeroed struct: unlock is then a no-op */
    int fd;
} mmp_run_lock;

/* Takes the run lock of the existing directory dir without waiting (creates
 * the lock file when missing). MMP_OK: held until mmp_run_unlock or exit.
 * MMP_ERR_IO with *holder set to the holder's pid (0 if the kernel could
 * not say) when another process holds it; the message names dir and the
 * pid. Other failures (dir missing, unwritable): MMP_ERR_IO, *holder = 0.
 * l->held is 0 after any failure. */
mmp_err mmp_run_lock_take(mmp_run_lock *l, const char *dir, pid_t *holder);
/* Releases the lock (closes the descriptor; the file stays). NULL-safe,
 * idempotent, valid on a zeroed struct and after a failed take. */
void mmp_run_unlock(mmp_run_lock *l);

#endif
