/* ssm_scan_avx2.c - the AVX2 path of the Mamba-2 scan step (ssm_scan.h): one
 * state row's eight lanes are the reference's eight partial sums, so the
 * bits are the scalar reference's. */
#include "ssm_scan.h"

#include <immintrin.h>

void kvc_ssm_scan_head_avx2(float *S, const float *x, const float *B, const float *C, float dA, float dt,
                            int32_t hd, int32_t N, float *y)
{
    const __m256 vda = _mm256_set1_ps(dA);
    for (int32_t r = 0; r < hd; r++) {
        float *s = S + (int64_t)r * N;
        const __m256 vxdt = _mm256_set1_ps(x[r] * dt);
        __m256 acc = _mm256_setzero_ps();
        for (int32_t k = 0; k < N; k += 8) {
            /* no FMA: the reference rounds each product */
            const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + k), vda),
                                           _mm256_mul_ps(_mm256_loadu_ps(B + k), vxdt));
            _mm256_storeu_ps(s + k, v);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(v, _mm256_loadu_ps(C + k)));
        }
        /* ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)) */
        const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        y[r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
    }
}
