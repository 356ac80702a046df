/* The mmpipe command line: one entry per subcommand, argv[0] is its name.
 * Each returns the process exit status: 0 ok, 1 failure, 2 usage error. */
#ifndef MMP_CLI_CLI_H
#define MMP_CLI_CLI_H

#include "common/err.h"

int mmp_cmd_launch(int argc, char **argv);
int mmp_cmd_ckpt(int argc, char **argv);
int mmp_cmd_data(int argc, char **argv);
int mmp_cmd_stage(int argc, char **argv);
int mmp_cmd_simulate(int argc, char **argv);
int mmp_cmd_bench(int argc, char **argv);
int mmp_cmd_devices(int argc, char **argv);
int mmp_cmd_agent(int argc, char **argv);
int mmp_cmd_rexec(int argc, char **argv);

/* Commands that take one PLAN.yaml (launch, simulate) describe their
 * options in a table and parse with mmp_cli_parse, so flags, values, --set
 * and the usage errors read the same in every one of them. */
typedef enum {
    MMP_CLI_FLAG,  /* --name: *(int *)out = 1 */
    MMP_CLI_VALUE, /* --name V: *(const char **)out = V (the last one given) */
    MMP_CLI_SET,   /* --name KEY=VALUE: appended to the plan overrides */
    MMP_CLI_STEPS, /* --name N: an integer 0..1e9, appended as job.steps=N */
} mmp_cli_kind;

typedef struct {
    const char *name;
    mmp_cli_kind kind;
    void *out; /* FLAG and VALUE only */
} mmp_cli_opt;

/* What mmp_cli_parse found besides the options' own outputs. */
typedef struct {
    const char *plan;  /* the PLAN.yaml argument */
    const char **sets; /* plan overrides (KEY=VALUE) in the order given */
    int n_sets;
    char steps_set[64]; /* job.steps=N for MMP_CLI_STEPS */
} mmp_cli_args;

#define MMP_CLI_GO (-1)

/* Parses argv[1..argc) of `mmpipe cmd`: -h/--help anywhere an option may
 * stand prints usage on stdout; every other argument is one of opts (a value
 * option with no value left is a usage error) or the plan. Returns
 * MMP_CLI_GO to go on, or the exit status to return now: 0 after --help, 1
 * out of memory, 2 a usage error (printed with usage where it helps). Either
 * way the caller owns args and frees it with mmp_cli_args_fini (also safe on
 * zeroed storage). */
int mmp_cli_parse(const char *cmd, const char *usage, const mmp_cli_opt *opts, int n_opts, int argc,
                  char **argv, mmp_cli_args *args);
void mmp_cli_args_fini(mmp_cli_args *args);

/* ckpt export / import (cli/cmd_ckpt_safetensors.c), after argument parsing:
 * exit statuses as above, errors printed. export: the checkpoint src (a step
 * directory, ckpt/latest or a run) to the safetensors file out, optimizer
 * moments only when optimizer. import: the safetensors file into the run
 * directory out as its step-0 checkpoint for the plan (with --set overrides). */
int mmp_ckpt_export(const char *src, const char *out, int optimizer);
int mmp_ckpt_import(const char *file, const char *plan_path, const char *const *sets, int n_sets,
                    const char *out);

/* The weights a new run starts from (cli/cmd_ckpt_safetensors.c): the
 * plan's model, initialised from job.seed as every stage initialises it, or
 * loaded from a safetensors file (ckpt import, launch --init-from). */
struct mmp_plan;
typedef struct mmp_init_weights mmp_init_weights;
/* file NULL: the plan's initial weights for a vocabulary of vocab_size.
 * file: its tensors (untrusted; see ckpt import), every parameter and
 * batch-norm buffer of the plan's model with its shape, no other name, and
 * text.embed.wte with vocab_size rows (vocab_size 0: any); errors name the
 * file and the tensor, with the shape it has and the one wanted. AdamW
 * moments the file lacks start at zero (*filled counts them); with
 * fresh_optimizer the file's own moments are dropped too. Reads and checks
 * only: nothing is written. On success *out is the caller's. */
mmp_err mmp_init_weights_create(mmp_init_weights **out, const struct mmp_plan *plan,
                                const char *plan_path, const char *file, int vocab_size,
                                int fresh_optimizer, int *filled);
/* Writes w as run_dir's step-0 checkpoint (ckpt/step_0000000 with the
 * plan's fingerprint) and points ckpt/latest at it, which `launch --resume`
 * and a restart start from. */
mmp_err mmp_init_weights_save(const mmp_init_weights *w, const struct mmp_plan *plan,
                              const char *run_dir);
/* NULL-safe. */
void mmp_init_weights_destroy(mmp_init_weights *w);

/* Shared argument handling of commands that take one PLAN.yaml: arg is an
 * argument that matched none of the command's options. Records it as the
 * plan (the first non-option) or prints the usage error; returns 0, or 2
 * (the exit status) when arg is an unknown option or a second plan. */
int mmp_cli_take_plan(const char *cmd, const char *usage, const char *arg, const char **plan_path);
/* Prints "mmpipe <cmd>: <message>", then usage's synopsis (its text up to
 * the first blank line) and a pointer to --help, on stderr; returns 2. */
__attribute__((format(printf, 3, 4))) int mmp_cli_usage_error(const char *cmd, const char *usage,
                                                              const char *fmt, ...);
/* 0 when a plan was given, else prints "no plan given" with usage and returns 2. */
int mmp_cli_need_plan(const char *cmd, const char *usage, const char *plan_path);

/* 1 when arg reads as an option ("--x", "-x"; not "-1"): what an option
 * that takes a value refuses as its value, so a forgotten value is an error
 * rather than the next option swallowed ("--out --force" made a directory
 * named --force). A value that starts with - is written ./-x or key=-x. */
int mmp_cli_is_option(const char *arg);

/* 1 after printing usage on stdout when arg is -h or --help, else 0. */
int mmp_cli_help(const char *arg, const char *usage);

/* A command made of subcommands (mmpipe itself, mmpipe data): one entry each. */
typedef struct {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand's name */
} mmp_cli_sub;

/* Runs the subcommand argv[1] names with argv[1..argc). No argument: usage
 * on stderr, 2; -h/--help: usage on stdout, 0; an unknown name: "<prog>:
 * unknown command '<name>'" and usage on stderr (or, for a name within two
 * edits of a subcommand's, "(did you mean '<sub>'?)" instead of usage), 2. */
int mmp_cli_dispatch(const char *prog, const char *usage, const mmp_cli_sub *subs, int n_subs,
                     int argc, char **argv);

#endif
