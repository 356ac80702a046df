/* The stall watchdog: quiet while every awaited stage reported within the
 * timeout or the watchdog is off; when the job stalls, it names a stopped
 * process (SIGSTOP) before the stage silent the longest. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coordinator/watchdog.h"
#include "tests/harness.h"

static void test_stall(void)
{
    pid_t child = fork();
    if (child == 0) {
        for (;;) {
            pause();
        }
    }
    CHECK(child > 0);
    char why[512];
    mmp_watch_proc p[3] = {
        {.name = "image.0/0", .pid = (int)getpid(), .alive = 1, .awaited = 1, .last_seen = 95},
        {.name = "text.0/0", .pid = (int)child, .alive = 1, .awaited = 0, .last_seen = 96},
        {.name = "fusion/0", .pid = (int)getpid(), .alive = 1, .awaited = 1, .last_seen = 90},
    };
    CHECK(mmp_watchdog_check(p, 3, 100, 20, "results", "train.stall_timeout", why, sizeof why) ==
          -1);
    CHECK(mmp_watchdog_check(p, 3, 200, 0, "results", "train.stall_timeout", why, sizeof why) ==
          -1); /* off */
    /* stalled, nobody stopped: the awaited stage silent the longest */
    CHECK(mmp_watchdog_check(p, 3, 200, 20, "results", "train.stall_timeout", why, sizeof why) ==
          2);
    CHECK(strstr(why, "fusion/0") && strstr(why, "no progress for 110 s") &&
          strstr(why, "waiting for results") && strstr(why, "train.stall_timeout is 20 s") &&
          !strstr(why, "last reported"));
    /* what the blamed stage last reported doing, and the limit's name */
    p[2].doing = "manifest /d/train.jsonl: 8.2k of 64.0k lines";
    CHECK(mmp_watchdog_check(p, 3, 200, 20, "stages to be ready", "the start-up limit", why,
                             sizeof why) == 2);
    CHECK(strstr(why, "fusion/0") &&
          strstr(why, "(waiting for stages to be ready; it last reported: manifest "
                      "/d/train.jsonl: 8.2k of 64.0k lines); the start-up limit is 20 s"));
    /* the same with text.0 stopped: it is named though it is not awaited */
    kill(child, SIGSTOP);
    char st = '?';
    for (int i = 0; i < 200 && st != 'T'; i++) {
        usleep(5000);
        st = mmp_watchdog_proc_state((int)child);
    }
    CHECK(st == 'T');
    CHECK(mmp_watchdog_check(p, 3, 200, 20, "results", "train.stall_timeout", why, sizeof why) ==
          1);
    CHECK(strstr(why, "text.0/0") && strstr(why, "is stopped") && !strstr(why, "last reported"));
    p[1].doing = "checkpoint /r/ckpt/step_0000010";
    CHECK(mmp_watchdog_check(p, 3, 200, 20, "stages to be ready", "the start-up limit", why,
                             sizeof why) == 1);
    CHECK(strstr(why, "text.0/0") && strstr(why, "is stopped") &&
          strstr(why, "it last reported: checkpoint /r/ckpt/step_0000010)"));
    /* a dead (reaped) process is not judged */
    p[0].alive = p[2].alive = 0;
    CHECK(mmp_watchdog_check(p, 3, 200, 20, "results", "train.stall_timeout", why, sizeof why) ==
          -1);
    CHECK(mmp_watchdog_proc_state((int)getpid()) == 'R');
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK(mmp_watchdog_proc_state((int)child) == '?');
}

MMP_TEST_LIST("test_watchdog", MMP_TEST_CASE(test_stall))
