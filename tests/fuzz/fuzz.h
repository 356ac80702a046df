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

#endif
