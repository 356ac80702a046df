/* The command lines that start stage processes (coordinator/launcher.h), per
 * launcher, from a table: local, ssh with the default and a custom template
 * (one remote-command argument, every value single-quoted), slurm's srun
 * step; values that must not reach a command line are refused. The lines
 * never carry the job token or a key (those travel on the stage's stdin). */
#include "coordinator/launcher.h"

#include <stdio.h>
#include <string.h>

#include "tests/harness.h"

static void two_hosts(mmp_plan *p)
{
    mmp_plan_defaults(p);
    p->n_hosts = 2;
    snprintf(p->hosts[1].name, sizeof p->hosts[1].name, "beta");
    snprintf(p->hosts[1].address, sizeof p->hosts[1].address, "10.9.0.2");
    snprintf(p->hosts[1].workdir, sizeof p->hosts[1].workdir, "/srv/it's here");
    snprintf(p->hosts[1].binary, sizeof p->hosts[1].binary, "/opt/mm/mmpipe");
    p->hosts[1].n_devices = 1;
    p->hosts[1].devices[0] = -1;
}

static const mmp_launch_stage stage = {
    .exe = "/usr/bin/mmpipe",
    .cwd = "/home/u/run",
    .endpoint = "tcp://10.9.0.1:40000",
    .stage = "image.0",
    .replica = 1,
    .shm_prefix = "/mmpipe-abc",
    .secrets_stdin = 1,
};

static void expect_line(const mmp_plan *p, int host, const mmp_launch_stage *s, int argc,
                        const char *want)
{
    mmp_launch_line l;
    char text[8192];
    CHECK_OK(mmp_launch_line_build(&l, p, host, s));
    mmp_launch_line_text(&l, text, sizeof text);
    CHECK(l.argc == argc && l.argv[l.argc] == NULL);
    CHECK(strcmp(text, want) == 0);
    if (strcmp(text, want) != 0 || l.argc != argc) {
        fprintf(stderr, "  got  (%d words) %s\n  want (%d words) %s\n", l.argc, text, argc, want);
    }
}

static void test_lines(void)
{
    mmp_plan p;
    two_hosts(&p);
    p.launcher = MMP_LAUNCH_LOCAL;
    expect_line(&p, 0, &stage, 12,
                "/usr/bin/mmpipe stage --connect tcp://10.9.0.1:40000 --stage image.0 --replica 1 "
                "--shm-prefix /mmpipe-abc --secrets stdin");
    mmp_launch_stage ipc = stage;
    ipc.secrets_stdin = 0;
    ipc.endpoint = "ipc://@mmpipe-1-x";
    expect_line(&p, 0, &ipc, 10,
                "/usr/bin/mmpipe stage --connect ipc://@mmpipe-1-x --stage image.0 --replica 1 "
                "--shm-prefix /mmpipe-abc");
    /* train.pin: the process's index on its host (index 0 is said too) */
    mmp_launch_stage pinned = ipc;
    pinned.pinned = 1;
    expect_line(&p, 0, &pinned, 12,
                "/usr/bin/mmpipe stage --connect ipc://@mmpipe-1-x --stage image.0 --replica 1 "
                "--shm-prefix /mmpipe-abc --pin-index 0");
    pinned.pin_index = 3;
    expect_line(&p, 0, &pinned, 12,
                "/usr/bin/mmpipe stage --connect ipc://@mmpipe-1-x --stage image.0 --replica 1 "
                "--shm-prefix /mmpipe-abc --pin-index 3");
    /* train.priority: a nice value only when there is one */
    pinned.nice = 10;
    expect_line(&p, 0, &pinned, 14,
                "/usr/bin/mmpipe stage --connect ipc://@mmpipe-1-x --stage image.0 --replica 1 "
                "--shm-prefix /mmpipe-abc --pin-index 3 --nice 10");

    p.launcher = MMP_LAUNCH_SSH;
    snprintf(p.launcher_command, sizeof p.launcher_command,
             "ssh -o BatchMode=yes -o ServerAliveInterval=1 -o ServerAliveCountMax=3 {address}");
    /* host 0 has no address: its name; no workdir or binary: ours */
    expect_line(&p, 0, &stage, 9,
                "ssh -o BatchMode=yes -o ServerAliveInterval=1 -o ServerAliveCountMax=3 localhost "
                "cd '/home/u/run' && exec '/usr/bin/mmpipe' 'stage' '--connect' "
                "'tcp://10.9.0.1:40000' '--stage' 'image.0' '--replica' '1' '--shm-prefix' "
                "'/mmpipe-abc' '--secrets' 'stdin'");
    /* a quote in the workdir is quoted away */
    snprintf(p.launcher_command, sizeof p.launcher_command,
             "  ssh  -F /etc/mm/ssh_config -l {name}-user {address}  ");
    expect_line(&p, 1, &stage, 7,
                "ssh -F /etc/mm/ssh_config -l beta-user 10.9.0.2 cd '/srv/it'\\''s here' && exec "
                "'/opt/mm/mmpipe' 'stage' '--connect' 'tcp://10.9.0.1:40000' '--stage' 'image.0' "
                "'--replica' '1' '--shm-prefix' '/mmpipe-abc' '--secrets' 'stdin'");
    pinned = stage;
    pinned.pinned = 1;
    pinned.pin_index = 2;
    expect_line(&p, 1, &pinned, 7,
                "ssh -F /etc/mm/ssh_config -l beta-user 10.9.0.2 cd '/srv/it'\\''s here' && exec "
                "'/opt/mm/mmpipe' 'stage' '--connect' 'tcp://10.9.0.1:40000' '--stage' 'image.0' "
                "'--replica' '1' '--shm-prefix' '/mmpipe-abc' '--secrets' 'stdin' '--pin-index' "
                "'2'");
    mmp_launch_line l;
    CHECK_OK(mmp_launch_line_build(&l, &p, 1, &stage));
    CHECK(strcmp(l.argv[5], "10.9.0.2") == 0); /* the destination is one word of its own */
    /* OpenBLAS's kernel choice travels to the remote command (ssh gives it
     * the remote login's environment), through env, quoted like the rest */
    const char *fwd[] = {"OPENBLAS_CORETYPE=Haswell", "OPENBLAS_L2_SIZE=512", NULL};
    mmp_launch_stage env = stage;
    env.env = fwd;
    expect_line(&p, 1, &env, 7,
                "ssh -F /etc/mm/ssh_config -l beta-user 10.9.0.2 cd '/srv/it'\\''s here' && exec "
                "'env' 'OPENBLAS_CORETYPE=Haswell' 'OPENBLAS_L2_SIZE=512' '/opt/mm/mmpipe' "
                "'stage' '--connect' 'tcp://10.9.0.1:40000' '--stage' 'image.0' '--replica' '1' "
                "'--shm-prefix' '/mmpipe-abc' '--secrets' 'stdin'");
    /* anything but those variables, or a value with other characters, is refused */
    const char *other[] = {"LD_PRELOAD=/tmp/x.so", NULL};
    env.env = other;
    CHECK(mmp_launch_line_build(&l, &p, 1, &env) == MMP_ERR_INVALID);
    const char *odd[] = {"OPENBLAS_CORETYPE=Has'well", NULL};
    env.env = odd;
    CHECK(mmp_launch_line_build(&l, &p, 1, &env) == MMP_ERR_INVALID);
    /* which of an environment are forwarded */
    char *envp[] = {"PATH=/bin",
                    "OPENBLAS_CORETYPE=SkylakeX",
                    "OPENBLAS_NUM_THREADS=4",
                    "OPENBLAS_L2_SIZE=$(reboot)",
                    "OPENBLAS_L2_SIZE=1024",
                    NULL};
    const char *got[4];
    CHECK(mmp_launch_forward_env(envp, got, 4) == 2);
    CHECK(strcmp(got[0], "OPENBLAS_CORETYPE=SkylakeX") == 0);
    CHECK(strcmp(got[1], "OPENBLAS_L2_SIZE=1024") == 0 && got[2] == NULL);
    CHECK(mmp_launch_forward_env(envp, got, 2) == 1 && got[1] == NULL); /* room for one */

    p.launcher = MMP_LAUNCH_SLURM;
    expect_line(&p, 1, &stage, 21,
                "srun --nodes=1 --ntasks=1 --nodelist=10.9.0.2 --overlap --kill-on-bad-exit=1 "
                "--quiet --job-name=mmpipe-image.0 --chdir=/srv/it's here /opt/mm/mmpipe stage "
                "--connect tcp://10.9.0.1:40000 --stage image.0 --replica 1 --shm-prefix "
                "/mmpipe-abc --secrets stdin");
    /* srun passes words without a shell: the path with a space is one word */
    CHECK_OK(mmp_launch_line_build(&l, &p, 1, &stage));
    CHECK(strcmp(l.argv[8], "--chdir=/srv/it's here") == 0);

    /* agent: this binary's relay to the host's agent, the key by its path
     * (the key itself never on a line), then the remote command as for ssh,
     * one word; an IPv6 address in brackets */
    p.launcher = MMP_LAUNCH_AGENT;
    p.agent.port = 29470;
    snprintf(p.agent.key_file, sizeof p.agent.key_file, "/etc/mm/agent.key");
    env.env = fwd;
    expect_line(&p, 1, &env, 6,
                "/usr/bin/mmpipe rexec --key-file /etc/mm/agent.key 10.9.0.2:29470 cd "
                "'/srv/it'\\''s here' && exec 'env' 'OPENBLAS_CORETYPE=Haswell' "
                "'OPENBLAS_L2_SIZE=512' '/opt/mm/mmpipe' 'stage' '--connect' "
                "'tcp://10.9.0.1:40000' '--stage' 'image.0' '--replica' '1' '--shm-prefix' "
                "'/mmpipe-abc' '--secrets' 'stdin'");
    snprintf(p.hosts[1].address, sizeof p.hosts[1].address, "fd00::2");
    CHECK_OK(mmp_launch_line_build(&l, &p, 1, &stage));
    CHECK(strcmp(l.argv[4], "[fd00::2]:29470") == 0);
    snprintf(p.agent.key_file, sizeof p.agent.key_file, "-oops");
    CHECK(mmp_launch_line_build(&l, &p, 1, &stage) == MMP_ERR_INVALID);
}

static void test_refused(void)
{
    mmp_plan p;
    two_hosts(&p);
    p.launcher = MMP_LAUNCH_SSH;
    snprintf(p.launcher_command, sizeof p.launcher_command, "ssh {address}");
    mmp_launch_line l;
    /* a name used as the address that would be an ssh option */
    snprintf(p.hosts[0].name, sizeof p.hosts[0].name, "-oProxyCommand=touch /tmp/x");
    CHECK(mmp_launch_line_build(&l, &p, 0, &stage) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "cannot stand on a command line") != NULL);
    snprintf(p.hosts[0].name, sizeof p.hosts[0].name, "a");
    mmp_launch_stage s = stage;
    s.stage = "--evil";
    CHECK(mmp_launch_line_build(&l, &p, 0, &s) == MMP_ERR_INVALID);
    s = stage;
    s.endpoint = "tcp://x\n";
    CHECK(mmp_launch_line_build(&l, &p, 0, &s) == MMP_ERR_INVALID);
    CHECK(mmp_launch_line_build(&l, &p, 5, &stage) == MMP_ERR_INVALID);
    p.launcher = MMP_LAUNCH_SLURM;
    snprintf(p.hosts[1].address, sizeof p.hosts[1].address, "no de");
    CHECK(mmp_launch_line_build(&l, &p, 1, &stage) == MMP_ERR_INVALID);
}

/* The secrets line (--secrets stdin): what the coordinator writes, the
 * stage reads back; anything else is refused naming the part, never
 * echoing the secret. */
static void test_secrets_line(void)
{
    mmp_ctl_keys k = {0}, got = {0};
    snprintf(k.server_public, sizeof k.server_public, "%s",
             "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
    snprintf(k.client_public, sizeof k.client_public, "%s",
             "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID");
    snprintf(k.client_secret, sizeof k.client_secret, "%s",
             "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs");
    char line[256], token[128];
    CHECK_OK(mmp_launch_secrets_format("0123456789abcdef0123456789abcdef", &k, line, sizeof line));
    CHECK(strncmp(line, MMP_LAUNCH_SECRETS_TAG " 0123", 21) == 0 && line[strlen(line) - 1] == '\n');
    line[strlen(line) - 1] = 0;
    CHECK_OK(mmp_launch_secrets_parse(line, token, sizeof token, &got));
    CHECK(strcmp(token, "0123456789abcdef0123456789abcdef") == 0 &&
          strcmp(got.server_public, k.server_public) == 0 &&
          strcmp(got.client_public, k.client_public) == 0 &&
          strcmp(got.client_secret, k.client_secret) == 0);
    CHECK(mmp_launch_secrets_format("01 23", &k, line, sizeof line) == MMP_ERR_INVALID);
    CHECK(mmp_launch_secrets_format("0123", &k, line, 40) == MMP_ERR_INVALID);
    char good[256];
    snprintf(good, sizeof good, "%s %s %s %s %s", MMP_LAUNCH_SECRETS_TAG, "beef", k.server_public,
             k.client_public, k.client_secret);
    char bad[6][300];
    snprintf(bad[0], sizeof bad[0], "%s x", good);                        /* more after */
    snprintf(bad[1], sizeof bad[1], "mmpipe-secrets-2%s", good + 16);     /* another tag */
    snprintf(bad[2], sizeof bad[2], "%.*s  %s", 21, good, good + 22);     /* two spaces */
    snprintf(bad[3], sizeof bad[3], "%.*s", (int)strlen(good) - 1, good); /* a key short */
    snprintf(bad[4], sizeof bad[4], "%s", good);
    bad[4][19] = 'G'; /* not hex in the token */
    snprintf(bad[5], sizeof bad[5], "%s", good);
    bad[5][30] = ' '; /* a space inside a key */
    for (int i = 0; i < 6; i++) {
        memset(token, 'x', sizeof token);
        CHECK(mmp_launch_secrets_parse(bad[i], token, sizeof token, &got) == MMP_ERR_PROTO);
        CHECK(token[0] == 'x' && strstr(mmp_last_error(), "secrets line") != NULL);
        CHECK(strstr(mmp_last_error(), k.client_secret) == NULL);
    }
    CHECK_OK(mmp_launch_secrets_parse(good, token, 5, &got));
    CHECK(mmp_launch_secrets_parse(good, token, 4, &got) == MMP_ERR_PROTO); /* no room */
}

MMP_TEST_LIST("test_launcher", MMP_TEST_CASE(test_lines), MMP_TEST_CASE(test_refused),
              MMP_TEST_CASE(test_secrets_line))
