/* ssm_scan_avx2.c - the AVX2 paths of ssm_scan.h's kernels, the bits of the
 * scalar references: the scan step's eight lanes of one state row are the
 * reference's eight partial sums; the convolution runs 8 channels a vector,
 * each lane the reference's operations. */
#include "ssm_scan.h"

#include "kernels_simd.h"

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

/* silu on 8 lanes, ssm_scan.h's formula (kvc_swiglu's with u = 1). */
static inline __m256 silu8(__m256 g)
{
    const __m256 nabs = _mm256_or_ps(g, _mm256_set1_ps(-0.0f));           /* -|g| */
    const __m256 e = _mm256_and_ps(_mm256_cmp_ps(nabs, _mm256_set1_ps(-80.0f), _CMP_GE_OQ), kvc_exp_neg8(nabs));
    const __m256 pos = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ);  /* g >= 0 */
    const __m256 num = _mm256_blendv_ps(_mm256_mul_ps(g, e), g, pos);
    return _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* ssm_scan.h's convolution, 8 channels a vector; the last n % 8 by the reference. */
void kvc_conv_step_avx2(const kvc_conv_args *a)
{
    const int32_t K = a->K;
    int64_t ch = 0;
    for (; ch + 8 <= a->n; ch += 8) {
        __m256 x = _mm256_loadu_ps(a->u + ch);
        if (a->u_mul)
            x = _mm256_mul_ps(x, _mm256_loadu_ps(a->u_mul + ch));
        __m256 acc = _mm256_setzero_ps();
        for (int32_t k = 0; k < K - 1; k++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a->wt + k * a->ld_w + ch),
                                                   _mm256_loadu_ps(a->st + k * a->ld_st + ch)));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a->wt + (int64_t)(K - 1) * a->ld_w + ch), x));
        for (int32_t k = 0; k + 1 < K - 1; k++)
            _mm256_storeu_ps(a->st + k * a->ld_st + ch, _mm256_loadu_ps(a->st + (k + 1) * a->ld_st + ch));
        if (K > 1)
            _mm256_storeu_ps(a->st + (int64_t)(K - 2) * a->ld_st + ch, x);
        if (a->bias)
            acc = _mm256_add_ps(acc, _mm256_loadu_ps(a->bias + ch));
        if (a->silu)
            acc = silu8(acc);
        if (a->y_mul)
            acc = _mm256_mul_ps(acc, _mm256_loadu_ps(a->y_mul + ch));
        _mm256_storeu_ps(a->y + ch, acc);
    }
    kvc_conv_step_ref(a, ch);
}
