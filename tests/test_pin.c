/* CPU pinning (common/pin.h, plan key train.pin): the core rule (process k
 * on list[(k * threads + j) % n]), pinning every thread of a process
 * (threads started before and after the call), the kernel's refusal named,
 * and the plan key: off / auto / a list, written to plan.json and read
 * back, bad core ids named with file:line:column. */
#include "common/pin.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/config.h"
#include "tests/harness.h"

static void test_pick(void)
{
    const int list[3] = {4, 5, 6};
    int out[8];
    const int one[5] = {4, 5, 6, 4, 5};
    for (int k = 0; k < 5; k++) {
        CHECK(mmp_pin_pick(list, 3, k, 1, out) == 1 && out[0] == one[k]);
    }
    /* two threads: process 0 on 4,5, process 1 on 6,4 */
    CHECK(mmp_pin_pick(list, 3, 0, 2, out) == 2 && out[0] == 4 && out[1] == 5);
    CHECK(mmp_pin_pick(list, 3, 1, 2, out) == 2 && out[0] == 6 && out[1] == 4);
    /* more threads than cores: every core once */
    CHECK(mmp_pin_pick(list, 3, 0, 5, out) == 3 && out[0] == 4 && out[1] == 5 && out[2] == 6);
    CHECK(mmp_pin_pick(list, 0, 0, 1, out) == 0);
    char buf[32];
    CHECK(strcmp(mmp_pin_format(list, 3, buf, sizeof buf), "4,5,6") == 0);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int go;

static void *waiter(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!go) {
        pthread_cond_wait(&cv, &mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void *nothing(void *arg)
{
    return arg;
}

/* Whether thread t runs on exactly core c. */
static int only_on(pthread_t t, int c)
{
    cpu_set_t set;
    if (pthread_getaffinity_np(t, sizeof set, &set) != 0) {
        return 0;
    }
    return CPU_COUNT(&set) == 1 && CPU_ISSET(c, &set);
}

/* In a child (pinning is for the whole process): a thread started before
 * the call is pinned too, and so is one started after. */
static void test_pin_threads(void)
{
    int allowed[MMP_PIN_MAX_CORES];
    int n = mmp_pin_allowed(allowed, MMP_PIN_MAX_CORES);
    CHECK(n >= 1);
    if (n < 1) {
        return; /* allowed[n - 1] would be out of bounds */
    }
    int core = allowed[n - 1];
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        pthread_t before, after;
        if (pthread_create(&before, NULL, waiter, NULL) != 0) {
            _exit(2);
        }
        if (mmp_pin_self(&core, 1) != MMP_OK) {
            PROBLEM(bad, "pin to core %d: %s", core, mmp_last_error());
        }
        if (!only_on(pthread_self(), core)) {
            PROBLEM(bad, "the calling thread is not on core %d alone", core);
        }
        if (!only_on(before, core)) {
            PROBLEM(bad, "a thread started before the call is not on core %d alone", core);
        }
        pthread_create(&after, NULL, nothing, NULL);
        if (!only_on(after, core)) {
            PROBLEM(bad, "a thread started after the call is not on core %d alone", core);
        }
        pthread_join(after, NULL);
        pthread_mutex_lock(&mu);
        go = 1;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
        pthread_join(before, NULL);
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* the parent was not touched */
    int again[MMP_PIN_MAX_CORES];
    CHECK(mmp_pin_allowed(again, MMP_PIN_MAX_CORES) == n);
}

static void test_refused(void)
{
    int allowed[MMP_PIN_MAX_CORES];
    int n = mmp_pin_allowed(allowed, MMP_PIN_MAX_CORES);
    if (allowed[n - 1] >= MMP_PIN_MAX_CORES - 1) {
        return; /* a machine with every core id: nothing to refuse */
    }
    pid_t pid = fork();
    if (pid == 0) {
        int core = MMP_PIN_MAX_CORES - 1;
        mmp_err e = mmp_pin_self(&core, 1);
        int ok = e == MMP_ERR_INVALID && strstr(mmp_last_error(), "train.pin: cores 1023") != NULL;
        if (!ok) {
            fprintf(stderr, "  got %s: %s\n", mmp_err_name(e), mmp_last_error());
        }
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_plan_key(void)
{
    const char *dir = mmp_test_tmpdir("test_pin");
    char path[1024], json[1024];
    snprintf(path, sizeof path, "%s/plan.yaml", dir);
    snprintf(json, sizeof json, "%s/plan.json", dir);
    int allowed[MMP_PIN_MAX_CORES];
    int n = mmp_pin_allowed(allowed, MMP_PIN_MAX_CORES);
    mmp_plan p, q;

    CHECK(mmp_test_write_text(path, "data: { manifest: m.jsonl }\n"));
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    CHECK(p.train.pin.mode == MMP_PIN_OFF);
    int list[MMP_PIN_MAX_CORES];
    CHECK(mmp_pin_list(&p, list) == 0);

    const char *auto_set[] = {"train.pin=auto"};
    CHECK_OK(mmp_plan_load(&p, path, auto_set, 1));
    CHECK(p.train.pin.mode == MMP_PIN_AUTO && mmp_pin_list(&p, list) == n);

    char text[256];
    snprintf(text, sizeof text, "data: { manifest: m.jsonl }\ntrain:\n  pin: [%d]\n",
             allowed[n - 1]);
    CHECK(mmp_test_write_text(path, text));
    CHECK_OK(mmp_plan_load(&p, path, NULL, 0));
    CHECK(p.train.pin.mode == MMP_PIN_LIST && p.train.pin.n_cores == 1 &&
          p.train.pin.cores[0] == allowed[n - 1]);
    CHECK_OK(mmp_plan_write_json(&p, json));
    CHECK_OK(mmp_plan_load(&q, json, NULL, 0));
    CHECK(q.train.pin.mode == MMP_PIN_LIST && q.train.pin.n_cores == 1 &&
          q.train.pin.cores[0] == allowed[n - 1]);

    /* bad core ids, each at its place */
    struct {
        const char *pin, *want;
    } bad[] = {
        {"[0, 1023]", ":3:12: train.pin[1]: core 1023 is not one this machine lets mmpipe use"},
        {"[-1]", ":3:9: train.pin[0]: -1 is out of range [0, 1023]"},
        {"[0, 0]", ":3:12: train.pin[1]: core 0 is already train.pin[0]"},
        {"many", ":3:8: train.pin: expected off, auto or a list of core ids, got 'many'"},
        {"[]", ":3:8: train.pin"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (i == 0 && allowed[n - 1] == 1023) {
            continue;
        }
        if (i == 2 && allowed[0] != 0) {
            continue; /* core 0 not ours: the first entry fails already */
        }
        snprintf(text, sizeof text, "data: { manifest: m.jsonl }\ntrain:\n  pin: %s\n", bad[i].pin);
        CHECK(mmp_test_write_text(path, text));
        mmp_err e = mmp_plan_load(&p, path, NULL, 0);
        CHECK(e == MMP_ERR_CONFIG && strstr(mmp_last_error(), bad[i].want) != NULL);
        if (e != MMP_ERR_CONFIG || !strstr(mmp_last_error(), bad[i].want)) {
            fprintf(stderr, "  %s: got '%s'\n", bad[i].pin, mmp_last_error());
        }
    }
}

MMP_TEST_LIST("test_pin", MMP_TEST_CASE(test_pick), MMP_TEST_CASE(test_pin_threads),
              MMP_TEST_CASE(test_refused), MMP_TEST_CASE(test_plan_key))
