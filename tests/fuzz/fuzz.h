/* Shared by the libFuzzer harnesses in tests/fuzz/ (one fuzz_<target>.c
 * each, a seed corpus in corpus/<target>/). Each harness defines
 * LLVMFuzzerTestOneInput and nothing else that links: the same file builds
 * with clang -fsanitize=fuzzer (-DMMP_FUZZ=ON, scripts/fuzz) and, with
 * replay.c as its main, as a plain ctest that runs every committed seed and
 * crash reproducer (fuzz_<target>_replay), so a fixed crash stays fixed in
 * the normal and the sanitizer builds.
 *
 * Harnesses must never: keep state between inputs (besides what they load
 * once), write outside $TMPDIR, or call exit(). */
#ifndef MMP_TESTS_FUZZ_H
#define MMP_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/tensor.h"
#include "data/png.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Once per process: errors are expected by the thousand; keep them quiet. */
static inline void fuzz_quiet(void)
{
    static int done;
    if (!done) {
        mmp_log_set_level(MMP_LOG_ERROR);
        done = 1;
    }
}

/* A per-process scratch file holding data[0..size); its path (static). For
 * parsers that take a path (plans, checkpoints, vocabularies). NULL on an
 * I/O failure, which the harness treats as nothing to test. */
static inline const char *fuzz_file(const char *suffix, const uint8_t *data, size_t size)
{
    static char path[256];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/mmp-fuzz-%d%s", dir && *dir ? dir : "/tmp", (int)getpid(),
             suffix);
    FILE *f = fopen(path, "wb");
    if (!f) {
        return NULL;
    }
    int ok = fwrite(data, 1, size, f) == size;
    ok = fclose(f) == 0 && ok;
    return ok ? path : NULL;
}

/* A malloc'd copy of data[0..size) (at least one byte) for harnesses that
 * repair checksums before parsing; NULL when out of memory. */
static inline uint8_t *fuzz_copy(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (copy) {
        memcpy(copy, data, size);
    }
    return copy;
}

/* Traps unless an accepted tensor's shape describes the bytes it holds: no
 * negative extent, no overflowing element count, its last byte readable. */
static inline void fuzz_check_tensor(const mmp_tensor *t)
{
    uint64_t n = mmp_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)t->shape[d], &n)) {
            __builtin_trap(); /* the element count overflows */
        }
    }
    if (n > 0) {
        volatile uint8_t last = ((const uint8_t *)t->data)[n - 1];
        (void)last;
    }
}

/* The pixel limit the image harnesses decode under: small enough that a
 * header declaring a big canvas costs milliseconds, not a second. */
#define FUZZ_IMAGE_MAX_PIXELS (1LL << 22)

typedef mmp_err (*fuzz_decoder)(const char *name, const void *buf, size_t len, long long max_pixels,
                                mmp_image *img);

/* Decodes data with dec under FUZZ_IMAGE_MAX_PIXELS and traps unless the
 * decoders' contract holds (data/png.h, data/codecs.h): an accepted image is
 * 1..16384 on a side, within the limit, its w x h x 3 bytes all there; the
 * limit is exact (one pixel less refuses the same bytes as too large, with
 * the same size, before any pixel is decoded); a refusal leaves img zeroed
 * except for a refusal on the limit, which holds a size over the limit. */
static inline void fuzz_check_decode(fuzz_decoder dec, const char *name, const uint8_t *data,
                                     size_t size)
{
    mmp_image img = {0};
    if (dec(name, data, size, FUZZ_IMAGE_MAX_PIXELS, &img) == MMP_OK) {
        long long px = (long long)img.width * img.height;
        if (!img.rgb || img.width < 1 || img.height < 1 || img.width > MMP_PNG_MAX_SIDE ||
            img.height > MMP_PNG_MAX_SIDE || px > FUZZ_IMAGE_MAX_PIXELS) {
            __builtin_trap(); /* an accepted image outside the limits */
        }
        volatile uint8_t last = img.rgb[(size_t)px * 3 - 1]; /* the whole buffer is there */
        (void)last;
        if (px > 1) {
            mmp_image small = {0};
            if (dec(name, data, size, px - 1, &small) != MMP_ERR_DATA ||
                !mmp_image_too_large(&small) || small.width != img.width ||
                small.height != img.height) {
                __builtin_trap(); /* the pixel limit is not exact */
            }
            mmp_image_fini(&small);
        }
    } else if (img.rgb) {
        __builtin_trap(); /* pixels left behind by a refusal */
    } else if (mmp_image_too_large(&img)) {
        if ((long long)img.width * img.height <= FUZZ_IMAGE_MAX_PIXELS) {
            __builtin_trap(); /* "too large" for a size within the limit */
        }
    } else if (img.width || img.height) {
        __builtin_trap(); /* a refusal that is not zeroed */
    }
    mmp_image_fini(&img);
}

#endif
