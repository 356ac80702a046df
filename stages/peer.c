/* The stage's checks of what crosses into it (contract in peer.h). Must
 * never: index, copy or allocate with a field before it is checked here. */
#include "stages/peer.h"

#include <string.h>

mmp_err mmp_peer_check_rows(int chan, const mmp_msg_header *h, int mb_max, size_t row_bytes)
{
    if (h->n < 0 || h->n > mb_max) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "channel %d: step %d micro-batch %d: header field n = %d, outside "
                          "0..%d (the micro-batch buffers' rows)",
                          chan, h->step, h->mb, h->n, mb_max);
    }
    unsigned long long want = (unsigned long long)h->n * (unsigned long long)row_bytes;
    if (h->bytes != want) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "channel %d: step %d micro-batch %d: header field bytes = %llu, want "
                          "%llu (%d rows of %zu bytes)",
                          chan, h->step, h->mb, (unsigned long long)h->bytes, want, h->n,
                          row_bytes);
    }
    return MMP_OK;
}

static const Mmpipe__Channel *channel_of(const Mmpipe__Assignment *a, int id)
{
    for (size_t i = 0; i < a->n_channels; i++) {
        if (a->channels[i] && a->channels[i]->id == id) {
            return a->channels[i];
        }
    }
    return NULL;
}

/* Whether prog has a BWD_INPUT of micro-batch mb (only asked on an error). */
static int has_input(Mmpipe__Instr *const *prog, size_t n, int mb)
{
    for (size_t j = 0; j < n; j++) {
        if (prog[j] && prog[j]->op == MMPIPE__OP__BWD_INPUT && prog[j]->mb == mb) {
            return 1;
        }
    }
    return 0;
}

mmp_err mmp_peer_check_program(const Mmpipe__Assignment *a, Mmpipe__Instr *const *prog, size_t n)
{
    int m = a->microbatches;
    if (m < 1 || m > MMP_MAX_MICROBATCHES) {
        return mmp_errorf(MMP_ERR_PROTO, "assignment: field microbatches = %d, outside 1..%d", m,
                          MMP_MAX_MICROBATCHES);
    }
    /* zb-h1, per micro-batch: 0 nothing yet, 1 its BWD_INPUT ran, 2 its BWD_WEIGHT too */
    unsigned char split[MMP_MAX_MICROBATCHES] = {0};
    for (size_t i = 0; i < n; i++) {
        const Mmpipe__Instr *in = prog[i];
        if (!in) {
            return mmp_errorf(MMP_ERR_PROTO, "instruction %zu: missing", i);
        }
        int send = -1, grad = -1, per_mb = 1;
        switch (in->op) {
        case MMPIPE__OP__LOAD:
        case MMPIPE__OP__FWD:
        case MMPIPE__OP__BWD:
        case MMPIPE__OP__BWD_INPUT:
        case MMPIPE__OP__BWD_WEIGHT:
            break;
        case MMPIPE__OP__RECV_ACT:
            send = 0, grad = 0;
            break;
        case MMPIPE__OP__SEND_ACT:
            send = 1, grad = 0;
            break;
        case MMPIPE__OP__RECV_GRAD:
            send = 0, grad = 1;
            break;
        case MMPIPE__OP__SEND_GRAD:
            send = 1, grad = 1;
            break;
        case MMPIPE__OP__GRAD_NORM:
        case MMPIPE__OP__OPT_STEP:
            per_mb = 0;
            break;
        default:
            return mmp_errorf(MMP_ERR_PROTO, "instruction %zu: field op = %d, not a known op", i,
                              (int)in->op);
        }
        if (per_mb && (in->mb < 0 || in->mb >= m)) {
            return mmp_errorf(MMP_ERR_PROTO, "instruction %zu: field mb = %d, outside 0..%d", i,
                              in->mb, m - 1);
        }
        if (in->op == MMPIPE__OP__BWD_WEIGHT) {
            /* zb-h1's W reads what its micro-batch's BWD_INPUT recorded */
            const char *why = split[in->mb] == 2           ? "repeats an earlier one"
                              : split[in->mb] == 1         ? NULL
                              : has_input(prog, n, in->mb) ? "before its BWD_INPUT"
                                                           : "without its BWD_INPUT";
            if (why) {
                return mmp_errorf(MMP_ERR_PROTO, "instruction %zu: BWD_WEIGHT of mb %d %s", i,
                                  in->mb, why);
            }
            split[in->mb] = 2;
        } else if (in->op == MMPIPE__OP__BWD_INPUT && split[in->mb] == 0) {
            split[in->mb] = 1;
        }
        if (send < 0) {
            continue;
        }
        const Mmpipe__Channel *c = channel_of(a, in->edge);
        if (!c) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "instruction %zu: field edge = %d, not one of the %zu channels", i,
                              in->edge, a->n_channels);
        }
        if ((c->send != 0) != send || (c->grad != 0) != grad) {
            return mmp_errorf(MMP_ERR_PROTO, "instruction %zu: %s on channel %d, which %s %s", i,
                              send ? "a send" : "a receive", in->edge,
                              c->send ? "sends" : "receives",
                              c->grad ? "gradients" : "activations");
        }
    }
    return MMP_OK;
}

mmp_err mmp_peer_check_assignment(const Mmpipe__Assignment *a)
{
    if (a->microbatches < 1 || a->microbatches > MMP_MAX_MICROBATCHES) {
        return mmp_errorf(MMP_ERR_PROTO, "assignment: field microbatches = %d, outside 1..%d",
                          a->microbatches, MMP_MAX_MICROBATCHES);
    }
    int replicas = a->replicas > 0 ? a->replicas : 1;
    if (a->replica < 0 || a->replica >= replicas) {
        return mmp_errorf(MMP_ERR_PROTO, "assignment: field replica = %d, outside 0..%d",
                          a->replica, replicas - 1);
    }
    if ((int)a->kind < MMPIPE__STAGE_KIND__STAGE_KIND_IMAGE ||
        (int)a->kind > MMPIPE__STAGE_KIND__STAGE_KIND_FUSION) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "assignment: field kind = %d, not image|text|fusion (0..2)",
                          (int)a->kind);
    }
    /* (a branch has at most as many sub-stages as layers: 1024 is far past
     * any, and keeps the trace's row number of a stage in range) */
    if (a->sub < 0 || a->sub >= 1024 || a->layer_first < 0 || a->layer_last < a->layer_first) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "assignment: fields sub = %d (0..1023), layers = [%d, %d): out of range "
                          "or empty",
                          a->sub, a->layer_first, a->layer_last);
    }
    if (a->inflight_bound < 0 || a->inflight_bound > a->microbatches) {
        return mmp_errorf(MMP_ERR_PROTO, "assignment: field inflight_bound = %d, outside 0..%d",
                          a->inflight_bound, a->microbatches);
    }
    for (size_t i = 0; i < a->n_channels; i++) {
        const Mmpipe__Channel *c = a->channels[i];
        if (!c || !c->peer || !c->address || !c->transport) {
            return mmp_errorf(MMP_ERR_PROTO, "assignment: channel %zu is incomplete", i);
        }
        if (c->id < 0) { /* an instruction's edge -1 is "no channel": the worker's NULL */
            return mmp_errorf(MMP_ERR_PROTO, "assignment: channel %zu: field id = %d, negative", i,
                              c->id);
        }
        if (c->slots < 1 || c->slots > 4096) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "assignment: channel %d: field slots = %d, outside 1..4096", c->id,
                              c->slots);
        }
        for (size_t j = 0; j < i; j++) {
            if (a->channels[j]->id == c->id) {
                return mmp_errorf(MMP_ERR_PROTO, "assignment: channel id %d appears twice", c->id);
            }
        }
    }
    return mmp_peer_check_program(a, a->program, a->n_program);
}
