/* Private to data/manifest.c and data/manifest_json.c: the one-line parser
 * the file walker calls with its own reusable arena. */
#ifndef MMP_DATA_MANIFEST_JSON_H
#define MMP_DATA_MANIFEST_JSON_H

#include <stddef.h>

#include "data/manifest.h"

/* Parses line s[0..n) with arena (>= n + 1 bytes, which e's strings then
 * point into); returns 1, or 0 with the reason in why[0..why_n) and its kind
 * in e->problem. Never allocates. */
int mmp_manifest_parse_entry(const char *s, size_t n, char *arena, mmp_manifest_entry *e, char *why,
                             size_t why_n);

#endif
