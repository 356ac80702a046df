/* Token + position embedding on the CPU. Token ids are trusted here: the data
 * loader validates them against the vocabulary. */
#include "kernels/cpu.h"

void mmp_cpu_embedding_fwd(float *out, const int32_t *ids, const float *wte, const float *wpe,
                           int B, int T, int C)
{
    // out (B,T,C), ids (B,T), wte (V,C), wpe (>=T,C) or NULL
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *y = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)ids[(size_t)b * T + t] * C;
            for (int c = 0; c < C; c++) {
                y[c] = e[c];
            }
            if (wpe) {
                const float *p = wpe + (size_t)t * C;
                for (int c = 0; c < C; c++) {
                    y[c] += p[c];
                }
            }
        }
    }
}

void mmp_cpu_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *ids, int B,
                           int T, int C)
{
    // dwte (V,C), dwpe (>=T,C), dout (B,T,C), ids (B,T)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *dy = dout + ((size_t)b * T + t) * C;
            if (dwte) {
                float *de = dwte + (size_t)ids[(size_t)b * T + t] * C;
                for (int c = 0; c < C; c++) {
                    de[c] += dy[c];
                }
            }
            if (dwpe) {
                float *dp = dwpe + (size_t)t * C;
                for (int c = 0; c < C; c++) {
                    dp[c] += dy[c];
                }
            }
        }
    }
}
