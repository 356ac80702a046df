/* common/fsutil: a whole-file read ends in a NUL and fails with the
 * caller's code for a bad path; an atomic file replaces PATH only on a
 * commit that succeeds, and leaves the old PATH and no PATH.tmp after an
 * abort or any failure (open, a write past RLIMIT_FSIZE or to a full disk,
 * the rename), with an error naming the file and errno's text; tree removal takes any bytes as a
 * path and never follows a symlink; the run lock refuses a second holder naming its pid and is free
 * again once the holder is gone. Also the fingerprint's key selection. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fingerprint.h"
#include "common/fsutil.h"
#include "tests/harness.h"

static void touch(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        close(fd);
    }
}

static void test_rmtree(const char *tmp)
{
    char keep[1200], tree[1200], p[1400];
    snprintf(keep, sizeof keep, "%s/keep", tmp);
    mkdir(keep, 0755);
    snprintf(p, sizeof p, "%s/file", keep);
    touch(p);
    /* quotes, spaces, a newline and a leading dash in one name */
    snprintf(tree, sizeof tree, "%s/-it's \"a\"\ntree", tmp);
    CHECK(mkdir(tree, 0755) == 0);
    snprintf(p, sizeof p, "%s/sub", tree);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/sub/f", tree);
    touch(p);
    snprintf(p, sizeof p, "%s/link", tree); /* a symlink into keep: removed, not followed */
    CHECK(symlink(keep, p) == 0);
    CHECK_OK(mmp_fs_rmtree(tree));
    struct stat st;
    CHECK(lstat(tree, &st) != 0 && errno == ENOENT);
    snprintf(p, sizeof p, "%s/file", keep);
    CHECK(stat(p, &st) == 0);
    CHECK_OK(mmp_fs_rmtree(tree)); /* absent: not an error */
    CHECK_OK(mmp_fs_rmtree(p));    /* a plain file */
    CHECK(stat(p, &st) != 0);
}

static void test_lock(const char *tmp)
{
    mmp_run_lock a = {0}, b = {0};
    pid_t holder = -1;
    mmp_run_unlock(&a); /* zeroed: a no-op */
    CHECK_OK(mmp_run_lock_take(&a, tmp, &holder));
    mmp_run_unlock(&a);
    mmp_run_unlock(&a);

    int ready[2] = {-1, -1}, go[2] = {-1, -1};
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    if (ready[0] < 0 || go[0] < 0) {
        return; /* no pipes: the child could not report */
    }
    pid_t child = fork();
    if (child == 0) {
        mmp_run_lock l = {0};
        pid_t h;
        char c = mmp_run_lock_take(&l, tmp, &h) == MMP_OK ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) {
            _exit(1);
        }
        _exit(0); /* dies holding it */
    }
    char c = 0;
    CHECK(read(ready[0], &c, 1) == 1 && c == 'y');
    CHECK(mmp_run_lock_take(&b, tmp, &holder) == MMP_ERR_IO);
    CHECK(holder == child);
    char want[64];
    snprintf(want, sizeof want, "pid %d", (int)child);
    CHECK(strstr(mmp_last_error(), want) != NULL);
    CHECK(write(go[1], "x", 1) == 1);
    waitpid(child, NULL, 0);
    CHECK_OK(mmp_run_lock_take(&b, tmp, &holder)); /* the dead holder's lock is gone */
    mmp_run_unlock(&b);
    close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);

    char missing[1200];
    snprintf(missing, sizeof missing, "%s/no/such/dir", tmp);
    CHECK(mmp_run_lock_take(&b, missing, &holder) == MMP_ERR_IO && holder == 0);
    mmp_run_unlock(&b);
}

static void test_read_file(const char *tmp)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/text", tmp);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (!f) {
        return;
    }
    fputs("ab\ncd", f);
    fclose(f);
    unsigned char *buf = NULL;
    size_t len = 0;
    CHECK_OK(mmp_fs_read_file(p, MMP_ERR_IO, SIZE_MAX, &buf, &len));
    CHECK(buf && len == 5 && memcmp(buf, "ab\ncd", 6) == 0); /* NUL after the bytes */
    free(buf);
    CHECK(mmp_fs_read_file(p, MMP_ERR_IO, 4, &buf, &len) == MMP_ERR_DATA && !buf && len == 0);
    CHECK_OK(mmp_fs_read_file(p, MMP_ERR_IO, 5, &buf, &len));
    free(buf);
    /* the caller's code for a bad path: missing, or not a regular file */
    snprintf(p, sizeof p, "%s/missing", tmp);
    CHECK(mmp_fs_read_file(p, MMP_ERR_DATA, SIZE_MAX, &buf, &len) == MMP_ERR_DATA && !buf);
    CHECK(strstr(mmp_last_error(), p) != NULL);
    CHECK(mmp_fs_read_file(p, MMP_ERR_IO, SIZE_MAX, &buf, &len) == MMP_ERR_IO && !buf);
    CHECK(mmp_fs_read_file(tmp, MMP_ERR_DATA, SIZE_MAX, &buf, &len) == MMP_ERR_DATA && !buf);
    CHECK(strstr(mmp_last_error(), "not a regular file") != NULL);
}

/* path's whole contents into buf (at most n - 1 bytes); "" when unreadable. */
static const char *contents(const char *path, char *buf, size_t n)
{
    buf[0] = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        size_t got = fread(buf, 1, n - 1, f);
        buf[got] = 0;
        fclose(f);
    }
    return buf;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* <tmp>/atomic/<name>, holding "old", with no <name>.tmp beside it. */
static void old_file(const char *tmp, const char *name, char *path, size_t n, char *tmp_path,
                     size_t tn)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/atomic", tmp);
    mkdir(dir, 0755);
    snprintf(path, n, "%s/%s", dir, name);
    snprintf(tmp_path, tn, "%s.tmp", path);
    unlink(tmp_path);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs("old", f);
        fclose(f);
    }
}

static void test_atomic_commit(const char *tmp)
{
    char path[1300], tp[1400], buf[64];
    for (unsigned flags = 0; flags <= MMP_ATOMIC_DURABLE; flags++) {
        old_file(tmp, flags ? "durable" : "plain", path, sizeof path, tp, sizeof tp);
        int reader = open(path, O_RDONLY); /* a reader of the old file keeps it whole */
        mmp_atomic_file a;
        CHECK_OK(mmp_atomic_open(&a, path, flags));
        CHECK(a.f != NULL && strcmp(a.path, path) == 0 && strcmp(a.tmp, tp) == 0);
        if (!a.f) {
            continue;
        }
        long want = 0;
        for (int i = 0; i < 5000; i++) { /* several stdio buffers */
            want += fprintf(a.f, "new %d\n", i);
        }
        CHECK(strcmp(contents(path, buf, sizeof buf), "old") == 0); /* nothing until commit */
        CHECK(exists(tp));
        CHECK_OK(mmp_atomic_commit(&a));
        CHECK(a.f == NULL && !exists(tp));
        CHECK(strncmp(contents(path, buf, sizeof buf), "new 0\nnew 1\n", 12) == 0);
        struct stat st;
        CHECK(stat(path, &st) == 0 && st.st_size == want);
        char got[8] = {0};
        CHECK(reader >= 0 && read(reader, got, sizeof got - 1) == 3 && strcmp(got, "old") == 0);
        if (reader >= 0) {
            close(reader);
        }
        mmp_atomic_abort(&a); /* after a commit: a no-op, PATH stays */
        CHECK(exists(path));
    }
    /* A stale PATH.tmp (a writer killed before its commit) is truncated, not appended to. */
    old_file(tmp, "stale", path, sizeof path, tp, sizeof tp);
    FILE *f = fopen(tp, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs("a killed writer's long partial file", f);
        fclose(f);
    }
    mmp_atomic_file a;
    CHECK_OK(mmp_atomic_open(&a, path, 0));
    if (a.f) {
        fputs("fresh", a.f);
        CHECK_OK(mmp_atomic_commit(&a));
    }
    CHECK(strcmp(contents(path, buf, sizeof buf), "fresh") == 0 && !exists(tp));
    CHECK_OK(mmp_fs_sync_dir(tmp));
}

static void test_atomic_abort(const char *tmp)
{
    char path[1300], tp[1400], buf[64];
    mmp_atomic_file z = {0};
    mmp_atomic_abort(&z); /* zeroed: a no-op */
    mmp_atomic_abort(NULL);
    old_file(tmp, "abort", path, sizeof path, tp, sizeof tp);
    mmp_atomic_file a;
    CHECK_OK(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE));
    if (a.f) {
        fputs("new", a.f);
        fflush(a.f);
    }
    CHECK(exists(tp));
    mmp_atomic_abort(&a);
    mmp_atomic_abort(&a); /* idempotent */
    CHECK(a.f == NULL && !exists(tp));
    CHECK(strcmp(contents(path, buf, sizeof buf), "old") == 0);
}

/* A failed commit: MMP_ERR_IO naming want (and PATH.tmp), PATH still "old", no PATH.tmp. */
static void check_failed(mmp_err e, const char *path, const char *tp, const char *want)
{
    char buf[64];
    CHECK(e == MMP_ERR_IO);
    CHECK(strstr(mmp_last_error(), tp) != NULL);
    CHECK(strstr(mmp_last_error(), want) != NULL);
    if (e != MMP_ERR_IO || !strstr(mmp_last_error(), want)) {
        fprintf(stderr, "  error: '%s' (wanted '%s')\n", mmp_last_error(), want);
    }
    CHECK(!exists(tp));
    CHECK(strcmp(contents(path, buf, sizeof buf), "old") == 0);
}

static void test_atomic_failures(const char *tmp)
{
    char path[1300], tp[1400];
    mmp_atomic_file a;

    /* Writes past a file size limit (a full disk's stand-in that works for
     * root too): SIGXFSZ ignored, so write() fails with EFBIG inside stdio,
     * where the caller does not look. Small writes (the last buffer is still
     * there for the commit's flush to fail on), then one large fwrite (it
     * bypasses the buffer: only the stream's error flag remembers it). The
     * limit is lifted before any check. */
    static char block[1 << 16];
    struct rlimit old_lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    for (int big = 0; big < 2; big++) {
        old_file(tmp, big ? "fsize_block" : "fsize_lines", path, sizeof path, tp, sizeof tp);
        void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
        CHECK_OK(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE));
        mmp_err e = MMP_OK;
        if (a.f) {
            struct rlimit lim = {.rlim_cur = 10000, .rlim_max = old_lim.rlim_max};
            int limited = setrlimit(RLIMIT_FSIZE, &lim) == 0;
            if (big) {
                fwrite(block, 1, sizeof block, a.f);
            } else {
                for (int i = 0; i < 3000; i++) {
                    fprintf(a.f, "line %d\n", i);
                }
            }
            e = mmp_atomic_commit(&a);
            CHECK(limited && setrlimit(RLIMIT_FSIZE, &old_lim) == 0);
        }
        signal(SIGXFSZ, old_sig);
        check_failed(e, path, tp, strerror(EFBIG));
    }

    /* A full disk: PATH.tmp is /dev/full. */
    old_file(tmp, "full", path, sizeof path, tp, sizeof tp);
    if (access("/dev/full", W_OK) == 0 && symlink("/dev/full", tp) == 0) {
        CHECK_OK(mmp_atomic_open(&a, path, 0));
        if (a.f) {
            fputs("new", a.f); /* stays in the buffer: the commit's flush fails */
            check_failed(mmp_atomic_commit(&a), path, tp, strerror(ENOSPC));
        }
    } else {
        printf("skip: no /dev/full\n");
    }

    /* The rename fails: a directory stands at PATH. */
    old_file(tmp, "dir_at_path", path, sizeof path, tp, sizeof tp);
    unlink(path);
    char inside[1400];
    snprintf(inside, sizeof inside, "%s/in_the_way", path);
    CHECK(mkdir(path, 0755) == 0 && mkdir(inside, 0755) == 0);
    CHECK_OK(mmp_atomic_open(&a, path, MMP_ATOMIC_DURABLE));
    if (a.f) {
        fputs("new", a.f);
        mmp_err e = mmp_atomic_commit(&a);
        CHECK(e == MMP_ERR_IO && strstr(mmp_last_error(), "rename ") != NULL);
        CHECK(strstr(mmp_last_error(), tp) != NULL && !exists(tp) && exists(inside));
    }

    /* The open fails: PATH's directory is missing. Nothing is created. */
    snprintf(path, sizeof path, "%s/atomic/no/such/dir/file", tmp);
    snprintf(tp, sizeof tp, "%s.tmp", path);
    CHECK(mmp_atomic_open(&a, path, 0) == MMP_ERR_IO && a.f == NULL);
    CHECK(strstr(mmp_last_error(), tp) != NULL);
    CHECK(strstr(mmp_last_error(), strerror(ENOENT)) != NULL);
    mmp_atomic_abort(&a); /* valid after a failed open */
    CHECK(mmp_fs_sync_dir(path) == MMP_ERR_IO && strstr(mmp_last_error(), path) != NULL);

    /* A path longer than the struct holds is refused by name, not cut short. */
    static char longp[MMP_ATOMIC_PATH_MAX + 100];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    CHECK(mmp_atomic_open(&a, longp, 0) == MMP_ERR_IO && a.f == NULL);
    CHECK(strstr(mmp_last_error(), "path too long") != NULL);
}

static void test_fingerprint_keys(void)
{
    CHECK(mmp_fingerprint_has("model.text.heads"));
    CHECK(mmp_fingerprint_has("model.image.channels"));
    CHECK(mmp_fingerprint_has("job.seed") && mmp_fingerprint_has("train.batch"));
    CHECK(mmp_fingerprint_has("data.manifest") && mmp_fingerprint_has("data.augment"));
    CHECK(!mmp_fingerprint_has("job.steps"));
    CHECK(!mmp_fingerprint_has("train.microbatches") && !mmp_fingerprint_has("train.batches"));
    CHECK(!mmp_fingerprint_has("stages.image.split") && !mmp_fingerprint_has("data.on_bad_sample"));
    mmp_plan p;
    mmp_plan_defaults(&p);
    char text[8192];
    CHECK_OK(mmp_fingerprint_text(&p, text, sizeof text));
    CHECK(strstr(text, "model.text.heads=4\n") != NULL);
    CHECK(strstr(text, "job.seed=1\n") != NULL);
    CHECK(strstr(text, "job.steps") == NULL);
    CHECK(mmp_fingerprint_text(&p, text, 16) == MMP_ERR_INVALID);
}

static const char *tmp;

static void test_rmtree_case(void)
{
    test_rmtree(tmp);
}

static void test_lock_case(void)
{
    test_lock(tmp);
}

static void test_read_file_case(void)
{
    test_read_file(tmp);
}

static void test_atomic_commit_case(void)
{
    test_atomic_commit(tmp);
}

static void test_atomic_abort_case(void)
{
    test_atomic_abort(tmp);
}

static void test_atomic_failures_case(void)
{
    test_atomic_failures(tmp);
}

static const mmp_test_case cases[] = {
    {"test_rmtree", test_rmtree_case},
    {"test_lock", test_lock_case},
    {"test_read_file", test_read_file_case},
    {"test_atomic_commit", test_atomic_commit_case},
    {"test_atomic_abort", test_atomic_abort_case},
    {"test_atomic_failures", test_atomic_failures_case},
    MMP_TEST_CASE(test_fingerprint_keys),
};

int main(int argc, char **argv)
{
    tmp = mmp_test_tmpdir("test_fsutil");
    return MMP_TEST_MAIN("test_fsutil", cases, argc, argv);
}
