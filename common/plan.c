/* The plan after its keys are read: defaults computed from other keys,
 * cross-key rules (each failing at the file:line:column of the key it
 * names), the topology questions every process asks of a plan (layers,
 * micro-batch sizes, replicas, device slots, simulated costs, evaluation
 * steps), and whether this version can run it.
 *
 * The keys themselves are common/plan_keys.c; reading YAML is the schema
 * engine's (common/schema.h). Nothing here prints or exits. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/plan_schema.h"

/* ---- after loading --------------------------------------------------------- */

/* "dir/train.jsonl" + "val.jsonl" -> "dir/val.jsonl". */
static bool beside(const char *file, const char *name, char *out, size_t size)
{
    const char *slash = strrchr(file, '/');
    int dir = slash ? (int)(slash - file + 1) : 0;
    return snprintf(out, size, "%.*s%s", dir, file, name) < (int)size;
}

/* Folds "." and ".." segments and repeated slashes of an absolute path, in
 * place and lexically (no symlink is looked at: "a/link/.." is "a"). */
static void fold_segments(char *path)
{
    size_t w = 0; /* path[0..w) is the folded prefix, "/seg/seg" */
    const char *r = path;
    while (*r) {
        while (*r == '/') {
            r++;
        }
        size_t n = strcspn(r, "/");
        if (n == 0) {
            break;
        }
        if (n == 1 && r[0] == '.') {
            /* nothing */
        } else if (n == 2 && r[0] == '.' && r[1] == '.') {
            while (w > 0 && path[--w] != '/') {
                /* back to the slash that starts the last kept segment */
            }
        } else {
            path[w++] = '/';
            memmove(path + w, r, n);
            w += n;
        }
        r += n;
    }
    if (w == 0) {
        path[w++] = '/';
    }
    path[w] = 0;
}

/* Makes the path in key absolute: a relative path written in the plan file
 * is relative to the file's folder, one given by --set to the current
 * directory (where the command line was typed). Empty stays empty. */
static mmp_err make_absolute(mmp_schema_loader *L, const mmp_plan *p, const char *key, char *path,
                             size_t size)
{
    if (!path[0] || path[0] == '/') {
        if (path[0]) {
            fold_segments(path);
        }
        return MMP_OK;
    }
    char cwd[MMP_PATH_MAX], joined[3 * MMP_PATH_MAX + 4];
    if (!getcwd(cwd, sizeof cwd)) {
        return mmp_schema_fail_at(L, key, NULL, "%s: cannot resolve %s: current directory: %s", key,
                                  path, strerror(errno));
    }
    if (mmp_schema_from_override(L, key)) {
        snprintf(joined, sizeof joined, "%s/%s", cwd, path);
    } else {
        const char *slash = strrchr(p->path, '/');
        int dir = slash ? (int)(slash - p->path) : 0;
        if (p->path[0] == '/') {
            snprintf(joined, sizeof joined, "%.*s/%s", dir, p->path, path);
        } else {
            snprintf(joined, sizeof joined, "%s/%.*s/%s", cwd, dir, p->path, path);
        }
    }
    fold_segments(joined);
    if (strlen(joined) >= size) {
        return mmp_schema_fail_at(L, key, NULL, "%s: %s resolves to a path longer than %zu bytes",
                                  key, path, size - 1);
    }
    memcpy(path, joined, strlen(joined) + 1);
    return MMP_OK;
}

/* The data paths, absolute (so plan.json, which stage processes load from
 * the run directory, names the same files), and their defaults: vocab.txt
 * beside the manifest; val.jsonl beside it only when that file exists, else
 * no validation set (evaluation off, see mmp_plan_evaluates). */
static mmp_err resolve_paths(mmp_schema_loader *L, mmp_plan *p)
{
    MMP_TRY(make_absolute(L, p, "data.manifest", p->data.manifest, sizeof p->data.manifest));
    MMP_TRY(make_absolute(L, p, "data.vocab", p->data.vocab, sizeof p->data.vocab));
    MMP_TRY(make_absolute(L, p, "data.val_manifest", p->data.val_manifest,
                          sizeof p->data.val_manifest));
    MMP_TRY(make_absolute(L, p, "agent.key_file", p->agent.key_file, sizeof p->agent.key_file));
    if ((!mmp_schema_given(L, "data.val_manifest") &&
         !beside(p->data.manifest, "val.jsonl", p->data.val_manifest,
                 sizeof p->data.val_manifest)) ||
        (!mmp_schema_given(L, "data.vocab") &&
         !beside(p->data.manifest, "vocab.txt", p->data.vocab, sizeof p->data.vocab))) {
        return mmp_schema_fail_at(
            L, "data.manifest", NULL,
            "data.manifest: path too long to put val.jsonl / vocab.txt beside it");
    }
    if (!mmp_schema_given(L, "data.val_manifest") && access(p->data.val_manifest, F_OK) != 0) {
        p->data.val_manifest[0] = 0;
    }
    /* a default beside the manifest is placed where the manifest was given */
    mmp_schema_where(L, "data.manifest", p->data.manifest_site, sizeof p->data.manifest_site);
    if (!mmp_schema_where(L, "data.val_manifest", p->data.val_manifest_site,
                          sizeof p->data.val_manifest_site)) {
        snprintf(p->data.val_manifest_site, sizeof p->data.val_manifest_site, "%s",
                 p->data.manifest_site);
    }
    if (!mmp_schema_where(L, "data.vocab", p->data.vocab_site, sizeof p->data.vocab_site)) {
        snprintf(p->data.vocab_site, sizeof p->data.vocab_site, "%s", p->data.manifest_site);
    }
    return MMP_OK;
}

static mmp_err resolve_defaults(mmp_schema_loader *L, mmp_plan *p)
{
    if (!mmp_schema_given(L, "train.optimizer.min_lr")) {
        p->train.optimizer.min_lr = 0.1f * p->train.optimizer.lr;
    }
    if (!mmp_schema_given(L, "sim.change.image")) {
        p->sim.change.image = p->sim.cost.image;
    }
    if (!mmp_schema_given(L, "sim.change.text")) {
        p->sim.change.text = p->sim.cost.text;
    }
    if (!mmp_schema_given(L, "sim.change.fusion")) {
        p->sim.change.fusion = p->sim.cost.fusion;
    }
    /* Simulated stages sleep instead of computing: an evaluation would
     * retrieve with embeddings no model made (recall 0). Off unless asked. */
    if (p->compute == MMP_COMPUTE_SIMULATED) {
        if (!mmp_schema_given(L, "train.eval_every")) {
            p->train.eval_every = 0;
        }
        if (!mmp_schema_given(L, "train.final_eval")) {
            p->train.final_eval = 0;
        }
    }
    return resolve_paths(L, p);
}

/* Layers of each branch, as nn/model.h counts them: image = stem, each
 * BasicBlock, projection; text = embedding, each transformer layer, final
 * LayerNorm. A split point k cuts between layers k-1 and k. */
static mmp_err check_split(mmp_schema_loader *L, const char *key, const mmp_stage_cfg *s,
                           int layers, const char *why)
{
    for (int i = 0; i < s->n_split; i++) {
        if (s->split[i] >= layers) {
            return mmp_schema_fail_at(L, key, NULL,
                                      "%s[%d]: %d is not below the %d layers of the branch (%s)",
                                      key, i, s->split[i], layers, why);
        }
    }
    return MMP_OK;
}

/* One entry for every sub-stage, or one per sub-stage. */
static mmp_err check_replicas(mmp_schema_loader *L, const char *key, const char *split_key,
                              const mmp_stage_cfg *s)
{
    int subs = s->n_split + 1;
    if (s->n_replicas != 1 && s->n_replicas != subs) {
        return mmp_schema_fail_at(
            L, key, split_key,
            "%s: %d values for %d sub-stage%s (%s%s): give one number for all, or one "
            "per sub-stage",
            key, s->n_replicas, subs, subs == 1 ? "" : "s", split_key ? split_key : "",
            split_key ? " cuts the branch" : "fusion is never cut");
    }
    return MMP_OK;
}

/* The runtime deals whole micro-batches to a stage's replicas: where a
 * branch's first sub-stage has more replicas than train.microbatches, one
 * loads none, which its loader refuses after every process has started
 * (later sub-stages and the fusion take part with none). */
static mmp_err check_replicas_mbs(mmp_schema_loader *L, const char *key, const mmp_stage_cfg *s,
                                  int m)
{
    if (s->n_replicas > 0 && s->replicas[0] > m) {
        return mmp_schema_fail_at(L, key, "train.microbatches",
                                  "%s: %d replicas of the branch's first sub-stage, more than "
                                  "train.microbatches (%d): each loads whole micro-batches, so "
                                  "one would load none",
                                  key, s->replicas[0], m);
    }
    return MMP_OK;
}

static mmp_err check_plan(mmp_schema_loader *L, mmp_plan *p)
{
    /* job.name is a file name (runs/<job.name>-<time>): a '/' would put the
     * run elsewhere ("../../x" outside runs/), a leading '-' or '.' makes a
     * name that rm and ls take for an option or hide, and "" one that
     * starts with '-' */
    if (strchr(p->job.name, '/') || !p->job.name[0] || p->job.name[0] == '-' ||
        p->job.name[0] == '.') {
        return mmp_schema_fail_at(L, "job.name", NULL,
                                  "job.name: '%s' names the run directory "
                                  "(runs/<job.name>-<time>): not empty, no '/' in it, not "
                                  "starting with '-' or '.'",
                                  p->job.name);
    }
    if (p->train.microbatches > p->train.batch) {
        return mmp_schema_fail_at(L, "train.microbatches", "train.batch",
                                  "train.microbatches (%d) is more than train.batch (%d)",
                                  p->train.microbatches, p->train.batch);
    }
    if (p->model.width % p->model.text.heads != 0) {
        return mmp_schema_fail_at(L, "model.text.heads", "model.width",
                                  "model.width (%d) is not divisible by model.text.heads (%d)",
                                  p->model.width, p->model.text.heads);
    }
    if (p->model.width % p->model.fusion.heads != 0) {
        return mmp_schema_fail_at(L, "model.fusion.heads", "model.width",
                                  "model.width (%d) is not divisible by model.fusion.heads (%d)",
                                  p->model.width, p->model.fusion.heads);
    }
    int nb = mmp_schema_list_len(L, "model.image.blocks");
    int nc = mmp_schema_list_len(L, "model.image.channels");
    if (nb != nc) {
        return mmp_schema_fail_at(
            L, "model.image.channels", "model.image.blocks",
            "model.image.channels has %d values but model.image.blocks has %d", nc, nb);
    }
    p->model.image.n_stages = nb;
    if (p->train.optimizer.min_lr > p->train.optimizer.lr) {
        return mmp_schema_fail_at(
            L, "train.optimizer.min_lr", "train.optimizer.lr",
            "train.optimizer.min_lr (%g) is more than train.optimizer.lr (%g)",
            (double)p->train.optimizer.min_lr, (double)p->train.optimizer.lr);
    }
    MMP_TRY(check_split(L, "stages.image.split", &p->stages.image, mmp_plan_image_layers(p),
                        "stem, model.image.blocks, projection"));
    MMP_TRY(check_split(L, "stages.text.split", &p->stages.text, mmp_plan_text_layers(p),
                        "embedding, model.text.layers, final norm"));
    MMP_TRY(check_replicas(L, "stages.image.replicas", "stages.image.split", &p->stages.image));
    MMP_TRY(check_replicas(L, "stages.text.replicas", "stages.text.split", &p->stages.text));
    MMP_TRY(check_replicas(L, "stages.fusion.replicas", NULL, &p->stages.fusion));
    int m = p->train.microbatches;
    MMP_TRY(check_replicas_mbs(L, "stages.image.replicas", &p->stages.image, m));
    MMP_TRY(check_replicas_mbs(L, "stages.text.replicas", &p->stages.text, m));
    return MMP_OK;
}

/* Hosts, launcher and control endpoint agree (values that reach a remote
 * command line are checked here, where file:line:column is known). */
static mmp_err check_launcher(mmp_schema_loader *L, mmp_plan *p)
{
    const char *t = p->launcher_command;
    if (p->launcher == MMP_LAUNCH_SSH) {
        if (!strstr(t, "{address}") || t[0] == ' ' || t[0] == 0) {
            return mmp_schema_fail_at(L, "launcher_command", "launcher",
                                      "launcher_command: '%s' must start with a program and name "
                                      "{address}",
                                      t);
        }
        if (strpbrk(t, "'\"\\$`;|&<>\n\t")) {
            return mmp_schema_fail_at(L, "launcher_command", "launcher",
                                      "launcher_command: '%s': quotes and shell characters are not "
                                      "allowed (it is split on spaces and run without a shell)",
                                      t);
        }
    }
    if (p->launcher == MMP_LAUNCH_AGENT) {
        const char *k = p->agent.key_file;
        if (!k[0]) {
            return mmp_schema_fail_at(L, "agent.key_file", "launcher",
                                      "launcher: agent needs agent.key_file, the key the hosts' "
                                      "agents were started with (mmpipe agent --new-key FILE "
                                      "makes one)");
        }
        if (strpbrk(k, "\n\r\t")) { /* absolute by now (resolve_paths): never an option */
            return mmp_schema_fail_at(L, "agent.key_file", NULL,
                                      "agent.key_file: '%s' cannot stand on a command line", k);
        }
    }
    if (p->control.address[0] && !mmp_plan_address_ok(p->control.address)) {
        return mmp_schema_fail_at(L, "control.address", NULL,
                                  "control.address: '%s' is not a host name or address",
                                  p->control.address);
    }
    for (int h = 0; h < p->n_hosts; h++) {
        const mmp_host *ho = &p->hosts[h];
        if (p->launcher == MMP_LAUNCH_LOCAL && (ho->binary[0] || ho->workdir[0])) {
            /* never silently ignored: a local stage is this binary, here */
            return mmp_schema_fail_at(L, "hosts", NULL,
                                      "hosts[%d].%s: only launcher: ssh, slurm or agent starts "
                                      "stages from it (launcher: local runs this mmpipe in this "
                                      "directory); drop it or set launcher",
                                      h, ho->binary[0] ? "binary" : "workdir");
        }
        if (p->launcher != MMP_LAUNCH_LOCAL && !p->hosts[h].address[0] &&
            !mmp_plan_address_ok(p->hosts[h].name)) {
            return mmp_schema_fail_at(L, "hosts", NULL,
                                      "hosts[%d]: no address, and the name '%s' is not one", h,
                                      p->hosts[h].name);
        }
    }
    return MMP_OK;
}

/* The schema engine's check hook: runs while the keys' positions are known. */
static mmp_err check_loaded(mmp_schema_loader *L, void *obj)
{
    mmp_plan *p = obj;
    mmp_schema_where(L, "hosts", p->hosts_site, sizeof p->hosts_site);
    MMP_TRY(resolve_defaults(L, obj));
    MMP_TRY(check_launcher(L, obj));
    return check_plan(L, obj);
}

void mmp_plan_defaults(mmp_plan *p)
{
    memset(p, 0, sizeof *p);
    mmp_schema_defaults(&mmp_plan_schema, p);
    p->train.optimizer.min_lr = 0.1f * p->train.optimizer.lr;
    p->n_hosts = 1;
    snprintf(p->hosts[0].name, sizeof p->hosts[0].name, "localhost");
    p->hosts[0].n_devices = 3;
    for (int d = 0; d < 3; d++) {
        p->hosts[0].devices[d] = -1;
    }
}

mmp_err mmp_plan_load(mmp_plan *p, const char *path, const char *const *overrides, int n_overrides)
{
    mmp_plan_defaults(p);
    if (snprintf(p->path, sizeof p->path, "%s", path) >= (int)sizeof p->path) {
        return mmp_errorf(MMP_ERR_CONFIG, "%.64s...: plan path too long", path);
    }
    return mmp_schema_load(&mmp_plan_schema, p, path, overrides, n_overrides, check_loaded);
}

mmp_err mmp_plan_check_runnable(const mmp_plan *p)
{
    const struct {
        int bad;
        const char *key, *why;
    } rules[] = {
        {p->n_hosts > 1 && p->launcher == MMP_LAUNCH_LOCAL, "hosts",
         "more than one host with launcher: local (set launcher: ssh, slurm or agent)"},
    };
    /* the rules concern hosts: say where the plan gave them */
    const char *site = p->hosts_site[0] ? p->hosts_site : p->path, *sep = site[0] ? ": " : "";
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        if (rules[i].bad) {
            return mmp_errorf(MMP_ERR_INVALID, "%s%s%s: %s is not supported yet", site, sep,
                              rules[i].key, rules[i].why);
        }
    }
#ifndef MMP_HAVE_CUDA
    for (int h = 0; h < p->n_hosts; h++) {
        for (int d = 0; d < p->hosts[h].n_devices; d++) {
            if (p->hosts[h].devices[d] >= 0) {
                return mmp_errorf(MMP_ERR_INVALID,
                                  "%s%shosts[%d].devices[%d]: CUDA device %d, but this mmpipe was "
                                  "built without CUDA (configure with -DMMP_CUDA=ON where nvcc, "
                                  "cuDNN and NCCL are installed)",
                                  site, sep, h, d, p->hosts[h].devices[d]);
            }
        }
    }
#endif
    return MMP_OK;
}

int mmp_plan_slot_device(const mmp_plan *p, int slot)
{
    for (int h = 0; h < p->n_hosts; h++) {
        if (slot < p->hosts[h].n_devices) {
            return slot >= 0 ? p->hosts[h].devices[slot] : -1;
        }
        slot -= p->hosts[h].n_devices;
    }
    return -1;
}

int mmp_plan_slot_host(const mmp_plan *p, int slot)
{
    for (int h = 0; h < p->n_hosts; h++) {
        if (slot >= 0 && slot < p->hosts[h].n_devices) {
            return h;
        }
        slot -= p->hosts[h].n_devices;
    }
    return 0;
}

int mmp_plan_control_tcp(const mmp_plan *p)
{
    if (p->control.transport != MMP_CTLT_AUTO) {
        return p->control.transport == MMP_CTLT_TCP;
    }
    return p->n_hosts > 1 || p->launcher != MMP_LAUNCH_LOCAL;
}

int mmp_plan_address_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= MMP_ADDRESS_MAX || s[0] == '-') {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '-' || ch == '_' || ch == ':')) {
            return 0;
        }
    }
    return 1;
}

/* ---- topology ------------------------------------------------------------------ */

int mmp_plan_image_layers(const mmp_plan *p)
{
    int n = 2; /* stem, projection */
    for (int i = 0; i < p->model.image.n_stages; i++) {
        n += p->model.image.blocks[i];
    }
    return n;
}

int mmp_plan_mb_size(const mmp_plan *p, int mb)
{
    int B = p->train.batch, m = p->train.microbatches;
    return B / m + (mb < B % m ? 1 : 0);
}

int mmp_plan_mb_offset(const mmp_plan *p, int mb)
{
    int B = p->train.batch, m = p->train.microbatches;
    return mb * (B / m) + (mb < B % m ? mb : B % m);
}

int mmp_plan_text_layers(const mmp_plan *p)
{
    return p->model.text.layers + 2; /* embedding, layers, final norm */
}

int mmp_plan_replicas(const mmp_plan *p, mmp_branch b, int sub)
{
    const mmp_stage_cfg *s = b == MMP_BRANCH_IMAGE  ? &p->stages.image
                             : b == MMP_BRANCH_TEXT ? &p->stages.text
                                                    : &p->stages.fusion;
    if (s->n_replicas <= 1) {
        return s->n_replicas == 1 ? s->replicas[0] : 1;
    }
    return sub >= 0 && sub < s->n_replicas ? s->replicas[sub] : 1;
}

int mmp_plan_slots(const mmp_plan *p)
{
    int n = 0;
    for (int i = 0; i < p->n_hosts; i++) {
        n += p->hosts[i].n_devices;
    }
    return n;
}

double mmp_plan_sim_ms(const mmp_plan *p, mmp_branch b, int first, int last, int n, int step,
                       int backward, int slot)
{
    int changed = p->sim.change_step > 0 && step + 1 >= p->sim.change_step;
    double per_sample = 0, share = 1;
    switch (b) {
    case MMP_BRANCH_IMAGE:
        per_sample = changed ? p->sim.change.image : p->sim.cost.image;
        share = (double)(last - first) / mmp_plan_image_layers(p);
        break;
    case MMP_BRANCH_TEXT:
        per_sample = changed ? p->sim.change.text : p->sim.cost.text;
        share = (double)(last - first) / mmp_plan_text_layers(p);
        break;
    case MMP_BRANCH_FUSION:
        per_sample = changed ? p->sim.change.fusion : p->sim.cost.fusion;
        break;
    }
    double slowdown = slot >= 0 && slot < p->sim.n_slowdown ? p->sim.slowdown[slot] : 1.0;
    return per_sample * n * share * slowdown * (backward ? p->sim.bwd_factor : 1.0);
}

int mmp_plan_evaluates(const mmp_plan *p)
{
    return p->data.val_manifest[0] && (p->train.eval_every > 0 || p->train.final_eval);
}

int mmp_plan_eval_due(const mmp_plan *p, int steps_done)
{
    return mmp_plan_evaluates(p) &&
           ((p->train.eval_every > 0 && steps_done % p->train.eval_every == 0) ||
            (p->train.final_eval && steps_done == p->job.steps));
}
