/* attention_avx2_i16.c - the integer scheme of attention.h with AVX2, for the
 * "avx2" ISA where kvc_attn_i16_ok(hd). As in attention_vnni.c, a KV block is
 * put in integer form once per call for all the rows of the tile that see
 * the same positions of it (a slot of the scratch, in the layout of
 * kvc_attn_i16_block), then folded into up to 4 rows at a time.
 *
 * WHY on AVX2: VPMADDWD multiplies 16 int16 pairs and adds each pair into an
 * int32 lane; with its VPADDD it runs about 1.5 a cycle on Zen 3, 24
 * multiply-adds a cycle against the 16 of two 8-lane FMAs, and K/V are
 * converted once a tile instead of once for every few rows. The integer sums
 * are exact in any order and every float step is attention.h's, lane by
 * lane, so the results equal kvc_attention_ref_i16 (and the vnni ISA) bit
 * for bit.
 *
 * Lanes. Scores: two vectors per block, lane = position j mod 8; the dword
 * of pair p holds (Ki[2p][j], Ki[2p + 1][j]) and the broadcast (a[2p],
 * a[2p + 1]). Output: lane = dimension d; the dword of pair k holds
 * (Vi[2k][d], Vi[2k + 1][d]) and the broadcast (Pi[2k], Pi[2k + 1]).
 *
 * Built with -mavx2 -mfma -mf16c. */
#include "attention.h"
#include "kernels_int8.h"
#include "kernels_simd.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

enum { B = KVC_ATTN_B, R_MAX = 4 };

AI __m256 load8(bool f16, const void *base, int64_t i)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

AI __m256 abs8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

/* rint(x) per lane, in int32 lanes whose low word is the int16; a NaN gives
 * 0x80000000, whose low word (all that pair16 and the packs keep) is 0. */
AI __m256i rint32(__m256 x) { return _mm256_cvtps_epi32(x); }

/* int16 pairs: the low word of each dword from lo, the high one from hi. */
AI __m256i pair16(__m256i lo, __m256i hi)
{
    return _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xAA);
}

/* acc + VPMADDWD(v, the dword *p broadcast). The add is written in asm so
 * that the sum stays a chain in its own register: GCC would otherwise
 * reassociate the adds into a tree and spill the products (or, with an
 * empty asm barrier, copy the register after every add). */
AI __m256i madd_bcast(__m256i acc, __m256i v, const int32_t *p)
{
    const __m256i prod = _mm256_madd_epi16(v, _mm256_set1_epi32(*p));
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(prod));
    return acc;
}

/* acc0 += VPMADDWD(v0, *p broadcast), acc1 += VPMADDWD(v1, the same), the
 * broadcast a load of its own: written as C, GCC keeps every broadcast of
 * the output's weights in a register or on the stack, extracting them with
 * ALU instructions the madds need. */
AI void madd2_bcast_mem(__m256i *acc0, __m256i *acc1, __m256i v0, __m256i v1, const int32_t *p)
{
    __m256i b, t0, t1;
    __asm__("vpbroadcastd %[p], %[b]\n\t"
            "vpmaddwd %[v0], %[b], %[t0]\n\t"
            "vpmaddwd %[v1], %[b], %[t1]\n\t"
            "vpaddd %[t0], %[a0], %[a0]\n\t"
            "vpaddd %[t1], %[a1], %[a1]"
            : [a0] "+x"(*acc0), [a1] "+x"(*acc1), [b] "=&x"(b), [t0] "=&x"(t0), [t1] "=&x"(t1)
            : [v0] "x"(v0), [v1] "x"(v1), [p] "m"(*p));
}

/* Lane r of the result = the maximum of the 8 lanes of x[r], r < R <= 4
 * (lanes past R: row 0). The maximum does not depend on the order (for
 * scores that are not NaN). */
AI __m128 rows_max4(const __m256 *x, const int R)
{
    const __m256 x0 = x[0], x1 = x[R > 1], x2 = x[R > 2 ? 2 : 0], x3 = x[R > 3 ? 3 : 0];
    const __m256 u01 = _mm256_max_ps(_mm256_shuffle_ps(x0, x1, 0x44), _mm256_shuffle_ps(x0, x1, 0xEE));
    const __m256 u23 = _mm256_max_ps(_mm256_shuffle_ps(x2, x3, 0x44), _mm256_shuffle_ps(x2, x3, 0xEE));
    const __m256 v = _mm256_max_ps(_mm256_shuffle_ps(u01, u23, 0x88), _mm256_shuffle_ps(u01, u23, 0xDD));
    return _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

/* All-ones in the lanes j (of 8, position base + j) with lo <= base + j < n. */
AI __m256 seen_mask(int32_t base, int32_t lo, int32_t n)
{
    return _mm256_castsi256_ps(_mm256_andnot_si256(kvc_first_lanes8(lo - base), kvc_first_lanes8(n - base)));
}

/* kvc_attn_i16_quantize_q with SSE lanes, for kvc_attn_i16_ok(hd): lane i
 * of the norm is the reference's fma chain over d = i, i + 4, ..., the rest
 * its scalar steps. Run by the vnni ISA too, which has AVX2. */
void kvc_attn_i16_quantize_q_simd(const kvc_attn_args *a)
{
    const int32_t rows = a->n_tok * a->n_q, hd = a->hd;
    int16_t *qi = kvc_attn_i16_q(a);
    float *cq = kvc_attn_i16_cq(a);
    for (int32_t r = 0; r < rows; r++) {
        const float *x = kvc_attn_q_row(a, r);
        int16_t *xi = qi + (size_t)r * hd;
        __m128 c = _mm_setzero_ps(), mx = _mm_setzero_ps();
        for (int32_t d = 0; d < hd; d += 4) {
            const __m128 v = _mm_loadu_ps(x + d);
            c = _mm_fmadd_ps(v, v, c);
            mx = _mm_max_ps(_mm_andnot_ps(_mm_set1_ps(-0.0f), v), mx);   /* a NaN v leaves mx */
        }
        _Alignas(16) float cl[4], ml[4];
        _mm_store_ps(cl, c);
        _mm_store_ps(ml, mx);
        const float n2 = (cl[0] + cl[1]) + (cl[2] + cl[3]);
        const float amax = fmaxf(fmaxf(ml[0], ml[1]), fmaxf(ml[2], ml[3]));
        if (!(amax >= KVC_I8_AMIN) || !(n2 <= FLT_MAX)) {
            memset(xi, 0, (size_t)hd * sizeof(*xi));
            cq[r] = 0.0f;
            continue;
        }
        const float inv = fminf(46000.0f / sqrtf(n2), 32767.0f / amax);
        const __m256 iv = _mm256_set1_ps(inv);
        for (int32_t d = 0; d < hd; d += 16) {   /* |x * inv| <= 32767: the packs do not saturate */
            const __m256i lo = rint32(_mm256_mul_ps(_mm256_loadu_ps(x + d), iv));
            const __m256i hi = rint32(_mm256_mul_ps(_mm256_loadu_ps(x + d + 8), iv));
            _mm256_storeu_si256((__m256i *)(xi + d), _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8));
        }
        cq[r] = ((1.0f / inv) * a->scale) * KVC_LOG2E;
    }
}

/* Block b into slot ib as rows that see its positions [j0, n) take it (the
 * ops' convert). */
AI void convert_kv(const kvc_attn_args *a, int64_t b, int32_t j0, int32_t n, const kvc_attn_i16_block *ib,
                   const bool f16)
{
    const int32_t hd = a->hd;
    const void *kb = a->k[b], *vb = a->v[b];
    /* K: lane j is position 8h + j; the squared norm as four fma chains over d */
    for (int h = 0; h < 2; h++) {
        const __m256 seen = seen_mask(8 * h, j0, n);
        const __m256i seeni = _mm256_castps_si256(seen);
        __m256 c[4], mx[4];
        for (int i = 0; i < 4; i++)
            c[i] = mx[i] = _mm256_setzero_ps();
        for (int32_t d = 0; d < hd; d += 4)
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m256 x = kvc_load8_seen(f16, kb, (int64_t)(d + i) * B + 8 * h, seeni);
                c[i] = _mm256_fmadd_ps(x, x, c[i]);
                mx[i] = _mm256_max_ps(abs8(x), mx[i]);   /* a NaN x leaves mx */
            }
        const __m256 n2 = _mm256_add_ps(_mm256_add_ps(c[0], c[1]), _mm256_add_ps(c[2], c[3]));
        const __m256 amax = _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3]));
        const __m256 ok = _mm256_and_ps(_mm256_and_ps(seen,
                                                      _mm256_cmp_ps(amax, _mm256_set1_ps(KVC_I8_AMIN), _CMP_GE_OQ)),
                                        _mm256_cmp_ps(n2, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ));
        const __m256 inv = _mm256_and_ps(ok, _mm256_min_ps(
            _mm256_div_ps(_mm256_set1_ps(46000.0f), _mm256_sqrt_ps(n2)),
            _mm256_div_ps(_mm256_set1_ps(32767.0f), amax)));
        _mm256_storeu_ps(ib->sk + 8 * h, _mm256_and_ps(ok, _mm256_div_ps(_mm256_set1_ps(1.0f), inv)));
        for (int32_t p = 0; p < hd / 2; p++) {   /* inv = 0 where !ok: 0, or NaN -> 0 */
            const int64_t i0 = (int64_t)(2 * p) * B + 8 * h, i1 = i0 + B;
            const __m256i lo = rint32(_mm256_mul_ps(kvc_load8_seen(f16, kb, i0, seeni), inv));
            const __m256i hi = rint32(_mm256_mul_ps(kvc_load8_seen(f16, kb, i1, seeni), inv));
            _mm256_storeu_si256((__m256i *)(ib->kp + 16 * p + 8 * h), pair16(lo, hi));
        }
    }
    /* V: lane d; the scales over the n positions seen */
    for (int32_t d0 = 0; d0 < hd; d0 += 8) {
        __m256 vmax = _mm256_setzero_ps();
        for (int32_t j = j0; j < n; j++)
            vmax = _mm256_max_ps(abs8(load8(f16, vb, (int64_t)j * hd + d0)), vmax);
        const __m256 vok = _mm256_cmp_ps(vmax, _mm256_set1_ps(KVC_I8_AMIN), _CMP_GE_OQ);
        const __m256 iv = _mm256_and_ps(vok, _mm256_div_ps(_mm256_set1_ps(4095.0f), vmax));
        _mm256_storeu_ps(ib->cv + d0, _mm256_and_ps(vok, _mm256_div_ps(vmax, _mm256_set1_ps(4095.0f))));
        for (int32_t k = 0; k < 8; k++) {
            const __m256i lo = 2 * k >= j0 && 2 * k < n
                ? rint32(_mm256_mul_ps(load8(f16, vb, (int64_t)(2 * k) * hd + d0), iv)) : _mm256_setzero_si256();
            const __m256i hi = 2 * k + 1 >= j0 && 2 * k + 1 < n
                ? rint32(_mm256_mul_ps(load8(f16, vb, (int64_t)(2 * k + 1) * hd + d0), iv)) : _mm256_setzero_si256();
            _mm256_storeu_si256((__m256i *)(ib->vp + (int64_t)k * hd + d0), pair16(lo, hi));
        }
    }
}

static __attribute__((noinline)) void convert(const kvc_attn_args *a, int64_t b, int32_t j0, int32_t n,
                                              const kvc_attn_i16_block *ib)
{
    if (a->f16)
        convert_kv(a, b, j0, n, ib, true);
    else
        convert_kv(a, b, j0, n, ib, false);
}

/* Rows [r0, r0 + R), each seeing the positions [j0, n) of the block in ib.
 * R and HD (the head dim, 0: a->hd) are constants at every call site, so the
 * accumulators stay in registers. */
AI void rows_i16(const kvc_attn_args *a, const kvc_attn_i16_block *ib, int32_t r0, int32_t j0, int32_t n,
                 const int R, const int HD, const bool FULL)
{
    const int32_t hd = HD ? HD : a->hd, rows = a->n_tok * a->n_q;
    const int16_t *q0 = kvc_attn_i16_q(a) + (size_t)r0 * hd;
    const float *cq = kvc_attn_i16_cq(a) + r0;
#define QP(r) ((const int32_t *)(const void *)(q0 + (size_t)(r) * hd))
    float *o[R_MAX];
    kvc_attn_rows_at(a, r0, R, NULL, o);
    /* scores */
    __m256i dot[R_MAX][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        dot[r][0] = dot[r][1] = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int32_t p = 0; p < hd / 2; p++) {
        const __m256i k0 = _mm256_loadu_si256((const __m256i *)(ib->kp + 16 * p));
        const __m256i k1 = _mm256_loadu_si256((const __m256i *)(ib->kp + 16 * p + 8));
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            dot[r][0] = madd_bcast(dot[r][0], k0, QP(r) + p);
            dot[r][1] = madd_bcast(dot[r][1], k1, QP(r) + p);
        }
    }
    const __m256 seen[2] = { seen_mask(0, j0, n), seen_mask(8, j0, n) };
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 s[R_MAX][2], mx[R_MAX];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {   /* -inf where not seen (FULL: every position is) */
            s[r][h] = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot[r][h]), _mm256_loadu_ps(ib->sk + 8 * h)),
                                    _mm256_set1_ps(cq[r]));
            if (!FULL)
                s[r][h] = _mm256_blendv_ps(ninf, s[r][h], seen[h]);
        }
        mx[r] = _mm256_max_ps(s[r][0], s[r][1]);
    }
    /* the running maxima, alpha, and the weights' scales, lane r: row r (the
     * lanes past R are not used) */
    const int rmask = (1 << R) - 1;
    const __m256 mbv = _mm256_zextps128_ps256(rows_max4(mx, R));
    const __m256 mv = _mm256_zextps128_ps256(_mm_maskload_ps(a->scratch + r0, _mm_setr_epi32(
        -(R > 0), -(R > 1), -(R > 2), -(R > 3))));
    const __m256 m1 = _mm256_max_ps(mbv, mv);   /* mb > m ? mb : m */
    const __m256 ev = kvc_exp2_neg8(_mm256_sub_ps(mbv, m1)), al = kvc_exp2_neg8(_mm256_sub_ps(mv, m1));
    const bool same = (_mm256_movemask_ps(_mm256_cmp_ps(al, _mm256_set1_ps(1.0f), _CMP_EQ_OQ)) & rmask) == rmask;
    _Alignas(32) float mb[8], alpha[8], emax[8], w[8];
    _mm256_store_ps(mb, mbv);
    _mm256_store_ps(alpha, al);
    _mm256_store_ps(emax, ev);
    _mm256_store_ps(w, _mm256_and_ps(_mm256_cmp_ps(ev, _mm256_set1_ps(KVC_I8_AMIN), _CMP_GE_OQ),
                                     _mm256_mul_ps(ev, _mm256_set1_ps(1.0f / 32767.0f))));
    _mm_maskstore_ps(a->scratch + r0, _mm_setr_epi32(-(R > 0), -(R > 1), -(R > 2), -(R > 3)),
                     _mm256_castps256_ps128(m1));
    /* the weights: l, and Pi as int16 in position order, pair k = dword k */
    _Alignas(32) int16_t pi[R_MAX][16];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float *l = a->scratch + rows + 16 * (r0 + r);
        __m256i pr[2];
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 e = kvc_exp2_neg8(_mm256_sub_ps(s[r][h], _mm256_set1_ps(mb[r])));
            if (!FULL)
                e = _mm256_and_ps(seen[h], e);
            const __m256 lv = _mm256_loadu_ps(l + 8 * h);
            _mm256_storeu_ps(l + 8 * h, _mm256_fmadd_ps(_mm256_set1_ps(emax[r]), e,
                                                        same ? lv : _mm256_mul_ps(lv, _mm256_set1_ps(alpha[r]))));
            pr[h] = rint32(_mm256_mul_ps(e, _mm256_set1_ps(32767.0f)));
        }
        /* the packs interleave the 128-bit halves: 0-3, 8-11, 4-7, 12-15 */
        _mm256_store_si256((__m256i *)pi[r], _mm256_permute4x64_epi64(_mm256_packs_epi32(pr[0], pr[1]), 0xD8));
    }
    /* output, 16 dimensions at a time */
    for (int32_t d0 = 0; d0 < hd; d0 += 16) {
        __m256i dv[R_MAX][2];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            dv[r][0] = dv[r][1] = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(ib->vp + (int64_t)k * hd + d0));
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(ib->vp + (int64_t)k * hd + d0 + 8));
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                madd2_bcast_mem(&dv[r][0], &dv[r][1], v0, v1, (const int32_t *)(const void *)pi[r] + k);
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 2
            for (int c = 0; c < 2; c++) {
                const __m256 ov = _mm256_loadu_ps(o[r] + d0 + 8 * c);
                const __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(ib->cv + d0 + 8 * c), _mm256_broadcast_ss(&w[r]));
                _mm256_storeu_ps(o[r] + d0 + 8 * c,
                                 _mm256_fmadd_ps(_mm256_cvtepi32_ps(dv[r][c]), sc,
                                                 same ? ov : _mm256_mul_ps(ov, _mm256_broadcast_ss(&alpha[r]))));
            }
    }
#undef QP
}

#define ROWS_CASES(HD, FULL)                                \
    switch (R) {                                            \
    case 4: rows_i16(a, ib, r0, j0, n, 4, HD, FULL); break; \
    case 3: rows_i16(a, ib, r0, j0, n, 3, HD, FULL); break; \
    case 2: rows_i16(a, ib, r0, j0, n, 2, HD, FULL); break; \
    case 1: rows_i16(a, ib, r0, j0, n, 1, HD, FULL); break; \
    default: break;                                         \
    }

/* Rows [r0, r0 + R), R <= 4, in the block of ib: the constants rows_i16
 * unrolls on. Not inlined into the loop below: inlined, the compiler keeps
 * kvc_exp2_neg8's constants in registers across it. */
static __attribute__((noinline)) void rows_n(const kvc_attn_args *a, const kvc_attn_i16_block *ib, int32_t r0,
                                             int32_t R, int32_t j0, int32_t n)
{
    const bool whole = j0 == 0 && n == B;
    if (a->hd == 64 && whole)
        ROWS_CASES(64, true)
    else if (a->hd == 64)
        ROWS_CASES(64, false)
    else if (a->hd == 128 && whole)
        ROWS_CASES(128, true)
    else if (a->hd == 128)
        ROWS_CASES(128, false)
    else
        ROWS_CASES(0, false)
}

/* Rows [r0, r1) in the block of ib (nb = 1), 4 at a time (the last 5 to 7
 * split evenly): the ops' rows. */
static void rows_all(const kvc_attn_args *a, const kvc_attn_i16_block *ib, int32_t r0, int32_t r1, int32_t j0,
                     int32_t n, int nb)
{
    (void)nb;
    for (int32_t R; r0 < r1; r0 += R) {
        const int32_t left = r1 - r0;
        R = left <= R_MAX ? left : left < 2 * R_MAX ? (left + 1) / 2 : R_MAX;
        rows_n(a, ib, r0, R, j0, n);
    }
}

const kvc_attn_i16_ops kvc_attn_i16_avx2 = { convert, rows_all, 1 };
