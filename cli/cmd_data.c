/* mmpipe data: make the demo set (synth), tokenize text, check a manifest.
 *
 * Argument parsing and printing only: the work is data/'s. Results go to
 * stdout, errors to stderr; exit status 0 ok, 1 failure (or, for check, any
 * problem found), 2 usage error. check reports problems and never stops at
 * the first one. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/progress.h"
#include "common/utf8.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/manifest.h"
#include "data/png.h"
#include "data/synth.h"
#include "data/tokenizer.h"

#define TOKENIZE_DEFAULT_MAX 512

static const char USAGE[] =
    "usage: mmpipe data <command> [options]\n"
    "\n"
    "commands:\n"
    "  synth --out DIR --samples N [--seed S] [--image-size N]\n"
    "                  write the synthetic shapes set (PNG images + JSONL + vocab.txt)\n"
    "  tokenize --vocab FILE [--max-len N]\n"
    "                  print the token ids of each line of stdin\n"
    "  check MANIFEST [--vocab FILE] [--decode [--max-pixels N]]\n"
    "                  report every bad line of a JSONL manifest\n"
    "\n"
    "mmpipe data <command> --help shows a command's options.\n";

static const char SYNTH_USAGE[] =
    "usage: mmpipe data synth --out DIR --samples N [--seed S] [--image-size N]\n"
    "\n"
    "Writes the synthetic shapes set to DIR (created if missing, files replaced):\n"
    "  images/NNNNNN.png  1-3 coloured shapes on a dark background\n"
    "  train.jsonl        N lines {\"image\": \"images/NNNNNN.png\", \"text\": caption}\n"
    "  val.jsonl          max(1, min(256, N/8)) more samples, not in train\n"
    "  vocab.txt          BERT vocab of the caption words\n"
    "The same seed always writes the same bytes.\n"
    "\n"
    "  --out DIR        where to write (required)\n"
    "  --samples N      training samples, 1..10000000 (required)\n"
    "  --seed S         an integer >= 0, default 1\n"
    "  --image-size N   pixels per side, 16..1024, default 32\n";

static const char TOKENIZE_USAGE[] =
    "usage: mmpipe data tokenize --vocab FILE [--max-len N]\n"
    "\n"
    "Reads text from stdin, one caption per line, and prints one line of\n"
    "space-separated token ids for each: [CLS] tokens [SEP], as the model sees\n"
    "them (lowercased, punctuation split, WordPiece, [UNK] for unknown words).\n"
    "\n"
    "  --vocab FILE     BERT vocab.txt, one token per line\n"
    "  --max-len N      truncate to N ids and pad with [PAD] to exactly N (N >= 2);\n"
    "                   without it: no padding, at most 512 ids\n";

static const char CHECK_USAGE[] =
    "usage: mmpipe data check MANIFEST [--vocab FILE] [--decode [--max-pixels N]]\n"
    "\n"
    "Reads a JSONL manifest line by line (in constant memory) and prints each\n"
    "problem as MANIFEST:LINE: reason: malformed JSON, a missing, duplicate or\n"
    "non-string field, invalid UTF-8, an empty caption, a missing or zero-size\n"
    "image file. Then one summary line: N non-blank lines, K problems (by\n"
    "kind ...).\n"
    "Progress goes to stderr when it is a terminal.\n"
    "\n"
    "  --vocab FILE     also tokenize every caption: a caption with no tokens is\n"
    "                   a problem; report the longest length and how many\n"
    "                   captions have unknown ([UNK]) words\n"
    "  --decode         also decode every image (PNG, JPEG incl. CMYK, GIF, WebP)\n"
    "                   as training does: undecodable or truncated images, and\n"
    "                   images of more pixels than the limit, are problems;\n"
    "                   report the image sizes\n"
    "  --max-pixels N   with --decode: the pixel limit (the plan's\n"
    "                   data.max_image_pixels; default PIL's 89478485)\n"
    "\n"
    "Exit status: 0 when there is no problem, 1 otherwise, 2 on usage errors.\n";

/* ---- argument helpers ------------------------------------------------------- */

static int is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* Matches argv[*i] against --name VALUE or --name=VALUE; on a match stores the
 * value (NULL when it is missing) and advances *i past it. */
static int take_opt(int argc, char **argv, int *i, const char *name, const char **value)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) {
        return 0;
    }
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != 0) {
        return 0;
    }
    *value = *i + 1 < argc ? argv[++*i] : NULL;
    return 1;
}

static int usage_error(const char *cmd, const char *usage, const char *fmt, const char *what)
{
    char name[32], msg[256];
    snprintf(name, sizeof name, "data %s", cmd);
    snprintf(msg, sizeof msg, fmt, what);
    return mmp_cli_usage_error(name, usage, "%s", msg);
}

/* A value option of a data subcommand and where its value goes. */
typedef struct {
    const char *name;
    const char **value;
} value_opt;

/* Parses argv[1..argc) of `mmpipe data cmd`, every argument one of opts
 * (--name V or --name=V). Returns MMP_CLI_GO to go on, 0 after -h/--help
 * (usage printed), 2 after a usage error (printed). */
static int take_opts(const char *cmd, const char *usage, const value_opt *opts, int n_opts,
                     int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (is_help(argv[i])) {
            fputs(usage, stdout);
            return 0;
        }
        int known = 0;
        for (int k = 0; k < n_opts && !known; k++) {
            if (take_opt(argc, argv, &i, opts[k].name, &v)) {
                *opts[k].value = v;
                known = 1;
            }
        }
        if (!known) {
            return usage_error(cmd, usage, "unknown argument '%s'", argv[i]);
        }
        if (!v) {
            return usage_error(cmd, usage, "%s needs a value", argv[i]);
        }
    }
    return MMP_CLI_GO;
}

static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s) {
        return 0;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        return 0;
    }
    *out = v;
    return 1;
}

/* ---- synth ------------------------------------------------------------------------ */

static int cmd_synth(int argc, char **argv)
{
    const char *out = NULL, *samples_s = NULL, *seed_s = "1", *size_s = "32";
    const value_opt opts[] = {
        {"--out", &out}, {"--samples", &samples_s}, {"--seed", &seed_s}, {"--image-size", &size_s}};
    int go = take_opts("synth", SYNTH_USAGE, opts, 4, argc, argv);
    if (go != MMP_CLI_GO) {
        return go;
    }
    long long samples, seed, size;
    if (!out || !*out) {
        return usage_error("synth", SYNTH_USAGE, "%s", "--out DIR is required");
    }
    if (!samples_s) {
        return usage_error("synth", SYNTH_USAGE, "%s", "--samples N is required");
    }
    if (!parse_int(samples_s, 1, 10000000, &samples)) {
        return usage_error("synth", SYNTH_USAGE, "--samples '%s': need an integer in [1, 10000000]",
                           samples_s);
    }
    if (!parse_int(seed_s, 0, INT64_MAX, &seed)) {
        return usage_error("synth", SYNTH_USAGE, "--seed '%s': need a non-negative integer",
                           seed_s);
    }
    if (!parse_int(size_s, MMP_SYNTH_MIN_IMAGE, MMP_SYNTH_MAX_IMAGE, &size)) {
        return usage_error("synth", SYNTH_USAGE, "--image-size '%s': need an integer in [16, 1024]",
                           size_s);
    }
    double t0 = mmp_now();
    if (mmp_synth_write(out, (int)samples, (uint64_t)seed, (int)size) != MMP_OK) {
        fprintf(stderr, "mmpipe data synth: %s\n", mmp_last_error());
        return 1;
    }
    double secs = mmp_now() - t0;
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", out);
    mmp_tokenizer *tok = NULL;
    if (mmp_tokenizer_load(&tok, vocab) != MMP_OK) {
        fprintf(stderr, "mmpipe data synth: wrote an unreadable vocab: %s\n", mmp_last_error());
        return 1;
    }
    int n_val = mmp_synth_val_count((int)samples);
    printf("wrote %s: %lld train + %d val samples (%lldx%lld, seed %lld) in %.2f s\n", out, samples,
           n_val, size, size, seed, secs);
    printf("  %s/train.jsonl\n  %s/val.jsonl\n  %s/vocab.txt (%d tokens)\n"
           "  %s/images/ (%lld PNG files)\n",
           out, out, out, mmp_tokenizer_vocab_size(tok), out, samples + n_val);
    mmp_tokenizer_destroy(tok);
    return 0;
}

/* ---- tokenize -------------------------------------------------------------------- */

static int cmd_tokenize(int argc, char **argv)
{
    const char *vocab = NULL, *max_s = NULL;
    const value_opt opts[] = {{"--vocab", &vocab}, {"--max-len", &max_s}};
    int go = take_opts("tokenize", TOKENIZE_USAGE, opts, 2, argc, argv);
    if (go != MMP_CLI_GO) {
        return go;
    }
    if (!vocab || !*vocab) {
        return usage_error("tokenize", TOKENIZE_USAGE, "%s", "--vocab FILE is required");
    }
    long long max_len = TOKENIZE_DEFAULT_MAX;
    if (max_s && !parse_int(max_s, 2, 1 << 20, &max_len)) {
        return usage_error("tokenize", TOKENIZE_USAGE,
                           "--max-len '%s': need an integer in [2, 1048576]", max_s);
    }
    mmp_tokenizer *tok = NULL;
    if (mmp_tokenizer_load(&tok, vocab) != MMP_OK) {
        fprintf(stderr, "mmpipe data tokenize: %s\n", mmp_last_error());
        return 1;
    }
    int rc = 0;
    int32_t *ids = malloc((size_t)max_len * sizeof *ids);
    char *line = NULL;
    size_t cap = 0;
    if (!ids) {
        fprintf(stderr, "mmpipe data tokenize: out of memory\n");
        rc = 1;
        goto exit;
    }
    ssize_t got;
    long lineno = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) {
            line[--got] = 0;
        }
        /* tokenized all the same (one output line per input line), but said:
         * a manifest refuses such a caption, so it is not what a run sees */
        size_t bad = mmp_utf8_check(line, (size_t)got);
        const char *nul = memchr(line, 0, bad);
        if (nul || bad < (size_t)got) {
            fprintf(stderr,
                    "mmpipe data tokenize: stdin:%ld:%zu: %s; the tokenizer drops it (a "
                    "manifest refuses such a caption)\n",
                    lineno, (size_t)((nul ? (size_t)(nul - line) : bad) + 1),
                    nul ? "a NUL byte" : "not UTF-8 text");
        }
        int n_real = 0;
        /* by length: a NUL byte in the line is text too (the tokenizer drops it) */
        mmp_tokenizer_encode_n(tok, line, (size_t)got, (int)max_len, ids, NULL, &n_real, NULL);
        int shown = max_s ? (int)max_len : n_real;
        for (int i = 0; i < shown; i++) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        putchar('\n');
    }
    if (ferror(stdin)) {
        fprintf(stderr, "mmpipe data tokenize: reading stdin: %s\n", strerror(errno));
        rc = 1;
    }
exit:
    free(line);
    free(ids);
    mmp_tokenizer_destroy(tok);
    return rc;
}

/* ---- check ------------------------------------------------------------------------- */

/* The live progress line appears after this long, on a terminal only. */
#define CHECK_PROGRESS_AFTER_S 1.0

typedef struct check_state {
    const char *manifest;
    mmp_tokenizer *tok;   /* NULL without --vocab */
    int decode;           /* --decode */
    long long max_pixels; /* --max-pixels (0: the default) */
    int64_t lines, problems;
    int64_t by_kind[MMP_PROBLEM_KINDS];
    int width, height;   /* of the first good image (--decode) */
    int64_t other_sizes; /* good images of another size */
    int64_t with_unk;    /* captions with an [UNK] */
    int max_tokens;      /* longest caption, [CLS] and [SEP] included */
    int32_t ids[TOKENIZE_DEFAULT_MAX];
    /* progress on a terminal */
    int tty, shown;
    double t0, last;
    uint64_t bytes;
} check_state;

static void clear_progress(check_state *st)
{
    if (st->shown) {
        fputs("\r\033[K", stderr);
        st->shown = 0;
    }
}

static void show_progress(check_state *st, uint64_t offset)
{
    if (!st->tty || st->lines % 1024 != 0) {
        return;
    }
    double now = mmp_now();
    if (now - st->t0 < CHECK_PROGRESS_AFTER_S || now - st->last < 0.2) {
        return;
    }
    st->last = now;
    fprintf(stderr, "\r\033[Kchecking: %lld lines, %lld problems, %.0f%%", (long long)st->lines,
            (long long)st->problems, st->bytes ? 100.0 * (double)offset / (double)st->bytes : 0.0);
    fflush(stderr);
    st->shown = 1;
}

static void report(check_state *st, mmp_sample_problem kind, int64_t line, const char *why)
{
    clear_progress(st);
    if (line > 0) {
        printf("%s:%lld: %s\n", st->manifest, (long long)line, why);
    } else {
        printf("%s\n", why); /* already "manifest:line: reason" */
    }
    st->problems++;
    st->by_kind[kind]++;
}

static mmp_err check_line(void *user, const mmp_manifest_entry *e, const char *problem)
{
    check_state *st = user;
    st->lines++;
    show_progress(st, e->offset);
    if (problem) {
        report(st, e->problem, 0, problem);
        return MMP_OK;
    }
    char path[4096];
    mmp_sample_problem kind = MMP_PROBLEM_MISSING_IMAGE;
    mmp_err err = mmp_manifest_resolve(st->manifest, e->image, path, sizeof path);
    if (err == MMP_OK) {
        err = mmp_dataset_check_file(path, &kind);
    }
    if (err != MMP_OK) {
        report(st, kind, e->line, mmp_last_error());
        return MMP_OK;
    }
    if (st->decode) {
        mmp_image img;
        if (mmp_image_read(path, st->max_pixels, &img) != MMP_OK) {
            report(st, mmp_image_too_large(&img) ? MMP_PROBLEM_LARGE_IMAGE : MMP_PROBLEM_BAD_IMAGE,
                   e->line, mmp_last_error());
            return MMP_OK;
        }
        if (st->width == 0) {
            st->width = img.width, st->height = img.height;
        } else if (img.width != st->width || img.height != st->height) {
            st->other_sizes++;
        }
        mmp_image_fini(&img);
    }
    if (st->tok) {
        int n_real = 0, n_unk = 0;
        mmp_tokenizer_encode(st->tok, e->text, TOKENIZE_DEFAULT_MAX, st->ids, NULL, &n_real,
                             &n_unk);
        if (n_real <= 2) {
            report(st, MMP_PROBLEM_BAD_CAPTION, e->line,
                   "caption has no tokens after normalisation");
            return MMP_OK;
        }
        st->with_unk += n_unk > 0;
        st->max_tokens = n_real > st->max_tokens ? n_real : st->max_tokens;
    }
    return MMP_OK;
}

/* "N non-blank lines, K problems (by kind: ...); G good samples; ..." */
static void print_summary(const check_state *st)
{
    const int64_t good = st->lines - st->problems;
    printf("%s: %lld non-blank line%s, %lld problem%s", st->manifest, (long long)st->lines,
           st->lines == 1 ? "" : "s", (long long)st->problems, st->problems == 1 ? "" : "s");
    if (st->problems) {
        const char *sep = " (by kind: ";
        for (int k = 1; k < MMP_PROBLEM_KINDS; k++) {
            if (st->by_kind[k]) {
                printf("%s%lld %s", sep, (long long)st->by_kind[k],
                       mmp_sample_problem_name((mmp_sample_problem)k));
                sep = ", ";
            }
        }
        printf(")");
    }
    printf("; %lld good sample%s", (long long)good, good == 1 ? "" : "s");
    if (st->decode && good > 0) {
        printf("; images %dx%d", st->width, st->height);
        if (st->other_sizes) {
            printf(" (and %lld of other sizes, resized when loaded)", (long long)st->other_sizes);
        }
    }
    if (st->tok && good > 0) {
        printf("; longest caption %d tokens, %lld with [UNK]", st->max_tokens,
               (long long)st->with_unk);
    }
    printf("\n");
}

static int cmd_check(int argc, char **argv)
{
    const char *manifest = NULL, *vocab = NULL;
    int decode = 0;
    long long max_pixels = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (is_help(argv[i])) {
            fputs(CHECK_USAGE, stdout);
            return 0;
        }
        if (take_opt(argc, argv, &i, "--vocab", &v)) {
            if (!v) {
                return usage_error("check", CHECK_USAGE, "%s needs a value", argv[i]);
            }
            vocab = v;
        } else if (strcmp(argv[i], "--decode") == 0) {
            decode = 1;
        } else if (take_opt(argc, argv, &i, "--max-pixels", &v)) {
            char *end = NULL;
            errno = 0;
            max_pixels = v ? strtoll(v, &end, 10) : 0;
            if (!v || !*v || *end || errno || max_pixels < 1) {
                return usage_error("check", CHECK_USAGE, "%s needs a positive integer",
                                   "--max-pixels");
            }
        } else if (argv[i][0] == '-' && argv[i][1] != 0) {
            return usage_error("check", CHECK_USAGE, "unknown argument '%s'", argv[i]);
        } else if (manifest) {
            return usage_error("check", CHECK_USAGE, "one manifest at a time ('%s')", argv[i]);
        } else {
            manifest = argv[i];
        }
    }
    if (!manifest) {
        return usage_error("check", CHECK_USAGE, "%s", "a MANIFEST is required");
    }
    if (max_pixels && !decode) {
        /* the limit is checked while decoding: without --decode it would do nothing */
        return usage_error("check", CHECK_USAGE, "%s", "--max-pixels applies with --decode");
    }
    check_state *st = calloc(1, sizeof *st);
    if (!st) {
        fprintf(stderr, "mmpipe data check: out of memory\n");
        return 1;
    }
    st->manifest = manifest;
    st->decode = decode;
    st->max_pixels = max_pixels;
    st->tty = isatty(2);
    st->t0 = mmp_now();
    struct stat sb;
    st->bytes = stat(manifest, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    int rc = 0;
    if (vocab && mmp_tokenizer_load(&st->tok, vocab) != MMP_OK) {
        fprintf(stderr, "mmpipe data check: %s\n", mmp_last_error());
        rc = 1;
        goto exit;
    }
    mmp_err err = mmp_manifest_scan(manifest, check_line, st);
    clear_progress(st);
    if (err != MMP_OK) {
        fprintf(stderr, "mmpipe data check: %s\n", mmp_last_error());
        rc = 1;
        goto exit;
    }
    print_summary(st);
    if (st->lines == 0) {
        printf("%s: no samples (the manifest is empty)\n", manifest);
    }
    rc = st->problems > 0 || st->lines == 0;
exit:
    mmp_tokenizer_destroy(st->tok);
    free(st);
    return rc;
}

int mmp_cmd_data(int argc, char **argv)
{
    static const mmp_cli_sub subs[] = {
        {"synth", cmd_synth},
        {"tokenize", cmd_tokenize},
        {"check", cmd_check},
    };
    return mmp_cli_dispatch("mmpipe data", USAGE, subs, 3, argc, argv);
}
