/* mmpipe: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char USAGE[] =
    "usage: mmpipe <command> [args]\n"
    "\n"
    "commands:\n"
    "  launch PLAN.yaml [--single-process] [--steps N] [--out DIR] [--resume DIR]\n"
    "                   [--set k=v]... [--force]\n"
    "                     train the plan (see mmpipe launch --help)\n"
    "  data synth|tokenize|check ...\n"
    "                     make the demo data set, tokenize text, check a manifest\n"
    "  simulate PLAN.yaml [--costs RUN|metrics.jsonl] [--plan-devices N|all]\n"
    "                     predict step time and bubble of the plan's schedule\n"
    "  bench PLAN.yaml [--schedules LIST] [--microbatches LIST] [--placement NAME=K=V,...]\n"
    "                  [--balance LIST] [--steps N] [--warmup W] [--out DIR] [--set k=v]...\n"
    "                     run a grid of launches against the single-process baseline;\n"
    "                     results.csv, results.md and gnuplot charts\n"
    "  ckpt diff A B      compare two checkpoints tensor by tensor\n"
    "  devices            the CPU and the CUDA devices a plan can name here\n"
    "  stage ...          one stage process (started by launch)\n"
    "\n"
    "mmpipe <command> --help shows a command's options.\n";

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "launch") == 0) {
        return mmp_cmd_launch(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "data") == 0) {
        return mmp_cmd_data(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "stage") == 0) {
        return mmp_cmd_stage(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "simulate") == 0) {
        return mmp_cmd_simulate(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "bench") == 0) {
        return mmp_cmd_bench(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "devices") == 0) {
        return mmp_cmd_devices(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "ckpt") == 0) {
        return mmp_cmd_ckpt(argc - 1, argv + 1);
    }
    fprintf(stderr, "mmpipe: unknown command '%s'\n\n%s", cmd, USAGE);
    return 2;
}
