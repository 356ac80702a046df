/* mmpipe simulate: the plan's schedule on paper. Compiles and checks the
 * schedule, then predicts one step with the discrete-event simulator
 * (coordinator/schedule.h): per-stage busy and idle time, step time,
 * throughput and bubble, from a nominal cost model or from the per-micro-batch
 * costs a run measured (its metrics.jsonl). With --plan-devices it also asks
 * the planner (coordinator/planner.h) for the best placement on that many
 * devices, from the same costs per layer. Reads files only; it never
 * launches or touches a stage. */
#include <errno.h>
#include <libfyaml.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "common/config.h"
#include "coordinator/planner.h"
#include "coordinator/schedule.h"

static const char USAGE[] =
    "usage: mmpipe simulate PLAN.yaml [--costs FILE] [--set KEY=VALUE]... [--dump]\n"
    "                       [--plan-devices N|all]\n"
    "\n"
    "Compiles the plan's schedule (train.schedule, train.microbatches, the\n"
    "stages' splits), checks it (matching sends and receives, F before B, no\n"
    "deadlock, in-flight memory bound) and simulates one training step: per\n"
    "stage busy and idle time, then step time, samples/s and bubble (idle share).\n"
    "\n"
    "options:\n"
    "  --costs FILE     costs a run measured: its metrics.jsonl, or the run\n"
    "                   directory. Uses the median over steps (the first, warm-up,\n"
    "                   left out) of each stage's fwd_ms, bwd_ms and load_ms per\n"
    "                   micro-batch, and of send_ms and overhead_ms when present;\n"
    "                   shows the measured step time beside the prediction.\n"
    "                   Without it: nominal costs, forward 0.1 ms per layer per\n"
    "                   sample, backward twice that, load/send/overhead free.\n"
    "  --set KEY=VALUE  override a plan key (repeatable), e.g.\n"
    "                   --set train.schedule=gpipe --set train.microbatches=16\n"
    "  --dump           print every stage's instruction list: L load, Ra/Sa\n"
    "                   receive/send activations, F forward, Rg/Sg receive/send\n"
    "                   gradients, B backward (each with its micro-batch), NORM\n"
    "                   grad-norm barrier, OPT optimizer step; :eK names the edge\n"
    "                   where a stage has several in one role\n"
    "  --plan-devices N|all\n"
    "                   also choose a placement for N devices ('all': every device\n"
    "                   in the plan's hosts) with the planner: where to cut each\n"
    "                   branch into sub-stages and how many replicas each sub-stage\n"
    "                   and fusion get, minimising the bottleneck stage. It uses the\n"
    "                   costs above per layer and per sample (measured ones spread\n"
    "                   evenly over each stage's layers) and prints the placement,\n"
    "                   its predicted step time, samples/s and balance efficiency\n"
    "                   (busy time / (devices x step time)), and the time planning\n"
    "                   took. Memory is not modelled here (no per-layer sizes)\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status: 0 ok, 1 a plan, costs or schedule error, 2 usage error.\n";

#define NOMINAL_FWD_MS_PER_LAYER_SAMPLE 0.1

/* Per-step samples of one quantity, for its median. */
typedef struct series {
    double *v;
    int n;
} series;

typedef struct measured {
    int records; /* step records read, the first included */
    series fwd[MMP_SCHED_MAX_STAGES], bwd[MMP_SCHED_MAX_STAGES], load[MMP_SCHED_MAX_STAGES];
    series step, send, overhead;
} measured;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of the values after the first (the warm-up step) when there are
 * two or more; sorts in place. */
static double median(series *s)
{
    double *v = s->v + (s->n > 1);
    int n = s->n - (s->n > 1);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void measured_fini(measured *m)
{
    for (int i = 0; i < MMP_SCHED_MAX_STAGES; i++) {
        free(m->fwd[i].v);
        free(m->bwd[i].v);
        free(m->load[i].v);
    }
    free(m->step.v);
    free(m->send.v);
    free(m->overhead.v);
    memset(m, 0, sizeof *m);
}

/* Reads one step record (a JSON object on line lineno) into m's next slot;
 * diag collects the parser's complaints (it must print nothing). Returns 1
 * when it was a step record, 0 for a line without "stages", -1 on an error
 * (printed). */
static int read_record(const char *path, int lineno, const char *line, size_t len,
                       struct fy_diag *diag, const mmp_sched *s, measured *m, const char *placement)
{
    /* A balanced run changes placement: only the steps of the one simulated count. */
    char want[1100];
    snprintf(want, sizeof want, "\"placement\":\"%s\"", placement);
    if (placement[0] && !strstr(line, want)) {
        return 0;
    }
    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET | FYPCF_JSON_FORCE, .diag = diag};
    struct fy_document *doc = fy_document_build_from_string(&cfg, line, len);
    struct fy_node *root = doc ? fy_document_root(doc) : NULL;
    int ret = -1, k = m->records;
    if (!root) {
        void *iter = NULL;
        struct fy_diag_error *e = fy_diag_errors_iterate(diag, &iter);
        fprintf(stderr, "mmpipe simulate: %s:%d:%d: malformed JSON: %s\n", path, lineno,
                e && e->column > 0 ? e->column : 1, e && e->msg ? e->msg : "cannot parse");
        goto exit;
    }
    if (!fy_node_is_mapping(root)) {
        fprintf(stderr, "mmpipe simulate: %s:%d: not a JSON object\n", path, lineno);
        goto exit;
    }
    struct fy_node *stages = fy_node_mapping_lookup_value_by_simple_key(root, "stages", 6);
    if (!stages) {
        ret = 0;
        goto exit;
    }
    if (!fy_node_is_sequence(stages)) {
        fprintf(stderr, "mmpipe simulate: %s:%d: \"stages\" is not a list\n", path, lineno);
        goto exit;
    }
    double v;
    if (mmp_cli_json_number(root, "step_ms", &v) != 1) {
        fprintf(stderr, "mmpipe simulate: %s:%d: no step_ms number\n", path, lineno);
        goto exit;
    }
    m->step.v[m->step.n++] = v;
    static const char *const top_keys[] = {"send_ms", "overhead_ms"};
    series *top[] = {&m->send, &m->overhead};
    for (int i = 0; i < 2; i++) {
        int got = mmp_cli_json_number(root, top_keys[i], &v);
        if (got < 0) {
            fprintf(stderr, "mmpipe simulate: %s:%d: %s is not a number\n", path, lineno,
                    top_keys[i]);
            goto exit;
        }
        if (got) {
            top[i]->v[top[i]->n++] = v;
        }
    }
    /* A stage with replicas appears once per replica: average them. */
    double sum[3][MMP_SCHED_MAX_STAGES] = {{0}};
    int count[MMP_SCHED_MAX_STAGES] = {0};
    void *iter = NULL;
    struct fy_node *item;
    while ((item = fy_node_sequence_iterate(stages, &iter)) != NULL) {
        const char *name = fy_node_is_mapping(item)
                               ? fy_node_mapping_lookup_scalar0_by_simple_key(item, "name", 4)
                               : NULL;
        if (!name) {
            fprintf(stderr, "mmpipe simulate: %s:%d: a stages entry without a name\n", path,
                    lineno);
            goto exit;
        }
        int replica = 0;
        if (mmp_cli_json_number(item, "replica", &v) == 1) {
            replica = (int)v;
        }
        int st = -1;
        for (int i = 0; i < s->n_stages; i++) {
            if (strcmp(s->stages[i].name, name) == 0 && s->stages[i].replica == replica) {
                st = i;
            }
        }
        if (st < 0) {
            continue; /* a process this placement does not have */
        }
        static const char *const keys[] = {"fwd_ms", "bwd_ms", "load_ms"};
        for (int i = 0; i < 3; i++) {
            int got = mmp_cli_json_number(item, keys[i], &v);
            if (got < 0 || (got == 0 && i < 2)) {
                fprintf(stderr, "mmpipe simulate: %s:%d: stage %s: %s %s\n", path, lineno, name,
                        keys[i], got ? "is not a number" : "is missing");
                goto exit;
            }
            sum[i][st] += got ? v : 0;
        }
        count[st]++;
    }
    for (int st = 0; st < s->n_stages; st++) {
        /* a replica without its own entry: its stage's other replicas */
        for (int r = 0; !count[st] && r < s->n_stages; r++) {
            if (count[r] && strcmp(s->stages[r].name, s->stages[st].name) == 0) {
                for (int i = 0; i < 3; i++) {
                    sum[i][st] = sum[i][r];
                }
                count[st] = count[r];
            }
        }
        if (!count[st]) {
            fprintf(stderr,
                    "mmpipe simulate: %s:%d: no stage \"%s\" in this step's stages (the plan has "
                    "it; were the costs measured with another placement?)\n",
                    path, lineno, s->stages[st].name);
            goto exit;
        }
        m->fwd[st].v[k] = sum[0][st] / count[st];
        m->bwd[st].v[k] = sum[1][st] / count[st];
        m->load[st].v[k] = sum[2][st] / count[st];
        m->fwd[st].n = m->bwd[st].n = m->load[st].n = k + 1;
    }
    m->records++;
    ret = 1;
exit:
    fy_document_destroy(doc);
    return ret;
}

/* The placement of a run's last step ("image.0[0:3):2 image.1[3:6):1 text.0:1
 * fusion:1", see coordinator/balancer.h) into out; "" when its metrics carry
 * none. */
static void last_placement(const char *arg, char *out, size_t n)
{
    char path[1100];
    struct stat sb;
    snprintf(path, sizeof path, stat(arg, &sb) == 0 && S_ISDIR(sb.st_mode) ? "%s/metrics.jsonl" : "%s",
             arg);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        const char *at = strstr(line, "\"placement\":\"");
        if (at) {
            at += strlen("\"placement\":\"");
            size_t len = strcspn(at, "\"");
            snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), at);
        }
    }
    free(line);
    fclose(f);
}

/* Sets p's stages.* to placement (last_placement's form). 0 ok, 1 when it
 * cannot be read (printed). */
static int apply_placement(mmp_plan *p, const char *placement)
{
    mmp_stage_cfg *cfg[3] = {&p->stages.image, &p->stages.text, &p->stages.fusion};
    for (int b = 0; b < 3; b++) {
        cfg[b]->n_split = 0;
        cfg[b]->n_replicas = 0;
    }
    char buf[1100];
    snprintf(buf, sizeof buf, "%s", placement);
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        int b = strncmp(t, "image.", 6) == 0 ? 0 : strncmp(t, "text.", 5) == 0 ? 1
                : strncmp(t, "fusion", 6) == 0                           ? 2
                                                                          : -1;
        int first = 0, last = 0, reps = 0, sub = 0;
        const char *colon = strrchr(t, ':');
        const char *br = strchr(t, '[');
        if (b < 0 || !colon || sscanf(colon + 1, "%d", &reps) != 1 || reps < 1 ||
            (br && sscanf(br, "[%d:%d)", &first, &last) != 2) ||
            (b < 2 && sscanf(t + (b ? 5 : 6), "%d", &sub) != 1) || sub != cfg[b]->n_replicas ||
            sub > MMP_MAX_SPLITS) {
            fprintf(stderr, "mmpipe simulate: cannot read the measured placement '%s' at '%s'\n",
                    placement, t);
            return 1;
        }
        if (sub > 0) {
            cfg[b]->split[cfg[b]->n_split++] = first;
        }
        cfg[b]->replicas[cfg[b]->n_replicas++] = reps;
    }
    return 0;
}

/* Fills c with the medians of a run's metrics (path: metrics.jsonl or the run
 * directory); *step_ms and *n_steps get the measured step time and how many
 * steps it is the median of. 0 ok, 1 error (printed). */
static int read_costs(const char *arg, const mmp_sched *s, mmp_sim_costs *c, double *step_ms,
                      int *n_steps, char *path, size_t path_n, const char *placement)
{
    struct stat sb;
    if (stat(arg, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(path, path_n, "%s/metrics.jsonl", arg);
    } else {
        snprintf(path, path_n, "%s", arg);
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "mmpipe simulate: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct fy_diag_cfg dcfg;
    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.output_fn = mmp_cli_json_quiet;
    dcfg.level = FYET_ERROR;
    struct fy_diag *diag = fy_diag_create(&dcfg);
    if (diag) {
        fy_diag_set_collect_errors(diag, true);
    }
    int lines = 0, ch, ret = 1;
    while ((ch = fgetc(f)) != EOF) {
        lines += ch == '\n';
    }
    lines++;
    rewind(f);
    measured m;
    memset(&m, 0, sizeof m);
    char *line = NULL;
    size_t cap = 0;
    series *all[3 * MMP_SCHED_MAX_STAGES + 3];
    int n_all = 0;
    for (int st = 0; st < s->n_stages; st++) {
        all[n_all++] = &m.fwd[st];
        all[n_all++] = &m.bwd[st];
        all[n_all++] = &m.load[st];
    }
    all[n_all++] = &m.step;
    all[n_all++] = &m.send;
    all[n_all++] = &m.overhead;
    for (int i = 0; i < n_all; i++) {
        all[i]->v = malloc((size_t)lines * sizeof *all[i]->v);
        if (!all[i]->v || !diag) {
            fprintf(stderr, "mmpipe simulate: out of memory reading %s\n", path);
            goto exit;
        }
    }
    ssize_t len;
    for (int lineno = 1; (len = getline(&line, &cap, f)) >= 0; lineno++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) {
            line[--len] = 0; /* keeps the parser's column on this line */
        }
        if (strspn(line, " \t") == (size_t)len) {
            continue;
        }
        if (read_record(path, lineno, line, (size_t)len, diag, s, &m, placement) < 0) {
            goto exit;
        }
    }
    if (m.records == 0) {
        fprintf(stderr, "mmpipe simulate: %s: no step records (lines with \"stages\")\n", path);
        goto exit;
    }
    memset(c, 0, sizeof *c);
    for (int st = 0; st < s->n_stages; st++) {
        c->fwd_ms[st] = median(&m.fwd[st]);
        c->bwd_ms[st] = median(&m.bwd[st]);
        c->load_ms[st] = median(&m.load[st]);
    }
    c->send_ms = m.send.n ? median(&m.send) : 0;
    c->step_overhead_ms = m.overhead.n ? median(&m.overhead) : 0;
    *step_ms = median(&m.step);
    *n_steps = m.records - (m.records > 1);
    ret = 0;
exit:
    free(line);
    measured_fini(&m);
    if (diag) {
        fy_diag_destroy(diag);
    }
    fclose(f);
    return ret;
}

/* The nominal model: forward cost proportional to layers and samples. */
static void nominal_costs(const mmp_plan *p, const mmp_sched *s, mmp_sim_costs *c)
{
    memset(c, 0, sizeof *c);
    double samples = (double)p->train.batch / p->train.microbatches;
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        int layers =
            g->kind == MMP_KIND_FUSION ? p->model.fusion.layers : g->layer_last - g->layer_first;
        if (p->compute == MMP_COMPUTE_SIMULATED) {
            /* the plan's own costs, on the slot the coordinator gives process st */
            int slots = mmp_plan_slots(p), slot = slots > 0 ? st % slots : 0;
            int n = mmp_plan_mb_size(p, 0);
            c->fwd_ms[st] = mmp_plan_sim_ms(p, (mmp_branch)g->kind, g->layer_first, g->layer_last,
                                            n, 0, 0, slot);
            c->bwd_ms[st] = mmp_plan_sim_ms(p, (mmp_branch)g->kind, g->layer_first, g->layer_last,
                                            n, 0, 1, slot);
            continue;
        }
        c->fwd_ms[st] = NOMINAL_FWD_MS_PER_LAYER_SAMPLE * layers * samples;
        c->bwd_ms[st] = 2 * c->fwd_ms[st];
    }
}

static void dump(const mmp_sched *s)
{
    printf("\nedges:\n");
    for (int e = 0; e < s->n_edges; e++) {
        const mmp_sched_edge *E = &s->edges[e];
        printf("  e%d %s -> %s, %s, %d slot%s\n", e, s->stages[E->from].proc, s->stages[E->to].proc,
               E->grad ? "gradients" : "activations", E->slots, E->slots == 1 ? "" : "s");
    }
    printf("instruction lists:\n");
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        printf("%s:", g->n_replicas > 1 ? g->proc : g->name);
        for (int pc = 0; pc < g->n_prog; pc++) {
            char tok[32];
            printf(" %s", mmp_instr_compact(s, st, &g->prog[pc], tok, sizeof tok));
        }
        printf("\n");
    }
}

static void report(const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c,
                   const mmp_sim_result *r)
{
    printf("%-10s %-9s %5s %9s %9s %9s %9s %10s %10s %7s\n", "stage", "layers", "depth",
           "in-flight", "load ms", "fwd ms", "bwd ms", "busy ms", "idle ms", "bubble");
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        char layers[32], inflight[32];
        snprintf(layers, sizeof layers, "[%d,%d)", g->layer_first, g->layer_last);
        snprintf(inflight, sizeof inflight, "%d/%d", g->max_inflight, g->inflight_bound);
        printf("%-10s %-9s %5d %9s %9.3f %9.3f %9.3f %10.3f %10.3f %6.1f%%\n",
               g->n_replicas > 1 ? g->proc : g->name, layers,
               g->depth, inflight, c->load_ms[st], c->fwd_ms[st], c->bwd_ms[st], r->busy_ms[st],
               r->idle_ms[st], r->step_ms > 0 ? 100 * r->idle_ms[st] / r->step_ms : 0.0);
    }
    printf("(costs per micro-batch; in-flight: most micro-batches held / the schedule's "
           "bound)\n");
    printf("\npredicted step time %.3f ms, %.1f samples/s, bubble %.1f%%\n", r->step_ms,
           r->step_ms > 0 ? p->train.batch / (r->step_ms / 1000) : 0.0, 100 * r->bubble);
}

/* The per-layer, per-sample costs behind c: each stage's per-micro-batch
 * times spread evenly over its layers and samples (the nominal model is
 * per layer already, so it comes back exactly). Fusion is one unit. The
 * arrays hold the branches' layer counts and fusion's one entry. */
static void layer_costs(const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c,
                        double *fwd[3], double *bwd[3])
{
    double samples = (double)p->train.batch / p->train.microbatches;
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        int u = g->kind == MMP_KIND_IMAGE ? 0 : g->kind == MMP_KIND_TEXT ? 1 : 2;
        int first = u < 2 ? g->layer_first : 0, last = u < 2 ? g->layer_last : 1;
        for (int l = first; l < last; l++) {
            fwd[u][l] = c->fwd_ms[st] / (samples * (last - first));
            bwd[u][l] = c->bwd_ms[st] / (samples * (last - first));
        }
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Plans a placement for devices with the planner and prints it. 0 ok, 1 error
 * (printed). */
static int plan_placement(const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c,
                          int measured, int devices)
{
    const int n[3] = {mmp_plan_image_layers(p), mmp_plan_text_layers(p), 1};
    double *fwd[3] = {NULL, NULL, NULL}, *bwd[3] = {NULL, NULL, NULL};
    int ret = 1;
    for (int u = 0; u < 3; u++) {
        fwd[u] = calloc((size_t)n[u], sizeof *fwd[u]);
        bwd[u] = calloc((size_t)n[u], sizeof *bwd[u]);
        if (!fwd[u] || !bwd[u]) {
            fprintf(stderr, "mmpipe simulate: out of memory for the planner's costs\n");
            goto exit;
        }
    }
    layer_costs(p, s, c, fwd, bwd);
    mmp_planner_input in;
    memset(&in, 0, sizeof in);
    mmp_planner_layers *units[3] = {&in.branch[MMP_PLANNER_IMAGE], &in.branch[MMP_PLANNER_TEXT],
                                    &in.fusion};
    for (int u = 0; u < 3; u++) {
        units[u]->n = n[u];
        units[u]->fwd_ms = fwd[u];
        units[u]->bwd_ms = bwd[u];
    }
    in.devices = devices;
    in.batch = p->train.batch;
    in.microbatches = p->train.microbatches;
    in.schedule = p->train.schedule;
    in.send_ms = c->send_ms;
    in.step_overhead_ms = c->step_overhead_ms;
    in.method = MMP_PLANNER_AUTO;
    mmp_planner_result r;
    double t0 = now_s();
    mmp_err e = mmp_planner_plan(&in, &r);
    double took = now_s() - t0;
    if (e != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: --plan-devices %d: %s\n", devices, mmp_last_error());
        goto exit;
    }
    const mmp_planner_eval *v = &r.eval;
    printf("\nplanner: %d devices, %s per-layer costs, %d micro-batches of %d samples at most; "
           "planned in %.1f ms (%d candidates, %d simulated)\n",
           devices, measured ? "measured" : "nominal", p->train.microbatches,
           (p->train.batch + p->train.microbatches - 1) / p->train.microbatches, 1000 * took,
           r.candidates, r.simulated);
    printf("%-10s %-9s %8s %12s %10s\n", "stage", "layers", "replicas", "ms/mb/repl", "busy");
    static const char *const names[2] = {"image", "text"};
    for (int b = 0; b < 2; b++) {
        for (int j = 0; j < r.placement.n_sub[b]; j++) {
            const mmp_planner_stage *g = &r.placement.sub[b][j];
            char name[32], layers[32];
            snprintf(name, sizeof name, "%s.%d", names[b], j);
            snprintf(layers, sizeof layers, "[%d,%d)", g->first, g->last);
            printf("%-10s %-9s %8d %12.3f %9.1f%%\n", name, layers, g->replicas, v->stage_ms[b][j],
                   100 * p->train.microbatches * v->stage_ms[b][j] / v->step_ms);
        }
    }
    printf("%-10s %-9s %8d %12.3f %9.1f%%\n", "fusion", "[0,1)", r.placement.fusion_replicas,
           v->fusion_ms, 100 * p->train.microbatches * v->fusion_ms / v->step_ms);
    printf("(ms/mb/repl: one replica's forward + backward per micro-batch; busy: its share of "
           "the step)\nas plan keys:");
    for (int b = 0; b < 2; b++) {
        printf(" stages.%s.split: [", names[b]);
        for (int j = 1; j < r.placement.n_sub[b]; j++) {
            printf("%s%d", j > 1 ? ", " : "", r.placement.sub[b][j].first);
        }
        printf("], stages.%s.replicas: [", names[b]);
        for (int j = 0; j < r.placement.n_sub[b]; j++) {
            printf("%s%d", j ? ", " : "", r.placement.sub[b][j].replicas);
        }
        printf("],");
    }
    printf(" stages.fusion.replicas: %d\n", r.placement.fusion_replicas);
    printf("\npredicted step time %.3f ms (%s; closed form %.3f ms), %.1f samples/s, balance "
           "efficiency %.1f%% (busy / (%d devices x step)); %d of %d devices used; bottleneck "
           "%.3f ms per micro-batch (the least any placement reaches: %.3f)\n",
           v->step_ms, mmp_planner_method_name(v->method), v->closed_form_ms, v->samples_per_s,
           100 * v->efficiency, devices, v->devices_used, devices, v->bottleneck_ms, r.bound_ms);
    ret = 0;
exit:
    for (int u = 0; u < 3; u++) {
        free(fwd[u]);
        free(bwd[u]);
    }
    return ret;
}

int mmp_cmd_simulate(int argc, char **argv)
{
    const char *plan_path = NULL, *costs_arg = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int n_sets = 0, want_dump = 0, ret = 1;
    const char *plan_devices = NULL;
    static mmp_plan plan;
    static mmp_sched sched;
    memset(&sched, 0, sizeof sched);
    if (!sets) {
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(USAGE, stdout);
            ret = 0;
            goto exit;
        } else if (strcmp(a, "--dump") == 0) {
            want_dump = 1;
        } else if (strcmp(a, "--plan-devices") == 0 && i + 1 < argc) {
            plan_devices = argv[++i];
        } else if ((strcmp(a, "--costs") == 0 || strcmp(a, "--set") == 0) && i + 1 < argc) {
            if (strcmp(a, "--costs") == 0) {
                costs_arg = argv[++i];
            } else {
                sets[n_sets++] = argv[++i];
            }
        } else if ((ret = mmp_cli_take_plan("simulate", USAGE, a, &plan_path)) != 0) {
            goto exit;
        }
    }
    if ((ret = mmp_cli_need_plan("simulate", USAGE, plan_path)) != 0) {
        goto exit;
    }
    ret = 1;
    int devices = 0;
    if (plan_devices && strcmp(plan_devices, "all") != 0) {
        char *end;
        long v = strtol(plan_devices, &end, 10);
        if (*end || end == plan_devices || v < 1 || v > MMP_PLANNER_MAX_DEVICES) {
            fprintf(stderr,
                    "mmpipe simulate: --plan-devices '%s': expected a device count (1 to %d) or "
                    "'all'\n",
                    plan_devices, MMP_PLANNER_MAX_DEVICES);
            ret = 2;
            goto exit;
        }
        devices = (int)v;
    }
    char placement[1100] = "";
    if (mmp_plan_load(&plan, plan_path, sets, n_sets) != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: %s\n", mmp_last_error());
        goto exit;
    }
    if (costs_arg) {
        /* Costs measured on another placement (a balanced run re-places its
         * stages) are simulated on the placement they were measured on. */
        last_placement(costs_arg, placement, sizeof placement);
        if (placement[0] && apply_placement(&plan, placement) != 0) {
            goto exit;
        }
    }
    if (mmp_sched_compile(&sched, &plan) != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: %s\n", mmp_last_error());
        goto exit;
    }
    mmp_sim_costs costs;
    double measured_ms = 0;
    int n_steps = 0;
    char costs_path[1100];
    if (costs_arg) {
        if (read_costs(costs_arg, &sched, &costs, &measured_ms, &n_steps, costs_path,
                       sizeof costs_path, placement) != 0) {
            goto exit;
        }
    } else {
        nominal_costs(&plan, &sched, &costs);
    }
    mmp_sim_result r;
    if (mmp_sched_simulate(&sched, &costs, &r) != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: %s\n", mmp_last_error());
        goto exit;
    }
    printf("plan %s: schedule %s, %d micro-batches of %.4g samples (batch %d), %d stages\n",
           plan_path, mmp_schedule_name(sched.kind), sched.microbatches,
           (double)plan.train.batch / sched.microbatches, plan.train.batch, sched.n_stages);
    if (costs_arg) {
        printf("costs: measured, medians over %d step%s of %s (first step left out as warm-up); "
               "send %.3f ms per message, step overhead %.3f ms\n",
               n_steps, n_steps == 1 ? "" : "s", costs_path, costs.send_ms, costs.step_overhead_ms);
        printf("placement: %s (the run's last)\n\n", placement[0] ? placement : "the plan's");
    } else if (plan.compute == MMP_COMPUTE_SIMULATED) {
        printf("costs: the plan's sim.* (compute: simulated), per device slot's slowdown; "
               "load/send/step overhead free\n\n");
    } else {
        printf("nominal costs (not measured): forward %.2g ms per layer per sample, backward 2x "
               "forward, load/send/step overhead free\n\n",
               NOMINAL_FWD_MS_PER_LAYER_SAMPLE);
    }
    report(&plan, &sched, &costs, &r);
    if (costs_arg) {
        printf("measured step time %.3f ms (median of %d step%s), prediction error %+.1f%%\n",
               measured_ms, n_steps, n_steps == 1 ? "" : "s",
               measured_ms > 0 ? 100 * (r.step_ms - measured_ms) / measured_ms : 0.0);
    }
    if (want_dump) {
        dump(&sched);
    }
    if (plan_devices) {
        if (devices == 0) { /* all */
            for (int h = 0; h < plan.n_hosts; h++) {
                devices += plan.hosts[h].n_devices;
            }
        }
        if (plan_placement(&plan, &sched, &costs, costs_arg != NULL, devices) != 0) {
            goto exit;
        }
    }
    ret = 0;
exit:
    mmp_sched_fini(&sched);
    free(sets);
    return ret;
}
