/* A typed-YAML schema engine: a table of keys (dotted path, type, range,
 * default, place in a struct) loads a YAML file into that struct.
 *
 * Internal to common/: the plan (common/plan*.c) is its one user, and
 * config.h stays the public contract. This header is the contract between
 * the engine (common/schema.c, common/schema_value.c) and a key table: the
 * engine knows YAML, positions, types and ranges, never which keys exist.
 *
 * Every error the engine reports names file:line:column (or the --set
 * override the value came from) and the dotted key, and goes up through
 * mmp_errorf() as MMP_ERR_CONFIG. The engine never prints (libfyaml's
 * diagnostics are collected, not written to stderr), never exits, and keeps
 * no state between calls. */
#ifndef MMP_COMMON_SCHEMA_H
#define MMP_COMMON_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/err.h"

/* Longest dotted key built while loading, list indices included
 * ("hosts[15].devices[63]"). */
#define MMP_SCHEMA_KEY_MAX 256
/* mmp_key_spec.field of a key that is checked but not stored. */
#define MMP_KEY_NO_FIELD ((size_t)-1)

typedef enum mmp_key_type {
    MMP_KEY_INT,        /* int or long long field (size tells which) */
    MMP_KEY_FLOAT,      /* float field */
    MMP_KEY_STRING,     /* char[size] field */
    MMP_KEY_BOOL,       /* int field, 0 or 1 */
    MMP_KEY_ENUM,       /* int-sized enum field; names[value] is its spelling */
    MMP_KEY_INT_LIST,   /* int[size]; count in count_field, or exactly size entries */
    MMP_KEY_FLOAT_LIST, /* float[size], exactly size entries */
    MMP_KEY_CUSTOM,     /* read and written by the key's own load / put_json */
} mmp_key_type;

typedef struct mmp_schema_loader mmp_schema_loader;

/* Where a value came from: its YAML node (and key, for a position when the
 * value has none, as an empty value does), and the --set override that put
 * it in the tree (-1 = the file). Custom loaders pass sites back to the
 * engine and never look inside. */
struct fy_node;
typedef struct mmp_schema_site {
    struct fy_node *node;
    struct fy_node *key;
    int origin;
} mmp_schema_site;

typedef struct mmp_key_spec {
    const char *path; /* "train.optimizer.lr" */
    mmp_key_type type;
    size_t field; /* offset in the struct; MMP_KEY_NO_FIELD for keys checked but not stored */
    size_t size;  /* MMP_KEY_INT: bytes of the field; MMP_KEY_STRING: bytes; lists: capacity */
    size_t count_field; /* variable-length lists: offset of the int count; else MMP_KEY_NO_FIELD */
    int min_len;        /* lists: fewest entries (capacity is the most) */
    long long imin, imax;        /* MMP_KEY_INT, MMP_KEY_INT_LIST entries: closed range */
    double fmin, fmax;           /* MMP_KEY_FLOAT, MMP_KEY_FLOAT_LIST entries */
    char lo_bracket, hi_bracket; /* '[' / ']' closed, '(' / ')' open */
    /* Lists whose entries must be strictly increasing: what an entry is
     * called in the error ("split point"); NULL for any order. */
    const char *increasing;
    bool required;
    bool scalar_ok;           /* MMP_KEY_INT_LIST: a plain number is a one-entry list */
    const char *const *names; /* MMP_KEY_ENUM: NULL-terminated, index = value */
    double def;               /* numbers, bools, enum values */
    const char *def_str;
    const double *def_list;
    int def_len;
    /* MMP_KEY_CUSTOM: loads the value at `at` into obj (errors through the
     * loader API below), and writes obj's value as JSON that loads back. */
    mmp_err (*load)(mmp_schema_loader *L, void *obj, mmp_schema_site at);
    void (*put_json)(FILE *f, const void *obj);
} mmp_key_spec;

typedef struct mmp_schema {
    /* Every leaf key once. Sections are the dotted prefixes of the paths and
     * must be contiguous in the table (JSON writers nest by them). */
    const mmp_key_spec *keys;
    int n_keys;
    /* Named when the top level is not a mapping: "job, data, model, ...". */
    const char *sections;
    /* Optionally, one section that may be given as a single word instead of
     * a mapping ("stages: auto"): the int at field is then set to 1. */
    struct {
        const char *path, *what, *word; /* what: its subsections, for the error */
        size_t field;
    } word_section;
} mmp_schema;

/* Cross-key checks, called by mmp_schema_load() after every key is loaded
 * and the required ones are present, while the positions are still known. */
typedef mmp_err (*mmp_schema_check)(mmp_schema_loader *L, void *obj);

/* Stores every stored key's default into obj (other bytes untouched). */
void mmp_schema_defaults(const mmp_schema *s, void *obj);

/* Loads the YAML file at path into obj, which holds the defaults already:
 * the n_overrides "a.b=c" strings are put into the tree in order (the value
 * parsed as YAML, with the same checks as the file's), then every key given
 * is checked and stored, required keys are asked for, and check (if not
 * NULL) runs. Returns MMP_OK or the first error (MMP_ERR_CONFIG for the
 * plan's content, MMP_ERR_IO, MMP_ERR_NOMEM), with its message in
 * mmp_last_error(); obj is then partly loaded. Owns nothing afterwards. */
mmp_err mmp_schema_load(const mmp_schema *s, void *obj, const char *path,
                        const char *const *overrides, int n_overrides, mmp_schema_check check);

/* Writes obj's value of key k as JSON (strings quoted and escaped: one line,
 * except a custom key's). It loads back as the same value. */
void mmp_schema_put_json(FILE *f, const mmp_key_spec *k, const void *obj);
/* A JSON string literal for s. */
void mmp_schema_put_string(FILE *f, const char *s);

/* ---- for checks: what was given, and failing at its site ------------------ */

/* Whether the file or an override gave key path. */
bool mmp_schema_given(const mmp_schema_loader *L, const char *path);
/* Whether key path's value came from a --set override (false when the file
 * gave it, or nobody did). */
bool mmp_schema_from_override(const mmp_schema_loader *L, const char *path);
/* Entries given for list key path; its default length when not given. */
int mmp_schema_list_len(const mmp_schema_loader *L, const char *path);
/* Where key path was given: "FILE:LINE:COL" or "--set K=V" into buf; false
 * (buf empty) when nobody gave it. */
bool mmp_schema_where(mmp_schema_loader *L, const char *path, char *buf, size_t size);
/* Returns MMP_ERR_CONFIG with "FILE:LINE:COL: msg" (or "--set K=V: msg") at
 * the site of the first of keys key, or_key (may be NULL) that was given;
 * at the top of the file when neither was. */
mmp_err mmp_schema_fail_at(mmp_schema_loader *L, const char *key, const char *or_key,
                           const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---- for custom keys: reading the YAML at a site --------------------------- */

/* Returns MMP_ERR_CONFIG with "FILE:LINE:COL: msg" (or "--set K=V: msg"). */
mmp_err mmp_schema_fail(mmp_schema_loader *L, mmp_schema_site at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* What the value is, for "expected X, got Y": "nothing", "a mapping",
 * "a list", "'text'" or "the quoted string \"text\"" (cut at 40 bytes). */
const char *mmp_schema_describe(mmp_schema_site at, char *buf, size_t size);
/* Typed values named name in errors: a plain decimal integer in [lo, hi]; a
 * string of fewer than size bytes; a list of min_len to max_len entries
 * (*count set). */
mmp_err mmp_schema_parse_int(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                             long long lo, long long hi, long long *out);
mmp_err mmp_schema_parse_string(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                                char *out, size_t size);
mmp_err mmp_schema_check_list(mmp_schema_loader *L, const char *name, mmp_schema_site at,
                              int min_len, int max_len, int *count);
/* Shapes: whether at is a mapping; how many items a list has (-1 when it is
 * not a list). */
bool mmp_schema_is_mapping(mmp_schema_site at);
int mmp_schema_items(mmp_schema_site at);
/* Iterates a list's items / a mapping's pairs: *iter starts NULL; false at
 * the end. Sites keep at's origin. */
bool mmp_schema_next_item(mmp_schema_site list, void **iter, mmp_schema_site *item);
bool mmp_schema_next_pair(mmp_schema_site map, void **iter, mmp_schema_site *key,
                          mmp_schema_site *value);
/* A scalar's text (quoted or not) into buf; false when at is no scalar or
 * the text does not fit. *plain (may be NULL): whether it was unquoted. */
bool mmp_schema_text(mmp_schema_site at, char *buf, size_t size, bool *plain);
/* Optional sign, then decimal digits only (no 0x, no 1e3, no 1_000). */
bool mmp_schema_is_integer(const char *text);
/* Levenshtein distance of a and b (INT_MAX past MMP_SCHEMA_KEY_MAX bytes). */
int mmp_schema_edit_distance(const char *a, const char *b);

#endif
