/* bench_attention.c - single-thread speed of the attention kernel per ISA at
 * Qwen2.5-0.5B's shape (7 query heads per KV head, head dim 64, F16 K/V) after
 * a depth of cached positions: a decode step (1 token; GB/s of K/V read) and
 * a prefill tile (GFLOP/s, 4 * hd flops per query head and position). CPU
 * time, best of several trials, so other load on the machine counts less.
 * The "vnni" row is the integer scheme (attention.h), the others the float
 * one. Not a test.
 *
 * Build: `cmake -DKVC_BENCH=ON` makes build/bench_attention; by hand, from the repo root:
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -ffp-contract=off -Iinclude -Isrc -Isrc/kernels \
 *       bench/bench_attention.c build/libkvchat.a -lm -lpthread -o bench_attention
 * Run: ./bench_attention [depth, default 4096] [tile tokens, default 18] */
#include "attention.h"
#include "kernels.h"
#include "quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Seconds of one kvc_attention call: the best of 8 trials of ~0.1 s. */
static double time_it(const kvc_attn_args *a)
{
    double best = 1e30;
    for (int trial = 0; trial < 8; trial++) {
        int64_t n = 0, t0 = cpu_us(), t1;
        do {
            kvc_attention(a);
            n++;
            t1 = cpu_us();
        } while (t1 - t0 < 100000);
        best = KVC_MIN(best, (double)(t1 - t0) * 1e-6 / (double)n);
    }
    return best;
}

int main(int argc, char **argv)
{
    const int64_t depth = argc > 1 ? atoll(argv[1]) : 4096;
    const int n_tile = argc > 2 ? atoi(argv[2]) : 18, n_q = 7, hd = 64, B = KVC_ATTN_B;
    const int64_t nb = (depth + n_tile + B - 1) / B;
    kvc_fp16 *k = kvc_alloc_aligned((size_t)nb * B * hd * 2), *v = kvc_alloc_aligned((size_t)nb * B * hd * 2);
    const void **kb = malloc((size_t)nb * sizeof(void *)), **vb = malloc((size_t)nb * sizeof(void *));
    for (int64_t i = 0; i < nb * B * hd; i++) {
        k[i] = kvc_fp32_to_fp16((float)((i * 37) % 101 - 50) * 0.02f);
        v[i] = kvc_fp32_to_fp16((float)((i * 53) % 97 - 48) * 0.02f);
    }
    for (int64_t b = 0; b < nb; b++) {
        kb[b] = k + b * B * hd;
        vb[b] = v + b * B * hd;
    }
    const int64_t ld = n_q * hd;
    float *q = kvc_alloc_aligned((size_t)n_tile * ld * sizeof(float));
    float *out = kvc_alloc_aligned((size_t)n_tile * ld * sizeof(float));
    float *sc = kvc_alloc_aligned(kvc_attn_scratch_floats((int64_t)n_tile * n_q, hd) * sizeof(float));
    for (int64_t i = 0; i < n_tile * ld; i++)
        q[i] = (float)(i % 17 - 8) * 0.1f;
    printf("attention, 1 thread, %d heads per KV head, hd %d, F16 K/V, depth %lld\n", n_q, hd,
           (long long)depth);
    printf("%-7s %22s %26s\n", "isa", "decode (GB/s of K/V)", "prefill tile of N (GFLOP/s)");
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        kvc_attn_args a = { .n_tok = 1, .n_q = n_q, .hd = hd, .n_pos = depth + 1, .f16 = true,
                            .k = kb, .v = vb, .q = q, .ldq = ld, .scale = 0.125f, .out = out,
                            .ldo = ld, .scratch = sc };
        double td = time_it(&a);
        double bytes = 2.0 * (double)(depth + 1) * hd * 2;
        a.n_tok = n_tile;
        double tp = time_it(&a);
        double flop = 4.0 * hd * n_q * (double)n_tile * (double)(depth + (n_tile + 1) / 2.0);
        printf("%-7s %12.1f (%6.1f us) %16.1f (%7.1f us)\n", kvc_isa_name((kvc_isa)isa), bytes / td * 1e-9,
               td * 1e6, flop / tp * 1e-9, tp * 1e6);
    }
    return 0;
}
