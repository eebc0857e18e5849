/* kernels_simd.h - inline helpers shared by the SIMD kernel files, which are
 * all compiled with at least AVX2, FMA and F16C (kernels_avx2.c,
 * kernels_avx512.c, kernels_vnni.c). Not for the scalar reference. */
#ifndef KVC_KERNELS_SIMD_H
#define KVC_KERNELS_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

#endif
