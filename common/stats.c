/* Medians and means (common/stats.h). */
#include "common/stats.h"

#include <math.h>
#include <stdlib.h>

int mmp_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double mmp_median(double *v, int n)
{
    if (n < 1) {
        return NAN;
    }
    qsort(v, (size_t)n, sizeof *v, mmp_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mmp_mean(const double *v, int n)
{
    if (n < 1) {
        return NAN;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        sum += v[i];
    }
    return sum / n;
}
