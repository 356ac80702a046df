/* The job-key handshake of a new network connection (the tcp data channel,
 * its side channel under nccl, the replica reduce over tcp), before any other
 * byte of it: both ends prove they hold the job's secret (the job token the
 * coordinator made; the stages got it over the authenticated control plane
 * or their stdin). A process without it, on any host that can reach a data
 * port, is refused before it can send a hello, let alone a tensor. Internal
 * to transport/.
 *
 * Wire, both ends at once: "MMPAUTH1" and 32 random bytes (the nonce); then
 * each sends HMAC-SHA256(secret, role || its nonce || the other's), role
 * "connector" or "listener", and checks the other's in constant time.
 * Nothing secret crosses the wire; a recorded exchange does not pass again
 * (fresh nonces), nor does an end's own answer sent back to it (the roles
 * differ), nor an end whose nonce equals ours (refused).
 *
 * Must never: use a secret of zero length, compare MACs in variable time,
 * or wait without the caller's deadline. */
#ifndef MMP_TRANSPORT_AUTH_H
#define MMP_TRANSPORT_AUTH_H

#include "common/err.h"

#define MMP_AUTH_BYTES 72 /* one end's part on the wire: 8 + 32 + 32 */

/* Runs the handshake on fd (connected, either blocking mode): connector 1 on
 * the end that connected. deadline and stop_fd as transport/sock.h's.
 * Errors, each starting with `what`: MMP_ERR_INVALID for a NULL or empty
 * secret; MMP_ERR_PROTO when the peer is not an mmpipe end ("not an mmpipe
 * peer") or does not hold the job's secret ("does not hold this job's
 * key"); MMP_ERR_TIMEOUT when the peer sent nothing in time (before the
 * deadline or the stop fd); the socket's MMP_ERR_PEER otherwise. */
mmp_err mmp_auth_handshake(int fd, const char *what, const char *secret, int connector,
                           double deadline, int stop_fd);

#endif
