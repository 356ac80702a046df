/* CPU tensor storage and dtype helpers. CUDA allocation lives in kernels/cuda. */
#include "common/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t mmp_dtype_size(mmp_dtype t)
{
    switch (t) {
    case MMP_F32:
        return 4;
    case MMP_BF16:
        return 2;
    case MMP_F16:
        return 2;
    case MMP_I32:
        return 4;
    }
    return 0;
}

const char *mmp_dtype_name(mmp_dtype t)
{
    switch (t) {
    case MMP_F32:
        return "f32";
    case MMP_BF16:
        return "bf16";
    case MMP_F16:
        return "f16";
    case MMP_I32:
        return "i32";
    }
    return "?";
}

mmp_err mmp_dtype_parse(const char *s, mmp_dtype *out)
{
    static const mmp_dtype all[] = {MMP_F32, MMP_BF16, MMP_F16, MMP_I32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, mmp_dtype_name(all[i])) == 0) {
            *out = all[i];
            return MMP_OK;
        }
    }
    return mmp_errorf(MMP_ERR_INVALID, "unknown dtype '%s' (f32, bf16, f16, i32)", s);
}

int64_t mmp_tensor_numel(const mmp_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        n *= t->shape[i];
    }
    return n;
}

size_t mmp_tensor_bytes(const mmp_tensor *t)
{
    return (size_t)mmp_tensor_numel(t) * mmp_dtype_size(t->dtype);
}

static void set_shape(mmp_tensor *t, mmp_dtype dtype, int ndim, const int64_t *shape)
{
    MMP_ASSERT(ndim >= 0 && ndim <= MMP_MAX_DIMS);
    t->dtype = dtype;
    t->device = MMP_DEV_CPU;
    t->cuda_device = -1;
    t->ndim = ndim;
    for (int i = 0; i < MMP_MAX_DIMS; i++) {
        t->shape[i] = i < ndim ? shape[i] : 1;
    }
}

mmp_err mmp_tensor_init(mmp_tensor *t, mmp_dtype dtype, int ndim, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    set_shape(t, dtype, ndim, shape);
    size_t bytes = mmp_tensor_bytes(t);
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) {
        return mmp_errorf(MMP_ERR_NOMEM, "tensor of %zu bytes", bytes);
    }
    memset(p, 0, rounded ? rounded : 64);
    t->data = p;
    t->owns = 1;
    return MMP_OK;
}

void mmp_tensor_view(mmp_tensor *t, void *data, mmp_dtype dtype, int ndim, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    set_shape(t, dtype, ndim, shape);
    t->data = data;
    t->owns = 0;
}

void mmp_tensor_fini(mmp_tensor *t)
{
    if (!t) {
        return;
    }
    if (t->owns && t->device == MMP_DEV_CPU) {
        free(t->data);
    }
    t->data = NULL;
    t->owns = 0;
}

const char *mmp_shape_str(const mmp_tensor *t, char *buf, size_t n)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "(");
    for (int i = 0; i < t->ndim && off < n; i++) {
        off += (size_t)snprintf(buf + off, n - off, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    }
    if (off < n) {
        snprintf(buf + off, n - off, ")");
    }
    return buf;
}

uint16_t mmp_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float mmp_bf16_to_f32(uint16_t x)
{
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t mmp_f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    if (exp == 0xff) {
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    }
    int e = (int)exp - 127 + 15;
    if (e >= 31) {
        return (uint16_t)(sign | 0x7c00u);
    }
    if (e <= 0) {
        if (e < -10) {
            return (uint16_t)sign;
        }
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) {
            half++;
        }
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++; /* may carry into the exponent, which is the correct rounding */
    }
    return (uint16_t)h;
}

float mmp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
