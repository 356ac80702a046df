/* mmpipe stage: one stage process, started by the coordinator (not by hand). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "stages/worker.h"

static const char USAGE[] =
    "usage: mmpipe stage --connect ENDPOINT --stage NAME --replica K --token T\n"
    "\n"
    "Runs one stage process of a pipeline. The coordinator (mmpipe launch)\n"
    "starts these itself; there is no reason to run one by hand.\n";

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
        } else if (strcmp(argv[i - 1], "--token") == 0) {
            a.token = v;
        } else {
            fprintf(stderr, "mmpipe stage: unknown option '%s'\n\n%s", argv[i - 1], USAGE);
            return 2;
        }
    }
    if (!a.endpoint || !a.stage || !a.token) {
        fprintf(stderr, "mmpipe stage: --connect, --stage and --token are required\n\n%s", USAGE);
        return 2;
    }
    return mmp_worker_main(&a);
}
