/* The plan: a stage placement file (YAML) parsed into one struct.
 *
 * mmp_plan_load() reads the YAML with libfyaml against a schema of every
 * known key (type, range, default). An unknown key, a wrong type or an
 * out-of-range value is an error naming file:line:column and the dotted key;
 * a typo in a placement file is never silently ignored. `--set a.b=c`
 * overrides are applied to the YAML tree before validation, with the same
 * checks (an error names the override instead of a line). Configuration comes
 * only from here: no environment variables steer behaviour. */
#ifndef MMP_COMMON_CONFIG_H
#define MMP_COMMON_CONFIG_H

#include <stddef.h>

#include "common/err.h"

#define MMP_PATH_MAX 1024
/* train.microbatches at most: every process sizes its per-step tables by it. */
#define MMP_MAX_MICROBATCHES 1024
/* hosts in a plan: a plan's 1024 processes on nodes of 8 GPUs (common/hostlist.h
 * takes as many SLURM nodes) */
#define MMP_MAX_HOSTS 128
#define MMP_MAX_DEVICES 64
#define MMP_MAX_IMAGE_STAGES 4 /* ResNet stages (blocks/channels entries) */
#define MMP_MAX_SPLITS 8
#define MMP_MAX_REPLICAS 256 /* stages.*.replicas' upper bound (the reduces' rank limits) */
#define MMP_MAX_PIN_LIST 256 /* train.pin entries */

typedef enum mmp_schedule {
    MMP_SCHED_GPIPE = 0,
    MMP_SCHED_1F1B = 1,
    MMP_SCHED_ZB_H1 = 2 /* 1F1B with the backward split in B and W (zero bubble, H1) */
} mmp_schedule;
typedef enum mmp_precision { MMP_PREC_FP32 = 0, MMP_PREC_BF16, MMP_PREC_FP16 } mmp_precision;
typedef enum mmp_balance_mode { MMP_BALANCE_OFF = 0, MMP_BALANCE_DYNAMIC } mmp_balance_mode;
typedef enum mmp_priority { MMP_PRIORITY_AUTO = 0, MMP_PRIORITY_OFF } mmp_priority;
/* How micro-batches are dealt to a stage's replicas. */
typedef enum mmp_routing { MMP_ROUTE_WEIGHTED = 0, MMP_ROUTE_ROUND_ROBIN } mmp_routing;
typedef enum mmp_bad_sample { MMP_BAD_FAIL = 0, MMP_BAD_SKIP } mmp_bad_sample;
typedef enum mmp_data_transport {
    MMP_DATA_AUTO = 0,
    MMP_DATA_SHM = 1,
    MMP_DATA_TCP = 2
} mmp_data_transport;

typedef enum mmp_compute { MMP_COMPUTE_REAL = 0, MMP_COMPUTE_SIMULATED } mmp_compute;
/* What the contrastive loss (ITC) and ITM's hard-negative mining range over:
 * the step's whole batch (the fusion stage waits for the step's last
 * micro-batch before its first backward), or each micro-batch apart. */
typedef enum mmp_itc_scope { MMP_ITC_BATCH = 0, MMP_ITC_MICROBATCH } mmp_itc_scope;
/* The branch whose simulated cost is asked for (the order of stage kinds). */
typedef enum mmp_branch { MMP_BRANCH_IMAGE = 0, MMP_BRANCH_TEXT, MMP_BRANCH_FUSION } mmp_branch;

/* How the coordinator starts stage processes (README "Launching on several
 * hosts"): local: posix_spawn here; ssh: one `launcher_command` per stage;
 * slurm: one `srun` step per stage inside the allocation; agent: one
 * `mmpipe rexec` per stage to the `mmpipe agent` on its host
 * (transport/rexec.h). */
typedef enum mmp_launcher {
    MMP_LAUNCH_LOCAL = 0,
    MMP_LAUNCH_SSH,
    MMP_LAUNCH_SLURM,
    MMP_LAUNCH_AGENT
} mmp_launcher;
/* The control plane's endpoint: auto is tcp (ZeroMQ CURVE) when the plan
 * has more than one host or a launcher other than local, else ipc. */
typedef enum mmp_ctl_transport { MMP_CTLT_AUTO = 0, MMP_CTLT_IPC, MMP_CTLT_TCP } mmp_ctl_transport;

#define MMP_ADDRESS_MAX 256

typedef struct mmp_host {
    char name[128];
    /* where the launcher reaches it (ssh destination, srun --nodelist):
     * [A-Za-z0-9._:-], not starting with '-'; default: name */
    char address[MMP_ADDRESS_MAX];
    char workdir[MMP_PATH_MAX]; /* remote working directory; default: the launch's */
    char binary[MMP_PATH_MAX];  /* the mmpipe binary there; default: this one's path */
    int n_devices;
    int devices[MMP_MAX_DEVICES]; /* -1 = cpu, k >= 0 = CUDA ordinal k */
} mmp_host;

typedef struct mmp_stage_cfg {
    /* Replica processes of each sub-stage: one entry for every sub-stage, or
     * one per sub-stage (n_split + 1); a plain number in YAML is one entry.
     * Use mmp_plan_replicas() to read it. */
    int n_replicas;
    int replicas[MMP_MAX_SPLITS + 1]; /* each >= 1 */
    int n_split;                      /* number of layer cut points (0 = one sub-stage) */
    int split[MMP_MAX_SPLITS];        /* strictly increasing layer indices */
} mmp_stage_cfg;

typedef struct mmp_plan {
    char path[MMP_PATH_MAX]; /* the file it came from */

    struct {
        char name[128]; /* default "job" */
        int steps;      /* default 100, >= 0 (0: only the initial checkpoint) */
        long long seed; /* default 1 */
    } job;

    struct {
        /* Paths: relative ones in the plan file are relative to the plan
         * file's folder, in a --set to the current directory; both are made
         * absolute when loading (plan.json records them so). */
        char manifest[MMP_PATH_MAX]; /* required */
        /* default: val.jsonl beside the manifest when that file exists, else
         * "" (no validation set: evaluation is off, mmp_plan_evaluates) */
        char val_manifest[MMP_PATH_MAX];
        char vocab[MMP_PATH_MAX]; /* default: vocab.txt beside the manifest */
        /* Where manifest, val_manifest and vocab were given ("FILE:LINE:COL"
         * or "--set KEY=..."; a default beside the manifest names the
         * manifest's), for the data preflight's errors after loading. */
        char manifest_site[MMP_PATH_MAX + 64];
        char val_manifest_site[MMP_PATH_MAX + 64];
        char vocab_site[MMP_PATH_MAX + 64];
        int image_size;   /* default 32, [8, 1024] */
        int max_text_len; /* default 32, [4, 512] (includes [CLS] and [SEP]) */
        float mean[3];    /* default ImageNet's */
        float std[3];
        int workers;                  /* default 1, [0, 64] */
        int augment;                  /* training: random resized crop + flip; default 0 */
        mmp_bad_sample on_bad_sample; /* default fail */
        int val_samples;              /* default 256 */
        long long max_image_pixels;   /* larger images are bad samples; default PIL's 89478485 */
    } data;

    struct {
        int width; /* D, the common token width; default 64 */
        struct {
            int n_stages;                       /* length of blocks / channels */
            int blocks[MMP_MAX_IMAGE_STAGES];   /* BasicBlocks per stage */
            int channels[MMP_MAX_IMAGE_STAGES]; /* widths per stage */
            int stem_pool;                      /* 3x3/2 max pool after the stem; default 0 */
        } image;
        struct {
            int layers;   /* default 2 */
            int heads;    /* default 4; width % heads == 0 */
            int ffn_mult; /* default 4 */
        } text;
        struct {
            int layers; /* cross-attention layers, default 1 */
            int heads;  /* default 4 */
            /* model.fusion.itc_scope: batch (default; train.microbatches
             * does not change the objective) | microbatch (ITC and hard
             * negatives per micro-batch) */
            mmp_itc_scope itc_scope;
        } fusion;
    } model;

    struct {
        int batch;        /* default 64 */
        int microbatches; /* default 4, [1, batch] */
        mmp_schedule schedule;
        mmp_precision precision;
        struct {
            float lr;           /* default 1e-3 */
            float min_lr;       /* cosine floor, default 0.1 * lr */
            float weight_decay; /* default 0.05 */
            int warmup;         /* steps, default 20 */
            float beta1, beta2, eps;
        } optimizer;
        float clip_grad_norm; /* default 1.0; 0 = off */
        /* fp16: clean steps after which the loss scale doubles (GradScaler's
         * growth_interval), default 2000 (common/loss_scale.h) */
        int loss_scale_window;
        /* Test hook: the loss gradient of this step (1-based) is +inf, a
         * forced overflow that fp16 skips; 0 = off (default) */
        int debug_overflow_step;
        int eval_every; /* default 50; 0 = none between steps */
        int final_eval; /* evaluate after the last step; default 1 (true) */
        int ckpt_every; /* default 50 (an interrupted run loses at most that much);
                           0 = only at the end and when stopped by a signal */
        int ckpt_keep;  /* step directories kept (the newest); default 3, 0 = all */
        /* pipeline runs: a stage snapshots its state to host memory and
         * writes the file while the next steps run (the last checkpoint and
         * a stop's are written at once); default 0 (false): on a local disk
         * it bought nothing measurable for a host copy of 3x the parameters
         * (bench/ckpt_async.sh, README) */
        int ckpt_async;
        /* Pipeline runs: seconds a stage the coordinator waits on may go
         * without a report (a heartbeat, a result) before the watchdog names
         * it and stops (or restarts) the job; default 60, 0 = off. Stages
         * report after each instruction, so it must exceed the longest one.
         * Stages wait on a peer for twice this long (at least 60 s). */
        int stall_timeout;
        /* Pipeline runs: how many times a dead or stalled stage makes the
         * coordinator stop the others and relaunch them all from ckpt/latest
         * before giving up; default 0, at most 1000. */
        int max_restarts;
        int threads; /* the CPU kernels' own threads per process (OpenBLAS one a call), default 1 */
        /* train.pin: off (default) | auto | [core ids]: which cores each
         * stage process (and the single process) runs on (common/pin.h) */
        struct {
            int mode; /* mmp_pin_mode */
            int n_cores;
            int cores[MMP_MAX_PIN_LIST];
        } pin;
        /* train.priority: auto (default) | off. auto: when the planner on
         * cores places more processes than cores, the processes carrying
         * the largest shares run at a lower priority (nice), so the light
         * stages' work others wait on goes first
         * (coordinator/planner_cores.h, Priorities). */
        mmp_priority priority;
        float init_temperature; /* ITC temperature at start, default 0.07 */
    } train;

    /* The load balancer (coordinator/balancer.h). */
    struct {
        /* off: the placement stays the plan's. dynamic: the balancer re-plans
         * splits and replica counts from measured costs and relaunches the
         * stages at a step boundary when it predicts a gain. */
        mmp_balance_mode mode;
        /* weighted (default): micro-batches go to a stage's replicas in
         * proportion to their measured speed, updated between steps;
         * round_robin: in turn, whatever their speed. */
        mmp_routing routing;
        int window;     /* steps measured before a decision (after a relaunch, one more
                           to warm up); default 3, >= 1 */
        float min_gain; /* predicted step-time gain a re-placement must promise; default 0.1 */
        /* Memory a re-placement may use per device, in GiB: every process's
         * predicted peak under it (processes sharing a device share it).
         * 0 (default): a GPU plan's smallest GPU less 1 GiB, no cap on a CPU
         * plan. */
        float device_memory_gib;
        /* A scripted re-placement (tests, experiments): after step force.step
         * completes, the stages are relaunched with the plan's stages.* keys
         * overridden by force.set ("stages.image.split=[3];stages.image.replicas=2").
         * 0: none. */
        struct {
            int step;
            char set[512];
        } force;
    } balance;

    /* real: the networks run. simulated: each forward / backward is a sleep
     * of the costs below, while tensors of the real sizes still move through
     * the real transport and control plane (outputs and gradients are zeros,
     * the loss is 0, evaluation reports recall 0). */
    mmp_compute compute; /* default real */

    /* Data-plane transports (transport/channel.h). data: auto (default)
     * gives each edge shm (cuda_ipc between two GPU processes) when both
     * ends are on one host and tcp when they are on different hosts, and
     * the replicas' gradient reduce shm or tcp alike; shm / tcp force one
     * for every edge and reduce (tcp on one host: over loopback, for tests
     * and benchmarks; shm across hosts is refused). */
    struct {
        mmp_data_transport data;
    } transport;

    struct {
        struct {
            /* ms per sample, forward, of the whole branch; >= 0, default 0 */
            float image, text, fusion;
        } cost;
        float bwd_factor; /* backward = factor x forward; default 2 */
        /* Per device slot: slowdown[k] multiplies the costs of the process on
         * slot k (slots number the hosts' devices in order; the coordinator
         * places processes on them in stage order, replicas in order). Default
         * empty = 1.0 everywhere; slots past the list run at 1.0. */
        int n_slowdown;
        float slowdown[MMP_MAX_DEVICES];
        int change_step; /* from this step on (1-based, as in metrics.jsonl)
                            costs are sim.change.*; default 0 = never */
        struct {
            float image, text, fusion; /* default: the sim.cost.* value */
        } change;
    } sim;

    mmp_launcher launcher;      /* default local */
    char launcher_command[512]; /* ssh: the command before the remote one; words split on
                                   spaces, {address} and {name} replaced; no shell */
    struct {
        int port;                    /* the agents' port (default MMP_REXEC_PORT) */
        char key_file[MMP_PATH_MAX]; /* the agents' key, read by the relays here */
    } agent;
    struct {
        mmp_ctl_transport transport;   /* default auto */
        char address[MMP_ADDRESS_MAX]; /* tcp: what stages connect to (default: this host's name) */
        int port;                      /* tcp: 0 = any free port */
        /* a connection refused for want of the job's keys: log it and go on
         * (default), or stop the job naming it */
        int stop_on_refused;
    } control;
    int n_hosts;
    /* Where `hosts` was given ("FILE:LINE:COL" or "--set hosts=..."; empty
     * when it was not), for errors found after loading. */
    char hosts_site[MMP_PATH_MAX + 64];
    mmp_host hosts[MMP_MAX_HOSTS]; /* default: one "localhost" with three cpu devices;
                                      `hosts: slurm` expands the allocation (common/hostlist.h) */

    struct {
        mmp_stage_cfg image, text, fusion;
    } stages;
    /* `stages: auto`: start with one process per stage, profile for
     * balance.window steps, then take the planner's placement for the plan's
     * device slots (coordinator/balancer.h). plan.json records the initial
     * placement. */
    int stages_auto;
} mmp_plan;

/* Fills every default (no file). */
void mmp_plan_defaults(mmp_plan *p);

/* Loads path, applies the n_overrides "a.b=c" strings in order, validates.
 * On error returns MMP_ERR_CONFIG with "file:line:column: key: reason" (or
 * "--set a.b=c: reason") in mmp_last_error(); *p is then unspecified. */
mmp_err mmp_plan_load(mmp_plan *p, const char *path, const char *const *overrides, int n_overrides);

/* Whether this version can run the plan: settings the schema accepts (they
 * are part of the plan format) but no process can run yet are refused by
 * key, never silently ignored. MMP_ERR_INVALID with "[SITE: ]KEY: what is
 * not supported yet" in mmp_last_error() otherwise (SITE: where the plan
 * gave `hosts`, else the plan's path). Every entry point that runs
 * a plan (launch, the coordinator, the single-process trainer) asks it. */
mmp_err mmp_plan_check_runnable(const mmp_plan *p);

/* Writes the resolved plan as JSON (plan.json) to path, atomically and
 * durably (mmp_atomic_file: path.tmp, fsync, rename), so a failed write
 * leaves an existing file as it was. */
mmp_err mmp_plan_write_json(const mmp_plan *p, const char *path);

/* Layers of each branch, the units a split cuts between (the networks in
 * nn/model.h have exactly these): image = stem + every BasicBlock + projection,
 * text = embedding + transformer layers + final norm. */
int mmp_plan_image_layers(const mmp_plan *p);
int mmp_plan_text_layers(const mmp_plan *p);

/* Samples in micro-batch mb when train.batch is cut into train.microbatches:
 * the first batch % m micro-batches take one more, so any m in [1, batch]
 * works; and the offset of mb's first sample in the batch. */
int mmp_plan_mb_size(const mmp_plan *p, int mb);
int mmp_plan_mb_offset(const mmp_plan *p, int mb);

/* Simulated compute: the milliseconds a forward (backward: x sim.bwd_factor)
 * of n samples takes on layers [first, last) of branch b at step (0-based),
 * on device slot `slot`: the branch's per-sample cost spread evenly over its
 * layers (fusion is one unit: first and last are ignored), times the slot's
 * slowdown. */
double mmp_plan_sim_ms(const mmp_plan *p, mmp_branch b, int first, int last, int n, int step,
                       int backward, int slot);

/* Replicas of sub-stage sub of branch b (fusion: sub 0). */
int mmp_plan_replicas(const mmp_plan *p, mmp_branch b, int sub);
/* Device slots the plan's hosts offer (sum of their devices). */
int mmp_plan_slots(const mmp_plan *p);
/* The device of slot `slot` (the hosts' devices in order): a CUDA ordinal,
 * or -1 for cpu (and for a slot out of range). */
int mmp_plan_slot_device(const mmp_plan *p, int slot);

/* The host that runs device slot `slot` (0 for a slot out of range). */
int mmp_plan_slot_host(const mmp_plan *p, int slot);
/* Whether the control plane runs over tcp with CURVE (control.transport,
 * or auto: more than one host or a launcher other than local). */
int mmp_plan_control_tcp(const mmp_plan *p);
/* Whether text is a usable host address (see mmp_host.address). */
int mmp_plan_address_ok(const char *text);

/* Evaluation (retrieval on data.val_manifest) runs after step `steps_done`
 * (1-based) when train.eval_every divides it, and after the last step when
 * train.final_eval. mmp_plan_evaluates: whether it runs at all (only then is
 * the validation set needed). */
int mmp_plan_evaluates(const mmp_plan *p);
int mmp_plan_eval_due(const mmp_plan *p, int steps_done);

/* The schema's keys in order ("job.name", ..., "hosts", "stages.image.replicas",
 * ...): count, the i-th dotted name (NULL out of range), and p's value of the
 * i-th key as plan.json writes it (strings quoted and escaped: one line) into
 * buf. Errors: MMP_ERR_INVALID for a bad i or a value that does not fit. */
int mmp_plan_key_count(void);
const char *mmp_plan_key_name(int i);
mmp_err mmp_plan_key_text(const mmp_plan *p, int i, char *buf, size_t n);

const char *mmp_schedule_name(mmp_schedule s);
const char *mmp_precision_name(mmp_precision p);

#endif
