/* Checkpoint file format: writer (temp + fsync + rename) and verifying reader. */
#include "common/ckpt.h"

#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fingerprint.h"
#include "common/fsutil.h"
#include "common/rng.h"

static const char MAGIC[8] = {'M', 'M', 'P', 'C', 'K', 'P', 'T', 0};

mmp_err mmp_mkdirs(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                return mmp_errorf(MMP_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
            }
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        return mmp_errorf(MMP_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
    }
    return MMP_OK;
}

/* ---- writer --------------------------------------------------------------------- */

static void put(mmp_ckpt_writer *w, const void *p, size_t n)
{
    if (w->err != MMP_OK) {
        return;
    }
    if (fwrite(p, 1, n, w->file.f) != n) {
        w->err = mmp_errorf(MMP_ERR_IO, "write %s: %s", w->file.tmp, strerror(errno));
    }
}

mmp_err mmp_ckpt_writer_open(mmp_ckpt_writer *w, const char *path)
{
    memset(w, 0, sizeof *w);
    /* Durable: once ckpt/latest names a step, its files must be on disk. */
    if ((w->err = mmp_atomic_open(&w->file, path, MMP_ATOMIC_DURABLE)) != MMP_OK) {
        return w->err;
    }
    uint32_t version = MMP_CKPT_VERSION, count = 0;
    put(w, MAGIC, sizeof MAGIC);
    put(w, &version, 4);
    put(w, &count, 4); /* patched at close */
    if (w->err != MMP_OK) {
        mmp_ckpt_writer_abort(w); /* callers only close a writer that opened */
    }
    return w->err;
}

mmp_err mmp_ckpt_write(mmp_ckpt_writer *w, const char *name, mmp_dtype dtype, int ndim,
                       const int64_t *shape, const void *data)
{
    size_t len = strlen(name);
    if (len == 0 || len >= sizeof(((mmp_ckpt_entry *)0)->name) || ndim < 0 || ndim > MMP_MAX_DIMS) {
        return w->err =
                   mmp_errorf(MMP_ERR_INVALID, "checkpoint tensor '%s': bad name or rank", name);
    }
    uint16_t nl = (uint16_t)len;
    uint8_t dt = (uint8_t)dtype, nd = (uint8_t)ndim;
    uint64_t numel = 1;
    put(w, &nl, 2);
    put(w, name, len);
    put(w, &dt, 1);
    put(w, &nd, 1);
    for (int i = 0; i < ndim; i++) {
        put(w, &shape[i], 8);
        numel *= (uint64_t)shape[i];
    }
    uint64_t nbytes = numel * mmp_dtype_size(dtype);
    put(w, &nbytes, 8);
    put(w, data, nbytes);
    w->count++;
    return w->err;
}

void mmp_ckpt_writer_abort(mmp_ckpt_writer *w)
{
    if (w) {
        mmp_atomic_abort(&w->file);
    }
}

mmp_err mmp_ckpt_writer_close(mmp_ckpt_writer *w)
{
    if (w->err != MMP_OK) {
        mmp_ckpt_writer_abort(w);
        return w->err;
    }
    /* The count is part of the checksummed header: rewrite it, then hash the
     * whole file once more so the footer covers what is on disk. */
    FILE *f = w->file.f;
    if (fseek(f, 12, SEEK_SET) != 0 || fwrite(&w->count, 4, 1, f) != 1 || fflush(f) != 0) {
        w->err = mmp_errorf(MMP_ERR_IO, "write %s: %s", w->file.tmp, strerror(errno));
        mmp_ckpt_writer_abort(w);
        return w->err;
    }
    uint64_t h = MMP_FNV1A_INIT;
    FILE *r = fopen(w->file.tmp, "rb");
    if (!r) {
        w->err = mmp_errorf(MMP_ERR_IO, "reopen %s: %s", w->file.tmp, strerror(errno));
        mmp_ckpt_writer_abort(w);
        return w->err;
    }
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, r)) > 0) {
        h = mmp_fnv1a(h, buf, got);
    }
    int read_failed = ferror(r);
    fclose(r);
    if (read_failed) { /* a checksum of part of the file would pass the write, fail every read */
        w->err = mmp_errorf(MMP_ERR_IO, "read back %s: %s", w->file.tmp, strerror(EIO));
        mmp_ckpt_writer_abort(w);
        return w->err;
    }
    if (fseek(f, 0, SEEK_END) != 0 || fwrite(&h, 8, 1, f) != 1) {
        w->err = mmp_errorf(MMP_ERR_IO, "write %s: %s", w->file.tmp, strerror(errno));
        mmp_ckpt_writer_abort(w);
        return w->err;
    }
    return w->err = mmp_atomic_commit(&w->file); /* fsync, rename, fsync of the directory */
}

/* ---- reader --------------------------------------------------------------------- */

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const mmp_ckpt_entry *)a)->name, ((const mmp_ckpt_entry *)b)->name);
}

typedef struct cursor {
    const unsigned char *p, *end;
} cursor;

static int take(cursor *c, void *out, size_t n)
{
    if ((size_t)(c->end - c->p) < n) {
        return 0;
    }
    memcpy(out, c->p, n);
    c->p += n;
    return 1;
}

mmp_err mmp_ckpt_read_file(mmp_ckpt *c, const char *path)
{
    mmp_err ret = MMP_OK;
    unsigned char *buf = NULL;
    size_t size = 0;
    MMP_TRY(mmp_fs_read_file(path, MMP_ERR_IO, SIZE_MAX, &buf, &size));
    if (size < 24) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: too short to be a checkpoint", path);
        goto exit;
    }
    if (memcmp(buf, MAGIC, 8) != 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: not an mmpipe checkpoint (bad magic)", path);
        goto exit;
    }
    uint64_t want;
    memcpy(&want, buf + size - 8, 8);
    if (mmp_fnv1a(MMP_FNV1A_INIT, buf, size - 8) != want) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: checksum mismatch (file corrupt or truncated)", path);
        goto exit;
    }
    cursor cur = {buf + 8, buf + size - 8};
    uint32_t version = 0, count = 0; /* size >= 24: take() fills both */
    take(&cur, &version, 4);
    take(&cur, &count, 4);
    if (version != MMP_CKPT_VERSION) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: checkpoint version %u, this mmpipe reads %u", path,
                         version, MMP_CKPT_VERSION);
        goto exit;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (uint32_t i = 0; i < count; i++) {
        mmp_ckpt_entry e;
        memset(&e, 0, sizeof e);
        uint16_t nl;
        uint8_t dt, nd;
        int64_t shape[MMP_MAX_DIMS];
        uint64_t nbytes;
        if (!take(&cur, &nl, 2) || nl == 0 || nl >= sizeof e.name || !take(&cur, e.name, nl) ||
            !take(&cur, &dt, 1) || !take(&cur, &nd, 1) || dt > MMP_I32 || nd > MMP_MAX_DIMS) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s: tensor %u: bad record header", path, i);
            goto exit;
        }
        for (int d = 0; d < nd; d++) {
            if (!take(&cur, &shape[d], 8) || shape[d] < 0) {
                ret = mmp_errorf(MMP_ERR_DATA, "%s: %s: bad shape", path, e.name);
                goto exit;
            }
        }
        if (!take(&cur, &nbytes, 8)) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s: %s: truncated", path, e.name);
            goto exit;
        }
        /* The shape is the file's word: its size must be the record's bytes
         * and fit in what is left of the file before anything is allocated
         * (a forged shape would overflow the element count or ask for TBs). */
        /* The product of the non-zero dims is bounded too: with a zero dim
         * the tensor is empty, but its shape is still multiplied out. */
        uint64_t numel = 1, left = (uint64_t)(cur.end - cur.p);
        uint64_t esize = mmp_dtype_size((mmp_dtype)dt);
        int empty = 0;
        for (int d = 0; d < nd && numel != UINT64_MAX; d++) {
            uint64_t s = (uint64_t)shape[d];
            empty |= s == 0;
            numel = s == 0 ? numel : numel > left / esize / s ? UINT64_MAX : numel * s;
        }
        if (numel == UINT64_MAX || (empty ? 0 : numel * esize) != nbytes || nbytes > left) {
            ret = mmp_errorf(MMP_ERR_DATA,
                             "%s: %s: shape and size disagree (%llu bytes recorded, %llu left)",
                             path, e.name, (unsigned long long)nbytes, (unsigned long long)left);
            goto exit;
        }
        ret = mmp_tensor_init(&e.t, (mmp_dtype)dt, nd, shape);
        if (ret != MMP_OK) {
            goto exit;
        }
        if (nbytes != mmp_tensor_bytes(&e.t) || !take(&cur, e.t.data, nbytes)) {
            mmp_tensor_fini(&e.t);
            ret = mmp_errorf(MMP_ERR_DATA, "%s: %s: size does not match its shape", path, e.name);
            goto exit;
        }
        snprintf(e.file, sizeof e.file, "%s", base);
        if (mmp_ckpt_find(c, e.name)) {
            mmp_tensor_fini(&e.t);
            ret = mmp_errorf(MMP_ERR_DATA, "%s: tensor %s appears twice", path, e.name);
            goto exit;
        }
        mmp_ckpt_entry *grown = realloc(c->entries, (size_t)(c->count + 1) * sizeof *grown);
        if (!grown) {
            mmp_tensor_fini(&e.t);
            ret = mmp_errorf(MMP_ERR_NOMEM, "checkpoint index");
            goto exit;
        }
        c->entries = grown;
        c->entries[c->count++] = e;
        qsort(c->entries, (size_t)c->count, sizeof *c->entries, cmp_entry);
    }
    if (cur.p != cur.end) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: trailing bytes after %u tensors", path, count);
    }
exit:
    free(buf);
    return ret;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

mmp_err mmp_ckpt_read_dir(mmp_ckpt *c, const char *dir)
{
    memset(c, 0, sizeof *c);
    char path[1024];
    struct stat st;
    /* Accept a run directory or its ckpt/ folder by following latest. */
    snprintf(path, sizeof path, "%s/ckpt/latest", dir);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        dir = path;
    } else {
        snprintf(path, sizeof path, "%s/latest", dir);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            dir = path;
        }
    }
    char resolved[1024];
    snprintf(resolved, sizeof resolved, "%s", dir);
    DIR *d = opendir(resolved);
    if (!d) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", resolved, strerror(errno));
    }
    /* Read files in name order so errors and entries do not depend on readdir. */
    char names[64][256];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (has_suffix(de->d_name, ".ckpt") && n < 64) {
            snprintf(names[n++], sizeof names[0], "%s", de->d_name);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    if (n == 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: no .ckpt files (not a checkpoint directory)",
                          resolved);
    }
    for (int i = 0; i < n; i++) {
        char file[1400];
        if (snprintf(file, sizeof file, "%s/%s", resolved, names[i]) >= (int)sizeof file) {
            mmp_ckpt_fini(c);
            return mmp_errorf(MMP_ERR_INVALID, "%s: path too long", resolved);
        }
        mmp_err e = mmp_ckpt_read_file(c, file);
        if (e != MMP_OK) {
            mmp_ckpt_fini(c);
            return e;
        }
    }
    return MMP_OK;
}

void mmp_ckpt_fini(mmp_ckpt *c)
{
    if (!c) {
        return;
    }
    for (int i = 0; i < c->count; i++) {
        mmp_tensor_fini(&c->entries[i].t);
    }
    free(c->entries);
    c->entries = NULL;
    c->count = 0;
}

const mmp_ckpt_entry *mmp_ckpt_find(const mmp_ckpt *c, const char *name)
{
    for (int i = 0; i < c->count; i++) {
        if (strcmp(c->entries[i].name, name) == 0) {
            return &c->entries[i];
        }
    }
    return NULL;
}

void mmp_ckpt_step_dir(char *buf, size_t n, const char *run_dir, int64_t step)
{
    snprintf(buf, n, "%s/ckpt/step_%07lld", run_dir, (long long)step);
}

mmp_err mmp_ckpt_mark_latest(const char *run_dir, int64_t step)
{
    char target[64], link[1100], tmp[1100];
    snprintf(target, sizeof target, "step_%07lld", (long long)step);
    snprintf(link, sizeof link, "%s/ckpt/latest", run_dir);
    snprintf(tmp, sizeof tmp, "%s/ckpt/.latest.tmp", run_dir);
    unlink(tmp);
    if (symlink(target, tmp) != 0) {
        return mmp_errorf(MMP_ERR_IO, "symlink %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, link) != 0) {
        unlink(tmp);
        return mmp_errorf(MMP_ERR_IO, "rename %s: %s", link, strerror(errno));
    }
    /* On disk before the caller prunes older steps: after a power cut,
     * latest must not name a step directory that was removed. */
    snprintf(tmp, sizeof tmp, "%s/ckpt", run_dir);
    return mmp_fs_sync_dir(tmp);
}

/* Removes one step directory: its files (checkpoints are flat), then it. */
static mmp_err remove_step_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", dir, strerror(errno));
    }
    struct dirent *de;
    char path[1600];
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
    }
    closedir(d);
    if (rmdir(dir) != 0) {
        return mmp_errorf(MMP_ERR_IO, "remove %s: %s", dir, strerror(errno));
    }
    return MMP_OK;
}

static int by_step_desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

mmp_err mmp_ckpt_prune(const char *run_dir, int64_t latest_step, int keep)
{
    if (keep <= 0) {
        return MMP_OK;
    }
    char ckdir[1100];
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", run_dir);
    DIR *d = opendir(ckdir);
    if (!d) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", ckdir, strerror(errno));
    }
    long long *steps = NULL;
    size_t n = 0, cap = 0;
    mmp_err ret = MMP_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        long long st;
        char tail;
        if (strlen(de->d_name) != 12 || sscanf(de->d_name, "step_%7lld%c", &st, &tail) != 1 ||
            st > latest_step) {
            continue; /* not a step directory, or newer than latest (a write cut short) */
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            long long *grown = realloc(steps, cap * sizeof *steps);
            if (!grown) {
                ret = mmp_errorf(MMP_ERR_NOMEM, "pruning %s", ckdir);
                goto exit;
            }
            steps = grown;
        }
        steps[n++] = st;
    }
    if (n > 1) { /* qsort's base must not be NULL, even for 0 elements */
        qsort(steps, n, sizeof *steps, by_step_desc);
    }
    for (size_t i = (size_t)keep; i < n; i++) {
        char dir[1200];
        mmp_ckpt_step_dir(dir, sizeof dir, run_dir, steps[i]);
        mmp_err e = remove_step_dir(dir);
        if (ret == MMP_OK) {
            ret = e;
        }
    }
exit:
    free(steps);
    closedir(d);
    return ret;
}

mmp_err mmp_ckpt_latest(const char *run_dir, char *step_dir, size_t n, int *step)
{
    char latest[1100], target[256], meta[1400];
    snprintf(latest, sizeof latest, "%s/ckpt/latest", run_dir);
    ssize_t len = readlink(latest, target, sizeof target - 1);
    if (len <= 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: no checkpoint to resume from", latest);
    }
    target[len] = 0;
    snprintf(step_dir, n, "%s/ckpt/%s", run_dir, target);
    snprintf(meta, sizeof meta, "%s/train.ckpt", step_dir);
    mmp_ckpt ck = {0};
    MMP_TRY(mmp_ckpt_read_file(&ck, meta));
    const mmp_ckpt_entry *e = mmp_ckpt_find(&ck, "meta.step");
    int s = e && e->t.dtype == MMP_I32 && mmp_tensor_numel(&e->t) == 1
                ? ((const int32_t *)e->t.data)[0]
                : -1;
    mmp_ckpt_fini(&ck);
    if (s < 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: no valid meta.step", meta);
    }
    *step = s;
    return MMP_OK;
}

mmp_err mmp_ckpt_write_meta(const char *dir, int steps_done, const mmp_plan *plan)
{
    return mmp_ckpt_write_meta_scaled(dir, steps_done, plan, NULL);
}

mmp_err mmp_ckpt_write_meta_scaled(const char *dir, int steps_done, const mmp_plan *plan,
                                   const mmp_loss_scale *ls)
{
    long long seed = plan->job.seed;
    MMP_TRY(mmp_fingerprint_write(dir, plan));
    char path[1200];
    snprintf(path, sizeof path, "%s/train.ckpt", dir);
    mmp_ckpt_writer w;
    MMP_TRY(mmp_ckpt_writer_open(&w, path));
    int64_t one = 1, two = 2;
    int32_t step = steps_done;
    int32_t s[2] = {(int32_t)((uint64_t)seed & 0xffffffffu), (int32_t)((uint64_t)seed >> 32)};
    mmp_ckpt_write(&w, "meta.step", MMP_I32, 1, &one, &step);
    mmp_ckpt_write(&w, "meta.seed", MMP_I32, 1, &two, s);
    if (ls) {
        int32_t good = ls->good_steps, skipped = ls->skipped;
        mmp_ckpt_write(&w, "meta.loss_scale", MMP_F32, 1, &one, &ls->scale);
        mmp_ckpt_write(&w, "meta.loss_scale_good", MMP_I32, 1, &one, &good);
        mmp_ckpt_write(&w, "meta.opt_skipped", MMP_I32, 1, &one, &skipped);
    }
    return mmp_ckpt_writer_close(&w);
}

/* The one-element entry name of c with dtype, or NULL. */
static const void *meta_scalar(const mmp_ckpt *c, const char *name, mmp_dtype dtype)
{
    const mmp_ckpt_entry *e = mmp_ckpt_find(c, name);
    return e && e->t.dtype == dtype && mmp_tensor_numel(&e->t) == 1 ? e->t.data : NULL;
}

mmp_err mmp_ckpt_read_loss_scale(const char *dir, mmp_loss_scale *ls)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/train.ckpt", dir);
    mmp_ckpt ck = {0};
    MMP_TRY(mmp_ckpt_read_file(&ck, path));
    const float *scale = meta_scalar(&ck, "meta.loss_scale", MMP_F32);
    const int32_t *good = meta_scalar(&ck, "meta.loss_scale_good", MMP_I32);
    const int32_t *skipped = meta_scalar(&ck, "meta.opt_skipped", MMP_I32);
    mmp_err ret = MMP_OK;
    if (scale && good && skipped) {
        if (!(*scale > 0) || !isfinite(*scale) || *good < 0 || *skipped < 0) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s: loss scale %g, %d clean steps, %d skipped", path,
                             (double)*scale, (int)*good, (int)*skipped);
        } else {
            *ls = (mmp_loss_scale){.scale = *scale, .good_steps = *good, .skipped = *skipped};
        }
    }
    mmp_ckpt_fini(&ck);
    return ret;
}
