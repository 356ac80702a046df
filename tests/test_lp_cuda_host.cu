/* The CPU's bf16/fp16 conversions (kernels/cpu/precision.c) against the CUDA
 * headers' own host code of the intrinsics the kernels use
 * (__float2bfloat16_rn, __float2half_rn, __half2float, __bfloat162float in
 * cuda_bf16.hpp / cuda_fp16.hpp: NVIDIA's model of what the device does),
 * bit for bit, NaN included. Runs on the CPU (no GPU needed) in CUDA builds
 * only; the device's own bits are gpu_kernels' test_precision_nan.
 * Every 16-bit pattern widened; fp32 patterns narrowed: a stride over the
 * whole range, and around every exponent the mantissas that decide a
 * rounding (ties, just off them, the last ones before a carry) in both
 * signs, plus NaNs of many payloads. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "kernels/cpu.h"
}

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static size_t checks, failed;

static void narrow(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    const uint16_t b = mmp_cpu_to_bf16(x), h = mmp_cpu_to_fp16(x);
    const uint16_t nb = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    const uint16_t nh = __half_as_ushort(__float2half_rn(x));
    checks += 2;
    if (b != nb || h != nh) {
        if (failed++ < 5) {
            fprintf(stderr, "  fp32 %08x: cpu bf16 %04x fp16 %04x, cuda host bf16 %04x fp16 %04x\n",
                    u, b, h, nb, nh);
        }
    }
}

int main(void)
{
    for (uint32_t v = 0; v < 65536; v++) {
        const uint16_t h = (uint16_t)v;
        const uint32_t cb = bits(mmp_cpu_from_bf16(h)),
                       nb = bits(__bfloat162float(__ushort_as_bfloat16(h)));
        const uint32_t ch = bits(mmp_cpu_from_fp16(h)),
                       nh = bits(__half2float(__ushort_as_half(h)));
        checks += 2;
        if (cb != nb || ch != nh) {
            if (failed++ < 5) {
                fprintf(stderr, "  16-bit %04x: cpu bf16 %08x fp16 %08x, cuda host %08x %08x\n", h,
                        cb, ch, nb, nh);
            }
        }
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 251) {
        narrow((uint32_t)u);
    }
    /* low mantissa bits that decide bf16 (16 dropped) and fp16 (13 dropped,
     * more for its subnormals) roundings */
    static const uint32_t low[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                   0x3000, 0x7fff, 0x8000, 0x8001, 0xffff, 0x18000};
    for (uint32_t e = 0; e < 256; e++) {
        for (uint32_t hi = 0; hi < 128; hi++) { /* the mantissa's top 7 bits */
            for (size_t l = 0; l < sizeof low / sizeof *low; l++) {
                const uint32_t m = (hi << 16 | low[l]) & 0x7fffffu;
                narrow(e << 23 | m);
                narrow(0x80000000u | e << 23 | m);
                narrow(e << 23 | (m ^ 0x7fe000u)); /* the fp16 mantissa's bits set */
            }
        }
    }
    printf("test_lp_cuda_host: %zu checks, %zu failed\n", checks, failed);
    return failed != 0;
}
