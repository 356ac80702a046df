/* The command line that starts one stage process, for each launcher
 * (common/config.h mmp_launcher). Pure: builds argv into caller storage, runs
 * nothing, reads no environment (tests/test_launcher.c checks the lines).
 *
 *   local: BINARY stage --connect EP --stage NAME --replica K --shm-prefix P
 *          [--secrets stdin] [--pin-index I] [--nice N]
 *   ssh:   the plan's launcher_command split on spaces ({address}, {name}
 *          replaced), then ONE argument, the remote command for the remote
 *          user's shell: cd 'WORKDIR' && exec 'BINARY' stage ... --secrets stdin
 *          with every value single-quoted ('\'' for a quote) after checking it;
 *          with forwarded variables (s.env): exec env 'K=V'... 'BINARY' ...
 *          (ssh starts the remote command with the remote login's
 *          environment, not ours; srun and a local start pass ours on)
 *   slurm: srun --nodes=1 --ntasks=1 --nodelist=ADDRESS --overlap
 *          --kill-on-bad-exit=1 --quiet --job-name=mmpipe-NAME --chdir=WORKDIR
 *          BINARY stage ... (srun runs it without a shell)
 * No secret is ever on these lines: with --secrets stdin the stage reads the
 * job token and its CURVE keys from its standard input (the launcher's pipe,
 * which ssh and srun forward), and takes the pipe's end of file as the
 * coordinator's end. Every value placed on a line is checked first (no
 * leading '-', no control characters), so a plan cannot smuggle options or
 * shell syntax in. */
#ifndef MMP_COORDINATOR_LAUNCHER_H
#define MMP_COORDINATOR_LAUNCHER_H

#include "common/config.h"
#include "common/err.h"
#include "transport/control.h"

#define MMP_LAUNCH_ARGV_MAX 64

typedef struct mmp_launch_line {
    char buf[8192]; /* the words' storage */
    size_t used;
    char *argv[MMP_LAUNCH_ARGV_MAX + 1]; /* NULL-terminated */
    int argc;
} mmp_launch_line;

typedef struct mmp_launch_stage {
    const char *exe;        /* this mmpipe (a host's binary defaults to it) */
    const char *cwd;        /* this process's directory (a host's workdir defaults to it) */
    const char *endpoint;   /* the control endpoint the stage connects to */
    const char *stage;      /* "image.0" */
    int replica;            /* >= 0 */
    const char *shm_prefix; /* "/mmpipe-..." */
    int secrets_stdin;      /* tcp control: token and keys on stdin (always for ssh and slurm) */
    int pinned;             /* train.pin is on: --pin-index pin_index (common/pin.h) */
    int pin_index;          /* the process's index on its host */
    int nice;               /* > 0: --nice nice (train.priority) */
    /* "NAME=VALUE" words the remote command sets (ssh only; NULL-terminated,
     * may be NULL): the variables that decide a stage's arithmetic, so a
     * stage on another host computes as this one (mmp_launch_forward_env) */
    const char *const *env;
} mmp_launch_stage;

/* The variables of envp (NULL-terminated, "NAME=VALUE") a remote stage must
 * see as the coordinator does: OpenBLAS's kernel choice and cache sizes
 * (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE), which decide the bits of every
 * GEMM, so without them a stage started by ssh on the same machine can pick
 * other kernels and the run no longer equals --single-process. Copies
 * pointers to those set (with a value of [A-Za-z0-9_.-] only; others are
 * skipped) into out (room for cap - 1, NULL-terminated); returns how many. */
int mmp_launch_forward_env(char *const *envp, const char **out, int cap);

/* Builds the line that starts stage s on plan host `host` with the plan's
 * launcher. MMP_ERR_INVALID naming the value when one is unusable on a
 * command line or the line does not fit. */
mmp_err mmp_launch_line_build(mmp_launch_line *l, const mmp_plan *p, int host,
                              const mmp_launch_stage *s);

/* The line as text for logs and tests: words joined by spaces. */
const char *mmp_launch_line_text(const mmp_launch_line *l, char *buf, size_t n);

/* The secrets line a --secrets stdin stage reads (token and CURVE keys,
 * made of [0-9a-f] and Z85 characters, no spaces): "mmpipe-secrets-1 TOKEN
 * SERVER_PUBLIC CLIENT_PUBLIC CLIENT_SECRET\n". */
#define MMP_LAUNCH_SECRETS_TAG "mmpipe-secrets-1"

/* The secrets line for token and k's server public, client public and
 * client secret keys into buf (n bytes, newline and NUL included).
 * MMP_ERR_INVALID when a part is not what mmp_launch_secrets_parse takes or
 * the line does not fit. */
mmp_err mmp_launch_secrets_format(const char *token, const mmp_ctl_keys *k, char *buf, size_t n);

/* Reads a secrets line (from another process: the coordinator's pipe, which
 * ssh or srun forwards), its newline already taken off: the tag, a token of
 * 1..token_n-1 characters [0-9a-f], then three keys of 40 Z85 characters,
 * separated by single spaces, nothing after. On success token and k's three
 * keys are set (k->server_secret is left alone); on failure MMP_ERR_PROTO
 * naming the part (never its text: it is secret) and nothing is written. */
mmp_err mmp_launch_secrets_parse(const char *line, char *token, size_t token_n, mmp_ctl_keys *k);

#endif
