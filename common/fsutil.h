/* File-system helpers that take user paths: whole-file reads, atomic file
 * replacement, tree removal and the run lock.
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
#include <stdio.h>
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

/* ---- atomic file replacement ---------------------------------------------
 *
 * Every file a reader must find either whole or not at all (plan.json,
 * metrics.jsonl, checkpoints, the fingerprint, trace.json, safetensors
 * exports, a data set's manifests) is written as PATH.tmp and renamed over
 * PATH once every byte of it is known to be written:
 *
 *     mmp_atomic_file a;
 *     MMP_TRY(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE));
 *     fprintf(a.f, ...);              // any stdio writes, unchecked
 *     return mmp_atomic_commit(&a);   // or mmp_atomic_abort(&a)
 *
 * The contract:
 * - Nothing at PATH changes until commit succeeds: a reader (or a crashed
 *   and restarted process) sees the old PATH (or none) or the whole new one.
 * - Commit checks every write (ferror, fflush, fclose, so a write that
 *   failed inside stdio on a full disk or past RLIMIT_FSIZE is caught even
 *   though the caller did not look), then renames.
 * - On any failure (open, a write, fsync, close, rename) PATH.tmp is removed
 *   and the error, MMP_ERR_IO, names PATH.tmp and the errno text:
 *   "create PATH.tmp: ...", "write PATH.tmp: ...", "rename PATH.tmp: ...".
 * - MMP_ATOMIC_DURABLE also survives a power cut: the file is fsynced before
 *   the rename, and PATH's directory after it, so once commit returns MMP_OK
 *   the new PATH is on disk. Without it a crash of the process still leaves
 *   the old or the new file, but after a power cut the file system may hold
 *   the rename without the data (an empty or short PATH). Checkpoints (and
 *   what resume reads: plan.json, metrics.jsonl) are durable; files that are
 *   diagnostics or regenerable (trace.json, synthetic data) are not, and
 *   skip the fsyncs' latency. A directory fsync that fails with anything
 *   but "not supported by this file system" fails the commit ("fsync
 *   DIR: ..."); PATH then already holds the new file (the rename is done;
 *   its durability is not known).
 * - A stale PATH.tmp (a writer killed before commit) is truncated and
 *   reused by the next open. Two writers of one PATH at once are the
 *   caller's to prevent (the run lock does).
 * Blocks. The struct is the caller's storage; commit and abort close the
 * file and leave a.f NULL; abort is NULL-safe, idempotent and valid after a
 * failed open or commit. */

#define MMP_ATOMIC_PATH_MAX 4096
enum { MMP_ATOMIC_DURABLE = 1 };

typedef struct mmp_atomic_file {
    FILE *f; /* PATH.tmp, open for writing ("wb"); NULL when not open */
    unsigned flags;
    char path[MMP_ATOMIC_PATH_MAX];
    char tmp[MMP_ATOMIC_PATH_MAX + 4]; /* path + ".tmp" */
} mmp_atomic_file;

/* Creates (or truncates) PATH.tmp for writing. flags: 0 or
 * MMP_ATOMIC_DURABLE. On failure a->f is NULL, nothing is left on disk,
 * and MMP_ERR_IO names PATH.tmp and errno's text, or says "path too long"
 * (PATH of MMP_ATOMIC_PATH_MAX bytes or more) and names PATH. */
mmp_err mmp_atomic_open(mmp_atomic_file *a, const char *path, unsigned flags);
/* Checks every write, fsyncs (durable), closes and renames PATH.tmp over
 * PATH. MMP_OK: PATH is the new file. Otherwise PATH is untouched (but see
 * the directory fsync above), PATH.tmp removed, MMP_ERR_IO. a->f must be
 * open (a second commit, or one after a failed open, is a broken invariant
 * and panics). */
mmp_err mmp_atomic_commit(mmp_atomic_file *a);
/* Abandons the write: closes and removes PATH.tmp; PATH stays as it was. */
void mmp_atomic_abort(mmp_atomic_file *a);
/* fsyncs directory dir (after a rename or a new entry in it). EINVAL and
 * ENOTSUP (a file system that cannot sync a directory) count as success.
 * MMP_ERR_IO naming dir otherwise. */
mmp_err mmp_fs_sync_dir(const char *dir);

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
/* The pid holding dir's run lock, 0 when none holds it (or there is no lock
 * file). Reads only: nothing on disk changes. */
pid_t mmp_run_lock_holder(const char *dir);
/* Releases the lock (closes the descriptor; the file stays). NULL-safe,
 * idempotent, valid on a zeroed struct and after a failed take. */
void mmp_run_unlock(mmp_run_lock *l);

#endif
