/* Preflight of the plan's data files (see preflight.h). Reads only. */
#include "data/preflight.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/manifest.h"
#include "data/tokenizer.h"

/* Whether fd has a byte other than white space (and a leading UTF-8 BOM),
 * the least a manifest with a sample holds; reads only up to that byte. */
static int has_text(int fd)
{
    char buf[4096];
    ssize_t got;
    int first = 1;
    while ((got = read(fd, buf, sizeof buf)) != 0) {
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return 1; /* a read error is the dataset's to report, with its cause */
        }
        ssize_t i = first && got >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
        first = 0;
        for (; i < got; i++) {
            if (!strchr(" \t\r\n", buf[i])) {
                return 1;
            }
        }
    }
    return 0;
}

/* Whether path is a regular file this process can read; a manifest must
 * also hold something (an empty one fails every stage after the run
 * directory exists). */
/* site: where the key was given ("FILE:LINE:COL", "--set ...", or "" when
 * the plan was not loaded from a file); it leads the error when known. */
static mmp_err readable(const char *site, const char *key, const char *path, int manifest,
                        const char *hint)
{
    struct stat st;
    const char *sep = site[0] ? ": " : "";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s%s%s: cannot read %s: %s%s", site, sep, key, path,
                          strerror(errno), hint);
    }
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    int empty = ok && manifest && !has_text(fd);
    close(fd);
    if (!ok) {
        return mmp_errorf(MMP_ERR_DATA, "%s%s%s: %s is not a regular file%s", site, sep, key, path,
                          hint);
    }
    if (empty) {
        return mmp_errorf(MMP_ERR_DATA, "%s%s%s: %s: no samples (the manifest is empty)%s", site,
                          sep, key, path, hint);
    }
    return MMP_OK;
}

mmp_err mmp_data_preflight(const mmp_plan *p)
{
    const char *beside = " (the default: beside data.manifest)";
    int vocab_default = strcmp(p->data.vocab_site, p->data.manifest_site) == 0;
    MMP_TRY(readable(p->data.manifest_site, "data.manifest", p->data.manifest, 1, ""));
    MMP_TRY(
        readable(p->data.vocab_site, "data.vocab", p->data.vocab, 0, vocab_default ? beside : ""));
    mmp_tokenizer *tok = NULL;
    mmp_err e = mmp_tokenizer_load(&tok, p->data.vocab);
    mmp_tokenizer_destroy(tok);
    if (e != MMP_OK) {
        char what[MMP_PATH_MAX + 80];
        snprintf(what, sizeof what, "%s%sdata.vocab", p->data.vocab_site,
                 p->data.vocab_site[0] ? ": " : "");
        return mmp_error_prefix(MMP_ERR_DATA, "%s", what);
    }
    if (mmp_plan_evaluates(p)) {
        MMP_TRY(readable(p->data.val_manifest_site, "data.val_manifest", p->data.val_manifest, 1,
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
