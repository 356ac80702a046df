/* JSONL manifests: one {"image": path, "text": caption} object per line.
 *
 * A line is a JSON object with string fields "image" (a path, relative to the
 * manifest's folder unless absolute) and "text" (the caption, not blank); an
 * optional "id" (string or number) is kept as text; other fields are parsed
 * for validity and ignored. Blank lines are skipped; a UTF-8 BOM is allowed.
 * Problems read "<manifest>:<line>: <reason>", e.g.
 *   train.jsonl:17: expected a string for "image"
 *   train.jsonl:3: not valid JSON at column 12: expected ':' after a key
 * An opened manifest keeps 8 bytes per sample (the line's byte offset and
 * length packed in one uint64; line numbers are derived, costing 16 bytes
 * per run of blank or left-out lines, none in a clean file) and re-reads a
 * line when asked for it: a manifest's captions are never held in memory. */
#ifndef MMP_DATA_MANIFEST_H
#define MMP_DATA_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MMP_MANIFEST_MAX_LINE (1 << 20) /* longer lines are a problem, not a sample */

/* What is wrong with a sample, for counting problems by kind: the first
 * kinds are the manifest line's, the last ones are found by whoever opens
 * the image or tokenises the caption (the dataset, `mmpipe data check`). */
typedef enum mmp_sample_problem {
    MMP_PROBLEM_NONE = 0,
    MMP_PROBLEM_JSON,            /* not valid JSON, or not an object */
    MMP_PROBLEM_MISSING_FIELD,   /* no "image" or no "text" */
    MMP_PROBLEM_FIELD_TYPE,      /* "image"/"text" not a string, "id" not a string or number */
    MMP_PROBLEM_DUPLICATE_FIELD, /* "image", "text" or "id" twice */
    MMP_PROBLEM_UTF8,            /* invalid UTF-8, a lone surrogate, or a NUL in a string */
    MMP_PROBLEM_EMPTY_PATH,      /* "image": "" */
    MMP_PROBLEM_EMPTY_CAPTION,   /* empty or only whitespace */
    MMP_PROBLEM_LONG_LINE,       /* longer than MMP_MANIFEST_MAX_LINE */
    MMP_PROBLEM_MISSING_IMAGE,   /* no such file (or not a regular file) */
    MMP_PROBLEM_EMPTY_IMAGE,     /* a zero-size file */
    MMP_PROBLEM_BAD_IMAGE,       /* unreadable, truncated, not a PNG/JPEG/GIF/WebP, absurd size */
    MMP_PROBLEM_BAD_CAPTION,     /* no tokens left after normalisation */
    MMP_PROBLEM_LARGE_IMAGE,     /* more pixels than data.max_image_pixels (data check --decode) */
    MMP_PROBLEM_KINDS
} mmp_sample_problem;

/* A short name for p ("malformed JSON", "missing image", ...). Never NULL. */
const char *mmp_sample_problem_name(mmp_sample_problem p);

typedef struct mmp_manifest_entry {
    int64_t line;               /* 1-based line number in the file */
    uint64_t offset;            /* byte offset of the line's first character */
    size_t length;              /* bytes, without the line end */
    const char *image;          /* decoded "image", never empty; NULL on a problem line */
    const char *text;           /* decoded "text", never blank; NULL on a problem line */
    const char *id;             /* "id" (a string decoded, a number as written), or NULL */
    char *storage;              /* what image/text/id point into when the entry owns it */
    mmp_sample_problem problem; /* on a problem line, its kind; else MMP_PROBLEM_NONE */
} mmp_manifest_entry;

/* Frees what an entry from mmp_manifest_parse_line / mmp_manifest_read owns.
 * NULL-safe and idempotent. */
void mmp_manifest_entry_fini(mmp_manifest_entry *e);

/* Parses one line (without its line end) into *e, which then owns its
 * strings. On a problem returns MMP_ERR_DATA with the bare reason (no
 * path:line) in mmp_last_error() and leaves *e empty but for e->problem. */
mmp_err mmp_manifest_parse_line(const char *line, size_t len, mmp_manifest_entry *e);

/* Called for every non-blank line: problem is NULL and e fully set for a good
 * line, else problem is "<path>:<line>: <reason>" and e has only line,
 * offset, length and problem. e's strings live until the call returns. Returning
 * anything but MMP_OK stops the walk with that error. */
typedef mmp_err (*mmp_manifest_visit)(void *user, const mmp_manifest_entry *e, const char *problem);

/* Walks every line of the file at path in order. Returns MMP_ERR_IO if it
 * cannot be read, the visitor's error if it stopped the walk, else MMP_OK
 * (bad lines are reported to the visitor, not returned). */
mmp_err mmp_manifest_scan(const char *path, mmp_manifest_visit visit, void *user);

/* Writes the path of an entry's image to out: image itself when absolute,
 * else joined to the folder of manifest_path. MMP_ERR_INVALID if it does
 * not fit in n bytes. */
mmp_err mmp_manifest_resolve(const char *manifest_path, const char *image, char *out, size_t n);

typedef struct mmp_manifest mmp_manifest;

/* Opens and validates the manifest: the first bad line is an MMP_ERR_DATA
 * naming path:line; an empty manifest is an error too. check (may be NULL)
 * is called for every good line as well and may reject it the same way (the
 * dataset checks that images exist). On success *out is the caller's. */
mmp_err mmp_manifest_open(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                          void *user);
/* As mmp_manifest_open, but a bad line (or one that check rejects with
 * MMP_ERR_DATA) is left out of the index, logged (the first few) and
 * counted, instead of failing; only a manifest with no good line is an
 * error. The index depends on the file alone when check is NULL or a pure
 * function of the line, so every process that opens the same file gets the
 * same samples in the same order. */
mmp_err mmp_manifest_open_skip(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                               void *user);
/* Progress of an open that takes a while (tens of millions of lines):
 * called with unit "bytes counted" (done of total bytes) every 256 KiB while
 * the lines are counted first, then with unit "lines" (done of total lines)
 * every MMP_MANIFEST_PROGRESS_LINES lines and once at the end. Runs on the
 * opening thread; must not call back into the manifest. */
#define MMP_MANIFEST_PROGRESS_LINES 4096
typedef void (*mmp_manifest_progress)(void *ctx, const char *unit, int64_t done, int64_t total);

/* mmp_manifest_open (skip 0) or mmp_manifest_open_skip (skip 1), reporting
 * progress (may be NULL) with ctx. */
mmp_err mmp_manifest_open_progress(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                                   void *user, int skip, mmp_manifest_progress progress, void *ctx);
/* NULL-safe. */
void mmp_manifest_close(mmp_manifest *m);

int64_t mmp_manifest_size(const mmp_manifest *m);
/* Bad lines mmp_manifest_open_skip left out (0 after mmp_manifest_open). */
int64_t mmp_manifest_dropped(const mmp_manifest *m);
/* Bytes the index holds on the heap (for tests and the memory budget). */
size_t mmp_manifest_index_bytes(const mmp_manifest *m);
/* The path it was opened with. */
const char *mmp_manifest_path(const mmp_manifest *m);
/* Line number of sample i (0 <= i < size). */
int64_t mmp_manifest_line(const mmp_manifest *m, int64_t i);

/* Re-reads and parses sample i into *e (which then owns its strings; free
 * with mmp_manifest_entry_fini). Safe to call from several threads at once.
 * Errors name path:line (a line that changed since open is a problem too). */
mmp_err mmp_manifest_read(const mmp_manifest *m, int64_t i, mmp_manifest_entry *e);

#endif
