/* Manifest lines (data/manifest.c): one JSONL line through
 * mmp_manifest_parse_line, and the whole input as a manifest file through
 * the scanner that splits and indexes lines. */
#include "data/manifest.h"
#include "tests/fuzz/fuzz.h"

static mmp_err visit(void *user, const mmp_manifest_entry *e, const char *problem)
{
    (void)problem;
    if (e->image) {
        *(size_t *)user += strlen(e->image);
    }
    if (e->text) {
        *(size_t *)user += strlen(e->text);
    }
    return MMP_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    mmp_manifest_entry e = {0};
    if (mmp_manifest_parse_line((const char *)data, size, &e) == MMP_OK) {
        volatile size_t n = (e.image ? strlen(e.image) : 0) + (e.text ? strlen(e.text) : 0) +
                            (e.id ? strlen(e.id) : 0);
        (void)n;
    }
    mmp_manifest_entry_fini(&e);
    const char *path = fuzz_file(".jsonl", data, size);
    if (path) {
        size_t total = 0;
        mmp_manifest_scan(path, visit, &total);
        unlink(path);
    }
    return 0;
}
