/* The slot ring with credit flow control that every shared-memory data
 * channel speaks (transport/shm.c with host slots, transport/cuda/cuda_ipc.c
 * with device slots). Internal to transport/.
 *
 * A ring is `slots` slots used strictly in ring order: message k lives in
 * slot k % slots. The sender may fill a slot only while head - tail < slots;
 * the receiver may read it only while its index < head. Per-slot headers
 * (mmp_msg_header) and payloads are plain memory ordered by the release store
 * of head (sender) and of tail (receiver). Two doorbells (transport/segment.h)
 * wake the waiters: data_bell, rung on post, and credit_bell, rung on
 * release, each only when its sleepers count says a waiter is about to
 * sleep (a waiter counts itself, then looks at the counter once more); both
 * are rung on close, unconditionally. Before it sleeps a waiter polls: for
 * spin_ns, or adaptively (mmp_ring_adaptive_spin, shm) up to a ceiling while
 * its recent waits say the peer answers within it; a ringer stamps the time
 * it found a sleeper, so a waiter learns when the peer answered, not when it
 * woke. A blocked call sleeps in slices of
 * MMP_RING_SLICE_MS and after each checks the peer's closed flag and whether
 * its process still exists, so a closed or SIGKILLed peer and the channel's
 * timeout are MMP_ERR_PEER, never a hang.
 *
 * This module owns the protocol and its checks of the peer's words (head,
 * tail, headers). The transport owns the segment (its layout, with one
 * mmp_ring_shared in it, creating and attaching through segment.h), where the
 * payloads live, and what its device must do at each step (the hooks).
 *
 * Errors read "<what> <name>: ...", `what` being the transport's name. Must
 * never: trust head, tail or a header the peer wrote without checking it, or
 * call a hook for a step that failed its checks. */
#ifndef MMP_TRANSPORT_RING_H
#define MMP_TRANSPORT_RING_H

#include <assert.h>
#include <limits.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "transport/channel.h"

#define MMP_RING_SLICE_MS 100

enum { MMP_RING_CREATOR = 0, MMP_RING_CONNECTOR = 1 };

/* The words both ends share, inside the transport's segment (the creator's
 * fresh segment reads as zeros, which is the initial state). Counters and
 * bells each on their own cache line. */
typedef struct mmp_ring_shared {
    _Atomic uint32_t unlinked;  /* 1 once one end has claimed unlinking the name */
    _Atomic int32_t pid[2];     /* [CREATOR], [CONNECTOR]; 0 until attached */
    _Atomic uint32_t closed[2]; /* [CREATOR], [CONNECTOR] */
    /* The CPU each end last ran on + 1 (0: not known yet), a hint for the
     * adaptive spin (mmp_ring_adaptive_spin); written only when it changes.
     * Nothing but that choice depends on it, so a forged value costs at most
     * some CPU time. In the line's padding: the size stays 192. */
    _Atomic int32_t cpu[2];
    /* Written by the sender. */
    alignas(64) _Atomic uint64_t head; /* messages posted */
    _Atomic uint32_t data_bell;        /* futex word: rung on post and close */
    _Atomic uint32_t data_sleepers;
    _Atomic int64_t data_rung_ns; /* CLOCK_MONOTONIC of the last post that found a sleeper */
    /* Written by the receiver. */
    alignas(64) _Atomic uint64_t tail; /* messages released */
    _Atomic uint32_t credit_bell;      /* futex word: rung on release and close */
    _Atomic uint32_t credit_sleepers;
    _Atomic int64_t credit_rung_ns; /* the same for the last release */
} mmp_ring_shared;

/* The start of every ring transport's segment: what the connector checks
 * before it trusts the rest (the transport's own fields follow). */
typedef struct mmp_ring_header {
    _Atomic uint64_t magic; /* the transport's, once the creator set up the rest (segment.h) */
    uint32_t version;
    uint32_t slots;
    uint64_t slot_bytes;
    uint64_t slot_stride;  /* from one slot's payload to the next */
    uint64_t total_bytes;  /* of the segment */
    int32_t creator_sends; /* 1: the creator is the sending end */
} mmp_ring_header;

static_assert(offsetof(mmp_ring_header, magic) == 0, "a segment's magic comes first (segment.h)");
static_assert(sizeof(mmp_ring_header) == 48, "mmp_ring_header is part of segment layouts");
static_assert(sizeof(mmp_ring_shared) == 192, "mmp_ring_shared is part of segment layouts");
static_assert(sizeof(mmp_msg_header) == 32, "mmp_msg_header is part of segment layouts");

/* What a transport's device must do at each step, for slot i (all optional;
 * NULL: nothing, as for host slots). Each runs after the step's checks passed
 * and before the step publishes anything to the peer; an error fails the
 * step, which then publishes nothing. */
typedef struct mmp_ring_hooks {
    /* Sender, acquire: reused is 1 when slot i held an earlier lap (the credit
     * says the receiver released it). */
    mmp_err (*acquire)(void *ctx, uint32_t i, int reused);
    mmp_err (*post)(void *ctx, uint32_t i);    /* sender, before head moves */
    mmp_err (*recv)(void *ctx, uint32_t i);    /* receiver, header checked */
    mmp_err (*release)(void *ctx, uint32_t i); /* receiver, before tail moves */
} mmp_ring_hooks;

/* One end of a ring. */
typedef struct mmp_ring {
    mmp_ring_shared *sh;  /* in the segment; NULL until attached */
    mmp_msg_header *msg;  /* in the segment: one per slot */
    unsigned char *slot0; /* slot 0's payload (host or device memory) */
    size_t stride;        /* from one slot's payload to the next */
    const char *what;     /* the transport's name, for messages */
    const char *name;     /* the channel's address, for messages */
    uint32_t slots;
    size_t slot_bytes;
    int send;                    /* this end sends */
    int me, peer;                /* MMP_RING_CREATOR / MMP_RING_CONNECTOR */
    int timeout_ms;              /* <= 0: blocking calls wait for ever */
    long spin_ns;                /* a waiter polls this long before sleeping (0: none) */
    long spin_max_ns;            /* adaptive spin's ceiling (0: off; mmp_ring_adaptive_spin) */
    uint32_t wait_hist;          /* the last 16 waits, newest in bit 0: 1 = within spin_max_ns */
    int32_t cpu_said;            /* the cpu[me] this end last published */
    int load_fd;                 /* /proc/loadavg, -1 until the adaptive spin reads it */
    int cpus_free;               /* its last sample: runnable tasks <= online CPUs */
    int64_t load_at;             /* when (CLOCK_MONOTONIC ns) it was taken */
    const mmp_ring_hooks *hooks; /* NULL: none */
    void *ctx;                   /* the hooks' */
    uint64_t count;              /* sender: messages posted; receiver: messages received */
    uint64_t released;           /* receiver: messages released */
    /* The peer's counter as this end last read and checked it (sender: tail,
     * receiver: head). While it already allows the next step, the step does
     * not read the shared word again: fewer cache-line transfers between the
     * cores, the counter's line stays with its writer. */
    uint64_t peer_seen;
    int acquired;   /* sender: a slot is acquired and not yet posted */
    int peer_pidfd; /* -1 until opened */
} mmp_ring;

/* The cfg checks every ring transport makes before anything else: address a
 * POSIX shm name, slots in 1..max_slots, a sane slot_bytes. MMP_ERR_INVALID
 * naming `what` (the transport) and the address. */
mmp_err mmp_ring_check_cfg(const char *what, const mmp_channel_cfg *cfg, int max_slots);

/* Creator: fills h (all but magic) from r and the transport's layout. */
void mmp_ring_header_init(mmp_ring_header *h, const mmp_ring *r, uint32_t version, size_t stride,
                          size_t total_bytes);

/* Connector: the checks of a creator's header that every ring transport
 * makes after its own magic check (an mmp_segment_check's body): version,
 * the creator's geometry against this end's cfg, the layout (stride, total
 * and the segment's actual size file_bytes, all as this end computes them),
 * and opposite directions. MMP_ERR_PROTO naming both sides' values. */
mmp_err mmp_ring_check_header(const mmp_ring *r, const mmp_ring_header *h, uint32_t version,
                              size_t stride, size_t total_bytes, size_t file_bytes);

/* This end's state, not attached yet (sh and msg NULL). what and name must
 * outlive r. */
void mmp_ring_init(mmp_ring *r, const char *what, const char *name, const mmp_channel_cfg *cfg,
                   int me, long spin_ns, const mmp_ring_hooks *hooks, void *ctx);

/* Adaptive spin (off after mmp_ring_init): before it sleeps on the bell, a
 * waiter polls for up to max_ns instead of spin_ns while at least 12 of its
 * last 16 waits ended within max_ns (the peer answers within the budget; a
 * fresh ring starts with all 16 counted as such), and not at all while the
 * peer last ran on the CPU this end runs on (polling there only delays the
 * peer), nor while the host has more runnable tasks than online CPUs
 * (/proc/loadavg, sampled at most every 10 ms: polling would take a CPU
 * another process wants, e.g. stages outnumbering cores). Waits longer than
 * max_ns (an idle pipeline, a peer that lost its
 * core) bring it back to spin_ns within 5 waits, so an idle end burns at most
 * max_ns of CPU per wait for 5 waits, then spin_ns per wait. max_ns <=
 * spin_ns: off. */
void mmp_ring_adaptive_spin(mmp_ring *r, long max_ns);

/* Points r at the shared words and per-slot headers in its segment. */
void mmp_ring_attach(mmp_ring *r, mmp_ring_shared *sh, mmp_msg_header *msg);

/* Where the payloads live: slot i's is slot0 + i * stride. */
void mmp_ring_slots(mmp_ring *r, unsigned char *slot0, size_t stride);

/* Creator, once its segment is otherwise ready (before publishing it):
 * records this process as the creator. */
void mmp_ring_take_creator(mmp_ring *r);

/* Connector, once its segment is mapped and its header checked: takes the
 * connector's place (*joined = 1) or reports that another process holds it
 * (MMP_ERR_PROTO, *joined = 0: the caller still owns its mapping), unlinks
 * the name (both ends are attached), and reports a creator that already
 * closed or died (MMP_ERR_PEER; joined, so closing r closes this end). */
mmp_err mmp_ring_join(mmp_ring *r, int *joined);

/* 1 when the peer's process is known to have exited (a zombie counts). */
int mmp_ring_peer_dead(mmp_ring *r);

/* The ring protocol (channel.h's acquire/post/recv/release, with their
 * misuse and peer checks). acquire and recv give the slot index; the
 * transport turns it into its payload pointer. */
mmp_err mmp_ring_acquire(mmp_ring *r, uint32_t *slot);
/* acquire without waiting: MMP_ERR_TIMEOUT, nothing recorded, when the slot
 * is still the receiver's. */
mmp_err mmp_ring_try_acquire(mmp_ring *r, uint32_t *slot);
mmp_err mmp_ring_post(mmp_ring *r, const mmp_msg_header *h);
mmp_err mmp_ring_recv(mmp_ring *r, mmp_msg_header *h, uint32_t *slot);
mmp_err mmp_ring_release(mmp_ring *r);

/* The table entries (channel.h) of a transport whose state begins with its
 * mmp_ring (it static_asserts offsetof(<state>, ring) == 0): the ring
 * protocol with payload pointers slot0 + i * stride. */
mmp_err mmp_ring_impl_acquire(mmp_channel_impl *c, void **payload);
mmp_err mmp_ring_impl_try_acquire(mmp_channel_impl *c, void **payload);
mmp_err mmp_ring_impl_post(mmp_channel_impl *c, const mmp_msg_header *h);
mmp_err mmp_ring_impl_recv(mmp_channel_impl *c, mmp_msg_header *h, const void **payload);
mmp_err mmp_ring_impl_release(mmp_channel_impl *c);
size_t mmp_ring_impl_slot_bytes(const mmp_channel_impl *c);
/* Those entries, for the transport's designated initializer. */
#define MMP_RING_TABLE_ENTRIES                                                                     \
    .acquire = mmp_ring_impl_acquire, .try_acquire = mmp_ring_impl_try_acquire,                    \
    .post = mmp_ring_impl_post, .recv = mmp_ring_impl_recv, .release = mmp_ring_impl_release,      \
    .slot_bytes = mmp_ring_impl_slot_bytes

/* Marks this end closed and wakes every waiter of the peer; a creator also
 * unlinks the name unless its connector already did. The segment stays
 * mapped (the transport unmaps it) and mmp_ring_peer_dead still works. No-op
 * when not attached. */
void mmp_ring_close(mmp_ring *r);

/* Closes the pidfd; r is done. Valid on any initialised ring. */
void mmp_ring_fini(mmp_ring *r);

#endif
