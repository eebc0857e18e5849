/* bench_ssm.c - single-thread speed of the recurrent mixers' per-token
 * kernels (ssm_scan.h) per path, scalar reference against AVX2, at the
 * shapes of the models they serve: one token's causal convolution of a
 * layer (Qwen3.5-9B's Gated DeltaNet: 8192 channels, 4 taps, silu; Granite
 * 4.0-H-Tiny's Mamba-2: 3328 channels, 4 taps, bias, silu; LFM2-1.2B's short
 * convolution: 2048 channels, 3 taps, both gates) and one token's Mamba-2
 * scan of a layer (48 heads of 64 x 128). Microseconds per token and layer,
 * CPU time, best of several trials, so other load on the machine counts
 * less. Not a test (test_ssm checks that both paths give the same bits).
 *
 * Build: `cmake -DKVC_BENCH=ON` makes build/bench_ssm; by hand, from the repo root:
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -ffp-contract=off -Iinclude -Isrc -Isrc/kernels \
 *       bench/bench_ssm.c build/libkvchat.a -lm -lpthread -o bench_ssm
 * Run: ./bench_ssm */
#include "ssm_scan.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int64_t cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

typedef struct conv_case {
    const char *name;
    int64_t     n;
    int32_t     K;
    bool        bias, silu, gates;
} conv_case;

typedef struct scan_case {
    const char *name;
    int32_t     heads, hd, N;
} scan_case;

static float *filled(int64_t n, float scale)
{
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; p && i < n; i++)
        p[i] = (float)(i % 37) / 37.0f * scale - 0.5f * scale;
    return p;
}

/* Microseconds of one token's convolution on path isa: best of 8 trials of ~50 ms. */
static double time_conv(kvc_isa isa, const conv_case *c)
{
    float *st = filled((c->K - 1) * c->n + 1, 1.0f), *wt = filled(c->K * c->n, 0.8f), *u = filled(c->n, 4.0f);
    float *m1 = filled(c->n, 2.0f), *m2 = filled(c->n, 2.0f), *b = filled(c->n, 1.0f), *y = filled(c->n, 1.0f);
    const kvc_conv_args a = { .st = st, .ld_st = c->n, .wt = wt, .ld_w = c->n, .K = c->K, .u = u,
                              .u_mul = c->gates ? m1 : NULL, .bias = c->bias ? b : NULL, .silu = c->silu,
                              .y_mul = c->gates ? m2 : NULL, .y = y, .n = c->n };
    double best = 1e30;
    for (int trial = 0; trial < 8; trial++) {
        int64_t n = 0, t0 = cpu_us(), t1;
        do {
            kvc_conv_step_isa(isa, &a);
            n++;
            t1 = cpu_us();
        } while (t1 - t0 < 50000);
        best = best < (double)(t1 - t0) / (double)n ? best : (double)(t1 - t0) / (double)n;
    }
    free(st), free(wt), free(u), free(m1), free(m2), free(b), free(y);
    return best;
}

/* Microseconds of one token's scan over all heads on path isa. */
static double time_scan(kvc_isa isa, const scan_case *c)
{
    const int64_t per = (int64_t)c->hd * c->N;
    float *S = filled(c->heads * per, 1.0f), *x = filled(c->hd, 1.0f), *B = filled(c->N, 1.0f);
    float *C = filled(c->N, 1.0f), *y = filled(c->hd, 1.0f);
    double best = 1e30;
    for (int trial = 0; trial < 8; trial++) {
        int64_t n = 0, t0 = cpu_us(), t1;
        do {
            for (int32_t h = 0; h < c->heads; h++)
                kvc_ssm_scan_head_isa(isa, S + h * per, x, B, C, 0.97f, 0.1f, c->hd, c->N, y);
            n++;
            t1 = cpu_us();
        } while (t1 - t0 < 50000);
        best = best < (double)(t1 - t0) / (double)n ? best : (double)(t1 - t0) / (double)n;
    }
    free(S), free(x), free(B), free(C), free(y);
    return best;
}

int main(void)
{
    static const conv_case convs[] = {
        { "conv qwen3.5-9b GDN (8192 ch, K 4, silu)", 8192, 4, false, true, false },
        { "conv granite-4.0-h-tiny Mamba-2 (3328 ch, K 4, bias, silu)", 3328, 4, true, true, false },
        { "conv lfm2-1.2b short conv (2048 ch, K 3, gates)", 2048, 3, false, false, true },
    };
    static const scan_case scans[] = { { "scan granite-4.0-h-tiny Mamba-2 (48 x 64 x 128)", 48, 64, 128 } };
    const bool avx2 = kvc_kernels_set_isa(KVC_ISA_AVX2) == KVC_OK;
    printf("| kernel, one token of one layer | scalar us | avx2 us | speedup |\n|---|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof(convs) / sizeof(convs[0]); i++) {
        const double s = time_conv(KVC_ISA_SCALAR, &convs[i]), v = avx2 ? time_conv(KVC_ISA_AVX2, &convs[i]) : 0;
        printf("| %s | %.2f | %.2f | %.2fx |\n", convs[i].name, s, v, v > 0 ? s / v : 0.0);
    }
    for (size_t i = 0; i < sizeof(scans) / sizeof(scans[0]); i++) {
        const double s = time_scan(KVC_ISA_SCALAR, &scans[i]), v = avx2 ? time_scan(KVC_ISA_AVX2, &scans[i]) : 0;
        printf("| %s | %.2f | %.2f | %.2fx |\n", scans[i].name, s, v, v > 0 ? s / v : 0.0);
    }
    return 0;
}
