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

    p.launcher = MMP_LAUNCH_SLURM;
    expect_line(&p, 1, &stage, 21,
                "srun --nodes=1 --ntasks=1 --nodelist=10.9.0.2 --overlap --kill-on-bad-exit=1 "
                "--quiet --job-name=mmpipe-image.0 --chdir=/srv/it's here /opt/mm/mmpipe stage "
                "--connect tcp://10.9.0.1:40000 --stage image.0 --replica 1 --shm-prefix "
                "/mmpipe-abc --secrets stdin");
    /* srun passes words without a shell: the path with a space is one word */
    CHECK_OK(mmp_launch_line_build(&l, &p, 1, &stage));
    CHECK(strcmp(l.argv[8], "--chdir=/srv/it's here") == 0);
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

MMP_TEST_LIST("test_launcher", MMP_TEST_CASE(test_lines), MMP_TEST_CASE(test_refused))
