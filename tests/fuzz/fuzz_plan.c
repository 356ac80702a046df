/* YAML plans and --set overrides (common/config.c). The input is a plan
 * file, optionally followed by a line "#--set" and one override per line
 * ("a.b=c"); mmp_plan_load reads the file and applies them. */
#include "common/config.h"
#include "tests/fuzz/fuzz.h"

#define MAX_SETS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    static const char sep[] = "\n#--set\n";
    size_t yaml = size;
    for (size_t i = 0; i + sizeof sep - 1 <= size; i++) {
        if (memcmp(data + i, sep, sizeof sep - 1) == 0) {
            yaml = i + 1;
            break;
        }
    }
    char *sets_buf = NULL;
    const char *sets[MAX_SETS];
    int n_sets = 0;
    if (yaml < size) {
        size_t off = yaml + sizeof sep - 2, n = size - off;
        sets_buf = malloc(n + 1);
        if (!sets_buf) {
            return 0;
        }
        memcpy(sets_buf, data + off, n);
        sets_buf[n] = 0;
        for (char *s = sets_buf, *e; s && *s && n_sets < MAX_SETS; s = e) {
            e = strchr(s, '\n');
            if (e) {
                *e++ = 0;
            }
            if (*s) {
                sets[n_sets++] = s;
            }
        }
    }
    const char *path = fuzz_file(".yaml", data, yaml);
    if (path) {
        static mmp_plan p;
        mmp_plan_load(&p, path, sets, n_sets);
        unlink(path);
    }
    free(sets_buf);
    return 0;
}
