/* Low-precision storage formats on the CPU: bf16 and fp16 as the GPU stores
 * them, so mixed-precision training is testable without a GPU.
 *
 * bf16 is rounded at the bit level (round to nearest, ties to even, on the
 * top 16 bits of the fp32 pattern; NaN becomes the canonical 0x7fff, as
 * __float2bfloat16_rn does); fp16 uses the compiler's _Float16 conversion
 * (IEEE round to nearest even, subnormals kept, overflow to inf), as
 * __float2half_rn does. Must never round fp32 (prec 0): that path is a plain
 * copy, so fp32 training stays bitwise what it was. */
#include "kernels/cpu.h"

#include <string.h>

uint16_t mmp_cpu_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fff; /* canonical quiet NaN */
    }
    /* Adding 0x7fff plus the lowest kept bit rounds half to even; a carry
     * into the exponent is the right answer (up to inf). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float mmp_cpu_from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t mmp_cpu_to_fp16(float x)
{
    _Float16 h = (_Float16)x;
    uint16_t b;
    memcpy(&b, &h, sizeof b);
    return b;
}

float mmp_cpu_from_fp16(uint16_t b)
{
    _Float16 h;
    memcpy(&h, &b, sizeof h);
    return (float)h;
}

void mmp_cpu_round_lp(float *dst, const float *src, size_t n, int prec)
{
    // dst (n), src (n); dst may equal src
    if (prec == 1) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = mmp_cpu_from_bf16(mmp_cpu_to_bf16(src[i]));
        }
    } else if (prec == 2) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = (float)(_Float16)src[i];
        }
    } else if (dst != src && n) {
        memcpy(dst, src, n * sizeof *dst);
    }
}

void mmp_cpu_pack_lp(void *dst, const float *src, size_t n, int prec)
{
    // dst (n) of mmp_cpu_lp_bytes(prec) each, src (n)
    uint16_t *h = dst;
    if (prec == 1) {
        for (size_t i = 0; i < n; i++) {
            h[i] = mmp_cpu_to_bf16(src[i]);
        }
    } else if (prec == 2) {
        for (size_t i = 0; i < n; i++) {
            h[i] = mmp_cpu_to_fp16(src[i]);
        }
    } else if (dst != (const void *)src && n) {
        memcpy(dst, src, n * sizeof *src);
    }
}

void mmp_cpu_unpack_lp(float *dst, const void *src, size_t n, int prec)
{
    // dst (n), src (n) of mmp_cpu_lp_bytes(prec) each
    const uint16_t *h = src;
    if (prec == 1) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = mmp_cpu_from_bf16(h[i]);
        }
    } else if (prec == 2) {
        for (size_t i = 0; i < n; i++) {
            dst[i] = mmp_cpu_from_fp16(h[i]);
        }
    } else if ((const void *)dst != src && n) {
        memcpy(dst, src, n * sizeof *dst);
    }
}

size_t mmp_cpu_lp_bytes(int prec)
{
    return prec == 1 || prec == 2 ? 2 : 4;
}
