/* Normalisations on the CPU: batch norm (per channel over N and HW), layer
 * norm (per row over C) and L2 normalisation (per row).
 *
 * Statistics are summed in double in a fixed order, so the reference is both
 * deterministic and accurate enough to judge the CUDA kernels by. The saved
 * mean / rstd are the float values the forward used, so backward
 * differentiates exactly what forward computed. */
#include "kernels/cpu.h"

#include <math.h>

void mmp_cpu_batchnorm_fwd_train(float *out, float *mean, float *rstd, float *running_mean,
                                 float *running_var, const float *inp, const float *gamma,
                                 const float *beta, int N, int C, int HW, float eps, float momentum)
{
    // out (N,C,HW), mean (C), rstd (C), running_mean (C) or NULL, running_var (C) or NULL,
    // inp (N,C,HW), gamma (C), beta (C)
    size_t count = (size_t)N * HW;
    for (int c = 0; c < C; c++) {
        double sum = 0.0;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                sum += x[i];
            }
        }
        double m = sum / (double)count;
        double ss = 0.0;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                double d = x[i] - m;
                ss += d * d;
            }
        }
        double var = ss / (double)count; /* biased: what the batch is normalised with */
        float mf = (float)m;
        float rs = (float)(1.0 / sqrt(var + eps));
        mean[c] = mf;
        rstd[c] = rs;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                y[i] = (x[i] - mf) * rs * gamma[c] + beta[c];
            }
        }
        if (running_mean) {
            running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mf;
        }
        if (running_var) {
            /* unbiased, as inference estimates the population variance */
            double unbiased = count > 1 ? var * (double)count / (double)(count - 1) : var;
            running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
        }
    }
}

void mmp_cpu_batchnorm_fwd_infer(float *out, const float *inp, const float *gamma,
                                 const float *beta, const float *running_mean,
                                 const float *running_var, int N, int C, int HW, float eps)
{
    // out (N,C,HW), inp (N,C,HW), gamma (C), beta (C), running_mean (C), running_var (C)
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            float *y = out + ((size_t)n * C + c) * HW;
            float rs = 1.0f / sqrtf(running_var[c] + eps);
            for (int i = 0; i < HW; i++) {
                y[i] = (x[i] - running_mean[c]) * rs * gamma[c] + beta[c];
            }
        }
    }
}

void mmp_cpu_batchnorm_bwd(float *dinp, float *dgamma, float *dbeta, const float *dout,
                           const float *inp, const float *mean, const float *rstd,
                           const float *gamma, int N, int C, int HW)
{
    // dinp (N,C,HW), dgamma (C), dbeta (C), dout (N,C,HW), inp (N,C,HW),
    // mean (C), rstd (C), gamma (C)
    double count = (double)N * HW;
    for (int c = 0; c < C; c++) {
        float m = mean[c], rs = rstd[c];
        double sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            const float *dy = dout + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                sum_dy += dy[i];
                sum_dy_xhat += dy[i] * ((x[i] - m) * rs);
            }
        }
        if (dbeta) {
            dbeta[c] += (float)sum_dy;
        }
        if (dgamma) {
            dgamma[c] += (float)sum_dy_xhat;
        }
        if (!dinp) {
            continue;
        }
        float mean_dy = (float)(sum_dy / count);
        float mean_dy_xhat = (float)(sum_dy_xhat / count);
        float g = gamma[c] * rs;
        for (int n = 0; n < N; n++) {
            const float *x = inp + ((size_t)n * C + c) * HW;
            const float *dy = dout + ((size_t)n * C + c) * HW;
            float *dx = dinp + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; i++) {
                float xhat = (x[i] - m) * rs;
                dx[i] += g * (dy[i] - mean_dy - xhat * mean_dy_xhat);
            }
        }
    }
}

void mmp_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C, float eps)
{
    // out (N,C), mean (N), rstd (N), inp (N,C), w (C), b (C)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double sum = 0.0;
        for (int i = 0; i < C; i++) {
            sum += x[i];
        }
        double m = sum / C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) {
            double d = x[i] - m;
            ss += d * d;
        }
        float mf = (float)m;
        float rs = (float)(1.0 / sqrt(ss / C + eps));
        for (int i = 0; i < C; i++) {
            y[i] = (x[i] - mf) * rs * w[i] + b[i];
        }
        mean[n] = mf;
        rstd[n] = rs;
    }
}

void mmp_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C)
{
    // dinp (N,C), dw (C), db (C), dout (N,C), inp (N,C), w (C), mean (N), rstd (N)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        const float *dy = dout + (size_t)n * C;
        float m = mean[n], rs = rstd[n];
        if (dw || db) {
            for (int i = 0; i < C; i++) {
                if (db) {
                    db[i] += dy[i];
                }
                if (dw) {
                    dw[i] += dy[i] * ((x[i] - m) * rs);
                }
            }
        }
        if (!dinp) {
            continue;
        }
        double sum_dn = 0.0, sum_dn_xhat = 0.0; /* dn = dout * w, the gradient of xhat */
        for (int i = 0; i < C; i++) {
            float dn = dy[i] * w[i];
            sum_dn += dn;
            sum_dn_xhat += dn * ((x[i] - m) * rs);
        }
        float mean_dn = (float)(sum_dn / C);
        float mean_dn_xhat = (float)(sum_dn_xhat / C);
        float *dx = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * rs;
            dx[i] += rs * (dy[i] * w[i] - mean_dn - xhat * mean_dn_xhat);
        }
    }
}

void mmp_cpu_l2norm_fwd(float *out, float *norm, const float *inp, int N, int C, float eps)
{
    // out (N,C), norm (N), inp (N,C)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) {
            ss += (double)x[i] * x[i];
        }
        float nrm = (float)sqrt(ss);
        float inv = 1.0f / (nrm > eps ? nrm : eps);
        for (int i = 0; i < C; i++) {
            y[i] = x[i] * inv;
        }
        norm[n] = nrm;
    }
}

void mmp_cpu_l2norm_bwd(float *dinp, const float *dout, const float *out, const float *norm, int N,
                        int C, float eps)
{
    // dinp (N,C), dout (N,C), out (N,C), norm (N)
    for (int n = 0; n < N; n++) {
        const float *dy = dout + (size_t)n * C;
        const float *y = out + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        if (!(norm[n] > eps)) {
            /* below eps the op is x / eps, a plain scaling */
            for (int i = 0; i < C; i++) {
                dx[i] += dy[i] / eps;
            }
            continue;
        }
        double dot = 0.0;
        for (int i = 0; i < C; i++) {
            dot += (double)dy[i] * y[i];
        }
        float d = (float)dot;
        float inv = 1.0f / norm[n];
        for (int i = 0; i < C; i++) {
            dx[i] += (dy[i] - y[i] * d) * inv;
        }
    }
}
