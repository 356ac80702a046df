/* The manifest's file walker and sample index (data/manifest_json.c parses
 * one line). This file never opens images: existence checks belong to the
 * dataset. */
#include "data/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/manifest_json.h"

/* ---- the file ----------------------------------------------------------------- */

mmp_err mmp_manifest_scan(const char *path, mmp_manifest_visit visit, void *user)
{
    mmp_err ret = MMP_OK;
    char *line = NULL, *arena = NULL;
    size_t line_cap = 0, arena_cap = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    uint64_t offset = 0;
    for (int64_t lineno = 1;; lineno++) {
        errno = 0;
        ssize_t got = getline(&line, &line_cap, f);
        if (got < 0) {
            if (ferror(f)) {
                ret = mmp_errorf(MMP_ERR_IO, "%s:%lld: read failed: %s", path, (long long)lineno,
                                 strerror(errno));
            }
            break;
        }
        mmp_manifest_entry e = {.line = lineno, .offset = offset};
        offset += (uint64_t)got;
        size_t n = (size_t)got;
        char *s = line;
        if (n > 0 && s[n - 1] == '\n') {
            n--;
        }
        if (n > 0 && s[n - 1] == '\r') {
            n--;
        }
        if (lineno == 1 && n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) {
            s += 3, n -= 3, e.offset += 3;
        }
        e.length = n;
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t')) {
            k++;
        }
        if (k == n) {
            continue; /* blank lines are not samples */
        }
        char why[256];
        const char *problem = NULL;
        char full[2048];
        if (n > MMP_MANIFEST_MAX_LINE) {
            snprintf(why, sizeof why, "line longer than %d bytes", MMP_MANIFEST_MAX_LINE);
            problem = why;
            e.problem = MMP_PROBLEM_LONG_LINE;
        } else {
            if (arena_cap < n + 1) {
                free(arena);
                arena_cap = n + 1 > 4096 ? n + 1 : 4096;
                arena = malloc(arena_cap);
                if (!arena) {
                    ret = mmp_errorf(MMP_ERR_NOMEM, "%s: %zu bytes to parse a line", path, n);
                    break;
                }
            }
            if (!mmp_manifest_parse_entry(s, n, arena, &e, why, sizeof why)) {
                problem = why;
            }
        }
        if (problem) {
            snprintf(full, sizeof full, "%s:%lld: %s", path, (long long)lineno, problem);
            e.image = e.text = e.id = NULL;
        }
        ret = visit(user, &e, problem ? full : NULL);
        if (ret != MMP_OK) {
            break;
        }
    }
    free(line);
    free(arena);
    fclose(f);
    return ret;
}

mmp_err mmp_manifest_resolve(const char *manifest_path, const char *image, char *out, size_t n)
{
    const char *slash = strrchr(manifest_path, '/');
    int w;
    if (image[0] == '/' || !slash) {
        w = snprintf(out, n, "%s", image);
    } else {
        w = snprintf(out, n, "%.*s/%s", (int)(slash - manifest_path), manifest_path, image);
    }
    if (w < 0 || (size_t)w >= n) {
        return mmp_errorf(MMP_ERR_INVALID, "image path too long: %s", image);
    }
    return MMP_OK;
}

/* ---- the index ---------------------------------------------------------------- */

/* One uint64 per sample: the line's byte offset in the high 40 bits (files up
 * to 1 TiB) and its length in the low 24. Line numbers are not stored per
 * sample: line(i) = i + 1 + (lines before sample i that are not samples:
 * blank or left out), and that count changes only where such a line occurs,
 * so `jumps` records it at each change; a clean manifest has none. */
#define LENGTH_BITS 24
#define OFFSET_LIMIT (1ull << (64 - LENGTH_BITS))
_Static_assert(MMP_MANIFEST_MAX_LINE < (1 << LENGTH_BITS), "a line's length must fit its field");

/* Warnings for lines left out, before they are only counted. */
#define DROP_LOG_MAX 10

typedef struct line_jump {
    int64_t first; /* the first sample it applies to */
    int64_t extra; /* lines before that sample which are not samples */
} line_jump;

struct mmp_manifest {
    char *path;
    int fd;
    int64_t n, cap;
    uint64_t *slot; /* (n) offset << LENGTH_BITS | length */
    int64_t n_jumps, jumps_cap;
    line_jump *jumps;
    int64_t dropped; /* bad lines left out (skip) */
};

typedef struct open_state {
    mmp_manifest *m;
    mmp_manifest_visit check;
    void *user;
    int skip;
    mmp_manifest_progress progress;
    void *ctx;
    int64_t lines; /* counted before the walk */
} open_state;

/* Grows *buf (of *cap elements of size elem) to hold at least need. */
static int grow(void **buf, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap) {
        return 1;
    }
    int64_t next = *cap ? 2 * *cap : 1024;
    void *p = realloc(*buf, (size_t)next * elem);
    if (!p) {
        return 0;
    }
    *buf = p;
    *cap = next;
    return 1;
}

static mmp_err drop_line(open_state *st, const char *why)
{
    mmp_manifest *m = st->m;
    if (m->dropped < DROP_LOG_MAX) {
        MMP_WARN("%s (left out: data.on_bad_sample is skip)", why);
    } else if (m->dropped == DROP_LOG_MAX) {
        MMP_WARN("%s: more bad lines left out, not listed", m->path);
    }
    m->dropped++;
    return MMP_OK;
}

static mmp_err index_line(void *user, const mmp_manifest_entry *e, const char *problem)
{
    open_state *st = user;
    mmp_manifest *m = st->m;
    if (st->progress && e->line % MMP_MANIFEST_PROGRESS_LINES == 0) {
        /* a file that grew since it was counted: never done > total */
        st->progress(st->ctx, "lines", e->line, e->line > st->lines ? e->line : st->lines);
    }
    if (problem) {
        return st->skip ? drop_line(st, problem) : mmp_errorf(MMP_ERR_DATA, "%s", problem);
    }
    if (st->check) {
        mmp_err ret = st->check(st->user, e, NULL);
        if (ret == MMP_ERR_DATA && st->skip) {
            return drop_line(st, mmp_last_error());
        }
        MMP_TRY(ret);
    }
    if (e->offset >= OFFSET_LIMIT) {
        return mmp_errorf(MMP_ERR_DATA, "%s:%lld: manifest larger than %llu bytes (split it)",
                          m->path, (long long)e->line, OFFSET_LIMIT);
    }
    /* Only a file that grew since it was counted needs more room. */
    if (!grow((void **)&m->slot, &m->cap, m->n + 1, sizeof *m->slot)) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s: index of %lld samples", m->path,
                          (long long)(2 * m->cap));
    }
    const int64_t extra = e->line - 1 - m->n;
    const int64_t last = m->n_jumps ? m->jumps[m->n_jumps - 1].extra : 0;
    if (extra != last) {
        if (!grow((void **)&m->jumps, &m->jumps_cap, m->n_jumps + 1, sizeof *m->jumps)) {
            return mmp_errorf(MMP_ERR_NOMEM, "%s: line table of %lld entries", m->path,
                              (long long)(2 * m->jumps_cap));
        }
        m->jumps[m->n_jumps++] = (line_jump){.first = m->n, .extra = extra};
    }
    m->slot[m->n++] = e->offset << LENGTH_BITS | (uint64_t)e->length;
    return MMP_OK;
}

/* Lines in the file at path (its newlines, plus one for a last line without
 * one). The index is allocated once at this size: growing it by doubling
 * would leave freed copies resident when the allocator serves it from the
 * heap, making memory depend on allocation history. */
static mmp_err count_lines(const char *path, int64_t *out, mmp_manifest_progress progress,
                           void *ctx)
{
    enum { CHUNK = 1 << 18 };
    mmp_err ret = MMP_OK;
    *out = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    struct stat sb;
    int64_t size = fstat(fd, &sb) == 0 ? (int64_t)sb.st_size : 0, bytes = 0;
    char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return mmp_errorf(MMP_ERR_NOMEM, "%s: %d bytes to count lines", path, CHUNK);
    }
    int64_t lines = 0;
    char last = '\n';
    for (;;) {
        ssize_t got = read(fd, buf, CHUNK);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
            break;
        }
        if (got == 0) {
            break;
        }
        for (const char *p = buf, *end = buf + got; (p = memchr(p, '\n', (size_t)(end - p))); p++) {
            lines++;
        }
        last = buf[got - 1];
        bytes += got;
        if (progress) {
            progress(ctx, "bytes counted", bytes, bytes > size ? bytes : size);
        }
    }
    *out = lines + (last != '\n');
    free(buf);
    close(fd);
    return ret;
}

static mmp_err open_index(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                          void *user, int skip, mmp_manifest_progress progress, void *ctx)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    mmp_manifest *m = calloc(1, sizeof *m);
    if (!m) {
        return mmp_errorf(MMP_ERR_NOMEM, "manifest");
    }
    m->fd = -1;
    m->path = strdup(path);
    if (!m->path) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "manifest path");
        goto fail;
    }
    int64_t lines;
    MMP_TRY_GOTO(count_lines(path, &lines, progress, ctx), ret, fail);
    if (lines > 0) {
        m->slot = malloc((size_t)lines * sizeof *m->slot);
        if (!m->slot) {
            ret = mmp_errorf(MMP_ERR_NOMEM, "%s: index of %lld lines (%zu bytes)", path,
                             (long long)lines, (size_t)lines * sizeof *m->slot);
            goto fail;
        }
        m->cap = lines;
    }
    open_state st = {.m = m,
                     .check = check,
                     .user = user,
                     .skip = skip,
                     .progress = progress,
                     .ctx = ctx,
                     .lines = lines};
    MMP_TRY_GOTO(mmp_manifest_scan(path, index_line, &st), ret, fail);
    if (progress) {
        progress(ctx, "lines", lines, lines);
    }
    if (m->n == 0) {
        ret = m->dropped ? mmp_errorf(MMP_ERR_DATA, "%s: no samples (all %lld lines are bad)", path,
                                      (long long)m->dropped)
                         : mmp_errorf(MMP_ERR_DATA, "%s: no samples (the manifest is empty)", path);
        goto fail;
    }
    if (m->dropped) {
        MMP_WARN("%s: %lld bad lines left out, %lld samples kept", path, (long long)m->dropped,
                 (long long)m->n);
    }
    /* Blank and left-out lines have slots; give them back (in place). */
    uint64_t *fit = realloc(m->slot, (size_t)m->n * sizeof *m->slot);
    if (fit) {
        m->slot = fit;
        m->cap = m->n;
    }
    m->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (m->fd < 0) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    *out = m;
    return MMP_OK;
fail:
    mmp_manifest_close(m);
    return ret;
}

mmp_err mmp_manifest_open(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                          void *user)
{
    return open_index(out, path, check, user, 0, NULL, NULL);
}

mmp_err mmp_manifest_open_skip(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                               void *user)
{
    return open_index(out, path, check, user, 1, NULL, NULL);
}

mmp_err mmp_manifest_open_progress(mmp_manifest **out, const char *path, mmp_manifest_visit check,
                                   void *user, int skip, mmp_manifest_progress progress, void *ctx)
{
    return open_index(out, path, check, user, skip != 0, progress, ctx);
}

void mmp_manifest_close(mmp_manifest *m)
{
    if (!m) {
        return;
    }
    if (m->fd >= 0) {
        close(m->fd);
    }
    free(m->path);
    free(m->slot);
    free(m->jumps);
    free(m);
}

int64_t mmp_manifest_size(const mmp_manifest *m)
{
    return m->n;
}

int64_t mmp_manifest_dropped(const mmp_manifest *m)
{
    return m->dropped;
}

const char *mmp_manifest_path(const mmp_manifest *m)
{
    return m->path;
}

int64_t mmp_manifest_line(const mmp_manifest *m, int64_t i)
{
    MMP_ASSERT(i >= 0 && i < m->n);
    /* The last jump at or before i. */
    int64_t lo = 0, hi = m->n_jumps;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (m->jumps[mid].first <= i) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return i + 1 + (lo ? m->jumps[lo - 1].extra : 0);
}

size_t mmp_manifest_index_bytes(const mmp_manifest *m)
{
    return (size_t)m->cap * sizeof *m->slot + (size_t)m->jumps_cap * sizeof *m->jumps;
}

mmp_err mmp_manifest_read(const mmp_manifest *m, int64_t i, mmp_manifest_entry *e)
{
    memset(e, 0, sizeof *e);
    if (i < 0 || i >= m->n) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: sample %lld out of range [0, %lld)", m->path,
                          (long long)i, (long long)m->n);
    }
    const uint64_t offset = m->slot[i] >> LENGTH_BITS;
    const size_t len = (size_t)(m->slot[i] & ((1u << LENGTH_BITS) - 1));
    const long long line = mmp_manifest_line(m, i);
    char *buf = malloc(len + 1);
    if (!buf) {
        return mmp_errorf(MMP_ERR_NOMEM, "%s:%lld: %zu bytes", m->path, line, len);
    }
    size_t done = 0;
    while (done < len) {
        ssize_t got = pread(m->fd, buf + done, len - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            free(buf);
            return mmp_errorf(MMP_ERR_IO, "%s:%lld: %s", m->path, line,
                              got < 0 ? strerror(errno) : "file shorter than when it was opened");
        }
        done += (size_t)got;
    }
    mmp_err ret = mmp_manifest_parse_line(buf, len, e);
    free(buf);
    if (ret != MMP_OK) {
        return mmp_error_prefix(ret, "%s:%lld: changed since it was opened", m->path, line);
    }
    e->line = line;
    e->offset = offset;
    return MMP_OK;
}
