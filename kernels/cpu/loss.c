/* Losses on the CPU: symmetric InfoNCE (CLIP's image-text contrastive loss)
 * and binary cross-entropy with logits. Losses are summed in double; the
 * InfoNCE backward works from the saved probabilities and needs no buffer. */
#include "kernels/cpu.h"
#include "kernels/pointwise.h"

#include <math.h>

/* p (n) = softmax over j < n of the logits scale * s[j * stride];
 * returns -log p[target]. */
static double softmax_ce(float *p, const float *s, int stride, float scale, int n, int target)
{
    float maxv = scale * s[0];
    for (int j = 1; j < n; j++) {
        float l = scale * s[(size_t)j * stride];
        if (l > maxv) {
            maxv = l;
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        p[j] = expf(scale * s[(size_t)j * stride] - maxv);
        sum += p[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < n; j++) {
        p[j] *= inv;
    }
    return (double)maxv + log((double)sum) - (double)(scale * s[(size_t)target * stride]);
}

float mmp_cpu_infonce_fwd(float *sim, float *p_i2t, float *p_t2i, const float *img,
                          const float *txt, float logit_scale, int B, int C)
{
    // sim (B,B), p_i2t (B,B), p_t2i (B,B), img (B,C), txt (B,C)
    mmp_cpu_gemm(0, 1, B, B, C, 1.0f, img, C, txt, C, 0.0f, sim, B);
    float scale = expf(logit_scale);
    double loss_i2t = 0.0, loss_t2i = 0.0;
    for (int i = 0; i < B; i++) {
        // row i of the logits: image i against every text
        loss_i2t += softmax_ce(p_i2t + (size_t)i * B, sim + (size_t)i * B, 1, scale, B, i);
    }
    for (int t = 0; t < B; t++) {
        // column t of the logits: text t against every image
        loss_t2i += softmax_ce(p_t2i + (size_t)t * B, sim + t, B, scale, B, t);
    }
    return (float)(0.5 * (loss_i2t + loss_t2i) / B);
}

void mmp_cpu_infonce_bwd(float *dimg, float *dtxt, float *dlogit_scale, const float *sim,
                         const float *p_i2t, const float *p_t2i, const float *img, const float *txt,
                         float logit_scale, float dloss, int B, int C)
{
    // dimg (B,C), dtxt (B,C), dlogit_scale (1), sim (B,B), p_i2t (B,B), p_t2i (B,B),
    // img (B,C), txt (B,C)
    float scale = expf(logit_scale);
    float g = dloss * 0.5f / (float)B;
    double dscale = 0.0;
    for (int i = 0; i < B; i++) {
        for (int t = 0; t < B; t++) {
            float target = i == t ? 1.0f : 0.0f;
            // d loss / d logits[i,t]: from the row CE and from the column CE
            float dlogit =
                g * ((p_i2t[(size_t)i * B + t] - target) + (p_t2i[(size_t)t * B + i] - target));
            // logits = exp(logit_scale) * sim: d logits / d logit_scale = logits
            dscale += (double)dlogit * scale * sim[(size_t)i * B + t];
            float dsim = dlogit * scale;
            if (dimg) {
                float *di = dimg + (size_t)i * C;
                const float *tx = txt + (size_t)t * C;
                for (int c = 0; c < C; c++) {
                    di[c] += dsim * tx[c];
                }
            }
            if (dtxt) {
                float *dt = dtxt + (size_t)t * C;
                const float *im = img + (size_t)i * C;
                for (int c = 0; c < C; c++) {
                    dt[c] += dsim * im[c];
                }
            }
        }
    }
    if (dlogit_scale) {
        *dlogit_scale += (float)dscale;
    }
}

float mmp_cpu_bce_fwd(const float *logits, const float *labels, int n)
{
    // logits (n), labels (n)
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        double x = logits[i], y = labels[i];
        // log(1 + e^-|x|) form: never overflows
        sum += (x > 0.0 ? x : 0.0) - x * y + log1p(exp(-fabs(x)));
    }
    return n > 0 ? (float)(sum / n) : 0.0f;
}

void mmp_cpu_bce_bwd(float *dlogits, const float *logits, const float *labels, float dloss, int n)
{
    // dlogits (n), logits (n), labels (n)
    for (int i = 0; i < n; i++) {
        dlogits[i] += dloss * (mmp_sigmoid(logits[i]) - labels[i]) / (float)n;
    }
}
