/* Placements and their forms (coordinator/placement.h). */
#include "coordinator/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const BRANCH_NAMES[2] = {"image", "text"};

void mmp_placement_of_sched(const mmp_sched *s, mmp_placement *pl)
{
    memset(pl, 0, sizeof *pl);
    for (int i = 0; i<s->n_stages; i += s->stages[i].n_replicas> 0 ? s->stages[i].n_replicas : 1) {
        const mmp_sched_stage *g = &s->stages[i];
        if (g->kind == MMP_KIND_FUSION) {
            pl->fusion_replicas = g->n_replicas;
            continue;
        }
        int br = g->kind == MMP_KIND_IMAGE ? MMP_PLANNER_IMAGE : MMP_PLANNER_TEXT;
        MMP_ASSERT(g->sub >= 0 && g->sub < MMP_PLANNER_MAX_SUB);
        pl->n_sub[br] = g->n_sub;
        pl->sub[br][g->sub] = (mmp_planner_stage){
            .first = g->layer_first, .last = g->layer_last, .replicas = g->n_replicas};
    }
}

void mmp_placement_to_plan(const mmp_placement *pl, mmp_plan *p)
{
    mmp_stage_cfg *cfg[2] = {&p->stages.image, &p->stages.text};
    for (int br = 0; br < 2; br++) {
        int n = pl->n_sub[br];
        MMP_ASSERT(n >= 0 && n <= MMP_MAX_SPLITS + 1);
        cfg[br]->n_split = n > 0 ? n - 1 : 0;
        cfg[br]->n_replicas = n;
        for (int j = 0; j < n; j++) {
            if (j < n - 1) {
                cfg[br]->split[j] = pl->sub[br][j].last;
            }
            cfg[br]->replicas[j] = pl->sub[br][j].replicas;
        }
    }
    p->stages.fusion.n_split = 0;
    p->stages.fusion.n_replicas = pl->fusion_replicas > 0 ? 1 : 0;
    p->stages.fusion.replicas[0] = pl->fusion_replicas;
}

const char *mmp_placement_format(const mmp_placement *pl, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int br = 0; br < 2; br++) {
        for (int j = 0; j < pl->n_sub[br]; j++) {
            const mmp_planner_stage *g = &pl->sub[br][j];
            if (pl->n_sub[br] > 1) {
                len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%s.%d[%d:%d):%d",
                                        len ? " " : "", BRANCH_NAMES[br], j, g->first, g->last,
                                        g->replicas);
            } else {
                len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%s.%d:%d",
                                        len ? " " : "", BRANCH_NAMES[br], j, g->replicas);
            }
        }
    }
    if (pl->fusion_replicas > 0) { /* missing, as parse reads a text without it */
        snprintf(buf + len, len < n ? n - len : 0, "%sfusion:%d", len ? " " : "",
                 pl->fusion_replicas);
    }
    return buf;
}

const char *mmp_placement_str(const mmp_sched *s, char *buf, size_t n)
{
    mmp_placement pl;
    mmp_placement_of_sched(s, &pl);
    return mmp_placement_format(&pl, buf, n);
}

/* One token into pl; 0 ok, -1 when it is not a placement token. */
static int parse_token(const char *t, const int layers[2], mmp_placement *pl)
{
    int br = strncmp(t, "image.", 6) == 0                                ? 0
             : strncmp(t, "text.", 5) == 0                               ? 1
             : strcmp(t, "fusion") == 0 || strncmp(t, "fusion:", 7) == 0 ? 2
                                                                         : -1;
    const char *colon = strrchr(t, ':');
    const char *br_open = strchr(t, '[');
    int reps = 0, sub = 0, first = 0, last = 0, used = 0;
    if (br < 0 || !colon || sscanf(colon + 1, "%d%n", &reps, &used) != 1 || colon[1 + used] ||
        reps < 1 || reps > MMP_SCHED_MAX_STAGES) {
        return -1;
    }
    if (br == 2) {
        pl->fusion_replicas = reps;
        return 0;
    }
    if (sscanf(t + (br ? 5 : 6), "%d", &sub) != 1 || sub != pl->n_sub[br] || sub > MMP_MAX_SPLITS) {
        return -1;
    }
    if (br_open) {
        if (sscanf(br_open, "[%d:%d)", &first, &last) != 2 || last <= first) {
            return -1;
        }
    } else {
        first = 0;
        last = layers[br];
    }
    if (sub > 0 && pl->sub[br][sub - 1].last != first) {
        return -1;
    }
    pl->sub[br][sub] = (mmp_planner_stage){.first = first, .last = last, .replicas = reps};
    pl->n_sub[br]++;
    return 0;
}

mmp_err mmp_placement_parse(const char *text, int image_layers, int text_layers, mmp_placement *pl)
{
    memset(pl, 0, sizeof *pl);
    const int layers[2] = {image_layers, text_layers};
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (parse_token(t, layers, pl) != 0) {
            return mmp_errorf(MMP_ERR_DATA, "cannot read the placement '%s' at '%s'", text, t);
        }
    }
    /* A cut branch's ranges cover its layers, no more, no fewer. */
    for (int br = 0; br < 2; br++) {
        int n = pl->n_sub[br];
        if (n > 0 && (pl->sub[br][0].first != 0 || pl->sub[br][n - 1].last != layers[br])) {
            int first = pl->sub[br][0].first, last = pl->sub[br][n - 1].last;
            memset(pl, 0, sizeof *pl);
            return mmp_errorf(MMP_ERR_DATA,
                              "cannot read the placement '%s': its %s sub-stages hold layers "
                              "[%d, %d), the plan's branch [0, %d)",
                              text, BRANCH_NAMES[br], first, last, layers[br]);
        }
    }
    return MMP_OK;
}

const char *mmp_edge_transport(mmp_data_transport want, int cross_host, int from_device,
                               int to_device)
{
    int gpus = want == MMP_DATA_AUTO && from_device >= 0 && to_device >= 0;
    if (cross_host) {
        return gpus ? "nccl" : "tcp";
    }
    if (want == MMP_DATA_TCP) {
        return "tcp";
    }
    return gpus ? "cuda_ipc" : "shm";
}

const char *mmp_reduce_transport(mmp_data_transport want, int cross_host, int all_gpus,
                                 int have_nccl)
{
    if (!cross_host && want != MMP_DATA_TCP) {
        return "shm";
    }
    return cross_host && all_gpus && want == MMP_DATA_AUTO && have_nccl ? "nccl" : "tcp";
}

int mmp_replicas_own_gpus(const int *host, const int *device, int n)
{
    for (int i = 0; i < n; i++) {
        if (device[i] < 0) {
            return 0;
        }
        for (int j = 0; j < i; j++) {
            if (host[j] == host[i] && device[j] == device[i]) {
                return 0;
            }
        }
    }
    return 1;
}

int mmp_procs_share_gpu(const mmp_plan *p, int n_procs)
{
    int slots = mmp_plan_slots(p);
    if (slots <= 0) {
        return 0;
    }
    for (int i = 0; i < n_procs; i++) {
        int si = i % slots, di = mmp_plan_slot_device(p, si);
        for (int j = 0; di >= 0 && j < i; j++) {
            int sj = j % slots;
            if (mmp_plan_slot_device(p, sj) == di &&
                mmp_plan_slot_host(p, sj) == mmp_plan_slot_host(p, si)) {
                return 1;
            }
        }
    }
    return 0;
}

int mmp_procs_most_on_device(const mmp_plan *p, int n_procs)
{
    int slots = mmp_plan_slots(p), most = 1;
    for (int i = 0; slots > 0 && i < n_procs; i++) {
        int si = i % slots, di = mmp_plan_slot_device(p, si), here = 1;
        for (int j = 0; j < i; j++) {
            int sj = j % slots;
            here += di < 0 ? sj == si
                           : mmp_plan_slot_device(p, sj) == di &&
                                 mmp_plan_slot_host(p, sj) == mmp_plan_slot_host(p, si);
        }
        most = here > most ? here : most;
    }
    return most;
}
