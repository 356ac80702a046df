/* JSONL manifests: one {"image": path, "text": caption} object per line.
 *
 * A line is a JSON object with string fields "image" (a path, relative to the
 * manifest's folder unless absolute) and "text" (the caption, not blank); an
 * optional "id" (string or number) is kept as text; other fields are parsed
 * for validity and ignored. Blank lines are skipped; a UTF-8 BOM is allowed.
 * Problems read "<manifest>:<line>: <reason>", e.g.
 *   train.jsonl:17: expected a string for "image"
 *   train.jsonl:3: not valid JSON at column 12: expected ':' after a key
 * An opened manifest keeps only (offset, length, line) per sample, 16 bytes,
 * and re-reads a line when asked for it. */
#ifndef MMP_DATA_MANIFEST_H
#define MMP_DATA_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MMP_MANIFEST_MAX_LINE (1 << 20) /* longer lines are a problem, not a sample */

typedef struct mmp_manifest_entry {
    int64_t line;      /* 1-based line number in the file */
    uint64_t offset;   /* byte offset of the line's first character */
    size_t length;     /* bytes, without the line end */
    const char *image; /* decoded "image", never empty; NULL on a problem line */
    const char *text;  /* decoded "text", never blank; NULL on a problem line */
    const char *id;    /* "id" (a string decoded, a number as written), or NULL */
    char *storage;     /* what image/text/id point into when the entry owns it */
} mmp_manifest_entry;

/* Frees what an entry from mmp_manifest_parse_line / mmp_manifest_read owns.
 * NULL-safe and idempotent. */
void mmp_manifest_entry_fini(mmp_manifest_entry *e);

/* Parses one line (without its line end) into *e, which then owns its
 * strings. On a problem returns MMP_ERR_DATA with the bare reason (no
 * path:line) in mmp_last_error() and leaves *e empty. */
mmp_err mmp_manifest_parse_line(const char *line, size_t len, mmp_manifest_entry *e);

/* Called for every non-blank line: problem is NULL and e fully set for a good
 * line, else problem is "<path>:<line>: <reason>" and e has only line,
 * offset and length. e's strings live until the call returns. Returning
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
/* NULL-safe. */
void mmp_manifest_close(mmp_manifest *m);

int64_t mmp_manifest_size(const mmp_manifest *m);
/* The path it was opened with. */
const char *mmp_manifest_path(const mmp_manifest *m);
/* Line number of sample i (0 <= i < size). */
int64_t mmp_manifest_line(const mmp_manifest *m, int64_t i);

/* Re-reads and parses sample i into *e (which then owns its strings; free
 * with mmp_manifest_entry_fini). Safe to call from several threads at once.
 * Errors name path:line (a line that changed since open is a problem too). */
mmp_err mmp_manifest_read(const mmp_manifest *m, int64_t i, mmp_manifest_entry *e);

#endif
