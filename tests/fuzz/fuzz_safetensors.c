/* safetensors files (common/safetensors.c): the input is one file, read
 * with mmp_safetensors_read (header length, JSON header, dtypes, shapes,
 * offsets, tiling). An accepted file must have given tensors whose shapes
 * describe the bytes they hold, each found by its name, and written back it
 * must read again to the same tensors. */
#include "common/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    const char *path = fuzz_file(".safetensors", data, size);
    if (!path) {
        return 0;
    }
    mmp_ckpt c = {0}, again = {0};
    mmp_st_meta meta;
    if (mmp_safetensors_read(&c, path, &meta) == MMP_OK) {
        mmp_st_item *items = calloc((size_t)c.count + 1, sizeof *items);
        for (int i = 0; items && i < c.count; i++) {
            const mmp_ckpt_entry *e = mmp_ckpt_find(&c, c.entries[i].name);
            if (!e) {
                __builtin_trap(); /* every tensor read must be found by its name */
            }
            fuzz_check_tensor(&e->t); /* its shape describes the bytes it holds */
            items[i] = (mmp_st_item){.name = e->name, .t = &e->t};
        }
        /* what was accepted writes and reads back to the same count */
        if (items && mmp_safetensors_write(path, items, c.count, &meta) == MMP_OK) {
            if (mmp_safetensors_read(&again, path, NULL) != MMP_OK || again.count != c.count) {
                __builtin_trap();
            }
        }
        free(items);
    }
    mmp_ckpt_fini(&c);
    mmp_ckpt_fini(&again);
    unlink(path);
    return 0;
}
