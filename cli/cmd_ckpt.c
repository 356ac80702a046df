/* mmpipe ckpt: verify checks checkpoints whole without loading them; diff
 * compares two checkpoints tensor by tensor; export and
 * import convert to and from safetensors (cli/cmd_ckpt_safetensors.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/ckpt.h"

static const char USAGE[] =
    "usage: mmpipe ckpt verify CKPT...\n"
    "       mmpipe ckpt diff A B [--tol X] [--quiet]\n"
    "       mmpipe ckpt export CKPT [--format safetensors] -o|--out FILE [--optimizer]\n"
    "       mmpipe ckpt import FILE.safetensors --plan PLAN.yaml [--set k=v]... -o|--out RUN_DIR\n"
    "\n"
    "verify: checks each checkpoint's files (a step directory, a run's ckpt/latest\n"
    "or a run directory) against its files.txt (every stage's file there, at the\n"
    "size it was written with, no other), then reads each front to back and\n"
    "checks each record and the file's checksum, keeping no tensor (memory does\n"
    "not grow with the checkpoint), and prints one line per checkpoint: its\n"
    "tensors and bytes, or what is wrong and where. A step written before mmpipe\n"
    "wrote files.txt is checked file by file and says so (a lost file would not\n"
    "show). Exit status: 0 when every one is whole; 1 otherwise; 2 on usage errors.\n"
    "\n"
    "diff: A and B are checkpoint directories (ckpt/step_NNNNNNN), a run's ckpt/latest,\n"
    "or run directories (their ckpt/latest is used). Prints one line per tensor\n"
    "that differs (--quiet: only the tensors one side lacks or holds in another\n"
    "shape), then the tensor counts; the last line is\n"
    "  max_abs_diff=<x> max_rel_diff=<y>\n"
    "where rel = |a-b| / max(|a|,|b|) per element (0 where both are 0).\n"
    "Exit status: 0 when both hold the same tensors with the same shapes (and,\n"
    "with --tol, max_rel_diff <= X); 1 otherwise; 2 on usage errors.\n"
    "\n"
    "export: writes the checkpoint's parameters and batch-norm statistics as one\n"
    "safetensors file (F32, mmpipe's names and layouts, e.g. image.layer1.0.conv1.weight\n"
    "(out,in,kh,kw), linear weights (out,in)); PyTorch loads it with safetensors or\n"
    "bench/torch/mmpipe_ref.py. --optimizer adds the AdamW moments (<name>.adam_m,\n"
    "<name>.adam_v). Metadata: format=mmpipe, step=<steps done>. safetensors is the\n"
    "one --format (and the default).\n"
    "\n"
    "import: reads FILE (untrusted: every offset, shape and dtype is checked; errors\n"
    "name FILE:byte-offset and the tensor), loads it into the model PLAN describes\n"
    "(every parameter and batch-norm buffer must be there with its shape; a name the\n"
    "model lacks is an error; the vocabulary size is text.embed.wte's rows) and\n"
    "writes RUN_DIR/ckpt/step_0000000 + ckpt/latest (RUN_DIR must hold no checkpoints\n"
    "yet). AdamW moments the file lacks start at zero. Train from it with:\n"
    "  mmpipe launch PLAN.yaml --resume RUN_DIR\n"
    "or, for a new run with fresh moments, skip the import:\n"
    "  mmpipe launch PLAN.yaml --init-from FILE.safetensors\n";

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

/* export and import: argv[1] is the subcommand. */
static int convert(int argc, char **argv)
{
    const char *cmd = argv[1], *src = NULL, *out = NULL, *format = NULL, *plan = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0, optimizer = 0, ret = 2;
    if (!sets) {
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc && !mmp_cli_is_option(argv[i + 1]);
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(USAGE, stdout);
            ret = 0;
            goto exit;
        } else if ((strcmp(a, "-o") == 0 || strcmp(a, "--out") == 0) && has_value) {
            out = argv[++i];
        } else if (strcmp(a, "--format") == 0 && has_value) {
            format = argv[++i];
        } else if (strcmp(a, "--plan") == 0 && has_value && cmd[0] == 'i') {
            plan = argv[++i];
        } else if (strcmp(a, "--set") == 0 && has_value && cmd[0] == 'i') {
            sets[n_sets++] = argv[++i];
        } else if (strcmp(a, "--optimizer") == 0 && cmd[0] == 'e') {
            optimizer = 1;
        } else if (!has_value &&
                   (strcmp(a, "-o") == 0 || strcmp(a, "--out") == 0 || strcmp(a, "--format") == 0 ||
                    strcmp(a, "--plan") == 0 || strcmp(a, "--set") == 0)) {
            const char *next = i + 1 < argc ? argv[i + 1] : NULL;
            mmp_cli_usage_error(cmd[0] == 'e' ? "ckpt export" : "ckpt import", USAGE,
                                next ? "%s needs a value, not the option '%s'" : "%s needs a value",
                                a, next ? next : "");
            goto exit;
        } else if (a[0] == '-' || src) {
            mmp_cli_usage_error(cmd[0] == 'e' ? "ckpt export" : "ckpt import", USAGE,
                                "unexpected '%s'", a);
            goto exit;
        } else {
            src = a;
        }
    }
    if (format && strcmp(format, "safetensors") != 0) {
        fprintf(stderr, "mmpipe ckpt %s: --format %s: only safetensors is known\n", cmd, format);
    } else if (!src || !out) {
        mmp_cli_usage_error(cmd[0] == 'e' ? "ckpt export" : "ckpt import", USAGE,
                            "needs a %s and -o", cmd[0] == 'e' ? "checkpoint" : "safetensors file");
    } else if (cmd[0] == 'i' && !plan) {
        fprintf(stderr, "mmpipe ckpt import: needs --plan PLAN.yaml (the model to load into)\n");
    } else {
        ret = cmd[0] == 'e' ? mmp_ckpt_export(src, out, optimizer)
                            : mmp_ckpt_import(src, plan, sets, n_sets, out);
    }
exit:
    free(sets);
    return ret;
}

typedef struct verify_count {
    long tensors;
    int64_t bytes;
    int has_step; /* meta.step seen: train.ckpt, written after the stages' files */
} verify_count;

static int count_none(void *ctx, const char *name)
{
    verify_count *k = ctx;
    k->tensors++;
    k->has_step |= strcmp(name, "meta.step") == 0;
    return 0; /* checked, not kept */
}

static void verify_progress(void *ctx, const char *unit, int64_t done, int64_t total)
{
    (void)unit;
    (void)done;
    ((verify_count *)ctx)->bytes = total;
}

/* mmpipe ckpt verify CKPT...: every file checked, nothing kept. */
static int verify(int argc, char **argv)
{
    int n = 0, bad = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (argv[i][0] == '-') {
            return mmp_cli_usage_error("ckpt verify", USAGE, "unexpected '%s'", argv[i]);
        }
    }
    for (int i = 2; i < argc; i++, n++) {
        verify_count k = {0, 0, 0};
        int listed = 0;
        mmp_ckpt_read_opts o = {.progress = verify_progress,
                                .progress_ctx = &k,
                                .want = count_none,
                                .want_ctx = &k,
                                .file_list = &listed};
        mmp_ckpt c;
        if (mmp_ckpt_read_dir_opts(&c, argv[i], &o) != MMP_OK) {
            printf("%s: bad: %s\n", argv[i], mmp_last_error());
            bad++;
        } else if (!listed && !k.has_step) {
            printf("%s: bad: no meta.step (train.ckpt), and no %s: not a whole checkpoint (both "
                   "are written after the stages' files)\n",
                   argv[i], MMP_CKPT_FILE_LIST);
            bad++;
        } else if (listed) {
            printf("%s: ok: %ld tensors, %lld bytes, every file, checksum and record checked\n",
                   argv[i], k.tensors, (long long)k.bytes);
        } else {
            printf("%s: ok: %ld tensors, %lld bytes, every checksum and record checked (no %s: "
                   "written before mmpipe listed a step's files, so a lost file would not show)\n",
                   argv[i], k.tensors, (long long)k.bytes, MMP_CKPT_FILE_LIST);
        }
        mmp_ckpt_fini(&c);
    }
    if (n == 0) {
        return mmp_cli_usage_error("ckpt verify", USAGE, "needs a checkpoint");
    }
    return bad ? 1 : 0;
}

int mmp_cmd_ckpt(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "export") == 0 || strcmp(argv[1], "import") == 0) {
        return convert(argc, argv);
    }
    if (strcmp(argv[1], "verify") == 0) {
        return verify(argc, argv);
    }
    if (strcmp(argv[1], "diff") != 0) {
        return mmp_cli_usage_error("ckpt", USAGE, "unknown subcommand '%s'", argv[1]);
    }
    const char *paths[2] = {NULL, NULL};
    int np = 0, quiet = 0;
    double tol = -1;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--tol") == 0 && i + 1 < argc) {
            char *end;
            tol = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(tol >= 0) || isinf(tol)) {
                fprintf(stderr, "mmpipe ckpt diff: --tol %s: wants a finite number >= 0\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (argv[i][0] == '-' || np == 2) {
            return mmp_cli_usage_error("ckpt diff", USAGE, "unexpected '%s'", argv[i]);
        } else {
            paths[np++] = argv[i];
        }
    }
    if (np != 2) {
        return mmp_cli_usage_error("ckpt diff", USAGE, "needs two checkpoints");
    }
    return diff(paths[0], paths[1], tol, quiet);
}
