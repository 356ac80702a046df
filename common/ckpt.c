/* Checkpoint file format: writer (temp + fsync + rename) and verifying reader. */
#include "common/ckpt.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
        return;
    }
    mmp_xxh64_update(&w->hash, p, n);
}

mmp_err mmp_ckpt_writer_open(mmp_ckpt_writer *w, const char *path)
{
    memset(w, 0, sizeof *w);
    /* Durable: once ckpt/latest names a step, its files must be on disk. */
    if ((w->err = mmp_atomic_open(&w->file, path, MMP_ATOMIC_DURABLE)) != MMP_OK) {
        return w->err;
    }
    mmp_xxh64_init(&w->hash);
    uint32_t version = MMP_CKPT_VERSION, reserved = 0;
    put(w, MAGIC, sizeof MAGIC);
    put(w, &version, 4);
    put(w, &reserved, 4);
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
    put(w, &w->count, 4); /* the trailer: every byte before the footer is hashed */
    uint64_t h = mmp_xxh64_digest(&w->hash);
    if (w->err == MMP_OK && fwrite(&h, 8, 1, w->file.f) != 1) {
        w->err = mmp_errorf(MMP_ERR_IO, "write %s: %s", w->file.tmp, strerror(errno));
    }
    if (w->err != MMP_OK) {
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

/* Every tensor name of a directory's files with its file, kept or not: the
 * tensors a want callback leaves out must not appear twice either. */
typedef struct name_seen {
    char name[128];
    char file[64];
} name_seen;
typedef struct names_seen {
    name_seen *v;
    size_t n, cap;
} names_seen;

static int cmp_seen(const void *a, const void *b)
{
    return strcmp(((const name_seen *)a)->name, ((const name_seen *)b)->name);
}

static mmp_err note_name(names_seen *s, const char *name, const char *file)
{
    if (s->n == s->cap) {
        size_t grow = s->cap ? 2 * s->cap : 256;
        name_seen *v = realloc(s->v, grow * sizeof *v);
        if (!v) {
            return mmp_errorf(MMP_ERR_NOMEM, "checkpoint names");
        }
        s->v = v;
        s->cap = grow;
    }
    snprintf(s->v[s->n].name, sizeof s->v[s->n].name, "%s", name);
    snprintf(s->v[s->n].file, sizeof s->v[s->n].file, "%s", file);
    s->n++;
    return MMP_OK;
}

/* A checkpoint file read front to back once: every byte goes through the
 * checksum as it arrives, tensor data straight into its tensor (no second
 * copy of the file in memory), and progress is reported as it goes. */
typedef struct reader {
    const char *path;
    int fd;
    int version;        /* the file's; 0 while its header is read (not hashed yet) */
    uint64_t h;         /* version 1: FNV-1a of the bytes consumed so far */
    mmp_xxh64_state xh; /* version 2: their XXH64 */
    uint64_t off, end;  /* consumed; where the part being read ends */
    uint64_t footer;    /* where the footer starts */
    unsigned char buf[1 << 16];
    size_t bpos, blen; /* buffered, not yet consumed: buf[bpos, blen) */
    int io_failed;     /* errno of a failed read; EIO for a short file */
    const mmp_ckpt_read_opts *o;
    int64_t done_base, total; /* what earlier files of the directory read; all of it */
    names_seen *seen;         /* NULL, or where every tensor name goes */
} reader;

/* 64 MiB: a tensor's data is read (and reported) in pieces of at most this */
#define READ_PIECE ((size_t)64 << 20)

static void report(reader *r)
{
    if (r->o->progress) {
        r->o->progress(r->o->progress_ctx, "bytes", r->done_base + (int64_t)r->off, r->total);
    }
}

/* Reads exactly n bytes of the file into p; 0 on an error or early end. */
static int read_raw(reader *r, unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t got = read(r->fd, p, n);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            r->io_failed = got < 0 ? errno : EIO;
            return 0;
        }
        p += got;
        n -= (size_t)got;
    }
    return 1;
}

static void hash(reader *r, const void *p, size_t n)
{
    if (r->version == 1) {
        r->h = mmp_fnv1a(r->h, p, n);
    } else if (r->version == 2) {
        mmp_xxh64_update(&r->xh, p, n);
    }
}

/* Consumes n bytes before the footer into out (hashing them); 0 when fewer
 * than n are left before the footer or the read fails. */
static int take(reader *r, void *out, size_t n)
{
    if (r->end - r->off < n) {
        return 0;
    }
    if (n == 0) { /* an empty tensor's data may be NULL */
        return 1;
    }
    unsigned char *o = out;
    size_t have = r->blen - r->bpos;
    size_t first = have < n ? have : n;
    memcpy(o, r->buf + r->bpos, first);
    r->bpos += first;
    size_t left = n - first;
    if (left >= sizeof r->buf) { /* large: straight into out, a piece at a time */
        r->off += first;
        for (size_t at = first; left > 0;) {
            size_t piece = left < READ_PIECE ? left : READ_PIECE;
            if (!read_raw(r, o + at, piece)) {
                return 0;
            }
            at += piece;
            left -= piece;
            r->off += piece;
            report(r);
        }
    } else if (left > 0) {
        size_t want = r->end - r->off - first; /* never past the footer */
        want = want < sizeof r->buf ? want : sizeof r->buf;
        if (!read_raw(r, r->buf, want)) {
            return 0;
        }
        r->bpos = left;
        r->blen = want;
        memcpy(o + first, r->buf, left);
        r->off += n;
    } else {
        r->off += n;
    }
    hash(r, out, n);
    return 1;
}

/* Consumes n bytes (hashing them) without keeping them. */
static int skip(reader *r, uint64_t n)
{
    unsigned char tmp[1 << 12];
    while (n > 0) {
        size_t k = n < sizeof tmp ? (size_t)n : sizeof tmp;
        if (!take(r, tmp, k)) {
            return 0;
        }
        n -= k;
        if ((r->off & (READ_PIECE - 1)) < k) { /* crossed a 64 MiB mark */
            report(r);
        }
    }
    return 1;
}

/* The footer's checksum against the bytes before it; the rest of the body is
 * hashed first (after a record error: a corrupt file is named as such). */
static int checksum_ok(reader *r)
{
    r->end = r->footer;
    if (!skip(r, r->end - r->off)) {
        return 0;
    }
    uint64_t want; /* the buffer never holds footer bytes: take stops at end */
    if (!read_raw(r, (unsigned char *)&want, 8)) {
        return 0;
    }
    return want == (r->version == 1 ? r->h : mmp_xxh64_digest(&r->xh));
}

/* The records of a file: count of them (version 1), or as many as there are
 * before r->end (version 2: count UINT32_MAX); *found: how many were read. */
static mmp_err read_records(reader *r, mmp_ckpt *c, int *cap, uint32_t count, const char *base,
                            uint32_t *found)
{
    const char *path = r->path;
    uint32_t i = 0;
    for (; count == UINT32_MAX ? r->off < r->end : i < count; i++) {
        *found = i;
        mmp_ckpt_entry e;
        memset(&e, 0, sizeof e);
        uint16_t nl;
        uint8_t dt, nd;
        int64_t shape[MMP_MAX_DIMS];
        uint64_t nbytes;
        if (!take(r, &nl, 2) || nl == 0 || nl >= sizeof e.name || !take(r, e.name, nl) ||
            !take(r, &dt, 1) || !take(r, &nd, 1) || dt > MMP_I32 || nd > MMP_MAX_DIMS) {
            return mmp_errorf(MMP_ERR_DATA, "%s: tensor %u: bad record header", path, i);
        }
        for (int d = 0; d < nd; d++) {
            if (!take(r, &shape[d], 8) || shape[d] < 0) {
                return mmp_errorf(MMP_ERR_DATA, "%s: %s: bad shape", path, e.name);
            }
        }
        if (!take(r, &nbytes, 8)) {
            return mmp_errorf(MMP_ERR_DATA, "%s: %s: truncated", path, e.name);
        }
        /* The shape is the file's word: its size must be the record's bytes
         * and fit in what is left of the file before anything is allocated
         * (a forged shape would overflow the element count or ask for TBs). */
        /* The product of the non-zero dims is bounded too: with a zero dim
         * the tensor is empty, but its shape is still multiplied out. */
        uint64_t numel = 1, left = r->end - r->off;
        uint64_t esize = mmp_dtype_size((mmp_dtype)dt);
        int empty = 0;
        for (int d = 0; d < nd && numel != UINT64_MAX; d++) {
            uint64_t s = (uint64_t)shape[d];
            empty |= s == 0;
            numel = s == 0 ? numel : numel > left / esize / s ? UINT64_MAX : numel * s;
        }
        if (numel == UINT64_MAX || (empty ? 0 : numel * esize) != nbytes || nbytes > left) {
            return mmp_errorf(MMP_ERR_DATA,
                              "%s: %s: shape and size disagree (%llu bytes recorded, %llu left)",
                              path, e.name, (unsigned long long)nbytes, (unsigned long long)left);
        }
        if (r->seen) {
            MMP_TRY(note_name(r->seen, e.name, base));
        }
        if (r->o->want && !r->o->want(r->o->want_ctx, e.name)) {
            if (!skip(r, nbytes)) {
                return mmp_errorf(MMP_ERR_DATA, "%s: %s: truncated", path, e.name);
            }
            report(r);
            continue;
        }
        MMP_TRY(mmp_tensor_init(&e.t, (mmp_dtype)dt, nd, shape));
        if (nbytes != mmp_tensor_bytes(&e.t) || !take(r, e.t.data, nbytes)) {
            mmp_tensor_fini(&e.t);
            return mmp_errorf(MMP_ERR_DATA, "%s: %s: size does not match its shape", path, e.name);
        }
        snprintf(e.file, sizeof e.file, "%s", base);
        if (c->count == *cap) {
            int grow = *cap ? 2 * *cap : 16;
            mmp_ckpt_entry *grown = realloc(c->entries, (size_t)grow * sizeof *grown);
            if (!grown) {
                mmp_tensor_fini(&e.t);
                return mmp_errorf(MMP_ERR_NOMEM, "checkpoint index");
            }
            c->entries = grown;
            *cap = grow;
        }
        c->entries[c->count++] = e;
        report(r);
    }
    *found = i;
    if (r->off != r->end) {
        return mmp_errorf(MMP_ERR_DATA, "%s: trailing bytes after %u tensors", path, count);
    }
    if (c->count > 1) {
        qsort(c->entries, (size_t)c->count, sizeof *c->entries, cmp_entry);
    }
    for (int i = 1; i < c->count; i++) {
        if (strcmp(c->entries[i - 1].name, c->entries[i].name) == 0) {
            return mmp_errorf(MMP_ERR_DATA, "%s: tensor %s appears twice", path,
                              c->entries[i].name);
        }
    }
    return MMP_OK;
}

/* Moves every entry of from into c (from ends empty); a name c holds
 * already is an error naming path. */
static mmp_err merge(mmp_ckpt *c, mmp_ckpt *from, const char *path)
{
    for (int i = 0; i < from->count; i++) {
        if (mmp_ckpt_find(c, from->entries[i].name)) {
            return mmp_errorf(MMP_ERR_DATA, "%s: tensor %s appears twice", path,
                              from->entries[i].name);
        }
    }
    if (from->count == 0) {
        return MMP_OK;
    }
    mmp_ckpt_entry *grown = realloc(c->entries, (size_t)(c->count + from->count) * sizeof *grown);
    if (!grown) {
        return mmp_errorf(MMP_ERR_NOMEM, "checkpoint index");
    }
    memcpy(grown + c->count, from->entries, (size_t)from->count * sizeof *grown);
    c->entries = grown;
    c->count += from->count;
    free(from->entries);
    from->entries = NULL;
    from->count = 0;
    qsort(c->entries, (size_t)c->count, sizeof *c->entries, cmp_entry);
    return MMP_OK;
}

/* One file's tensors into *got (empty on entry). The order of the checks
 * is the reader's contract: too short, bad magic, then a checksum mismatch
 * before anything the records or the version say. */
static mmp_err read_one(reader *r, mmp_ckpt *got)
{
    const char *path = r->path;
    struct stat st;
    if (fstat(r->fd, &st) != 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        return mmp_errorf(MMP_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        return mmp_errorf(MMP_ERR_DATA, "%s: too short to be a checkpoint", path);
    }
    r->footer = r->end = (uint64_t)st.st_size - 8;
    unsigned char hdr[16];
    uint32_t version = 0, count = 0; /* version 2: count is the trailer's */
    if (!take(r, hdr, 16)) {
        return mmp_errorf(MMP_ERR_IO, "read %s: %s", path, strerror(r->io_failed));
    }
    if (memcmp(hdr, MAGIC, 8) != 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: not an mmpipe checkpoint (bad magic)", path);
    }
    memcpy(&version, hdr + 8, 4);
    memcpy(&count, hdr + 12, 4);
    if (version != 1 && version != 2) { /* nor its checksum known */
        return mmp_errorf(MMP_ERR_DATA, "%s: checkpoint version %u, this mmpipe reads 1 and 2",
                          path, version);
    }
    if (version == 2 && st.st_size < 28) {
        return mmp_errorf(MMP_ERR_DATA, "%s: too short to be a checkpoint", path);
    }
    r->version = (int)version;
    if (version == 1) {
        r->h = mmp_fnv1a(MMP_FNV1A_INIT, hdr, 16);
    } else {
        mmp_xxh64_init(&r->xh);
        mmp_xxh64_update(&r->xh, hdr, 16);
        r->end = r->footer - 4; /* the records end at the trailer */
    }
    const char *base = strrchr(path, '/');
    int cap = 0;
    uint32_t found = 0, trailer = 0;
    mmp_err ret = read_records(r, got, &cap, version == 1 ? count : UINT32_MAX,
                               base ? base + 1 : path, &found);
    if (ret == MMP_OK && version == 2) {
        r->end = r->footer;
        if (!take(r, &trailer, 4)) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s: truncated", path);
        }
    }
    /* A corrupt file is named by its checksum, whatever its records said. */
    if (!r->io_failed && !checksum_ok(r) && !r->io_failed) {
        return mmp_errorf(MMP_ERR_DATA, "%s: checksum mismatch (file corrupt or truncated)", path);
    }
    if (r->io_failed) {
        return mmp_errorf(MMP_ERR_IO, "read %s: %s", path, strerror(r->io_failed));
    }
    if (ret == MMP_OK && version == 2 && count != 0) {
        return mmp_errorf(MMP_ERR_DATA, "%s: header field after the version is %u, not 0", path,
                          count);
    }
    if (ret == MMP_OK && version == 2 && trailer != found) {
        return mmp_errorf(MMP_ERR_DATA, "%s: %u tensors, the trailer says %u", path, found,
                          trailer);
    }
    return ret;
}

/* One file's tensors into c; *done (bytes of the directory read before this
 * file) grows by the file's size once it is read whole. */
static mmp_err read_file(mmp_ckpt *c, const char *path, const mmp_ckpt_read_opts *o, int64_t *done,
                         int64_t total, names_seen *seen)
{
    reader *r = calloc(1, sizeof *r);
    if (!r) {
        return mmp_errorf(MMP_ERR_NOMEM, "checkpoint reader");
    }
    r->path = path;
    r->o = o;
    r->done_base = *done;
    r->total = total;
    r->seen = seen;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        mmp_err e = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
        free(r);
        return e;
    }
    mmp_ckpt got = {0};
    mmp_err ret = read_one(r, &got);
    if (ret == MMP_OK) {
        ret = merge(c, &got, path); /* nothing of a file that failed is kept */
        *done += (int64_t)(r->footer + 8);
    }
    mmp_ckpt_fini(&got);
    close(r->fd);
    free(r);
    return ret;
}

static const mmp_ckpt_read_opts every_tensor = {0};

mmp_err mmp_ckpt_read_file(mmp_ckpt *c, const char *path)
{
    int64_t done = 0;
    return read_file(c, path, &every_tensor, &done, 0, NULL);
}

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

mmp_err mmp_ckpt_read_dir(mmp_ckpt *c, const char *dir)
{
    return mmp_ckpt_read_dir_opts(c, dir, NULL);
}

/* dir itself, or the step its ckpt/latest (a run directory) or latest (a
 * ckpt folder) names, into out; a latest naming a step that is gone is an
 * error that says so. */
static mmp_err resolve_dir(const char *dir, char *out, size_t n)
{
    static const char *const links[] = {"%s/ckpt/latest", "%s/latest"};
    char path[1024], target[256];
    struct stat st;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, links[i], dir);
        int found = stat(path, &st) == 0;
        int why = errno;
        if (found && S_ISDIR(st.st_mode)) {
            snprintf(out, n, "%s", path);
            return MMP_OK;
        }
        ssize_t len = found ? -1 : readlink(path, target, sizeof target - 1);
        if (len > 0) {
            target[len] = 0;
            return mmp_errorf(MMP_ERR_IO, "%s -> %s: %s (the step it names is gone)", path, target,
                              strerror(why));
        }
    }
    snprintf(out, n, "%s", dir);
    return MMP_OK;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
}

/* The *.ckpt files of dir, sorted by name (so errors and entries do not
 * depend on readdir): *names (for free_names) and *n; none is an error. */
static mmp_err list_ckpt_files(const char *dir, char ***names_out, size_t *n_out)
{
    DIR *d = opendir(dir);
    if (!d) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", dir, strerror(errno));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    mmp_err ret = MMP_OK;
    struct dirent *de;
    while (ret == MMP_OK && (de = readdir(d)) != NULL) {
        if (!has_suffix(de->d_name, ".ckpt")) {
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) {
                ret = mmp_errorf(MMP_ERR_NOMEM, "%s: file list", dir);
                break;
            }
            names = grown;
        }
        if (!(names[n] = strdup(de->d_name))) {
            ret = mmp_errorf(MMP_ERR_NOMEM, "%s: file list", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (ret == MMP_OK && n == 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: no .ckpt files (not a checkpoint directory)", dir);
    }
    if (ret != MMP_OK) {
        free_names(names, n);
        return ret;
    }
    if (n > 1) {
        qsort(names, n, sizeof *names, cmp_name);
    }
    *names_out = names;
    *n_out = n;
    return MMP_OK;
}

/* A listed file's name: a plain *.ckpt name, no path. */
static int list_name_ok(const char *s)
{
    size_t len = strlen(s);
    if (len < 6 || len >= 64 || !has_suffix(s, ".ckpt") || s[0] == '.') {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        if (!(isalnum((unsigned char)s[i]) || s[i] == '.' || s[i] == '_' || s[i] == '-')) {
            return 0;
        }
    }
    return 1;
}

/* Holds dir's files (names[0..n), sorted) to its files.txt when it has one
 * (*listed 1): every listed file present with its recorded size, every
 * *.ckpt file listed. Without one (checkpoints written before it existed)
 * *listed is 0 and nothing is checked. */
static const void *meta_scalar(const mmp_ckpt *c, const char *name, mmp_dtype dtype);

/* Whether dir's train.ckpt says its step was written with a files.txt
 * (meta.files_listed): then one missing is a damage, not an older step. */
static int says_listed(const char *dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/train.ckpt", dir);
    mmp_ckpt ck = {0};
    int yes = mmp_ckpt_read_file(&ck, path) == MMP_OK &&
              meta_scalar(&ck, "meta.files_listed", MMP_I32) != NULL;
    mmp_ckpt_fini(&ck);
    return yes;
}

/* A checkpoint file's footer: its last 8 bytes, the checksum of all before
 * them (as it is stored); 0 when unreadable. Two files of different
 * contents differ in it: files.txt records it, so a file of another step
 * copied in, of the same size, is found. */
static uint64_t file_footer(const char *path)
{
    uint64_t h = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size >= 8 &&
        pread(fd, &h, sizeof h, st.st_size - 8) != (ssize_t)sizeof h) {
        h = 0;
    }
    if (fd >= 0) {
        close(fd);
    }
    return h;
}

static mmp_err check_file_list(const char *dir, char **names, size_t n, int *listed)
{
    char path[1200];
    *listed = 0;
    snprintf(path, sizeof path, "%s/%s", dir, MMP_CKPT_FILE_LIST);
    FILE *f = fopen(path, "r");
    if (!f && errno == ENOENT && says_listed(dir)) {
        return mmp_errorf(MMP_ERR_DATA,
                          "%s is missing, and train.ckpt says this step was written with one: "
                          "the step is damaged or incomplete; resume from an earlier step",
                          path);
    }
    if (!f) {
        return errno == ENOENT ? MMP_OK : mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    *listed = 1;
    unsigned char *seen = calloc(n, 1);
    if (!seen) {
        fclose(f);
        return mmp_errorf(MMP_ERR_NOMEM, "%s", path);
    }
    mmp_err ret = MMP_OK;
    char line[256];
    int line_no = 0, entries = 0;
    while (ret == MMP_OK && fgets(line, sizeof line, f)) {
        line_no++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            ret = mmp_errorf(MMP_ERR_DATA, "%s:%d: line longer than %zu bytes", path, line_no,
                             sizeof line - 2);
            break;
        }
        if (line[0] == '#' || line[0] == '\n') {
            continue;
        }
        char *sp = strchr(line, ' ');
        char *end = NULL, *hex_end = NULL;
        long long size = -1;
        unsigned long long footer = 0;
        int has_footer = 0;
        if (sp) {
            *sp = 0;
            errno = 0;
            size = isdigit((unsigned char)sp[1]) ? strtoll(sp + 1, &end, 10) : -1;
        }
        if (end && *end == ' ' && strspn(end + 1, "0123456789abcdef") == 16) {
            /* the file's checksum (written since; a step from before has none) */
            footer = strtoull(end + 1, &hex_end, 16);
            has_footer = 1;
            end = hex_end;
        }
        if (!sp || !list_name_ok(line) || size < 0 || errno || !end ||
            (*end != '\n' && *end != 0)) {
            ret =
                mmp_errorf(MMP_ERR_DATA, "%s:%d: not \"NAME.ckpt BYTES CHECKSUM\"", path, line_no);
            break;
        }
        const char *key = line;
        char **hit = n ? bsearch(&key, names, n, sizeof *names, cmp_name) : NULL;
        if (!hit) {
            ret = mmp_errorf(MMP_ERR_DATA,
                             "%s/%s is missing (%s:%d lists it): this checkpoint is incomplete; "
                             "resume from an earlier step",
                             dir, line, MMP_CKPT_FILE_LIST, line_no);
            break;
        }
        size_t k = (size_t)(hit - names);
        if (seen[k]) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s:%d: %s listed twice", path, line_no, line);
            break;
        }
        seen[k] = 1;
        entries++;
        char file[1400];
        struct stat st;
        snprintf(file, sizeof file, "%s/%s", dir, line);
        if (stat(file, &st) != 0) {
            ret = mmp_errorf(MMP_ERR_IO, "%s: %s", file, strerror(errno));
        } else if ((long long)st.st_size != size) {
            ret = mmp_errorf(MMP_ERR_DATA,
                             "%s: %lld bytes, %s:%d recorded %lld (cut short or replaced)", file,
                             (long long)st.st_size, MMP_CKPT_FILE_LIST, line_no, size);
        } else if (has_footer) {
            unsigned long long have = file_footer(file);
            if (have != footer) {
                ret = mmp_errorf(MMP_ERR_DATA,
                                 "%s: its checksum %016llx is not the %016llx %s:%d recorded (a "
                                 "file of another step, or changed since)",
                                 file, have, footer, MMP_CKPT_FILE_LIST, line_no);
            }
        }
    }
    if (ret == MMP_OK && ferror(f)) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: read failed", path);
    }
    fclose(f);
    if (ret == MMP_OK && entries == 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: lists no file", path);
    }
    for (size_t i = 0; ret == MMP_OK && i < n; i++) {
        if (!seen[i]) {
            ret = mmp_errorf(MMP_ERR_DATA,
                             "%s/%s: not in %s (not part of this checkpoint: move it away)", dir,
                             names[i], MMP_CKPT_FILE_LIST);
        }
    }
    free(seen);
    return ret;
}

mmp_err mmp_ckpt_check_files(const char *step_dir, int *listed)
{
    char **names = NULL;
    size_t n = 0;
    MMP_TRY(list_ckpt_files(step_dir, &names, &n));
    mmp_err ret = check_file_list(step_dir, names, n, listed);
    free_names(names, n);
    return ret;
}

mmp_err mmp_ckpt_read_dir_opts(mmp_ckpt *c, const char *dir, const mmp_ckpt_read_opts *o)
{
    memset(c, 0, sizeof *c);
    o = o ? o : &every_tensor;
    char resolved[1024];
    MMP_TRY(resolve_dir(dir, resolved, sizeof resolved));
    /* Every *.ckpt file (one per stage process that holds weights: no fixed
     * cap), in name order; their sizes first, for the progress's total. */
    char **names = NULL;
    size_t n = 0;
    MMP_TRY(list_ckpt_files(resolved, &names, &n));
    int listed = 0;
    mmp_err ret = check_file_list(resolved, names, n, &listed);
    if (o->file_list) {
        *o->file_list = listed;
    }
    int64_t total = 0, done = 0;
    char file[1400];
    struct stat st;
    for (size_t i = 0; ret == MMP_OK && i < n; i++) {
        if (snprintf(file, sizeof file, "%s/%s", resolved, names[i]) >= (int)sizeof file) {
            ret = mmp_errorf(MMP_ERR_INVALID, "%s: path too long", resolved);
        } else if (stat(file, &st) == 0 && S_ISREG(st.st_mode)) {
            total += st.st_size;
        }
    }
    /* tensors left out by want are checked for repeats here (merge checks
     * the kept ones) */
    names_seen seen = {0};
    for (size_t i = 0; ret == MMP_OK && i < n; i++) {
        snprintf(file, sizeof file, "%s/%s", resolved, names[i]);
        ret = read_file(c, file, o, &done, total, o->want ? &seen : NULL);
    }
    if (ret == MMP_OK && seen.n > 1) {
        qsort(seen.v, seen.n, sizeof *seen.v, cmp_seen);
        for (size_t i = 1; ret == MMP_OK && i < seen.n; i++) {
            if (strcmp(seen.v[i - 1].name, seen.v[i].name) == 0) {
                ret = mmp_errorf(MMP_ERR_DATA, "%s: tensor %s is in both %s and %s", resolved,
                                 seen.v[i].name, seen.v[i - 1].file, seen.v[i].file);
            }
        }
    }
    free(seen.v);
    if (ret == MMP_OK && o->progress) {
        o->progress(o->progress_ctx, "bytes", total, total);
    }
    free_names(names, n);
    if (ret != MMP_OK) {
        mmp_ckpt_fini(c);
    }
    return ret;
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

/* Unlinks the files of a step directory (checkpoints are flat; anything
 * else in it stays, and is the writer's to trip over, by name). */
static mmp_err unlink_files(const char *dir)
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
    return MMP_OK;
}

/* Removes one step directory: its files, then it. */
static mmp_err remove_step_dir(const char *dir)
{
    MMP_TRY(unlink_files(dir));
    if (rmdir(dir) != 0) {
        return mmp_errorf(MMP_ERR_IO, "remove %s: %s", dir, strerror(errno));
    }
    return MMP_OK;
}

mmp_err mmp_ckpt_step_begin(const char *run_dir, int64_t step, char *dir, size_t n)
{
    struct stat st;
    if (stat(run_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return mmp_errorf(MMP_ERR_IO,
                          "run directory %s: %s (removed while the run wrote it? nothing more "
                          "can be saved there)",
                          run_dir, stat(run_dir, &st) != 0 ? strerror(errno) : "not a directory");
    }
    char ckpt[1100], target[64], named[64];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", run_dir);
    if (mkdir(ckpt, 0777) != 0 && errno != EEXIST) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", ckpt, strerror(errno));
    }
    mmp_ckpt_step_dir(dir, n, run_dir, step);
    snprintf(target, sizeof target, "step_%07lld", (long long)step);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/latest", run_dir);
    ssize_t len = readlink(ckpt, named, sizeof named - 1);
    named[len > 0 ? len : 0] = 0;
    if (stat(dir, &st) == 0 && strcmp(named, target) != 0) {
        /* left by an earlier attempt at this step (a crash or a full disk
         * mid-checkpoint, then a resume, perhaps with another placement):
         * none of its files may pass for this checkpoint's */
        MMP_TRY(unlink_files(dir));
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", dir, strerror(errno));
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

/* <dir>/files.txt, written last: each *.ckpt file of dir and its size, by
 * which a reader tells a whole step from one with a file missing, cut short
 * or added (check_file_list). */
static mmp_err write_file_list(const char *dir)
{
    char **names = NULL;
    size_t n = 0;
    MMP_TRY(list_ckpt_files(dir, &names, &n));
    char path[1200], file[1400];
    snprintf(path, sizeof path, "%s/%s", dir, MMP_CKPT_FILE_LIST);
    mmp_atomic_file a;
    mmp_err ret = mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE); /* part of the checkpoint */
    if (ret == MMP_OK) {
        fputs("# the files of this checkpoint, their bytes and checksums (mmpipe ckpt verify "
              "checks them)\n",
              a.f);
    }
    for (size_t i = 0; ret == MMP_OK && i < n; i++) {
        struct stat st;
        snprintf(file, sizeof file, "%s/%s", dir, names[i]);
        if (stat(file, &st) != 0) {
            ret = mmp_errorf(MMP_ERR_IO, "%s: %s", file, strerror(errno));
            mmp_atomic_abort(&a);
        } else {
            fprintf(a.f, "%s %lld %016llx\n", names[i], (long long)st.st_size,
                    (unsigned long long)file_footer(file));
        }
    }
    if (ret == MMP_OK) {
        ret = mmp_atomic_commit(&a);
    }
    free_names(names, n);
    return ret;
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
        int32_t scaled = mmp_loss_scale_active(plan);
        mmp_ckpt_write(&w, "meta.loss_scaled", MMP_I32, 1, &one, &scaled);
    }
    int32_t listed = 1; /* files.txt follows (write_file_list) */
    mmp_ckpt_write(&w, "meta.files_listed", MMP_I32, 1, &one, &listed);
    MMP_TRY(mmp_ckpt_writer_close(&w));
    return write_file_list(dir);
}

/* The one-element entry name of c with dtype, or NULL. */
static const void *meta_scalar(const mmp_ckpt *c, const char *name, mmp_dtype dtype)
{
    const mmp_ckpt_entry *e = mmp_ckpt_find(c, name);
    return e && e->t.dtype == dtype && mmp_tensor_numel(&e->t) == 1 ? e->t.data : NULL;
}

mmp_err mmp_ckpt_read_loss_scale(const char *dir, const mmp_plan *plan, mmp_loss_scale *ls)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/train.ckpt", dir);
    mmp_ckpt ck = {0};
    MMP_TRY(mmp_ckpt_read_file(&ck, path));
    const float *scale = meta_scalar(&ck, "meta.loss_scale", MMP_F32);
    const int32_t *good = meta_scalar(&ck, "meta.loss_scale_good", MMP_I32);
    const int32_t *skipped = meta_scalar(&ck, "meta.opt_skipped", MMP_I32);
    const int32_t *scaled = meta_scalar(&ck, "meta.loss_scaled", MMP_I32);
    mmp_err ret = MMP_OK;
    if (scale && good && skipped) {
        if (!(*scale > 0) || !isfinite(*scale) || *good < 0 || *skipped < 0) {
            ret = mmp_errorf(MMP_ERR_DATA, "%s: loss scale %g, %d clean steps, %d skipped", path,
                             (double)*scale, (int)*good, (int)*skipped);
        } else {
            /* (a checkpoint from before meta.loss_scaled: an unscaled run's
             * state is scale 1 with no clean steps counted) */
            int was = scaled ? *scaled != 0 : !(*scale == 1.0f && *good == 0);
            ls->skipped = *skipped;
            if (was && mmp_loss_scale_active(plan)) {
                ls->scale = *scale;
                ls->good_steps = *good;
            }
        }
    }
    mmp_ckpt_fini(&ck);
    return ret;
}
