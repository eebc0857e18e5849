/* attention_avx2.c - one KV block folded into up to 6 query rows at a time:
 * two 8-lane halves are the block's 16 positions (scores), 8 lanes are 8
 * dimensions (output). Each lane runs exactly the scalar reference's
 * operations (attention.h). The loops over rows are unrolled so that the
 * accumulators stay in registers. */
#include "attention.h"
#include "kernels_simd.h"

#include <immintrin.h>
#include <math.h>

static inline __m256 load8(bool f16, const void *base, int64_t i)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

/* Rows [r0, r0 + R) of block b; R is a constant at every call site. */
static inline __attribute__((always_inline)) void block_rows(const kvc_attn_args *a, int64_t b,
                                                             int32_t r0, const int R)
{
    const int32_t hd = a->hd, rows = a->n_tok * a->n_q;
    const void *kb = a->k[b], *vb = a->v[b];
    const float *q[6];
    float *o[6], alpha[6], e[6][16];
    int32_t seen[6];
    bool full = true;
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        q[r] = kvc_attn_q_row(a, r0 + r);
        o[r] = kvc_attn_o_row(a, r0 + r);
        seen[r] = kvc_attn_seen(a, b, r0 + r);
        full = full && seen[r] == 16;
    }
    __m256 lo[6], hi[6];
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        lo[r] = hi[r] = _mm256_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m256 k0 = load8(a->f16, kb, (int64_t)d * 16), k1 = load8(a->f16, kb, (int64_t)d * 16 + 8);
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 qd = _mm256_set1_ps(q[r][d]);
            lo[r] = _mm256_fmadd_ps(qd, k0, lo[r]);
            hi[r] = _mm256_fmadd_ps(qd, k1, hi[r]);
        }
    }
    /* scores, their maxima, and every row's alpha at once (lane r: row r) */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 s0[6], s1[6], m0[6], m1[6];
    float mo[8] = { 0 }, mn[8] = { 0 };
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *m = a->scratch + r0 + r;
        __m256 sc = _mm256_set1_ps(a->scale), ninf = _mm256_set1_ps(-INFINITY);
        m0[r] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(seen[r]), lane));
        m1[r] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(seen[r] - 8), lane));
        s0[r] = _mm256_blendv_ps(ninf, _mm256_mul_ps(lo[r], sc), m0[r]);
        s1[r] = _mm256_blendv_ps(ninf, _mm256_mul_ps(hi[r], sc), m1[r]);
        __m256 mx = _mm256_max_ps(s0[r], s1[r]);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float mb = _mm_cvtss_f32(m4);
        mo[r] = *m;
        mn[r] = *m = mb > *m ? mb : *m;
    }
    float al8[8];
    _mm256_storeu_ps(al8, kvc_exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(mo), _mm256_loadu_ps(mn))));
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *l = a->scratch + rows + 16 * (r0 + r);
        alpha[r] = al8[r];
        __m256 mv = _mm256_set1_ps(mn[r]), av = _mm256_set1_ps(alpha[r]);
        __m256 e0 = _mm256_and_ps(m0[r], kvc_exp_neg8(_mm256_sub_ps(s0[r], mv)));
        __m256 e1 = _mm256_and_ps(m1[r], kvc_exp_neg8(_mm256_sub_ps(s1[r], mv)));
        _mm256_storeu_ps(e[r], e0);
        _mm256_storeu_ps(e[r] + 8, e1);
        _mm256_storeu_ps(l, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(l), av), e0));
        _mm256_storeu_ps(l + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(l + 8), av), e1));
    }
    __m256 acc[6];
    for (int32_t d0 = 0; d0 < hd; d0 += 8) {
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_mul_ps(_mm256_loadu_ps(o[r] + d0), _mm256_set1_ps(alpha[r]));
        for (int j = 0; j < 16; j++) {
            __m256 v = load8(a->f16, vb, (int64_t)j * hd + d0);
            #pragma GCC unroll 6
            for (int r = 0; r < R; r++)
                if (full || j < seen[r])   /* unseen positions may hold anything: skip, not times 0 */
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(e[r][j]), v, acc[r]);
        }
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            _mm256_storeu_ps(o[r] + d0, acc[r]);
    }
}

void kvc_attn_block_avx2(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1)
{
    for (; r0 + 6 <= r1; r0 += 6)
        block_rows(a, b, r0, 6);
    switch (r1 - r0) {
    case 5: block_rows(a, b, r0, 5); break;
    case 4: block_rows(a, b, r0, 4); break;
    case 3: block_rows(a, b, r0, 3); break;
    case 2: block_rows(a, b, r0, 2); break;
    case 1: block_rows(a, b, r0, 1); break;
    default: break;
    }
}
