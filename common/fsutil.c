/* Whole-file reads, atomic replacement (PATH.tmp + rename), tree removal
 * (nftw + remove, no shell) and the run directory's lock.
 * Must never hand a path to a shell or exec another program. */
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

mmp_err mmp_fs_read_file(const char *path, mmp_err bad_path, size_t max_len, unsigned char **out,
                         size_t *len)
{
    mmp_err ret = MMP_OK;
    unsigned char *buf = NULL;
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mmp_errorf(bad_path, "%s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
        goto exit;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = mmp_errorf(bad_path, "%s: not a regular file", path);
        goto exit;
    }
    size_t cap = max_len < SIZE_MAX ? max_len : SIZE_MAX - 1; /* n + 1 below must not wrap */
    if ((unsigned long long)st.st_size > (unsigned long long)cap) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: %lld bytes, more than the %zu bytes this file may have",
                         path, (long long)st.st_size, cap);
        goto exit;
    }
    size_t n = (size_t)st.st_size;
    buf = malloc(n + 1);
    if (!buf) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes to read it", path, n);
        goto exit;
    }
    if (n && fread(buf, 1, n, f) != n) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: short read", path);
        free(buf);
        goto exit;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
exit:
    fclose(f);
    return ret;
}

mmp_err mmp_atomic_open(mmp_atomic_file *a, const char *path, unsigned flags)
{
    a->f = NULL;
    a->flags = flags;
    a->path[0] = a->tmp[0] = 0;
    size_t n = strlen(path);
    if (n >= sizeof a->path) {
        /* the reason first: a message is cut at 2 KiB */
        return mmp_errorf(MMP_ERR_IO, "path too long (%zu bytes, at most %zu): %s", n,
                          sizeof a->path - 1, path);
    }
    memcpy(a->path, path, n + 1);
    memcpy(a->tmp, path, n);
    memcpy(a->tmp + n, ".tmp", 5);
    /* O_CLOEXEC: a stage process started meanwhile must not hold it open. */
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "create %s: %s", a->tmp, strerror(errno));
    }
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        int e = errno;
        close(fd);
        unlink(a->tmp);
        return mmp_errorf(MMP_ERR_IO, "create %s: %s", a->tmp, strerror(e));
    }
    return MMP_OK;
}

mmp_err mmp_fs_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "open %s: %s", dir, strerror(errno));
    }
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL && e != ENOTSUP) {
        return mmp_errorf(MMP_ERR_IO, "fsync %s: %s", dir, strerror(e));
    }
    return MMP_OK;
}

/* fsyncs the directory that holds path (its rename is then on disk). */
static mmp_err sync_parent(const char *path)
{
    char dir[MMP_ATOMIC_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        return mmp_fs_sync_dir(".");
    }
    size_t n = slash == path ? 1 : (size_t)(slash - path); /* "/x" lives in "/" */
    memcpy(dir, path, n);
    dir[n] = 0;
    return mmp_fs_sync_dir(dir);
}

mmp_err mmp_atomic_commit(mmp_atomic_file *a)
{
    MMP_ASSERT(a->f != NULL);
    FILE *f = a->f;
    a->f = NULL;
    /* ferror too: a write that failed inside stdio (a full disk) drops its
     * buffer, and fflush then has nothing left to fail on. errno still
     * holds that write's reason; EIO where nothing says more. */
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (!bad && (a->flags & MMP_ATOMIC_DURABLE) && fsync(fileno(f)) != 0) {
        bad = 1;
        e = errno;
    }
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        unlink(a->tmp);
        return mmp_errorf(MMP_ERR_IO, "write %s: %s", a->tmp, strerror(e ? e : EIO));
    }
    if (rename(a->tmp, a->path) != 0) {
        e = errno;
        unlink(a->tmp);
        return mmp_errorf(MMP_ERR_IO, "rename %s: %s", a->tmp, strerror(e));
    }
    return a->flags & MMP_ATOMIC_DURABLE ? sync_parent(a->path) : MMP_OK;
}

void mmp_atomic_abort(mmp_atomic_file *a)
{
    if (!a || !a->f) {
        return;
    }
    fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
}

/* nftw has no user pointer: the first failure's path goes here (one tree
 * removal at a time per thread). */
static _Thread_local char failed_path[1024];
static _Thread_local int failed_errno;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    if (remove(path) == 0 || errno == ENOENT) {
        return 0;
    }
    failed_errno = errno;
    snprintf(failed_path, sizeof failed_path, "%s", path);
    return 1;
}

mmp_err mmp_fs_rmtree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) {
            return MMP_OK;
        }
        return mmp_errorf(MMP_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT) {
            return mmp_errorf(MMP_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
        }
        return MMP_OK;
    }
    failed_path[0] = 0;
    failed_errno = 0;
    /* FTW_DEPTH: children before their directory; FTW_PHYS: a symlink is
     * an entry to remove, not a directory to enter. */
    int rc = nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc != 0) {
        if (failed_path[0]) {
            return mmp_errorf(MMP_ERR_IO, "cannot remove %s: %s", failed_path,
                              strerror(failed_errno));
        }
        return mmp_errorf(MMP_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    }
    return MMP_OK;
}

/* The pid whose lock on fd's file stops a write lock, 0 when none. */
static pid_t lock_holder_of(int fd)
{
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    return fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK ? q.l_pid : 0;
}

pid_t mmp_run_lock_holder(const char *dir)
{
    char path[1200];
    if (snprintf(path, sizeof path, "%s/%s", dir, MMP_RUN_LOCK_FILE) >= (int)sizeof path) {
        return 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    pid_t pid = lock_holder_of(fd);
    close(fd);
    return pid;
}

mmp_err mmp_run_lock_take(mmp_run_lock *l, const char *dir, pid_t *holder)
{
    char path[1200];
    *holder = 0;
    l->held = 0;
    l->fd = -1;
    if (snprintf(path, sizeof path, "%s/%s", dir, MMP_RUN_LOCK_FILE) >= (int)sizeof path) {
        return mmp_errorf(MMP_ERR_IO, "%s: path too long", dir);
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "cannot open the run lock %s: %s", path, strerror(errno));
    }
    /* A classic (per-process) fcntl lock, not an OFD one: F_GETLK then
     * names the holder's pid. Nothing else in this process opens the file,
     * so no stray close drops it. */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_SETLK, &fl) == 0) {
        l->fd = fd;
        l->held = 1;
        /* The pid in the file is for people (cat); the kernel's lock is the truth. */
        char pid[32];
        int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
            /* harmless: the lock is held all the same */
        }
        return MMP_OK;
    }
    int e = errno;
    if (e != EACCES && e != EAGAIN) {
        close(fd);
        return mmp_errorf(MMP_ERR_IO, "cannot lock %s: %s", path, strerror(e));
    }
    *holder = lock_holder_of(fd);
    close(fd);
    if (*holder > 0) {
        return mmp_errorf(MMP_ERR_IO, "%s is in use by another run (pid %d holds %s)", dir,
                          (int)*holder, path);
    }
    return mmp_errorf(MMP_ERR_IO, "%s is in use by another run (%s is locked)", dir, path);
}

void mmp_run_unlock(mmp_run_lock *l)
{
    if (l && l->held) {
        close(l->fd);
        l->fd = -1;
        l->held = 0;
    }
}
