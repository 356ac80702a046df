/* Fault-injection hooks for the tests: a slow disk, a slow start-up, a
 * checkpoint write that fails, a silent start, a slow remote host. They are
 * not configuration (no plan has them; users never set them): each is an
 * MMP_TEST_* environment variable the test sets on the launch it injects a
 * fault into, and this module is the only place that reads them, so what
 * the tests can steer is listed here and nowhere else. Unset, empty or not
 * a number: 0, the hook is off. */
#ifndef MMP_COMMON_TEST_HOOKS_H
#define MMP_COMMON_TEST_HOOKS_H

typedef enum mmp_test_hook {
    /* coordinator/control_loop.c: the start-up silence limit, seconds, when
     * below its own (tests/cli_startup.sh) */
    MMP_HOOK_READY_SILENCE_S,
    /* stages/ckpt_writer.c: a background checkpoint write waits this many ms
     * before its file exists (tests/cli_ckpt_async.sh) */
    MMP_HOOK_CKPT_WRITE_DELAY_MS,
    /* stages/ckpt_writer.c: the background write of this step fails */
    MMP_HOOK_CKPT_FAIL_STEP,
    /* stages/worker.c: a manifest open pauses this many ms at each progress
     * report (tests/cli_startup.sh) */
    MMP_HOOK_SLOW_START_MS,
    /* transport/rexec.c: an agent waits this many ms before it reports a
     * stage's exit (tests/cli_agent.sh) */
    MMP_HOOK_AGENT_STATUS_DELAY_MS,
} mmp_test_hook;

/* The hook's value, 0 when it is off. */
double mmp_test_hook_value(mmp_test_hook h);

#endif
