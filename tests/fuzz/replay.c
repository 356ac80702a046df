/* A main for the fuzz harnesses without libFuzzer: runs
 * LLVMFuzzerTestOneInput once on every file named, or in a folder named, on
 * the command line (the seed corpus and the committed crash reproducers),
 * and fails when a folder is empty or a file cannot be read. A crash is the
 * test's failure (under ASan in scripts/test's sanitizer build). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: cannot open\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
    fclose(f);
    if (!buf || got != (size_t)(n > 0 ? n : 0)) {
        free(buf);
        fprintf(stderr, "replay: %s: cannot read\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int bad = 0, runs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: no such file or folder\n", argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += run_file(argv[i]);
            runs++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, alphasort);
        int here = 0;
        for (int k = 0; k < n; k++) {
            if (names[k]->d_name[0] != '.') {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
                bad += run_file(path);
                runs++;
                here++;
            }
            free(names[k]);
        }
        free(names);
        if (here == 0) {
            fprintf(stderr, "replay: %s: no inputs\n", argv[i]);
            bad++;
        }
    }
    fprintf(stderr, "replay: %d inputs, %d problems\n", runs, bad);
    return bad ? 1 : 0;
}
