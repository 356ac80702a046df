/* The control plane: ZeroMQ sockets carrying protobuf-c Envelopes.
 *
 * The coordinator binds a ROUTER; each stage connects a DEALER whose routing
 * id is its process name ("image.0/0"). Every message is one frame holding a
 * packed Envelope (after the ROUTER's identity frame). Receiving checks, in
 * order: size (<= MMP_CTL_MAX_BYTES), decoding, version, job token, and that
 * a body is set; a message failing any check is logged with its sender and
 * reason, counted, and dropped: it never reaches the caller, and the run goes
 * on. Sockets are not thread-safe: one thread per mmp_ctl. LINGER is 0 so
 * closing never hangs on a dead peer. */
#ifndef MMP_TRANSPORT_CONTROL_H
#define MMP_TRANSPORT_CONTROL_H

#include <stddef.h>

#include "common/err.h"
#include "proto/mmpipe.pb-c.h"

#define MMP_CTL_VERSION 1
#define MMP_CTL_MAX_BYTES (4u << 20)
#define MMP_CTL_ID_MAX 64

typedef struct mmp_ctl mmp_ctl;

typedef struct mmp_ctl_stats {
    long received, rejected; /* rejected: dropped for one of the reasons above */
    long too_big, undecodable, bad_version, bad_token, no_body;
} mmp_ctl_stats;

/* Coordinator: binds endpoint ("ipc://@mmpipe-<token>" or "tcp://*:port"). */
mmp_err mmp_ctl_bind(mmp_ctl **out, const char *endpoint, const char *job_token);
/* Stage: connects with routing id `identity`. */
mmp_err mmp_ctl_connect(mmp_ctl **out, const char *endpoint, const char *identity,
                        const char *job_token);
void mmp_ctl_close(mmp_ctl *c);

/* Sends env, after setting its version and job token. `to` is the peer's
 * routing id on a ROUTER, NULL on a DEALER. A ROUTER send to an unknown peer
 * fails with MMP_ERR_PEER (ROUTER_MANDATORY), never silently. */
mmp_err mmp_ctl_send(mmp_ctl *c, const char *to, Mmpipe__Envelope *env);

/* Waits up to timeout_ms (-1: forever, 0: poll) for one valid message.
 * MMP_OK: *env is set (free with mmp_ctl_free) and `from` holds the sender's
 * routing id (ROUTER; "" on a DEALER). MMP_ERR_TIMEOUT when none came. */
mmp_err mmp_ctl_recv(mmp_ctl *c, int timeout_ms, Mmpipe__Envelope **env, char *from,
                     size_t from_n);
void mmp_ctl_free(Mmpipe__Envelope *env);

/* The underlying socket, for zmq_poll alongside other descriptors. */
void *mmp_ctl_socket(mmp_ctl *c);
mmp_ctl_stats mmp_ctl_get_stats(const mmp_ctl *c);

/* Fills tok (33 bytes) with a fresh random hex job token. */
mmp_err mmp_ctl_new_token(char tok[33]);

#endif
