/* Plan files: every key and default of a full plan, each kind of error with
 * its exact "file:line:column: key: reason" message, --set overrides, and
 * plan.json read back through libfyaml's JSON parser. Fixtures are in
 * tests/data/config/; run from the repository root. */
#include "common/config.h"

#include <libfyaml.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"

#define DIR "tests/data/config/"

/* Whether files a and b hold the same bytes (no shell: paths come from MMP_TMP). */
static int same_bytes(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF || cb == EOF) {
            break;
        }
    }
    if (fa) {
        fclose(fa);
    }
    if (fb) {
        fclose(fb);
    }
    return same;
}

static int feq(float a, double b)
{
    return fabs((double)a - b) <= 1e-7 + 1e-6 * fabs(b);
}

/* Loading file with the overrides fails with error want and exactly msg. */
static void expect_error(const char *file, const char *const *ov, int n, mmp_err want,
                         const char *msg)
{
    mmp_plan p;
    mmp_err e = mmp_plan_load(&p, file, ov, n);
    CHECK(e == want);
    if (strcmp(mmp_last_error(), msg) != 0) {
        fprintf(stderr, "  got:  %s\n  want: %s\n", mmp_last_error(), msg);
    }
    CHECK(strcmp(mmp_last_error(), msg) == 0);
}

/* As expect_error, for messages whose tail is libfyaml's wording. */
static void expect_error_prefix(const char *file, const char *const *ov, int n, const char *prefix)
{
    mmp_plan p;
    mmp_err e = mmp_plan_load(&p, file, ov, n);
    CHECK(e == MMP_ERR_CONFIG);
    if (strncmp(mmp_last_error(), prefix, strlen(prefix)) != 0) {
        fprintf(stderr, "  got:  %s\n  want: %s...\n", mmp_last_error(), prefix);
    }
    CHECK(strncmp(mmp_last_error(), prefix, strlen(prefix)) == 0);
}

/* path is absolute, under the current directory, and ends with tail. */
static int ends_with_abs(const char *path, const char *tail)
{
    char cwd[1024];
    size_t n = strlen(path), k = strlen(tail);
    int ok = getcwd(cwd, sizeof cwd) && strncmp(path, cwd, strlen(cwd)) == 0 && n >= k &&
             strcmp(path + n - k, tail) == 0;
    if (!ok) {
        fprintf(stderr, "  %s: want <cwd>...%s\n", path, tail);
    }
    return ok;
}

/* Plan paths: relative to the plan file's folder ("..", "." folded), a
 * --set one relative to the current directory, absolute ones kept; the
 * validation set defaults to val.jsonl beside the manifest only when it
 * exists; an explicit one is kept even when missing (preflight names it). */
static void test_paths(void)
{
    char root[1024], path[1200], cwd[1024], want[2400];
    snprintf(root, sizeof root, "%s", mmp_test_tmpdir("config_paths"));
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    snprintf(path, sizeof path, "%s/plans", root);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/d", root);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/plans/p.yaml", root);
    mmp_test_write_text(path, "data: { manifest: ../d/./train.jsonl }\n");
    mmp_plan p;
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    snprintf(want, sizeof want, "%s/d/train.jsonl", root);
    CHECK(strcmp(p.data.manifest, want) == 0);
    snprintf(want, sizeof want, "%s/d/vocab.txt", root);
    CHECK(strcmp(p.data.vocab, want) == 0);
    CHECK(p.data.val_manifest[0] == 0 && !mmp_plan_evaluates(&p));

    snprintf(path, sizeof path, "%s/d/val.jsonl", root);
    mmp_test_write_text(path, "");
    snprintf(path, sizeof path, "%s/plans/p.yaml", root);
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    snprintf(want, sizeof want, "%s/d/val.jsonl", root);
    CHECK(strcmp(p.data.val_manifest, want) == 0 && mmp_plan_evaluates(&p));

    /* The same plan named relative to another directory. */
    CHECK(chdir(root) == 0);
    CHECK_OK(mmp_plan_load(&p, "plans/p.yaml", NULL, 0));
    snprintf(want, sizeof want, "%s/d/train.jsonl", root);
    CHECK(strcmp(p.data.manifest, want) == 0);

    /* --set: relative to where the command runs; absolute kept. */
    const char *ov[] = {"data.vocab=words/v.txt", "data.val_manifest=/x/../y/held.jsonl"};
    CHECK_OK(mmp_plan_load(&p, "plans/p.yaml", ov, 2));
    snprintf(want, sizeof want, "%s/words/v.txt", root);
    CHECK(strcmp(p.data.vocab, want) == 0);
    CHECK(strcmp(p.data.val_manifest, "/y/held.jsonl") == 0);
    CHECK(chdir(cwd) == 0);

    /* plan.json records them absolute, and loads back unchanged from anywhere. */
    snprintf(path, sizeof path, "%s/plan.json", root);
    CHECK_OK(mmp_plan_write_json(&p, path));
    mmp_plan q;
    CHECK_OK(mmp_plan_load(&q, path, NULL, 0));
    CHECK(strcmp(q.data.manifest, p.data.manifest) == 0 &&
          strcmp(q.data.vocab, p.data.vocab) == 0 &&
          strcmp(q.data.val_manifest, p.data.val_manifest) == 0);
    /* ... and a plan without a validation set keeps none. */
    snprintf(path, sizeof path, "%s/d/val.jsonl", root);
    CHECK(unlink(path) == 0);
    snprintf(path, sizeof path, "%s/plans/p.yaml", root);
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    snprintf(path, sizeof path, "%s/plan.json", root);
    CHECK_OK(mmp_plan_write_json(&p, path));
    snprintf(path, sizeof path, "%s/d/val.jsonl", root);
    mmp_test_write_text(path, "");
    snprintf(path, sizeof path, "%s/plan.json", root);
    CHECK_OK(mmp_plan_load(&q, path, NULL, 0));
    CHECK(q.data.val_manifest[0] == 0 && !mmp_plan_evaluates(&q));
}

static void test_full_plan(void)
{
    mmp_plan p;
    CHECK_OK(mmp_plan_load(&p, DIR "good.yaml", NULL, 0));
    CHECK(strcmp(p.path, DIR "good.yaml") == 0);
    CHECK(strcmp(p.job.name, "full \"test\"") == 0);
    CHECK(p.job.steps == 250);
    CHECK(p.job.seed == 12345678901LL);

    /* Paths in the file are relative to its folder, recorded absolute. */
    CHECK(ends_with_abs(p.data.manifest, "/" DIR "data/full/train.jsonl"));
    CHECK(ends_with_abs(p.data.val_manifest, "/" DIR "data/full/held_out.jsonl"));
    CHECK(ends_with_abs(p.data.vocab, "/" DIR "data/full/words.txt"));
    CHECK(p.data.image_size == 64 && p.data.max_text_len == 40);
    CHECK(feq(p.data.mean[0], 0.5) && feq(p.data.mean[1], 0.25) && feq(p.data.mean[2], 0.125));
    CHECK(feq(p.data.std[0], 0.5) && feq(p.data.std[1], 0.5) && feq(p.data.std[2], 2));
    CHECK(p.data.workers == 3);
    CHECK(p.data.on_bad_sample == MMP_BAD_SKIP);
    CHECK(p.data.val_samples == 512);

    CHECK(p.model.width == 96);
    CHECK(p.model.image.n_stages == 3);
    CHECK(p.model.image.blocks[0] == 2 && p.model.image.blocks[1] == 2 &&
          p.model.image.blocks[2] == 1);
    CHECK(p.model.image.channels[0] == 8 && p.model.image.channels[1] == 16 &&
          p.model.image.channels[2] == 32);
    CHECK(p.model.image.stem_pool == 1);
    CHECK(p.model.text.layers == 3 && p.model.text.heads == 6 && p.model.text.ffn_mult == 2);
    CHECK(p.model.fusion.layers == 2 && p.model.fusion.heads == 3);

    CHECK(p.train.batch == 48 && p.train.microbatches == 6);
    CHECK(p.train.schedule == MMP_SCHED_GPIPE);
    CHECK(p.train.precision == MMP_PREC_BF16);
    CHECK(feq(p.train.optimizer.lr, 3e-4) && feq(p.train.optimizer.min_lr, 1e-5));
    CHECK(feq(p.train.optimizer.weight_decay, 0.1) && p.train.optimizer.warmup == 7);
    CHECK(feq(p.train.optimizer.beta1, 0.8) && feq(p.train.optimizer.beta2, 0.95));
    CHECK(feq(p.train.optimizer.eps, 1e-6));
    CHECK(feq(p.train.clip_grad_norm, 0.5));
    CHECK(p.train.eval_every == 25 && p.train.ckpt_every == 100 && p.train.threads == 2);
    CHECK(feq(p.train.init_temperature, 0.1));
    CHECK(p.balance.mode == MMP_BALANCE_DYNAMIC);

    CHECK(p.n_hosts == 2);
    CHECK(strcmp(p.hosts[0].name, "alpha") == 0 && p.hosts[0].n_devices == 3);
    CHECK(p.hosts[0].devices[0] == -1 && p.hosts[0].devices[1] == 0 && p.hosts[0].devices[2] == 1);
    CHECK(strcmp(p.hosts[1].name, "beta") == 0 && p.hosts[1].n_devices == 1 &&
          p.hosts[1].devices[0] == -1);
    CHECK(strcmp(p.hosts[0].address, "alpha.example.org") == 0 && p.hosts[1].address[0] == 0);
    CHECK(strcmp(p.hosts[0].workdir, "/srv/mm") == 0 &&
          strcmp(p.hosts[0].binary, "/opt/mmpipe/bin/mmpipe") == 0 && p.hosts[1].binary[0] == 0);
    CHECK(p.launcher == MMP_LAUNCH_SSH &&
          strcmp(p.launcher_command, "ssh -p 2222 -o BatchMode=yes {address}") == 0);
    CHECK(p.control.transport == MMP_CTLT_TCP && strcmp(p.control.address, "10.1.2.3") == 0 &&
          p.control.port == 5555 && mmp_plan_control_tcp(&p));
    CHECK(mmp_plan_slot_host(&p, 2) == 0 && mmp_plan_slot_host(&p, 3) == 1);

    CHECK(mmp_plan_replicas(&p, MMP_BRANCH_IMAGE, 1) == 2 && p.stages.image.n_split == 2);
    CHECK(p.stages.image.split[0] == 2 && p.stages.image.split[1] == 4);
    CHECK(mmp_plan_replicas(&p, MMP_BRANCH_TEXT, 0) == 1 && p.stages.text.n_split == 1 &&
          p.stages.text.split[0] == 2);
    CHECK(mmp_plan_replicas(&p, MMP_BRANCH_FUSION, 0) == 3 && p.stages.fusion.n_split == 0);
}

static void check_defaults(const mmp_plan *p)
{
    CHECK(strcmp(p->job.name, "job") == 0 && p->job.steps == 100 && p->job.seed == 1);
    CHECK(p->data.image_size == 32 && p->data.max_text_len == 32);
    CHECK(feq(p->data.mean[0], 0.485) && feq(p->data.mean[1], 0.456) &&
          feq(p->data.mean[2], 0.406));
    CHECK(feq(p->data.std[0], 0.229) && feq(p->data.std[1], 0.224) && feq(p->data.std[2], 0.225));
    CHECK(p->data.workers == 1 && p->data.on_bad_sample == MMP_BAD_FAIL);
    CHECK(p->data.val_samples == 256);
    CHECK(p->model.width == 64 && p->model.image.n_stages == 4);
    for (int i = 0; i < 4; i++) {
        CHECK(p->model.image.blocks[i] == 1);
        CHECK(p->model.image.channels[i] == 16 << i);
    }
    CHECK(p->model.image.stem_pool == 0);
    CHECK(p->model.text.layers == 2 && p->model.text.heads == 4 && p->model.text.ffn_mult == 4);
    CHECK(p->model.fusion.layers == 1 && p->model.fusion.heads == 4);
    CHECK(p->train.batch == 64 && p->train.microbatches == 4);
    CHECK(p->train.schedule == MMP_SCHED_1F1B && p->train.precision == MMP_PREC_FP32);
    CHECK(feq(p->train.optimizer.lr, 1e-3) && feq(p->train.optimizer.min_lr, 1e-4));
    CHECK(feq(p->train.optimizer.weight_decay, 0.05) && p->train.optimizer.warmup == 20);
    CHECK(feq(p->train.optimizer.beta1, 0.9) && feq(p->train.optimizer.beta2, 0.999));
    CHECK(feq(p->train.optimizer.eps, 1e-8));
    CHECK(feq(p->train.clip_grad_norm, 1.0) && feq(p->train.init_temperature, 0.07));
    CHECK(p->train.eval_every == 50 && p->train.ckpt_every == 50 && p->train.threads == 1);
    CHECK(p->train.stall_timeout == 60 && p->train.max_restarts == 0 && p->train.ckpt_keep == 3);
    CHECK(p->balance.mode == MMP_BALANCE_OFF);
    CHECK(p->n_hosts == 1 && strcmp(p->hosts[0].name, "localhost") == 0);
    CHECK(p->hosts[0].n_devices == 3);
    for (int d = 0; d < 3; d++) {
        CHECK(p->hosts[0].devices[d] == -1);
    }
    CHECK(p->stages.image.n_replicas == 1 && p->stages.image.replicas[0] == 1 &&
          p->stages.image.n_split == 0);
    CHECK(mmp_plan_replicas(p, MMP_BRANCH_TEXT, 0) == 1 && p->stages.text.n_split == 0);
    CHECK(mmp_plan_replicas(p, MMP_BRANCH_FUSION, 0) == 1);
    CHECK(p->balance.routing == MMP_ROUTE_WEIGHTED && p->balance.window == 3 &&
          p->balance.force.step == 0);
    CHECK(p->compute == MMP_COMPUTE_REAL);
    CHECK(feq(p->sim.cost.image, 0) && feq(p->sim.cost.text, 0) && feq(p->sim.cost.fusion, 0));
    CHECK(feq(p->sim.bwd_factor, 2) && p->sim.n_slowdown == 0 && p->sim.change_step == 0);
    CHECK(feq(p->sim.change.image, 0) && feq(p->sim.change.text, 0) &&
          feq(p->sim.change.fusion, 0));
}

static void test_defaults(void)
{
    mmp_plan p;
    mmp_plan_defaults(&p);
    check_defaults(&p);
    CHECK(p.data.manifest[0] == 0);

    CHECK_OK(mmp_plan_load(&p, DIR "minimal.yaml", NULL, 0));
    check_defaults(&p);
    CHECK(ends_with_abs(p.data.manifest, "/" DIR "data/min/train.jsonl"));
    CHECK(p.data.val_manifest[0] == 0); /* no val.jsonl there: no validation set */
    CHECK(!mmp_plan_evaluates(&p) && !mmp_plan_eval_due(&p, p.job.steps));
    CHECK(ends_with_abs(p.data.vocab, "/" DIR "data/min/vocab.txt"));

    CHECK(strcmp(mmp_schedule_name(MMP_SCHED_GPIPE), "gpipe") == 0);
    CHECK(strcmp(mmp_schedule_name(MMP_SCHED_1F1B), "1f1b") == 0);
    CHECK(strcmp(mmp_precision_name(MMP_PREC_FP32), "fp32") == 0);
    CHECK(strcmp(mmp_precision_name(MMP_PREC_BF16), "bf16") == 0);
    CHECK(strcmp(mmp_precision_name(MMP_PREC_FP16), "fp16") == 0);
}

static void test_demo(void)
{
    /* configs/demo.yaml is the plan users copy: it must always load. */
    if (access("configs/demo.yaml", R_OK) != 0) {
        fprintf(stderr, "note: configs/demo.yaml absent, not checked\n");
        return;
    }
    mmp_plan p;
    CHECK_OK(mmp_plan_load(&p, "configs/demo.yaml", NULL, 0));
    CHECK(p.data.manifest[0] != 0);
}

static void test_file_errors(void)
{
    static const struct {
        const char *file, *msg; /* msg follows the fixture's path */
    } fixtures[] = {
        {"typo.yaml", ":6:3: unknown key 'train.microbatchs' "
                      "(did you mean 'train.microbatches'?)"},
        /* nothing spelled alike in train: the key of that name elsewhere */
        {"misplaced.yaml", ":6:3: unknown key 'train.steps' (did you mean 'job.steps'?)"},
        {"wrongtype.yaml", ":4:10: train.batch: expected an integer, got 'abc'"},
        {"range.yaml", ":2:35: train.microbatches: 0 is out of range [1, 1024]"},
        {"badenum.yaml", ":3:13: train.schedule: unknown value 'pipedream' "
                         "(accepted: gpipe, 1f1b, zb-h1)"},
        {"dupkey.yaml", ":5:3: duplicate key 'train.batch' "
                        "(first given at line 3, column 3)"},
        {"notmap.yaml", ":4:9: model.text: expected a mapping, got a list"},
        {"meanlen.yaml", ":3:9: data.mean: expected 3 values, got 2"},
        {"nomanifest.yaml", ":2:1: data.manifest: required key is missing"},
        {"device.yaml", ":4:20: hosts[0].devices[1]: expected 'cpu', 'cuda:N' or a CUDA "
                        "device ordinal, got 'gpu0'"},
        /* Not UTF-8: refused before libfyaml, which loops for ever on this one
         * (a directive holding invalid bytes; found by tests/fuzz/fuzz_plan.c). */
        {"notutf8.yaml", ":2:2: invalid YAML: byte 0xf7 is not UTF-8 text"},
        /* A complex key: refused before libfyaml, whose parser this one
         * corrupts (found by tests/fuzz/fuzz_plan.c). */
        {"complexkey.yaml", ":3:3: invalid YAML: a '?' complex key (plans have none)"},
        /* checks across keys, placed at the key the file gave */
        {"microbatches.yaml", ":4:17: train.microbatches (8) is more than "
                              "train.batch (4)"},
        {"heads.yaml", ":3:10: model.width (66) is not divisible by "
                       "model.text.heads (4)"},
        {"stagelen.yaml", ":3:20: model.image.channels has 4 values but "
                          "model.image.blocks has 2"},
        {"split.yaml", ":3:22: stages.text.split[1]: 2 must be greater than the split "
                       "point before it (3)"},
    };
    char path[256], want[512];
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        snprintf(path, sizeof path, DIR "%s", fixtures[i].file);
        snprintf(want, sizeof want, "%s%s", path, fixtures[i].msg);
        expect_error(path, NULL, 0, MMP_ERR_CONFIG, want);
    }
    expect_error_prefix(DIR "syntax.yaml", NULL, 0, DIR "syntax.yaml:3:61: invalid YAML: ");
    const char *bad_set[] = {"train.schedule=gpipe\xf7"};
    expect_error(DIR "minimal.yaml", bad_set, 1, MMP_ERR_CONFIG,
                 "--set train.schedule: invalid YAML value: not UTF-8 text");
    const char *key_set[] = {"train.schedule=? e:\t:"};
    expect_error(DIR "minimal.yaml", key_set, 1, MMP_ERR_CONFIG,
                 "--set train.schedule: invalid YAML value: a '?' complex key (plans have none)");
    expect_error(DIR "does_not_exist.yaml", NULL, 0, MMP_ERR_IO,
                 DIR "does_not_exist.yaml: No such file or directory");
    expect_error("tests/data/config", NULL, 0, MMP_ERR_IO, "tests/data/config: Is a directory");
}

/* Plans written on the fly, for errors that need no fixture of their own. */
static void test_written_errors(const char *tmp)
{
    static const struct {
        const char *yaml, *msg;
    } cases[] = {
        {"", "%s:1:1: data.manifest: required key is missing"},
        {"- a\n- b\n",
         "%s:1:1: expected a mapping of sections (job, data, model, ...), got a list"},
        {"data: { manifest: t.jsonl }\n---\ntrain: { batch: 2 }\n",
         "%s:3:1: a plan is one YAML document; this starts a second one"},
        {"data: { manifest: t.jsonl }\nmodel: { text: { heads: 5 } }\n",
         "%s:2:25: model.width (64) is not divisible by model.text.heads (5)"},
        {"data: { manifest: t.jsonl }\nmodel: { fusion: { heads: 7 } }\n",
         "%s:2:27: model.width (64) is not divisible by model.fusion.heads (7)"},
        {"data: { manifest: t.jsonl }\ntrain: { optimizer: { lr: 1e-3, min_lr: 1e-2 } }\n",
         "%s:2:41: train.optimizer.min_lr (0.01) is more than train.optimizer.lr (0.001)"},
        {"data: { manifest: t.jsonl }\nmodel: { image: { stem_pool: 2 } }\n",
         "%s:2:30: model.image.stem_pool: expected true or false, got '2'"},
        {"data: { manifest: t.jsonl }\ntrain: { optimizer: { beta2: 1 } }\n",
         "%s:2:30: train.optimizer.beta2: 1 is out of range [0, 1)"},
        {"data: { manifest: t.jsonl }\ntrain: { batch: \"8\" }\n",
         "%s:2:17: train.batch: expected an integer, got the quoted string \"8\""},
        {"data: { manifest: t.jsonl }\nstages: { text: { split: [9] } }\n",
         "%s:2:26: stages.text.split[0]: 9 is not below the 4 layers of the branch "
         "(embedding, model.text.layers, final norm)"},
        {"data: { manifest: t.jsonl }\nhosts:\n  - { name: a, devices: [cpu] }\n"
         "  - { name: a, devices: [0] }\n",
         "%s:4:13: hosts[1].name: 'a' is already the name of hosts[0]"},
        {"data: { manifest: t.jsonl }\nhosts:\n  - { name: a, address: -oProxyCommand=x, "
         "devices: [cpu] }\n",
         "%s:3:25: hosts[0].address: '-oProxyCommand=x' is not a host name or address (letters, "
         "digits, '.', '-', '_', ':'; not starting with '-')"},
        {"data: { manifest: t.jsonl }\nhosts:\n  - { name: a, workdir: rel/dir, devices: [cpu] }\n",
         "%s:3:25: hosts[0].workdir: expected an absolute path without quotes or control "
         "characters, got 'rel/dir'"},
        {"data: { manifest: t.jsonl }\nhosts:\n  - { name: a, binary: /opt/mmpipe, devices: [cpu] "
         "}\n",
         "%s:3:3: hosts[0].binary: only launcher: ssh, slurm or agent starts stages from it "
         "(launcher: "
         "local runs this mmpipe in this directory); drop it or set launcher"},
        {"data: { manifest: t.jsonl }\nhosts:\n  - { name: a, binray: /x, devices: [cpu] }\n",
         "%s:3:16: unknown key 'hosts[0].binray' (did you mean 'hosts[0].binary'?)"},
        {"data: { manifest: t.jsonl }\nlauncher: ssh\nlauncher_command: ssh {address}; rm\n",
         "%s:3:19: launcher_command: 'ssh {address}; rm': quotes and shell characters are not "
         "allowed (it is split on spaces and run without a shell)"},
        {"data: { manifest: t.jsonl }\nlauncher: ssh\nlauncher_command: ssh host\n",
         "%s:3:19: launcher_command: 'ssh host' must start with a program and name {address}"},
        {"data: { manifest: t.jsonl }\nlauncher: pdsh\n",
         "%s:2:11: launcher: unknown value 'pdsh' (accepted: local, ssh, slurm, agent)"},
        {"data: { manifest: t.jsonl }\nlauncher: agent\n",
         "%s:2:11: launcher: agent needs agent.key_file, the key the hosts' agents were started "
         "with (mmpipe agent --new-key FILE makes one)"},
        {"data: { manifest: t.jsonl }\nlauncher: agent\nagent: { key_file: /k, port: 0 }\n",
         "%s:3:30: agent.port: 0 is out of range [1, 65535]"},
        {"data: { manifest: t.jsonl }\ncontrol: { address: 'a b' }\n",
         "%s:2:21: control.address: 'a b' is not a host name or address"},
        {"data: { manifest: t.jsonl }\nhosts: slurmm\n",
         "%s:2:8: hosts: expected 'slurm' or a list of {name, devices}, got 'slurmm'"},
        {"data: { manifest: t.jsonl }\nstages: { image: { layers: first } }\n",
         "%s:2:28: stages.image.layers: unknown value 'first' (accepted: all)"},
        {"data: { manifest: t.jsonl }\nsim: { cost: { text: -1 } }\n",
         "%s:2:22: sim.cost.text: -1 is out of range [0, 1e+06]"},
        {"data: { manifest: t.jsonl }\nsim: { slowdown: [1, 0] }\n",
         "%s:2:22: sim.slowdown[1]: 0 is out of range (0, 1000]"},
        {"data: { manifest: t.jsonl }\ncompute: fake\n",
         "%s:2:10: compute: unknown value 'fake' (accepted: real, simulated)"},
        {"data: { manifest: t.jsonl }\ntrian: {}\n",
         "%s:2:1: unknown key 'trian' (did you mean 'train'?)"},
        {"data: { manifest: t.jsonl }\ntrain: { batch: *nope }\n",
         "%s:2:18: alias *nope: no anchor &nope before it"},
    };
    char path[1200], want[2048];
    snprintf(path, sizeof path, "%s/plan.yaml", tmp);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!mmp_test_write_text(path, cases[i].yaml)) {
            return;
        }
        snprintf(want, sizeof want, cases[i].msg, path);
        expect_error(path, NULL, 0, MMP_ERR_CONFIG, want);
    }
}

static void test_overrides(void)
{
    mmp_plan p;
    const char *const ok[] = {
        "train.batch=32",           "train.optimizer.lr=5e-4",
        "model.image.blocks=[2,2]", "model.image.channels=[8, 16]",
        "stages.text.split=[1]",    "hosts=[{name: h1, devices: [cpu, 0, cuda:3]}]",
        "balance.mode=dynamic", /* no balance section in the file: created */
        "job.name=override run",
    };
    CHECK_OK(mmp_plan_load(&p, DIR "minimal.yaml", ok, 8));
    CHECK(p.train.batch == 32);
    CHECK(feq(p.train.optimizer.lr, 5e-4) && feq(p.train.optimizer.min_lr, 5e-5));
    CHECK(p.model.image.n_stages == 2 && p.model.image.blocks[1] == 2 &&
          p.model.image.channels[1] == 16);
    CHECK(p.stages.text.n_split == 1 && p.stages.text.split[0] == 1);
    CHECK(p.n_hosts == 1 && strcmp(p.hosts[0].name, "h1") == 0 && p.hosts[0].n_devices == 3 &&
          p.hosts[0].devices[0] == -1 && p.hosts[0].devices[1] == 0 && p.hosts[0].devices[2] == 3);
    CHECK(mmp_plan_slot_device(&p, 2) == 3 && mmp_plan_slot_device(&p, 0) == -1 &&
          mmp_plan_slot_device(&p, 3) == -1);
    CHECK(p.balance.mode == MMP_BALANCE_DYNAMIC);
    CHECK(strcmp(p.job.name, "override run") == 0);

    /* later overrides win; a value in the file is replaced */
    const char *const twice[] = {"train.batch=8", "train.batch=16", "train.microbatches=3"};
    CHECK_OK(mmp_plan_load(&p, DIR "good.yaml", twice, 3));
    CHECK(p.train.batch == 16 && p.train.microbatches == 3);
    /* more replicas of a loading sub-stage than micro-batches: one would load
     * none (the fusion's 3 replicas with 2 micro-batches are fine) */
    const char *const few[] = {"train.microbatches=2", "stages.image.replicas=[3,1,1]"};
    expect_error(DIR "good.yaml", few, 2, MMP_ERR_CONFIG,
                 "--set stages.image.replicas=[3,1,1]: stages.image.replicas: 3 replicas of the "
                 "branch's first sub-stage, more than train.microbatches (2): each loads whole "
                 "micro-batches, so one would load none");
    const char *const fusion3[] = {"train.microbatches=2"};
    CHECK_OK(mmp_plan_load(&p, DIR "good.yaml", fusion3, 1));
    CHECK(feq(p.train.optimizer.lr, 3e-4)); /* the rest of the file still applies */

    /* a whole section as a flow mapping */
    const char *const section[] = {"train={batch: 8, microbatches: 2}"};
    CHECK_OK(mmp_plan_load(&p, DIR "minimal.yaml", section, 1));
    CHECK(p.train.batch == 8 && p.train.microbatches == 2);
    /* merged into the section the file has, key by key, mappings in it too:
     * the file's other keys stay (they used to fall back to the defaults) */
    const char *const merged[] = {"train={batch: 8, optimizer: {warmup: 3}}"};
    CHECK_OK(mmp_plan_load(&p, DIR "good.yaml", merged, 1));
    CHECK(p.train.batch == 8 && p.train.optimizer.warmup == 3);
    CHECK(feq(p.train.optimizer.lr, 3e-4) && feq(p.train.optimizer.min_lr, 1e-5));
    /* a key it merges in is checked and named as the override's */
    const char *const merged_bad[] = {"train={optimizer: {warmup: -1}}"};
    expect_error_prefix(DIR "good.yaml", merged_bad, 1,
                        "--set train={optimizer: {warmup: -1}}: train.optimizer.warmup: -1");

    static const struct {
        const char *file, *set, *msg;
    } bad[] = {
        {DIR "minimal.yaml", "train.microbatchs=4",
         "--set train.microbatchs=4: unknown key 'train.microbatchs' "
         "(did you mean 'train.microbatches'?)"},
        {DIR "minimal.yaml", "steps=5",
         "--set steps=5: unknown key 'steps' (did you mean "
         "'job.steps'?)"},
        {DIR "minimal.yaml", "train.lr=0.1",
         "--set train.lr=0.1: unknown key 'train.lr' (did you mean 'train.optimizer.lr'?)"},
        {DIR "minimal.yaml", "model.heads=2",
         "--set model.heads=2: unknown key 'model.heads' (did you mean 'model.text.heads' or "
         "'model.fusion.heads'?)"},
        {DIR "minimal.yaml", "job.name=../../x",
         "--set job.name=../../x: job.name: '../../x' names the run directory "
         "(runs/<job.name>-<time>): not empty, no '/' in it, not starting with '-' or '.'"},
        {DIR "minimal.yaml", "job.name=''",
         "--set job.name='': job.name: '' names the run directory "
         "(runs/<job.name>-<time>): not empty, no '/' in it, not starting with '-' or '.'"},
        {DIR "minimal.yaml", "job.name=-rf",
         "--set job.name=-rf: job.name: '-rf' names the run directory "
         "(runs/<job.name>-<time>): not empty, no '/' in it, not starting with '-' or '.'"},
        {DIR "minimal.yaml", "train.batch=abc",
         "--set train.batch=abc: train.batch: expected an integer, got 'abc'"},
        {DIR "minimal.yaml", "train.batch", "--set train.batch: expected KEY=VALUE"},
        {DIR "minimal.yaml", "train.microbatches=128",
         "--set train.microbatches=128: train.microbatches (128) is more than "
         "train.batch (64)"},
        {DIR "minimal.yaml", "train={batch: 8, microbatchs: 2}",
         "--set train={batch: 8, microbatchs: 2}: unknown key 'train.microbatchs' "
         "(did you mean 'train.microbatches'?)"},
        {DIR "minimal.yaml", "train={batch: 1, batch: 2}",
         "--set train={batch: 1, batch: 2}: duplicate key 'train.batch'"},
        {DIR "minimal.yaml", "train.optimizer.lr=0",
         "--set train.optimizer.lr=0: train.optimizer.lr: 0 is out of range (0, 10]"},
        /* the file, not the override, is wrong here: the message points into it */
        {DIR "notmap.yaml", "model.text.layers=3",
         DIR "notmap.yaml:4:9: model.text: expected a mapping, got a list"},
        {DIR "nomanifest.yaml", "data.workers=2",
         DIR "nomanifest.yaml:2:1: data.manifest: required key is missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        expect_error(bad[i].file, &bad[i].set, 1, MMP_ERR_CONFIG, bad[i].msg);
    }
    const char *const bad_yaml[] = {"model.image.blocks=[1,2"};
    expect_error_prefix(DIR "minimal.yaml", bad_yaml, 1,
                        "--set model.image.blocks=[1,2: invalid YAML value: ");
    /* the override only fixes what the file gets wrong */
    const char *const fix[] = {"train.microbatches=4"};
    CHECK_OK(mmp_plan_load(&p, DIR "range.yaml", fix, 1));
}

/* compute: simulated and the sim.* keys: loading, the change.* defaults
 * (the costs before the change), and the costs mmp_plan_sim_ms derives. */
static void test_sim(const char *tmp)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/sim.yaml", tmp);
    if (!mmp_test_write_text(path, "data: { manifest: t.jsonl }\n"
                                   "model: { image: { blocks: [1, 1, 1] }, text: { layers: 2 } }\n"
                                   "compute: simulated\n"
                                   "sim:\n"
                                   "  cost: { image: 4, text: 1, fusion: 0.5 }\n"
                                   "  bwd_factor: 3\n"
                                   "  slowdown: [1.5, 1]\n"
                                   "  change_step: 10\n"
                                   "  change: { text: 2 }\n")) {
        return;
    }
    const char *const chans[] = {"model.image.channels=[8, 16, 32]"};
    mmp_plan p;
    CHECK_OK(mmp_plan_load(&p, path, chans, 1));
    CHECK(p.compute == MMP_COMPUTE_SIMULATED);
    CHECK(feq(p.sim.cost.image, 4) && feq(p.sim.cost.text, 1) && feq(p.sim.cost.fusion, 0.5));
    CHECK(feq(p.sim.bwd_factor, 3) && p.sim.change_step == 10);
    CHECK(p.sim.n_slowdown == 2 && feq(p.sim.slowdown[0], 1.5) && feq(p.sim.slowdown[1], 1));
    /* not given: the cost before the change */
    CHECK(feq(p.sim.change.image, 4) && feq(p.sim.change.text, 2) && feq(p.sim.change.fusion, 0.5));

    /* image: 5 layers (stem, 3 blocks, projection); text: 4 */
    CHECK(mmp_plan_image_layers(&p) == 5 && mmp_plan_text_layers(&p) == 4);
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_IMAGE, 0, 5, 8, 0, 0, 0) - 4 * 8 * 1.5) < 1e-9);
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_IMAGE, 1, 3, 8, 0, 0, 0) - 4 * 8 * 0.4 * 1.5) < 1e-9);
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_IMAGE, 0, 5, 8, 0, 1, 0) - 4 * 8 * 1.5 * 3) < 1e-9);
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_FUSION, 0, 0, 2, 0, 0, 0) - 0.5 * 2 * 1.5) < 1e-9);
    /* step 9 (0-based) is metrics step 10: the change applies from there */
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_TEXT, 0, 4, 4, 8, 0, 0) - 1 * 4 * 1.5) < 1e-9);
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_TEXT, 0, 4, 4, 9, 0, 0) - 2 * 4 * 1.5) < 1e-9);
    /* the slowdown is per device slot; slots past the list run at 1.0 */
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_TEXT, 0, 4, 4, 9, 0, 1) - 2 * 4 * 1.0) < 1e-9);
    CHECK(fabs(mmp_plan_sim_ms(&p, MMP_BRANCH_TEXT, 0, 4, 4, 9, 0, 5) - 2 * 4 * 1.0) < 1e-9);

    /* plan.json keeps them (stage processes read it) */
    char json[1300];
    snprintf(json, sizeof json, "%s/sim.json", tmp);
    CHECK_OK(mmp_plan_write_json(&p, json));
    mmp_plan q;
    CHECK_OK(mmp_plan_load(&q, json, NULL, 0));
    CHECK(q.compute == MMP_COMPUTE_SIMULATED && q.sim.n_slowdown == 2 &&
          feq(q.sim.change.text, 2) && feq(q.sim.change.image, 4) && q.sim.change_step == 10);

    const char *const factor[] = {"sim.bwd_factor=-0.5"};
    expect_error(DIR "minimal.yaml", factor, 1, MMP_ERR_CONFIG,
                 "--set sim.bwd_factor=-0.5: sim.bwd_factor: -0.5 is out of range [0, 1000]");
    const char *const step[] = {"sim.change_step=-1"};
    expect_error(DIR "minimal.yaml", step, 1, MMP_ERR_CONFIG,
                 "--set sim.change_step=-1: sim.change_step: -1 is out of range [0, 1000000000]");
}

/* The scalar at path ("/a/0/b") in doc, or "" (for CHECKs to fail on). */
static const char *json_at(struct fy_document *doc, const char *path, char *buf, size_t size)
{
    /* libfyaml 0.7.12's FYNWF_PTR_JSON mode loses its way in mappings
     * inside lists ("/hosts/0/name"); its default path syntax does not. */
    struct fy_node *n =
        doc ? fy_node_by_path(fy_document_root(doc), path, FY_NT, FYNWF_DONT_FOLLOW) : NULL;
    size_t len = 0;
    const char *s = n ? fy_node_get_scalar(n, &len) : NULL;
    snprintf(buf, size, "%.*s", s ? (int)len : 0, s ? s : "");
    return buf;
}

static void test_json(const char *tmp)
{
    mmp_plan p;
    char path[1200], buf[256];
    CHECK_OK(mmp_plan_load(&p, DIR "good.yaml", NULL, 0));
    /* characters JSON must escape */
    snprintf(p.job.name, sizeof p.job.name, "a \"quoted\" back\\slash\nnew\tline");
    snprintf(path, sizeof path, "%s/plan.json", tmp);
    CHECK_OK(mmp_plan_write_json(&p, path));

    struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET | FYPCF_JSON_FORCE};
    struct fy_document *doc = fy_document_build_from_file(&cfg, path);
    CHECK(doc != NULL);
    CHECK(strcmp(json_at(doc, "/path", buf, sizeof buf), "") == 0); /* schema keys only */
    CHECK(strcmp(json_at(doc, "/job/name", buf, sizeof buf), p.job.name) == 0);
    CHECK(strcmp(json_at(doc, "/job/seed", buf, sizeof buf), "12345678901") == 0);
    CHECK(strcmp(json_at(doc, "/train/batch", buf, sizeof buf), "48") == 0);
    CHECK(strcmp(json_at(doc, "/train/schedule", buf, sizeof buf), "gpipe") == 0);
    CHECK(strtof(json_at(doc, "/train/optimizer/lr", buf, sizeof buf), NULL) ==
          p.train.optimizer.lr);
    CHECK(strtof(json_at(doc, "/train/optimizer/eps", buf, sizeof buf), NULL) ==
          p.train.optimizer.eps);
    CHECK(strtof(json_at(doc, "/data/mean/2", buf, sizeof buf), NULL) == p.data.mean[2]);
    CHECK(strcmp(json_at(doc, "/model/image/channels/2", buf, sizeof buf), "32") == 0);
    CHECK(strcmp(json_at(doc, "/model/image/stem_pool", buf, sizeof buf), "true") == 0);
    CHECK(strcmp(json_at(doc, "/hosts/0/devices/0", buf, sizeof buf), "cpu") == 0);
    CHECK(strcmp(json_at(doc, "/hosts/0/devices/2", buf, sizeof buf), "1") == 0);
    CHECK(strcmp(json_at(doc, "/hosts/1/name", buf, sizeof buf), "beta") == 0);
    CHECK(strcmp(json_at(doc, "/stages/image/split/1", buf, sizeof buf), "4") == 0);
    CHECK(strcmp(json_at(doc, "/stages/image/layers", buf, sizeof buf), "all") == 0);
    CHECK(strcmp(json_at(doc, "/stages/fusion/replicas/0", buf, sizeof buf), "3") == 0);
    fy_document_destroy(doc);

    /* plan.json loads back as the same plan (stage processes rely on it). */
    mmp_plan q;
    CHECK_OK(mmp_plan_load(&q, path, NULL, 0));
    char again[1300];
    snprintf(again, sizeof again, "%s/plan2.json", tmp);
    CHECK_OK(mmp_plan_write_json(&q, again));
    CHECK(same_bytes(path, again));

    char bad[1300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/plan.json", tmp);
    CHECK(mmp_plan_write_json(&p, bad) == MMP_ERR_IO);
    CHECK(strstr(mmp_last_error(), "No such file or directory") != NULL);
}

static const char *tmp;

static void test_written_errors_case(void)
{
    test_written_errors(tmp);
}

/* Aliases that expand past any plan's size are refused before the
 * document is resolved (which would copy them all: 4.8 million nodes for
 * the 7 levels of nine below, a billion for 10), at the alias that goes
 * over; so is a chain of anchors nested deeper than any plan. */
static void test_alias_bombs(void)
{
    static char yaml[64 * 1024];
    char path[1200];
    snprintf(path, sizeof path, "%s/laughs.yaml", tmp);
    for (int deep = 0; deep < 2; deep++) {
        int n = snprintf(yaml, sizeof yaml,
                         "data: { manifest: t.jsonl }\nhosts:\n"
                         "  - { name: a, devices: [cpu] }\n"
                         "x:\n  l0: &l0 [a, a, a, a, a, a, a, a, a]\n");
        int levels = deep ? 300 : 7;
        for (int l = 1; l <= levels; l++) {
            n += snprintf(yaml + n, sizeof yaml - (size_t)n, "  l%d: &l%d [", l, l);
            for (int k = 0; k < (deep ? 1 : 9); k++) {
                n += snprintf(yaml + n, sizeof yaml - (size_t)n, "%s*l%d", k ? ", " : "", l - 1);
            }
            n += snprintf(yaml + n, sizeof yaml - (size_t)n, "]\n");
        }
        if (!mmp_test_write_text(path, yaml)) {
            return;
        }
        mmp_plan p;
        CHECK(mmp_plan_load(&p, path, NULL, 0) == MMP_ERR_CONFIG);
        const char *msg = mmp_last_error();
        /* 7 levels: l5 (9^6 nodes, with 74732 before it) goes over in its list */
        char where[1300];
        snprintf(where, sizeof where, "%s:%d:", path, deep ? 5 + 256 / 2 : 5 + 5);
        int ok =
            strstr(msg, "aliases expand past") && (deep || strncmp(msg, where, strlen(where)) == 0);
        if (!ok) {
            fprintf(stderr, "  %s: got: %s\n", deep ? "deep chain" : "nested nines", msg);
        }
        CHECK(ok);
    }
}

/* YAML merge keys: a host that is another with one key changed; a list of
 * sources, the first giving a key winning; a key the mapping gives itself
 * winning over every source; a merge of a scalar refused where it stands;
 * a bad key that came through a merge named at its own line. */
static void test_merge_keys(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/merge.yaml", tmp);
    const char *good = "launcher: ssh\n"
                       "data: { manifest: t.jsonl }\n"
                       "hosts:\n"
                       "  - &a { name: a, address: node-a, workdir: /w, devices: [cpu, cpu] }\n"
                       "  - { <<: *a, name: b, address: node-b }\n"
                       "  - &c { name: c, devices: [cpu] }\n"
                       "  - { <<: [*c, *a], name: d }\n";
    if (!mmp_test_write_text(path, good)) {
        return;
    }
    mmp_plan p;
    mmp_err e = mmp_plan_load(&p, path, NULL, 0);
    CHECK_OK(e);
    if (e == MMP_OK) {
        CHECK(p.n_hosts == 4);
        CHECK(strcmp(p.hosts[1].name, "b") == 0 && strcmp(p.hosts[1].address, "node-b") == 0);
        CHECK(strcmp(p.hosts[1].workdir, "/w") == 0 && p.hosts[1].n_devices == 2);
        /* d: its own name; devices from c (first), workdir and address from a */
        CHECK(strcmp(p.hosts[3].name, "d") == 0 && p.hosts[3].n_devices == 1);
        CHECK(strcmp(p.hosts[3].workdir, "/w") == 0 && strcmp(p.hosts[3].address, "node-a") == 0);
        CHECK(strcmp(p.hosts[0].name, "a") == 0 && strcmp(p.hosts[0].address, "node-a") == 0);
    }
    const char *bad[][2] = {
        {"data: { manifest: t.jsonl }\n"
         "hosts:\n"
         "  - { name: a, devices: [cpu] }\n"
         "train: { batch: &b 8, optimizer: { <<: *b } }\n",
         ":4:41: <<: merges mappings"},
        /* a key valid where it was written, not where it was merged to:
         * the message says where it went and points where it was written */
        {"data: { manifest: t.jsonl }\n"
         "train: { optimizer: &o { lr: 1.0e-3 } }\n"
         "hosts:\n"
         "  - { <<: *o, name: a, devices: [cpu] }\n",
         ":2:26: unknown key 'hosts[0].lr'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (!mmp_test_write_text(path, bad[i][0])) {
            return;
        }
        CHECK(mmp_plan_load(&p, path, NULL, 0) == MMP_ERR_CONFIG);
        const char *msg = mmp_last_error();
        int ok = strstr(msg, bad[i][1]) != NULL;
        if (!ok) {
            fprintf(stderr, "  merge case %zu: want '%s', got: %s\n", i, bad[i][1], msg);
        }
        CHECK(ok);
    }
}

static void test_sim_case(void)
{
    test_sim(tmp);
}

static void test_json_case(void)
{
    test_json(tmp);
}

/* `hosts: slurm` reads the allocation's environment (common/hostlist.h);
 * outside one it is a clear error at the key's place. */
static void test_hosts_slurm(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/slurm.yaml", tmp);
    CHECK(
        mmp_test_write_text(path, "data: { manifest: t.jsonl }\nlauncher: slurm\nhosts: slurm\n"));
    unsetenv("SLURM_JOB_NODELIST");
    mmp_plan p;
    CHECK(mmp_plan_load(&p, path, NULL, 0) == MMP_ERR_CONFIG);
    CHECK(strstr(mmp_last_error(), "slurm.yaml:3:8: hosts: slurm: not inside a SLURM allocation") !=
          NULL);
    setenv("SLURM_JOB_NODELIST", "gpu[01-02,07]", 1);
    setenv("SLURM_GPUS_ON_NODE", "2", 1);
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    CHECK(p.n_hosts == 3 && strcmp(p.hosts[2].name, "gpu07") == 0 &&
          strcmp(p.hosts[2].address, "gpu07") == 0 && p.hosts[2].n_devices == 2 &&
          p.hosts[2].devices[1] == 1 && p.launcher == MMP_LAUNCH_SLURM);
    setenv("SLURM_JOB_NODELIST", "gpu[01-", 1);
    CHECK(mmp_plan_load(&p, path, NULL, 0) == MMP_ERR_CONFIG);
    CHECK(strstr(mmp_last_error(), "SLURM_JOB_NODELIST: hostlist 'gpu[01-'") != NULL);
    /* as many nodes as a plan takes hosts (MMP_MAX_HOSTS), not one more */
    setenv("SLURM_JOB_NODELIST", "n[001-128]", 1);
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    CHECK(p.n_hosts == 128 && strcmp(p.hosts[127].name, "n128") == 0 && mmp_plan_slots(&p) == 256);
    setenv("SLURM_JOB_NODELIST", "n[001-129]", 1);
    CHECK(mmp_plan_load(&p, path, NULL, 0) == MMP_ERR_CONFIG);
    CHECK(strstr(mmp_last_error(), "SLURM_JOB_NODELIST") != NULL);
    unsetenv("SLURM_JOB_NODELIST");
    unsetenv("SLURM_GPUS_ON_NODE");
}

/* A plan's hosts: up to MMP_MAX_HOSTS (128: a plan's 1024 processes on
 * nodes of 8 GPUs), one more refused at the key's place. */
static void test_many_hosts(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/hosts.yaml", tmp);
    static mmp_plan p;
    for (int n = MMP_MAX_HOSTS; n <= MMP_MAX_HOSTS + 1; n++) {
        static char text[64 * (MMP_MAX_HOSTS + 1) + 256];
        size_t at = (size_t)snprintf(text, sizeof text,
                                     "data: { manifest: t.jsonl }\nlauncher: ssh\nhosts:\n");
        for (int h = 0; h < n; h++) {
            at += (size_t)snprintf(text + at, sizeof text - at,
                                   "  - { name: node%03d, devices: [cuda:0, cuda:1] }\n", h);
        }
        CHECK(mmp_test_write_text(path, text));
        mmp_err e = mmp_plan_load(&p, path, NULL, 0);
        if (n == MMP_MAX_HOSTS) {
            CHECK(e == MMP_OK && p.n_hosts == n && mmp_plan_slots(&p) == 2 * n &&
                  strcmp(p.hosts[n - 1].name, "node127") == 0 &&
                  mmp_plan_slot_host(&p, 2 * n - 1) == n - 1);
        } else {
            CHECK(e == MMP_ERR_CONFIG && strstr(mmp_last_error(), "hosts.yaml:4:3: ") &&
                  strstr(mmp_last_error(), "expected 1 to 128 hosts, got 129"));
        }
    }
}

/* hosts[].nodes: a hostlist (SLURM's syntax) for a run of hosts alike
 * (Kubernetes pods, a rack), expanded in place among the other entries; its
 * errors at the key's file:line:column; plan.json holds the expanded hosts
 * and loads back to the same plan. */
static void test_hosts_nodes(void)
{
    char path[1200], json[1200];
    snprintf(path, sizeof path, "%s/nodes.yaml", tmp);
    snprintf(json, sizeof json, "%s/nodes.json", tmp);
    static mmp_plan p, back;
    CHECK(mmp_test_write_text(path,
                              "data: { manifest: t.jsonl }\nlauncher: agent\n"
                              "agent: { key_file: /k }\nhosts:\n"
                              "  - { name: head, devices: [cpu] }\n"
                              "  - { nodes: \"pod-[0-2].mm,gpu07\", devices: [cuda:0, cuda:1], "
                              "binary: /opt/mm }\n"
                              "  - { name: tail, address: 10.0.0.9, devices: [cpu] }\n"));
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    CHECK(p.n_hosts == 6 && mmp_plan_slots(&p) == 10);
    static const char *const want[] = {"head", "pod-0.mm", "pod-1.mm", "pod-2.mm", "gpu07", "tail"};
    for (int h = 0; h < 6 && h < p.n_hosts; h++) {
        CHECK(strcmp(p.hosts[h].name, want[h]) == 0);
    }
    CHECK(strcmp(p.hosts[2].address, "pod-1.mm") == 0 && p.hosts[2].n_devices == 2 &&
          p.hosts[2].devices[1] == 1 && strcmp(p.hosts[4].binary, "/opt/mm") == 0);
    CHECK(strcmp(p.hosts[5].address, "10.0.0.9") == 0 && p.hosts[0].address[0] == 0);
    CHECK(mmp_plan_slot_host(&p, 9) == 5 && mmp_plan_slot_device(&p, 8) == 1);
    CHECK_OK(mmp_plan_write_json(&p, json));
    CHECK_OK(mmp_plan_load(&back, json, NULL, 0));
    CHECK(back.n_hosts == 6 && strcmp(back.hosts[3].name, "pod-2.mm") == 0 &&
          strcmp(back.hosts[3].address, "pod-2.mm") == 0);
    struct {
        const char *hosts, *want;
    } bad[] = {
        {"  - { nodes: \"n[3-1]\", devices: [cpu] }\n", "nodes.yaml:5:14: hosts[0].nodes: "},
        {"  - { nodes: \"n[1-2]\", name: x, devices: [cpu] }\n",
         "nodes.yaml:5:14: hosts[0]: nodes names and addresses its hosts: no name beside it"},
        {"  - { nodes: \"n[1-2]\", address: a, devices: [cpu] }\n", "no address beside it"},
        {"  - { nodes: \"n[1-2]\" }\n",
         "nodes.yaml:5:5: hosts[0].devices: required key is missing"},
        {"  - { name: n2, devices: [cpu] }\n  - { nodes: \"n[1-3]\", devices: [cpu] }\n",
         "nodes.yaml:6:14: hosts[1].nodes: 'n2' is already the name of another host"},
        {"  - { nodes: \"n[1-128]\", devices: [cpu] }\n  - { name: x, devices: [cpu] }\n",
         "nodes.yaml:6:5: hosts[1]: past the 128 hosts a plan holds"},
        {"  - { name: x, devices: [cpu] }\n  - { nodes: \"n[1-128]\", devices: [cpu] }\n",
         "a plan holds at most 128 hosts in all"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char text[512];
        snprintf(
            text, sizeof text,
            "data: { manifest: t.jsonl }\nlauncher: agent\nagent: { key_file: /k }\nhosts:\n%s",
            bad[k].hosts);
        CHECK(mmp_test_write_text(path, text));
        mmp_err e = mmp_plan_load(&p, path, NULL, 0);
        CHECK(e == MMP_ERR_CONFIG && strstr(mmp_last_error(), bad[k].want));
        if (e != MMP_ERR_CONFIG || !strstr(mmp_last_error(), bad[k].want)) {
            fprintf(stderr, "  case %zu: got %s\n  want %s\n", k, mmp_last_error(), bad[k].want);
        }
    }
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_hosts_slurm),
    MMP_TEST_CASE(test_many_hosts),
    MMP_TEST_CASE(test_hosts_nodes),
    MMP_TEST_CASE(test_full_plan),
    MMP_TEST_CASE(test_defaults),
    MMP_TEST_CASE(test_paths),
    MMP_TEST_CASE(test_demo),
    MMP_TEST_CASE(test_file_errors),
    {"test_written_errors", test_written_errors_case},
    {"test_alias_bombs", test_alias_bombs},
    MMP_TEST_CASE(test_merge_keys),
    MMP_TEST_CASE(test_overrides),
    {"test_sim", test_sim_case},
    {"test_json", test_json_case},
};

int main(int argc, char **argv)
{
    tmp = mmp_test_tmpdir("test_config");
    return MMP_TEST_MAIN("test_config", cases, argc, argv);
}
