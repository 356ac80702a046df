/* Mixed precision on the CPU: the bf16/fp16 rounding that stands in for the
 * GPU's storage (kernels/cpu/precision.c, the backend's round_lp / pack_lp /
 * unpack_lp) against values worked out by hand (ties to even, subnormals,
 * overflow, inf/nan), and the products at the training precision
 * (nn/lowp.h, attention's prec) against the fp32 ops on pre-rounded inputs. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu.h"
#include "nn/lowp.h"
#include "tests/harness.h"

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float round1(float x, mmp_precision p)
{
    float y;
    mmp_backend *be = mmp_backend_cpu();
    be->ops->round_lp(be, &y, &x, 1, p);
    return y;
}

static void test_bf16(void)
{
    const mmp_precision P = MMP_PREC_BF16;
    CHECK(mmp_cpu_to_bf16(1.0f) == 0x3f80);
    CHECK(mmp_cpu_to_bf16(-2.0f) == 0xc000);
    /* 1 + 2^-8 is half way between 1 and 1 + 2^-7: the even one (1) wins */
    CHECK(round1(1.0f + 0x1p-8f, P) == 1.0f);
    /* 1 + 3 * 2^-8: half way between 1 + 2^-7 (odd) and 1 + 2^-6 (even) */
    CHECK(round1(1.0f + 3 * 0x1p-8f, P) == 1.0f + 0x1p-6f);
    /* just above a tie rounds up */
    CHECK(round1(1.0f + 0x1p-8f + 0x1p-20f, P) == 1.0f + 0x1p-7f);
    CHECK(round1(-(1.0f + 0x1p-8f), P) == -1.0f);
    /* subnormals stay subnormal (bf16 has fp32's exponent), ties to even */
    CHECK(bits(round1(from_bits(0x00018000u), P)) == 0x00020000u);
    CHECK(bits(round1(from_bits(0x00008000u), P)) == 0x00000000u);
    CHECK(bits(round1(from_bits(0x80008001u), P)) == 0x80010000u);
    /* overflow to inf; the largest finite bf16 stays */
    CHECK(isinf(round1(3.4028235e38f, P)) && round1(3.4028235e38f, P) > 0);
    CHECK(bits(round1(from_bits(0x7f7f7fffu), P)) == 0x7f7f0000u);
    CHECK(round1(INFINITY, P) == INFINITY && round1(-INFINITY, P) == -INFINITY);
    CHECK(isnan(round1(NAN, P)) && mmp_cpu_to_bf16(NAN) == 0x7fff);
    CHECK(mmp_cpu_from_bf16(0x3f81) == 1.0078125f);
}

static void test_fp16(void)
{
    const mmp_precision P = MMP_PREC_FP16;
    CHECK(mmp_cpu_to_fp16(1.0f) == 0x3c00);
    CHECK(mmp_cpu_to_fp16(65504.0f) == 0x7bff);
    CHECK(mmp_cpu_to_fp16(0x1p-24f) == 0x0001);
    /* ties to even around 1: ulp 2^-10 */
    CHECK(round1(1.0f + 0x1p-11f, P) == 1.0f);
    CHECK(round1(1.0f + 3 * 0x1p-11f, P) == 1.0f + 0x1p-9f);
    CHECK(round1(1.0f + 0x1p-11f + 0x1p-20f, P) == 1.0f + 0x1p-10f);
    /* the largest finite value, and the tie above it goes to inf */
    CHECK(round1(65519.0f, P) == 65504.0f);
    CHECK(mmp_cpu_to_fp16(65520.0f) == 0x7c00 && isinf(round1(65520.0f, P)));
    CHECK(round1(-1e6f, P) == -INFINITY);
    /* subnormals: 2^-25 is half way between 0 and 2^-24 (odd): 0; 3 * 2^-25
     * half way between 2^-24 (odd) and 2^-23 (even): 2^-23 */
    CHECK(round1(0x1p-24f, P) == 0x1p-24f);
    CHECK(round1(0x1p-25f, P) == 0.0f);
    CHECK(round1(3 * 0x1p-25f, P) == 0x1p-23f);
    CHECK(round1(1e-8f, P) == 0.0f);
    CHECK(round1(5e-5f, P) == mmp_cpu_from_fp16(mmp_cpu_to_fp16(5e-5f)));
    CHECK(round1(INFINITY, P) == INFINITY && isnan(round1(NAN, P)));
    CHECK(mmp_cpu_to_fp16(NAN) == 0x7fff && mmp_cpu_to_fp16(-0.0f) == 0x8000);
}

/* The edges of both conversions, by their bits: NaN (any sign, quiet or
 * signalling, any payload) narrows to 0x7fff and an fp16 NaN widens to
 * 0x7fffffff (the CUDA kernels' lp_pack / lp_unpack give the same bits:
 * gpu_kernels test_precision_nan), inf, overflow, subnormals, signed zero;
 * through the backend's pack_lp / unpack_lp / round_lp too. */
static void test_edges_bits(void)
{
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                    0x7fffffffu, 0xffffffffu, 0x7fa5a5a5u, 0xffbfe001u};
    mmp_backend *be = mmp_backend_cpu();
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        const float x = from_bits(nans[i]);
        CHECK(mmp_cpu_to_bf16(x) == 0x7fff);
        CHECK(mmp_cpu_to_fp16(x) == 0x7fff);
        CHECK(bits(round1(x, MMP_PREC_BF16)) == 0x7fff0000u);
        CHECK(bits(round1(x, MMP_PREC_FP16)) == 0x7fffffffu);
        uint16_t h = 0;
        be->ops->pack_lp(be, &h, &x, 1, MMP_PREC_FP16);
        CHECK(h == 0x7fff);
        be->ops->pack_lp(be, &h, &x, 1, MMP_PREC_BF16);
        CHECK(h == 0x7fff);
    }
    /* fp16 NaNs of every kind widen to one pattern; bf16 by the shift */
    static const uint16_t hnans[] = {0x7c01, 0xfc01, 0x7e00, 0xfe00, 0x7fff, 0xffff, 0x7d55};
    for (size_t i = 0; i < sizeof hnans / sizeof *hnans; i++) {
        float y = 0;
        CHECK(bits(mmp_cpu_from_fp16(hnans[i])) == 0x7fffffffu);
        be->ops->unpack_lp(be, &y, &hnans[i], 1, MMP_PREC_FP16);
        CHECK(bits(y) == 0x7fffffffu);
        be->ops->unpack_lp(be, &y, &hnans[i], 1, MMP_PREC_BF16);
        CHECK(bits(y) == (uint32_t)hnans[i] << 16);
    }
    /* inf both ways, and the overflow boundaries */
    CHECK(mmp_cpu_to_fp16(INFINITY) == 0x7c00 && mmp_cpu_to_fp16(-INFINITY) == 0xfc00);
    CHECK(mmp_cpu_to_bf16(INFINITY) == 0x7f80 && mmp_cpu_to_bf16(-INFINITY) == 0xff80);
    CHECK(bits(mmp_cpu_from_fp16(0x7c00)) == 0x7f800000u);
    CHECK(bits(mmp_cpu_from_fp16(0xfc00)) == 0xff800000u);
    CHECK(mmp_cpu_to_fp16(from_bits(0x477fefffu)) == 0x7bff); /* just under 65520 */
    CHECK(mmp_cpu_to_fp16(-65520.0f) == 0xfc00 && mmp_cpu_to_fp16(3.4028235e38f) == 0x7c00);
    CHECK(mmp_cpu_to_bf16(from_bits(0x7f7f8000u)) == 0x7f80); /* tie, odd: up to inf */
    CHECK(mmp_cpu_to_bf16(from_bits(0xff7f7fffu)) == 0xff7f);
    /* fp16 subnormals: ties to even at each end, the carry into the normals */
    CHECK(mmp_cpu_to_fp16(0x1p-25f) == 0x0000 && mmp_cpu_to_fp16(-0x1p-25f) == 0x8000);
    CHECK(mmp_cpu_to_fp16(from_bits(0x33000001u)) == 0x0001); /* just above 2^-25 */
    CHECK(mmp_cpu_to_fp16(1.5f * 0x1p-24f) == 0x0002);
    CHECK(mmp_cpu_to_fp16(1023.5f * 0x1p-24f) == 0x0400); /* tie, odd: the smallest normal */
    CHECK(mmp_cpu_to_fp16(0x1p-14f) == 0x0400 && mmp_cpu_to_fp16(1022.5f * 0x1p-24f) == 0x03fe);
    CHECK(mmp_cpu_to_fp16(from_bits(0x80000001u)) == 0x8000); /* fp32 subnormal: -0 */
    CHECK(mmp_cpu_from_fp16(0x0001) == 0x1p-24f && mmp_cpu_from_fp16(0x83ff) == -1023 * 0x1p-24f);
    CHECK(bits(mmp_cpu_from_fp16(0x8000)) == 0x80000000u);
    /* bf16 subnormals (fp32's): ties to even, the sign kept */
    CHECK(mmp_cpu_to_bf16(from_bits(0x00008000u)) == 0x0000);
    CHECK(mmp_cpu_to_bf16(from_bits(0x80018000u)) == 0x8002);
    CHECK(bits(mmp_cpu_from_bf16(0x0001)) == 0x00010000u);
}

/* The bit-level fp16 conversions against the compiler's _Float16 where it
 * has one (GCC on x86-64): every half pattern widened, and a million fp32
 * patterns spread over the whole range narrowed (NaN aside: x86 keeps the
 * sign and payload where mmpipe canonicalises, as the GPU; test_edges_bits). */
static void test_fp16_exhaustive(void)
{
#ifdef __FLT16_MAX__
    size_t bad_from = 0, bad_to = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        _Float16 h;
        uint16_t b16 = (uint16_t)b;
        memcpy(&h, &b16, 2);
        float want = (float)h, got = mmp_cpu_from_fp16(b16);
        bad_from += isnan(want) ? !isnan(got) : memcmp(&want, &got, 4) != 0;
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
        uint32_t u32 = (uint32_t)u;
        float x;
        memcpy(&x, &u32, 4);
        if (isnan(x)) {
            continue;
        }
        _Float16 h = (_Float16)x;
        uint16_t want;
        memcpy(&want, &h, 2);
        if (mmp_cpu_to_fp16(x) != want && bad_to++ < 3) {
            fprintf(stderr, "  to_fp16(%a): %04x, _Float16 %04x\n", (double)x, mmp_cpu_to_fp16(x),
                    want);
        }
    }
    CHECK(bad_from == 0);
    CHECK(bad_to == 0);
#else
    fprintf(stderr, "  no _Float16 in this compiler: the hand-checked values above stand\n");
#endif
}

static void random_fill(float *x, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        x[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * powf(2.0f, (float)(rand() % 40 - 20));
    }
}

/* pack then unpack is round_lp, bit for bit; fp32 is a copy; in place works. */
static void test_pack(void)
{
    enum { N = 4096 };
    static float x[N], r[N], y[N], z[N];
    static uint16_t h[N];
    mmp_backend *be = mmp_backend_cpu();
    random_fill(x, N, 3);
    for (int p = MMP_PREC_BF16; p <= MMP_PREC_FP16; p++) {
        be->ops->round_lp(be, r, x, N, (mmp_precision)p);
        be->ops->pack_lp(be, h, x, N, (mmp_precision)p);
        be->ops->unpack_lp(be, y, h, N, (mmp_precision)p);
        CHECK(memcmp(r, y, sizeof r) == 0);
        memcpy(z, x, sizeof z);
        be->ops->round_lp(be, z, z, N, (mmp_precision)p);
        CHECK(memcmp(r, z, sizeof r) == 0);
        be->ops->round_lp(be, z, r, N, (mmp_precision)p); /* idempotent */
        CHECK(memcmp(r, z, sizeof r) == 0);
    }
    be->ops->round_lp(be, r, x, N, MMP_PREC_FP32);
    CHECK(memcmp(r, x, sizeof r) == 0);
    be->ops->pack_lp(be, y, x, N, MMP_PREC_FP32);
    be->ops->unpack_lp(be, z, y, N, MMP_PREC_FP32);
    CHECK(memcmp(z, x, sizeof z) == 0);
    CHECK(mmp_backend_lp_bytes(MMP_PREC_BF16) == 2 && mmp_backend_lp_bytes(MMP_PREC_FP32) == 4);
}

/* A linear at bf16/fp16 is the fp32 linear of the rounded inputs, and it
 * leaves its inputs alone; at fp32 it is the plain op. */
static void test_lowp_linear(void)
{
    enum { N = 7, C = 13, OC = 5 };
    float inp[N * C], w[OC * C], b[OC], dout[N * OC];
    float ri[N * C], rw[OC * C], rd[N * OC], in0[N * C];
    float out[N * OC], ref[N * OC], dinp[N * C], dinp_ref[N * C], dw[OC * C], dw_ref[OC * C];
    float db[OC], db_ref[OC];
    random_fill(inp, N * C, 1);
    random_fill(w, OC * C, 2);
    random_fill(b, OC, 4);
    random_fill(dout, N * OC, 5);
    memcpy(in0, inp, sizeof in0);
    for (int p = MMP_PREC_FP32; p <= MMP_PREC_FP16; p++) {
        mmp_lowp lp;
        mmp_lowp_init(&lp, mmp_backend_cpu(), (mmp_precision)p);
        CHECK_OK(mmp_lowp_reserve(&lp, mmp_lowp_linear_floats(N, C, OC)));
        CHECK((p == MMP_PREC_FP32) == (lp.buf == NULL));
        mmp_cpu_round_lp(ri, inp, N * C, p);
        mmp_cpu_round_lp(rw, w, OC * C, p);
        mmp_cpu_round_lp(rd, dout, N * OC, p);
        mmp_lowp_linear_fwd(&lp, out, inp, w, b, N, C, OC);
        mmp_cpu_linear_fwd(ref, ri, rw, b, N, C, OC);
        CHECK(memcmp(out, ref, sizeof out) == 0);
        memset(dinp, 0, sizeof dinp), memset(dw, 0, sizeof dw), memset(db, 0, sizeof db);
        memset(dinp_ref, 0, sizeof dinp), memset(dw_ref, 0, sizeof dw),
            memset(db_ref, 0, sizeof db);
        mmp_lowp_linear_bwd(&lp, dinp, dw, db, dout, inp, w, N, C, OC);
        mmp_cpu_linear_bwd(dinp_ref, dw_ref, db_ref, rd, ri, rw, N, C, OC);
        CHECK(memcmp(dinp, dinp_ref, sizeof dinp) == 0);
        CHECK(memcmp(dw, dw_ref, sizeof dw) == 0 && memcmp(db, db_ref, sizeof db) == 0);
        CHECK(memcmp(inp, in0, sizeof inp) == 0);
        if (p != MMP_PREC_FP32) {
            /* the rounding matters: fp32 inputs give another answer */
            mmp_cpu_linear_fwd(ref, inp, w, b, N, C, OC);
            CHECK(memcmp(out, ref, sizeof out) != 0);
        }
        mmp_lowp_fini(&lp);
        mmp_lowp_fini(&lp); /* idempotent */
    }
}

/* Attention at bf16 saves probabilities that are bf16 values, and at fp32 it
 * is bitwise the fp32 op. */
static void test_attention(void)
{
    enum { B = 2, T = 5, C = 8, NH = 2 };
    float q[B * T * C], k[B * T * C], v[B * T * C], out[B * T * C], att[B * NH * T * T];
    float out32[B * T * C], att32[B * NH * T * T], r[B * NH * T * T];
    float dq[B * T * C], dk[B * T * C], dv[B * T * C];
    random_fill(q, sizeof q / sizeof q[0], 7);
    random_fill(k, sizeof k / sizeof k[0], 8);
    random_fill(v, sizeof v / sizeof v[0], 9);
    mmp_cpu_attention_fwd(out32, att32, q, k, v, NULL, B, T, T, C, NH, 0);
    mmp_cpu_attention_fwd(out, att, q, k, v, NULL, B, T, T, C, NH, MMP_PREC_BF16);
    mmp_cpu_round_lp(r, att, B * NH * T * T, MMP_PREC_BF16);
    CHECK(memcmp(r, att, sizeof r) == 0);
    CHECK(memcmp(att32, att, sizeof r) != 0);
    memset(dq, 0, sizeof dq), memset(dk, 0, sizeof dk), memset(dv, 0, sizeof dv);
    mmp_cpu_attention_bwd(dq, dk, dv, out, att, q, k, v, B, T, T, C, NH, MMP_PREC_BF16);
    int finite = 1;
    for (size_t i = 0; i < sizeof dq / sizeof dq[0]; i++) {
        finite &= isfinite(dq[i]) && isfinite(dk[i]) && isfinite(dv[i]);
    }
    CHECK(finite);
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_bf16),       MMP_TEST_CASE(test_fp16),
    MMP_TEST_CASE(test_edges_bits), MMP_TEST_CASE(test_fp16_exhaustive),
    MMP_TEST_CASE(test_pack),       MMP_TEST_CASE(test_lowp_linear),
    MMP_TEST_CASE(test_attention),
};

int main(int argc, char **argv)
{
    mmp_cpu_set_threads(1);
    return MMP_TEST_MAIN("test_precision", cases, argc, argv);
}
