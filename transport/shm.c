/* The `shm` data channel: a POSIX shared-memory ring between two processes
 * on one host, with credit flow control and a futex doorbell.
 *
 * One segment per channel, named cfg->address, mapped once by each end:
 *
 *   page 0..   shm_header: magic (stored last by the creator), version,
 *              geometry, the ring's shared words (mmp_ring_shared: both ends'
 *              pids and closed flags, the head and tail counters and the two
 *              doorbells), then one mmp_msg_header per slot.
 *   then       `slots` payload areas of slot_stride bytes (slot_bytes rounded
 *              up to 64), starting on a page boundary, so every payload
 *              pointer is 64-byte aligned.
 *
 * The ring protocol (slots in ring order, credits, the two doorbells, peer
 * death and timeouts as MMP_ERR_PEER) is transport/ring.h's, shared with
 * cuda_ipc; this file gives it host slots and no hooks, and turns on the
 * ring's adaptive spin: a waiter polls for up to MMP_SHM_SPIN_MAX_NS (50 µs)
 * while its recent waits say the peer answers within that, else for
 * MMP_SHM_SPIN_NS (2 µs; also while the host has more runnable tasks than
 * CPUs), and not at all while the peer runs on its CPU, before it sleeps on
 * the futex doorbell (measurements beside the values).
 * A stream between two cores (the peer busy, the ring neither full nor empty
 * for long) then makes no system call at all.
 *
 * Naming: the creator creates the name with O_CREAT|O_EXCL; the connector
 * unlinks it as soon as it has mapped the segment, so once both ends are
 * attached nothing is left in /dev/shm whatever happens to either process. A
 * creator closing before anyone connected unlinks it itself. Exactly one of
 * them unlinks: the one that wins the `unlinked` flag in the header.
 *
 * Creating, attaching, the futex calls, the pidfd and the unlink flag are
 * transport/segment.h's, shared with the replica reduce and cuda_ipc; this
 * file owns the layout and where the payloads live.
 *
 * Must never: allocate or map per message, leave a name behind on an error
 * path, or trust the peer's header fields without checking them. */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "transport/channel.h"
#include "transport/ring.h"
#include "transport/segment.h"

#define SHM_MAGIC 0x31304d4853504d4dull /* "MMPSHM01" */
#define SHM_VERSION 2u                  /* 2: the ring words are one mmp_ring_shared */
#define SHM_ALIGN 64
#define SHM_PAGE 4096
#define SHM_MAX_SLOTS 4096
/* Before sleeping, a waiter polls its condition for this long (ns). Measured
 * on the 2-core development VM (bench_transport and a 64-byte stream):
 * - a futex sleep/wake costs ~3-8 µs one way (a halted vCPU must be woken);
 *   a 2 µs spin does not hide that in a ping-pong, 10 µs does (0.1 µs);
 * - streaming 64-byte messages: no spin 0.5-9 M msg/s (both ends fall into
 *   sleep/wake lock-step), 2 µs spin 11-12 M msg/s with no system calls;
 * - a stage's real wait (a micro-batch being computed upstream) lasts ms, so
 *   the spin rarely wins there and costs at most 2 µs of CPU per wait, which
 *   matters when stages outnumber cores. Hence short, not none.
 * Build with -DMMP_SHM_SPIN_NS=... to change the default; the environment
 * variable MMP_SHM_SPIN_NS (0 to 10^9) overrides it per process, for
 * measuring other values (bench_transport prints it). */
#ifndef MMP_SHM_SPIN_NS
#define MMP_SHM_SPIN_NS 2000
#endif

/* The adaptive spin's ceiling (transport/ring.h, mmp_ring_adaptive_spin).
 * Measured with bench_transport --spin-ab (2-core VM, other jobs running):
 * zero-copy 64 KB-1 MB streams 1.1-2.4x the 2 µs poll (the ends stop falling
 * into futex lock-step), 4-64 MB unchanged; a pipeline's waits (a
 * micro-batch being computed, ms) stay above it, so the demo's stages never
 * poll longer than 2 µs (counted: 0 long polls in 30 steps). An idle end
 * polls 50 µs per wait for at most 5 waits. MMP_SHM_SPIN_MAX_NS in the
 * environment (0 to 10^9; <= MMP_SHM_SPIN_NS: off, the old wait) overrides
 * it per process, for measuring. */
#ifndef MMP_SHM_SPIN_MAX_NS
#define MMP_SHM_SPIN_MAX_NS 50000
#endif

/* The environment variable `var` (0 to 10^9 ns) into *out, else dflt. */
static mmp_err env_ns(const char *var, long dflt, long *out)
{
    const char *e = getenv(var);
    *out = dflt;
    if (!e) {
        return MMP_OK;
    }
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (end == e || *end || errno || v < 0 || v > 1000000000L) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "shm: environment variable %s='%s' is not a number of "
                          "nanoseconds from 0 to 1000000000",
                          var, e);
    }
    *out = v;
    return MMP_OK;
}

typedef struct shm_header {
    mmp_ring_header g;                       /* magic (SHM_MAGIC), version, geometry, directions */
    uint64_t payload_offset;                 /* from the segment's start; a multiple of SHM_PAGE */
    alignas(SHM_ALIGN) mmp_ring_shared ring; /* pids, closed flags, counters, doorbells */
    alignas(SHM_ALIGN) mmp_msg_header msg[]; /* one per slot */
} shm_header;

static_assert(offsetof(shm_header, g) == 0, "a segment's magic comes first (segment.h)");
static_assert(sizeof(shm_header) == 256, "shm_header is part of the segment layout");

typedef struct shm_channel {
    mmp_ring ring; /* first: the table's ring entries take the channel as their ring */
    shm_header *hdr;
    size_t map_bytes;       /* the segment's size, as this end computes it */
    size_t payload_offset;  /* from hdr to slot 0's payload */
    unsigned char *payload; /* slot 0 */
    size_t slot_bytes, stride;
    uint32_t slots;
    int send; /* this end sends */
    char name[NAME_MAX + 1];
} shm_channel;

static_assert(offsetof(shm_channel, ring) == 0, "mmp_ring_impl_* take the channel as its ring");

static shm_channel *shm_of(mmp_channel_impl *c)
{
    return (shm_channel *)(void *)c;
}

/* ---- geometry ----------------------------------------------------------- */

typedef struct shm_geometry {
    size_t stride, payload_offset, total;
} shm_geometry;

static mmp_err check_cfg(const mmp_channel_cfg *cfg, shm_geometry *g)
{
    MMP_TRY(mmp_ring_check_cfg("shm", cfg, SHM_MAX_SLOTS));
    g->stride = (cfg->slot_bytes + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
    size_t head = sizeof(shm_header) + (size_t)cfg->slots * sizeof(mmp_msg_header);
    g->payload_offset = (head + SHM_PAGE - 1) / SHM_PAGE * SHM_PAGE;
    g->total = g->payload_offset + (size_t)cfg->slots * g->stride;
    return MMP_OK;
}

/* This end of the channel cfg describes (checked), not attached yet. */
static mmp_err new_channel(shm_channel **out, const mmp_channel_cfg *cfg, int me)
{
    shm_geometry g = {0};
    long spin = 0, spin_max = 0;
    MMP_TRY(check_cfg(cfg, &g));
    MMP_TRY(env_ns("MMP_SHM_SPIN_NS", MMP_SHM_SPIN_NS, &spin));
    MMP_TRY(env_ns("MMP_SHM_SPIN_MAX_NS", MMP_SHM_SPIN_MAX_NS, &spin_max));
    shm_channel *ch = calloc(1, sizeof *ch);
    if (!ch) {
        return mmp_errorf(MMP_ERR_NOMEM, "shm %s: channel", cfg->address);
    }
    snprintf(ch->name, sizeof ch->name, "%s", cfg->address);
    ch->slot_bytes = cfg->slot_bytes;
    ch->stride = g.stride;
    ch->slots = (uint32_t)cfg->slots;
    ch->send = cfg->send != 0;
    ch->map_bytes = g.total;
    ch->payload_offset = g.payload_offset;
    mmp_ring_init(&ch->ring, "shm", ch->name, cfg, me, spin, NULL, NULL);
    mmp_ring_adaptive_spin(&ch->ring, spin_max);
    *out = ch;
    return MMP_OK;
}

/* Points ch at its mapped segment. */
static void attach(shm_channel *ch, void *base)
{
    ch->hdr = base;
    ch->payload = (unsigned char *)base + ch->payload_offset;
    mmp_ring_attach(&ch->ring, &ch->hdr->ring, ch->hdr->msg);
    mmp_ring_slots(&ch->ring, ch->payload, ch->stride);
}

/* ---- the transport ------------------------------------------------------ */

static int shm_can_connect(const mmp_channel_cfg *cfg, const char **why_not)
{
    /* Same host is assumed for now: the coordinator only asks for shm between
     * processes it placed on one machine. */
    if (!cfg || !cfg->address || cfg->address[0] != '/') {
        if (why_not) {
            *why_not = "address is not a POSIX shm name (must start with '/')";
        }
        return 0;
    }
    return 1;
}

static mmp_err shm_setup(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    shm_channel *ch = NULL;
    void *base = NULL;
    *out = NULL;
    MMP_TRY(new_channel(&ch, cfg, MMP_RING_CREATOR));
    mmp_err ret = mmp_segment_create(&base, "shm", ch->name, ch->map_bytes);
    if (ret != MMP_OK) {
        free(ch);
        return ret;
    }
    attach(ch, base);
    shm_header *h = ch->hdr; /* a fresh segment reads as zeros */
    mmp_ring_header_init(&h->g, &ch->ring, SHM_VERSION, ch->stride, ch->map_bytes);
    h->payload_offset = ch->payload_offset;
    mmp_ring_take_creator(&ch->ring);
    mmp_segment_publish(base, SHM_MAGIC);
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

/* The creator's header against the connecting end ch (an mmp_segment_check):
 * magic, version, geometry and layout as ch computes them, and opposite
 * directions. */
static mmp_err check_header(void *ctx, const void *header, uint64_t magic, size_t file_bytes)
{
    const shm_channel *ch = ctx;
    const shm_header *h = header;
    if (magic != SHM_MAGIC) {
        return mmp_errorf(MMP_ERR_PROTO, "shm %s: not an mmpipe channel (magic %#llx, want %#llx)",
                          ch->name, (unsigned long long)magic, (unsigned long long)SHM_MAGIC);
    }
    MMP_TRY(mmp_ring_check_header(&ch->ring, &h->g, SHM_VERSION, ch->stride, ch->map_bytes,
                                  file_bytes));
    if (h->payload_offset != ch->payload_offset) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "shm %s: layout mismatch: segment payload offset %llu, this end "
                          "computes %zu",
                          ch->name, (unsigned long long)h->payload_offset, ch->payload_offset);
    }
    return MMP_OK;
}

/* Takes the connector's place in the segment mapped at base (map_bytes,
 * header checked). Once the place is taken ch owns the mapping, whatever this
 * returns: closing ch then closes this end like any other close, so the
 * creator sees it. When another connector holds the place, unmaps base. */
static mmp_err join(shm_channel *ch, void *base)
{
    int joined = 0;
    attach(ch, base);
    mmp_err e = mmp_ring_join(&ch->ring, &joined);
    if (!joined) {
        ch->hdr = NULL;
        mmp_ring_attach(&ch->ring, NULL, NULL);
        mmp_segment_unmap(base, ch->map_bytes);
    }
    return e;
}

static void shm_close(mmp_channel_impl *c);

static mmp_err shm_connect(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    shm_channel *ch = NULL;
    void *base = NULL;
    *out = NULL;
    MMP_TRY(new_channel(&ch, cfg, MMP_RING_CONNECTOR));
    mmp_err ret = mmp_segment_attach(&base, "shm", ch->name, sizeof(shm_header), ch->map_bytes,
                                     ch->ring.timeout_ms, check_header, ch);
    if (ret == MMP_ERR_TIMEOUT) {
        ret = mmp_errorf(MMP_ERR_PEER, "shm %s: no ready creator after %d ms", ch->name,
                         ch->ring.timeout_ms);
    }
    if (ret == MMP_OK) {
        ret = join(ch, base);
    }
    if (ret != MMP_OK) {
        /* unmaps if joined; never unlinks a creator's name */
        shm_close((mmp_channel_impl *)(void *)ch);
        return ret;
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

/* Marks this end closed, wakes the peer (its blocked call returns
 * MMP_ERR_PEER once it has drained what was posted), unmaps and frees ch. A
 * creator no one connected to unlinks the name. NULL is a no-op; ch is freed,
 * so the caller drops its pointer (closing twice is closing NULL). */
static void shm_close(mmp_channel_impl *c)
{
    shm_channel *ch = shm_of(c);
    if (!ch) {
        return;
    }
    mmp_ring_close(&ch->ring);
    if (ch->hdr) {
        mmp_segment_unmap(ch->hdr, ch->map_bytes);
    }
    mmp_ring_fini(&ch->ring);
    free(ch);
}

const mmp_transport mmp_transport_shm = {
    .name = "shm",
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .connect = shm_connect,
    .close = shm_close,
    MMP_RING_TABLE_ENTRIES, /* acquire, post, recv, release, slot_bytes */
};
