/* The schema engine's walk: reads a YAML file with libfyaml, puts the --set
 * overrides into its tree, rejects duplicate and unknown keys (with a "did
 * you mean" hint), hands each known key's node to common/schema_value.c, and
 * asks for the required keys. It knows the key table only through
 * common/schema.h, never which keys exist.
 *
 * Every error names file:line:column (or the --set override it came from)
 * and the dotted key, and goes up through mmp_errorf(). This file never
 * prints (libfyaml's diagnostics are collected, not written to stderr),
 * never exits, and keeps no state between calls. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/schema_yaml.h"
#include "common/utf8.h"

#define KEY_MAX MMP_SCHEMA_KEY_MAX

static int find_key(const mmp_schema *s, const char *path)
{
    for (int i = 0; i < s->n_keys; i++) {
        if (strcmp(s->keys[i].path, path) == 0) {
            return i;
        }
    }
    return -1;
}

/* Whether path names a section (a strict prefix of some key, ending at a dot). */
static bool is_section(const mmp_schema *s, const char *path)
{
    size_t n = strlen(path);
    for (int i = 0; i < s->n_keys; i++) {
        if (strncmp(s->keys[i].path, path, n) == 0 && s->keys[i].path[n] == '.') {
            return true;
        }
    }
    return false;
}

/* ---- "did you mean" -------------------------------------------------------- */

static int edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    int row[KEY_MAX + 1];
    if (na > KEY_MAX || nb > KEY_MAX) {
        return INT_MAX;
    }
    for (size_t j = 0; j <= nb; j++) {
        row[j] = (int)j;
    }
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) {
                best = up + 1;
            }
            if (row[j - 1] + 1 < best) {
                best = row[j - 1] + 1;
            }
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

int mmp_schema_edit_distance(const char *a, const char *b)
{
    return edit_distance(a, strlen(a), b, strlen(b));
}

static int count_dots(const char *s, size_t n)
{
    int d = 0;
    for (size_t i = 0; i < n; i++) {
        d += s[i] == '.';
    }
    return d;
}

/* Writes " (did you mean 'K'?)" into hint when a known key or section K of
 * the same depth whose first parent_len characters equal key's is within
 * edit distance 2 of key; else "". A file's mapping passes its own path as
 * the parent (siblings only); an override passes 0 (any key). */
static void suggest(const mmp_schema *s, const char *key, size_t parent_len, char *hint,
                    size_t size)
{
    size_t n = strlen(key);
    int depth = count_dots(key, n);
    int best = 3;
    const char *best_path = NULL;
    size_t best_len = 0;
    hint[0] = 0;
    for (int i = 0; i < s->n_keys; i++) {
        const char *c = s->keys[i].path;
        for (size_t len = 1; len <= strlen(c); len++) {
            if ((c[len] != '.' && c[len] != 0) || count_dots(c, len) != depth || len < parent_len ||
                strncmp(c, key, parent_len) != 0) {
                continue;
            }
            int d = edit_distance(key, n, c, len);
            if (d < best) {
                best = d;
                best_path = c;
                best_len = len;
            }
        }
    }
    if (best_path) {
        snprintf(hint, size, " (did you mean '%.*s'?)", (int)best_len, best_path);
        return;
    }
    /* Nothing spelled alike: a key of that name in another section
     * ("train.steps", "steps": job.steps; "train.lr": train.optimizer.lr),
     * named when one or two keys have it. */
    const char *leaf = strrchr(key, '.');
    leaf = leaf ? leaf + 1 : key;
    const char *same[3];
    int n_same = 0;
    for (int i = 0; i < s->n_keys; i++) {
        const char *c = s->keys[i].path, *cl = strrchr(c, '.');
        cl = cl ? cl + 1 : c;
        if (strcmp(cl, leaf) == 0 && strcmp(c, key) != 0 && n_same < 3) {
            same[n_same++] = c;
        }
    }
    if (n_same == 1) {
        snprintf(hint, size, " (did you mean '%s'?)", same[0]);
    } else if (n_same == 2) {
        snprintf(hint, size, " (did you mean '%s' or '%s'?)", same[0], same[1]);
    }
}

/* ---- the tree ---------------------------------------------------------------- */

static int origin_of(const mmp_schema_loader *L, struct fy_node *n)
{
    for (int i = 0; i < L->n_overrides; i++) {
        if (L->override_nodes[i] && L->override_nodes[i] == n) {
            return i;
        }
    }
    for (int k = 0; k < L->n_merged; k++) {
        if (L->merged_nodes[k] == n) {
            return L->merged_from[k];
        }
    }
    return -1;
}

/* The pair in map whose key's text is name[0..n) (our own lookup: libfyaml's
 * *_by_string variants parse the key as YAML first). */
static struct fy_node_pair *lookup_pair(struct fy_node *map, const char *name, size_t n)
{
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(map, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair);
        size_t len;
        const char *s = mmp_yaml_is_scalar(k) ? fy_node_get_scalar(k, &len) : NULL;
        if (s && len == n && memcmp(s, name, n) == 0) {
            return pair;
        }
    }
    return NULL;
}

/* The schema's one section that may be a word instead ("stages: auto"). */
static mmp_err load_word_section(mmp_schema_loader *L, void *obj, mmp_schema_site vs)
{
    char word[16], got[96];
    const mmp_schema *s = L->schema;
    if (!mmp_yaml_scalar_text(vs.node, word, sizeof word) ||
        strcmp(word, s->word_section.word) != 0) {
        return mmp_schema_fail(L, vs, "%s: expected a mapping (%s) or '%s', got %s",
                               s->word_section.path, s->word_section.what, s->word_section.word,
                               mmp_yaml_describe(vs.node, got, sizeof got));
    }
    *(int *)((char *)obj + s->word_section.field) = 1;
    return MMP_OK;
}

/* Loads the mapping at.node, whose dotted path is prefix ("" for the top). */
static mmp_err load_mapping(mmp_schema_loader *L, void *obj, mmp_schema_site at, const char *prefix)
{
    const mmp_schema *s = L->schema;
    char got[96];
    if (prefix[0] && mmp_yaml_is_null(at.node)) {
        return MMP_OK; /* "train:" with nothing under it */
    }
    if (!mmp_schema_is_mapping(at)) {
        if (!prefix[0]) {
            return mmp_schema_fail(L, at, "expected a mapping of sections (%s), got %s",
                                   s->sections, mmp_yaml_describe(at.node, got, sizeof got));
        }
        return mmp_schema_fail(L, at, "%s: expected a mapping, got %s", prefix,
                               mmp_yaml_describe(at.node, got, sizeof got));
    }
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(at.node, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair), *v = fy_node_pair_value(pair);
        int origin = origin_of(L, v);
        mmp_schema_site vs = {.node = v, .key = k, .origin = origin >= 0 ? origin : at.origin};
        mmp_schema_site ks = {.node = k, .key = k, .origin = vs.origin};
        char key[64], path[KEY_MAX];
        if (!mmp_yaml_is_scalar(k) || mmp_yaml_is_null(k) ||
            !mmp_yaml_scalar_text(k, key, sizeof key)) {
            return mmp_schema_fail(L, ks, "%s%skeys must be short names, got %s", prefix,
                                   prefix[0] ? ": " : "", mmp_yaml_describe(k, got, sizeof got));
        }
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", key);
        int idx = find_key(s, path);
        if (s->word_section.path && strcmp(path, s->word_section.path) == 0 &&
            mmp_yaml_is_scalar(v) && !mmp_yaml_is_null(v)) {
            MMP_TRY(load_word_section(L, obj, vs));
        } else if (idx >= 0) {
            MMP_TRY(mmp_schema_load_value(L, obj, idx, vs));
        } else if (is_section(s, path)) {
            MMP_TRY(load_mapping(L, obj, vs, path));
        } else {
            char hint[2 * KEY_MAX + 48];
            suggest(s, path, prefix[0] ? strlen(prefix) + 1 : 0, hint, sizeof hint);
            return mmp_schema_fail(L, ks, "unknown key '%s'%s", path, hint);
        }
    }
    return MMP_OK;
}

/* Rejects a key given twice in one mapping. libfyaml can do this itself, but
 * its message names neither the dotted key nor the first occurrence. */
static mmp_err check_duplicates(mmp_schema_loader *L, struct fy_node *n, const char *path,
                                int origin)
{
    void *iter = NULL;
    if (!n) {
        return MMP_OK;
    }
    if (fy_node_get_type(n) == FYNT_SEQUENCE) {
        struct fy_node *item;
        for (int i = 0; (item = fy_node_sequence_iterate(n, &iter)) != NULL; i++) {
            char sub[KEY_MAX];
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
            MMP_TRY(check_duplicates(L, item, sub, origin));
        }
        return MMP_OK;
    }
    if (fy_node_get_type(n) != FYNT_MAPPING) {
        return MMP_OK;
    }
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(n, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair);
        char key[64], sub[KEY_MAX];
        if (!mmp_yaml_is_scalar(k) || !mmp_yaml_scalar_text(k, key, sizeof key)) {
            continue; /* load_mapping rejects it with a better message */
        }
        snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", key);
        void *prev_iter = NULL;
        struct fy_node_pair *prev;
        while ((prev = fy_node_mapping_iterate(n, &prev_iter)) != pair) {
            struct fy_node *pk = fy_node_pair_key(prev);
            char prev_key[64];
            if (mmp_yaml_is_scalar(pk) && mmp_yaml_scalar_text(pk, prev_key, sizeof prev_key) &&
                strcmp(prev_key, key) == 0) {
                mmp_schema_site at = {.node = k, .key = k, .origin = origin};
                int line, col;
                if (origin >= 0 || !mmp_yaml_node_mark(L, pk, &line, &col)) {
                    return mmp_schema_fail(L, at, "duplicate key '%s'", sub);
                }
                return mmp_schema_fail(L, at,
                                       "duplicate key '%s' (first given at line %d, column %d)",
                                       sub, line, col);
            }
        }
        MMP_TRY(check_duplicates(L, fy_node_pair_value(pair), sub, origin));
    }
    return MMP_OK;
}

/* ---- alias expansion --------------------------------------------------------
 * fy_document_resolve copies every alias's anchored node in place. A few
 * nested anchors, each listing the one before nine times ("billion laughs"),
 * would make billions of nodes and take the memory and the minutes that
 * copying them needs, before any key is read. So the expansion is counted
 * first, and refused past a budget no plan comes near (the 1024-host plan in
 * configs/ has a few thousand nodes), naming the alias that goes over it. */
#define EXPANDED_NODES_MAX 200000
#define EXPANDED_DEPTH_MAX 256

/* Adds n's nodes, aliases expanded, to *nodes; 0 (with *blame: the
 * outermost alias on the way, or n) once over the budget or the depth, or
 * (*blame the alias, *nodes -1) at an alias whose anchor is nowhere. */
static int expansion_ok(struct fy_node *n, struct fy_node *via, int depth, long *nodes,
                        struct fy_node **blame)
{
    if (!n) {
        return 1;
    }
    if (++*nodes > EXPANDED_NODES_MAX || depth > EXPANDED_DEPTH_MAX) {
        *blame = via ? via : n;
        return 0;
    }
    if (fy_node_is_alias(n)) {
        struct fy_node *target = fy_node_resolve_alias(n);
        if (!target) {
            *blame = n;
            *nodes = -1;
            return 0;
        }
        return expansion_ok(target, via ? via : n, depth + 1, nodes, blame);
    }
    void *iter = NULL;
    if (fy_node_get_type(n) == FYNT_SEQUENCE) {
        struct fy_node *item;
        while ((item = fy_node_sequence_iterate(n, &iter)) != NULL) {
            if (!expansion_ok(item, via, depth + 1, nodes, blame)) {
                return 0;
            }
        }
    } else if (fy_node_get_type(n) == FYNT_MAPPING) {
        struct fy_node_pair *pair;
        while ((pair = fy_node_mapping_iterate(n, &iter)) != NULL) {
            if (!expansion_ok(fy_node_pair_key(pair), via, depth + 1, nodes, blame) ||
                !expansion_ok(fy_node_pair_value(pair), via, depth + 1, nodes, blame)) {
                return 0;
            }
        }
    }
    return 1;
}

static mmp_err check_expansion(mmp_schema_loader *L, struct fy_node *root)
{
    long nodes = 0;
    struct fy_node *blame = NULL;
    if (expansion_ok(root, NULL, 0, &nodes, &blame)) {
        return MMP_OK;
    }
    mmp_schema_site at = {.node = blame, .key = NULL, .origin = -1};
    if (nodes < 0) {
        size_t len = 0;
        const char *name = fy_node_get_scalar(blame, &len);
        return mmp_schema_fail(L, at, "alias *%.*s: no anchor &%.*s before it", name ? (int)len : 0,
                               name ? name : "", name ? (int)len : 0, name ? name : "");
    }
    return mmp_schema_fail(L, at,
                           "aliases expand past %d nodes or %d levels here (anchors that "
                           "repeat each other?); a plan needs a few thousand",
                           EXPANDED_NODES_MAX, EXPANDED_DEPTH_MAX);
}

/* ---- merge keys ---------------------------------------------------------------
 * `<<: *anchor` (or `<<: [*a, *b]`, or an inline mapping) puts the merged
 * mappings' keys into the mapping that holds it, YAML's merge key: a key the
 * mapping gives itself wins, then the sources in their order. So a host of
 * a plan can be another's with one key changed. libfyaml's resolve refuses
 * a key given both ways ("duplicate key after resolving"), which is what a
 * merge is for: so the merges are done here, before it, each source's pairs
 * copied (its scalars keep their place in the file, for messages). */

static bool is_merge_key(struct fy_node *k)
{
    size_t len = 0;
    const char *t = fy_node_get_type(k) == FYNT_SCALAR && fy_node_get_style(k) == FYNS_PLAIN
                        ? fy_node_get_scalar(k, &len)
                        : NULL;
    return t && len == 2 && memcmp(t, "<<", 2) == 0;
}

/* Records copy's collections against orig's, in step (scalars keep their
 * own place). */
/* Room for one more of *n items of `size` bytes in *items (*cap held). */
static mmp_err room_for_one(const mmp_schema_loader *L, void **items, int n, int *cap, size_t size)
{
    if (n < *cap) {
        return MMP_OK;
    }
    int more = *cap ? 2 * *cap : 16;
    void *p = realloc(*items, (size_t)more * size);
    if (!p) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", L->path);
    }
    *items = p;
    *cap = more;
    return MMP_OK;
}

static mmp_err note_copy(mmp_schema_loader *L, struct fy_node *copy, struct fy_node *orig)
{
    if (!copy || !orig || fy_node_get_type(copy) == FYNT_SCALAR || fy_node_is_alias(copy)) {
        return MMP_OK;
    }
    MMP_TRY(room_for_one(L, (void **)&L->copies, L->n_copies, &L->cap_copies, sizeof *L->copies));
    L->copies[L->n_copies++] = (mmp_yaml_copy){copy, orig};
    void *ic = NULL, *io = NULL;
    if (fy_node_get_type(copy) == FYNT_SEQUENCE) {
        struct fy_node *a, *b;
        while ((a = fy_node_sequence_iterate(copy, &ic)) != NULL &&
               (b = fy_node_sequence_iterate(orig, &io)) != NULL) {
            MMP_TRY(note_copy(L, a, b));
        }
    } else {
        struct fy_node_pair *a, *b;
        while ((a = fy_node_mapping_iterate(copy, &ic)) != NULL &&
               (b = fy_node_mapping_iterate(orig, &io)) != NULL) {
            MMP_TRY(note_copy(L, fy_node_pair_value(a), fy_node_pair_value(b)));
        }
    }
    return MMP_OK;
}

mmp_err mmp_yaml_touch(mmp_schema_loader *L, struct fy_node *n)
{
    MMP_TRY(
        room_for_one(L, (void **)&L->touched, L->n_touched, &L->cap_touched, sizeof *L->touched));
    L->touched[L->n_touched++] = n;
    return MMP_OK;
}

struct fy_node *mmp_yaml_original(const mmp_schema_loader *L, struct fy_node *n)
{
    for (int k = L->n_copies - 1; k >= 0; k--) {
        if (L->copies[k].copy == n) {
            n = L->copies[k].orig; /* which may be a copy itself, made earlier */
        }
    }
    return n;
}

/* Adds source's pairs to map where map has no such key yet. */
static mmp_err merge_from(mmp_schema_loader *L, struct fy_node *map, struct fy_node *source,
                          struct fy_node *site)
{
    struct fy_node *src = fy_node_is_alias(source) ? fy_node_resolve_alias(source) : source;
    if (!src || fy_node_get_type(src) != FYNT_MAPPING) {
        mmp_schema_site at = {.node = site, .key = NULL, .origin = -1};
        return mmp_schema_fail(L, at, "<<: merges mappings (an alias of one, or a list of them)");
    }
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(src, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(pair);
        size_t len = 0;
        const char *name = fy_node_get_type(k) == FYNT_SCALAR ? fy_node_get_scalar(k, &len) : NULL;
        if (!name || is_merge_key(k) || fy_node_mapping_lookup_pair_by_string(map, name, len)) {
            continue; /* given already (or a merge the source had: done when it was walked) */
        }
        struct fy_node *kc = fy_node_copy(L->fyd, k);
        struct fy_node *vc = kc ? fy_node_copy(L->fyd, fy_node_pair_value(pair)) : NULL;
        if (!vc || fy_node_mapping_append(map, kc, vc) != 0) {
            fy_node_free(kc);
            fy_node_free(vc);
            return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", L->path);
        }
        MMP_TRY(note_copy(L, vc, fy_node_pair_value(pair)));
    }
    return MMP_OK;
}

/* Does every merge under n, innermost first (an anchored mapping comes
 * before its aliases, so its own merges are done when they are copied). */
static mmp_err merge_keys(mmp_schema_loader *L, struct fy_node *n)
{
    if (!n || fy_node_is_alias(n)) {
        return MMP_OK;
    }
    void *iter = NULL;
    if (fy_node_get_type(n) == FYNT_SEQUENCE) {
        struct fy_node *item;
        while ((item = fy_node_sequence_iterate(n, &iter)) != NULL) {
            MMP_TRY(merge_keys(L, item));
        }
        return MMP_OK;
    }
    if (fy_node_get_type(n) != FYNT_MAPPING) {
        return MMP_OK;
    }
    struct fy_node_pair *pair, *merge = NULL;
    while ((pair = fy_node_mapping_iterate(n, &iter)) != NULL) {
        MMP_TRY(merge_keys(L, fy_node_pair_value(pair)));
        if (!merge && is_merge_key(fy_node_pair_key(pair))) {
            merge = pair; /* one: a second is check_duplicates' */
        }
    }
    if (!merge) {
        return MMP_OK;
    }
    struct fy_node *v = fy_node_pair_value(merge);
    if (v && !fy_node_is_alias(v) && fy_node_get_type(v) == FYNT_SEQUENCE) {
        void *it = NULL;
        struct fy_node *item;
        while ((item = fy_node_sequence_iterate(v, &it)) != NULL) {
            MMP_TRY(merge_from(L, n, item, item));
        }
    } else {
        MMP_TRY(merge_from(L, n, v, v ? v : fy_node_pair_key(merge)));
    }
    fy_node_free(fy_node_mapping_remove_by_key(n, fy_node_pair_key(merge)));
    return mmp_yaml_touch(L, n);
}

/* ---- --set overrides ------------------------------------------------------- */

/* Puts node into map under name, or into pair's value when pair is given;
 * 0 on success. On failure node is not attached and stays the caller's. */
static int attach(struct fy_document *fyd, struct fy_node *map, struct fy_node_pair *pair,
                  const char *name, size_t len, struct fy_node *node)
{
    if (pair) {
        return fy_node_pair_set_value(pair, node);
    }
    struct fy_node *k = fy_node_create_scalar_copy(fyd, name, len);
    if (!k || fy_node_mapping_append(map, k, node) != 0) {
        if (k) {
            fy_node_free(k);
        }
        return -1;
    }
    return 0;
}

/* YAML text must be UTF-8 without NULs before libfyaml sees it: Debian's
 * libfyaml 0.8 loops for ever on a directive holding an invalid byte
 * ("%\xf7 1:", found by tests/fuzz/fuzz_plan.c). Returns the offset of the
 * first bad byte, or len. */
static size_t bad_text_at(const char *text, size_t len)
{
    size_t bad = mmp_utf8_check(text, len);
    const char *nul = memchr(text, 0, bad);
    return nul ? (size_t)(nul - text) : bad;
}

/* The offset of the first explicit-key indicator in block context (a line
 * whose first item, after blanks and "- " entries, is a '?' followed by a
 * blank or the line's end), or len. A plan has no complex keys, and Debian's
 * libfyaml 0.8 corrupts its parser on one whose key is an implicit mapping
 * with a tab before a ':' ("? e:\t:" crashes in fy_parser_destroy, found by
 * tests/fuzz/fuzz_plan.c). */
static size_t complex_key_at(const char *text, size_t len)
{
    size_t i = 0;
    while (i < len) {
        while (i < len &&
               (text[i] == ' ' || text[i] == '\t' ||
                (text[i] == '-' && i + 1 < len && (text[i + 1] == ' ' || text[i + 1] == '\t')))) {
            i++;
        }
        if (i < len && text[i] == '?' && (i + 1 == len || strchr(" \t\r\n", text[i + 1]) != NULL)) {
            return i;
        }
        const char *nl = memchr(text + i, '\n', len - i);
        i = nl ? (size_t)(nl - text) + 1 : len;
    }
    return len;
}

/* Puts override i ("a.b.c=value") into the tree: the value is parsed as YAML
 * (so "[1,2]" is a list) and missing mappings on the way are created. */
/* Override i's mapping `from` merged into the plan's mapping `into`: each
 * key of from replaces the same key of into, where both are mappings key
 * by key; the rest of into stays. So `--set train={batch: 8}` changes the
 * batch, not every other train key back to its default. */
static mmp_err merge_mapping(mmp_schema_loader *L, struct fy_node *into, struct fy_node *from,
                             int i)
{
    MMP_TRY(mmp_yaml_touch(L, into)); /* changed: libfyaml can no longer place it */
    void *iter = NULL;
    struct fy_node_pair *fp;
    while ((fp = fy_node_mapping_iterate(from, &iter)) != NULL) {
        struct fy_node *k = fy_node_pair_key(fp), *v = fy_node_pair_value(fp);
        size_t len = 0;
        const char *name = mmp_yaml_is_scalar(k) ? fy_node_get_scalar(k, &len) : NULL;
        if (!name) {
            return mmp_errorf(MMP_ERR_CONFIG, "--set %s: a key that is not a name",
                              L->overrides[i]);
        }
        struct fy_node_pair *tp = lookup_pair(into, name, len);
        struct fy_node *tv = tp ? fy_node_pair_value(tp) : NULL;
        if (tv && v && fy_node_get_type(tv) == FYNT_MAPPING &&
            fy_node_get_type(v) == FYNT_MAPPING) {
            MMP_TRY(merge_mapping(L, tv, v, i));
            continue;
        }
        struct fy_node *copy = v ? fy_node_copy(L->fyd, v) : fy_node_create_scalar(L->fyd, "~", 1);
        if (L->n_merged == L->cap_merged) {
            int cap = L->cap_merged ? 2 * L->cap_merged : 16;
            struct fy_node **nodes = realloc(L->merged_nodes, (size_t)cap * sizeof *nodes);
            if (nodes) {
                L->merged_nodes = nodes;
            }
            int *from_i = nodes ? realloc(L->merged_from, (size_t)cap * sizeof *from_i) : NULL;
            if (from_i) {
                L->merged_from = from_i;
                L->cap_merged = cap;
            }
        }
        if (!copy || L->n_merged == L->cap_merged ||
            attach(L->fyd, into, tp, name, len, copy) != 0) {
            if (copy) {
                fy_node_free(copy);
            }
            return mmp_errorf(MMP_ERR_NOMEM, "--set %s: out of memory", L->overrides[i]);
        }
        L->merged_nodes[L->n_merged] = copy;
        L->merged_from[L->n_merged++] = i;
    }
    return MMP_OK;
}

static mmp_err apply_override(mmp_schema_loader *L, int i)
{
    const char *s = L->overrides[i];
    const char *eq = strchr(s, '=');
    char key[KEY_MAX], hint[2 * KEY_MAX + 48], got[96];
    if (!eq || eq == s) {
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: expected KEY=VALUE", s);
    }
    if ((size_t)(eq - s) >= sizeof key) {
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: key too long", s);
    }
    memcpy(key, s, (size_t)(eq - s));
    key[eq - s] = 0;
    if (find_key(L->schema, key) < 0 && !is_section(L->schema, key)) {
        suggest(L->schema, key, 0, hint, sizeof hint);
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: unknown key '%s'%s", s, key, hint);
    }

    /* Follow the mappings already on the path; stop at the first component
     * that is missing, empty ("train:" alone) or the last one. */
    struct fy_node *map = fy_document_root(L->fyd);
    struct fy_node_pair *pair;
    const char *part = key, *dot;
    int origin = -1;
    for (;;) {
        dot = strchr(part, '.');
        pair = lookup_pair(map, part, dot ? (size_t)(dot - part) : strlen(part));
        if (!pair || !dot) {
            break;
        }
        struct fy_node *v = fy_node_pair_value(pair);
        origin = origin_of(L, v) >= 0 ? origin_of(L, v) : origin;
        if (mmp_yaml_is_null(v)) {
            break;
        }
        if (fy_node_get_type(v) != FYNT_MAPPING) {
            /* the file (or an earlier override) put something else here */
            mmp_schema_site at = {.node = v, .key = fy_node_pair_key(pair), .origin = origin};
            return mmp_schema_fail(L, at, "%.*s: expected a mapping, got %s", (int)(dot - key), key,
                                   mmp_yaml_describe(v, got, sizeof got));
        }
        map = v;
        part = dot + 1;
    }

    const char *text = eq[1] ? eq + 1 : "~"; /* "key=" sets nothing: a null */
    if (bad_text_at(text, strlen(text)) < strlen(text)) {
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: invalid YAML value: not UTF-8 text", key);
    }
    if (complex_key_at(text, strlen(text)) < strlen(text)) {
        return mmp_errorf(MMP_ERR_CONFIG,
                          "--set %s: invalid YAML value: a '?' complex key (plans have none)", key);
    }
    int before = mmp_yaml_diag_count(L->diag);
    struct fy_node *value = fy_node_build_from_string(L->fyd, text, FY_NT);
    if (!value) {
        struct fy_diag_error *e = mmp_yaml_diag_error(L->diag, before);
        return mmp_errorf(MMP_ERR_CONFIG, "--set %s: invalid YAML value: %s", s,
                          e && e->msg ? e->msg : "cannot parse");
    }
    mmp_err ret = check_duplicates(L, value, key, i);
    if (ret != MMP_OK) {
        fy_node_free(value);
        return ret;
    }
    if (pair && !strchr(part, '.') && fy_node_get_type(value) == FYNT_MAPPING &&
        fy_node_pair_value(pair) && fy_node_get_type(fy_node_pair_value(pair)) == FYNT_MAPPING) {
        /* a section (or a mapping in one) the plan already has: merged */
        ret = merge_mapping(L, fy_node_pair_value(pair), value, i);
        fy_node_free(value);
        return ret;
    }
    struct fy_node *added = NULL; /* the topmost node this override creates */
    for (; (dot = strchr(part, '.')) != NULL; part = dot + 1) {
        struct fy_node *m = fy_node_create_mapping(L->fyd);
        if (!m || attach(L->fyd, map, pair, part, (size_t)(dot - part), m) != 0) {
            if (m) {
                fy_node_free(m);
            }
            fy_node_free(value);
            return mmp_errorf(MMP_ERR_NOMEM, "--set %s: out of memory", s);
        }
        added = added ? added : m;
        map = m;
        pair = NULL;
    }
    if (attach(L->fyd, map, pair, part, strlen(part), value) != 0) {
        fy_node_free(value);
        return mmp_errorf(MMP_ERR_NOMEM, "--set %s: out of memory", s);
    }
    L->override_nodes[i] = added ? added : value;
    return MMP_OK;
}

/* ---- after the walk ---------------------------------------------------------- */

bool mmp_schema_given(const mmp_schema_loader *L, const char *path)
{
    int i = find_key(L->schema, path);
    return i >= 0 && L->keys[i].seen;
}

bool mmp_schema_from_override(const mmp_schema_loader *L, const char *path)
{
    int i = find_key(L->schema, path);
    return i >= 0 && L->keys[i].seen && L->keys[i].site.origin >= 0;
}

int mmp_schema_list_len(const mmp_schema_loader *L, const char *path)
{
    int i = find_key(L->schema, path);
    return i >= 0 ? L->keys[i].list_len : 0;
}

bool mmp_schema_where(mmp_schema_loader *L, const char *path, char *buf, size_t size)
{
    int i = find_key(L->schema, path);
    if (size) {
        buf[0] = 0;
    }
    if (i < 0 || !L->keys[i].seen) {
        return false;
    }
    mmp_schema_site_text(L, L->keys[i].site, buf, size);
    return true;
}

mmp_err mmp_schema_fail_at(mmp_schema_loader *L, const char *key, const char *or_key,
                           const char *fmt, ...)
{
    mmp_schema_site at = {.node = NULL, .key = NULL, .origin = -1};
    const char *tries[] = {key, or_key};
    for (int t = 1; t >= 0; t--) { /* the first given wins */
        int i = tries[t] ? find_key(L->schema, tries[t]) : -1;
        if (i >= 0 && L->keys[i].seen) {
            at = L->keys[i].site;
        }
    }
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mmp_schema_fail(L, at, "%s", msg);
}

/* A required key missing is reported at its section's key when the section
 * is there, else at the top of the file. */
static mmp_err check_required(mmp_schema_loader *L)
{
    for (int i = 0; i < L->schema->n_keys; i++) {
        const mmp_key_spec *k = &L->schema->keys[i];
        if (k->required && !L->keys[i].seen) {
            char section[64];
            snprintf(section, sizeof section, "%.*s", (int)strcspn(k->path, "."), k->path);
            struct fy_node *root = fy_document_root(L->fyd);
            struct fy_node_pair *pair = lookup_pair(root, section, strlen(section));
            mmp_schema_site at = {.node = pair ? fy_node_pair_key(pair) : NULL,
                                  .key = NULL,
                                  .origin = pair ? origin_of(L, fy_node_pair_value(pair)) : -1};
            return mmp_schema_fail(L, at, "%s: required key is missing", k->path);
        }
    }
    return MMP_OK;
}

/* ---- the file ------------------------------------------------------------------ */

static void discard_diag(struct fy_diag *diag, void *user, const char *buf, size_t len)
{
    (void)diag, (void)user, (void)buf, (void)len;
}

static mmp_err read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int failed = ferror(f), saved = errno;
    fclose(f);
    if (!buf) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory reading it", path);
    }
    if (failed) {
        free(buf);
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(saved));
    }
    *out = buf;
    *len = n;
    return MMP_OK;
}

static mmp_err yaml_error(mmp_schema_loader *L, int first)
{
    struct fy_diag_error *e = mmp_yaml_diag_error(L->diag, first);
    return mmp_errorf(MMP_ERR_CONFIG, "%s:%d:%d: invalid YAML: %s", L->path, e ? e->line : 1,
                      e ? e->column : 1, e && e->msg ? e->msg : "cannot parse");
}

/* Parses text into L->fyd (with L->fyp, which must outlive it): exactly one
 * document, or an empty one for a file without any (empty, or comments). */
static mmp_err parse_text(mmp_schema_loader *L, const char *text, size_t len)
{
    size_t bad = bad_text_at(text, len), key = bad < len ? len : complex_key_at(text, len);
    if (bad < len || key < len) {
        size_t at = bad < len ? bad : key;
        int line = 1, col = 1;
        for (size_t i = 0; i < at; i++) {
            line += text[i] == '\n';
            col = text[i] == '\n' ? 1 : col + 1;
        }
        if (key < len) {
            return mmp_errorf(MMP_ERR_CONFIG,
                              "%s:%d:%d: invalid YAML: a '?' complex key (plans have none)",
                              L->path, line, col);
        }
        return mmp_errorf(MMP_ERR_CONFIG, "%s:%d:%d: invalid YAML: byte 0x%02x is not UTF-8 text",
                          L->path, line, col, (unsigned char)text[bad]);
    }
    /* Duplicates are let through so check_duplicates can name them properly;
     * aliases are resolved only after that check, as merges can repeat keys. */
    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET | FYPCF_ALLOW_DUPLICATE_KEYS, .diag = L->diag};
    if (len > 0) {
        L->fyp = fy_parser_create(&cfg);
        if (!L->fyp || fy_parser_set_string(L->fyp, text, len) != 0) {
            return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", L->path);
        }
        L->fyd = fy_parse_load_document(L->fyp);
        if (mmp_yaml_diag_count(L->diag) > 0) {
            return yaml_error(L, 0);
        }
    }
    if (!L->fyd) {
        L->fyd = fy_document_create(&cfg);
        return L->fyd ? MMP_OK : mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", L->path);
    }
    L->fyd_parsed = true;
    struct fy_document *next = fy_parse_load_document(L->fyp);
    mmp_err ret = MMP_OK;
    if (mmp_yaml_diag_count(L->diag) > 0) {
        ret = yaml_error(L, 0);
    } else if (next && !mmp_yaml_is_null(fy_document_root(next))) {
        mmp_schema_site at = {.node = fy_document_root(next), .key = NULL, .origin = -1};
        ret = mmp_schema_fail(L, at, "a plan is one YAML document; this starts a second one");
    }
    if (next) {
        fy_parse_document_destroy(L->fyp, next);
    }
    return ret;
}

/* Everything after the file is parsed: the overrides, the walk, the checks. */
static mmp_err load_tree(mmp_schema_loader *L, void *obj, mmp_schema_check check)
{
    MMP_TRY(check_expansion(L, fy_document_root(L->fyd)));
    MMP_TRY(check_duplicates(L, fy_document_root(L->fyd), "", -1));
    MMP_TRY(merge_keys(L, fy_document_root(L->fyd)));
    int before = mmp_yaml_diag_count(L->diag);
    if (fy_document_resolve(L->fyd) != 0) {
        return yaml_error(L, before);
    }
    struct fy_node *root = fy_document_root(L->fyd);
    if (mmp_yaml_is_null(root)) {
        /* an empty file (or just comments): every key takes its default */
        root = fy_node_create_mapping(L->fyd);
        if (!root || fy_document_set_root(L->fyd, root) != 0) {
            return mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", L->path);
        }
    }
    mmp_schema_site top = {.node = root, .key = NULL, .origin = -1};
    if (fy_node_get_type(root) != FYNT_MAPPING) {
        return load_mapping(L, obj, top, ""); /* fails, naming what the top level is */
    }
    for (int i = 0; i < L->n_overrides; i++) {
        MMP_TRY(apply_override(L, i));
    }
    MMP_TRY(load_mapping(L, obj, top, ""));
    MMP_TRY(check_required(L));
    return check ? check(L, obj) : MMP_OK;
}

mmp_err mmp_schema_load(const mmp_schema *s, void *obj, const char *path,
                        const char *const *overrides, int n_overrides, mmp_schema_check check)
{
    mmp_schema_loader L = {
        .schema = s, .path = path, .overrides = overrides, .n_overrides = n_overrides};
    char *text = NULL;
    size_t len = 0;
    mmp_err ret = MMP_OK;

    MMP_TRY(read_file(path, &text, &len));

    struct fy_diag_cfg dcfg;
    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.output_fn = discard_diag;
    dcfg.level = FYET_ERROR;
    L.diag = fy_diag_create(&dcfg);
    L.override_nodes = calloc(n_overrides > 0 ? (size_t)n_overrides : 1, sizeof(struct fy_node *));
    L.keys = calloc(s->n_keys > 0 ? (size_t)s->n_keys : 1, sizeof *L.keys);
    if (!L.diag || !L.override_nodes || !L.keys) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "%s: out of memory", path);
        goto exit;
    }
    for (int i = 0; i < s->n_keys; i++) {
        L.keys[i].list_len = s->keys[i].def_len;
    }
    fy_diag_set_collect_errors(L.diag, true);
    if ((ret = parse_text(&L, text, len)) == MMP_OK) {
        ret = load_tree(&L, obj, check);
    }
exit:
    if (L.fyd_parsed) {
        fy_parse_document_destroy(L.fyp, L.fyd);
    } else if (L.fyd) {
        fy_document_destroy(L.fyd);
    }
    if (L.fyp) {
        fy_parser_destroy(L.fyp);
    }
    if (L.diag) {
        fy_diag_destroy(L.diag);
    }
    free(L.keys);
    free(L.override_nodes);
    free(L.merged_nodes);
    free(L.merged_from);
    free(L.copies);
    free(L.touched);
    free(text);
    return ret;
}
