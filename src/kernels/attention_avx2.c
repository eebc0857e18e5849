/* attention_avx2.c - KV blocks folded into query rows: 8 lanes are 8 of a
 * block's 16 positions (scores) or 8 dimensions (output). Two kernels: the
 * blocks every row of the tile sees whole (all but the last one or two at
 * depth), two at a time, converted to F32 once for the whole tile and folded
 * into 6 rows at a time without masks; and any one block for up to 6 rows,
 * masked, for the rest. Each lane runs exactly the scalar reference's
 * operations (attention.h). The loops over rows are unrolled so that the
 * accumulators stay in registers. The avx2 ISA runs these float kernels
 * where the integer scheme does not apply (kvc_attn_uses_i16; its kernels
 * are in attention_avx2_i16.c). */
#include "attention.h"
#include "kernels_simd.h"

#include <immintrin.h>
#include <math.h>

/* ------------------------------------------------------------ any block */

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
    int32_t seen[6], from[6];   /* row r sees the block's positions [from[r], seen[r]) */
    bool full = true;
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        q[r] = kvc_attn_q_row(a, r0 + r);
        o[r] = kvc_attn_o_row(a, r0 + r);
        seen[r] = kvc_attn_seen(a, b, r0 + r);
        from[r] = kvc_attn_seen_lo(a, b, r0 + r);
        full = full && seen[r] == 16 && from[r] == 0;
    }
    int32_t lo_any = from[0], hi_any = seen[0];   /* the positions some row sees: K is read there only */
    #pragma GCC unroll 6
    for (int r = 1; r < R; r++) {
        lo_any = from[r] < lo_any ? from[r] : lo_any;
        hi_any = seen[r] > hi_any ? seen[r] : hi_any;
    }
    const __m256i any0 = _mm256_andnot_si256(kvc_first_lanes8(lo_any), kvc_first_lanes8(hi_any));
    const __m256i any1 = _mm256_andnot_si256(kvc_first_lanes8(lo_any - 8), kvc_first_lanes8(hi_any - 8));
    __m256 lo[6], hi[6];
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        lo[r] = hi[r] = _mm256_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m256 k0 = kvc_load8_seen(a->f16, kb, (int64_t)d * 16, any0),
               k1 = kvc_load8_seen(a->f16, kb, (int64_t)d * 16 + 8, any1);
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 qd = _mm256_set1_ps(q[r][d]);
            lo[r] = _mm256_fmadd_ps(qd, k0, lo[r]);
            hi[r] = _mm256_fmadd_ps(qd, k1, hi[r]);
        }
    }
    /* scores, their maxima, and every row's alpha at once (lane r: row r) */
    __m256 s0[6], s1[6], m0[6], m1[6];
    float mo[8] = { 0 }, mn[8] = { 0 };
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *m = a->scratch + r0 + r;
        __m256 sc = _mm256_set1_ps(a->scale), ninf = _mm256_set1_ps(-INFINITY);
        m0[r] = _mm256_castsi256_ps(_mm256_andnot_si256(kvc_first_lanes8(from[r]), kvc_first_lanes8(seen[r])));
        m1[r] = _mm256_castsi256_ps(_mm256_andnot_si256(kvc_first_lanes8(from[r] - 8), kvc_first_lanes8(seen[r] - 8)));
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
        for (int j = lo_any; j < hi_any; j++) {
            __m256 v = load8(a->f16, vb, (int64_t)j * hd + d0);
            #pragma GCC unroll 6
            for (int r = 0; r < R; r++)
                if (full || (j >= from[r] && j < seen[r]))   /* unseen positions may hold anything: skip, not times 0 */
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

/* ------------------------------------------------------------ full blocks
 * Blocks every row of the tile sees whole. WHY a second kernel: VCVTPH2PS
 * costs as much as two FMAs on Zen 3, and the block kernel converts K and V
 * again for every 6 rows. Here a pair of blocks is converted once into the
 * scratch (kvc_attn_f32_slot), where it stays in L1 while every row of the
 * tile takes it; each q[r][d] broadcast feeds 4 K vectors (3 rows at a
 * time), each e[r][j] broadcast 4 output vectors, and o stays in registers
 * across the two blocks. Every lane still runs the reference's operations
 * block after block. */

#define AI static inline __attribute__((always_inline))

enum { RS = 3, RO = 3, RG = 6 };   /* rows per score pass, per output pass, per group */

typedef struct fblock {
    const float *k;   /* [hd][16] */
    const float *v;   /* [16][hd] */
} fblock;

/* Block b in F32: its own memory (F32 K/V), or slot i of the scratch. */
static fblock fblock_get(const kvc_attn_args *a, int64_t b, int i)
{
    if (!a->f16)
        return (fblock){ a->k[b], a->v[b] };
    const int64_t n = (int64_t)a->hd * KVC_ATTN_B;
    float *s = kvc_attn_f32_slot(a, i);
    const uint16_t *k = a->k[b], *v = a->v[b];
    for (int64_t x = 0; x < n; x += 8) {
        _mm256_store_ps(s + x, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + x))));
        _mm256_store_ps(s + n + x, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + x))));
    }
    return (fblock){ s, s + n };
}

/* s[i][p + r] = the scores (times scale) of rows q[p + r], r < R, in the NB blocks. */
AI void scores(const kvc_attn_args *a, const fblock *fb, const float *const *q, float (*s)[RG][16],
               const int p, const int R, const int NB)
{
    __m256 acc[2][2][RS];
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++)
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++)
            acc[i][0][r] = acc[i][1][r] = _mm256_setzero_ps();
    for (int32_t d = 0; d < a->hd; d++) {
        __m256 k[2][2];
        #pragma GCC unroll 2
        for (int i = 0; i < NB; i++) {
            k[i][0] = _mm256_loadu_ps(fb[i].k + 16 * d);
            k[i][1] = _mm256_loadu_ps(fb[i].k + 16 * d + 8);
        }
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++) {
            const __m256 qd = _mm256_broadcast_ss(q[p + r] + d);
            #pragma GCC unroll 2
            for (int i = 0; i < NB; i++) {
                acc[i][0][r] = _mm256_fmadd_ps(qd, k[i][0], acc[i][0][r]);
                acc[i][1][r] = _mm256_fmadd_ps(qd, k[i][1], acc[i][1][r]);
            }
        }
    }
    const __m256 sc = _mm256_set1_ps(a->scale);
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++)
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++) {
            _mm256_store_ps(s[i][p + r], _mm256_mul_ps(acc[i][0][r], sc));
            _mm256_store_ps(s[i][p + r] + 8, _mm256_mul_ps(acc[i][1][r], sc));
        }
}

/* Rows o[p + r], r < R, 32 dimensions at a time: o * alpha, then the fma
 * chain over the block's 16 positions, block after block. hd % 32 == 0. */
AI void outputs(const kvc_attn_args *a, const fblock *fb, float *const *o, const float (*alpha)[8],
                const float (*e)[RG][16], const int p, const int R, const int NB)
{
    const int32_t hd = a->hd;
    for (int32_t d0 = 0; d0 < hd; d0 += 32) {
        __m256 acc[RO][4];
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm256_loadu_ps(o[p + r] + d0 + 8 * c);
        #pragma GCC unroll 2
        for (int i = 0; i < NB; i++) {
            #pragma GCC unroll 3
            for (int r = 0; r < R; r++) {
                const __m256 al = _mm256_broadcast_ss(&alpha[i][p + r]);
                #pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    acc[r][c] = _mm256_mul_ps(acc[r][c], al);
            }
            for (int j = 0; j < KVC_ATTN_B; j++) {
                __m256 v[4];
                #pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    v[c] = _mm256_loadu_ps(fb[i].v + (int64_t)j * hd + d0 + 8 * c);
                #pragma GCC unroll 3
                for (int r = 0; r < R; r++) {
                    const __m256 eb = _mm256_broadcast_ss(&e[i][p + r][j]);
                    #pragma GCC unroll 4
                    for (int c = 0; c < 4; c++)
                        acc[r][c] = _mm256_fmadd_ps(eb, v[c], acc[r][c]);
                }
            }
        }
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                _mm256_storeu_ps(o[p + r] + d0 + 8 * c, acc[r][c]);
    }
}

/* The NB blocks of fb into rows [r0, r0 + R), R <= RG, every position seen
 * by every row: scores RS rows at a time, the softmax of all R rows at once
 * (lane r: row r), then the output RO rows at a time. */
AI void full_rows(const kvc_attn_args *a, const fblock *fb, int32_t r0, const int R, const int NB)
{
    const int32_t rows = a->n_tok * a->n_q;
    const float *q[RG];
    float *o[RG];
    kvc_attn_rows_at(a, r0, R, q, o);
    _Alignas(32) float s[2][RG][16], e[2][RG][16], mn[2][8], alpha[2][8], m[8] = { 0 };
    #pragma GCC unroll 2
    for (int r = 0; r < R; r += RS)
        scores(a, fb, q, s, r, R - r < RS ? R - r : RS, NB);
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        m[r] = a->scratch[r0 + r];
    __m256 mv = _mm256_load_ps(m);
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++) {
        _Alignas(32) float mb[8] = { 0 };
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 mx = _mm256_max_ps(_mm256_load_ps(s[i][r]), _mm256_load_ps(s[i][r] + 8));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            mb[r] = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        }
        const __m256 m1 = _mm256_max_ps(_mm256_load_ps(mb), mv);   /* mb > m ? mb : m */
        _mm256_store_ps(alpha[i], kvc_exp_neg8(_mm256_sub_ps(mv, m1)));
        _mm256_store_ps(mn[i], m1);
        mv = m1;
    }
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        a->scratch[r0 + r] = mn[NB - 1][r];
        float *l = a->scratch + rows + 16 * (r0 + r);
        __m256 l0 = _mm256_loadu_ps(l), l1 = _mm256_loadu_ps(l + 8);
        #pragma GCC unroll 2
        for (int i = 0; i < NB; i++) {
            const __m256 mr = _mm256_broadcast_ss(&mn[i][r]), al = _mm256_broadcast_ss(&alpha[i][r]);
            const __m256 e0 = kvc_exp_neg8(_mm256_sub_ps(_mm256_load_ps(s[i][r]), mr));
            const __m256 e1 = kvc_exp_neg8(_mm256_sub_ps(_mm256_load_ps(s[i][r] + 8), mr));
            _mm256_store_ps(e[i][r], e0);
            _mm256_store_ps(e[i][r] + 8, e1);
            l0 = _mm256_add_ps(_mm256_mul_ps(l0, al), e0);
            l1 = _mm256_add_ps(_mm256_mul_ps(l1, al), e1);
        }
        _mm256_storeu_ps(l, l0);
        _mm256_storeu_ps(l + 8, l1);
    }
    #pragma GCC unroll 2
    for (int r = 0; r < R; r += RO)
        outputs(a, fb, o, (const float (*)[8])alpha, (const float (*)[RG][16])e, r, R - r < RO ? R - r : RO, NB);
}

/* Constants for full_rows to unroll on. Not inlined into the loop below:
 * inlined, the compiler keeps exp_neg8's constants in registers across it. */
static __attribute__((noinline)) void full_group(const kvc_attn_args *a, const fblock *fb, int32_t r0,
                                                 int32_t n, int nb)
{
#define FULL_CASES(NB)                                  \
    switch (n) {                                        \
    case 6: full_rows(a, fb, r0, 6, NB); break;         \
    case 5: full_rows(a, fb, r0, 5, NB); break;         \
    case 4: full_rows(a, fb, r0, 4, NB); break;         \
    case 3: full_rows(a, fb, r0, 3, NB); break;         \
    case 2: full_rows(a, fb, r0, 2, NB); break;         \
    case 1: full_rows(a, fb, r0, 1, NB); break;         \
    default: break;                                     \
    }
    if (nb == 2)
        FULL_CASES(2)
    else
        FULL_CASES(1)
#undef FULL_CASES
}

/* Blocks [b0, b1) two at a time (a last odd one alone), rows in groups of 6
 * (the last two split evenly: decode's 7 rows are 4 and 3). hd % 32 == 0. */
void kvc_attn_full_avx2(const kvc_attn_args *a, int64_t b0, int64_t b1)
{
    const int32_t rows = a->n_tok * a->n_q;
    for (int64_t b = b0, nb; b < b1; b += nb) {
        nb = b1 - b >= 2 ? 2 : 1;
        fblock fb[2];
        for (int i = 0; i < nb; i++)
            fb[i] = fblock_get(a, b + i, i);
        for (int32_t r = 0, n; r < rows; r += n) {
            const int32_t left = rows - r;
            n = left <= RG ? left : left < 2 * RG ? (left + 1) / 2 : RG;
            full_group(a, fb, r, n, (int)nb);
        }
    }
}
