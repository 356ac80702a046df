/* Order statistics over small samples of measurements (per-step times,
 * per-replica speeds, benchmark repetitions): the one median in the tree.
 * Pure functions: no allocation, no I/O. */
#ifndef MMP_COMMON_STATS_H
#define MMP_COMMON_STATS_H

/* qsort comparator for doubles, ascending (NaNs are the caller's to drop). */
int mmp_cmp_double(const void *a, const void *b);

/* The median of v[0..n-1] (the mean of the middle two when n is even).
 * Sorts v in place. NAN when n < 1. */
double mmp_median(double *v, int n);

/* The arithmetic mean of v[0..n-1]; NAN when n < 1. */
double mmp_mean(const double *v, int n);

#endif
