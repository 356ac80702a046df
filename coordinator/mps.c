/* CUDA MPS for stages that share a GPU. Without it, the processes placed on
 * one GPU time-slice it: one context's kernels at a time, so a pipeline on
 * one GPU is slower than one process. Under MPS their kernels share the GPU
 * at once (measured on an H100: seed-scale 1f1b 114 vs 76 samples/s, the
 * single process 86; bench/gpu.sh). So when two or more stage processes
 * land on one GPU of one host (two slots naming it, or more processes than
 * slots dealt onto a GPU slot twice), the coordinator starts a private MPS control
 * daemon for the job (its pipe and log directories under /tmp, named by the
 * run id), its stages find it through CUDA_MPS_PIPE_DIRECTORY, and it is
 * stopped ("quit") and its directories removed when the job ends.
 * MMP_GPU_SHARING=timeslice turns it off; without nvidia-cuda-mps-control,
 * or when it does not start (another MPS server owns the GPU, say), the job
 * runs time-sliced with a warning. Before the directories go, the lines of
 * the daemon's and server's logs that tell of trouble (errors, failures,
 * faults, a server exiting with a status other than 0) are warned in the
 * job's log: the only account of an MPS server that refused or lost the
 * stages. The coordinator itself never touches CUDA. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/progress.h"
#include "coordinator/coord.h"
#include "coordinator/placement.h"

extern char **environ;

/* The control binary on PATH (no shell), into path; 0 when there is none. */
static int find_control(char *path, size_t n)
{
    const char *env = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s", env ? env : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, n, "%s/nvidia-cuda-mps-control", d[0] ? d : ".");
        if (access(path, X_OK) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Runs the control binary (stdin: input, or /dev/null) and waits: its exit status, -1 if it
 * could not start. */
static int run_control(const char *exe, const char *input)
{
    int fds[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (input) {
        if (pipe(fds) != 0) {
            posix_spawn_file_actions_destroy(&fa);
            return -1;
        }
        posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
        posix_spawn_file_actions_addclose(&fa, fds[1]);
    } else {
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    }
    char *argv[] = {(char *)exe, input ? NULL : "-d", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (input) {
        close(fds[0]);
        if (rc == 0) {
            ssize_t w = write(fds[1], input, strlen(input));
            (void)w;
        }
        close(fds[1]);
    }
    if (rc != 0) {
        return -1;
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Removes dir's files, then dir (the daemon's pipes and logs: flat). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                char p[512];
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

/* A line of the daemon's or server's log that tells of trouble: an error, a
 * failure, a fault, or a server that exited with a status other than 0. */
static int troubled(const char *line)
{
    const char *st = strstr(line, "exited with status ");
    if (st) {
        return atoi(st + strlen("exited with status ")) != 0;
    }
    return strcasestr(line, "error") || strcasestr(line, "fail") || strcasestr(line, "fault");
}

/* Warns with the troubled lines of the MPS logs in dir (control.log,
 * server.log; at most 8 a file) before the directory goes: they are the
 * only account of an MPS server that refused or lost the stages. */
static void report_logs(const char *dir)
{
    static const char *files[] = {"control.log", "server.log"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[200], line[512];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        FILE *f = fopen(p, "r");
        if (!f) {
            continue;
        }
        int shown = 0;
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (troubled(line) && shown++ < 8) {
                MMP_WARN("MPS %s: %s", files[i], line);
            }
        }
        if (shown > 8) {
            MMP_WARN("MPS %s: %d more such lines", files[i], shown - 8);
        }
        fclose(f);
    }
}

void coord_mps_start(coord *c, const char *run_id, int n_procs)
{
    const char *mode = getenv("MMP_GPU_SHARING");
    if (!mmp_procs_share_gpu(c->plan, n_procs) || (mode && strcmp(mode, "timeslice") == 0)) {
        return;
    }
    char exe[600];
    if (!find_control(exe, sizeof exe)) {
        MMP_WARN("several stages share a GPU, but nvidia-cuda-mps-control is not on PATH: they "
                 "time-slice it (slower than one process; see README, GPU)");
        return;
    }
    snprintf(c->mps_dir, sizeof c->mps_dir, "/tmp/mmpipe-mps-%.12s", run_id);
    char pipe_dir[160], log_dir[160];
    snprintf(pipe_dir, sizeof pipe_dir, "%s/pipe", c->mps_dir);
    snprintf(log_dir, sizeof log_dir, "%s/log", c->mps_dir);
    if (mkdir(c->mps_dir, 0700) != 0 || mkdir(pipe_dir, 0700) != 0 || mkdir(log_dir, 0700) != 0) {
        MMP_WARN("MPS: cannot make %s: %s; the stages time-slice the GPU", c->mps_dir,
                 strerror(errno));
        coord_mps_stop(c);
        return;
    }
    /* the daemon and (inherited) the stages find each other here */
    setenv("CUDA_MPS_PIPE_DIRECTORY", pipe_dir, 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", log_dir, 1);
    int rc = run_control(exe, NULL);
    if (rc != 0) {
        MMP_WARN("MPS: %s -d exited with %d; the stages time-slice the GPU", exe, rc);
        unsetenv("CUDA_MPS_PIPE_DIRECTORY");
        unsetenv("CUDA_MPS_LOG_DIRECTORY");
        coord_mps_stop(c);
        return;
    }
    snprintf(c->mps_exe, sizeof c->mps_exe, "%s", exe);
    MMP_INFO("stages share a GPU: CUDA MPS daemon started for this job (%s; MMP_GPU_SHARING="
             "timeslice turns it off)",
             c->mps_dir);
}

void coord_mps_stop(coord *c)
{
    if (c->mps_exe[0]) {
        int rc = run_control(c->mps_exe, "quit\n");
        if (rc != 0) {
            MMP_WARN("MPS: quit exited with %d", rc);
        }
        c->mps_exe[0] = 0;
        unsetenv("CUDA_MPS_PIPE_DIRECTORY");
        unsetenv("CUDA_MPS_LOG_DIRECTORY");
        /* the daemon removes its pipes as it exits: give it a moment */
        for (int i = 0; i < 50; i++) {
            char p[200];
            snprintf(p, sizeof p, "%s/pipe/control", c->mps_dir);
            if (access(p, F_OK) != 0) {
                break;
            }
            mmp_sleep_ms(20);
        }
    }
    if (c->mps_dir[0]) {
        char d[160];
        snprintf(d, sizeof d, "%s/pipe", c->mps_dir);
        remove_dir(d);
        snprintf(d, sizeof d, "%s/log", c->mps_dir);
        report_logs(d);
        remove_dir(d);
        rmdir(c->mps_dir);
        c->mps_dir[0] = 0;
    }
}
