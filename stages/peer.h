/* What a stage process accepts from outside itself, checked against its own
 * geometry before anything is indexed or copied with it: the rows of a data
 * message against the receiving buffers (mb_max rows of row_bytes), and the
 * instruction list the coordinator sends against the assignment it belongs
 * to (micro-batch numbers, channel ids, directions).
 *
 * The transport has already checked what it knows (payload bytes within the
 * slot: mmp_msg_check); these are the checks only the stage can make. Every
 * failure is MMP_ERR_PROTO with a message naming the channel or instruction,
 * the field, its value and the limit; none asserts. Pure functions: safe on
 * any input (the fuzz harnesses feed them). */
#ifndef MMP_STAGES_PEER_H
#define MMP_STAGES_PEER_H

#include <stddef.h>

#include "common/config.h"
#include "common/err.h"
#include "proto/mmpipe.pb-c.h"
#include "transport/channel.h"

/* A received data message on channel `chan` (its id, for the message):
 * 0 <= h->n <= mb_max and h->bytes == h->n * row_bytes exactly, so every
 * part of the payload the stage reads (data rows, mask, valid flags) lies
 * in the bytes the sender wrote. */
mmp_err mmp_peer_check_rows(int chan, const mmp_msg_header *h, int mb_max, size_t row_bytes);

/* An Assignment's shape, before the stage builds anything from it:
 * 1..MMP_MAX_MICROBATCHES micro-batches, replica < replicas, a known
 * kind, sub and layers not negative, channels with unique ids not
 * negative (an instruction's edge -1 names no channel), slots in 1..4096,
 * and its program (mmp_peer_check_program). */
mmp_err mmp_peer_check_assignment(const Mmpipe__Assignment *a);

/* An instruction list for assignment a (its first program or a later
 * Program): a known op; mb in 0..microbatches-1 for the per-micro-batch ops
 * (LOAD, RECV_*, FWD, SEND_*, BWD); for RECV_ACT/SEND_ACT/RECV_GRAD/SEND_GRAD
 * an edge that is one of a's channels with the matching direction and kind. */
mmp_err mmp_peer_check_program(const Mmpipe__Assignment *a, Mmpipe__Instr *const *prog, size_t n);

#endif
