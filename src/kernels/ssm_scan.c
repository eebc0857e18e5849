/* ssm_scan.c - the scalar references of the recurrent mixers' per-token
 * kernels and their dispatch (ssm_scan.h). */
#include "ssm_scan.h"
#include "attention.h"

#include <math.h>

static void scan_head_ref(float *S, const float *x, const float *B, const float *C, float dA, float dt,
                          int32_t hd, int32_t N, float *y)
{
    for (int32_t r = 0; r < hd; r++) {
        float *s = S + (int64_t)r * N;
        const float xdt = x[r] * dt;
        float p[8] = { 0 };
        for (int32_t k = 0; k < N; k++) {
            const float v = s[k] * dA + B[k] * xdt;
            s[k] = v;
            p[k % 8] += v * C[k];
        }
        y[r] = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
    }
}

void kvc_ssm_scan_head_isa(kvc_isa isa, float *S, const float *x, const float *B, const float *C, float dA,
                           float dt, int32_t hd, int32_t N, float *y)
{
    if (isa >= KVC_ISA_AVX2 && N % 8 == 0)
        kvc_ssm_scan_head_avx2(S, x, B, C, dA, dt, hd, N, y);
    else
        scan_head_ref(S, x, B, C, dA, dt, hd, N, y);
}

void kvc_ssm_scan_head(float *S, const float *x, const float *B, const float *C, float dA, float dt,
                       int32_t hd, int32_t N, float *y)
{
    kvc_ssm_scan_head_isa(kvc_kernels_isa(), S, x, B, C, dA, dt, hd, N, y);
}

/* ------------------------------------------------------- convolution */

void kvc_conv_step_ref(const kvc_conv_args *a, int64_t ch0)
{
    const int32_t K = a->K;
    for (int64_t ch = ch0; ch < a->n; ch++) {
        const float x = a->u_mul ? a->u[ch] * a->u_mul[ch] : a->u[ch];
        float acc = 0.0f;
        for (int32_t k = 0; k < K - 1; k++)
            acc = acc + a->wt[k * a->ld_w + ch] * a->st[k * a->ld_st + ch];
        acc = acc + a->wt[(int64_t)(K - 1) * a->ld_w + ch] * x;
        for (int32_t k = 0; k + 1 < K - 1; k++)
            a->st[k * a->ld_st + ch] = a->st[(k + 1) * a->ld_st + ch];
        if (K > 1)
            a->st[(int64_t)(K - 2) * a->ld_st + ch] = x;
        if (a->bias)
            acc = acc + a->bias[ch];
        if (a->silu) {
            const float e = fabsf(acc) <= 80.0f ? kvc_exp_neg(-fabsf(acc)) : 0.0f;
            acc = (acc >= 0.0f ? acc : acc * e) / (1.0f + e);
        }
        a->y[ch] = a->y_mul ? acc * a->y_mul[ch] : acc;
    }
}

void kvc_conv_step_isa(kvc_isa isa, const kvc_conv_args *a)
{
    if (isa >= KVC_ISA_AVX2)
        kvc_conv_step_avx2(a);
    else
        kvc_conv_step_ref(a, 0);
}

void kvc_conv_step(const kvc_conv_args *a) { kvc_conv_step_isa(kvc_kernels_isa(), a); }

void kvc_conv_taps_transpose(const float *w, int64_t n, int32_t K, float *wt)
{
    for (int64_t ch = 0; ch < n; ch++)
        for (int32_t k = 0; k < K; k++)
            wt[k * n + ch] = w[ch * K + k];
}
