/* attention_avx512.c - one KV block folded into up to 16 query rows at a time:
 * 16 lanes are the block's 16 positions (scores) or 16 dimensions (output).
 * Each lane runs exactly the scalar reference's operations (attention.h).
 * The loops over rows are unrolled so that the accumulators stay in registers. */
#include "attention.h"

#include <immintrin.h>
#include <math.h>

static inline __m512 load16(bool f16, const void *base, int64_t i)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_loadu_ps((const float *)base + i);
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

/* Rows [r0, r0 + R) of block b. R is a constant at every call site, so the
 * accumulators stay in registers. */
static inline __attribute__((always_inline)) void block_rows(const kvc_attn_args *a, int64_t b,
                                                             int32_t r0, const int R)
{
    const int32_t hd = a->hd, rows = a->n_tok * a->n_q;
    const void *kb = a->k[b], *vb = a->v[b];
    const float *q[16];
    float *o[16], alpha[16], e[16][16];
    int32_t seen[16];
    __mmask16 mask[16];
    bool full = true;
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        q[r] = kvc_attn_q_row(a, r0 + r);
        o[r] = kvc_attn_o_row(a, r0 + r);
        seen[r] = kvc_attn_seen(a, b, r0 + r);
        mask[r] = (__mmask16)((1u << seen[r]) - 1);
        full = full && seen[r] == 16;
    }
    __m512 acc[16];
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m512 k = load16(a->f16, kb, (int64_t)d * 16);
        #pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k, acc[r]);
    }
    /* scores, their maxima, and every row's alpha at once (lane r: row r) */
    __m512 s[16];
    float mo[16] = { 0 }, mn[16] = { 0 };
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        float *m = a->scratch + r0 + r;
        s[r] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), mask[r],
                                  _mm512_mul_ps(acc[r], _mm512_set1_ps(a->scale)));
        float mb = _mm512_reduce_max_ps(s[r]);
        mo[r] = *m;
        mn[r] = *m = mb > *m ? mb : *m;
    }
    _mm512_storeu_ps(alpha, exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(mo), _mm512_loadu_ps(mn))));
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        float *l = a->scratch + rows + 16 * (r0 + r);
        __m512 ev = _mm512_maskz_mov_ps(mask[r], exp_neg16(_mm512_sub_ps(s[r], _mm512_set1_ps(mn[r]))));
        _mm512_storeu_ps(e[r], ev);
        _mm512_storeu_ps(l, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l), _mm512_set1_ps(alpha[r])), ev));
    }
    for (int32_t d0 = 0; d0 < hd; d0 += 16) {
        #pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_mul_ps(_mm512_loadu_ps(o[r] + d0), _mm512_set1_ps(alpha[r]));
        if (full) {
            for (int j = 0; j < 16; j++) {
                __m512 v = load16(a->f16, vb, (int64_t)j * hd + d0);
                #pragma GCC unroll 16
                for (int r = 0; r < R; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(e[r][j]), v, acc[r]);
            }
        } else {
            /* positions a row does not see may hold anything (even inf): skip, not times 0 */
            for (int j = 0; j < 16; j++) {
                __m512 v = load16(a->f16, vb, (int64_t)j * hd + d0);
                #pragma GCC unroll 16
                for (int r = 0; r < R; r++)
                    acc[r] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(e[r][j]), v, acc[r],
                                                   (__mmask16)-(j < seen[r]));
            }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            _mm512_storeu_ps(o[r] + d0, acc[r]);
    }
}

void kvc_attn_block_avx512(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1)
{
    for (; r0 + 16 <= r1; r0 += 16)
        block_rows(a, b, r0, 16);
    switch (r1 - r0) {
    case 15: block_rows(a, b, r0, 15); break;
    case 14: block_rows(a, b, r0, 14); break;
    case 13: block_rows(a, b, r0, 13); break;
    case 12: block_rows(a, b, r0, 12); break;
    case 11: block_rows(a, b, r0, 11); break;
    case 10: block_rows(a, b, r0, 10); break;
    case 9:  block_rows(a, b, r0, 9); break;
    case 8:  block_rows(a, b, r0, 8); break;
    case 7:  block_rows(a, b, r0, 7); break;
    case 6:  block_rows(a, b, r0, 6); break;
    case 5:  block_rows(a, b, r0, 5); break;
    case 4:  block_rows(a, b, r0, 4); break;
    case 3:  block_rows(a, b, r0, 3); break;
    case 2:  block_rows(a, b, r0, 2); break;
    case 1:  block_rows(a, b, r0, 1); break;
    default: break;
    }
}
