/* mmpipe: dispatches to a subcommand. */
#include <stdio.h>

#include "cli/cli.h"

static const char USAGE[] =
    "usage: mmpipe <command> [args]\n"
    "\n"
    "commands:\n"
    "  launch PLAN.yaml [--single-process] [--steps N] [--out DIR] [--resume DIR]\n"
    "                   [--init-from FILE.safetensors] [--set k=v]... [--force]\n"
    "                     train the plan (see mmpipe launch --help)\n"
    "  data synth|tokenize|check ...\n"
    "                     make the demo data set, tokenize text, check a manifest\n"
    "  simulate PLAN.yaml [--costs RUN|metrics.jsonl] [--plan-devices N|all\n"
    "                     [--device-memory SIZE]] [--plan-cores N|all] [--dump] [--set k=v]...\n"
    "                     predict step time and bubble of the plan's schedule\n"
    "  bench PLAN.yaml [--schedules LIST] [--microbatches LIST] [--placement NAME=K=V,...]\n"
    "                  [--balance LIST] [--precisions LIST] [--steps N] [--warmup W]\n"
    "                  [--out DIR] [--force] [--set k=v]... [--no-single] [--dry-run]\n"
    "                     run a grid of launches against the single-process baseline;\n"
    "                     results.csv, results.md and gnuplot charts\n"
    "  ckpt diff A B      compare two checkpoints tensor by tensor\n"
    "  ckpt export CKPT --format safetensors -o FILE | ckpt import FILE --plan PLAN -o RUN\n"
    "                     weights to and from safetensors (PyTorch's names and layouts)\n"
    "  devices            the CPU and the CUDA devices a plan can name here\n"
    "  agent --key-file FILE [--listen [HOST:]PORT] | agent --new-key FILE\n"
    "                     start stages on this node for plans with launcher: agent\n"
    "  stage ...          one stage process (started by launch)\n"
    "  rexec ...          run a stage through an agent (started by launch)\n"
    "\n"
    "mmpipe <command> --help shows a command's options.\n";

static const mmp_cli_sub COMMANDS[] = {
    {"launch", mmp_cmd_launch},     {"data", mmp_cmd_data},   {"stage", mmp_cmd_stage},
    {"simulate", mmp_cmd_simulate}, {"bench", mmp_cmd_bench}, {"devices", mmp_cmd_devices},
    {"ckpt", mmp_cmd_ckpt},         {"agent", mmp_cmd_agent}, {"rexec", mmp_cmd_rexec},
};

int main(int argc, char **argv)
{
    return mmp_cli_dispatch("mmpipe", USAGE, COMMANDS, (int)(sizeof COMMANDS / sizeof COMMANDS[0]),
                            argc, argv);
}
