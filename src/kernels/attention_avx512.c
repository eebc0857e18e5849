/* attention_avx512.c - KV blocks folded into query rows: 16 lanes are a
 * block's 16 positions (scores) or 16 dimensions (output). Two kernels: the
 * blocks every row of the tile sees whole (all but the last one or two at
 * depth), two blocks for 6 rows at a time without masks; and any one block
 * for up to 16 rows, masked, for the rest. Each lane runs exactly the scalar
 * reference's operations (attention.h). The loops over rows are unrolled so
 * that the accumulators stay in registers. */
#include "attention.h"
#include "kernels_simd.h"

#include <immintrin.h>
#include <math.h>

static inline __m512 load16(bool f16, const void *base, int64_t i)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_loadu_ps((const float *)base + i);
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
    __mmask16 mask[16];   /* the positions row r sees */
    __mmask16 any = 0;    /* some row sees: K and V are read there only */
    bool full = true;
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        q[r] = kvc_attn_q_row(a, r0 + r);
        o[r] = kvc_attn_o_row(a, r0 + r);
        mask[r] = (__mmask16)kvc_attn_span_mask(kvc_attn_seen_lo(a, b, r0 + r), kvc_attn_seen(a, b, r0 + r));
        full = full && mask[r] == 0xFFFF;
        any |= mask[r];
    }
    __m512 acc[16];
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m512 k = kvc_load16_seen(a->f16, kb, (int64_t)d * 16, any);
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
    _mm512_storeu_ps(alpha, kvc_exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(mo), _mm512_loadu_ps(mn))));
    #pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        float *l = a->scratch + rows + 16 * (r0 + r);
        __m512 ev = _mm512_maskz_mov_ps(mask[r], kvc_exp_neg16(_mm512_sub_ps(s[r], _mm512_set1_ps(mn[r]))));
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
                if (!((any >> j) & 1))
                    continue;
                __m512 v = load16(a->f16, vb, (int64_t)j * hd + d0);
                #pragma GCC unroll 16
                for (int r = 0; r < R; r++)
                    acc[r] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(e[r][j]), v, acc[r],
                                                   (__mmask16)-((mask[r] >> j) & 1));
            }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            _mm512_storeu_ps(o[r] + d0, acc[r]);
    }
}

/* ------------------------------------------------------------ full blocks
 * Blocks every row of the tile sees whole (attention.h's walk gives them
 * first): no masks, NB blocks at a time for R rows at a time. Each q[r][d]
 * broadcast feeds NB K vectors, each e[r][j] broadcast feeds C output chunks,
 * and o stays in registers across the NB blocks, while every lane still runs
 * the reference's operations block after block. */

/* o[r][d0 .. d0 + 16 C) of rows [r0, r0 + R) over the NB blocks from b0:
 * o = o * alpha, then the fma chain over the block's 16 positions, per block. */
static inline __attribute__((always_inline)) void pv_chunks(const kvc_attn_args *a, int64_t b0,
        float *const *o, int32_t d0, const float (*alpha)[16], const float (*e)[8][16],
        const int r0, const int R, const int NB, const int C, const bool f16)
{
    const int32_t hd = a->hd;
    __m512 acc[8][4];
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_loadu_ps(o[r0 + r] + d0 + 16 * c);
    #pragma GCC unroll 4
    for (int i = 0; i < NB; i++) {
        const void *vb = a->v[b0 + i];
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_mul_ps(acc[r][c], _mm512_set1_ps(alpha[i][r0 + r]));
        for (int j = 0; j < 16; j++) {
            __m512 v[4];
            #pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                v[c] = load16(f16, vb, (int64_t)j * hd + d0 + 16 * c);
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 eb = _mm512_set1_ps(e[i][r0 + r][j]);
                #pragma GCC unroll 4
                for (int c = 0; c < C; c++)
                    acc[r][c] = _mm512_fmadd_ps(eb, v[c], acc[r][c]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            _mm512_storeu_ps(o[r0 + r] + d0 + 16 * c, acc[r][c]);
}

/* Rows [r0, r0 + R) of the output, R <= 6: 4 chunks of 16 dimensions at a
 * time (4 R accumulators), then 2, then 1. */
static inline __attribute__((always_inline)) void pv_rows(const kvc_attn_args *a, int64_t b0,
        float *const *o, const float (*alpha)[16], const float (*e)[8][16],
        const int r0, const int R, const int NB, const bool f16)
{
    const int32_t hd = a->hd;
    int32_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64)
        pv_chunks(a, b0, o, d0, alpha, e, r0, R, NB, 4, f16);
    for (; d0 + 32 <= hd; d0 += 32)
        pv_chunks(a, b0, o, d0, alpha, e, r0, R, NB, 2, f16);
    for (; d0 < hd; d0 += 16)
        pv_chunks(a, b0, o, d0, alpha, e, r0, R, NB, 1, f16);
}

/* Blocks [b0, b0 + NB) into rows [r0, r0 + R), every position seen by every row. */
static inline __attribute__((always_inline)) void full_rows(const kvc_attn_args *a, int64_t b0,
                                                            int32_t r0, const int R, const int NB,
                                                            const bool f16)
{
    const int32_t hd = a->hd, rows = a->n_tok * a->n_q;
    const float *q[8];
    int32_t t[8], h[8];   /* row r0 + r is head h[r] of token t[r]: one division, not R */
    t[0] = r0 / a->n_q;
    h[0] = r0 % a->n_q;
    #pragma GCC unroll 8
    for (int r = 1; r < R; r++) {
        bool next = h[r - 1] + 1 == a->n_q;
        t[r] = t[r - 1] + next;
        h[r] = next ? 0 : h[r - 1] + 1;
    }
    float *o[8];
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        q[r] = a->q + (int64_t)t[r] * a->ldq + (int64_t)h[r] * hd;
        o[r] = a->out + (int64_t)t[r] * a->ldo + (int64_t)h[r] * hd;
    }
    /* o waits in memory: held in registers through the scores, it took the
     * place of the q pointers, which went to vector registers */
    __asm__("" : : "r"(o) : "memory");
    __m512 s[4][8];
    #pragma GCC unroll 4
    for (int i = 0; i < NB; i++)
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            s[i][r] = _mm512_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m512 k[4];
        #pragma GCC unroll 4
        for (int i = 0; i < NB; i++)
            k[i] = load16(f16, a->k[b0 + i], (int64_t)d * 16);
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 qb = _mm512_set1_ps(q[r][d]);
            #pragma GCC unroll 4
            for (int i = 0; i < NB; i++)
                s[i][r] = _mm512_fmadd_ps(qb, k[i], s[i][r]);
        }
    }
    /* the running maxima block after block, all rows at once (lane r: row r) */
    _Alignas(64) float mn[4][16], alpha[4][16], e[4][8][16];
    const __mmask16 rmask = (__mmask16)((1u << R) - 1);
    __m512 m = _mm512_maskz_loadu_ps(rmask, a->scratch + r0);
    #pragma GCC unroll 4
    for (int i = 0; i < NB; i++) {
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            s[i][r] = _mm512_mul_ps(s[i][r], _mm512_set1_ps(a->scale));
        __m512 m1 = _mm512_max_ps(kvc_rows_max16(s[i], R), m);
        _mm512_store_ps(alpha[i], kvc_exp_neg16(_mm512_sub_ps(m, m1)));
        _mm512_store_ps(mn[i], m1);
        m = m1;
    }
    _mm512_mask_storeu_ps(a->scratch + r0, rmask, m);
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float *l = a->scratch + rows + 16 * (r0 + r);
        __m512 lv = _mm512_loadu_ps(l);
        #pragma GCC unroll 4
        for (int i = 0; i < NB; i++) {
            __m512 ev = kvc_exp_neg16(_mm512_sub_ps(s[i][r], _mm512_set1_ps(mn[i][r])));
            _mm512_store_ps(e[i][r], ev);
            lv = _mm512_add_ps(_mm512_mul_ps(lv, _mm512_set1_ps(alpha[i][r])), ev);
        }
        _mm512_storeu_ps(l, lv);
    }
    /* e and alpha stay in memory, read by broadcast loads where they are used
     * (else the compiler holds them in registers the accumulators need) */
    __asm__("" : : "r"(alpha), "r"(e) : "memory");
    if (R <= 6) {
        pv_rows(a, b0, o, alpha, e, 0, R, NB, f16);
    } else {
        pv_rows(a, b0, o, alpha, e, 0, 4, NB, f16);
        pv_rows(a, b0, o, alpha, e, 4, R - 4, NB, f16);
    }
}

/* Blocks [b0, b0 + NB) into rows [r0, r0 + n), 1 <= n <= 8; the constants
 * R, NB and f16 reach full_rows, which unrolls on them. */
static inline __attribute__((always_inline)) void full_rows_n(const kvc_attn_args *a, int64_t b0,
                                                              int32_t r0, int32_t n, const int NB,
                                                              const bool f16)
{
    switch (n) {
    case 8: full_rows(a, b0, r0, 8, NB, f16); break;
    case 7: full_rows(a, b0, r0, 7, NB, f16); break;
    case 6: full_rows(a, b0, r0, 6, NB, f16); break;
    case 5: full_rows(a, b0, r0, 5, NB, f16); break;
    case 4: full_rows(a, b0, r0, 4, NB, f16); break;
    case 3: full_rows(a, b0, r0, 3, NB, f16); break;
    case 2: full_rows(a, b0, r0, 2, NB, f16); break;
    case 1: full_rows(a, b0, r0, 1, NB, f16); break;
    default: break;
    }
}

/* Not inlined into the loops below: inlined, the compiler keeps exp_neg16's
 * constants in registers across them and spills the accumulators instead. */
static __attribute__((noinline)) void full_group(const kvc_attn_args *a, int64_t b0, int32_t r0,
                                                 int32_t n, int nb)
{
    if (a->f16 && nb == 2)
        full_rows_n(a, b0, r0, n, 2, true);
    else if (a->f16)
        full_rows_n(a, b0, r0, n, 1, true);
    else if (nb == 2)
        full_rows_n(a, b0, r0, n, 2, false);
    else
        full_rows_n(a, b0, r0, n, 1, false);
}

/* Blocks [b0, b1) two at a time (a last odd one alone), rows in groups of 6,
 * the last one up to 8 (decode's 7 rows are one group). Two blocks for 6 rows
 * keep 12 score and 24 output accumulators in registers. */
void kvc_attn_full_avx512(const kvc_attn_args *a, int64_t b0, int64_t b1)
{
    const int32_t rows = a->n_tok * a->n_q;
    for (int64_t b = b0, nb; b < b1; b += nb) {
        nb = b1 - b >= 2 ? 2 : 1;
        for (int32_t r = 0, n; r < rows; r += n) {
            n = rows - r <= 8 ? rows - r : 6;
            full_group(a, b, r, n, (int)nb);
        }
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
