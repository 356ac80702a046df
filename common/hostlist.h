/* SLURM's hostlist syntax and the allocation's environment.
 *
 * A hostlist is comma-separated items; an item may hold bracketed range
 * lists ("gpu[01-04,07]", "n[1-3]-ib", "r[1-2]-n[01-02]"): each bracket is
 * expanded in order (the last bracket varies fastest, as scontrol show
 * hostnames does), and a range keeps the zero padding of its lower bound.
 * Pure functions: nothing here prints, exits or keeps state. The one reader
 * of the environment is mmp_hostlist_from_slurm, and only for `hosts: slurm`. */
#ifndef MMP_COMMON_HOSTLIST_H
#define MMP_COMMON_HOSTLIST_H

#include <stddef.h>

#include "common/err.h"

#define MMP_HOSTLIST_NAME_MAX 128
/* nodes of an allocation mmp_hostlist_from_slurm takes (a plan's hosts, MMP_MAX_HOSTS) */
#define MMP_HOSTLIST_MAX_NODES 128

/* Expands `list` into names[0..max) (each MMP_HOSTLIST_NAME_MAX bytes);
 * *n gets the count. MMP_ERR_INVALID with the offending text and column in
 * mmp_last_error() for a malformed list (unbalanced or empty brackets, a
 * range whose end is below its start, an empty item, a name longer than
 * MMP_HOSTLIST_NAME_MAX-1, characters other than [A-Za-z0-9._-]) or more
 * than max names. */
mmp_err mmp_hostlist_expand(const char *list, char (*names)[MMP_HOSTLIST_NAME_MAX], int max,
                            int *n);

/* What an allocation offers each node, from the environment SLURM gives a
 * batch script or salloc shell: the nodes (SLURM_JOB_NODELIST), GPUs per
 * node (SLURM_GPUS_ON_NODE, else the entries of CUDA_VISIBLE_DEVICES: what
 * a node of the allocation sees, in a batch script; else the request
 * SLURM_GPUS_PER_NODE, "[type:]count" items summed: all an salloc shell on
 * the login node has; 0 when none is set, or CUDA_VISIBLE_DEVICES is
 * SLURM's "NoDevFiles": each node then has cpu_slots cpu devices, from
 * SLURM_NTASKS_PER_NODE, else 1). MMP_ERR_INVALID naming the variable when
 * SLURM_JOB_NODELIST is unset (not inside an allocation), a value is
 * malformed, or GPUs were asked for without a per-node count known here
 * (SLURM_GPUS, SLURM_GPUS_PER_TASK, SLURM_GPUS_PER_SOCKET only: placing
 * the stages on CPUs would be wrong). `getenv_fn` is getenv, or a table in
 * tests. (`--gres=gpu:N` leaves an salloc shell no trace at all: such an
 * allocation reads as cpu slots there; README says to use --gpus-per-node.) */
typedef struct mmp_slurm_env {
    int n_nodes;
    char nodes[MMP_HOSTLIST_MAX_NODES][MMP_HOSTLIST_NAME_MAX];
    int gpus;      /* GPUs on each node */
    int gpu[64];   /* their ordinals as a stage sees them: 0..gpus-1 (CUDA renumbers the devices
                    * CUDA_VISIBLE_DEVICES lists, and srun each step's, from 0) */
    int cpu_slots; /* when gpus == 0 */
    char job_id[32];
} mmp_slurm_env;

mmp_err mmp_hostlist_from_slurm(mmp_slurm_env *out, const char *(*getenv_fn)(const char *));

#endif
