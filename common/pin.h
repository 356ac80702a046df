/* CPU pinning of stage processes (plan key train.pin; README "Cores").
 *
 *   train.pin: off          (default) the OS places every process
 *   train.pin: auto         the cores this process may run on, in order
 *   train.pin: [0, 1, ...]  these core ids, in this order
 *
 * The core list is L (n entries). The process with index k among the stage
 * processes of its host (stage order, replicas in order: the order `mmpipe
 * simulate` and the placement text print) runs on the train.threads cores
 * L[(k * threads + j) % n], j < threads; the single process (index 0) on the
 * first train.threads of them. So with one thread and more processes than
 * cores, processes k and k + n share core L[k % n]: the planner's CPU
 * packing (coordinator/planner.h, mmp_planner_plan_cores) models exactly
 * this rule.
 *
 * Pure helpers plus the two system calls that read and set affinity; nothing
 * here reads the plan file or prints. */
#ifndef MMP_COMMON_PIN_H
#define MMP_COMMON_PIN_H

#include <stddef.h>

#include "common/err.h"

struct mmp_plan;

#define MMP_PIN_MAX_CORES 1024 /* core ids are below this (glibc's CPU_SETSIZE) */

typedef enum mmp_pin_mode { MMP_PIN_OFF = 0, MMP_PIN_AUTO, MMP_PIN_LIST } mmp_pin_mode;

/* The cores this process may run on (sched_getaffinity), ascending, into
 * cores[0..max); returns how many (>= 1; 1 with core 0 when the call fails). */
int mmp_pin_allowed(int *cores, int max);

/* The cores process k of a host gets from list (n entries) with `threads`
 * threads, as above, into out (room for threads); returns how many (at most
 * n: a core is never given twice). Pure. */
int mmp_pin_pick(const int *list, int n, int k, int threads, int *out);

/* Sets the affinity of every thread of this process (each task in
 * /proc/self/task: OpenBLAS may have started its threads before the caller
 * knew its cores) to cores[0..n); threads started later inherit it.
 * MMP_ERR_INVALID naming the cores when the kernel refuses them (a core
 * that is offline or outside this process's cpuset), MMP_ERR_IO when the
 * task list cannot be read. */
mmp_err mmp_pin_self(const int *cores, int n);

/* Lowers this process's priority to nice n (1 to 19), every thread's
 * (Linux keeps a nice value per thread; the threads started later inherit
 * it): train.priority (coordinator/planner_cores.h, Priorities). Raising a
 * nice value needs no privilege. MMP_ERR_INVALID naming the thread. */
mmp_err mmp_nice_self(int n);

/* The core list plan p pins to (train.pin): its list, or for auto the cores
 * this process may run on; into cores (room for MMP_PIN_MAX_CORES); returns
 * how many, 0 when pinning is off. */
int mmp_pin_list(const struct mmp_plan *p, int *cores);

/* Pins this process as plan p says for process index k on its host (the
 * rule above): nothing when train.pin is off. On success *n (may be NULL)
 * is how many cores it now runs on, written as text into what (may be NULL)
 * for the log. Errors as mmp_pin_self. */
mmp_err mmp_pin_apply(const struct mmp_plan *p, int k, int *n, char *what, size_t what_n);

/* "0,2,5" into buf (n bytes); returns buf. */
const char *mmp_pin_format(const int *cores, int n_cores, char *buf, size_t n);

#endif
