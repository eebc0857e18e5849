/* attention_avx512.c - the attention passes with 16-lane fused multiply-adds.
 * Each lane runs exactly the scalar reference's chain (attention.c). */
#include "attention.h"

#include <immintrin.h>
#include <math.h>

static inline __m512 load16(const kvc_attn_args *a, const void *base, int64_t i)
{
    if (a->f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_loadu_ps((const float *)base + i);
}

/* 16 positions of a block at once: lane j accumulates q[d] * K[d][j] over d. */
void kvc_attn_scores_avx512(const kvc_attn_args *a)
{
    const int64_t nb = (a->n_pos + 15) / 16, stride = nb * 16;
    for (int64_t b = 0; b < nb; b++) {
        __m512 acc[16];
        for (int32_t h = 0; h < a->n_q; h++)
            acc[h] = _mm512_setzero_ps();
        for (int32_t d = 0; d < a->hd; d++) {
            __m512 k = load16(a, a->k[b], (int64_t)d * 16);
            for (int32_t h = 0; h < a->n_q; h++)
                acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(a->q[h * a->hd + d]), k, acc[h]);
        }
        __m512 sc = _mm512_set1_ps(a->scale);
        for (int32_t h = 0; h < a->n_q; h++)
            _mm512_storeu_ps(a->scores + h * stride + b * 16, _mm512_mul_ps(acc[h], sc));
    }
}

/* 16 dimensions at once: lane d accumulates e_j * V[j][d] over j. */
void kvc_attn_output_avx512(const kvc_attn_args *a)
{
    const int64_t stride = (a->n_pos + 15) / 16 * 16;
    for (int32_t d0 = 0; d0 < a->hd; d0 += 16) {
        __m512 acc[16];
        for (int32_t h = 0; h < a->n_q; h++)
            acc[h] = _mm512_setzero_ps();
        for (int64_t j = 0; j < a->n_pos; j++) {
            __m512 v = load16(a, a->v[j / 16], (j % 16) * a->hd + d0);
            for (int32_t h = 0; h < a->n_q; h++)
                acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(a->scores[h * stride + j]), v, acc[h]);
        }
        for (int32_t h = 0; h < a->n_q; h++)
            _mm512_storeu_ps(a->out + h * a->hd + d0, acc[h]);
    }
}

static inline __m512 exp_neg16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-80.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

void kvc_attn_softmax_avx512(const kvc_attn_args *a, float *inv)
{
    const int64_t stride = (a->n_pos + 15) / 16 * 16;
    for (int32_t h = 0; h < a->n_q; h++) {
        float *s = a->scores + h * stride;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= a->n_pos; j += 16)
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
        __mmask16 tail = (__mmask16)((1u << (a->n_pos - j)) - 1);
        if (j < a->n_pos)
            mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, s + j));
        __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j + 16 <= a->n_pos; j += 16) {
            __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
            _mm512_storeu_ps(s + j, e);
            sum = _mm512_add_ps(sum, e);
        }
        if (j < a->n_pos) {
            __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + j), m));
            _mm512_mask_storeu_ps(s + j, tail, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
        }
        /* halves added pairwise: lanes i + 8, then + 4, + 2, + 1 */
        __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
        inv[h] = 1.0f / _mm_cvtss_f32(s1);
    }
}
