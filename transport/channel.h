/* Data channels: one direction of one pipeline edge (activations forward or
 * gradients backward), between exactly two processes.
 *
 * A channel is a ring of `slots` fixed-size slots with credit flow control:
 * the sender fills a free slot and posts it; the receiver gets posted slots in
 * order, reads the payload in place (zero-copy) and releases the slot, which
 * returns the credit. A slot is never reused before its release. Every posted
 * slot carries a header (step, mb, sample-id digest, payload bytes, flags) so
 * the receiver can check what it pairs.
 *
 * Implementations are tables of function pointers (one exported symbol per
 * implementation file); mmp_channel_open() walks the priority list, asking each
 * can_connect() and logging why one is passed over. Every implementation runs
 * the one conformance suite in tests/test_transport.c.
 *
 * Callers hold an mmp_channel handle, which carries its transport's table
 * (as nng's pipe carries its p_tran_ops): every call is mmp_channel_<verb>(ch,
 * ...), never a (transport, channel) pair, and every payload byte goes
 * through the transport (fill/read), so device-memory slots need nothing of
 * the caller; only a producer on host slots (no MMP_TRANSPORT_DEVICE_SLOTS,
 * mmp_channel_host_slots) may write its output into the slot in place
 * (zero-copy posting: mmp_channel_try_acquire, then post).
 *
 * Lifecycle: the creator end calls setup (allocates the shared resource under
 * `address`); the other end calls connect (attaches; may wait for the creator
 * up to timeout_ms). Once both are attached the name is unlinked, so a crash
 * of either process leaves nothing in /dev/shm. close is NULL-safe and
 * idempotent; a closed peer is reported as MMP_ERR_PEER by blocking calls.
 * Network transports (caps MMP_TRANSPORT_NETWORK: tcp) name no shared
 * resource: the creator listens on "host:port" (port 0: one it picks, then
 * mmp_channel_address() says which, and the caller hands that to the
 * connector), the connector retries a refused port until timeout_ms. */
#ifndef MMP_TRANSPORT_CHANNEL_H
#define MMP_TRANSPORT_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct mmp_msg_header {
    int32_t step;
    int32_t mb;
    uint64_t digest; /* hash of the micro-batch's sample ids, in order */
    uint64_t bytes;  /* payload bytes used (<= slot_bytes) */
    int32_t n;       /* samples in the micro-batch */
    int32_t flags;   /* MMP_MSG_* */
} mmp_msg_header;

enum {
    MMP_MSG_EVAL = 1, /* an evaluation chunk, not a training micro-batch */
    MMP_MSG_STOP = 2, /* the sender is done (no payload) */
    /* Activations whose n valid flags (the payload's last n floats) are all
     * 1: a receiver may take them as such without reading them (a GPU stage
     * then copies nothing to its host). Set by stages/worker_exec.c. */
    MMP_MSG_ALL_VALID = 4,
};

typedef struct mmp_channel_cfg {
    const char *address; /* transport-specific name, e.g. "/mmpipe-<token>-e3" */
    size_t slot_bytes;   /* payload capacity of a slot */
    int slots;           /* ring depth, >= 1 */
    int send;            /* this end sends */
    int timeout_ms; /* how long connect and blocking calls wait before MMP_ERR_PEER (<=0: forever)
                     */
    /* Where the payloads live. All zero (the default of every existing cfg)
     * means host memory. on_gpu describes the edge, not one end: both ends
     * must set the same value, or they would pick different transports. */
    int on_gpu;        /* 1: both ends are GPU processes on one host and the slots
                        * are device memory (cuda_ipc); 0: host memory */
    int device;        /* on_gpu: this end's CUDA device ordinal (setup/connect
                        * make it the calling thread's current device) */
    void *cuda_stream; /* on_gpu: this end's cudaStream_t (void *, so this header
                        * needs no CUDA); NULL: the legacy default stream */
    /* Network transports (tcp, and nccl's tcp side channel): the job's
     * secret both ends prove they hold before anything else crosses the
     * connection (transport/auth.h); required there (NULL or "": refused
     * with MMP_ERR_INVALID), ignored by the others. */
    const char *secret;
} mmp_channel_cfg;

/* A transport's own state for one end of one channel. Only its transport
 * touches it: everyone else holds the mmp_channel handle below. */
typedef struct mmp_channel_impl mmp_channel_impl;

enum {
    /* The slots are device memory: the host must not dereference a slot
     * pointer; payload bytes go through fill/read (mmp_channel_fill/read). */
    MMP_TRANSPORT_DEVICE_SLOTS = 1,
    /* The address is "host:port" and the ends may be on different hosts. A
     * creator given port 0 listens on a free port: mmp_channel_address()
     * after the open says which, and whoever placed the two ends must hand
     * that address to the connector (the coordinator forwards it). */
    MMP_TRANSPORT_NETWORK = 2,
};

/* What a transport implements. Callers never call these directly: they go
 * through the handle (mmp_channel_*), which checks the direction and the
 * slot bounds before a call reaches the table. */
typedef struct mmp_transport {
    const char *name;
    unsigned caps; /* MMP_TRANSPORT_* */
    /* 1 when this transport can join the two ends described (same host, CPU...). */
    int (*can_connect)(const mmp_channel_cfg *cfg, const char **why_not);
    mmp_err (*setup)(mmp_channel_impl **out, const mmp_channel_cfg *cfg);   /* creator end */
    mmp_err (*connect)(mmp_channel_impl **out, const mmp_channel_cfg *cfg); /* other end */
    /* Sender: a free slot to fill (blocks for a credit). */
    mmp_err (*acquire)(mmp_channel_impl *ch, void **payload);
    /* Optional: acquire without waiting: as acquire when a credit is there
     * now, else MMP_ERR_TIMEOUT with nothing acquired and no message recorded
     * (a closed peer, a forged credit: errors as acquire's). NULL: the
     * transport cannot tell, and mmp_channel_try_acquire says MMP_ERR_TIMEOUT. */
    mmp_err (*try_acquire)(mmp_channel_impl *ch, void **payload);
    /* Sender: publishes the acquired slot with header h and wakes the receiver. */
    mmp_err (*post)(mmp_channel_impl *ch, const mmp_msg_header *h);
    /* Receiver: the next posted slot (blocks); payload stays valid until release.
     * Slots posted before the sender closed or died are still delivered;
     * MMP_ERR_PEER comes once they are drained. */
    mmp_err (*recv)(mmp_channel_impl *ch, mmp_msg_header *h, const void **payload);
    /* Receiver: returns the oldest held slot's credit to the sender. */
    mmp_err (*release)(mmp_channel_impl *ch);
    /* Frees ch (NULL: a no-op). A creator closing before its peer connected
     * removes the name. */
    void (*close)(mmp_channel_impl *ch);
    /* Payload capacity of each slot (the cfg's slot_bytes). */
    size_t (*slot_bytes)(const mmp_channel_impl *ch);
    /* Optional: copies bytes from src (host or, for device transports, device
     * memory) into an acquired slot at dst (NULL: memcpy, host slots). */
    mmp_err (*fill)(mmp_channel_impl *ch, void *dst, const void *src, size_t bytes);
    /* Optional: copies bytes of a received slot at src out to dst (NULL:
     * memcpy, host slots). */
    mmp_err (*read)(mmp_channel_impl *ch, void *dst, const void *src, size_t bytes);
    /* Optional: the address this end is reachable at when it differs from
     * cfg's (tcp: the creator's real port). NULL: cfg's address. */
    const char *(*address)(const mmp_channel_impl *ch);
} mmp_transport;

extern const mmp_transport mmp_transport_shm;
/* Host memory between two processes on any two hosts: one TCP connection
 * ("host:port"; transport/tcp.c states the rendezvous and the wire). */
extern const mmp_transport mmp_transport_tcp;
/* In the CUDA module only (common/cuda_module.h; code outside it gets them
 * with mmp_transport_gpu, mmp_channel_open walks them for on_gpu cfgs):
 * Device-memory slots between two GPU processes of one host (cfg.on_gpu);
 * transport/cuda/cuda_ipc.c states the stream-ordering contract of its calls. */
extern const mmp_transport mmp_transport_cuda_ipc;
/* Device-memory slots between two GPU processes on different hosts (cfg.on_gpu,
 * a "host:port" address): ncclSend/ncclRecv, headers and credits over tcp;
 * transport/cuda/nccl.c states the rendezvous and its ordering. */
extern const mmp_transport mmp_transport_nccl;
/* *out: the CUDA module's transport table of that symbol name
 * ("mmp_transport_cuda_ipc", "mmp_transport_nccl"), loading the module
 * (transport/cuda_entry.c); its load error otherwise (MMP_ERR_UNSUPPORTED
 * in a build without CUDA). */
mmp_err mmp_transport_gpu(const char *symbol, const mmp_transport **out);
/* Splits a nccl creator's address "host:port#nccl:<hex id>" (untrusted: it
 * crossed the control plane) into host_port (cap bytes) and the
 * NCCL_UNIQUE_ID_BYTES (MMP_NCCL_ID_BYTES) of its ncclUniqueId; MMP_ERR_PROTO
 * naming the fault. Text only (transport/sock.c): built with or without CUDA. */
mmp_err mmp_nccl_parse_address(const char *address, char *host_port, size_t cap, void *id_out);
/* Checks an address a creator reported (an Endpoints entry the coordinator
 * forwards to the connecting end): "host:port" with a port 1..65535, or a
 * nccl creator's "host:port#nccl:<id hex>" of that form. MMP_ERR_PROTO
 * naming the fault otherwise, so that a stage never takes a shm name, port 0
 * or other text from another process for the network end it connects. */
mmp_err mmp_channel_check_endpoint(const char *address);
/* Room for an endpoint address and its NUL: a tcp creator's "host:port"
 * (MMP_SOCK_ADDR_MAX) or a nccl creator's "host:port#nccl:" and 256 hex
 * digits. The control plane's decoder (transport/control.c), the stages'
 * buffers (stages/worker_build.c) and the nccl transport all hold to it. */
#define MMP_ENDPOINT_MAX 600

/* ---- the channel handle ----------------------------------------------------
 * One end of one channel: its transport's ops, the transport's state and the
 * direction, so every call is `mmp_channel_<verb>(ch, ...)`. A call that
 * belongs to the other direction (acquire/fill/post/send on a receiving end,
 * recv/read/release on a sending end) returns MMP_ERR_INVALID naming the
 * channel and does not reach the transport. Not thread-safe: one thread uses
 * one end at a time. */
typedef struct mmp_channel mmp_channel;

/* Opens this end (creator: setup, else connect) with the transport called
 * `name` (the coordinator's pick, e.g. "shm"), or with the first transport of
 * the priority list whose can_connect() accepts cfg when name is NULL or "".
 * Logs why each transport is passed over; MMP_ERR_UNSUPPORTED when none fits.
 * MMP_OK: *out is the caller's to mmp_channel_close. Otherwise *out is NULL. */
mmp_err mmp_channel_open(mmp_channel **out, const char *name, const mmp_channel_cfg *cfg,
                         int creator);
/* The same with transport t, without asking its can_connect (the conformance
 * suite and the benches, which test one transport on purpose). */
mmp_err mmp_channel_open_with(mmp_channel **out, const mmp_transport *t, const mmp_channel_cfg *cfg,
                              int creator);
/* Closes this end and frees the handle (the transport's close, see above).
 * NULL is a no-op, so the caller drops its pointer after the call. */
void mmp_channel_close(mmp_channel *ch);

/* The transport this end uses (its table: name, caps). */
const mmp_transport *mmp_channel_transport(const mmp_channel *ch);
/* Payload capacity of each slot. */
size_t mmp_channel_slot_bytes(const mmp_channel *ch);
/* The address the connector must be given: cfg's address, except for a
 * transport with MMP_TRANSPORT_NETWORK whose creator was opened on port 0:
 * "host:<the port it listens on>". Valid until the close. */
const char *mmp_channel_address(const mmp_channel *ch);
/* 1 when this end sends. */
int mmp_channel_sends(const mmp_channel *ch);

/* ---- the sending half ---- */
/* A free slot (blocks for a credit): *slot is where its payload lies, host or
 * device memory as the transport's caps say. Write it only through
 * mmp_channel_fill, unless the transport has host slots and the caller
 * produces its bytes in place (zero-copy). */
mmp_err mmp_channel_acquire(mmp_channel *ch, void **slot);
/* The same without waiting for a credit: MMP_ERR_TIMEOUT (no message
 * recorded, nothing acquired, *slot NULL) when none is free now. A producer
 * that would write its output straight into the slot asks this before it
 * computes, so that a full ring never holds up the computation; it computes
 * into its own buffer and sends a copy when the answer is no. */
mmp_err mmp_channel_try_acquire(mmp_channel *ch, void **slot);
/* 1 when the slots are host memory the caller may write in place (the
 * transport has no MMP_TRANSPORT_DEVICE_SLOTS). */
int mmp_channel_host_slots(const mmp_channel *ch);
/* Copies bytes from src into the acquired slot at dst (inside it: dst to
 * dst + bytes within the slot, else MMP_ERR_INVALID) through the transport.
 * Device transports order the copy on their stream (see cuda_ipc.c). */
mmp_err mmp_channel_fill(mmp_channel *ch, void *dst, const void *src, size_t bytes);
/* Publishes the acquired slot with header h and wakes the receiver. */
mmp_err mmp_channel_post(mmp_channel *ch, const mmp_msg_header *h);
/* Copying send: acquire + fill + post. h->bytes is checked against the slot
 * before anything is acquired. */
mmp_err mmp_channel_send(mmp_channel *ch, const mmp_msg_header *h, const void *payload);

/* One piece of a gathered payload. */
typedef struct mmp_channel_seg {
    const void *p;
    size_t bytes;
} mmp_channel_seg;
/* Gathering send: the segments, back to back, as one message whose header is
 * h with h->bytes set to their sum. The size is checked against the slot
 * before anything is acquired or copied (MMP_ERR_INVALID naming the channel
 * `what`); bytes go into the slot through the transport's fill. */
mmp_err mmp_channel_sendv(mmp_channel *ch, const char *what, mmp_msg_header h,
                          const mmp_channel_seg *segs, int n_segs);

/* ---- the receiving half ---- */
/* The next posted message (blocks): its header (checked with mmp_msg_check)
 * and where its payload lies (host or device memory as the caps say; valid
 * until its release). Messages are released in the order received. */
mmp_err mmp_channel_recv(mmp_channel *ch, mmp_msg_header *h, const void **payload);
/* Copies bytes of a held received payload, starting at src, out to dst
 * through the transport (host slots: memcpy; device slots: see the
 * transport). */
mmp_err mmp_channel_read(mmp_channel *ch, void *dst, const void *src, size_t bytes);
/* Returns the oldest held message's slot to the sender. */
mmp_err mmp_channel_release(mmp_channel *ch);

/* The checks every transport applies to a header read from its peer's side
 * of a shared segment before anyone uses it: payload bytes within the slot
 * (slot_bytes), no unknown flag, no payload on a STOP, and step, mb and n
 * not negative. What the fields must be beyond that (rows against the
 * receiver's buffers, the expected step) is the receiver's to check.
 * MMP_ERR_PROTO with a message naming `what` (the channel), the field, its
 * value and the limit. Pure: safe on any bytes (the fuzz harness feeds it). */
mmp_err mmp_msg_check(const char *what, const mmp_msg_header *h, size_t slot_bytes);

/* Removes every shm segment whose name starts with prefix (crash clean-up by
 * the coordinator). Returns how many were removed. */
int mmp_shm_unlink_prefix(const char *prefix);
/* The same with system calls only (open, getdents64, unlinkat, close) and
 * no logging: safe in a signal handler, which may have interrupted malloc
 * (a stage's death signal when its coordinator dies). prefix as above. */
void mmp_shm_unlink_prefix_signal_safe(const char *prefix);

#endif
