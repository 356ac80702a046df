/* SLURM hostlist expansion (common/hostlist.h) from a table of lists and the
 * names scontrol show hostnames prints for them, malformed lists with the
 * column they must name, and the allocation's environment (SLURM_* and
 * CUDA_VISIBLE_DEVICES) read through a fake getenv. */
#include "common/hostlist.h"

#include <stdio.h>
#include <string.h>

#include "tests/harness.h"

static const struct {
    const char *list, *want; /* want: the names joined by spaces */
} good[] = {
    {"node1", "node1"},
    {"a,b", "a b"},
    {"gpu[01-04,07]", "gpu01 gpu02 gpu03 gpu04 gpu07"},
    {"n[1-3]-ib", "n1-ib n2-ib n3-ib"},
    {"n[8-11]", "n8 n9 n10 n11"},
    {"n[008-010]", "n008 n009 n010"},
    {"r[1-2]-n[01-02]", "r1-n01 r1-n02 r2-n01 r2-n02"},
    {"gpu[01-02],cpu[7],login.cluster", "gpu01 gpu02 cpu7 login.cluster"},
    {"x[3,1]", "x3 x1"},
    {"a_b-c.d[0]", "a_b-c.d0"},
};

static const struct {
    const char *list, *why; /* why: a part of the message */
} malformed[] = {
    {"", "empty"},
    {"gpu[01-04", "column 4: '[' without ']'"},
    {"gpu]", "column 4: ']' without '['"},
    {"gpu[]", "column 4: empty brackets"},
    {"gpu[4-1]", "column 5: range end below its start"},
    {"gpu[a-b]", "column 5: expected a number"},
    {"gpu[1-]", "column 7: expected a number after '-'"},
    {"gpu[1,]", "empty range after ','"},
    {"a,,b", "column 3: empty item"},
    {"a,", "empty item after ','"},
    {"a b", "column 2: character not allowed"},
    {"a;rm", "column 2: character not allowed"},
    {"n[[1]]", "nested '['"},
    {"n[1-100000]", "more than 64 hosts"},
    {"n[1234567890]", "at most 9 digits"},
};

static void test_expand_table(void)
{
    static char names[64][MMP_HOSTLIST_NAME_MAX];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int n = -1;
        char joined[1024] = "";
        CHECK_OK(mmp_hostlist_expand(good[i].list, names, 64, &n));
        for (int k = 0; k < n; k++) {
            strncat(joined, k ? " " : "", sizeof joined - strlen(joined) - 1);
            strncat(joined, names[k], sizeof joined - strlen(joined) - 1);
        }
        CHECK(strcmp(joined, good[i].want) == 0);
        if (strcmp(joined, good[i].want) != 0) {
            fprintf(stderr, "  '%s': got '%s', want '%s'\n", good[i].list, joined, good[i].want);
        }
    }
}

static void test_malformed_table(void)
{
    static char names[64][MMP_HOSTLIST_NAME_MAX];
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        int n = -1;
        CHECK(mmp_hostlist_expand(malformed[i].list, names, 64, &n) == MMP_ERR_INVALID);
        CHECK(n == 0);
        CHECK(strstr(mmp_last_error(), malformed[i].why) != NULL);
        if (!strstr(mmp_last_error(), malformed[i].why)) {
            fprintf(stderr, "  '%s': got '%s', want '%s'\n", malformed[i].list, mmp_last_error(),
                    malformed[i].why);
        }
    }
    /* a name longer than the limit */
    char lng[300];
    memset(lng, 'a', sizeof lng - 1);
    lng[sizeof lng - 1] = 0;
    int n;
    CHECK(mmp_hostlist_expand(lng, names, 64, &n) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "too long") != NULL);
}

/* A fake environment: pairs of name, value. */
static const char *const *fake_env;
static const char *fake_getenv(const char *name)
{
    for (int i = 0; fake_env[i]; i += 2) {
        if (strcmp(fake_env[i], name) == 0) {
            return fake_env[i + 1];
        }
    }
    return NULL;
}

static void test_slurm_env(void)
{
    mmp_slurm_env s;
    static const char *const none[] = {NULL};
    fake_env = none;
    CHECK(mmp_hostlist_from_slurm(&s, fake_getenv) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "not inside a SLURM allocation") != NULL);

    static const char *const gpus[] = {"SLURM_JOB_NODELIST",
                                       "gpu[01-02]",
                                       "SLURM_JOB_ID",
                                       "4711",
                                       "SLURM_GPUS_ON_NODE",
                                       "4",
                                       NULL};
    fake_env = gpus;
    CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
    CHECK(s.n_nodes == 2 && strcmp(s.nodes[1], "gpu02") == 0);
    CHECK(s.gpus == 4 && s.gpu[3] == 3 && strcmp(s.job_id, "4711") == 0 && s.cpu_slots == 1);

    static const char *const cvd[] = {"SLURM_JOB_NODELIST",
                                      "a,b",
                                      "CUDA_VISIBLE_DEVICES",
                                      "2,3",
                                      "SLURM_NTASKS_PER_NODE",
                                      "3(x2)",
                                      NULL};
    fake_env = cvd;
    CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
    /* the stages inherit the variable: CUDA shows them physical 2 and 3 as 0 and 1 */
    CHECK(s.gpus == 2 && s.gpu[0] == 0 && s.gpu[1] == 1 && s.cpu_slots == 3);
    static const char *const uuids[] = {
        "SLURM_JOB_NODELIST", "a", "CUDA_VISIBLE_DEVICES",
        "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0",
        NULL};
    fake_env = uuids;
    CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
    CHECK(s.gpus == 2 && s.gpu[0] == 0 && s.gpu[1] == 1);
    static const char *const nodev[] = {"SLURM_JOB_NODELIST",
                                        "a",
                                        "CUDA_VISIBLE_DEVICES",
                                        "NoDevFiles",
                                        "SLURM_NTASKS_PER_NODE",
                                        "2",
                                        NULL};
    fake_env = nodev;
    CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
    CHECK(s.gpus == 0 && s.cpu_slots == 2);

    static const char *const cpu[] = {"SLURM_JOB_NODELIST", "c[1-3]", NULL};
    fake_env = cpu;
    CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
    CHECK(s.n_nodes == 3 && s.gpus == 0 && s.cpu_slots == 1 && s.job_id[0] == 0);

    static const char *const bad_list[] = {"SLURM_JOB_NODELIST", "c[1-", NULL};
    fake_env = bad_list;
    CHECK(mmp_hostlist_from_slurm(&s, fake_getenv) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "SLURM_JOB_NODELIST") != NULL);
    static const char *const bad_gpus[] = {"SLURM_JOB_NODELIST", "c1", "SLURM_GPUS_ON_NODE", "four",
                                           NULL};
    fake_env = bad_gpus;
    CHECK(mmp_hostlist_from_slurm(&s, fake_getenv) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "SLURM_GPUS_ON_NODE") != NULL);
    static const char *const uuid[] = {"SLURM_JOB_NODELIST", "c1", "CUDA_VISIBLE_DEVICES",
                                       "0,GPU-12x4", NULL};
    fake_env = uuid;
    CHECK(mmp_hostlist_from_slurm(&s, fake_getenv) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "CUDA_VISIBLE_DEVICES") != NULL);
}

/* An salloc shell on the login node: SLURM sets the request
 * (SLURM_GPUS_PER_NODE, as --gpus-per-node gave it) and neither
 * SLURM_GPUS_ON_NODE nor CUDA_VISIBLE_DEVICES (seen with slurm-wlm 22.05,
 * tests/cli_slurm.sh); a node's own count wins where there is one. */
static void test_slurm_login_shell(void)
{
    mmp_slurm_env s;
    static const struct {
        const char *value;
        int gpus; /* -1: refused, naming the variable */
    } req[] = {{"2", 2},      {"a100:2", 2},  {"gpu:a100:1,v100:3", 4}, {"0", 0},  {"a100:", -1},
               {"2,", -1},    {"", 0},        {"a1 00:2", -1},          {":2", 2}, {"two", -1},
               {"99999", -1}, {"a100:1,", -1}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        const char *env[] = {"SLURM_JOB_NODELIST", "n[1-2]", "SLURM_GPUS_PER_NODE", req[i].value,
                             NULL};
        fake_env = env;
        mmp_err e = mmp_hostlist_from_slurm(&s, fake_getenv);
        if (req[i].gpus < 0) {
            CHECK(e == MMP_ERR_INVALID && strstr(mmp_last_error(), "SLURM_GPUS_PER_NODE"));
        } else {
            CHECK(e == MMP_OK && s.gpus == req[i].gpus && s.n_nodes == 2);
            CHECK(s.gpus == 0 || s.gpu[s.gpus - 1] == s.gpus - 1);
        }
        if ((e == MMP_OK) != (req[i].gpus >= 0)) {
            fprintf(stderr, "  SLURM_GPUS_PER_NODE='%s': %s\n", req[i].value,
                    e == MMP_OK ? "taken" : mmp_last_error());
        }
    }
    static const char *const both[] = {
        "SLURM_JOB_NODELIST", "n1", "SLURM_GPUS_ON_NODE", "4", "SLURM_GPUS_PER_NODE", "2", NULL};
    fake_env = both;
    CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
    CHECK(s.gpus == 4);
    /* GPUs asked for with no per-node count here: refused, not cpu slots */
    static const char *const asked[] = {"SLURM_GPUS", "SLURM_GPUS_PER_TASK",
                                        "SLURM_GPUS_PER_SOCKET"};
    for (size_t i = 0; i < sizeof asked / sizeof asked[0]; i++) {
        const char *env[] = {"SLURM_JOB_NODELIST", "n[1-2]", asked[i], "2", NULL};
        fake_env = env;
        CHECK(mmp_hostlist_from_slurm(&s, fake_getenv) == MMP_ERR_INVALID);
        CHECK(strstr(mmp_last_error(), asked[i]) && strstr(mmp_last_error(), "--gpus-per-node"));
        const char *with_count[] = {"SLURM_JOB_NODELIST",  "n[1-2]", asked[i], "2",
                                    "SLURM_GPUS_PER_NODE", "1",      NULL};
        fake_env = with_count;
        CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
        CHECK(s.gpus == 1);
    }
    static const char *const zero[] = {"SLURM_JOB_NODELIST", "n1", "SLURM_GPUS", "0", NULL};
    fake_env = zero;
    CHECK_OK(mmp_hostlist_from_slurm(&s, fake_getenv));
    CHECK(s.gpus == 0 && s.cpu_slots == 1);
}

MMP_TEST_LIST("test_hostlist", MMP_TEST_CASE(test_expand_table),
              MMP_TEST_CASE(test_malformed_table), MMP_TEST_CASE(test_slurm_env),
              MMP_TEST_CASE(test_slurm_login_shell))
