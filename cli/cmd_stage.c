/* mmpipe stage: one stage process, started by the coordinator (not by hand). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "stages/worker.h"
#include "transport/control.h"

static const char USAGE[] =
    "usage: MMP_JOB_TOKEN=T mmpipe stage --connect ENDPOINT --stage NAME --replica K\n"
    "\n"
    "Runs one stage process of a pipeline. The coordinator (mmpipe launch)\n"
    "starts these itself; there is no reason to run one by hand.\n"
    "\n"
    "The job token comes from the environment variable MMP_JOB_TOKEN, never\n"
    "from the command line (any user can read a command line with ps). The\n"
    "stage reads it, wipes it and removes it from its environment at start.\n"
    "There is no --token option.\n";

/* Takes the job token out of the environment into buf: copies it, wipes the
 * original bytes (so /proc/self/environ no longer shows it) and unsets it
 * (so nothing this process starts inherits it). 0 when absent or bad. */
static int take_token(char *buf, size_t n)
{
    char *v = getenv(MMP_CTL_TOKEN_ENV);
    if (!v || !*v || strlen(v) >= n) {
        return 0;
    }
    snprintf(buf, n, "%s", v);
    /* getenv's string is the process's initial environment block, which is
     * what /proc/PID/environ shows: overwrite it before dropping the name. */
    memset(v, 0, strlen(v));
    unsetenv(MMP_CTL_TOKEN_ENV);
    return 1;
}

int mmp_cmd_stage(int argc, char **argv)
{
    mmp_worker_args a = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mmpipe stage: '%s' needs a value\n\n%s", argv[i], USAGE);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(argv[i - 1], "--connect") == 0) {
            a.endpoint = v;
        } else if (strcmp(argv[i - 1], "--stage") == 0) {
            a.stage = v;
        } else if (strcmp(argv[i - 1], "--replica") == 0) {
            a.replica = atoi(v);
        } else {
            fprintf(stderr, "mmpipe stage: unknown option '%s'\n\n%s", argv[i - 1], USAGE);
            return 2;
        }
    }
    if (!a.endpoint || !a.stage) {
        fprintf(stderr, "mmpipe stage: --connect and --stage are required\n\n%s", USAGE);
        return 2;
    }
    static char token[128];
    if (!take_token(token, sizeof token)) {
        fprintf(stderr, "mmpipe stage: no job token in the environment (%s)\n\n%s",
                MMP_CTL_TOKEN_ENV, USAGE);
        return 2;
    }
    a.token = token;
    return mmp_worker_main(&a);
}
