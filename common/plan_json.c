/* plan.json: the resolved plan, every key of the table and nothing else, as
 * nested JSON objects (sections open and close as the dotted path prefix
 * changes). JSON is YAML, so it loads back as a plan: stage processes load
 * the resolved plan from it. Values are written by the schema engine
 * (mmp_schema_put_json), the same text mmp_plan_key_text gives. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/fsutil.h"
#include "common/plan_schema.h"

/* Splits "a.b.c" into its parts; returns how many. */
static int split_path(const char *path, char parts[][64], int max)
{
    int n = 0;
    while (n < max) {
        size_t len = strcspn(path, ".");
        snprintf(parts[n++], 64, "%.*s", (int)len, path);
        if (!path[len]) {
            break;
        }
        path += len + 1;
    }
    return n;
}

/* Starts the next item of an object at nesting level (0 = the top). */
static void next_item(FILE *f, bool *first, int level)
{
    fputs(first[level] ? "\n" : ",\n", f);
    first[level] = false;
    fprintf(f, "%*s", 2 * (level + 1), "");
}

mmp_err mmp_plan_write_json(const mmp_plan *p, const char *path)
{
    enum { DEPTH = 8 };
    const mmp_schema *s = &mmp_plan_schema;
    /* Written aside and renamed: a resume that fails here (a full disk)
     * must not cut short the plan.json its `resume with` command names.
     * Durable: a checkpoint is resumed with this file. */
    mmp_atomic_file a;
    MMP_TRY(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE));
    FILE *f = a.f;
    char open[DEPTH][64]; /* the sections now open, outermost first */
    bool first[DEPTH + 1] = {true};
    int n_open = 0;
    /* A section given as its word (`stages: auto`) is written so, not as
     * the keys it stands for: a resume from this file plans again, as the
     * launch did (the placement it chose goes in when it is taken). */
    const char *ws = s->word_section.path;
    size_t ws_len = ws ? strlen(ws) : 0;
    int word = ws && *(const int *)((const char *)p + s->word_section.field);
    int word_done = 0;
    fputs("{", f);
    for (int i = 0; i < s->n_keys; i++) {
        if (word && strncmp(s->keys[i].path, ws, ws_len) == 0 && s->keys[i].path[ws_len] == '.') {
            while (!word_done && n_open > 0) {
                n_open--;
                fprintf(f, "\n%*s}", 2 * (n_open + 1), "");
            }
            if (!word_done) {
                next_item(f, first, 0);
                fprintf(f, "\"%s\": \"%s\"", ws, s->word_section.word);
                word_done = 1;
            }
            continue;
        }
        char parts[DEPTH][64];
        int n = split_path(s->keys[i].path, parts, DEPTH);
        int common = 0;
        while (common < n_open && common < n - 1 && strcmp(open[common], parts[common]) == 0) {
            common++;
        }
        while (n_open > common) { /* close the sections this key is not in */
            n_open--;
            fprintf(f, "\n%*s}", 2 * (n_open + 1), "");
        }
        while (n_open < n - 1) { /* open the ones it is in */
            next_item(f, first, n_open);
            fprintf(f, "\"%s\": {", parts[n_open]);
            snprintf(open[n_open], sizeof open[n_open], "%s", parts[n_open]);
            first[++n_open] = true;
        }
        next_item(f, first, n_open);
        fprintf(f, "\"%s\": ", parts[n - 1]);
        mmp_schema_put_json(f, &s->keys[i], p);
    }
    while (n_open > 0) {
        n_open--;
        fprintf(f, "\n%*s}", 2 * (n_open + 1), "");
    }
    fputs("\n}\n", f);
    return mmp_atomic_commit(&a);
}
