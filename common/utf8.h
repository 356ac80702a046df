/* UTF-8 helpers shared by the plan loader (YAML text is checked before
 * libfyaml sees it), the manifest's JSON strings and the tokenizer. */
#ifndef MMP_COMMON_UTF8_H
#define MMP_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length in bytes of the valid UTF-8 sequence starting at s[0] (n bytes
 * available), or 0 when it is not one (bad lead byte, bad continuation,
 * overlong form, surrogate, above U+10FFFF, or cut short). */
size_t mmp_utf8_seq_len(const unsigned char *s, size_t n);

/* Offset of the first byte of s[0..n) that is not valid UTF-8, or n. */
size_t mmp_utf8_check(const char *s, size_t n);

/* Writes code point cp (<= U+10FFFF, not a surrogate) as UTF-8 to out;
 * returns the byte count (1..4), or 0 when cp cannot be encoded. */
int mmp_utf8_encode(uint32_t cp, char out[4]);

/* Number of code points in the valid UTF-8 string s[0..n). */
size_t mmp_utf8_count(const char *s, size_t n);

#endif
