/* The control plane: ZeroMQ sockets carrying protobuf-c Envelopes.
 *
 * The coordinator binds a ROUTER; each stage connects a DEALER whose routing
 * id is its process name ("image.0/0"). Every message is one frame holding a
 * packed Envelope (after the ROUTER's identity frame). Receiving checks, in
 * order: framing (exactly one payload frame), size (<= MMP_CTL_MAX_BYTES),
 * decoding, version, job token, and that a known body is set; a message
 * failing any check is logged with its sender and reason, counted, and
 * dropped: it never reaches the caller, and the run goes on. ZeroMQ itself
 * disconnects a peer that sends a frame a few KiB over the limit (such a
 * message is never seen here, so not counted); it reconnects on its own,
 * and a reconnecting routing id takes over from the old connection
 * (ROUTER_HANDOVER). Messages in flight when a connection drops are lost.
 * An ipc ROUTER admits connections of its own user only (ZeroMQ's
 * IPC_FILTER_UID): another user's process could otherwise take a stage's
 * routing id over before its token is ever checked.
 *
 * Each mmp_ctl owns its own ZeroMQ context (one I/O thread), so closing one
 * tears down only its own threads. Sockets are not thread-safe: one thread
 * per mmp_ctl. LINGER is 0 so closing never hangs on a dead peer, and over
 * tcp ZMTP heartbeats (every 1 s, 5 s timeout) drop dead connections (not
 * over ipc: one host, where the kernel tells a closed end at once and a
 * heartbeat would only drop a coordinator paused by Ctrl-Z or a debugger).
 *
 * Over tcp (several hosts) the channel is authenticated and encrypted with
 * ZeroMQ CURVE (mmp_ctl_opts.curve): the coordinator is the CURVE server
 * with the job's server key pair and a ZAP handler that admits only the
 * job's client public key; a stage holds the server's public key and the
 * job's client key pair. A peer without CURVE, with another server key or
 * another client key is refused during the handshake, logged with its
 * address and counted (stats.refused); it never reaches mmp_ctl_recv. A
 * helper thread per CURVE mmp_ctl serves ZAP and watches the socket's
 * events; on a stage it also calls opts.lost once when the coordinator is
 * gone: its connection dropped after the handshake (ZMTP heartbeat: no
 * answer for HEARTBEAT_TIMEOUT after at most HEARTBEAT_IVL, so within
 * MMP_CTL_LOST_S seconds of a host or link vanishing) or opts.watch_fd read
 * end of file (the launcher's pipe: ssh or the coordinator died). */
#ifndef MMP_TRANSPORT_CONTROL_H
#define MMP_TRANSPORT_CONTROL_H

#include <stddef.h>

#include "common/err.h"
#include "proto/mmpipe.pb-c.h"

#define MMP_CTL_VERSION 2 /* 2: Assignment.kind is a StageKind, not a string */
#define MMP_CTL_MAX_BYTES (4u << 20)
#define MMP_CTL_ID_MAX 64

typedef struct mmp_ctl mmp_ctl;

/* Seconds within which a stage notices a vanished coordinator: the ZMTP
 * heartbeat interval (1 s) + timeout (5 s), and 1 s for the helper thread
 * to be scheduled on a loaded machine (measured: 5.0 to 6.0 s). */
#define MMP_CTL_LOST_S 7
/* The ZMTP heartbeat: a ping every second; a connection that answers
 * nothing for this long is dropped (on both ends). */
#define MMP_CTL_HEARTBEAT_TIMEOUT_S 5

/* CURVE keys as Z85 text (40 characters and a NUL), made per job by
 * mmp_ctl_new_keys. The coordinator needs server_secret and client_public;
 * a stage server_public, client_public and client_secret. */
#define MMP_CTL_KEY_CHARS 41
typedef struct mmp_ctl_keys {
    char server_public[MMP_CTL_KEY_CHARS], server_secret[MMP_CTL_KEY_CHARS];
    char client_public[MMP_CTL_KEY_CHARS], client_secret[MMP_CTL_KEY_CHARS];
} mmp_ctl_keys;

typedef struct mmp_ctl_opts {
    const mmp_ctl_keys *curve; /* NULL: no CURVE (ipc endpoints, tests) */
    /* stage only: a descriptor whose end of file means the coordinator is
     * gone (-1: none; 0 is stdin, a valid choice), and what to call then,
     * from the helper thread, once (it may _exit) */
    int watch_fd;
    void (*lost)(const char *why, void *arg);
    void *lost_arg;
} mmp_ctl_opts;

/* Fresh server and client key pairs (zmq_curve_keypair). MMP_ERR_UNSUPPORTED
 * when this libzmq has no CURVE (zmq_has("curve")). */
mmp_err mmp_ctl_new_keys(mmp_ctl_keys *k);

typedef struct mmp_ctl_stats {
    long received, rejected; /* rejected: dropped for one of the reasons above */
    long too_big, undecodable, bad_version, bad_token, no_body;
    long bad_frames; /* not exactly one payload frame */
    long bad_body;   /* a body field outside what any sender may write (mmp_ctl_decode) */
    long refused;    /* CURVE: connections refused in the handshake (not in rejected) */
} mmp_ctl_stats;

/* Why mmp_ctl_decode refused a payload (MMP_CTL_OK: it did not). */
typedef enum mmp_ctl_verdict {
    MMP_CTL_OK = 0,
    MMP_CTL_TOO_BIG,
    MMP_CTL_UNDECODABLE,
    MMP_CTL_BAD_VERSION,
    MMP_CTL_BAD_TOKEN,
    MMP_CTL_NO_BODY,
    MMP_CTL_BAD_BODY,
} mmp_ctl_verdict;

/* The receive checks on one payload frame's bytes, in the contract's order:
 * size, decoding, version, job token (compared in constant time), a known
 * body, and then the body's own fields where no sender may write them
 * whatever the geometry (negative step or micro-batch numbers, counts past
 * the limits, timings that are not finite, a missing sub-message). What a
 * field must be against a receiver's state (micro-batch < microbatches, the
 * channel it names) is the receiver's check (stages/peer.h, the
 * coordinator). On MMP_CTL_OK *out is the envelope (free with
 * mmp_ctl_free); otherwise *out is NULL and why holds the reason. Pure: no
 * socket, safe on any bytes (tests/fuzz/fuzz_control.c feeds it). */
mmp_ctl_verdict mmp_ctl_decode(const void *data, size_t size, const char *job_token,
                               Mmpipe__Envelope **out, char *why, size_t why_n);

/* Coordinator: binds endpoint ("ipc://@mmpipe-<token>" or "tcp://0.0.0.0:port").
 * The token (1..128 characters) is copied. MMP_ERR_IO when the endpoint is
 * malformed or in use; *out is NULL on failure. */
mmp_err mmp_ctl_bind(mmp_ctl **out, const char *endpoint, const char *job_token);
/* The same with options (NULL: none). With opts->curve the endpoint should
 * be tcp; a port of "*" binds a free one (see mmp_ctl_last_endpoint). */
mmp_err mmp_ctl_bind_opts(mmp_ctl **out, const char *endpoint, const char *job_token,
                          const mmp_ctl_opts *opts);
/* The endpoint actually bound ("tcp://0.0.0.0:41234"), into buf. */
mmp_err mmp_ctl_last_endpoint(mmp_ctl *c, char *buf, size_t n);
/* Stage: connects with routing id `identity` (1..MMP_CTL_ID_MAX-1 printable
 * ASCII characters). Does not wait for the peer: ZeroMQ connects (and
 * reconnects) in the background and queues sends meanwhile. */
mmp_err mmp_ctl_connect(mmp_ctl **out, const char *endpoint, const char *identity,
                        const char *job_token);
mmp_err mmp_ctl_connect_opts(mmp_ctl **out, const char *endpoint, const char *identity,
                             const char *job_token, const mmp_ctl_opts *opts);
/* Drops unsent messages and frees everything at once. NULL-safe. */
void mmp_ctl_close(mmp_ctl *c);

/* Sends env, after setting its version and job token. `to` is the peer's
 * routing id on a ROUTER, NULL on a DEALER. A ROUTER send to an unknown peer
 * fails with MMP_ERR_PEER (ROUTER_MANDATORY), never silently. env->version
 * is left set; env->job_token is pointed at this ctl's token only while
 * packing and restored on return, so a received envelope can be re-sent and
 * then freed. The caller keeps env. MMP_ERR_INVALID for an env without a body
 * or one that packs to more than MMP_CTL_MAX_BYTES (the peer would reject
 * it). Blocks only while the peer's queue is full (1000 unread messages), at
 * most 5 s, then MMP_ERR_PEER. */
mmp_err mmp_ctl_send(mmp_ctl *c, const char *to, Mmpipe__Envelope *env);

/* Waits up to timeout_ms (-1: forever, 0: poll) for one valid message;
 * rejected messages do not restart the wait. MMP_OK: *env is set (free with
 * mmp_ctl_free) and `from` holds the sender's routing id (ROUTER; "" on a
 * DEALER; from_n >= MMP_CTL_ID_MAX holds any id mmp_ctl_connect accepts; a
 * binary id from a foreign peer is written as "0x" + hex). MMP_ERR_TIMEOUT
 * when none came, and also when a signal interrupted the wait, so the
 * caller's loop can look at its signal flags. */
mmp_err mmp_ctl_recv(mmp_ctl *c, int timeout_ms, Mmpipe__Envelope **env, char *from, size_t from_n);
/* Frees an envelope from mmp_ctl_recv. NULL-safe. */
void mmp_ctl_free(Mmpipe__Envelope *env);

/* The underlying socket, for zmq_poll alongside other descriptors (only
 * poll it: reading it directly would bypass the checks). */
void *mmp_ctl_socket(mmp_ctl *c);
mmp_ctl_stats mmp_ctl_get_stats(const mmp_ctl *c);
/* The last refused handshake, as logged ("" when none), into buf. */
void mmp_ctl_last_refused(mmp_ctl *c, char *buf, size_t n);
/* Coordinator over CURVE (tcp): seconds since ZeroMQ dropped the connection
 * that peer `id`'s last valid message came on (its ZMTP heartbeats went
 * unanswered for 5 s: its host or link is gone; or it closed), -1 while it
 * stands, for a peer never heard from, and without CURVE (ipc: no heartbeat
 * watch). A peer that reconnects and sends again stands again. */
double mmp_ctl_peer_dropped_s(mmp_ctl *c, const char *id);

/* Fills tok (33 bytes) with a fresh random hex job token. */
mmp_err mmp_ctl_new_token(char tok[33]);

/* Makes sure this process may hold `need` open file descriptors (a control
 * connection per stage process in the coordinator, a tcp socket per
 * channel and a pidfd per replica in a stage): raises the soft
 * RLIMIT_NOFILE up to the hard limit when it is lower than need, and
 * returns MMP_ERR_CONFIG, naming `what` (e.g. "1024 stage processes"),
 * need and both limits, when even the hard limit is lower. Never lowers
 * a limit. */
mmp_err mmp_ctl_reserve_fds(long need, const char *what);

/* The environment variable a stage process gets its job token from (the
 * coordinator sets it for each stage it spawns; the stage reads it, wipes it
 * and unsets it). Never on a command line: any user can read argv with ps. */
#define MMP_CTL_TOKEN_ENV "MMP_JOB_TOKEN"
/* The pid of the coordinator that spawned a local stage, in its
 * environment: a stage whose parent is another (the coordinator died before
 * the stage could ask to die with it, and a subreaper, not init, took the
 * stage) knows it is orphaned. */
#define MMP_CTL_PARENT_ENV "MMP_PARENT_PID"

#endif
