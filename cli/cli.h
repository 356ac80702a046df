/* The mmpipe command line: one entry per subcommand, argv[0] is its name.
 * Each returns the process exit status: 0 ok, 1 failure, 2 usage error. */
#ifndef MMP_CLI_CLI_H
#define MMP_CLI_CLI_H

int mmp_cmd_launch(int argc, char **argv);
int mmp_cmd_ckpt(int argc, char **argv);
int mmp_cmd_data(int argc, char **argv);
int mmp_cmd_stage(int argc, char **argv);
int mmp_cmd_simulate(int argc, char **argv);
int mmp_cmd_bench(int argc, char **argv);

/* ckpt export / import (cli/cmd_ckpt_safetensors.c), after argument parsing:
 * exit statuses as above, errors printed. export: the checkpoint src (a step
 * directory, ckpt/latest or a run) to the safetensors file out, optimizer
 * moments only when optimizer. import: the safetensors file into the run
 * directory out as its step-0 checkpoint for the plan (with --set overrides). */
int mmp_ckpt_export(const char *src, const char *out, int optimizer);
int mmp_ckpt_import(const char *file, const char *plan_path, const char *const *sets, int n_sets,
                    const char *out);

/* Shared argument handling of commands that take one PLAN.yaml: arg is an
 * argument that matched none of the command's options. Records it as the
 * plan (the first non-option) or prints the usage error; returns 0, or 2
 * (the exit status) when arg is an unknown option or a second plan. */
int mmp_cli_take_plan(const char *cmd, const char *usage, const char *arg, const char **plan_path);
/* 0 when a plan was given, else prints "no plan given" with usage and returns 2. */
int mmp_cli_need_plan(const char *cmd, const char *usage, const char *plan_path);

/* 1 after printing usage on stdout when arg is -h or --help, else 0. */
int mmp_cli_help(const char *arg, const char *usage);

#endif
