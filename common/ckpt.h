/* Checkpoint files: named tensors with a magic, a version and a checksum.
 *
 * A checkpoint is a directory ckpt/step_NNNNNNN/ holding one file per stage
 * process (image.ckpt, text.ckpt, fusion.ckpt, or image.0.ckpt ... when a
 * branch is cut into sub-stages). Tensor names are global ("image.proj.weight",
 * "image.proj.weight.adam_m", "meta.step"), so a checkpoint reads the same
 * whether one process or a pipeline wrote it, and `mmpipe ckpt diff` compares
 * by name across all files of the two directories.
 *
 * File layout (little-endian), version 2 (what is written):
 *   header  "MMPCKPT\0" u32 version u32 0
 *   records { u16 name_len, name, u8 dtype, u8 ndim, i64 shape[ndim], u64 nbytes, data } ...
 *   trailer u32 count (of the records)
 *   footer  u64 XXH64 (seed 0, common/xxh64.h) of every byte before it
 * so a writer hashes each byte once as it writes it, and a reader as it
 * reads it (no pass of its own over gigabytes). Version 1 (still read):
 * "MMPCKPT\0" u32 1 u32 count, the records, u64 FNV-1a of every byte before
 * it (byte-wise FNV-1a hashed at about a quarter of XXH64's speed, and its
 * header count forced the writer to hash the whole file again at close).
 * Files are written to a temporary name, fsynced and renamed into place, so a
 * crash leaves either the old file or the new one, never half of one.
 *
 * The step's last file, files.txt (after train.ckpt, before ckpt/latest
 * names the step), lists each *.ckpt file and its size, "NAME BYTES" a line
 * ('#' lines are comments): a reader refuses a step with a listed file
 * missing or of another size, or a *.ckpt file not listed, naming it. A step
 * without files.txt (written before it existed) is read as before. */
#ifndef MMP_COMMON_CKPT_H
#define MMP_COMMON_CKPT_H

#include <stdint.h>
#include <stdio.h>

#include "common/config.h"
#include "common/loss_scale.h"
#include "common/err.h"
#include "common/fsutil.h"
#include "common/tensor.h"
#include "common/xxh64.h"

#define MMP_CKPT_VERSION 2 /* written; 1 and 2 are read */

/* ---- writing -------------------------------------------------------------- */
typedef struct mmp_ckpt_writer {
    mmp_atomic_file file; /* durable: fsync of the file and its directory */
    uint32_t count;
    mmp_xxh64_state hash; /* of every byte written so far */
    mmp_err err;
} mmp_ckpt_writer;

/* Opens path's temporary sibling (mmp_atomic_file) for writing. On failure
 * nothing is left open or on disk. */
mmp_err mmp_ckpt_writer_open(mmp_ckpt_writer *w, const char *path);
/* Appends one tensor (CPU data). Errors are sticky: check the result of close. */
mmp_err mmp_ckpt_write(mmp_ckpt_writer *w, const char *name, mmp_dtype dtype, int ndim,
                       const int64_t *shape, const void *data);
/* Finishes (count, checksum), fsyncs, renames into place and fsyncs the
 * directory. On failure the temporary file is removed and nothing replaces
 * path. */
mmp_err mmp_ckpt_writer_close(mmp_ckpt_writer *w);
/* Abandons a write (removes the temporary file). NULL-safe. */
void mmp_ckpt_writer_abort(mmp_ckpt_writer *w);

/* ---- reading -------------------------------------------------------------- */
typedef struct mmp_ckpt_entry {
    char name[128];
    char file[64]; /* which file of the directory held it */
    mmp_tensor t;  /* owned CPU tensor */
} mmp_ckpt_entry;

typedef struct mmp_ckpt {
    mmp_ckpt_entry *entries; /* sorted by name */
    int count;
} mmp_ckpt;

#define MMP_CKPT_FILE_LIST "files.txt"

/* Reads every *.ckpt file of dir (a step directory, or a symlink such as
 * ckpt/latest; a run directory's ckpt/latest is followed when dir is a run
 * or its ckpt folder; a latest naming a step that is gone is an error).
 * Verifies the files against files.txt when there is one, then magic,
 * version, checksum; a tensor name found in two files is an error. Each file is read once, front to
 * back: tensor data goes straight into its tensor (memory: the tensors, not the file twice). On
 * failure c is empty. */
mmp_err mmp_ckpt_read_dir(mmp_ckpt *c, const char *dir);
/* How far a read is: done of total bytes of the directory's files (unit
 * "bytes"), reported after every tensor, every 64 MiB within one, and once
 * at the end. */
typedef void (*mmp_ckpt_progress)(void *ctx, const char *unit, int64_t done, int64_t total);
typedef struct mmp_ckpt_read_opts {
    mmp_ckpt_progress progress; /* NULL: none */
    void *progress_ctx;
    /* NULL: keep every tensor; else only those it answers 1 for. The others
     * are checked (record, size, checksum) but their data is not kept, so a
     * stage holds its own tensors only, not the whole step's. */
    int (*want)(void *want_ctx, const char *name);
    void *want_ctx;
    /* NULL, or set to whether the step had a files.txt to check its files
     * by (0: written before there was one; nothing told a missing file) */
    int *file_list;
} mmp_ckpt_read_opts;
/* mmp_ckpt_read_dir with options (o may be NULL: as mmp_ckpt_read_dir). */
mmp_err mmp_ckpt_read_dir_opts(mmp_ckpt *c, const char *dir, const mmp_ckpt_read_opts *o);
/* Checks step_dir's files against its files.txt (*listed 1), reading
 * nothing but the list and the sizes: what a resume checks before it starts
 * the stages. Without files.txt, *listed 0 and MMP_OK. */
mmp_err mmp_ckpt_check_files(const char *step_dir, int *listed);
/* Reads one file and appends its tensors; on failure none of them. */
mmp_err mmp_ckpt_read_file(mmp_ckpt *c, const char *path);
void mmp_ckpt_fini(mmp_ckpt *c);
const mmp_ckpt_entry *mmp_ckpt_find(const mmp_ckpt *c, const char *name);

/* ---- step directories ------------------------------------------------------ */
/* "<run>/ckpt/step_0000042" into buf. */
void mmp_ckpt_step_dir(char *buf, size_t n, const char *run_dir, int64_t step);
/* Makes step's directory, empty, for a checkpoint's files (its path into
 * dir): one left by an earlier attempt at the same step (a crash or a full
 * disk mid-checkpoint, then a resume, perhaps with another placement) is
 * emptied first, unless ckpt/latest names it. run_dir must exist: it is
 * never re-created (a run whose directory was removed must stop, not write
 * a new one that passes for it). */
mmp_err mmp_ckpt_step_begin(const char *run_dir, int64_t step, char *dir, size_t n);
/* Points <run>/ckpt/latest at step_NNNNNNN atomically (symlink + rename)
 * and durably (fsync of <run>/ckpt). */
mmp_err mmp_ckpt_mark_latest(const char *run_dir, int64_t step);

/* Keeps the keep newest step directories up to latest_step (latest_step's
 * own included) and removes older ones; keep <= 0 keeps all. Directories
 * newer than latest_step (a checkpoint whose write was cut short) are left
 * alone. Call after mmp_ckpt_mark_latest(latest_step). */
mmp_err mmp_ckpt_prune(const char *run_dir, int64_t latest_step, int keep);

/* Resolves <run>/ckpt/latest: its step directory into step_dir and the
 * steps it holds (train.ckpt's meta.step) into *step. */
mmp_err mmp_ckpt_latest(const char *run_dir, char *step_dir, size_t n, int *step);
/* Writes <dir>/train.ckpt: meta.step (steps done) and meta.seed (the data
 * cursor is a pure function of (seed, step), so nothing else is needed), and
 * <dir>/fingerprint.txt: the plan keys the checkpoint is bound to
 * (common/fingerprint.h), which `launch --resume` checks. */
mmp_err mmp_ckpt_write_meta(const char *dir, int steps_done, const mmp_plan *plan);
/* As mmp_ckpt_write_meta, with the loss-scale state (common/loss_scale.h)
 * after steps_done steps: meta.loss_scale, meta.loss_scale_good and
 * meta.opt_skipped, which a resumed run continues from, and
 * meta.loss_scaled (1: the run scaled its loss, fp16). */
mmp_err mmp_ckpt_write_meta_scaled(const char *dir, int steps_done, const mmp_plan *plan,
                                   const mmp_loss_scale *ls);
/* The loss-scale state of step directory dir into *ls, which the caller
 * initialised for plan (mmp_loss_scale_init): the optimizer steps skipped
 * always; the scale and its clean-step count only when the checkpoint's run
 * and plan's both scale (fp16): a run resumed in another precision starts
 * its scale afresh (bf16/fp32 never scale; fp16 after bf16 starts at 2^16,
 * as a new GradScaler). A checkpoint written without the state (before loss
 * scaling, or by `ckpt import`) leaves *ls as it is. MMP_ERR_IO/DATA when
 * train.ckpt cannot be read. */
mmp_err mmp_ckpt_read_loss_scale(const char *dir, const mmp_plan *plan, mmp_loss_scale *ls);

/* mkdir -p. */
mmp_err mmp_mkdirs(const char *path);

#endif
