/* Control-plane envelopes as they come off the socket: the receive checks
 * (mmp_ctl_decode: size, protobuf-c unpack, version, job token, body fields)
 * and then the stage's own checks of what it would act on (an Assignment,
 * a Program against a fixed assignment). The token is this harness's, so
 * the seeds carry it and mutations reach the bodies. */
#include "stages/peer.h"
#include "tests/fuzz/fuzz.h"
#include "transport/control.h"

#define FUZZ_TOKEN "0123456789abcdef0123456789abcdef"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    Mmpipe__Envelope *env = NULL;
    char why[256];
    if (mmp_ctl_decode(data, size, FUZZ_TOKEN, &env, why, sizeof why) != MMP_CTL_OK) {
        return 0;
    }
    if (env->body_case == MMPIPE__ENVELOPE__BODY_ASSIGNMENT) {
        mmp_peer_check_assignment(env->assignment);
    } else if (env->body_case == MMPIPE__ENVELOPE__BODY_PROGRAM) {
        Mmpipe__Channel c = MMPIPE__CHANNEL__INIT, *cp = &c;
        c.id = 1, c.slots = 2, c.peer = "fusion/0", c.address = "/x", c.transport = "shm";
        Mmpipe__Assignment a = MMPIPE__ASSIGNMENT__INIT;
        a.kind = MMPIPE__STAGE_KIND__STAGE_KIND_IMAGE, a.microbatches = 4, a.n_channels = 1,
        a.channels = &cp;
        mmp_peer_check_program(&a, env->program->program, env->program->n_program);
    }
    /* What the receivers read besides: strings are NUL-terminated. */
    if (env->body_case == MMPIPE__ENVELOPE__BODY_ERROR && env->error->message) {
        volatile size_t n = strlen(env->error->message);
        (void)n;
    }
    mmp_ctl_free(env);
    return 0;
}
