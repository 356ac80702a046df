/* Checkpoint files (common/ckpt.c): the input is one .ckpt file, read with
 * mmp_ckpt_read_file (magic, version, entries, checksum), every tensor then
 * looked up by name. */
#include "common/ckpt.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    const char *path = fuzz_file(".ckpt", data, size);
    if (!path) {
        return 0;
    }
    mmp_ckpt c = {0};
    if (mmp_ckpt_read_file(&c, path) == MMP_OK) {
        for (int i = 0; i < c.count; i++) {
            if (mmp_ckpt_find(&c, c.entries[i].name) == NULL) {
                __builtin_trap(); /* every entry read must be found by its name */
            }
        }
    }
    mmp_ckpt_fini(&c);
    unlink(path);
    return 0;
}
