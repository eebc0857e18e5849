/* kernels_simd.h - inline helpers shared by the SIMD kernel files, which are
 * all compiled with at least AVX2, FMA and F16C (kernels_avx2.c,
 * kernels_avx2_int8.c, kernels_avx512.c, kernels_vnni.c, attention_avx2.c,
 * attention_avx2_i16.c, attention_avx512.c, attention_vnni.c).
 * Not for the scalar reference. */
#ifndef KVC_KERNELS_SIMD_H
#define KVC_KERNELS_SIMD_H

#include "attention.h"   /* the constants of kvc_exp2_neg */

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* All-ones in the first n of 8 int32 lanes (none for n <= 0, all for
 * 8 <= n < 2^31): the masks of a vector's tail or of the positions a row
 * sees. */
static inline __attribute__((always_inline)) __m256i kvc_first_lanes8(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 K values (F16 or F32, at element i of base) as floats, the lanes not
 * set in `seen` (all-ones int32 lanes: the positions some row sees) 0
 * before any use: the pool never wrote them (a block's positions past the
 * sequence's end) or they are behind every row's window, so no value of
 * theirs may take part, not even times 0 (a NaN), nor to valgrind, for
 * which one undefined half makes every lane of a VCVTPH2PS undefined. */
static inline __attribute__((always_inline)) __m256 kvc_load8_seen(bool f16, const void *base, int64_t i,
                                                                   __m256i seen)
{
    if (f16) {
        const __m128i seen16 = _mm_packs_epi32(_mm256_castsi256_si128(seen), _mm256_extracti128_si256(seen, 1));
        return _mm256_cvtph_ps(_mm_and_si128(seen16, _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i))));
    }
    return _mm256_and_ps(_mm256_castsi256_ps(seen), _mm256_loadu_ps((const float *)base + i));
}

#ifdef __AVX512BW__
/* The same for 16 positions with masked loads: the lanes not in `seen` are
 * not read at all, and are 0. */
static inline __attribute__((always_inline)) __m512 kvc_load16_seen(bool f16, const void *base, int64_t i,
                                                                    __mmask16 seen)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(seen, (const uint16_t *)base + i));
    return _mm512_maskz_loadu_ps(seen, (const float *)base + i);
}
#endif

/* The 8 sub-block scales and mins of a Q4_K / Q5_K super-block, as quant.c's
 * reference dequantization makes them: ds[j] = d * sc_j, dm[j] = dmin * m_j
 * (one float multiply each). s: the 12 packed 6-bit values. */
static inline __attribute__((always_inline)) void kvc_k4_scales(const uint8_t *s, float d, float dmin,
                                                                float ds[8], float dm[8])
{
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t sc_lo = u0 & 0x3f3f3f3f, m_lo = u1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4;
    const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4;
    __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo)));
    __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)m_hi, (int)m_lo)));
    _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_set1_ps(d), sc));
    _mm256_storeu_ps(dm, _mm256_mul_ps(_mm256_set1_ps(dmin), m));
}

/* kvc_exp_neg (attention.c) on 8 or 16 lanes, the same operations lane by
 * lane: exp(x) for x <= 0, clamped at -80. */
static inline __attribute__((always_inline)) __m256 kvc_exp_neg8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-80.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* kvc_exp2_neg (attention.c) on 8 or 16 lanes, the same operations lane by
 * lane: 2^x for x <= 0. The multiply by 2^n is exact (n >= -120: 2^n and the
 * result are normal), as VSCALEFPS is, and as adding n to the exponent
 * field. */
static inline __attribute__((always_inline)) __m256 kvc_exp2_neg8(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-120.0f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(KVC_EXP2_C4), f, _mm256_set1_ps(KVC_EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(KVC_EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(KVC_EXP2_C1));
    /* p in [0.7, 1.5]: n added to its exponent field is the exact product */
    const __m256i p2 = _mm256_castps_si256(_mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f)));
    return _mm256_castsi256_ps(_mm256_add_epi32(p2, _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23)));
}

#ifdef __AVX512F__
static inline __attribute__((always_inline)) __m512 kvc_exp2_neg16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-120.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(KVC_EXP2_C4), f, _mm512_set1_ps(KVC_EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(KVC_EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(KVC_EXP2_C1));
    return _mm512_scalef_ps(_mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f)), n);
}

static inline __attribute__((always_inline)) __m512 kvc_exp_neg16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-80.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    /* y * 2^n in one VSCALEFPS: exact, as the reference's multiply is (n >= -116 and
     * y ~ 1: no subnormal, no rounding) */
    return _mm512_scalef_ps(y, n);
}

/* Lane r of the result = the maximum of the lanes of s[r], r < R (R <= 16):
 * a transposing tree of shuffles and maxima instead of R horizontal
 * reductions. The maximum does not depend on the order (for scores that are
 * not NaN; unseen positions, which may hold anything, never reach here). */
static inline __attribute__((always_inline)) __m512 kvc_rows_max16(const __m512 *s, const int R)
{
    /* slot k + 4i holds row 4k + i, so that lane L of the tree's result is row L */
    __m512 v[16], w[8], z[4], y[2];
    #pragma GCC unroll 16
    for (int slot = 0; slot < 16; slot++) {
        int row = 4 * (slot % 4) + slot / 4;
        v[slot] = s[row < R ? row : 0];
    }
    #pragma GCC unroll 8
    for (int p = 0; p < 8; p++)   /* 8 partial maxima of 2 rows */
        w[p] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    #pragma GCC unroll 4
    for (int p = 0; p < 4; p++)   /* 4 of 4 rows */
        z[p] = _mm512_max_ps(_mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0xDD));
    #pragma GCC unroll 2
    for (int p = 0; p < 2; p++)   /* 2 of 8 rows */
        y[p] = _mm512_max_ps(_mm512_shuffle_ps(z[2 * p], z[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * p], z[2 * p + 1], 0xEE));
    return _mm512_max_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
}
#endif

#endif
