/* Preflight of the plan's data files (see preflight.h). Reads only. */
#include "data/preflight.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/manifest.h"
#include "data/tokenizer.h"

/* Whether path is a regular file this process can read. */
static mmp_err readable(const char *key, const char *path, const char *hint)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: cannot read %s: %s%s", key, path, strerror(errno),
                          hint);
    }
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
    if (!ok) {
        return mmp_errorf(MMP_ERR_DATA, "%s: %s is not a regular file%s", key, path, hint);
    }
    return MMP_OK;
}

mmp_err mmp_data_preflight(const mmp_plan *p)
{
    MMP_TRY(readable("data.manifest", p->data.manifest, ""));
    MMP_TRY(readable("data.vocab", p->data.vocab, ""));
    mmp_tokenizer *tok = NULL;
    mmp_err e = mmp_tokenizer_load(&tok, p->data.vocab);
    mmp_tokenizer_destroy(tok);
    if (e != MMP_OK) {
        return mmp_error_prefix(MMP_ERR_DATA, "data.vocab");
    }
    if (mmp_plan_evaluates(p)) {
        MMP_TRY(readable("data.val_manifest", p->data.val_manifest,
                         " (evaluation reads it; with train.eval_every: 0 and train.final_eval: "
                         "false it is not needed)"));
    }
    return MMP_OK;
}

typedef struct coverage_walk {
    const mmp_tokenizer *tok;
    mmp_vocab_coverage *cov;
    int64_t limit;
    int stopped;
    int32_t ids[512];
} coverage_walk;

static mmp_err count_caption(void *user, const mmp_manifest_entry *e, const char *problem)
{
    coverage_walk *w = user;
    if (problem) {
        return MMP_OK;
    }
    int n_real = 0, n_unk = 0;
    if (mmp_tokenizer_encode(w->tok, e->text, 512, w->ids, NULL, &n_real, &n_unk) == MMP_OK) {
        w->cov->captions++;
        w->cov->pieces += n_real - 2;
        w->cov->unk += n_unk;
    }
    if (w->cov->captions >= w->limit) {
        w->stopped = 1;
        return MMP_ERR_INVALID; /* stops the walk; not an error (stopped says so) */
    }
    return MMP_OK;
}

mmp_err mmp_data_vocab_coverage(const mmp_plan *p, int64_t lines, mmp_vocab_coverage *cov)
{
    memset(cov, 0, sizeof *cov);
    mmp_tokenizer *tok = NULL;
    if (mmp_tokenizer_load(&tok, p->data.vocab) != MMP_OK) {
        return mmp_error_prefix(MMP_ERR_DATA, "data.vocab");
    }
    cov->vocab_size = mmp_tokenizer_vocab_size(tok);
    coverage_walk *w = calloc(1, sizeof *w);
    if (!w) {
        mmp_tokenizer_destroy(tok);
        return mmp_errorf(MMP_ERR_NOMEM, "vocab coverage");
    }
    w->tok = tok;
    w->cov = cov;
    w->limit = lines;
    mmp_err e = lines > 0 ? mmp_manifest_scan(p->data.manifest, count_caption, w) : MMP_OK;
    if (w->stopped) {
        e = MMP_OK;
    }
    free(w);
    mmp_tokenizer_destroy(tok);
    return e == MMP_OK ? MMP_OK : mmp_error_prefix(MMP_ERR_DATA, "data.manifest");
}
