/* mmpipe's plan keys: every leaf key of mmp_plan once, with its type, range,
 * default and place in the struct (keys[]), read and written by the schema
 * engine (common/schema.h). A key added here is parsed, defaulted, written to
 * plan.json and fingerprinted without another edit. Also: the hosts list
 * (the one key the engine's types do not describe) and the keys as text.
 *
 * Cross-key rules and defaults computed from other keys live in
 * common/plan.c, not here. Nothing here prints, exits or keeps state. */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/hostlist.h"
#include "common/pin.h"
#include "common/plan_schema.h"

/* ---- hosts: [{name, address?, devices, workdir?, binary?} | {nodes, devices, ...}, ...]
 * | slurm ---- */

/* A remote path: absolute, printable, no quote (it is quoted for the remote
 * shell, but a path with a quote is a mistake worth naming). */
static int remote_path_ok(const char *s)
{
    if (s[0] != '/') {
        return 0;
    }
    for (; *s; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f || *s == '\'') {
            return 0;
        }
    }
    return 1;
}

static mmp_err load_devices(mmp_schema_loader *L, mmp_host *h, int i, mmp_schema_site at)
{
    char name[MMP_SCHEMA_KEY_MAX], got[96];
    snprintf(name, sizeof name, "hosts[%d].devices", i);
    MMP_TRY(mmp_schema_check_list(L, name, at, 1, MMP_MAX_DEVICES, &h->n_devices));
    void *iter = NULL;
    mmp_schema_site is;
    for (int d = 0; mmp_schema_next_item(at, &iter, &is); d++) {
        char text[16];
        bool plain = false;
        long long ordinal = 0;
        snprintf(name, sizeof name, "hosts[%d].devices[%d]", i, d);
        bool scalar = mmp_schema_text(is, text, sizeof text, &plain);
        /* "cpu" may be quoted: plan.json writes it so. */
        if (scalar && strcmp(text, "cpu") == 0) {
            h->devices[d] = -1;
            continue;
        }
        /* "cuda:N" (as torch names it) or the bare ordinal N */
        if (scalar && strncmp(text, "cuda:", 5) == 0 && mmp_schema_is_integer(text + 5) &&
            text[5] != '-' && text[5] != '+') {
            ordinal = strtoll(text + 5, NULL, 10);
            if (ordinal > 1023) {
                return mmp_schema_fail(L, is, "%s: CUDA device ordinal %lld is over 1023", name,
                                       ordinal);
            }
            h->devices[d] = (int)ordinal;
            continue;
        }
        if (!scalar || !plain || !mmp_schema_is_integer(text)) {
            return mmp_schema_fail(L, is,
                                   "%s: expected 'cpu', 'cuda:N' or a CUDA device ordinal, got %s",
                                   name, mmp_schema_describe(is, got, sizeof got));
        }
        MMP_TRY(mmp_schema_parse_int(L, name, is, 0, 1023, &ordinal));
        h->devices[d] = (int)ordinal;
    }
    return MMP_OK;
}

static_assert(sizeof(((mmp_host *)0)->name) >= MMP_HOSTLIST_NAME_MAX &&
                  sizeof(((mmp_host *)0)->address) >= MMP_HOSTLIST_NAME_MAX,
              "a hostlist's node names fit a host's name and address");

/* Entry i of the list gave `nodes`: its hostlist, expanded into hosts
 * first.. (the entry's own, p->hosts[first], is the template: devices,
 * workdir, binary), each named and addressed by its node. *n gets how many. */
static mmp_err expand_nodes(mmp_schema_loader *L, mmp_plan *p, int i, int first, const char *list,
                            mmp_schema_site at, int *n)
{
    static char names[MMP_MAX_HOSTS][MMP_HOSTLIST_NAME_MAX];
    int room = MMP_MAX_HOSTS - first, count = 0;
    if (mmp_hostlist_expand(list, names, room, &count) != MMP_OK) {
        return mmp_schema_fail(L, at, "hosts[%d].nodes: %s%s", i, mmp_last_error(),
                               strstr(mmp_last_error(), "more than") ? " (a plan holds at most "
                                                                       "128 hosts in all)"
                                                                     : "");
    }
    mmp_host tmpl = p->hosts[first];
    for (int k = 0; k < count; k++) {
        mmp_host *h = &p->hosts[first + k];
        *h = tmpl;
        size_t len = strnlen(names[k], MMP_HOSTLIST_NAME_MAX - 1); /* < both fields */
        memcpy(h->name, names[k], len);
        h->name[len] = 0;
        memcpy(h->address, names[k], len);
        h->address[len] = 0;
        for (int j = 0; j < first + k; j++) {
            if (strcmp(p->hosts[j].name, h->name) == 0) {
                return mmp_schema_fail(L, at,
                                       "hosts[%d].nodes: '%s' is already the name of "
                                       "another host",
                                       i, h->name);
            }
        }
    }
    *n = count;
    return MMP_OK;
}

/* Entry i of the hosts list into p->hosts[first..]: one host, or with
 * `nodes` one per node of its hostlist; *n gets how many. */
static mmp_err load_host(mmp_schema_loader *L, mmp_plan *p, int i, int first, mmp_schema_site at,
                         int *n)
{
    char name[MMP_SCHEMA_KEY_MAX], got[96];
    if (first >= MMP_MAX_HOSTS) {
        return mmp_schema_fail(L, at, "hosts[%d]: past the %d hosts a plan holds", i,
                               MMP_MAX_HOSTS);
    }
    mmp_host *h = &p->hosts[first];
    memset(h, 0, sizeof *h);
    *n = 1;
    if (!mmp_schema_is_mapping(at)) {
        return mmp_schema_fail(L, at, "hosts[%d]: expected a mapping {name, devices}, got %s", i,
                               mmp_schema_describe(at, got, sizeof got));
    }
    bool have_name = false, have_devices = false, have_address = false;
    static char nodes[1024];
    nodes[0] = 0;
    mmp_schema_site nodes_at = at;
    void *iter = NULL;
    mmp_schema_site ks, vs;
    while (mmp_schema_next_pair(at, &iter, &ks, &vs)) {
        char key[64];
        if (!mmp_schema_text(ks, key, sizeof key, NULL)) {
            snprintf(key, sizeof key, "?");
        }
        if (strcmp(key, "name") == 0) {
            snprintf(name, sizeof name, "hosts[%d].name", i);
            MMP_TRY(mmp_schema_parse_string(L, name, vs, h->name, sizeof h->name));
            for (int j = 0; j < first; j++) {
                if (strcmp(p->hosts[j].name, h->name) == 0) {
                    return mmp_schema_fail(L, vs, "%s: '%s' is already the name of hosts[%d]", name,
                                           h->name, j);
                }
            }
            have_name = true;
        } else if (strcmp(key, "nodes") == 0) {
            snprintf(name, sizeof name, "hosts[%d].nodes", i);
            MMP_TRY(mmp_schema_parse_string(L, name, vs, nodes, sizeof nodes));
            nodes_at = vs;
        } else if (strcmp(key, "devices") == 0) {
            MMP_TRY(load_devices(L, h, i, vs));
            have_devices = true;
        } else if (strcmp(key, "address") == 0) {
            have_address = true;
            snprintf(name, sizeof name, "hosts[%d].address", i);
            MMP_TRY(mmp_schema_parse_string(L, name, vs, h->address, sizeof h->address));
            if (!mmp_plan_address_ok(h->address)) {
                return mmp_schema_fail(L, vs,
                                       "%s: '%s' is not a host name or address (letters, digits, "
                                       "'.', '-', '_', ':'; not starting with '-')",
                                       name, h->address);
            }
        } else if (strcmp(key, "workdir") == 0 || strcmp(key, "binary") == 0) {
            char *dst = key[0] == 'w' ? h->workdir : h->binary;
            snprintf(name, sizeof name, "hosts[%d].%s", i, key);
            MMP_TRY(mmp_schema_parse_string(L, name, vs, dst, MMP_PATH_MAX));
            if (!remote_path_ok(dst)) {
                return mmp_schema_fail(L, vs,
                                       "%s: expected an absolute path without quotes or control "
                                       "characters, got '%s'",
                                       name, dst);
            }
        } else {
            static const char *const host_keys[] = {"name",    "devices", "address",
                                                    "workdir", "binary",  "nodes"};
            char hint[128] = "";
            for (int c = 0; c < 6; c++) {
                if (mmp_schema_edit_distance(key, host_keys[c]) <= 2) {
                    snprintf(hint, sizeof hint, " (did you mean 'hosts[%d].%s'?)", i, host_keys[c]);
                    break;
                }
            }
            return mmp_schema_fail(L, ks, "unknown key 'hosts[%d].%s'%s", i, key, hint);
        }
    }
    if (nodes[0]) {
        if (have_name || have_address) {
            return mmp_schema_fail(L, nodes_at,
                                   "hosts[%d]: nodes names and addresses its hosts: no %s beside "
                                   "it",
                                   i, have_name ? "name" : "address");
        }
        if (!have_devices) {
            return mmp_schema_fail(L, at, "hosts[%d].devices: required key is missing", i);
        }
        return expand_nodes(L, p, i, first, nodes, nodes_at, n);
    }
    if (!have_name || !have_devices) {
        return mmp_schema_fail(L, at, "hosts[%d].%s: required key is missing", i,
                               have_name ? "devices" : "name");
    }
    return MMP_OK;
}

static const char *real_getenv(const char *name)
{
    return getenv(name);
}

/* `hosts: slurm`: the allocation's nodes, each with its GPUs (or cpu slots). */
static mmp_err load_slurm_hosts(mmp_schema_loader *L, mmp_plan *p, mmp_schema_site at)
{
    static mmp_slurm_env env;
    if (mmp_hostlist_from_slurm(&env, real_getenv) != MMP_OK) {
        return mmp_schema_fail(L, at, "%s", mmp_last_error());
    }
    if (env.n_nodes > MMP_MAX_HOSTS) {
        return mmp_schema_fail(L, at, "hosts: slurm: %d nodes in SLURM_JOB_NODELIST, at most %d",
                               env.n_nodes, MMP_MAX_HOSTS);
    }
    for (int i = 0; i < env.n_nodes; i++) {
        mmp_host *h = &p->hosts[i];
        memset(h, 0, sizeof *h);
        snprintf(h->name, sizeof h->name, "%s", env.nodes[i]);
        snprintf(h->address, sizeof h->address, "%s", env.nodes[i]);
        h->n_devices = env.gpus > 0 ? env.gpus : env.cpu_slots;
        for (int d = 0; d < h->n_devices; d++) {
            h->devices[d] = env.gpus > 0 ? env.gpu[d] : -1;
        }
    }
    p->n_hosts = env.n_nodes;
    return MMP_OK;
}

static mmp_err load_hosts(mmp_schema_loader *L, void *obj, mmp_schema_site at)
{
    mmp_plan *p = obj;
    char got[96];
    char word[16];
    if (mmp_schema_text(at, word, sizeof word, NULL) && strcmp(word, "slurm") == 0) {
        return load_slurm_hosts(L, p, at);
    }
    int n = mmp_schema_items(at);
    if (n < 0) {
        return mmp_schema_fail(L, at,
                               "hosts: expected 'slurm' or a list of {name, devices}, got %s",
                               mmp_schema_describe(at, got, sizeof got));
    }
    if (n < 1 || n > MMP_MAX_HOSTS) {
        return mmp_schema_fail(L, at, "hosts: expected 1 to %d hosts, got %d", MMP_MAX_HOSTS, n);
    }
    void *iter = NULL;
    mmp_schema_site item;
    int total = 0;
    for (int i = 0; mmp_schema_next_item(at, &iter, &item); i++) {
        int k = 0;
        MMP_TRY(load_host(L, p, i, total, item, &k));
        total += k;
    }
    p->n_hosts = total;
    return MMP_OK;
}

static void put_hosts(FILE *f, const void *obj)
{
    const mmp_plan *p = obj;
    fputc('[', f);
    for (int i = 0; i < p->n_hosts && i < MMP_MAX_HOSTS; i++) {
        const mmp_host *h = &p->hosts[i];
        fputs(i ? ",\n    {\"name\": " : "\n    {\"name\": ", f);
        mmp_schema_put_string(f, h->name);
        fputs(", \"devices\": [", f);
        for (int d = 0; d < h->n_devices && d < MMP_MAX_DEVICES; d++) {
            fputs(d ? ", " : "", f);
            if (h->devices[d] < 0) {
                fputs("\"cpu\"", f);
            } else {
                fprintf(f, "%d", h->devices[d]);
            }
        }
        fputc(']', f);
        static const char *const extra[] = {"address", "workdir", "binary"};
        const char *val[] = {h->address, h->workdir, h->binary};
        for (int k = 0; k < 3; k++) {
            if (val[k][0]) {
                fprintf(f, ", \"%s\": ", extra[k]);
                mmp_schema_put_string(f, val[k]);
            }
        }
        fputc('}', f);
    }
    fputs("\n  ]", f);
}

/* ---- train.pin: off | auto | [core, ...] ----------------------------------------- */

static mmp_err load_pin(mmp_schema_loader *L, void *obj, mmp_schema_site at)
{
    mmp_plan *p = obj;
    char word[16], got[96];
    if (mmp_schema_text(at, word, sizeof word, NULL)) {
        if (strcmp(word, "off") == 0 || strcmp(word, "auto") == 0) {
            p->train.pin.mode = word[0] == 'o' ? MMP_PIN_OFF : MMP_PIN_AUTO;
            p->train.pin.n_cores = 0;
            return MMP_OK;
        }
    }
    if (mmp_schema_items(at) < 0) {
        return mmp_schema_fail(L, at, "train.pin: expected off, auto or a list of core ids, got %s",
                               mmp_schema_describe(at, got, sizeof got));
    }
    int n = 0;
    MMP_TRY(mmp_schema_check_list(L, "train.pin", at, 1, MMP_MAX_PIN_LIST, &n));
    /* The cores this machine lets us use: a core id outside them would make
     * every stage fail at start; say so here, where the line is known. */
    static int allowed[MMP_PIN_MAX_CORES];
    int n_allowed = mmp_pin_allowed(allowed, MMP_PIN_MAX_CORES);
    void *iter = NULL;
    mmp_schema_site is;
    for (int i = 0; mmp_schema_next_item(at, &iter, &is); i++) {
        char name[32];
        long long core = 0;
        snprintf(name, sizeof name, "train.pin[%d]", i);
        MMP_TRY(mmp_schema_parse_int(L, name, is, 0, MMP_PIN_MAX_CORES - 1, &core));
        for (int j = 0; j < i; j++) {
            if (p->train.pin.cores[j] == core) {
                return mmp_schema_fail(L, is, "%s: core %lld is already train.pin[%d]", name, core,
                                       j);
            }
        }
        int ok = 0;
        for (int j = 0; j < n_allowed; j++) {
            ok |= allowed[j] == core;
        }
        if (!ok) {
            char list[512];
            return mmp_schema_fail(
                L, is, "%s: core %lld is not one this machine lets mmpipe use (%s)", name, core,
                mmp_pin_format(allowed, n_allowed, list, sizeof list));
        }
        p->train.pin.cores[i] = (int)core;
    }
    p->train.pin.mode = MMP_PIN_LIST;
    p->train.pin.n_cores = n;
    return MMP_OK;
}

static void put_pin(FILE *f, const void *obj)
{
    const mmp_plan *p = obj;
    if (p->train.pin.mode != MMP_PIN_LIST) {
        fputs(p->train.pin.mode == MMP_PIN_AUTO ? "\"auto\"" : "\"off\"", f);
        return;
    }
    fputc('[', f);
    for (int i = 0; i < p->train.pin.n_cores && i < MMP_MAX_PIN_LIST; i++) {
        fprintf(f, "%s%d", i ? ", " : "", p->train.pin.cores[i]);
    }
    fputc(']', f);
}

/* ---- the table ---------------------------------------------------------------- */

/* train.schedule: gpipe (all forwards, then all backwards), 1f1b (the
 * default: one forward, one backward; the fewest micro-batches held), zb-h1
 * (1f1b with each branch stage's backward split into an input-gradient pass
 * B and a weight-gradient pass W, W deferred into the bubbles; the same peak
 * in-flight count as 1f1b; coordinator/schedule.h). */
static const char *const schedule_names[] = {"gpipe", "1f1b", "zb-h1", NULL};
static const char *const precision_names[] = {"fp32", "bf16", "fp16", NULL};
static const char *const balance_names[] = {"off", "dynamic", NULL};
static const char *const routing_names[] = {"weighted", "round_robin", NULL};
static const char *const priority_names[] = {"auto", "off", NULL};
static const char *const bad_sample_names[] = {"fail", "skip", NULL};
static const char *const compute_names[] = {"real", "simulated", NULL};
static const char *const data_transport_names[] = {"auto", "shm", "tcp", NULL};
static const char *const itc_scope_names[] = {"batch", "microbatch", NULL};
static const char *const layers_names[] = {"all", NULL}; /* only whole branches, for now */
static const char *const launcher_names[] = {"local", "ssh", "slurm", "agent", NULL};
static const char *const ctl_transport_names[] = {"auto", "ipc", "tcp", NULL};
static const char *const on_refused_names[] = {"log", "stop", NULL};

static_assert(MMP_SCHED_GPIPE == 0 && MMP_SCHED_1F1B == 1 && MMP_SCHED_ZB_H1 == 2,
              "schedule_names order");
static_assert(MMP_PREC_FP32 == 0 && MMP_PREC_BF16 == 1 && MMP_PREC_FP16 == 2,
              "precision_names order");
static_assert(MMP_BALANCE_OFF == 0 && MMP_BALANCE_DYNAMIC == 1, "balance_names order");
static_assert(MMP_BAD_FAIL == 0 && MMP_BAD_SKIP == 1, "bad_sample_names order");
static_assert(MMP_COMPUTE_REAL == 0 && MMP_COMPUTE_SIMULATED == 1, "compute_names order");
static_assert(MMP_LAUNCH_LOCAL == 0 && MMP_LAUNCH_SSH == 1 && MMP_LAUNCH_SLURM == 2 &&
                  MMP_LAUNCH_AGENT == 3,
              "launcher_names order");
static_assert(MMP_CTLT_AUTO == 0 && MMP_CTLT_IPC == 1 && MMP_CTLT_TCP == 2,
              "ctl_transport_names order");
static_assert(MMP_DATA_AUTO == 0 && MMP_DATA_SHM == 1 && MMP_DATA_TCP == 2,
              "data_transport_names order");
static_assert(sizeof(mmp_data_transport) == sizeof(int), "enum fields are int-sized");
static_assert(MMP_ITC_BATCH == 0 && MMP_ITC_MICROBATCH == 1, "itc_scope_names order");
/* Enum fields are stored through an int pointer. */
static_assert(sizeof(mmp_schedule) == sizeof(int) && sizeof(mmp_precision) == sizeof(int) &&
                  sizeof(mmp_balance_mode) == sizeof(int) &&
                  sizeof(mmp_bad_sample) == sizeof(int) && sizeof(mmp_compute) == sizeof(int) &&
                  sizeof(mmp_launcher) == sizeof(int) && sizeof(mmp_ctl_transport) == sizeof(int),
              "enum fields are int-sized");

static const double imagenet_mean[] = {0.485, 0.456, 0.406};
static const double imagenet_std[] = {0.229, 0.224, 0.225};
static const double image_blocks_def[] = {1, 1, 1, 1};
static const double one_def[] = {1};
static const double image_channels_def[] = {16, 32, 64, 128};

#define OFF(m) offsetof(mmp_plan, m)
#define SIZE(m) sizeof(((mmp_plan *)0)->m)
#define LEN(m) (SIZE(m) / sizeof(((mmp_plan *)0)->m[0]))
#define DEFS(a) .def_list = a, .def_len = (int)(sizeof a / sizeof a[0])

#define INT(k, m, lo, hi, d)                                                                       \
    {                                                                                              \
        .path = k, .type = MMP_KEY_INT, .field = OFF(m), .size = SIZE(m), .imin = lo, .imax = hi,  \
        .def = d                                                                                   \
    }
#define FLOAT(k, m, lb, lo, hi, hb, d)                                                             \
    {                                                                                              \
        .path = k, .type = MMP_KEY_FLOAT, .field = OFF(m), .fmin = lo, .fmax = hi,                 \
        .lo_bracket = lb, .hi_bracket = hb, .def = d                                               \
    }
#define STR(k, m, d, req)                                                                          \
    {                                                                                              \
        .path = k, .type = MMP_KEY_STRING, .field = OFF(m), .size = SIZE(m), .def_str = d,         \
        .required = req                                                                            \
    }
#define BOOL(k, m, d)                                                                              \
    {                                                                                              \
        .path = k, .type = MMP_KEY_BOOL, .field = OFF(m), .def = d                                 \
    }
#define ENUM(k, m, n, d)                                                                           \
    {                                                                                              \
        .path = k, .type = MMP_KEY_ENUM, .field = OFF(m), .names = n, .def = d                     \
    }
#define CHECKED_ENUM(k, n)                                                                         \
    {                                                                                              \
        .path = k, .type = MMP_KEY_ENUM, .field = MMP_KEY_NO_FIELD, .names = n                     \
    }
#define INTS(k, m, count, minlen, lo, hi, what_increases, ...)                                     \
    {                                                                                              \
        .path = k, .type = MMP_KEY_INT_LIST, .field = OFF(m), .size = LEN(m),                      \
        .count_field = OFF(count), .min_len = minlen, .imin = lo, .imax = hi,                      \
        .increasing = what_increases, __VA_ARGS__                                                  \
    }
#define FLOATS(k, m, lb, lo, hi, hb, defs)                                                         \
    {                                                                                              \
        .path = k, .type = MMP_KEY_FLOAT_LIST, .field = OFF(m), .size = LEN(m),                    \
        .count_field = MMP_KEY_NO_FIELD, .min_len = (int)LEN(m), .fmin = lo, .fmax = hi,           \
        .lo_bracket = lb, .hi_bracket = hb, DEFS(defs)                                             \
    }
#define FLOAT_VEC(k, m, count, minlen, lb, lo, hi, hb)                                             \
    {                                                                                              \
        .path = k, .type = MMP_KEY_FLOAT_LIST, .field = OFF(m), .size = LEN(m),                    \
        .count_field = OFF(count), .min_len = minlen, .fmin = lo, .fmax = hi, .lo_bracket = lb,    \
        .hi_bracket = hb                                                                           \
    }

/* Sections are contiguous: the JSON writer opens and closes objects as the
 * path prefix changes. Defaults follow config.h; min_lr, val_manifest and
 * vocab are resolved from other keys after loading (resolve_defaults, plan.c). */
static const mmp_key_spec keys[] = {
    STR("job.name", job.name, "job", false),
    INT("job.steps", job.steps, 0, 1000000000, 100),
    INT("job.seed", job.seed, 0, LLONG_MAX, 1),

    STR("data.manifest", data.manifest, "", true),
    STR("data.val_manifest", data.val_manifest, "", false),
    STR("data.vocab", data.vocab, "", false),
    INT("data.image_size", data.image_size, 8, 1024, 32),
    INT("data.max_text_len", data.max_text_len, 4, 512, 32),
    FLOATS("data.mean", data.mean, '[', -1000, 1000, ']', imagenet_mean),
    FLOATS("data.std", data.std, '(', 0, 1000, ']', imagenet_std),
    INT("data.workers", data.workers, 0, 64, 1),
    ENUM("data.on_bad_sample", data.on_bad_sample, bad_sample_names, MMP_BAD_FAIL),
    INT("data.val_samples", data.val_samples, 0, 1000000000, 256),
    BOOL("data.augment", data.augment, 0),
    INT("data.max_image_pixels", data.max_image_pixels, 1, 16384LL * 16384, 89478485),

    INT("model.width", model.width, 1, 16384, 64),
    /* blocks and channels share n_stages; their lengths must agree (check_plan, plan.c) */
    INTS("model.image.blocks", model.image.blocks, model.image.n_stages, 1, 1, 64, NULL,
         DEFS(image_blocks_def)),
    INTS("model.image.channels", model.image.channels, model.image.n_stages, 1, 1, 4096, NULL,
         DEFS(image_channels_def)),
    BOOL("model.image.stem_pool", model.image.stem_pool, 0),
    INT("model.text.layers", model.text.layers, 1, 256, 2),
    INT("model.text.heads", model.text.heads, 1, 256, 4),
    INT("model.text.ffn_mult", model.text.ffn_mult, 1, 64, 4),
    INT("model.fusion.layers", model.fusion.layers, 1, 64, 1),
    INT("model.fusion.heads", model.fusion.heads, 1, 256, 4),
    /* batch: ITC over all of a step's pairs and ITM hard negatives mined from
     * the whole batch, whatever train.microbatches (the fusion stage holds the
     * step's features and runs its backward after the step's last forward);
     * microbatch: both per micro-batch (fewer negatives as m grows). */
    ENUM("model.fusion.itc_scope", model.fusion.itc_scope, itc_scope_names, MMP_ITC_BATCH),

    INT("train.batch", train.batch, 1, 1 << 20, 64),
    INT("train.microbatches", train.microbatches, 1, MMP_MAX_MICROBATCHES, 4),
    ENUM("train.schedule", train.schedule, schedule_names, MMP_SCHED_1F1B),
    ENUM("train.precision", train.precision, precision_names, MMP_PREC_FP32),
    FLOAT("train.optimizer.lr", train.optimizer.lr, '(', 0, 10, ']', 1e-3),
    FLOAT("train.optimizer.min_lr", train.optimizer.min_lr, '[', 0, 10, ']', 1e-4),
    FLOAT("train.optimizer.weight_decay", train.optimizer.weight_decay, '[', 0, 10, ']', 0.05),
    INT("train.optimizer.warmup", train.optimizer.warmup, 0, 1000000000, 20),
    FLOAT("train.optimizer.beta1", train.optimizer.beta1, '[', 0, 1, ')', 0.9),
    FLOAT("train.optimizer.beta2", train.optimizer.beta2, '[', 0, 1, ')', 0.999),
    FLOAT("train.optimizer.eps", train.optimizer.eps, '(', 0, 1, ']', 1e-8),
    FLOAT("train.clip_grad_norm", train.clip_grad_norm, '[', 0, 1e6, ']', 1.0),
    INT("train.loss_scale_window", train.loss_scale_window, 1, 1000000000, 2000),
    INT("train.debug_overflow_step", train.debug_overflow_step, 0, 1000000000, 0),
    INT("train.eval_every", train.eval_every, 0, 1000000000, 50),
    BOOL("train.final_eval", train.final_eval, 1),
    INT("train.ckpt_every", train.ckpt_every, 0, 1000000000, 50),
    INT("train.ckpt_keep", train.ckpt_keep, 0, 1000000000, 3),
    BOOL("train.ckpt_async", train.ckpt_async, 0),
    INT("train.stall_timeout", train.stall_timeout, 0, 86400, 60),
    INT("train.max_restarts", train.max_restarts, 0, 1000, 0),
    INT("train.threads", train.threads, 1, 256, 1),
    {.path = "train.pin",
     .type = MMP_KEY_CUSTOM,
     .field = MMP_KEY_NO_FIELD,
     .load = load_pin,
     .put_json = put_pin},
    ENUM("train.priority", train.priority, priority_names, MMP_PRIORITY_AUTO),
    FLOAT("train.init_temperature", train.init_temperature, '(', 0, 10, ']', 0.07),

    ENUM("balance.mode", balance.mode, balance_names, MMP_BALANCE_OFF),
    ENUM("balance.routing", balance.routing, routing_names, MMP_ROUTE_WEIGHTED),
    INT("balance.window", balance.window, 1, 1000, 3),
    FLOAT("balance.min_gain", balance.min_gain, '[', 0, 10, ']', 0.1),
    FLOAT("balance.device_memory_gib", balance.device_memory_gib, '[', 0, 1e6, ']', 0),
    INT("balance.force.step", balance.force.step, 0, 1000000000, 0),
    STR("balance.force.set", balance.force.set, "", false),

    ENUM("compute", compute, compute_names, MMP_COMPUTE_REAL),
    FLOAT("sim.cost.image", sim.cost.image, '[', 0, 1e6, ']', 0),
    FLOAT("sim.cost.text", sim.cost.text, '[', 0, 1e6, ']', 0),
    FLOAT("sim.cost.fusion", sim.cost.fusion, '[', 0, 1e6, ']', 0),
    FLOAT("sim.bwd_factor", sim.bwd_factor, '[', 0, 1000, ']', 2),
    /* per device slot; empty = 1.0 everywhere */
    FLOAT_VEC("sim.slowdown", sim.slowdown, sim.n_slowdown, 0, '(', 0, 1000, ']'),
    INT("sim.change_step", sim.change_step, 0, 1000000000, 0),
    /* defaults are the sim.cost.* values (resolve_defaults) */
    FLOAT("sim.change.image", sim.change.image, '[', 0, 1e6, ']', 0),
    FLOAT("sim.change.text", sim.change.text, '[', 0, 1e6, ']', 0),
    FLOAT("sim.change.fusion", sim.change.fusion, '[', 0, 1e6, ']', 0),

    ENUM("launcher", launcher, launcher_names, MMP_LAUNCH_LOCAL),
    /* checked in plan.c (check_launcher): {address} present, no quotes */
    STR("launcher_command", launcher_command,
        "ssh -o BatchMode=yes -o ServerAliveInterval=1 -o ServerAliveCountMax=3 {address}", false),
    INT("agent.port", agent.port, 1, 65535, 29470), /* MMP_REXEC_PORT */
    /* checked in plan.c (check_launcher): set for launcher: agent, a usable word */
    STR("agent.key_file", agent.key_file, "", false),
    ENUM("control.transport", control.transport, ctl_transport_names, MMP_CTLT_AUTO),
    STR("control.address", control.address, "", false),
    INT("control.port", control.port, 0, 65535, 0),
    ENUM("control.on_refused", control.stop_on_refused, on_refused_names, 0),
    /* the data plane's transports (coordinator/steps.c edge_transport) */
    ENUM("transport.data", transport.data, data_transport_names, MMP_DATA_AUTO),

    {.path = "hosts",
     .type = MMP_KEY_CUSTOM,
     .field = MMP_KEY_NO_FIELD,
     .load = load_hosts,
     .put_json = put_hosts},

    INTS("stages.image.replicas", stages.image.replicas, stages.image.n_replicas, 1, 1,
         MMP_MAX_REPLICAS, NULL, DEFS(one_def), .scalar_ok = true),
    INTS("stages.image.split", stages.image.split, stages.image.n_split, 0, 1, 4096, "split point"),
    CHECKED_ENUM("stages.image.layers", layers_names),
    INTS("stages.text.replicas", stages.text.replicas, stages.text.n_replicas, 1, 1,
         MMP_MAX_REPLICAS, NULL, DEFS(one_def), .scalar_ok = true),
    INTS("stages.text.split", stages.text.split, stages.text.n_split, 0, 1, 4096, "split point"),
    INTS("stages.fusion.replicas", stages.fusion.replicas, stages.fusion.n_replicas, 1, 1,
         MMP_MAX_REPLICAS, NULL, DEFS(one_def), .scalar_ok = true),
};
const mmp_schema mmp_plan_schema = {
    .keys = keys,
    .n_keys = (int)(sizeof keys / sizeof keys[0]),
    .sections = "job, data, model, ...",
    .word_section = {.path = "stages",
                     .what = "image, text, fusion",
                     .word = "auto",
                     .field = offsetof(mmp_plan, stages_auto)},
};

/* ---- keys as text (checkpoint fingerprints) ---------------------------------- */

int mmp_plan_key_count(void)
{
    return mmp_plan_schema.n_keys;
}

const char *mmp_plan_key_name(int i)
{
    return i >= 0 && i < mmp_plan_schema.n_keys ? keys[i].path : NULL;
}

mmp_err mmp_plan_key_text(const mmp_plan *p, int i, char *buf, size_t n)
{
    if (i < 0 || i >= mmp_plan_schema.n_keys || n == 0) {
        return mmp_errorf(MMP_ERR_INVALID, "plan key %d: no such key", i);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        return mmp_errorf(MMP_ERR_NOMEM, "plan key %s: %s", keys[i].path, strerror(errno));
    }
    mmp_schema_put_json(f, &keys[i], p);
    fclose(f);
    if (!text) {
        return mmp_errorf(MMP_ERR_NOMEM, "plan key %s", keys[i].path);
    }
    int fits = len < n;
    snprintf(buf, n, "%s", text);
    free(text);
    return fits ? MMP_OK
                : mmp_errorf(MMP_ERR_INVALID, "plan key %s: value longer than %zu bytes",
                             keys[i].path, n - 1);
}

const char *mmp_schedule_name(mmp_schedule s)
{
    return (unsigned)s < 3 ? schedule_names[s] : "?";
}

const char *mmp_precision_name(mmp_precision p)
{
    return (unsigned)p < 3 ? precision_names[p] : "?";
}
