/* Multi-head scaled dot-product attention and the row softmax on the CPU.
 *
 * Heads are C split into NH contiguous chunks of hs = C / NH, read in place
 * with a row stride of C (no transposed copies). Forward keeps the
 * probabilities in att; backward computes one head's (Tq,Tk) score
 * gradients at a time into a buffer it allocates per call, so that all four
 * of its products are GEMMs (a loop of dot products per (query, key) ran
 * at scalar speed). Masked keys get probability exactly 0 and therefore no
 * gradient; a query whose keys are all masked outputs 0. */
#include "kernels/cpu.h"

#include <math.h>
#include <stdlib.h>

#include "common/err.h"

/* p (n) = softmax of x (n) over the entries with valid[j] != 0 (all when
 * valid is NULL); the rest get 0, and a row with none valid is all 0.
 * p may alias x. */
static void masked_softmax(float *p, const float *x, const float *valid, int n)
{
    float maxv = -INFINITY;
    int any = 0;
    for (int j = 0; j < n; j++) {
        if (valid && valid[j] == 0.0f) {
            continue;
        }
        if (!any || x[j] > maxv) {
            maxv = x[j];
        }
        any = 1;
    }
    if (!any) {
        for (int j = 0; j < n; j++) {
            p[j] = 0.0f;
        }
        return;
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        float e = 0.0f;
        if (!valid || valid[j] != 0.0f) {
            e = expf(x[j] - maxv);
        }
        p[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < n; j++) {
        p[j] *= inv;
    }
}

static float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

void mmp_cpu_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v,
                           const float *key_mask, int B, int Tq, int Tk, int C, int NH, int prec)
{
    // out (B,Tq,C), att (B,NH,Tq,Tk), q (B,Tq,C), k (B,Tk,C), v (B,Tk,C), key_mask (B,Tk) or NULL
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        const float *valid = key_mask ? key_mask + (size_t)b * Tk : NULL;
        for (int h = 0; h < NH; h++) {
            const float *qh = q + (size_t)b * Tq * C + h * hs;
            const float *kh = k + (size_t)b * Tk * C + h * hs;
            const float *vh = v + (size_t)b * Tk * C + h * hs;
            float *oh = out + (size_t)b * Tq * C + h * hs;
            float *a = att + ((size_t)b * NH + h) * Tq * Tk;
            // a (Tq,Tk) = scale * qh (Tq,hs) @ kh^T (hs,Tk)
            mmp_cpu_gemm(0, 1, Tq, Tk, hs, scale, qh, C, kh, C, 0.0f, a, Tk);
            for (int i = 0; i < Tq; i++) {
                masked_softmax(a + (size_t)i * Tk, a + (size_t)i * Tk, valid, Tk);
            }
            mmp_cpu_round_lp(a, a, (size_t)Tq * Tk, prec);
            // oh (Tq,hs) = a (Tq,Tk) @ vh (Tk,hs)
            mmp_cpu_gemm(0, 0, Tq, hs, Tk, 1.0f, a, Tk, vh, C, 0.0f, oh, C);
        }
    }
}

void mmp_cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *att,
                           const float *q, const float *k, const float *v, int B, int Tq, int Tk,
                           int C, int NH, int prec)
{
    // dq (B,Tq,C), dk (B,Tk,C), dv (B,Tk,C), dout (B,Tq,C), att (B,NH,Tq,Tk),
    // q (B,Tq,C), k (B,Tk,C), v (B,Tk,C)
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    float *ds = NULL; /* (Tq,Tk): da, then the score gradients, one head at a time */
    if (dq || dk) {
        ds = malloc(sizeof(float) * (size_t)Tq * Tk);
        if (!ds) {
            /* the contract has no error path, as conv2d's im2col buffer */
            mmp_panic(__FILE__, __LINE__, "out of memory for the attention score gradients");
        }
    }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t qoff = (size_t)b * Tq * C + h * hs;
            size_t koff = (size_t)b * Tk * C + h * hs;
            const float *a = att + ((size_t)b * NH + h) * Tq * Tk;
            if (dv) {
                // dv_h (Tk,hs) += a^T (Tk,Tq) @ dout_h (Tq,hs)
                mmp_cpu_gemm(1, 0, Tk, hs, Tq, 1.0f, a, Tk, dout + qoff, C, 1.0f, dv + koff, C);
            }
            if (!ds) {
                continue;
            }
            // da (Tq,Tk) = dout_h (Tq,hs) @ v_h^T (hs,Tk)
            mmp_cpu_gemm(0, 1, Tq, Tk, hs, 1.0f, dout + qoff, C, v + koff, C, 0.0f, ds, Tk);
            for (int i = 0; i < Tq; i++) {
                const float *ai = a + (size_t)i * Tk;
                float *di = ds + (size_t)i * Tk;
                // softmax backward: dpre_j = a_j (da_j - sum_j' a_j' da_j');
                // masked keys (a_j == 0) get exactly 0, so they add nothing below
                float sum = 0.0f;
                for (int j = 0; j < Tk; j++) {
                    if (ai[j] != 0.0f) {
                        sum += ai[j] * di[j];
                    }
                }
                for (int j = 0; j < Tk; j++) {
                    di[j] = ai[j] != 0.0f ? ai[j] * (di[j] - sum) * scale : 0.0f;
                }
            }
            mmp_cpu_round_lp(ds, ds, (size_t)Tq * Tk, prec);
            if (dq) {
                // dq_h (Tq,hs) += dpre (Tq,Tk) @ k_h (Tk,hs)
                mmp_cpu_gemm(0, 0, Tq, hs, Tk, 1.0f, ds, Tk, k + koff, C, 1.0f, dq + qoff, C);
            }
            if (dk) {
                // dk_h (Tk,hs) += dpre^T (Tk,Tq) @ q_h (Tq,hs)
                mmp_cpu_gemm(1, 0, Tk, hs, Tq, 1.0f, ds, Tk, q + qoff, C, 1.0f, dk + koff, C);
            }
        }
    }
    free(ds);
}

void mmp_cpu_softmax_fwd(float *out, const float *inp, int rows, int cols)
{
    // out (rows,cols), inp (rows,cols)
    for (int r = 0; r < rows; r++) {
        masked_softmax(out + (size_t)r * cols, inp + (size_t)r * cols, NULL, cols);
    }
}

void mmp_cpu_softmax_bwd(float *dinp, const float *dout, const float *out, int rows, int cols)
{
    // dinp (rows,cols), dout (rows,cols), out (rows,cols)
    for (int r = 0; r < rows; r++) {
        const float *dy = dout + (size_t)r * cols;
        const float *y = out + (size_t)r * cols;
        float *dx = dinp + (size_t)r * cols;
        float s = dot(dy, y, cols);
        for (int c = 0; c < cols; c++) {
            dx[c] += y[c] * (dy[c] - s);
        }
    }
}
