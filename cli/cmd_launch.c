/* mmpipe launch: load and check the plan, prepare the run directory, train. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/ckpt.h"
#include "common/config.h"
#include "common/fingerprint.h"
#include "common/fsutil.h"
#include "common/interrupt.h"
#include "common/metrics.h"
#include "coordinator/balancer.h"
#include "coordinator/run.h"
#include "data/preflight.h"
#include "data/tokenizer.h"
#include "stages/single.h"

static const char USAGE[] =
    "usage: mmpipe launch PLAN.yaml [--single-process] [--steps N] [--out DIR] [--force]\n"
    "                     [--resume DIR | --init-from FILE.safetensors] [--set KEY=VALUE]...\n"
    "\n"
    "Trains the model the plan describes and writes the run directory:\n"
    "metrics.jsonl, plan.json, ckpt/step_NNNNNNN/ and ckpt/latest.\n"
    "\n"
    "Without --single-process the coordinator starts one process per stage\n"
    "(image, text, fusion, and sub-stages when a branch is split), runs the\n"
    "plan's schedule over data channels (shared memory; cuda_ipc between GPU\n"
    "stages; tcp or NCCL between hosts: transport.data), and writes trace.json\n"
    "too.\n"
    "Schedules (train.schedule): gpipe, 1f1b (the default), zb-h1 (1f1b with\n"
    "the backward split into input- and weight-gradient passes, the weight\n"
    "passes deferred into the bubbles); each trains bit-identically to\n"
    "--single-process.\n"
    "\n"
    "Cores (CPU plans): train.threads holds in every process; train.pin: auto\n"
    "(or a list of core ids) pins stage process k of a host to core k % n of\n"
    "that list (the single process to the first), off (default) leaves them to\n"
    "the OS. stages: auto profiles one process per stage, then takes the\n"
    "planner's placement for this host's cores, processes sharing cores so that\n"
    "every core carries about the same work (e.g. the demo on 2 cores:\n"
    "image.0:2 text.0:2 fusion:1); with more processes than cores,\n"
    "train.priority: auto (the default; off to keep every process at 0) runs\n"
    "the processes with the big loads at nice 10, so the light stages' work\n"
    "that the others wait on goes first.\n"
    "\n"
    "Several hosts: the plan's launcher (ssh: one launcher_command per stage;\n"
    "slurm: one srun step per stage inside an allocation, with hosts: slurm\n"
    "reading SLURM_JOB_NODELIST) starts each stage on its host; the control\n"
    "plane then runs over tcp with ZeroMQ CURVE (keys made per job, handed to\n"
    "each stage on its stdin) and channels between hosts over tcp. The run\n"
    "directory and the data must be at the same paths on every host.\n"
    "\n"
    "options:\n"
    "  --single-process   run image branch, text branch and fusion in this one\n"
    "                     process (the numerical reference and speed baseline)\n"
    "  --resume DIR       continue the run in DIR from its ckpt/latest (DIR is\n"
    "                     also the output directory). Refused, naming the key,\n"
    "                     when the plan changes a key the checkpoint is bound to\n"
    "                     (model.*, data.manifest, data.vocab, data.image_size,\n"
    "                     data.max_text_len, data.mean, data.std, data.augment,\n"
    "                     job.seed, train.batch); job.steps, the optimizer,\n"
    "                     schedule, evaluation and stages.* may change. job.steps\n"
    "                     is the run's total: a checkpoint past it is refused\n"
    "  --init-from FILE   start a new run (step 0, fresh AdamW moments) from the\n"
    "                     weights in FILE.safetensors: an export (mmpipe ckpt export\n"
    "                     RUN --format safetensors) or the PyTorch reference's\n"
    "                     (bench/torch/mmpipe_ref.py write_safetensors). Every\n"
    "                     parameter and batch-norm buffer of the plan's model must\n"
    "                     be there with its shape (text.embed.wte: data.vocab's\n"
    "                     size), and nothing else (AdamW moments, from an export\n"
    "                     with --optimizer, are set aside for fresh ones, with a\n"
    "                     warning); a mismatch is refused naming the tensor,\n"
    "                     before anything is written. The weights\n"
    "                     become the run's ckpt/step_0000000 (a restart goes back\n"
    "                     to them), in the pipeline and --single-process alike.\n"
    "                     Not with --resume\n"
    "  --steps N          train N steps (same as --set job.steps=N). N = 0 writes\n"
    "                     only the initial checkpoint (job.seed's initialisation,\n"
    "                     or --init-from's), plan.json and an empty metrics.jsonl,\n"
    "                     and starts no stage: `mmpipe ckpt export` hands it to\n"
    "                     PyTorch\n"
    "  --out DIR          run directory (default runs/<job.name>-<YYYYmmdd-HHMMSS>, or\n"
    "                     with -2, -3 ... when a launch that second made it)\n"
    "  --set KEY=VALUE    override a plan key, e.g. --set train.microbatches=8\n"
    "                     (repeatable; checked like the file); a mapping, as in\n"
    "                     --set 'train={batch: 8}', is merged key by key into the\n"
    "                     plan's own\n"
    "  --force            replace DIR if it already holds a run with steps or\n"
    "                     checkpoints (a run that stopped before its first step,\n"
    "                     with neither, is replaced without it, and says so)\n"
    "  -h, --help         this text\n"
    "\n"
    "Relative paths in the plan (data.manifest, data.vocab, data.val_manifest)\n"
    "are relative to the plan file's folder, in a --set to the current\n"
    "directory; plan.json records them absolute. data.val_manifest defaults to\n"
    "val.jsonl beside the manifest when that file exists; without one,\n"
    "evaluation is off (said once at start).\n"
    "\n"
    "launch warns when more than 5% of the caption word pieces in the first\n"
    "1000 manifest lines are [UNK] under data.vocab (English captions with the\n"
    "synthetic set's vocab): scripts/vocab writes bert-base-uncased's.\n"
    "\n"
    "Before anything is created or started, the plan's data files are checked\n"
    "(data.manifest, data.vocab, and data.val_manifest unless evaluation is off:\n"
    "train.eval_every 0 and train.final_eval false). A run holds a lock on its\n"
    "directory (DIR/.mmpipe.lock) while it runs: --force or --resume into a\n"
    "live run is refused, naming the pid that holds it. A refused launch\n"
    "changes nothing on disk.\n"
    "\n"
    "Stopping, resuming, restarting:\n"
    "  Ctrl-C, SIGTERM or SIGHUP  finishes the step in flight, writes a checkpoint,\n"
    "                     stops every stage, prints the command to resume and exits\n"
    "                     130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP: the terminal\n"
    "                     closed); a second signal stops at once (stages killed,\n"
    "                     shared memory removed, nothing saved). The first signal\n"
    "                     again within 0.2 s counts once (timeout -s INT sends it\n"
    "                     to the process and then to its group).\n"
    "  --resume DIR       goes on from DIR/ckpt/latest: metrics.jsonl keeps its\n"
    "                     lines up to that step, trace.json keeps every launch.\n"
    "  train.ckpt_every   checkpoint every N steps (default 50): what a crash loses;\n"
    "                     train.ckpt_keep: the newest K step directories stay (3).\n"
    "  train.stall_timeout  a stage the coordinator waits on that reports nothing\n"
    "                     for this many seconds is named and the job stopped (or\n"
    "                     restarted); default 60, 0 = off.\n"
    "  train.max_restarts N  when a stage dies or stalls, stop the others and\n"
    "                     relaunch all from ckpt/latest, up to N times (default 0);\n"
    "                     each restart is logged (\"restarts\" in metrics.jsonl, a\n"
    "                     \"restart\" mark in trace.json).\n";

/* Whether the run in dir got anywhere: a step in its metrics.jsonl (any
 * byte of it) or anything under its ckpt/. A run that failed during
 * start-up (a stage died before step 1) has neither, and a new launch may
 * replace it without --force: there is nothing to lose. 1 when it cannot
 * tell (an unreadable file or folder): then it counts as progress. */
static int run_made_progress(const char *dir)
{
    char path[1200];
    struct stat st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (stat(path, &st) != 0 || st.st_size > 0) {
        return 1;
    }
    snprintf(path, sizeof path, "%s/ckpt", dir);
    DIR *d = opendir(path);
    if (!d) {
        return errno != ENOENT;
    }
    int any = 0;
    struct dirent *de;
    while (!any && (de = readdir(d)) != NULL) {
        any = strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    }
    closedir(d);
    return any;
}

/* Removes a previous run's outputs from dir (only the files a run writes,
 * trace parts of a killed run included). No shell: dir is any bytes. */
static int clear_run(const char *dir)
{
    static const char *const outputs[] = {"ckpt", "metrics.jsonl", "plan.json", "trace.json"};
    char path[1400];
    for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, outputs[i]);
        if (mmp_fs_rmtree(path) != MMP_OK) {
            fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
            return 1;
        }
    }
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "mmpipe launch: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    struct dirent *de;
    int bad = 0;
    while (!bad && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (strncmp(de->d_name, "trace.", 6) == 0 && n > 11 &&
            strcmp(de->d_name + n - 5, ".part") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            if (mmp_fs_rmtree(path) != MMP_OK) {
                fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
                bad = 1;
            }
        }
    }
    closedir(d);
    return bad;
}

/* Makes the default run directory dir (runs/<job.name>-<time>), or dir-2,
 * dir-3 ... when a launch in the same second (a sweep) already made it:
 * mkdir claims a name atomically, so two launches never share one. dir is
 * rewritten to the name made. */
static mmp_err claim_run_dir(char *dir, size_t n)
{
    char parent[1024];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) {
        *slash = 0;
        MMP_TRY(mmp_mkdirs(parent));
    }
    char base[1024];
    snprintf(base, sizeof base, "%s", dir);
    for (int k = 1; k <= 1000; k++) {
        if (k > 1 && snprintf(dir, n, "%s-%d", base, k) >= (int)n) {
            return mmp_errorf(MMP_ERR_INVALID, "%s: name too long", base);
        }
        if (mkdir(dir, 0777) == 0) {
            return MMP_OK;
        }
        if (errno != EEXIST) {
            return mmp_errorf(MMP_ERR_IO, "%s: %s", dir, strerror(errno));
        }
    }
    return mmp_errorf(MMP_ERR_IO, "%s: it and %s-2 ... %s-1000 all exist: pass --out DIR", base,
                      base, base);
}

/* Checks, reading only, that DIR's latest checkpoint can continue under
 * plan: it exists, its files are those its files.txt lists, and it was
 * trained with the same fingerprinted keys (common/fingerprint.h). 0 ok, 1
 * refused (printed). */
static int check_resume(const mmp_plan *plan, const char *dir)
{
    char step_dir[1200];
    int step, checked, listed;
    if (mmp_ckpt_latest(dir, step_dir, sizeof step_dir, &step) != MMP_OK ||
        mmp_ckpt_check_files(step_dir, &listed) != MMP_OK ||
        mmp_fingerprint_check(step_dir, plan, &checked) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: --resume %s: %s\n", dir, mmp_last_error());
        return 1;
    }
    if (step > plan->job.steps) {
        /* job.steps counts from the run's start, not from the checkpoint */
        fprintf(stderr,
                "mmpipe launch: --resume %s: its checkpoint is at step %d, past job.steps %d: "
                "nothing to train (job.steps is the run's total: --steps N with N > %d trains "
                "on)\n",
                dir, step, plan->job.steps, step);
        return 1;
    }
    if (!checked) {
        fprintf(stderr,
                "mmpipe launch: warning: %s has no %s (written before checkpoints carried "
                "one): only tensor shapes are checked\n",
                step_dir, MMP_FINGERPRINT_FILE);
    }
    return 0;
}

/* Captions the vocab cannot spell train the text branch on [UNK]s, and a
 * manifest smaller than a batch repeats samples within every batch: say so
 * (once, before anything starts) rather than let a user find out from a
 * flat recall curve. Problems reading the files are preflight's to report. */
#define UNK_SCAN_LINES 1000

static void warn_about_data(const mmp_plan *plan)
{
    /* as far as one batch too, to tell a manifest smaller than a batch */
    int64_t lines = plan->train.batch >= UNK_SCAN_LINES ? plan->train.batch : UNK_SCAN_LINES;
    mmp_vocab_coverage cov;
    if (mmp_data_vocab_coverage(plan, lines, &cov) != MMP_OK || cov.pieces == 0) {
        return;
    }
    double share = (double)cov.unk / (double)cov.pieces;
    if (share > MMP_UNK_WARN_SHARE) {
        fprintf(stderr,
                "mmpipe launch: warning: %.0f%% of the caption word pieces in the first %lld "
                "lines of %s are [UNK] under data.vocab %s (%d tokens); for English captions "
                "use bert-base-uncased's vocab: scripts/vocab, then --set "
                "data.vocab=data/bert-base-uncased/vocab.txt (README: Data)\n",
                100.0 * share, (long long)cov.captions, plan->data.manifest, plan->data.vocab,
                cov.vocab_size);
    }
    if (cov.captions < plan->train.batch) {
        /* the whole manifest was read: every batch repeats samples, and a
         * repeat is a false negative of itself in the contrastive loss */
        fprintf(stderr,
                "mmpipe launch: warning: train.batch %d is more than the %lld samples of %s: "
                "each batch holds some of them twice, which the contrastive loss counts as "
                "negatives of themselves (a train.batch of at most %lld avoids it)\n",
                plan->train.batch, (long long)cov.captions, plan->data.manifest,
                (long long)cov.captions);
    }
}

/* The weights of a new run from --init-from's file (NULL: the plan's own
 * initialisation, for a 0-step run), read and checked against the plan's
 * model. 0 ok, 1 refused (printed). */
static int load_init(const mmp_plan *plan, const char *plan_path, const char *file,
                     mmp_init_weights **out)
{
    mmp_tokenizer *tok = NULL;
    int filled = 0;
    mmp_err err = mmp_tokenizer_load(&tok, plan->data.vocab);
    if (err == MMP_OK) {
        err = mmp_init_weights_create(out, plan, plan_path, file, mmp_tokenizer_vocab_size(tok), 1,
                                      &filled);
    }
    mmp_tokenizer_destroy(tok);
    if (err != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s%s\n", file ? "--init-from: " : "", mmp_last_error());
        return 1;
    }
    return 0;
}

/* A 0-step run: its step-0 checkpoint is written; plan.json and an empty
 * metrics.jsonl complete the run directory. Returns the exit status. */
static int write_zero_step_run(const mmp_plan *plan, const char *out, const char *init_from)
{
    char path[1200];
    FILE *metrics = NULL;
    snprintf(path, sizeof path, "%s/plan.json", out);
    if (mmp_plan_write_json(plan, path) != MMP_OK ||
        mmp_metrics_continue(out, -1, &metrics) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
        return 1;
    }
    fclose(metrics);
    printf("0 steps: wrote the initial weights (%s) to %s/ckpt/step_0000000; no stage started\n",
           init_from ? init_from : "job.seed's initialisation", out);
    return 0;
}

int mmp_cmd_launch(int argc, char **argv)
{
    const char *out = NULL, *resume = NULL, *init_from = NULL;
    mmp_init_weights *init = NULL;
    int force = 0, single = 0;
    mmp_run_lock lock = {0};
    const mmp_cli_opt opts[] = {
        {"--single-process", MMP_CLI_FLAG, &single},
        {"--force", MMP_CLI_FLAG, &force},
        {"--steps", MMP_CLI_STEPS, NULL},
        {"--out", MMP_CLI_VALUE, &out},
        {"--set", MMP_CLI_SET, NULL},
        {"--resume", MMP_CLI_VALUE, &resume},
        {"--init-from", MMP_CLI_VALUE, &init_from},
    };
    mmp_cli_args args;
    int ret = mmp_cli_parse("launch", USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv,
                            &args);
    if (ret != MMP_CLI_GO) {
        goto exit;
    }
    const char *plan_path = args.plan;
    ret = 1;
    static mmp_plan plan;
    if (mmp_plan_load(&plan, plan_path, args.sets, args.n_sets) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
        goto exit;
    }
    if (resume && init_from) {
        fprintf(stderr, "mmpipe launch: --init-from starts a new run and --resume continues one "
                        "from its checkpoint: give one of them\n");
        ret = 2;
        goto exit;
    }
    if (resume && plan.job.steps == 0) {
        fprintf(stderr, "mmpipe launch: --resume with 0 steps: nothing to train\n");
        ret = 2;
        goto exit;
    }
    if (resume) {
        if (out && strcmp(out, resume) != 0) {
            fprintf(stderr, "mmpipe launch: --resume DIR writes into DIR; drop --out\n");
            ret = 2;
            goto exit;
        }
        out = resume;
        struct stat rs;
        int found = stat(resume, &rs) == 0;
        if (!found || !S_ISDIR(rs.st_mode)) {
            fprintf(stderr,
                    "mmpipe launch: --resume %s: %s (give the run directory a launch "
                    "wrote)\n",
                    resume, found ? "not a directory" : strerror(errno));
            goto exit;
        }
    }
    if (mmp_plan_check_runnable(&plan) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error()); /* it names the plan */
        goto exit;
    }
    char out_buf[1024];
    const int auto_out = !out; /* runs/<job.name>-<time>, claimed below */
    if (auto_out) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char stamp[32];
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        snprintf(out_buf, sizeof out_buf, "runs/%s-%s", plan.job.name, stamp);
        out = out_buf;
    }
    /* Everything that can refuse the command without a lock is checked
     * before anything is created or changed. */
    static mmp_plan forced;
    if (plan.balance.force.step > 0 &&
        mmp_balancer_forced_plan(&plan, plan_path, (const char *const *)args.sets, args.n_sets,
                                 &forced) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s: %s\n", plan_path, mmp_last_error());
        goto exit;
    }
    if (mmp_data_preflight(&plan) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error()); /* it names file:line:col */
        goto exit;
    }
    warn_about_data(&plan);
    if ((plan.train.eval_every > 0 || plan.train.final_eval) && !plan.data.val_manifest[0]) {
        fprintf(stderr,
                "mmpipe launch: no validation set (data.val_manifest is not set and there is no "
                "val.jsonl beside %s): evaluation is off\n",
                plan.data.manifest);
    }
    /* The weights a new run starts from are read and checked now; written
     * (ckpt/step_0000000) once the run directory is ours. */
    if ((init_from || plan.job.steps == 0) && load_init(&plan, plan_path, init_from, &init) != 0) {
        goto exit;
    }
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/metrics.jsonl", out);
    int held = !auto_out && !resume && access(probe, F_OK) == 0;
    /* a run that failed before its first step: replaced as if with --force */
    int failed_start = held && !force && !run_made_progress(out);
    snprintf(probe, sizeof probe, "%s/ckpt", out);
    if (init && !auto_out && !held && !force && access(probe, F_OK) == 0) {
        /* never repoint another run's ckpt/latest at step 0 */
        fprintf(stderr,
                "mmpipe launch: %s already holds checkpoints; pass --force to replace them\n", out);
        goto exit;
    }
    pid_t live = resume ? mmp_run_lock_holder(out) : 0;
    if (live > 0) {
        /* a live run first: its pid says more than "no checkpoint yet" would */
        fprintf(stderr, "mmpipe launch: %s is in use by another run (pid %d holds its lock)\n", out,
                (int)live);
        goto exit;
    }
    if (resume && check_resume(&plan, out) != 0) {
        goto exit;
    }
    if (held && !force && !failed_start) {
        fprintf(stderr,
                "mmpipe launch: %s already holds a run (with steps or checkpoints); pass --force "
                "to replace it, or --resume to continue it\n",
                out);
        goto exit;
    }
    if ((auto_out ? claim_run_dir(out_buf, sizeof out_buf) : mmp_mkdirs(out)) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
        goto exit;
    }
    /* Held by this process (coordinator or single-process trainer) until it
     * exits: a second launch into a live run is refused, naming the pid. */
    pid_t holder;
    if (mmp_run_lock_take(&lock, out, &holder) != MMP_OK) {
        fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
        goto exit;
    }
    if (failed_start) { /* under the lock: a live run that has not finished step 1 is refused */
        fprintf(stderr,
                "mmpipe launch: %s holds a run that stopped before its first step (no step in "
                "metrics.jsonl, no checkpoint): replacing it\n",
                out);
    }
    if ((held || (init && force)) && clear_run(out) != 0) {
        goto exit;
    }
    if (init) {
        if (mmp_init_weights_save(init, &plan, out) != MMP_OK) {
            fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
            goto exit;
        }
        if (plan.job.steps == 0) {
            ret = write_zero_step_run(&plan, out, init_from);
            goto exit;
        }
        fprintf(stderr,
                "mmpipe launch: a new run from %s (its ckpt/step_0000000, fresh AdamW "
                "moments)\n",
                init_from);
    }
    if (single) {
        mmp_log_set_name("single");
        if (mmp_train_single(&plan, out, resume != NULL || init != NULL) != MMP_OK) {
            fprintf(stderr, "mmpipe launch: %s\n", mmp_last_error());
            goto exit;
        }
        if (mmp_interrupt_status()) {
            ret = mmp_interrupt_status(); /* stopped by a signal, after a checkpoint */
            goto exit;
        }
    } else {
        /* from the step-0 checkpoint just written, as a resume at step 0 */
        ret = mmp_coord_run(&plan, out, resume != NULL || init != NULL);
        goto exit;
    }
    ret = 0;
exit:
    mmp_run_unlock(&lock);
    mmp_init_weights_destroy(init);
    mmp_cli_args_fini(&args);
    return ret;
}
