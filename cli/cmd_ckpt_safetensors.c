/* mmpipe ckpt export / import: checkpoints to and from safetensors, the
 * format PyTorch reads (bench/torch/mmpipe_ref.py loads an export as its
 * state dict; tensor names and layouts are mmpipe's own).
 *
 * Import never trusts the file: the safetensors reader checks its structure
 * (common/safetensors.h), and the tensors are then loaded into the model the
 * plan describes, so a name the model lacks, a tensor it misses or a shape
 * it does not have is an error naming the tensor. What is written is an
 * ordinary checkpoint (the model's own save), which `launch --resume` takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/ckpt.h"
#include "common/safetensors.h"
#include "nn/model.h"

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int is_moment(const char *name)
{
    return has_suffix(name, ".adam_m") || has_suffix(name, ".adam_v");
}

int mmp_ckpt_export(const char *src, const char *out, int optimizer)
{
    mmp_ckpt c;
    if (mmp_ckpt_read_dir(&c, src) != MMP_OK) {
        fprintf(stderr, "mmpipe ckpt export: %s\n", mmp_last_error());
        return 1;
    }
    int ret = 1, n = 0;
    mmp_st_meta meta = {0};
    char step[32] = "unknown";
    mmp_st_item *items = calloc((size_t)c.count + 1, sizeof *items);
    if (!items) {
        fprintf(stderr, "mmpipe ckpt export: out of memory\n");
        goto exit;
    }
    for (int i = 0; i < c.count; i++) {
        const mmp_ckpt_entry *e = &c.entries[i];
        if (strcmp(e->name, "meta.step") == 0 && e->t.dtype == MMP_I32 &&
            mmp_tensor_numel(&e->t) == 1) {
            snprintf(step, sizeof step, "%d", *(const int32_t *)e->t.data);
        }
        if (strncmp(e->name, "meta.", 5) == 0 || (!optimizer && is_moment(e->name))) {
            continue;
        }
        items[n++] = (mmp_st_item){.name = e->name, .t = &e->t};
    }
    if (mmp_st_meta_set(&meta, "format", "mmpipe") != MMP_OK ||
        mmp_st_meta_set(&meta, "step", step) != MMP_OK ||
        mmp_safetensors_write(out, items, n, &meta) != MMP_OK) {
        fprintf(stderr, "mmpipe ckpt export: %s\n", mmp_last_error());
        goto exit;
    }
    printf("wrote %d tensors (step %s) to %s\n", n, step, out);
    ret = 0;
exit:
    free(items);
    mmp_ckpt_fini(&c);
    return ret;
}

/* Appends a zero tensor shaped as q named name (a fresh optimizer moment). */
static mmp_err add_zero(mmp_ckpt *c, const char *name, const mmp_param *q)
{
    mmp_ckpt_entry *g = realloc(c->entries, (size_t)(c->count + 1) * sizeof *g);
    if (!g) {
        return mmp_errorf(MMP_ERR_NOMEM, "checkpoint index");
    }
    c->entries = g;
    mmp_ckpt_entry *e = &c->entries[c->count];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    MMP_TRY(mmp_tensor_init(&e->t, MMP_F32, q->ndim, q->shape));
    c->count++;
    return MMP_OK;
}

/* Whether name is a value or moment of a parameter in one of the tables. */
static int known(mmp_params *const *tables, int n_tables, const char *name)
{
    char base[sizeof(((mmp_ckpt_entry *)0)->name)];
    snprintf(base, sizeof base, "%s", name);
    if (is_moment(base)) {
        base[strlen(base) - 7] = 0;
    }
    for (int k = 0; k < n_tables; k++) {
        mmp_param *q = mmp_params_find(tables[k], base);
        if (q && (q->trainable || strcmp(base, name) == 0)) {
            return 1;
        }
    }
    return 0;
}

/* Fills the moments the file lacks with zeros; returns how many. */
static mmp_err fill_moments(mmp_ckpt *c, mmp_params *p, int *filled)
{
    for (int i = 0; i < p->count; i++) {
        const mmp_param *q = &p->items[i];
        for (int m = 0; q->trainable && m < 2; m++) {
            char name[MMP_NAME_MAX + 16];
            snprintf(name, sizeof name, "%s%s", q->name, m ? ".adam_v" : ".adam_m");
            if (!mmp_ckpt_find(c, name)) {
                MMP_TRY(add_zero(c, name, q));
                ++*filled;
            }
        }
    }
    return MMP_OK;
}

struct mmp_init_weights {
    mmp_image_net *img;
    mmp_text_net *txt;
    mmp_fusion_net *fus;
};

void mmp_init_weights_destroy(mmp_init_weights *w)
{
    if (!w) {
        return;
    }
    mmp_image_net_destroy(w->img);
    mmp_text_net_destroy(w->txt);
    mmp_fusion_net_destroy(w->fus);
    free(w);
}

/* Loads file's tensors into w's three nets; see mmp_init_weights_create. */
static mmp_err load_file(mmp_init_weights *w, const mmp_plan *plan, const char *plan_path,
                         const char *file, int vocab_size, int fresh, int *filled)
{
    mmp_ckpt c = {0};
    mmp_err err;
    if ((err = mmp_safetensors_read(&c, file, NULL)) != MMP_OK) {
        goto exit;
    }
    const mmp_ckpt_entry *wte = mmp_ckpt_find(&c, "text.embed.wte");
    if (!wte || wte->t.ndim != 2) {
        err = mmp_errorf(MMP_ERR_DATA,
                         "%s: no 2-d tensor text.embed.wte (the vocabulary size "
                         "comes from it)",
                         file);
        goto exit;
    }
    if (vocab_size > 0 && wte->t.shape[0] != vocab_size) {
        err = mmp_errorf(MMP_ERR_DATA,
                         "%s: tensor text.embed.wte has %lld rows (a vocabulary of %lld tokens), "
                         "the model wants %d (data.vocab %s)",
                         file, (long long)wte->t.shape[0], (long long)wte->t.shape[0], vocab_size,
                         plan->data.vocab);
        goto exit;
    }
    uint64_t seed = (uint64_t)plan->job.seed;
    if ((err = mmp_image_net_create(&w->img, plan, 0, mmp_image_net_layers(plan), seed)) !=
            MMP_OK ||
        (err = mmp_text_net_create(&w->txt, plan, (int)wte->t.shape[0], 0,
                                   mmp_text_net_layers(plan), seed)) != MMP_OK ||
        (err = mmp_fusion_net_create(&w->fus, plan, seed)) != MMP_OK) {
        goto exit;
    }
    mmp_params *tables[3] = {mmp_image_net_params(w->img), mmp_text_net_params(w->txt),
                             mmp_fusion_net_params(w->fus)};
    for (int i = 0; i < c.count; i++) {
        if (!known(tables, 3, c.entries[i].name)) {
            err = mmp_errorf(MMP_ERR_DATA,
                             "%s: tensor %s is not a parameter of the model %s "
                             "describes",
                             file, c.entries[i].name, plan_path);
            goto exit;
        }
    }
    for (int k = 0; k < 3 && err == MMP_OK; k++) {
        err = fill_moments(&c, tables[k], filled);
    }
    int reset = 0;
    for (int i = 0; fresh && i < c.count; i++) {
        mmp_tensor *t = &c.entries[i].t;
        if (is_moment(c.entries[i].name) && t->data) {
            memset(t->data, 0, (size_t)mmp_tensor_numel(t) * mmp_dtype_size(t->dtype));
            reset++;
        }
    }
    if (reset > 0 && err == MMP_OK) {
        MMP_WARN("%s holds AdamW moments too (%d tensors: an export with --optimizer); a new "
                 "run starts with fresh ones (to go on with them: mmpipe ckpt import, then "
                 "launch --resume)",
                 file, reset);
    }
    for (int k = 0; k < 3 && err == MMP_OK; k++) {
        err = mmp_params_load(tables[k], &c);
    }
    if (err != MMP_OK) {
        mmp_error_prefix(err, "%s", file);
    }
exit:
    mmp_ckpt_fini(&c);
    return err;
}

mmp_err mmp_init_weights_create(mmp_init_weights **out, const mmp_plan *plan, const char *plan_path,
                                const char *file, int vocab_size, int fresh_optimizer, int *filled)
{
    mmp_err err = MMP_OK;
    mmp_init_weights *w = calloc(1, sizeof *w);
    *out = NULL;
    *filled = 0;
    if (!w) {
        return mmp_errorf(MMP_ERR_NOMEM, "initial weights");
    }
    if (file) {
        err = load_file(w, plan, plan_path, file, vocab_size, fresh_optimizer, filled);
    } else {
        uint64_t seed = (uint64_t)plan->job.seed;
        if ((err = mmp_image_net_create(&w->img, plan, 0, mmp_image_net_layers(plan), seed)) ==
                MMP_OK &&
            (err = mmp_text_net_create(&w->txt, plan, vocab_size, 0, mmp_text_net_layers(plan),
                                       seed)) == MMP_OK) {
            err = mmp_fusion_net_create(&w->fus, plan, seed);
        }
    }
    if (err != MMP_OK) {
        mmp_init_weights_destroy(w);
        return err;
    }
    *out = w;
    return MMP_OK;
}

static mmp_err save_into(const char *dir, const char *file, mmp_params *p)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return mmp_params_save(p, path);
}

mmp_err mmp_init_weights_save(const mmp_init_weights *w, const mmp_plan *plan, const char *run_dir)
{
    char dir[1200];
    mmp_ckpt_step_dir(dir, sizeof dir, run_dir, 0);
    MMP_TRY(mmp_mkdirs(dir));
    MMP_TRY(save_into(dir, "image.ckpt", mmp_image_net_params(w->img)));
    MMP_TRY(save_into(dir, "text.ckpt", mmp_text_net_params(w->txt)));
    MMP_TRY(save_into(dir, "fusion.ckpt", mmp_fusion_net_params(w->fus)));
    MMP_TRY(mmp_ckpt_write_meta(dir, 0, plan));
    return mmp_ckpt_mark_latest(run_dir, 0);
}

/* Prints s on stdout as one POSIX shell word: as it is when it holds only
 * characters no shell treats specially, else single-quoted. */
static void put_shell_word(const char *s)
{
    if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                        "_./=:,+-@%") == strlen(s)) {
        fputs(s, stdout);
        return;
    }
    putchar('\'');
    for (; *s; s++) {
        if (*s == '\'') {
            fputs("'\\''", stdout); /* close, an escaped quote, reopen */
        } else {
            putchar(*s);
        }
    }
    putchar('\'');
}

int mmp_ckpt_import(const char *file, const char *plan_path, const char *const *sets, int n_sets,
                    const char *out)
{
    static mmp_plan plan;
    mmp_init_weights *w = NULL;
    mmp_err err = MMP_OK;
    int filled = 0;
    char dir[1100];
    struct stat st;
    snprintf(dir, sizeof dir, "%s/ckpt", out);
    if (stat(dir, &st) == 0) {
        /* never repoint another run's latest at step 0 */
        err = mmp_errorf(MMP_ERR_INVALID,
                         "%s already holds checkpoints; import into a new directory", out);
        goto exit;
    }
    if ((err = mmp_plan_load(&plan, plan_path, sets, n_sets)) != MMP_OK ||
        (err = mmp_init_weights_create(&w, &plan, plan_path, file, 0, 0, &filled)) != MMP_OK ||
        (err = mmp_init_weights_save(w, &plan, out)) != MMP_OK) {
        goto exit;
    }
    mmp_ckpt_step_dir(dir, sizeof dir, out, 0);
    /* the --set overrides too: the checkpoint's fingerprint holds them, so a
     * resume without them would be refused */
    printf("imported %s into %s (step 0%s); train on with: mmpipe launch ", file, dir,
           filled ? ", fresh optimizer moments" : "");
    put_shell_word(plan_path);
    for (int i = 0; i < n_sets; i++) {
        fputs(" --set ", stdout);
        put_shell_word(sets[i]);
    }
    fputs(" --resume ", stdout);
    put_shell_word(out);
    putchar('\n');
exit:
    if (err != MMP_OK) {
        fprintf(stderr, "mmpipe ckpt import: %s\n", mmp_last_error());
    }
    mmp_init_weights_destroy(w);
    return err == MMP_OK ? 0 : 1;
}
