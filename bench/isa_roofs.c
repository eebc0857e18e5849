/* isa_roofs.c - how many of the instructions our kernels are built from this
 * CPU retires per nanosecond, one thread: the roofs that the kernels'
 * figures are read against. Not a test; x86-64 with AVX2 and FMA.
 *
 * Each loop issues independent instructions (where they accumulate, enough
 * chains to hide the latency), written in asm so that the compiler can
 * neither merge nor drop the work:
 *   fma        VFMADDPS ymm: the float kernels (8 multiply-adds each)
 *   madd       VPMADDWD ymm alone (16 int16 multiply-adds each)
 *   madd+add   VPMADDWD then VPADDD into an accumulator: the integer scheme's
 *              step on AVX2 (kernels_int8.h, attention.h), per pair
 *   add        VPADDD ymm
 * FMA runs 2 a cycle on the CPUs we meet, so "fma / 2" estimates the clock in
 * GHz. On a shared Zen 3 (2 vCPUs) madd+add ran 1.2-1.9 pairs a cycle from one
 * run to the next (madd alone 1.7-2.5): the exact int16 scheme then does
 * ~19-30 multiply-adds a cycle, against FMA's 16. Run it a few times and read
 * the best figures.
 *
 * Build: gcc -O2 bench/isa_roofs.c -o isa_roofs (-DKVC_BENCH=ON: build/isa_roofs)   Run: ./isa_roofs [seconds, default 0.5] */
#define _POSIX_C_SOURCE 199309L   /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Each body issues `per` of its instruction an iteration (pairs, for madd+add). */

/* 12 chains: FMA's latency (4 on Zen 3) times its 2 a cycle needs 8, and 8
 * would leave no slack */
static void body_fma(long n)
{
    for (long i = 0; i < n; i++)
        __asm__ volatile("vfmadd231ps %%ymm14, %%ymm15, %%ymm0\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm1\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm3\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm4\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm6\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm7\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm9\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm10\n\t"
                         "vfmadd231ps %%ymm14, %%ymm15, %%ymm11"
                         ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                             "xmm10", "xmm11");
}

/* 8 of `insn` from ymm14 and ymm15 into ymm0-7: independent, so only the
 * throughput counts */
#define EIGHT(insn)                                                                 \
    insn " %%ymm14, %%ymm15, %%ymm0\n\t" insn " %%ymm14, %%ymm15, %%ymm1\n\t"        \
    insn " %%ymm14, %%ymm15, %%ymm2\n\t" insn " %%ymm14, %%ymm15, %%ymm3\n\t"        \
    insn " %%ymm14, %%ymm15, %%ymm4\n\t" insn " %%ymm14, %%ymm15, %%ymm5\n\t"        \
    insn " %%ymm14, %%ymm15, %%ymm6\n\t" insn " %%ymm14, %%ymm15, %%ymm7"
#define EIGHT_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7"

static void body_madd(long n)
{
    for (long i = 0; i < n; i++)
        __asm__ volatile(EIGHT("vpmaddwd") ::: EIGHT_CLOBBERS);
}

static void body_add(long n)
{
    for (long i = 0; i < n; i++)
        __asm__ volatile(EIGHT("vpaddd") ::: EIGHT_CLOBBERS);
}

static void body_madd_add(long n)
{
    for (long i = 0; i < n; i++)
        __asm__ volatile("vpmaddwd %%ymm14, %%ymm15, %%ymm8\n\t"  "vpaddd %%ymm8, %%ymm0, %%ymm0\n\t"
                         "vpmaddwd %%ymm13, %%ymm15, %%ymm9\n\t"  "vpaddd %%ymm9, %%ymm1, %%ymm1\n\t"
                         "vpmaddwd %%ymm14, %%ymm12, %%ymm10\n\t" "vpaddd %%ymm10, %%ymm2, %%ymm2\n\t"
                         "vpmaddwd %%ymm13, %%ymm12, %%ymm11\n\t" "vpaddd %%ymm11, %%ymm3, %%ymm3\n\t"
                         "vpmaddwd %%ymm14, %%ymm15, %%ymm8\n\t"  "vpaddd %%ymm8, %%ymm4, %%ymm4\n\t"
                         "vpmaddwd %%ymm13, %%ymm15, %%ymm9\n\t"  "vpaddd %%ymm9, %%ymm5, %%ymm5\n\t"
                         "vpmaddwd %%ymm14, %%ymm12, %%ymm10\n\t" "vpaddd %%ymm10, %%ymm6, %%ymm6\n\t"
                         "vpmaddwd %%ymm13, %%ymm12, %%ymm11\n\t" "vpaddd %%ymm11, %%ymm7, %%ymm7"
                         ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                             "xmm10", "xmm11");
}

/* Instructions per ns of body (per iteration: per) over about `secs` seconds:
 * the best of 5 runs, the one the machine's other load disturbed least. */
static double rate(void (*body)(long), int per, double secs)
{
    long n = 1 << 16;
    double t;
    do {   /* grow n until one run takes a fifth of the time asked */
        n *= 2;
        const double t0 = now_s();
        body(n);
        t = now_s() - t0;
    } while (t < secs / 5);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_s();
        body(n);
        const double per_ns = (double)per * (double)n / ((now_s() - t0) * 1e9);
        best = per_ns > best ? per_ns : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        fprintf(stderr, "isa_roofs: this CPU has no AVX2 and FMA\n");
        return 2;
    }
    const double secs = argc > 1 ? atof(argv[1]) : 0.5;
    const double fma = rate(body_fma, 12, secs), madd = rate(body_madd, 8, secs);
    const double pair = rate(body_madd_add, 8, secs), add = rate(body_add, 8, secs);
    const double ghz = fma / 2;
    printf("per ns, one thread (per cycle at the %.2f GHz that FMA's 2 a cycle implies):\n", ghz);
    printf("  fma       %5.2f (%.2f)  = %5.1f float multiply-adds\n", fma, fma / ghz, 8 * fma);
    printf("  madd      %5.2f (%.2f)\n", madd, madd / ghz);
    printf("  madd+add  %5.2f (%.2f)  = %5.1f int16 multiply-adds (the integer scheme on AVX2)\n", pair,
           pair / ghz, 16 * pair);
    printf("  add       %5.2f (%.2f)\n", add, add / ghz);
    return 0;
}
