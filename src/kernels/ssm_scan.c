/* ssm_scan.c - the scalar reference of the Mamba-2 scan step and its dispatch
 * (ssm_scan.h). */
#include "ssm_scan.h"

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
