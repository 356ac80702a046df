/* The stage worker: one process of the pipeline (`mmpipe stage ...`).
 *
 * Connects to the coordinator, says Hello, receives its Assignment (stage,
 * layer range, channels, one step's instruction list), builds its part of the
 * model, opens its data channels, and then interprets its instruction list
 * once per Start. Between steps it serves evaluation and checkpoint requests.
 * It never decides anything about the schedule: the coordinator compiled it. */
#ifndef MMP_STAGES_WORKER_H
#define MMP_STAGES_WORKER_H

#include "transport/control.h"

typedef struct mmp_worker_args {
    const char *endpoint; /* coordinator's ROUTER */
    const char *stage;    /* "image.0", "text.0", "fusion" */
    int replica;
    const char *token; /* job token */
    /* tcp control (--secrets stdin): the CURVE keys; the stage watches
     * watch_fd (its stdin) and, when the coordinator is gone, removes the
     * job's shared memory on this host (shm_prefix) and exits */
    const mmp_ctl_keys *curve;
    int watch_fd;
    const char *shm_prefix;
    int pin_index; /* train.pin: this process's index on its host (common/pin.h); -1: none */
    int nice;      /* train.priority: > 0, the nice value to run at (common/pin.h) */
} mmp_worker_args;

/* Runs the worker to its end; returns the process exit status. */
int mmp_worker_main(const mmp_worker_args *args);

#endif
