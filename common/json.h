/* JSON text output for the files mmpipe writes by hand (metrics.jsonl,
 * the synthetic data set's manifests): the one string escaper. Reading JSON
 * is libfyaml's job (common/metrics.h, data/manifest.c). */
#ifndef MMP_COMMON_JSON_H
#define MMP_COMMON_JSON_H

#include <stddef.h>
#include <stdio.h>

/* Writes s to f as a JSON string, quotes included: '"' and '\\' escaped,
 * other control characters as \u00XX; bytes >= 0x80 (UTF-8) as they are.
 * Stream errors are the caller's to check (ferror). */
void mmp_json_put_string(FILE *f, const char *s);

/* s escaped the same way, without the quotes, into buf (n bytes, NUL
 * terminated; cut short at a whole character to fit). Returns buf. */
const char *mmp_json_escape(const char *s, char *buf, size_t n);

#endif
