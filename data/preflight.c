/* Preflight of the plan's data files (see preflight.h). Reads only. */
#include "data/preflight.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
