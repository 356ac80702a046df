/* Named POSIX shared-memory segments: creating, attaching, doorbells, peer
 * liveness and removing the name (the contract is in segment.h).
 *
 * Must never: trust a segment's size before the user's check has seen its
 * header, leave a name behind after a failed create, keep a file descriptor
 * open past a call, or use FUTEX_PRIVATE (the waiters are other processes). */
#include "transport/segment.h"
#include "common/progress.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Pauses between attach attempts (ms): short at first, since the creator is
 * usually starting at the same moment, then doubling up to a ceiling, so a
 * slow creator costs few system calls and is still noticed within 5 ms. */
#define ATTACH_FIRST_PAUSE_MS 0.2
#define ATTACH_MAX_PAUSE_MS 5.0

static double now_ms(void)
{
    return mmp_now() * 1e3; /* CLOCK_MONOTONIC */
}

static void sleep_ms(double ms)
{
    struct timespec t = {(time_t)(ms / 1e3), (long)((ms - (time_t)(ms / 1e3) * 1e3) * 1e6)};
    nanosleep(&t, NULL);
}

mmp_err mmp_segment_check_name(const char *what, const char *field, const char *name)
{
    if (!name || name[0] != '/' || !name[1] || strchr(name + 1, '/') || strlen(name) > NAME_MAX) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "%s: %s '%s' is not a POSIX shm name ('/' then up to %d characters, no "
                          "other '/')",
                          what, field, name ? name : "(null)", NAME_MAX - 1);
    }
    return MMP_OK;
}

/* ---- creating and attaching ---------------------------------------------- */

mmp_err mmp_segment_create(void **base, const char *what, const char *name, size_t bytes)
{
    mmp_err ret = MMP_OK;
    void *map = MAP_FAILED;
    *base = NULL;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "%s %s: create: %s%s", what, name, strerror(errno),
                          errno == EEXIST ? " (left by a crashed run? mmp_shm_unlink_prefix)" : "");
    }
    /* posix_fallocate, not just ftruncate: a full /dev/shm is an error here,
     * not a SIGBUS on some later access. */
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    if (e != 0) {
        ret =
            mmp_errorf(MMP_ERR_IO, "%s %s: reserve %zu bytes: %s", what, name, bytes, strerror(e));
        goto fail;
    }
    map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) {
        ret =
            mmp_errorf(MMP_ERR_IO, "%s %s: map %zu bytes: %s", what, name, bytes, strerror(errno));
        goto fail;
    }
    *base = map;

exit:
    close(fd); /* the mapping holds the segment */
    return ret;

fail:
    shm_unlink(name);
    goto exit;
}

void mmp_segment_publish(void *base, uint64_t magic)
{
    atomic_store_explicit((_Atomic uint64_t *)base, magic, memory_order_release);
}

/* One attempt to attach: MMP_OK, MMP_ERR_TIMEOUT when the segment is not
 * there or not ready yet (try again), or a real error. */
static mmp_err try_attach(void **base, const char *what, const char *name, size_t header_bytes,
                          size_t bytes, mmp_segment_check check, void *ctx)
{
    mmp_err ret = MMP_OK;
    void *map = MAP_FAILED;
    size_t mapped = 0;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        if (errno == ENOENT) {
            return MMP_ERR_TIMEOUT;
        }
        return mmp_errorf(MMP_ERR_IO, "%s %s: open: %s", what, name, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ret = mmp_errorf(MMP_ERR_IO, "%s %s: stat: %s", what, name, strerror(errno));
        goto exit;
    }
    if ((size_t)st.st_size < header_bytes) {
        ret = MMP_ERR_TIMEOUT; /* created, not sized yet */
        goto exit;
    }
    /* Read the creator's header through a small mapping before trusting its
     * size: a mismatched segment may be of any size. */
    mapped = header_bytes;
    map = mmap(NULL, mapped, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ret = mmp_errorf(MMP_ERR_IO, "%s %s: map header: %s", what, name, strerror(errno));
        goto exit;
    }
    uint64_t magic = atomic_load_explicit((_Atomic uint64_t *)map, memory_order_acquire);
    if (magic == 0) {
        ret = MMP_ERR_TIMEOUT; /* the creator has not published it yet */
        goto exit;
    }
    ret = check(ctx, map, magic, (size_t)st.st_size);
    if (ret != MMP_OK) {
        goto exit;
    }
    munmap(map, mapped);
    mapped = bytes;
    map = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) {
        ret =
            mmp_errorf(MMP_ERR_IO, "%s %s: map %zu bytes: %s", what, name, mapped, strerror(errno));
        goto exit;
    }
    *base = map;
    map = MAP_FAILED; /* the caller's now */

exit:
    if (map != MAP_FAILED) {
        munmap(map, mapped);
    }
    close(fd);
    return ret;
}

mmp_err mmp_segment_attach(void **base, const char *what, const char *name, size_t header_bytes,
                           size_t bytes, int timeout_ms, mmp_segment_check check, void *ctx)
{
    *base = NULL;
    double start = now_ms(), pause = ATTACH_FIRST_PAUSE_MS;
    mmp_err ret;
    while ((ret = try_attach(base, what, name, header_bytes, bytes, check, ctx)) ==
           MMP_ERR_TIMEOUT) {
        if (timeout_ms > 0 && now_ms() - start >= timeout_ms) {
            break;
        }
        sleep_ms(pause);
        pause = pause * 2 < ATTACH_MAX_PAUSE_MS ? pause * 2 : ATTACH_MAX_PAUSE_MS;
    }
    return ret;
}

void mmp_segment_unmap(void *base, size_t bytes)
{
    if (base) {
        munmap(base, bytes);
    }
}

int mmp_segment_unlink_once(_Atomic uint32_t *unlinked, const char *name)
{
    uint32_t zero = 0;
    if (!atomic_compare_exchange_strong(unlinked, &zero, 1)) {
        return 0;
    }
    shm_unlink(name); /* ENOENT is harmless: someone removed it by hand */
    return 1;
}

/* ---- doorbells ------------------------------------------------------------ */

int mmp_segment_bell_wait(_Atomic uint32_t *bell, uint32_t seen, _Atomic uint32_t *sleepers, int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    /* seq_cst, the mirror of the ringer's bump then load of sleepers: either
     * the FUTEX_WAIT below reads the bumped word or the ringer sees us. */
    if (sleepers) {
        atomic_fetch_add_explicit(sleepers, 1, memory_order_seq_cst);
    }
    int r = 0;
    if (syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAIT, seen, &t, NULL, 0) != 0) {
        r = errno == EAGAIN ? 0 : errno;
    }
    if (sleepers) {
        atomic_fetch_sub_explicit(sleepers, 1, memory_order_relaxed);
    }
    return r;
}

/* Waking unconditionally would cost a system call per message on a data
 * channel even while the peer is awake: measured 1.4-2.3 M msg/s against
 * 11-12 M msg/s with the sleepers check, streaming 64-byte messages. */
void mmp_segment_bell_ring(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers)
{
    atomic_fetch_add_explicit(bell, 1, memory_order_seq_cst);
    if (!sleepers || atomic_load_explicit(sleepers, memory_order_seq_cst) != 0) {
        syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* ---- peer liveness -------------------------------------------------------- */

int mmp_segment_peer_dead(_Atomic int32_t *pid, int *pidfd)
{
    pid_t p = atomic_load_explicit(pid, memory_order_acquire);
    if (p <= 0) {
        return 0; /* not attached yet: only the caller's timeout can end its wait */
    }
    if (*pidfd < 0) {
        /* A pidfd pins the process: unlike kill(pid, 0) it reports a
         * not-yet-reaped child as exited and is immune to pid reuse. */
        int fd = (int)syscall(SYS_pidfd_open, p, 0);
        if (fd < 0 && errno == ESRCH) {
            return 1;
        }
        if (fd < 0) {
            return kill(p, 0) == -1 && errno == ESRCH;
        }
        *pidfd = fd;
    }
    struct pollfd pf = {.fd = *pidfd, .events = POLLIN};
    return poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN);
}
