/* mmpipe stage: one stage process, started by the coordinator (not by hand). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <unistd.h>

#include "cli/cli.h"
#include "coordinator/launcher.h"
#include "stages/worker.h"
#include "transport/control.h"

static const char USAGE[] =
    "usage: MMP_JOB_TOKEN=T mmpipe stage --connect ENDPOINT --stage NAME --replica K\n"
    "                                    [--shm-prefix /mmpipe-ID] [--secrets stdin]\n"
    "                                    [--pin-index I] [--nice N]\n"
    "\n"
    "Runs one stage process of a pipeline. The coordinator (mmpipe launch)\n"
    "starts these itself, here or through ssh / srun; there is no reason to\n"
    "run one by hand.\n"
    "\n"
    "The job token comes from the environment variable MMP_JOB_TOKEN, never\n"
    "from the command line (any user can read a command line with ps). The\n"
    "stage reads it, wipes it and removes it from its environment at start.\n"
    "There is no --token option.\n"
    "\n"
    "--secrets stdin (tcp control, other hosts): the token and the job's CURVE\n"
    "keys come as one line on standard input instead, and standard input then\n"
    "stays open: its end of file means the coordinator (or its ssh) is gone,\n"
    "and the stage removes the job's shared memory here (--shm-prefix) and exits.\n"
    "\n"
    "--pin-index I (plan key train.pin): this is the I-th stage process on its\n"
    "host; it pins itself to the cores the plan's train.pin gives that index.\n"
    "\n"
    "--nice N (plan key train.priority, 1 to 19): the coordinator's planner\n"
    "gave this process a large share of cores it shares with lighter stages;\n"
    "it lowers its own priority (every thread) to nice N.\n";

/* Reads the secrets line from fd 0 one byte at a time (nothing after the
 * newline is consumed: the rest of stdin is the coordinator's liveness). */
static int take_secrets(char *token, size_t token_n, mmp_ctl_keys *k)
{
    char line[400];
    size_t n = 0;
    while (n + 1 < sizeof line) {
        char ch;
        ssize_t r = read(0, &ch, 1);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r != 1 || ch == '\n') {
            break;
        }
        line[n++] = ch;
    }
    line[n] = 0;
    int ok = mmp_launch_secrets_parse(line, token, token_n, k) == MMP_OK;
    explicit_bzero(line, sizeof line);
    return ok;
}

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

/* Whether v is a whole decimal number from lo to hi; if so *out gets it. */
static int int_in(const char *v, long lo, long hi, int *out)
{
    char *end;
    long k = strtol(v, &end, 10);
    if (*end || end == v || k < lo || k > hi) {
        return 0;
    }
    *out = (int)k;
    return 1;
}

int mmp_cmd_stage(int argc, char **argv)
{
    mmp_worker_args a = {.watch_fd = -1, .pin_index = -1};
    int secrets_stdin = 0;
    static mmp_ctl_keys keys;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
        /* the options below, each with a value */
        static const char *const known[] = {"--connect", "--stage",      "--replica", "--pin-index",
                                            "--nice",    "--shm-prefix", "--secrets"};
        int is_known = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
            is_known |= strcmp(argv[i], known[k]) == 0;
        }
        if (!is_known) {
            fprintf(stderr, "mmpipe stage: unknown option '%s'\n\n%s", argv[i], USAGE);
            return 2;
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
            if (!int_in(v, 0, 1000000, &a.replica)) {
                fprintf(stderr, "mmpipe stage: --replica takes a replica index, got '%s'\n\n%s", v,
                        USAGE);
                return 2;
            }
        } else if (strcmp(argv[i - 1], "--pin-index") == 0) {
            if (!int_in(v, 0, 1000000, &a.pin_index)) {
                fprintf(stderr, "mmpipe stage: --pin-index takes a process index, got '%s'\n\n%s",
                        v, USAGE);
                return 2;
            }
        } else if (strcmp(argv[i - 1], "--nice") == 0) {
            if (!int_in(v, 1, 19, &a.nice)) {
                fprintf(stderr,
                        "mmpipe stage: --nice takes a nice value from 1 to 19, got '%s'\n\n%s", v,
                        USAGE);
                return 2;
            }
        } else if (strcmp(argv[i - 1], "--shm-prefix") == 0) {
            /* exactly a job's ("/mmpipe-" and 12 hex digits, coordinator/run.c):
             * the stage removes everything under it when its coordinator is
             * gone, and "/mmpipe-" alone would be every job's on the host */
            size_t n = strlen(v);
            int ok = n == 20 && strncmp(v, "/mmpipe-", 8) == 0 &&
                     strspn(v + 8, "0123456789abcdef") == 12;
            if (!ok) {
                fprintf(stderr,
                        "mmpipe stage: --shm-prefix takes a job's prefix, /mmpipe- and 12 hex "
                        "digits, got '%s'\n\n%s",
                        v, USAGE);
                return 2;
            }
            a.shm_prefix = v;
        } else if (strcmp(argv[i - 1], "--secrets") == 0) {
            if (strcmp(v, "stdin") != 0) {
                fprintf(stderr, "mmpipe stage: --secrets takes 'stdin', got '%s'\n\n%s", v, USAGE);
                return 2;
            }
            secrets_stdin = 1;
        }
    }
    if (!a.endpoint || !a.stage) {
        fprintf(stderr, "mmpipe stage: --connect and --stage are required\n\n%s", USAGE);
        return 2;
    }
    static char token[128];
    if (secrets_stdin) {
        if (!take_secrets(token, sizeof token, &keys)) {
            fprintf(stderr, "mmpipe stage: no valid secrets line on stdin (%s)\n\n%s",
                    mmp_last_error(), USAGE);
            return 2;
        }
        a.curve = &keys;
        a.watch_fd = 0;
    } else if (!take_token(token, sizeof token)) {
        fprintf(stderr, "mmpipe stage: no job token in the environment (%s)\n\n%s",
                MMP_CTL_TOKEN_ENV, USAGE);
        return 2;
    }
    a.token = token;
    return mmp_worker_main(&a);
}
