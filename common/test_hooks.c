/* The tests' fault-injection hooks (common/test_hooks.h). */
#include "common/test_hooks.h"

#include <stdlib.h>

double mmp_test_hook_value(mmp_test_hook h)
{
    static const char *const names[] = {
        [MMP_HOOK_READY_SILENCE_S] = "MMP_TEST_READY_SILENCE_S",
        [MMP_HOOK_CKPT_WRITE_DELAY_MS] = "MMP_TEST_CKPT_WRITE_DELAY_MS",
        [MMP_HOOK_CKPT_FAIL_STEP] = "MMP_TEST_CKPT_FAIL_STEP",
        [MMP_HOOK_SLOW_START_MS] = "MMP_TEST_SLOW_START_MS",
        [MMP_HOOK_AGENT_STATUS_DELAY_MS] = "MMP_TEST_AGENT_STATUS_DELAY_MS",
    };
    if ((unsigned)h >= sizeof names / sizeof names[0]) {
        return 0;
    }
    const char *v = getenv(names[h]);
    char *end = NULL;
    double x = v && *v ? strtod(v, &end) : 0;
    return end && *end == 0 && x > 0 ? x : 0;
}
