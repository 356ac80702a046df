/* The `tcp` data channel's wire format (transport/tcp.c), for the transport
 * and for the tests that play a hostile peer by writing bytes into the
 * socket (tests/test_transport.c). Little-endian hosts only (x86-64, arm64):
 * the structs go on the wire as they lie in memory.
 *
 * 0. The job-key handshake (transport/auth.h): both ends prove they hold
 *    the job's secret; the creator drops a connector that does not.
 * 1. The connector sends one mmp_tcp_hello (its geometry, sends = 1 when it
 *    is the sending end, status 0). The creator checks it and answers with
 *    its own hello, status MMP_TCP_OK or the reason it refuses; on a refusal
 *    it closes that connection and keeps listening for the right connector.
 * 2. Sender -> receiver: one frame per message, the mmp_msg_header (32 bytes)
 *    then exactly header.bytes payload bytes (none for STOP).
 * 3. Receiver -> sender: credits, one uint64 each: the count of messages
 *    released so far (cumulative, so a lost ordering cannot double a credit).
 * Everything the peer sends is checked before it is used: the hello's
 * fields, every header (mmp_msg_check), that a message came with a credit,
 * that a credit count never goes back nor past the messages posted. */
#ifndef MMP_TRANSPORT_TCP_H
#define MMP_TRANSPORT_TCP_H

#include <assert.h>
#include <stdint.h>

#include "transport/channel.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the tcp transport's wire is little-endian structs"
#endif

#define MMP_TCP_MAGIC 0x3130504354504d4dull /* "MMPTCP01" */
#define MMP_TCP_VERSION 2u                  /* 2: the job-key handshake (transport/auth.h) first */

enum {
    MMP_TCP_OK = 0,
    MMP_TCP_GEOMETRY = 1,  /* slots or slot_bytes differ */
    MMP_TCP_DIRECTION = 2, /* both ends send, or both receive */
    MMP_TCP_VERSION_MISMATCH = 3,
};

typedef struct mmp_tcp_hello {
    uint64_t magic; /* MMP_TCP_MAGIC */
    uint32_t version;
    uint32_t slots;
    uint64_t slot_bytes;
    int32_t sends;  /* 1: the end that wrote this hello sends */
    int32_t status; /* the creator's answer: MMP_TCP_OK or a reason */
} mmp_tcp_hello;

static_assert(sizeof(mmp_tcp_hello) == 32, "mmp_tcp_hello is part of the wire");
static_assert(sizeof(mmp_msg_header) == 32, "mmp_msg_header is part of the wire");

#endif
