/* ab_common.h - what bench/ab_kernels.c and bench/ab_attention.c share:
 * the clock, and the report of alternating old/new calls. */
#ifndef KVC_AB_COMMON_H
#define KVC_AB_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_PAIRS 101

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best times and the median old/new ratio of `pairs` alternating calls. */
static inline void report(const char *what, double work, const char *unit, const double *t_old,
                          const double *t_new, int pairs)
{
    double r[MAX_PAIRS], o[MAX_PAIRS], n[MAX_PAIRS];
    for (int i = 0; i < pairs; i++) {
        r[i] = t_old[i] / t_new[i];
        o[i] = t_old[i];
        n[i] = t_new[i];
    }
    qsort(r, (size_t)pairs, sizeof(double), cmp_double);
    qsort(o, (size_t)pairs, sizeof(double), cmp_double);
    qsort(n, (size_t)pairs, sizeof(double), cmp_double);
    printf("%s: old best %.1f %s, new best %.1f %s; new/old speed, median of %d pairs %.3fx (range %.3f-%.3f)\n",
           what, work / o[0], unit, work / n[0], unit, pairs, r[pairs / 2], r[0], r[pairs - 1]);
}

#endif
