/* Low-precision storage formats on the CPU: bf16 and fp16 as the GPU stores
 * them, so mixed-precision training is testable without a GPU.
 *
 * bf16 is rounded at the bit level (round to nearest, ties to even, on the
 * top 16 bits of the fp32 pattern); fp16 likewise (IEEE round to nearest
 * even, subnormals kept, overflow to inf): no _Float16, which not every
 * compiler has on x86 (clang 14 has none) and GCC emulates slowly;
 * test_precision holds it to _Float16 where the compiler has one.
 * NaN: every NaN, whatever its sign and payload, narrows to 0x7fff in both
 * formats; an fp16 NaN widens to 0x7fffffff, a bf16 value (NaN too) by the
 * 16-bit shift. That is what the CUDA headers' host code of
 * __float2bfloat16_rn / __float2half_rn / __half2float does, and what the
 * CUDA kernels do by explicit bit tests (kernels/cuda/internal.cuh lp_pack,
 * lp_unpack; the PTX ISA leaves the NaN of cvt unspecified), so CPU and GPU
 * agree bit for bit on NaN as well (tests/test_lp_cuda_host, gpu_kernels).
 * Must never round fp32 (prec 0): that path is a plain copy, so fp32
 * training stays bitwise what it was. */
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
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return 0x7fffu; /* NaN: canonical, sign dropped */
    }
    if (a >= 0x477ff000u) {
        return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and inf): inf */
    }
    if (a >= 0x38800000u) {
        /* normal: rebias the exponent, round the 13 dropped bits half to
         * even (a carry into the exponent is the right answer) */
        uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ffu), rest = a & 0x1fffu;
        h += rest > 0x1000u || (rest == 0x1000u && (h & 1u));
        return (uint16_t)(sign | h);
    }
    if (a < 0x33000000u) {
        return (uint16_t)sign; /* below half the smallest subnormal (2^-25 ties to 0) */
    }
    /* subnormal: the value in units of 2^-24, rounded half to even */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23);
    uint32_t h = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    h += rest > half || (rest == half && (h & 1u));
    return (uint16_t)(sign | h);
}

float mmp_cpu_from_fp16(uint16_t b)
{
    uint32_t sign = (uint32_t)(b & 0x8000u) << 16, e = (b >> 10) & 0x1fu, m = b & 0x3ffu, u;
    if (e == 0x1f) {
        u = m ? 0x7fffffffu : sign | 0x7f800000u; /* NaN: canonical; inf */
    } else if (e) {
        u = sign | (e + 112) << 23 | m << 13;
    } else if (m == 0) {
        u = sign;
    } else {
        /* subnormal: normalise */
        int shift = 0;
        while (!(m & 0x400u)) {
            m <<= 1;
            shift++;
        }
        u = sign | (uint32_t)(113 - shift) << 23 | (m & 0x3ffu) << 13;
    }
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
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
            dst[i] = mmp_cpu_from_fp16(mmp_cpu_to_fp16(src[i]));
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
