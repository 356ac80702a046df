/* Checkpoint files (common/ckpt.c): the input is one .ckpt file, read with
 * mmp_ckpt_read_file (magic, version, records, checksum), every tensor then
 * looked up by name. The harness rewrites the trailing checksum to match
 * (on a copy; FNV-1a for version 1, XXH64 for version 2), so mutations
 * reach the record parser instead of dying at the checksum. */
#include "common/ckpt.h"
#include "common/rng.h"
#include "common/xxh64.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    uint8_t *copy = fuzz_copy(data, size);
    if (!copy) {
        return 0;
    }
    if (size >= 24) { /* the footer each version's reader checks */
        uint32_t version;
        memcpy(&version, copy + 8, 4);
        uint64_t h =
            version == 2 ? mmp_xxh64(copy, size - 8) : mmp_fnv1a(MMP_FNV1A_INIT, copy, size - 8);
        memcpy(copy + size - 8, &h, 8);
    }
    const char *path = fuzz_file(".ckpt", copy, size);
    free(copy);
    if (!path) {
        return 0;
    }
    mmp_ckpt c = {0};
    if (mmp_ckpt_read_file(&c, path) == MMP_OK) {
        for (int i = 0; i < c.count; i++) {
            const mmp_ckpt_entry *e = mmp_ckpt_find(&c, c.entries[i].name);
            if (!e) {
                __builtin_trap(); /* every record read must be found by its name */
            }
            fuzz_check_tensor(&e->t); /* its shape describes the bytes it holds */
        }
    }
    mmp_ckpt_fini(&c);
    unlink(path);
    return 0;
}
