/* Remote execution for `launcher: agent`: what ssh does for the ssh
 * launcher, where a node has no sshd and no SLURM (containers, Kubernetes
 * pods: every node starts `mmpipe agent` itself, as torchrun is started on
 * every node).
 *
 *   agent (one per node, cli/cmd_agent.c): listens on a tcp port; every
 *     connection goes through its gate (mmp_rexec_gate_create: the job-key
 *     handshake of transport/auth.h with the agent key and a hello, all
 *     pending connections at once), and each one that passes is served by a
 *     process of its own (mmp_rexec_serve): one command, run as `sh -c
 *     COMMAND` in a process group of its own with its standard input,
 *     output and error relayed over the connection, and its exit status sent
 *     back.
 *   relay (`mmpipe rexec`, mmp_rexec_run): what the coordinator starts for
 *     each remote stage in place of ssh: connects, proves it holds the key,
 *     sends the command, relays its own standard input, output and error,
 *     forwards SIGINT, SIGTERM and SIGHUP, and exits with the command's
 *     status (255 when the agent is lost, as ssh does).
 *
 * The key is a file both ends read (a Kubernetes secret, a file copied to
 * every node), never an argument: at least 32 characters of [0-9A-Za-z],
 * refused when its mode lets the group or others read it. A connection
 * without it is refused in the handshake (transport/auth.h: HMACs over
 * fresh nonces, the key never on the wire), before any command is read, and
 * logged with its address. Then each end sends 32 random bytes, and every
 * frame after is sealed (libsodium's crypto_secretbox: XSalsa20-Poly1305)
 * under a key of its direction, HMAC-SHA256(key, direction || relay's bytes
 * || agent's bytes), with a counter as nonce: the command, the stage's
 * secrets line on its input and its output are encrypted, and a frame
 * altered, dropped, replayed or reordered does not open (the connection
 * ends as a protocol error).
 *
 * A lost connection (the relay killed, the coordinator's host gone: the
 * socket's keepalive notices in MMP_SOCK_LOST_MS) closes the command's
 * standard input -- a stage takes that as its coordinator's end, removes its
 * shared memory and exits -- then, if it is still there, SIGTERM to its
 * process group after MMP_REXEC_GRACE_MS and SIGKILL as long again after.
 * Whatever a command leaves running in its group when it ends is sent
 * SIGTERM.
 *
 * Wire, after the handshake and the 32 bytes each way: frames of a 4-byte
 * length (big endian) and that many sealed bytes, which open to a 4-byte
 * type (big endian) and the payload. Relay to agent: EXEC (once, first: the
 * command,
 * 1 to MMP_REXEC_CMD_MAX bytes, no control characters), STDIN, STDIN_EOF,
 * SIGNAL (4 bytes: SIGINT, SIGTERM, SIGHUP or SIGKILL). Agent to relay:
 * STDOUT, STDERR, EXIT (4 bytes: the exit code, 128 + N for signal N). A
 * payload is at most MMP_REXEC_FRAME_MAX bytes; anything else ends the
 * connection as a protocol error. */
#ifndef MMP_TRANSPORT_REXEC_H
#define MMP_TRANSPORT_REXEC_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MMP_REXEC_PORT 29470 /* the agent's default port */
#define MMP_REXEC_CMD_MAX 16384
#define MMP_REXEC_FRAME_MAX 65536
#define MMP_REXEC_KEY_MIN 32
#define MMP_REXEC_KEY_MAX 256
#define MMP_REXEC_GRACE_MS 3000

enum {
    MMP_REXEC_EXEC = 1,
    MMP_REXEC_STDIN,
    MMP_REXEC_STDIN_EOF,
    MMP_REXEC_SIGNAL,
    MMP_REXEC_STDOUT,
    MMP_REXEC_STDERR,
    MMP_REXEC_EXIT,
};

/* One end of a connection after mmp_rexec_open. */
typedef struct mmp_rexec_conn {
    int fd;
    char what[320]; /* "agent at HOST:PORT", "agent: PEER": error messages start with it */
    unsigned char tx[32], rx[32];
    unsigned long long ntx, nrx; /* frames sealed and opened */
} mmp_rexec_conn;

/* Which end mmp_rexec_open opens. */
enum {
    MMP_REXEC_RELAY = 1,       /* the relay: handshake, hello, session keys */
    MMP_REXEC_AGENT = 0,       /* the agent, on a connection as accepted: the same */
    MMP_REXEC_AGENT_GATED = 2, /* the agent, on a connection its gate took: session keys only */
};

/* The agent's door (transport/auth.h's gate on the listening lfd): every
 * connection at once through the handshake with key and the relay's 8-byte
 * hello, each given 5 s, so strangers that connect and wait do not keep a
 * relay out (they hold one of MMP_AUTH_PENDING places until dropped); each
 * refusal logged with its address. key must outlive the gate. */
struct mmp_auth_gate;
mmp_err mmp_rexec_gate_create(struct mmp_auth_gate **gate, int lfd, const char *key);

/* Opens side's end of the connection on fd: the handshake with key and the
 * hello (not for MMP_REXEC_AGENT_GATED: its gate did them), then the 32
 * bytes each way and the session keys. MMP_OK, or the handshake's errors
 * (transport/auth.h), MMP_ERR_PROTO for a hello refused, MMP_ERR_PEER when
 * the bytes do not come within timeout_ms. c->fd = fd, still the caller's. */
mmp_err mmp_rexec_open(mmp_rexec_conn *c, int fd, const char *what, const char *key, int side,
                       int timeout_ms);
/* Seals and sends one frame (len <= MMP_REXEC_FRAME_MAX). */
mmp_err mmp_rexec_send(mmp_rexec_conn *c, uint32_t type, const void *buf, uint32_t len);
/* Receives and opens one frame into buf (cap bytes): its first byte within
 * timeout_ms (<= 0: no limit), the rest within 10 s. MMP_ERR_PROTO when it
 * is longer than cap or does not open; the socket's errors otherwise. */
mmp_err mmp_rexec_recv(mmp_rexec_conn *c, uint32_t *type, void *buf, uint32_t cap, uint32_t *len,
                       int timeout_ms);

/* The key in path into key[n] (newline stripped). MMP_ERR_CONFIG naming
 * the file when it cannot be read, is readable by its group or others, or
 * is not MMP_REXEC_KEY_MIN to MMP_REXEC_KEY_MAX characters of [0-9A-Za-z]. */
mmp_err mmp_rexec_key_load(const char *path, char *key, size_t n);

/* A new random key (64 hex characters) in a new file at path, mode 0600;
 * MMP_ERR_IO when path exists or cannot be written. */
mmp_err mmp_rexec_key_new(const char *path);

/* The agent's side of one connection fd (from peer, "host:port"), as
 * described above (gated: it came through mmp_rexec_gate_create's gate, so
 * the handshake and hello are done), in a process of its own: it installs handlers for
 * SIGTERM and SIGINT, each of which ends the connection as if it were lost
 * (the command stops as described), and ignores SIGHUP and SIGPIPE. Returns
 * when the command has ended and its status was sent, or the connection
 * failed (its command then stopped). Logs what it starts, how it ended and
 * every refusal. Closes fd. Returns 0 when a command ran and its status was
 * delivered, 1 otherwise. */
int mmp_rexec_serve(int fd, const char *peer, const char *key, int gated);

/* The relay: runs command on the agent at address ("host:port") with key,
 * trying to connect for connect_ms. Returns the command's exit status, or
 * 255 (with the reason on stderr) when it could not be run or the agent was
 * lost. */
int mmp_rexec_run(const char *address, const char *key, const char *command, int connect_ms);

#endif
