/* common/fsutil: a whole-file read ends in a NUL and fails with the
 * caller's code for a bad path; tree removal takes any bytes as a path and never follows a
 * symlink; the run lock refuses a second holder naming its pid and is free
 * again once the holder is gone. Also the fingerprint's key selection. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static const mmp_test_case cases[] = {
    {"test_rmtree", test_rmtree_case},
    {"test_lock", test_lock_case},
    {"test_read_file", test_read_file_case},
    MMP_TEST_CASE(test_fingerprint_keys),
};

int main(int argc, char **argv)
{
    tmp = mmp_test_tmpdir("test_fsutil");
    return MMP_TEST_MAIN("test_fsutil", cases, argc, argv);
}
