/* A placement's text (coordinator/placement.c), which `mmpipe simulate
 * --costs RUN` reads from a run's metrics.jsonl (balance.placement) and
 * compiles into the schedule it simulates: mmp_placement_parse with the
 * default model's layer counts, then mmp_placement_to_plan and
 * mmp_sched_compile as coordinator/costs.c does. A text it takes formats
 * back to a text it reads as the same placement, and a schedule compiled
 * from a text naming every branch and the fusion (when the compiler takes
 * the plan: replicas past 64 processes are its to refuse) runs that text
 * again. */
#include "common/metrics.h"
#include "coordinator/placement.h"
#include "coordinator/schedule.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    static mmp_plan plan;
    static mmp_sched s;
    static mmp_placement pl, again;
    char text[MMP_METRICS_PLACEMENT_MAX];
    if (size >= sizeof text) {
        return 0; /* metrics.jsonl holds at most this much */
    }
    memcpy(text, data, size);
    text[size] = 0;
    mmp_plan_defaults(&plan);
    plan.train.batch = 64;
    plan.train.microbatches = 8;
    const int il = mmp_plan_image_layers(&plan), tl = mmp_plan_text_layers(&plan);
    if (mmp_placement_parse(text, il, tl, &pl) != MMP_OK) {
        return 0;
    }
    char out[2 * MMP_METRICS_PLACEMENT_MAX], ran[2 * MMP_METRICS_PLACEMENT_MAX];
    mmp_placement_format(&pl, out, sizeof out);
    if (mmp_placement_parse(out, il, tl, &again) != MMP_OK || memcmp(&pl, &again, sizeof pl) != 0) {
        fprintf(stderr, "fuzz_placement: '%s' formats as '%s', which reads differently\n", text,
                out);
        __builtin_trap();
    }
    mmp_placement_to_plan(&pl, &plan);
    /* what the text leaves out is the plan's default (one sub-stage, one
     * replica): a text naming everything compiles to itself */
    int whole = pl.n_sub[0] > 0 && pl.n_sub[1] > 0 && pl.fusion_replicas > 0;
    if (mmp_sched_compile(&s, &plan) == MMP_OK && whole) {
        mmp_placement_str(&s, ran, sizeof ran);
        if (strcmp(ran, out) != 0) {
            fprintf(stderr, "fuzz_placement: '%s' compiles to '%s'\n", out, ran);
            __builtin_trap();
        }
    }
    mmp_sched_fini(&s);
    return 0;
}
