/* Internal to common/schema.c and common/schema_value.c: the loader's state
 * and the YAML node helpers both halves of the engine use. A key table never
 * includes this (it has common/schema.h). */
#ifndef MMP_COMMON_SCHEMA_YAML_H
#define MMP_COMMON_SCHEMA_YAML_H

#include <libfyaml.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/schema.h"

/* What the walk learnt about one key of the table. */
typedef struct mmp_schema_key_state {
    bool seen;            /* the file or an override gave it */
    mmp_schema_site site; /* where, when seen */
    int list_len;         /* lists: entries given (their default length if not given) */
} mmp_schema_key_state;

/* A collection a merge key copied, and its original. */
typedef struct mmp_yaml_copy {
    struct fy_node *copy, *orig;
} mmp_yaml_copy;

struct mmp_schema_loader {
    const mmp_schema *schema;
    const char *path;
    const char *const *overrides;
    int n_overrides;
    struct fy_diag *diag; /* collects libfyaml's errors instead of printing them */
    struct fy_parser *fyp;
    struct fy_document *fyd;
    bool fyd_parsed;                 /* fyd came from fyp (else fy_document_create) */
    struct fy_node **override_nodes; /* [n_overrides]: the subtree each override added */
    /* the subtrees an override of a whole section merged in, key by key,
     * and the override each came from */
    struct fy_node **merged_nodes;
    int *merged_from, n_merged, cap_merged;
    /* the collections a merge key copied, and the original of each (which
     * has a place in the file: a copy has none of its own) */
    mmp_yaml_copy *copies;
    int n_copies, cap_copies;
    /* collections changed after parsing (a merge key's target, a --set
     * merge's): libfyaml 0.8 crashes placing one, or any collection holding
     * one, so those are placed by their first scalar instead */
    struct fy_node **touched;
    int n_touched, cap_touched;
    mmp_schema_key_state *keys; /* [schema->n_keys] */
};

/* libfyaml's collected diagnostics: how many, and the i-th (NULL past them). */
int mmp_yaml_diag_count(struct fy_diag *diag);
struct fy_diag_error *mmp_yaml_diag_error(struct fy_diag *diag, int i);
/* Records collection n as changed after parsing (see touched). */
mmp_err mmp_yaml_touch(mmp_schema_loader *L, struct fy_node *n);
/* The node a merge key copied n from (n itself when it is no copy). */
struct fy_node *mmp_yaml_original(const mmp_schema_loader *L, struct fy_node *n);
/* 1-based line and column of node n in the file; false if it has none. */
bool mmp_yaml_node_mark(mmp_schema_loader *L, struct fy_node *n, int *line, int *col);
/* Where site at is: "FILE:LINE:COL", or "--set K=V" for an override. */
void mmp_schema_site_text(mmp_schema_loader *L, mmp_schema_site at, char *buf, size_t size);

bool mmp_yaml_is_scalar(struct fy_node *n);
bool mmp_yaml_is_plain(struct fy_node *n);
/* Absent, empty, or a plain ~ / null. */
bool mmp_yaml_is_null(struct fy_node *n);
/* Copies a scalar's text into buf; false if it does not fit or holds a NUL. */
bool mmp_yaml_scalar_text(struct fy_node *n, char *buf, size_t size);
/* What a node is, for "expected X, got Y". */
const char *mmp_yaml_describe(struct fy_node *n, char *buf, size_t size);

/* Checks the value at `at` against key idx of the table and stores it into
 * obj; records that the key was given, and where. */
mmp_err mmp_schema_load_value(mmp_schema_loader *L, void *obj, int idx, mmp_schema_site at);

#endif
