/* attention_avx2.c - the attention passes with 8-lane fused multiply-adds.
 * Each lane runs exactly the scalar reference's chain (attention.c). */
#include "attention.h"

#include <immintrin.h>
#include <math.h>

static inline __m256 load8(const kvc_attn_args *a, const void *base, int64_t i)
{
    if (a->f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

void kvc_attn_scores_avx2(const kvc_attn_args *a)
{
    const int64_t nb = (a->n_pos + 15) / 16, stride = nb * 16;
    for (int64_t b = 0; b < nb; b++)
        for (int32_t half = 0; half < 16; half += 8) {
            __m256 acc[16];
            for (int32_t h = 0; h < a->n_q; h++)
                acc[h] = _mm256_setzero_ps();
            for (int32_t d = 0; d < a->hd; d++) {
                __m256 k = load8(a, a->k[b], (int64_t)d * 16 + half);
                for (int32_t h = 0; h < a->n_q; h++)
                    acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(a->q[h * a->hd + d]), k, acc[h]);
            }
            __m256 sc = _mm256_set1_ps(a->scale);
            for (int32_t h = 0; h < a->n_q; h++)
                _mm256_storeu_ps(a->scores + h * stride + b * 16 + half, _mm256_mul_ps(acc[h], sc));
        }
}

void kvc_attn_output_avx2(const kvc_attn_args *a)
{
    const int64_t stride = (a->n_pos + 15) / 16 * 16;
    for (int32_t d0 = 0; d0 < a->hd; d0 += 8) {
        __m256 acc[16];
        for (int32_t h = 0; h < a->n_q; h++)
            acc[h] = _mm256_setzero_ps();
        for (int64_t j = 0; j < a->n_pos; j++) {
            __m256 v = load8(a, a->v[j / 16], (j % 16) * a->hd + d0);
            for (int32_t h = 0; h < a->n_q; h++)
                acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(a->scores[h * stride + j]), v, acc[h]);
        }
        for (int32_t h = 0; h < a->n_q; h++)
            _mm256_storeu_ps(a->out + h * a->hd + d0, acc[h]);
    }
}

static inline __m256 exp_neg8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-80.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* Lanes 0-7 of the 16 partial sums in lo, 8-15 in hi (the AVX-512 layout). */
void kvc_attn_softmax_avx2(const kvc_attn_args *a, float *inv)
{
    const int64_t stride = (a->n_pos + 15) / 16 * 16;
    for (int32_t h = 0; h < a->n_q; h++) {
        float *s = a->scores + h * stride;
        float mx = -INFINITY;
        for (int64_t j = 0; j < a->n_pos; j++)
            mx = s[j] > mx ? s[j] : mx;
        __m256 m = _mm256_set1_ps(mx), lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 16 <= a->n_pos; j += 16) {
            __m256 e0 = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
            __m256 e1 = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), m));
            _mm256_storeu_ps(s + j, e0);
            _mm256_storeu_ps(s + j + 8, e1);
            lo = _mm256_add_ps(lo, e0);
            hi = _mm256_add_ps(hi, e1);
        }
        if (j < a->n_pos) {
            float t[16] = { 0 };
            int64_t k = a->n_pos - j;
            for (int64_t i = 0; i < k; i++)
                t[i] = s[j + i] - mx;
            __m256 e0 = exp_neg8(_mm256_loadu_ps(t)), e1 = exp_neg8(_mm256_loadu_ps(t + 8));
            _mm256_storeu_ps(t, e0);
            _mm256_storeu_ps(t + 8, e1);
            for (int64_t i = k; i < 16; i++)
                t[i] = 0.0f;
            for (int64_t i = 0; i < k; i++)
                s[j + i] = t[i];
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(t));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(t + 8));
        }
        __m256 s8 = _mm256_add_ps(lo, hi);
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
        inv[h] = 1.0f / _mm_cvtss_f32(s1);
    }
}
