/* The secrets line a `--secrets stdin` stage reads from the coordinator's
 * pipe, which ssh or srun forwards (coordinator/launcher.c
 * mmp_launch_secrets_parse; cli/cmd_stage.c reads one line of at most 399
 * bytes and hands it over without its newline). A line it takes is exactly
 * the line mmp_launch_secrets_format writes for what it read; a line it
 * refuses leaves the token untouched. */
#include "coordinator/launcher.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char line[400];
    if (size >= sizeof line) {
        return 0;
    }
    memcpy(line, data, size);
    line[size] = 0;
    char token[128]; /* cmd_stage.c's */
    memset(token, 'x', sizeof token);
    mmp_ctl_keys k;
    memset(&k, 0, sizeof k);
    if (mmp_launch_secrets_parse(line, token, sizeof token, &k) != MMP_OK) {
        if (token[0] != 'x') {
            __builtin_trap(); /* a refused line wrote the token */
        }
        return 0;
    }
    char again[512];
    if (mmp_launch_secrets_format(token, &k, again, sizeof again) != MMP_OK ||
        strlen(again) != strlen(line) + 1 || strncmp(again, line, strlen(line)) != 0) {
        __builtin_trap(); /* what it read does not write back as the line */
    }
    return 0;
}
