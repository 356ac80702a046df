/* Argument handling shared by the commands that take a plan. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int mmp_cli_take_plan(const char *cmd, const char *usage, const char *arg, const char **plan_path)
{
    if (arg[0] == '-') {
        fprintf(stderr, "mmpipe %s: unknown or incomplete option '%s'\n\n%s", cmd, arg, usage);
        return 2;
    }
    if (*plan_path) {
        fprintf(stderr, "mmpipe %s: one plan only ('%s' and '%s')\n", cmd, *plan_path, arg);
        return 2;
    }
    *plan_path = arg;
    return 0;
}

int mmp_cli_need_plan(const char *cmd, const char *usage, const char *plan_path)
{
    if (!plan_path) {
        fprintf(stderr, "mmpipe %s: no plan given\n\n%s", cmd, usage);
        return 2;
    }
    return 0;
}

int mmp_cli_help(const char *arg, const char *usage)
{
    if (strcmp(arg, "-h") != 0 && strcmp(arg, "--help") != 0) {
        return 0;
    }
    fputs(usage, stdout);
    return 1;
}
