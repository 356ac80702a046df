/* mmpipe: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>

#include "cli/cli.h"

#ifndef MMP_VERSION
#define MMP_VERSION "unknown"
#endif

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
    "  bench PLAN.yaml|--plan PLAN.yaml [--schedules LIST] [--microbatches LIST]\n"
    "                  [--placement NAME=K=V,...] [--balance LIST] [--precisions LIST]\n"
    "                  [--steps N] [--warmup W] [--out DIR] [--force] [--set k=v]...\n"
    "                  [--no-single] [--dry-run]\n"
    "                     run a grid of launches against the single-process baseline;\n"
    "                     results.csv, results.md and gnuplot charts\n"
    "  ckpt verify CKPT...\n"
    "                     check checkpoints whole (their files, records, checksums)\n"
    "  ckpt diff A B      compare two checkpoints tensor by tensor\n"
    "  ckpt export CKPT --format safetensors -o FILE | ckpt import FILE --plan PLAN -o RUN\n"
    "                     weights to and from safetensors (PyTorch's names and layouts)\n"
    "  devices            the CPU and the CUDA devices a plan can name here\n"
    "  agent --key-file FILE [--listen [HOST:]PORT] | agent --new-key FILE\n"
    "                     start stages on this node for plans with launcher: agent\n"
    "  stage ...          one stage process (started by launch)\n"
    "  rexec ...          run a stage through an agent (started by launch)\n"
    "\n"
    "mmpipe <command> --help shows a command's options; mmpipe --version its version.\n";

static const mmp_cli_sub COMMANDS[] = {
    {"launch", mmp_cmd_launch},     {"data", mmp_cmd_data},   {"stage", mmp_cmd_stage},
    {"simulate", mmp_cmd_simulate}, {"bench", mmp_cmd_bench}, {"devices", mmp_cmd_devices},
    {"ckpt", mmp_cmd_ckpt},         {"agent", mmp_cmd_agent}, {"rexec", mmp_cmd_rexec},
};

/* A stage (or an agent's relay) is started as /proc/self/exe, so the kernel
 * names it "exe": renamed "mmpipe", so pgrep, killall and top find it
 * under the name a user looks for. */
static void name_process(void)
{
    char comm[32] = {0};
    FILE *f = fopen("/proc/self/comm", "r");
    if (f) {
        if (!fgets(comm, sizeof comm, f)) {
            comm[0] = 0;
        }
        fclose(f);
    }
    if (strcmp(comm, "exe\n") == 0) {
        prctl(PR_SET_NAME, "mmpipe", 0, 0, 0);
    }
}

int main(int argc, char **argv)
{
    name_process();
    if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
        if (argc > 2) {
            fprintf(stderr, "mmpipe: --version takes nothing after it, got '%s'\n", argv[2]);
            return 2;
        }
        printf("mmpipe %s\n", MMP_VERSION);
        return 0;
    }
    return mmp_cli_dispatch("mmpipe", USAGE, COMMANDS, (int)(sizeof COMMANDS / sizeof COMMANDS[0]),
                            argc, argv);
}
