/* Argument handling shared by the commands: subcommand dispatch, and the
 * options of those that take a plan. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/schema.h"

int mmp_cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mmpipe %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    /* the synopsis only: a whole --help would scroll the message away */
    const char *end = strstr(usage, "\n\n");
    int n = end ? (int)(end - usage) : (int)strlen(usage);
    fprintf(stderr, "\n%.*s\n(mmpipe %s --help: every option)\n", n, usage, cmd);
    return 2;
}

int mmp_cli_is_option(const char *arg)
{
    return arg[0] == '-' && (arg[1] == '-' || isalpha((unsigned char)arg[1]));
}

int mmp_cli_take_plan(const char *cmd, const char *usage, const char *arg, const char **plan_path)
{
    if (arg[0] == '-') {
        return mmp_cli_usage_error(cmd, usage, "unknown option '%s'", arg);
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
        return mmp_cli_usage_error(cmd, usage, "no plan given");
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

int mmp_cli_dispatch(const char *prog, const char *usage, const mmp_cli_sub *subs, int n_subs,
                     int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (mmp_cli_help(argv[1], usage)) {
        return 0;
    }
    for (int k = 0; k < n_subs; k++) {
        if (strcmp(argv[1], subs[k].name) == 0) {
            return subs[k].run(argc - 1, argv + 1);
        }
    }
    const char *near = NULL;
    for (int k = 0; k < n_subs && !near; k++) {
        if (mmp_schema_edit_distance(argv[1], subs[k].name) <= 2) {
            near = subs[k].name;
        }
    }
    if (near) {
        fprintf(stderr, "%s: unknown command '%s' (did you mean '%s'?)\n", prog, argv[1], near);
    } else {
        fprintf(stderr, "%s: unknown command '%s'\n\n%s", prog, argv[1], usage);
    }
    return 2;
}

/* Applies option o, whose value (if it takes one) is v. 0, or 2 (printed). */
static int take_option(const char *cmd, const mmp_cli_opt *o, const char *v, mmp_cli_args *args)
{
    switch (o->kind) {
    case MMP_CLI_FLAG:
        *(int *)o->out = 1;
        return 0;
    case MMP_CLI_VALUE:
        *(const char **)o->out = v;
        return 0;
    case MMP_CLI_SET:
        args->sets[args->n_sets++] = v;
        return 0;
    case MMP_CLI_STEPS: {
        char *end;
        long n = strtol(v, &end, 10);
        if (!*v || *end || n < 0 || n > 1000000000) {
            fprintf(stderr, "mmpipe %s: %s wants an integer 0..1000000000, got '%s'\n", cmd,
                    o->name, v);
            return 2;
        }
        snprintf(args->steps_set, sizeof args->steps_set, "job.steps=%ld", n);
        args->sets[args->n_sets++] = args->steps_set;
        return 0;
    }
    }
    return 2;
}

int mmp_cli_parse(const char *cmd, const char *usage, const mmp_cli_opt *opts, int n_opts, int argc,
                  char **argv, mmp_cli_args *args)
{
    memset(args, 0, sizeof *args);
    /* every argument could be a --set */
    args->sets = calloc((size_t)argc + 1, sizeof *args->sets);
    if (!args->sets) {
        return 1;
    }
    unsigned long long given = 0; /* the value options seen, by index */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (mmp_cli_help(a, usage)) {
            return 0;
        }
        const mmp_cli_opt *o = NULL;
        int k = 0;
        for (; k < n_opts && !o; k++) {
            if (strcmp(a, opts[k].name) == 0) {
                o = &opts[k];
            }
        }
        /* a value option twice (`--steps 2 ... --steps 3`): which one was
         * meant? (--set is made to repeat) */
        if (o && (o->kind == MMP_CLI_VALUE || o->kind == MMP_CLI_STEPS) && k - 1 < 64) {
            if (given & (1ull << (k - 1))) {
                return mmp_cli_usage_error(cmd, usage, "%s given twice", a);
            }
            given |= 1ull << (k - 1);
        }
        if (o && o->kind != MMP_CLI_FLAG && i + 1 >= argc) {
            return mmp_cli_usage_error(cmd, usage, "%s needs a value", a);
        }
        if (o && o->kind != MMP_CLI_FLAG && mmp_cli_is_option(argv[i + 1])) {
            return mmp_cli_usage_error(cmd, usage, "%s needs a value, not the option '%s'", a,
                                       argv[i + 1]);
        }
        if (o && o->kind == MMP_CLI_VALUE && !argv[i + 1][0]) {
            return mmp_cli_usage_error(cmd, usage, "%s needs a value, got an empty one", a);
        }
        int rc = o ? take_option(cmd, o, o->kind == MMP_CLI_FLAG ? NULL : argv[++i], args)
                   : mmp_cli_take_plan(cmd, usage, a, &args->plan);
        if (rc != 0) {
            return rc;
        }
    }
    int rc = mmp_cli_need_plan(cmd, usage, args->plan);
    return rc != 0 ? rc : MMP_CLI_GO;
}

void mmp_cli_args_fini(mmp_cli_args *args)
{
    free(args->sets);
    args->sets = NULL;
    args->n_sets = 0;
}
