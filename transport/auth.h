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

#include <stddef.h>

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

/* ---- the listener's door ------------------------------------------------
 * A listening end (the tcp channel's creator, rank 0 of the reduce over
 * tcp) takes connectors through a gate: every connection that arrives is
 * accepted at once and driven through the handshake, then its hello (a
 * fixed-size struct of the caller's wire) and the caller's answer, all
 * pending connections at the same time (one poll over all of them), each
 * with its own deadline of hello_ms from its accept. A stranger that
 * connects and sends nothing therefore delays nobody: it holds one of
 * MMP_AUTH_PENDING places until its deadline (when they are all taken, the
 * oldest is dropped for the newcomer: a real peer finishes in
 * milliseconds), while the real peer, arriving after it, is answered at
 * once. Every refusal is logged (MMP_WARN) with the connection's address and
 * the reason. */

#define MMP_AUTH_PENDING 32   /* connections in the handshake at once */
#define MMP_AUTH_HELLO_MAX 64 /* the largest hello (and answer) a gate carries */

typedef struct mmp_auth_gate mmp_auth_gate;

/* The caller's check of an authenticated connector's hello (hello_bytes of
 * it, not yet checked: the peer holds the key, but check every field). Fills
 * reply[reply_bytes] (when it returns >= 0) and returns 0 to take the
 * connection, > 0 to refuse it after sending reply, < 0 to refuse it
 * without an answer; *why (a static string) says why for the log when it
 * refuses. Called on the thread in mmp_auth_gate_next. */
typedef int (*mmp_auth_judge_fn)(void *ctx, const void *hello, void *reply, const char **why);

/* A gate on lfd (listening, non-blocking; still the caller's: the gate
 * never closes it). what names the listener in logs; secret (the job's,
 * non-empty) must outlive the gate. MMP_ERR_INVALID for a hello or reply
 * over MMP_AUTH_HELLO_MAX or no secret, MMP_ERR_NOMEM. */
mmp_err mmp_auth_gate_create(mmp_auth_gate **out, int lfd, const char *what, const char *secret,
                             size_t hello_bytes, size_t reply_bytes, int hello_ms,
                             mmp_auth_judge_fn judge, void *ctx);

/* Blocks until one connector passed the handshake and the judge took it:
 * *fd (non-blocking, the caller's to close), its address in peer[peer_n] and
 * its hello in hello[hello_bytes]. Connections still in the handshake stay in
 * the gate for the next call. MMP_ERR_TIMEOUT when stop_fd (an eventfd, see
 * sock.h; never -1 here) became readable; MMP_ERR_IO when accepting failed
 * for good. */
mmp_err mmp_auth_gate_next(mmp_auth_gate *g, int stop_fd, int *fd, char *peer, size_t peer_n,
                           void *hello);

/* Closes every connection still in the handshake, logging each as refused
 * for `why` (NULL: closing quietly, e.g. when stopped), and frees the gate.
 * NULL is a no-op. */
void mmp_auth_gate_destroy(mmp_auth_gate *g, const char *why);

#endif
