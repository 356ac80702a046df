/* The mmpipe command line: one entry per subcommand, argv[0] is its name.
 * Each returns the process exit status: 0 ok, 1 failure, 2 usage error. */
#ifndef MMP_CLI_CLI_H
#define MMP_CLI_CLI_H

int mmp_cmd_launch(int argc, char **argv);
int mmp_cmd_ckpt(int argc, char **argv);
int mmp_cmd_data(int argc, char **argv);
int mmp_cmd_stage(int argc, char **argv);
int mmp_cmd_simulate(int argc, char **argv);

#endif
