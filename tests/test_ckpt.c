/* The checkpoint reader (common/ckpt.h): tensors round-trip bit for bit
 * across the files of a step directory, however many files it holds; a
 * corrupt, forged, truncated or foreign file is refused with the reason its
 * damage calls for, and a failed read leaves nothing; progress reports climb
 * to the directory's size in bytes; a selective read keeps only what it is
 * asked for but checks every byte; and a file is read once, straight into
 * its tensors: a read fits in an address space that holds the tensors once
 * but not twice. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/rng.h"
#include "common/xxh64.h"
#include "harness.h"

static const char *dir_of(const char *name)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", mmp_test_tmpdir("test_ckpt"), name);
    CHECK_OK(mmp_mkdirs(buf));
    return buf;
}

/* A file of count float tensors "<prefix>.tK" of n elements each, value i+K. */
static void write_ckpt(const char *path, const char *prefix, int count, int64_t n)
{
    mmp_ckpt_writer w;
    CHECK_OK(mmp_ckpt_writer_open(&w, path));
    float *x = mmp_test_floats((size_t)n);
    for (int k = 0; k < count; k++) {
        for (int64_t i = 0; i < n; i++) {
            x[i] = (float)(i + k);
        }
        char name[64];
        snprintf(name, sizeof name, "%s.t%d", prefix, k);
        CHECK_OK(mmp_ckpt_write(&w, name, MMP_F32, 1, &n, x));
    }
    free(x);
    CHECK_OK(mmp_ckpt_writer_close(&w));
}

static int holds(const mmp_ckpt *c, const char *name, int64_t n, int k)
{
    const mmp_ckpt_entry *e = mmp_ckpt_find(c, name);
    if (!e || e->t.dtype != MMP_F32 || e->t.ndim != 1 || e->t.shape[0] != n) {
        return 0;
    }
    const float *x = e->t.data;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != (float)(i + k)) {
            return 0;
        }
    }
    return 1;
}

/* 70 files (more than the 64 the reader once took, dropping the rest without
 * a word), each with three tensors, one of them empty. */
static void test_many_files(void)
{
    const char *d = dir_of("many");
    char path[1200];
    for (int f = 0; f < 70; f++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "s%02d", f);
        snprintf(path, sizeof path, "%s/%s.ckpt", d, prefix);
        mmp_ckpt_writer w;
        CHECK_OK(mmp_ckpt_writer_open(&w, path));
        int64_t zero = 0, n = 100 + f;
        float *x = mmp_test_floats((size_t)n);
        for (int k = 0; k < 2; k++) {
            for (int64_t i = 0; i < n; i++) {
                x[i] = (float)(i + k);
            }
            char name[64];
            snprintf(name, sizeof name, "%s.t%d", prefix, k);
            CHECK_OK(mmp_ckpt_write(&w, name, MMP_F32, 1, &n, x));
        }
        char empty[64];
        snprintf(empty, sizeof empty, "%s.empty", prefix);
        CHECK_OK(mmp_ckpt_write(&w, empty, MMP_F32, 1, &zero, x));
        free(x);
        CHECK_OK(mmp_ckpt_writer_close(&w));
    }
    mmp_ckpt c;
    CHECK_OK(mmp_ckpt_read_dir(&c, d));
    CHECK(c.count == 70 * 3);
    int good = 0;
    for (int f = 0; f < 70; f++) {
        char name[64];
        snprintf(name, sizeof name, "s%02d.t1", f);
        good += holds(&c, name, 100 + f, 1);
        snprintf(name, sizeof name, "s%02d.empty", f);
        const mmp_ckpt_entry *e = mmp_ckpt_find(&c, name);
        char file[32];
        snprintf(file, sizeof file, "s%02d.ckpt", f);
        good += e && e->t.shape[0] == 0 && strcmp(e->file, file) == 0;
    }
    CHECK(good == 140);
    for (int i = 1; i < c.count; i++) {
        CHECK(strcmp(c.entries[i - 1].name, c.entries[i].name) < 0);
    }
    mmp_ckpt_fini(&c);
}

typedef struct prog {
    int calls, backwards, bad_unit;
    int64_t last, total;
} prog;

static void on_progress(void *ctx, const char *unit, int64_t done, int64_t total)
{
    prog *p = ctx;
    p->calls++;
    p->backwards += done < p->last || (p->total && total != p->total);
    p->bad_unit += strcmp(unit, "bytes") != 0;
    p->last = done;
    p->total = total;
}

static int64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* Writes n bytes at off (< 0: from the end of the file) of path. */
static void patch(const char *path, long off, const void *bytes, size_t n)
{
    off = off < 0 ? (long)file_size(path) + off : off;
    int fd = open(path, O_WRONLY);
    if (fd < 0) {
        CHECK(fd >= 0);
        return;
    }
    CHECK(pwrite(fd, bytes, n, off) == (ssize_t)n);
    close(fd);
}

/* Progress: after each tensor and every 64 MiB within one, never backwards,
 * ending at the directory's size. */
static void test_progress(void)
{
    const char *d = dir_of("progress");
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/a.ckpt", d);
    snprintf(b, sizeof b, "%s/b.ckpt", d);
    write_ckpt(a, "a", 5, 1000);
    const int64_t big = (int64_t)50 << 20; /* 200 MiB of floats: four pieces */
    write_ckpt(b, "b", 1, big);
    prog p = {0};
    mmp_ckpt c;
    mmp_ckpt_read_opts o = {.progress = on_progress, .progress_ctx = &p};
    CHECK_OK(mmp_ckpt_read_dir_opts(&c, d, &o));
    int64_t size = file_size(a) + file_size(b);
    CHECK(p.total == size && p.last == size);
    CHECK(p.backwards == 0 && p.bad_unit == 0);
    CHECK(p.calls >= 5 + 4 + 1); /* five tensors of a, four pieces of b, the end */
    CHECK(holds(&c, "a.t4", 1000, 4) && holds(&c, "b.t0", big, 0));
    mmp_ckpt_fini(&c);
}

static int only_a(void *ctx, const char *name)
{
    (*(int *)ctx)++;
    return strncmp(name, "a.", 2) == 0;
}

/* A selective read keeps the tensors asked for, but checks every byte of
 * every file: a corrupt tensor it does not keep still fails the read. */
static void test_select(void)
{
    const char *d = dir_of("select");
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/a.ckpt", d);
    snprintf(b, sizeof b, "%s/b.ckpt", d);
    write_ckpt(a, "a", 3, 100);
    write_ckpt(b, "b", 3, (int64_t)5 << 20); /* pieces beyond the skip's buffer */
    int asked = 0;
    prog p = {0};
    mmp_ckpt_read_opts o = {
        .want = only_a, .want_ctx = &asked, .progress = on_progress, .progress_ctx = &p};
    mmp_ckpt c;
    CHECK_OK(mmp_ckpt_read_dir_opts(&c, d, &o));
    CHECK(asked == 6 && c.count == 3 && holds(&c, "a.t2", 100, 2) && !mmp_ckpt_find(&c, "b.t0"));
    CHECK(p.last == file_size(a) + file_size(b) && p.backwards == 0);
    mmp_ckpt_fini(&c);
    unsigned char x = 0xa5; /* a byte of b.t1's data */
    patch(b, (long)(file_size(b) / 2), &x, 1);
    mmp_err e = mmp_ckpt_read_dir_opts(&c, d, &o);
    CHECK(e == MMP_ERR_DATA && strstr(mmp_last_error(), "b.ckpt: checksum mismatch") &&
          c.count == 0);
    mmp_ckpt_fini(&c);
}

/* Replaces path's bytes with buf's (a failed write is a failed check). */
static void rewrite(const char *path, const unsigned char *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    int ok = f != NULL;
    if (f) {
        ok = fwrite(buf, 1, len, f) == len;
        ok = fclose(f) == 0 && ok;
    }
    CHECK(ok);
}

/* Rewrites the footer so that a forged body passes the checksum. */
static void reseal(const char *path)
{
    size_t len = 0;
    unsigned char *buf = mmp_test_slurp(path, &len);
    if (!buf || len < 24) {
        CHECK(!"a checkpoint file to reseal");
        free(buf);
        return;
    }
    uint64_t h = mmp_xxh64(buf, len - 8);
    memcpy(buf + len - 8, &h, 8);
    rewrite(path, buf, len);
    free(buf);
}

static void expect_refused(const char *what, const char *dir, const char *reason)
{
    mmp_ckpt c;
    mmp_err e = mmp_ckpt_read_dir(&c, dir);
    int ok = e != MMP_OK && strstr(mmp_last_error(), reason) && c.count == 0 && !c.entries;
    if (!ok) {
        fprintf(stderr, "  %s: want \"%s\", got %s: %s\n", what, reason, mmp_err_name(e),
                mmp_last_error());
    }
    CHECK(ok);
    mmp_ckpt_fini(&c);
}

/* Damage of every kind, in a directory whose other file is whole (what that
 * one added must not stay behind either). Offsets: header 16 bytes; the
 * first record: u16 name length, "x.t0" (4), dtype, ndim, shape (8), nbytes
 * (8), then its data from byte 40; the trailer's count 12 bytes before the
 * end. */
static void test_damage(void)
{
    struct {
        const char *what, *reason;
        long off;      /* where to write (< 0: from the end) */
        uint64_t val;  /* what (len bytes) */
        int len, seal; /* reseal: the damage passes the checksum */
    } cases[] = {
        {"a flipped data byte", "checksum mismatch", 41, 0x5a, 1, 0},
        {"a flipped header byte", "checksum mismatch", 13, 0x7f, 1, 0},
        {"a header field forged", "header field after the version is 5, not 0", 12, 5, 4, 1},
        {"bad magic", "bad magic", 0, 'X', 1, 0},
        {"another version", "checkpoint version 9, this mmpipe reads 1 and 2", 8, 9, 4, 0},
        {"a forged shape", "shape and size disagree", 24, (uint64_t)1 << 40, 8, 1},
        {"a negative shape", "bad shape", 24, UINT64_MAX, 8, 1},
        {"a forged size", "shape and size disagree", 32, 12, 8, 1},
        {"a bad dtype", "bad record header", 22, 200, 1, 1},
        {"a flipped trailer", "checksum mismatch", -12, 3, 4, 0},
        {"more tensors than written", "2 tensors, the trailer says 3", -12, 3, 4, 1},
        {"fewer tensors than written", "2 tensors, the trailer says 1", -12, 1, 4, 1},
        {"a flipped footer", "checksum mismatch", -3, 0x11, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32], path[1200], other[1200];
        snprintf(name, sizeof name, "damage%zu", i);
        const char *d = dir_of(name);
        snprintf(path, sizeof path, "%s/x.ckpt", d);
        snprintf(other, sizeof other, "%s/a.ckpt", d); /* read first */
        write_ckpt(other, "a", 2, 10);
        write_ckpt(path, "x", 2, 10);
        patch(path, cases[i].off, &cases[i].val, (size_t)cases[i].len);
        if (cases[i].seal) {
            reseal(path);
        }
        expect_refused(cases[i].what, d, cases[i].reason);
    }
    /* cut short: within the data, and below the smallest file */
    const char *d = dir_of("cut");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.ckpt", d);
    write_ckpt(path, "x", 2, 10);
    CHECK(truncate(path, file_size(path) - 20) == 0);
    expect_refused("a file cut short", d, "checksum mismatch");
    CHECK(truncate(path, 20) == 0);
    expect_refused("a 20-byte file", d, "too short to be a checkpoint");
    /* one name in two files */
    d = dir_of("twice");
    snprintf(path, sizeof path, "%s/a.ckpt", d);
    write_ckpt(path, "x", 1, 10);
    snprintf(path, sizeof path, "%s/b.ckpt", d);
    write_ckpt(path, "x", 1, 10);
    expect_refused("a tensor in two files", d, "b.ckpt: tensor x.t0 appears twice");
    /* not a directory of checkpoints */
    expect_refused("no .ckpt files", dir_of("empty"), "no .ckpt files");
    /* a directory named like a file */
    d = dir_of("dir");
    snprintf(path, sizeof path, "%s/x.ckpt", d);
    CHECK_OK(mmp_mkdirs(path));
    expect_refused("a directory x.ckpt", d, "not a regular file");
}

/* A file is read once, into its tensors: a 192 MiB tensor reads in a child
 * whose address space has room for it once (plus 96 MiB), not for the file
 * and the tensor both, as when the whole file was read into memory first. */
static void test_memory(void)
{
#ifdef MMP_TEST_UNDER_ASAN
    fprintf(stderr, "  (memory limit part skipped: RLIMIT_AS and ASan's shadow do not mix)\n");
#else
    const char *d = dir_of("memory");
    char path[1200];
    snprintf(path, sizeof path, "%s/m.ckpt", d);
    const int64_t n = (int64_t)48 << 20;
    write_ckpt(path, "m", 1, n);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (mmp_test_limit_address_space((size_t)n * sizeof(float) + ((size_t)96 << 20)) != 0) {
            _exit(11);
        }
        int problems = 0;
        mmp_ckpt c;
        mmp_err e = mmp_ckpt_read_dir(&c, d);
        if (e != MMP_OK) {
            PROBLEM(problems, "under the limit: %s", mmp_last_error());
        } else if (!holds(&c, "m.t0", n, 0)) {
            PROBLEM(problems, "under the limit: m.t0 read wrong");
        }
        mmp_ckpt_fini(&c);
        _exit(problems ? 1 : 0);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
}

/* XXH64 (seed 0) against the reference implementation's values (python
 * xxhash 3.x: xxh64(b).hexdigest()), whole and fed in every split. */
static void test_xxh64(void)
{
    unsigned char big[1283];
    for (int i = 0; i < 1280; i++) {
        big[i] = (unsigned char)i;
    }
    memcpy(big + 1280, "xyz", 3);
    struct {
        const void *p;
        size_t n;
        uint64_t want;
    } kat[] = {
        {"", 0, 0xef46db3751d8e999ull},
        {"a", 1, 0xd24ec4f1a98c6e5bull},
        {"abc", 3, 0x44bc2cf5ad770999ull},
        {big, sizeof big, 0xafd18a3957d3670aull},
    };
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        CHECK(mmp_xxh64(kat[k].p, kat[k].n) == kat[k].want);
    }
    int bad = 0;
    for (size_t a = 0; a <= 70; a++) {
        for (size_t b = a; b <= 140; b += 7) {
            mmp_xxh64_state st;
            mmp_xxh64_init(&st);
            mmp_xxh64_update(&st, big, a);
            mmp_xxh64_update(&st, big + a, b - a);
            mmp_xxh64_update(&st, big + b, sizeof big - b);
            bad += mmp_xxh64_digest(&st) != 0xafd18a3957d3670aull;
        }
    }
    CHECK(bad == 0);
}

/* A version-1 file (header count, byte-wise FNV-1a footer), as mmpipe wrote
 * them before, still reads: made here from a version-2 file's records. */
static void test_version1(void)
{
    const char *d = dir_of("v1");
    char path[1200];
    snprintf(path, sizeof path, "%s/x.ckpt", d);
    write_ckpt(path, "x", 3, 1000);
    size_t len = 0;
    unsigned char *buf = mmp_test_slurp(path, &len);
    if (!buf || len <= 28) {
        CHECK(!"a format-2 file to rewrite");
        free(buf);
        return;
    }
    uint32_t one = 1, count = 0;
    memcpy(&count, buf + len - 12, 4);
    memcpy(buf + 8, &one, 4);
    memcpy(buf + 12, &count, 4);
    len -= 4; /* the trailer goes: records, then the footer */
    uint64_t h = mmp_fnv1a(MMP_FNV1A_INIT, buf, len - 8);
    memcpy(buf + len - 8, &h, 8);
    rewrite(path, buf, len);
    free(buf);
    mmp_ckpt c;
    CHECK_OK(mmp_ckpt_read_dir(&c, d));
    CHECK(c.count == 3 && holds(&c, "x.t0", 1000, 0) && holds(&c, "x.t2", 1000, 2));
    mmp_ckpt_fini(&c);
    unsigned char x = 0x42; /* its FNV-1a still guards it */
    patch(path, 100, &x, 1);
    expect_refused("a damaged version-1 file", d, "checksum mismatch");
}

/* A step without files.txt: one written before mmpipe listed a step's files
 * (its train.ckpt says nothing of one) is read as before, listed 0; one
 * whose train.ckpt says it was written with one (meta.files_listed) has
 * lost it, and is refused. */
static void test_file_list_legacy(void)
{
    const char *d = dir_of("legacy");
    char path[1200];
    snprintf(path, sizeof path, "%s/image.ckpt", d);
    write_ckpt(path, "image", 2, 10);
    snprintf(path, sizeof path, "%s/train.ckpt", d);
    mmp_ckpt_writer w;
    int64_t one = 1;
    int32_t step = 3, listed = 1;
    CHECK_OK(mmp_ckpt_writer_open(&w, path));
    CHECK_OK(mmp_ckpt_write(&w, "meta.step", MMP_I32, 1, &one, &step));
    CHECK_OK(mmp_ckpt_writer_close(&w));
    int got = -1;
    CHECK_OK(mmp_ckpt_check_files(d, &got));
    CHECK(got == 0);
    CHECK_OK(mmp_ckpt_writer_open(&w, path));
    CHECK_OK(mmp_ckpt_write(&w, "meta.step", MMP_I32, 1, &one, &step));
    CHECK_OK(mmp_ckpt_write(&w, "meta.files_listed", MMP_I32, 1, &one, &listed));
    CHECK_OK(mmp_ckpt_writer_close(&w));
    CHECK(mmp_ckpt_check_files(d, &got) == MMP_ERR_DATA &&
          strstr(mmp_last_error(), "files.txt is missing, and train.ckpt says"));
    expect_refused("a lost files.txt", d, "files.txt is missing, and train.ckpt says");
}

int main(void)
{
    test_xxh64();
    test_version1();
    test_many_files();
    test_progress();
    test_select();
    test_damage();
    test_memory();
    test_file_list_legacy();
    return mmp_test_finish("test_ckpt");
}
