/* mmpipe agent: the per-node process that starts a job's stages for
 * `launcher: agent` (transport/rexec.h), and mmpipe rexec, the relay the
 * coordinator runs in place of ssh. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "transport/auth.h"
#include "transport/rexec.h"
#include "transport/sock.h"

#define MAX_SERVING 1024 /* connections served at once */

static const char AGENT_USAGE[] =
    "usage: mmpipe agent --key-file FILE [--listen [HOST:]PORT]\n"
    "       mmpipe agent --new-key FILE\n"
    "\n"
    "Starts a job's stages on this node for a plan with `launcher: agent`, where\n"
    "nodes have no sshd and no SLURM (containers, Kubernetes pods): run one agent on\n"
    "every host of the plan (the coordinator's too if stages run there), then\n"
    "`mmpipe launch` on one of them. Each connection that proves it holds the key\n"
    "runs one command (a stage) under `sh -c` here, in a process group of its own;\n"
    "when the connection ends (the coordinator stopped or lost) the stage's input\n"
    "ends, and it is sent SIGTERM and then SIGKILL if it is still there.\n"
    "\n"
    "  --key-file FILE    the key the coordinator holds too (plan key agent.key_file):\n"
    "                     one line of 32 to 256 characters of [0-9A-Za-z], mode 600\n"
    "  --listen ADDR      where to listen: PORT or HOST:PORT (default 0.0.0.0:29470)\n"
    "  --new-key FILE     write a new random key to FILE (mode 600) and exit\n"
    "\n"
    "SIGINT, SIGTERM or SIGHUP (not under nohup) stops the agent and every stage it\n"
    "started.\n";

static int wake_fd = -1;
static volatile sig_atomic_t stopping;

static void wake(void)
{
    int saved = errno;
    uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof one);
    errno = saved;
}

static void on_stop(int sig)
{
    (void)sig;
    stopping = 1;
    wake();
}

static void on_child(int sig)
{
    (void)sig;
    wake(); /* a serving process ended: reap it */
}

static int reap(pid_t *serving, int n)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < n; i++) {
            if (serving[i] == pid) {
                serving[i] = serving[--n];
                break;
            }
        }
    }
    return n;
}

int mmp_cmd_agent(int argc, char **argv)
{
    const char *key_file = NULL, *listen_at = NULL, *new_key = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(AGENT_USAGE, stdout);
            return 0;
        }
        const char **slot = strcmp(a, "--key-file") == 0  ? &key_file
                            : strcmp(a, "--listen") == 0  ? &listen_at
                            : strcmp(a, "--new-key") == 0 ? &new_key
                                                          : NULL;
        if (!slot || i + 1 >= argc || mmp_cli_is_option(argv[i + 1])) {
            fprintf(stderr, "mmpipe agent: %s: %s\n%s", a,
                    slot ? "needs a value" : "unknown argument", AGENT_USAGE);
            return 2;
        }
        *slot = argv[++i];
    }
    if (new_key) {
        if (mmp_rexec_key_new(new_key) != MMP_OK) {
            fprintf(stderr, "mmpipe agent: %s\n", mmp_last_error());
            return 1;
        }
        printf("mmpipe agent: a new key in %s (mode 600): copy it to every host of the plan\n",
               new_key);
        return 0;
    }
    if (!key_file) {
        fprintf(stderr, "mmpipe agent: --key-file is required\n%s", AGENT_USAGE);
        return 2;
    }
    static char key[MMP_REXEC_KEY_MAX + 1];
    if (mmp_rexec_key_load(key_file, key, sizeof key) != MMP_OK) {
        fprintf(stderr, "mmpipe agent: %s\n", mmp_last_error());
        return 2;
    }
    char address[MMP_SOCK_ADDR_MAX];
    if (!listen_at) {
        snprintf(address, sizeof address, "0.0.0.0:%d", MMP_REXEC_PORT);
    } else if (strspn(listen_at, "0123456789") == strlen(listen_at)) {
        snprintf(address, sizeof address, "0.0.0.0:%s", listen_at);
    } else {
        snprintf(address, sizeof address, "%s", listen_at);
    }
    char host[256];
    int port = 0;
    if (mmp_sock_parse("--listen", address, host, sizeof host, &port) != MMP_OK) {
        fprintf(stderr, "mmpipe agent: %s\n", mmp_last_error());
        return 2;
    }
    mmp_log_set_name("agent");
    signal(SIGPIPE, SIG_IGN);
    wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int lfd = -1;
    char bound[MMP_SOCK_ADDR_MAX];
    if (wake_fd < 0 ||
        mmp_sock_listen(&lfd, "mmpipe agent", address, bound, sizeof bound) != MMP_OK) {
        fprintf(stderr, "mmpipe agent: %s\n", wake_fd < 0 ? strerror(errno) : mmp_last_error());
        return 1;
    }
    struct mmp_auth_gate *gate = NULL;
    if (mmp_rexec_gate_create(&gate, lfd, key) != MMP_OK) {
        fprintf(stderr, "mmpipe agent: %s\n", mmp_last_error());
        close(lfd);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN) {
        sigaction(SIGHUP, &sa, NULL); /* a closed terminal stops it, except under nohup */
    }
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    MMP_INFO("listening on %s (pid %d)", bound, (int)getpid());
    static pid_t serving[MAX_SERVING];
    int n = 0;
    while (!stopping) {
        int fd = -1;
        char peer[MMP_SOCK_ADDR_MAX], hello[MMP_AUTH_HELLO_MAX];
        /* strangers wait in the gate, all at once, never in a process */
        mmp_err e = mmp_auth_gate_next(gate, wake_fd, &fd, peer, sizeof peer, hello);
        if (e == MMP_ERR_TIMEOUT) { /* woken: a signal */
            uint64_t v;
            (void)!read(wake_fd, &v, sizeof v);
            n = reap(serving, n);
            continue;
        }
        n = reap(serving, n);
        if (e != MMP_OK) {
            MMP_WARN("%s", mmp_last_error());
            usleep(100 * 1000); /* accepting failed (out of descriptors?): not a busy loop */
            continue;
        }
        if (n == MAX_SERVING) {
            MMP_WARN("refused %s: %d connections served already", peer, MAX_SERVING);
            close(fd);
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            /* only its connection: not the listener, nor the others waiting in the gate */
            if (fd != 3 && dup2(fd, 3) == 3) {
                close(fd);
                fd = 3;
            }
            fcntl(fd, F_SETFD, FD_CLOEXEC); /* never the command's */
            close_range((unsigned)fd + 1, ~0U, 0);
            signal(SIGCHLD, SIG_DFL);
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* the agent gone: end what it started */
            _exit(mmp_rexec_serve(fd, peer, key, 1));
        }
        close(fd);
        if (pid < 0) {
            MMP_WARN("refused %s: fork: %s", peer, strerror(errno));
            continue;
        }
        serving[n++] = pid;
    }
    mmp_auth_gate_destroy(gate, NULL);
    close(lfd);
    if (n > 0) {
        MMP_INFO("stopping: ending %d command%s", n, n > 1 ? "s" : "");
    }
    for (int i = 0; i < n; i++) {
        kill(serving[i], SIGTERM);
    }
    /* each ends its command: input closed, SIGTERM, SIGKILL (rexec.h) */
    for (int t = 0; n > 0 && t < (2 * MMP_REXEC_GRACE_MS + 2000) / 100; t++) {
        usleep(100 * 1000);
        n = reap(serving, n);
    }
    for (int i = 0; i < n; i++) {
        kill(serving[i], SIGKILL);
    }
    while (n > 0 && waitpid(-1, NULL, 0) > 0) {
        n--;
    }
    MMP_INFO("stopped");
    return 0;
}

static const char REXEC_USAGE[] =
    "usage: mmpipe rexec --key-file FILE HOST:PORT COMMAND\n"
    "\n"
    "Runs COMMAND (one argument, for sh -c) on the mmpipe agent at HOST:PORT,\n"
    "relaying standard input, output and error and SIGINT/SIGTERM/SIGHUP, and exits\n"
    "with its status (255: it could not be run, or the agent was lost). `mmpipe\n"
    "launch` runs it for every stage of a plan with `launcher: agent`.\n";

int mmp_cmd_rexec(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        fputs(REXEC_USAGE, stdout);
        return 0;
    }
    if (argc != 5 || strcmp(argv[1], "--key-file") != 0) {
        fprintf(stderr, "%s", REXEC_USAGE);
        return 2;
    }
    static char key[MMP_REXEC_KEY_MAX + 1];
    if (mmp_rexec_key_load(argv[2], key, sizeof key) != MMP_OK) {
        fprintf(stderr, "mmpipe rexec: %s\n", mmp_last_error());
        return 255;
    }
    mmp_log_set_name("rexec");
    return mmp_rexec_run(argv[3], key, argv[4], 10000);
}
