/* Named POSIX shared-memory segments between processes on one host: the
 * mechanics that the data channels (transport/shm.c, transport/cuda/cuda_ipc.c,
 * through transport/ring.h) and the replica reduce (transport/reduce.c) share.
 * Internal to transport/.
 *
 * A segment is one shm object, created by one process and attached by the
 * others, each mapping it once. What lies in it, who attaches in which role
 * and what a waiter waits for stay with the user; this module owns:
 * - creating it with its memory reserved up front, and attaching to it only
 *   once its creator has published a header the user has checked;
 * - doorbells: futex words in the segment that waiters sleep on;
 * - peer liveness: whether a process whose pid is in the segment has exited;
 * - removing the name exactly once, whoever gets there first.
 *
 * Every segment starts with its magic, an _Atomic uint64_t at offset 0 of the
 * mapping: zero until the creator has written the rest of its header, then
 * stored with release order (mmp_segment_publish). An attacher that reads it
 * non-zero (acquire) sees the whole header. Users static_assert the offset.
 *
 * Errors are recorded with mmp_errorf as "<what> <name>: ...", `what` being
 * the user's word ("shm", "reduce"), so they read like the user's own. No call
 * keeps a file descriptor open after it returns. */
#ifndef MMP_TRANSPORT_SEGMENT_H
#define MMP_TRANSPORT_SEGMENT_H

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Words shared across processes must be plain memory, not a lock in one
 * process: futex words 32-bit, counters (the users' too) 64-bit. */
static_assert(sizeof(_Atomic uint32_t) == 4 && ATOMIC_INT_LOCK_FREE == 2,
              "futex words must be plain lock-free 32-bit integers");
static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "counters must be lock-free across processes");

/* MMP_OK when name is a POSIX shm name: '/', then 1 to NAME_MAX - 1
 * characters, none of them '/'. Otherwise MMP_ERR_INVALID, recorded as
 * "<what>: <field> '<name>' is not a POSIX shm name (...)", field being the
 * user's config field that holds it ("address", "name"). NULL is invalid. */
mmp_err mmp_segment_check_name(const char *what, const char *field, const char *name);

/* ---- creating and attaching ---------------------------------------------- */

/* Creates name (O_EXCL, mode 0600), reserves `bytes` of memory for it (a full
 * /dev/shm fails here, not as a SIGBUS later) and maps it read-write and
 * populated; the fresh segment reads as zeros. Does not block.
 * MMP_OK: *base is the mapping, which the caller owns (mmp_segment_unmap);
 * the name stays until someone unlinks it. MMP_ERR_IO, named (an existing name
 * hints at a crashed run's leftovers): *base is NULL and nothing is left
 * behind, neither name nor mapping. */
mmp_err mmp_segment_create(void **base, const char *what, const char *name, size_t bytes);

/* The creator's last step: stores magic (non-zero) into the segment's first
 * word with release order. Everything written before it is visible to an
 * attacher that sees it. */
void mmp_segment_publish(void *base, uint64_t magic);

/* Judges a creator's header before anything trusts the segment's size:
 * header is its first header_bytes, mapped read-only; magic is its first word,
 * non-zero (comparing it with the user's own is the check's job); file_bytes
 * is the segment's actual size, which the check must find equal to the
 * `bytes` mmp_segment_attach is about to map (a shorter segment would fault
 * on access). Returns MMP_OK to accept, or an error it has recorded, which
 * mmp_segment_attach returns as it is. Runs in the attaching thread. */
typedef mmp_err (*mmp_segment_check)(void *ctx, const void *header, uint64_t magic,
                                     size_t file_bytes);

/* Attaches to the segment another process creates under name. Blocks while
 * the segment is not ready: the name does not exist yet, the segment is
 * smaller than header_bytes (created, not sized yet) or its magic is still
 * zero (not published yet), trying again after a pause that doubles from
 * 0.2 ms to 5 ms. Once it is ready, calls check(ctx, ...) once and, if that
 * accepts, maps `bytes` read-write and populated.
 * MMP_OK: *base is the mapping, which the caller owns (mmp_segment_unmap).
 * Otherwise *base is NULL and nothing is mapped: check's error; MMP_ERR_IO,
 * named, when a system call fails; MMP_ERR_TIMEOUT, with no message recorded,
 * when the segment was not ready within timeout_ms (<= 0: waits for ever), so
 * the caller says what it was waiting for. Never unlinks the name. */
mmp_err mmp_segment_attach(void **base, const char *what, const char *name, size_t header_bytes,
                           size_t bytes, int timeout_ms, mmp_segment_check check, void *ctx);

/* Unmaps what mmp_segment_create or mmp_segment_attach mapped. NULL is a
 * no-op. The name is not touched: see mmp_segment_unlink_once. */
void mmp_segment_unmap(void *base, size_t bytes);

/* Removes name unless another user already has: *unlinked is a flag in the
 * segment, and the call that flips it from 0 to 1 unlinks. Returns 1 when this
 * call did. A name already gone (removed by hand) is not an error. */
int mmp_segment_unlink_once(_Atomic uint32_t *unlinked, const char *name);

/* ---- doorbells ------------------------------------------------------------ */

/* A doorbell is a 32-bit word in the segment that a process bumps after each
 * change a waiter may sleep for, optionally with a count of sleepers so that
 * ringing costs no system call while nobody sleeps. A waiter reads the bell
 * (acquire), then checks its condition, then waits with the value it read:
 * a ring between the check and the sleep changes the word, so the wait returns
 * at once and the ring is never lost. The futex calls are shared between
 * processes (never FUTEX_PRIVATE). */

/* Sleeps while *bell == seen, for at most ms (> 0). When sleepers is given,
 * counts itself in it for the duration, so mmp_segment_bell_ring wakes it.
 * Returns 0 when woken (or the bell had already moved on), ETIMEDOUT or
 * EINTR: the caller re-checks its condition whatever it returns. */
int mmp_segment_bell_wait(_Atomic uint32_t *bell, uint32_t seen, _Atomic uint32_t *sleepers,
                          int ms);

/* Bumps *bell, then wakes every waiter, skipping the system call when
 * sleepers is given and counts nobody. Pass NULL to wake unconditionally: for
 * bells whose waiters do not count themselves, and for a close, which must
 * reach every waiter whatever the count says. */
void mmp_segment_bell_ring(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers);

/* ---- peer liveness -------------------------------------------------------- */

/* 1 when the process whose pid is stored at *pid is known to have exited (an
 * unreaped zombie counts as exited; a reused pid does not fool it); 0 while it
 * runs or while *pid is still 0 (not attached yet). *pidfd is the caller's
 * cache, -1 until a call opens a pidfd for that pid; the caller closes it once
 * done with the peer. Does not block. */
int mmp_segment_peer_dead(_Atomic int32_t *pid, int *pidfd);

#endif
