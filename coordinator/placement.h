/* A placement: where each branch is cut into sub-stages and how many replica
 * processes every sub-stage and fusion get (mmp_placement, defined with the
 * planner that chooses them). This is the one module that converts between
 * its forms:
 *
 *   - a compiled schedule (coordinator/schedule.h) -> a placement;
 *   - a placement -> a plan's stages.* keys (what a relaunch runs);
 *   - a placement <-> its text, "image.0[0:3):2 image.1[3:6):1 text.0:1
 *     fusion:1": sub-stages in branch order, the layer range only where a
 *     branch is cut, ":R" the replicas; spaces between, no commas. The text
 *     is what metrics.jsonl records (balance.placement) and what people read
 *     in logs; mmp_placement_parse is the only reader of it.
 *
 * Pure functions: no I/O, no allocation. */
#ifndef MMP_COORDINATOR_PLACEMENT_H
#define MMP_COORDINATOR_PLACEMENT_H

#include <stddef.h>

#include "common/config.h"
#include "common/err.h"
#include "coordinator/planner.h"
#include "coordinator/schedule.h"

/* The placement s runs (replica 0 of each stage gives its range and count). */
void mmp_placement_of_sched(const mmp_sched *s, mmp_placement *pl);

/* Sets p's stages.image, stages.text and stages.fusion splits and replica
 * counts to pl's; a branch with no sub-stages (n_sub 0) or fusion_replicas 0
 * is left to the plan's defaults (one sub-stage, one replica). pl's branches
 * have at most MMP_MAX_SPLITS + 1 sub-stages (asserted). */
void mmp_placement_to_plan(const mmp_placement *pl, mmp_plan *p);

/* The text form of pl into buf (at most n bytes, NUL included); returns buf.
 * A fusion of 0 replicas (missing) is left out, as parse reads it. */
const char *mmp_placement_format(const mmp_placement *pl, char *buf, size_t n);
/* The text form of the placement s runs: mmp_placement_format of
 * mmp_placement_of_sched. */
const char *mmp_placement_str(const mmp_sched *s, char *buf, size_t n);

/* Reads the text form into *pl. image_layers and text_layers are the
 * branches' layer counts: the range of a branch that is not cut. Branches
 * missing from text get n_sub 0, a missing fusion 0 replicas.
 * MMP_ERR_DATA "cannot read the placement 'TEXT' at 'TOKEN'" for a token
 * that is not one of the forms above (replicas 1..MMP_SCHED_MAX_STAGES),
 * sub-stages out of order or more than a plan can cut (MMP_MAX_SPLITS + 1),
 * ranges that do not follow each other, or a cut branch whose ranges do not
 * cover exactly [0, its layers) (the text is from another run: a
 * metrics.jsonl, checked whole). */
mmp_err mmp_placement_parse(const char *text, int image_layers, int text_layers, mmp_placement *pl);

/* The data transport of one edge (plan key transport.data = want) whose ends
 * sit on the device slots from_device and to_device (CUDA ordinals, -1 for
 * a cpu slot), on different hosts when cross_host: between hosts "nccl"
 * when both ends are GPUs and want is auto, else "tcp"; on one host
 * "cuda_ipc" between two GPUs (auto), "tcp" when forced, else "shm". (shm
 * forced across hosts gives "tcp" here; the coordinator refuses that plan.) */
const char *mmp_edge_transport(mmp_data_transport want, int cross_host, int from_device,
                               int to_device);

/* The transport of one stage's replicas' reduce (transport/reduce.h):
 * "shm" when its replicas share one host and want is not tcp; else "nccl"
 * when they span hosts, every replica is on a GPU (all_gpus), want is auto
 * and this build has NCCL (have_nccl: a CUDA build), and "tcp" otherwise
 * (GPU replicas then stage their gradients through host memory). */
const char *mmp_reduce_transport(mmp_data_transport want, int cross_host, int all_gpus,
                                 int have_nccl);

/* 1 when n replicas placed on host[i], device[i] (a CUDA ordinal, -1: the
 * CPU) are each on a GPU of their own: every device >= 0 and no two on one
 * device of one host. NCCL refuses two ranks of a communicator on one GPU
 * ("Duplicate GPU detected", at the first sum), so only then may a reduce be
 * "nccl" (the caller's all_gpus above); replicas that share a GPU go over
 * the host path. */
int mmp_replicas_own_gpus(const int *host, const int *device, int n);

/* 1 when two of n_procs stage processes of plan p run on one GPU: process
 * i takes device slot i % slots (the launcher's dealing), so two processes
 * share when their slots name the same device of the same host, or when
 * there are more processes than slots and a slot dealt twice is a GPU. The
 * same ordinal on two hosts is two GPUs. 0 for no GPU slot at all. */
int mmp_procs_share_gpu(const mmp_plan *p, int n_procs);

/* The most of n_procs stage processes of plan p that land on one device,
 * dealt as above (a cpu slot is a device of its own; one GPU is every slot
 * naming its ordinal on its host); 1 when n_procs < 1. */
int mmp_procs_most_on_device(const mmp_plan *p, int n_procs);

#endif
