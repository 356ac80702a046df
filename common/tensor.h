/* Tensors: a typed, shaped block of memory on the CPU or a CUDA device.
 *
 * The kernels work on raw pointers with shapes in their signatures (the CPU
 * reference is the spec and reads best that way); mmp_tensor is what layers,
 * checkpoints and channels hold and pass around. A tensor either owns its
 * memory (created here) or views someone else's (owns == 0). */
#ifndef MMP_COMMON_TENSOR_H
#define MMP_COMMON_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MMP_MAX_DIMS 6

typedef enum mmp_dtype { MMP_F32 = 0, MMP_BF16 = 1, MMP_F16 = 2, MMP_I32 = 3 } mmp_dtype;
typedef enum mmp_device { MMP_DEV_CPU = 0, MMP_DEV_CUDA = 1 } mmp_device;

typedef struct mmp_tensor {
    void *data;
    mmp_dtype dtype;
    mmp_device device;
    int cuda_device; /* ordinal when device == MMP_DEV_CUDA */
    int ndim;
    int64_t shape[MMP_MAX_DIMS];
    int owns;
} mmp_tensor;

size_t mmp_dtype_size(mmp_dtype t);
const char *mmp_dtype_name(mmp_dtype t);
/* Parses "f32" / "bf16" / "f16" / "i32"; MMP_ERR_INVALID otherwise. */
mmp_err mmp_dtype_parse(const char *s, mmp_dtype *out);

int64_t mmp_tensor_numel(const mmp_tensor *t);
size_t mmp_tensor_bytes(const mmp_tensor *t);

/* Allocates a zero-filled CPU tensor (64-byte aligned). On failure *t is left
 * so that mmp_tensor_fini(t) is safe. */
mmp_err mmp_tensor_init(mmp_tensor *t, mmp_dtype dtype, int ndim, const int64_t *shape);
/* A non-owning view of data. */
void mmp_tensor_view(mmp_tensor *t, void *data, mmp_dtype dtype, int ndim, const int64_t *shape);
/* Frees owned memory; NULL-safe and idempotent. */
void mmp_tensor_fini(mmp_tensor *t);

/* "(64,3,32,32)" into buf. */
const char *mmp_shape_str(const mmp_tensor *t, char *buf, size_t n);

/* bf16/fp16 <-> fp32 conversions (round to nearest even). */
uint16_t mmp_f32_to_bf16(float x);
float mmp_bf16_to_f32(uint16_t x);
uint16_t mmp_f32_to_f16(float x);
float mmp_f16_to_f32(uint16_t x);

#endif
