/* mmpipe ckpt diff: compare two checkpoints tensor by tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/ckpt.h"

static const char USAGE[] =
    "usage: mmpipe ckpt diff A B [--tol X] [--quiet]\n"
    "\n"
    "A and B are checkpoint directories (ckpt/step_NNNNNNN), a run's ckpt/latest,\n"
    "or run directories (their ckpt/latest is used). Prints one line per tensor\n"
    "that differs; the last line is\n"
    "  max_abs_diff=<x> max_rel_diff=<y>\n"
    "where rel = |a-b| / max(|a|,|b|) per element (0 where both are 0).\n"
    "Exit status: 0 when both hold the same tensors with the same shapes (and,\n"
    "with --tol, max_rel_diff <= X); 1 otherwise; 2 on usage errors.\n";

static double value_at(const mmp_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case MMP_F32:
        return ((const float *)t->data)[i];
    case MMP_I32:
        return ((const int32_t *)t->data)[i];
    case MMP_BF16:
        return mmp_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case MMP_F16:
        return mmp_f16_to_f32(((const uint16_t *)t->data)[i]);
    }
    return 0;
}

static int same_shape(const mmp_tensor *a, const mmp_tensor *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype) {
        return 0;
    }
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] != b->shape[i]) {
            return 0;
        }
    }
    return 1;
}

static int diff(const char *pa, const char *pb, double tol, int quiet)
{
    mmp_ckpt a, b;
    if (mmp_ckpt_read_dir(&a, pa) != MMP_OK) {
        fprintf(stderr, "mmpipe ckpt diff: %s\n", mmp_last_error());
        return 1;
    }
    if (mmp_ckpt_read_dir(&b, pb) != MMP_OK) {
        fprintf(stderr, "mmpipe ckpt diff: %s\n", mmp_last_error());
        mmp_ckpt_fini(&a);
        return 1;
    }
    int structural = 0;
    double max_abs = 0, max_rel = 0;
    for (int i = 0; i < a.count; i++) {
        const mmp_ckpt_entry *ea = &a.entries[i];
        const mmp_ckpt_entry *eb = mmp_ckpt_find(&b, ea->name);
        char sa[96], sb[96];
        if (!eb) {
            printf("only in A: %s %s\n", ea->name, mmp_shape_str(&ea->t, sa, sizeof sa));
            structural = 1;
            continue;
        }
        if (!same_shape(&ea->t, &eb->t)) {
            printf("shape differs: %s %s %s vs %s %s\n", ea->name, mmp_dtype_name(ea->t.dtype),
                   mmp_shape_str(&ea->t, sa, sizeof sa), mmp_dtype_name(eb->t.dtype),
                   mmp_shape_str(&eb->t, sb, sizeof sb));
            structural = 1;
            continue;
        }
        double t_abs = 0, t_rel = 0;
        int64_t n = mmp_tensor_numel(&ea->t), n_diff = 0;
        for (int64_t k = 0; k < n; k++) {
            double x = value_at(&ea->t, k), y = value_at(&eb->t, k);
            double d = fabs(x - y);
            if (isnan(x) != isnan(y)) {
                d = INFINITY;
            } else if (isnan(x)) {
                d = 0;
            }
            double den = fmax(fabs(x), fabs(y));
            double r = d == 0 ? 0 : (den > 0 ? d / den : INFINITY);
            n_diff += d != 0;
            t_abs = fmax(t_abs, d);
            t_rel = fmax(t_rel, r);
        }
        if (n_diff && !quiet) {
            printf("%s: %lld of %lld differ, max_abs=%.3g max_rel=%.3g\n", ea->name,
                   (long long)n_diff, (long long)n, t_abs, t_rel);
        }
        max_abs = fmax(max_abs, t_abs);
        max_rel = fmax(max_rel, t_rel);
    }
    for (int i = 0; i < b.count; i++) {
        if (!mmp_ckpt_find(&a, b.entries[i].name)) {
            char sb[96];
            printf("only in B: %s %s\n", b.entries[i].name,
                   mmp_shape_str(&b.entries[i].t, sb, sizeof sb));
            structural = 1;
        }
    }
    printf("tensors: %d in A, %d in B\n", a.count, b.count);
    printf("max_abs_diff=%.9g max_rel_diff=%.9g\n", max_abs, max_rel);
    mmp_ckpt_fini(&a);
    mmp_ckpt_fini(&b);
    if (structural) {
        return 1;
    }
    return tol >= 0 && max_rel > tol ? 1 : 0;
}

int mmp_cmd_ckpt(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "diff") != 0) {
        fprintf(stderr, "mmpipe ckpt: unknown subcommand '%s'\n\n%s", argv[1], USAGE);
        return 2;
    }
    const char *paths[2] = {NULL, NULL};
    int np = 0, quiet = 0;
    double tol = -1;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--tol") == 0 && i + 1 < argc) {
            char *end;
            tol = strtod(argv[++i], &end);
            if (*end || tol < 0) {
                fprintf(stderr, "mmpipe ckpt diff: --tol wants a number >= 0\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (argv[i][0] == '-' || np == 2) {
            fprintf(stderr, "mmpipe ckpt diff: unexpected '%s'\n\n%s", argv[i], USAGE);
            return 2;
        } else {
            paths[np++] = argv[i];
        }
    }
    if (np != 2) {
        fprintf(stderr, "mmpipe ckpt diff: needs two checkpoints\n\n%s", USAGE);
        return 2;
    }
    return diff(paths[0], paths[1], tol, quiet);
}
