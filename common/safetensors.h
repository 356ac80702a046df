/* safetensors files: named tensors in the format PyTorch and Hugging Face
 * exchange weights in, so mmpipe weights round-trip with bench/torch.
 *
 * Layout (all little-endian):
 *   u64 N                  length of the header
 *   N bytes                JSON object, padded with spaces:
 *                          {"<name>": {"dtype": "F32", "shape": [2, 3],
 *                                      "data_offsets": [begin, end]}, ...,
 *                           "__metadata__": {"<key>": "<value>", ...}}
 *   data                   the tensors' bytes; offsets are relative to here
 * Offsets must tile the data exactly (no gap, no overlap, nothing after the
 * last tensor), as the reference implementation demands.
 *
 * The reader treats the file as untrusted: every length, offset, shape and
 * dtype is checked against the file's size before anything is allocated,
 * and an error names the file, the byte offset in it and the tensor.
 * Dtypes: F32, I32, BF16, F16 (mmpipe's own dtypes); others are refused. */
#ifndef MMP_COMMON_SAFETENSORS_H
#define MMP_COMMON_SAFETENSORS_H

#include <stdint.h>

#include "common/ckpt.h"
#include "common/err.h"
#include "common/tensor.h"

#define MMP_ST_HEADER_MAX (100u << 20) /* as the reference implementation */
#define MMP_ST_META_MAX 16

/* One tensor to write: name and CPU tensor are borrowed for the call. */
typedef struct mmp_st_item {
    const char *name;
    const mmp_tensor *t;
} mmp_st_item;

/* The "__metadata__" object: string keys and values. */
typedef struct mmp_st_meta {
    int count;
    char key[MMP_ST_META_MAX][64];
    char value[MMP_ST_META_MAX][256];
} mmp_st_meta;

/* Writes n tensors in the order given, with meta (NULL: none), to path
 * through a durable mmp_atomic_file (path.tmp, fsync, rename): path is
 * either the old file or the whole new one. Names must be unique,
 * non-empty, shorter than a checkpoint entry's name and must not be
 * "__metadata__". Blocks; nothing is owned after the call. */
mmp_err mmp_safetensors_write(const char *path, const mmp_st_item *items, int n,
                              const mmp_st_meta *meta);

/* Reads every tensor of path and appends it to c as an owned CPU tensor
 * (entry file = path's base name), kept sorted by name as mmp_ckpt_read_file
 * does; c must be zeroed or hold earlier entries. A name already in c is an
 * error. meta (may be NULL) receives the metadata. On failure c keeps what
 * it held before (the caller still owns it, mmp_ckpt_fini frees it). */
mmp_err mmp_safetensors_read(mmp_ckpt *c, const char *path, mmp_st_meta *meta);

/* Adds key = value to m; MMP_ERR_INVALID when full or too long. */
mmp_err mmp_st_meta_set(mmp_st_meta *m, const char *key, const char *value);
/* The value of key, NULL when absent. */
const char *mmp_st_meta_get(const mmp_st_meta *m, const char *key);

#endif
