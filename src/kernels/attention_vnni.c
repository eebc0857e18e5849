/* attention_vnni.c - the integer scheme of attention.h with AVX-512 VNNI.
 * A KV block is put in integer form once per call for all the rows of the
 * tile that see the same positions of it (a slot of the scratch), then
 * folded into up to 8 rows at a time with VPDPWSSD, 32 multiply-adds an
 * instruction.
 *
 * Lanes. Scores: lane = position j; the dword of pair p holds
 * (Ki[2p][j], Ki[2p + 1][j]) and the broadcast (a[2p], a[2p + 1]), so one
 * VPDPWSSD adds two dimensions for 16 positions. Output: lane = dimension d;
 * the dword of pair k holds (Vi[2k][d], Vi[2k + 1][d]) and the broadcast
 * (Pi[2k], Pi[2k + 1]). Integer sums are exact in any order and every float
 * step is attention.h's, lane by lane, so the results equal
 * kvc_attention_ref_i16 bit for bit.
 *
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma
 * -mf16c -mavx2; called only when the "vnni" ISA is in use. */
#include "attention.h"
#include "kernels_int8.h"
#include "kernels_simd.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

#define AI static inline __attribute__((always_inline))

enum { B = KVC_ATTN_B, R_MAX = 8 };

typedef kvc_attn_i16_block iblock;   /* attention.h gives its layout */

AI __m512 load16(bool f16, const void *base, int64_t i)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_loadu_ps((const float *)base + i);
}


/* rint(x) per lane, in int32 lanes whose low word is the int16; a NaN gives
 * 0x80000000, whose low word (all that pair16 and the packs keep) is 0. */
AI __m512i rint32(__m512 x)
{
    return _mm512_cvtps_epi32(x);
}

/* int16 pairs: the low word of each dword from lo, the high one from hi. */
AI __m512i pair16(__m512i lo, __m512i hi)
{
    return _mm512_mask_blend_epi16((__mmask32)0xAAAAAAAAu, lo, _mm512_slli_epi32(hi, 16));
}

/* acc + VPDPWSSD(v, the dword *p broadcast). GCC 12 does not fold the
 * broadcast into the instruction (m32bcst) but issues a VPBROADCASTD, which
 * takes a vector slot. */
AI __m512i dp_bcast(__m512i acc, __m512i v, const int32_t *p)
{
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*p));
    return acc;
}

/* *p on every lane, by a load: the compiler would otherwise take a value it
 * has just stored from the register with a VPERMD, which takes a vector slot. */
AI __m512 bcast_load(const float *p)
{
    __m512 x;
    __asm__("vbroadcastss %1, %0" : "=v"(x) : "m"(*p));
    return x;
}

/* Block b into slot ib as rows that see its positions [j0, n) take it (the
 * ops' convert). */
AI void convert_kv(const kvc_attn_args *a, int64_t b, int32_t j0, int32_t n, const iblock *ib, const bool f16)
{
    const int32_t hd = a->hd;
    const void *kb = a->k[b], *vb = a->v[b];
    const __mmask16 seen = (__mmask16)kvc_attn_span_mask(j0, n);
    /* K: lane j is position j; the squared norm as four fma chains over d */
    __m512 c[4], mx[4];
    for (int i = 0; i < 4; i++)
        c[i] = mx[i] = _mm512_setzero_ps();
    for (int32_t d = 0; d < hd; d += 4)
        #pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m512 x = kvc_load16_seen(f16, kb, (int64_t)(d + i) * B, seen);
            c[i] = _mm512_fmadd_ps(x, x, c[i]);
            mx[i] = _mm512_max_ps(_mm512_abs_ps(x), mx[i]);   /* a NaN x leaves mx */
        }
    const __m512 n2 = _mm512_add_ps(_mm512_add_ps(c[0], c[1]), _mm512_add_ps(c[2], c[3]));
    const __m512 amax = _mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3]));
    const __mmask16 ok = seen & _mm512_cmp_ps_mask(amax, _mm512_set1_ps(KVC_I8_AMIN), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(n2, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ);
    const __m512 inv = _mm512_maskz_mov_ps(ok, _mm512_min_ps(
        _mm512_div_ps(_mm512_set1_ps(46000.0f), _mm512_sqrt_ps(n2)),
        _mm512_div_ps(_mm512_set1_ps(32767.0f), amax)));
    _mm512_storeu_ps(ib->sk, _mm512_maskz_div_ps(ok, _mm512_set1_ps(1.0f), inv));
    for (int32_t p = 0; p < hd / 2; p++) {   /* inv = 0 where !ok: 0, or NaN -> 0 */
        const __m512i lo = rint32(_mm512_mul_ps(kvc_load16_seen(f16, kb, (int64_t)(2 * p) * B, seen), inv));
        const __m512i hi = rint32(_mm512_mul_ps(kvc_load16_seen(f16, kb, (int64_t)(2 * p + 1) * B, seen), inv));
        _mm512_storeu_si512(ib->kp + 16 * p, pair16(lo, hi));
    }
    /* V: lane d; the scales over the n positions seen */
    for (int32_t d0 = 0; d0 < hd; d0 += 16) {
        __m512 vmax = _mm512_setzero_ps();
        for (int32_t j = j0; j < n; j++)
            vmax = _mm512_max_ps(_mm512_abs_ps(load16(f16, vb, (int64_t)j * hd + d0)), vmax);
        const __mmask16 vok = _mm512_cmp_ps_mask(vmax, _mm512_set1_ps(KVC_I8_AMIN), _CMP_GE_OQ);
        const __m512 iv = _mm512_maskz_div_ps(vok, _mm512_set1_ps(4095.0f), vmax);
        _mm512_storeu_ps(ib->cv + d0, _mm512_maskz_div_ps(vok, vmax, _mm512_set1_ps(4095.0f)));
        for (int32_t k = 0; k < 8; k++) {
            const __m512i lo = 2 * k >= j0 && 2 * k < n
                ? rint32(_mm512_mul_ps(load16(f16, vb, (int64_t)(2 * k) * hd + d0), iv)) : _mm512_setzero_si512();
            const __m512i hi = 2 * k + 1 >= j0 && 2 * k + 1 < n
                ? rint32(_mm512_mul_ps(load16(f16, vb, (int64_t)(2 * k + 1) * hd + d0), iv)) : _mm512_setzero_si512();
            _mm512_storeu_si512(ib->vp + (int64_t)k * hd + d0, pair16(lo, hi));
        }
    }
}

static __attribute__((noinline)) void convert(const kvc_attn_args *a, int64_t b, int32_t j0, int32_t n,
                                              const iblock *ib)
{
    if (a->f16)
        convert_kv(a, b, j0, n, ib, true);
    else
        convert_kv(a, b, j0, n, ib, false);
}

/* Rows [r0, r0 + R), each seeing the positions [j0, n) of each of the NB
 * blocks in ib (in order; all 16 when NB > 1). R, NB and HD (the head dim,
 * 0: a->hd) are constants at every call site, so the accumulators stay in
 * registers and the q rows' addresses are one pointer plus constants. */
AI void rows_i16(const kvc_attn_args *a, const iblock *ib, int32_t r0, int32_t j0, int32_t n,
                 const int R, const int NB, const int HD)
{
    const int32_t hd = HD ? HD : a->hd, rows = a->n_tok * a->n_q;
    const int16_t *q0 = kvc_attn_i16_q(a) + (size_t)r0 * hd;
    const float *cq = kvc_attn_i16_cq(a) + r0;
#define QP(r) ((const int32_t *)(const void *)(q0 + (size_t)(r) * hd))
    float *o[R_MAX];
    kvc_attn_rows_at(a, r0, R, NULL, o);
    const __mmask16 seen = (__mmask16)kvc_attn_span_mask(j0, n);
    /* scores */
    __m512i dot[2][R_MAX];
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++)
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            dot[i][r] = _mm512_setzero_si512();
    #pragma GCC unroll 4
    for (int32_t p = 0; p < hd / 2; p++) {
        __m512i k[2];
        #pragma GCC unroll 2
        for (int i = 0; i < NB; i++)
            k[i] = _mm512_loadu_si512(ib[i].kp + 16 * p);
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 2
            for (int i = 0; i < NB; i++)
                dot[i][r] = dp_bcast(dot[i][r], k[i], QP(r) + p);
    }
    /* the running maxima, alpha, and the weights' scales (lane r: row r) */
    __m512 s[2][R_MAX];
    _Alignas(64) float mbs[2][16], alpha[2][16], emaxs[2][16], w[2][16];
    /* Pi of rows 2h and 2h + 1 as VPACKSSDW leaves them: dword 4 (k / 2) + k % 2
     * holds pair k of row 2h, the same + 2 pair k of row 2h + 1 */
    _Alignas(64) int16_t pi[2][R_MAX / 2][32];
    bool same[2] = { false, false };   /* alpha = 1 for every row: the * alpha skipped */
    const __mmask16 rmask = (__mmask16)((1u << R) - 1);
    __m512 m = _mm512_maskz_loadu_ps(rmask, a->scratch + r0);
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++) {
        const __m512 sk = _mm512_loadu_ps(ib[i].sk);
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            s[i][r] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), seen,
                _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot[i][r]), sk), _mm512_set1_ps(cq[r])));
        const __m512 mb = kvc_rows_max16(s[i], R), m1 = _mm512_max_ps(mb, m);
        const __m512 emax = kvc_exp2_neg16(_mm512_sub_ps(mb, m1)), al = kvc_exp2_neg16(_mm512_sub_ps(m, m1));
        const __mmask16 ok = _mm512_cmp_ps_mask(emax, _mm512_set1_ps(KVC_I8_AMIN), _CMP_GE_OQ);
        same[i] = (_mm512_cmp_ps_mask(al, _mm512_set1_ps(1.0f), _CMP_EQ_OQ) & rmask) == rmask;
        _mm512_store_ps(mbs[i], mb);
        _mm512_store_ps(emaxs[i], emax);
        _mm512_store_ps(alpha[i], al);
        _mm512_store_ps(w[i], _mm512_maskz_mul_ps(ok, emax, _mm512_set1_ps(1.0f / 32767.0f)));
        m = m1;
    }
    _mm512_mask_storeu_ps(a->scratch + r0, rmask, m);
    #pragma GCC unroll 2
    for (int i = 0; i < NB; i++) {
        __m512i pr[R_MAX];
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float *l = a->scratch + rows + 16 * (r0 + r);
            const __m512 e = _mm512_maskz_mov_ps(seen, kvc_exp2_neg16(_mm512_sub_ps(s[i][r], bcast_load(&mbs[i][r]))));
            const __m512 lv = _mm512_loadu_ps(l);
            _mm512_storeu_ps(l, _mm512_fmadd_ps(bcast_load(&emaxs[i][r]), e,
                                                same[i] ? lv : _mm512_mul_ps(lv, bcast_load(&alpha[i][r]))));
            pr[r] = rint32(_mm512_mul_ps(e, _mm512_set1_ps(32767.0f)));
        }
        #pragma GCC unroll 4
        for (int h = 0; 2 * h < R; h++)
            _mm512_store_si512(pi[i][h], _mm512_packs_epi32(pr[2 * h], 2 * h + 1 < R ? pr[2 * h + 1] : _mm512_setzero_si512()));
    }
    /* output, 16 dimensions at a time: the blocks' integer sums, each folded
     * into o in block order */
    const int32_t *pc = (const int32_t *)(const void *)&pi[0][0][0];   /* one base: constant offsets */
    for (int32_t d0 = 0; d0 < hd; d0 += 16) {
        __m512 ov[R_MAX];
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            ov[r] = _mm512_loadu_ps(o[r] + d0);
        #pragma GCC unroll 2
        for (int i = 0; i < NB; i++) {
            __m512i dv[R_MAX];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                dv[r] = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m512i v = _mm512_loadu_si512(ib[i].vp + (int64_t)k * hd + d0);
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    dv[r] = dp_bcast(dv[r], v, pc + (i * R_MAX / 2 + r / 2) * 16 + 4 * (k / 2) + 2 * (r % 2) + k % 2);
            }
            const __m512 cv = _mm512_loadu_ps(ib[i].cv + d0);
            if (same[i])
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    ov[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dv[r]), _mm512_mul_ps(cv, bcast_load(&w[i][r])), ov[r]);
            else
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    ov[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dv[r]), _mm512_mul_ps(cv, bcast_load(&w[i][r])),
                                            _mm512_mul_ps(ov[r], bcast_load(&alpha[i][r])));
        }
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            _mm512_storeu_ps(o[r] + d0, ov[r]);
    }
#undef QP
}

#define ROWS_CASES(NB, HD)                                  \
    switch (R) {                                            \
    case 8: rows_i16(a, ib, r0, j0, n, 8, NB, HD); break;   \
    case 7: rows_i16(a, ib, r0, j0, n, 7, NB, HD); break;   \
    case 6: rows_i16(a, ib, r0, j0, n, 6, NB, HD); break;   \
    case 5: rows_i16(a, ib, r0, j0, n, 5, NB, HD); break;   \
    case 4: rows_i16(a, ib, r0, j0, n, 4, NB, HD); break;   \
    case 3: rows_i16(a, ib, r0, j0, n, 3, NB, HD); break;   \
    case 2: rows_i16(a, ib, r0, j0, n, 2, NB, HD); break;   \
    case 1: rows_i16(a, ib, r0, j0, n, 1, NB, HD); break;   \
    default: break;                                         \
    }

/* Rows [r0, r0 + R), R <= 8, in the NB (1 or 2) blocks of ib: the constants
 * rows_i16 unrolls on. Not inlined into the loops below: inlined, the
 * compiler keeps kvc_exp2_neg16's constants in registers across them. */
static __attribute__((noinline)) void rows_n(const kvc_attn_args *a, const iblock *ib, int32_t r0,
                                             int32_t R, int32_t j0, int32_t n, int NB)
{
    if (NB == 2 && a->hd == 64)
        ROWS_CASES(2, 64)
    else if (NB == 2 && a->hd == 128)
        ROWS_CASES(2, 128)
    else if (NB == 2)
        ROWS_CASES(2, 0)
    else if (a->hd == 64)
        ROWS_CASES(1, 64)
    else if (a->hd == 128)
        ROWS_CASES(1, 128)
    else
        ROWS_CASES(1, 0)
}

/* Rows [r0, r1) in the NB blocks of ib, 8 at a time: the ops' rows. */
static void rows_all(const kvc_attn_args *a, const iblock *ib, int32_t r0, int32_t r1, int32_t j0, int32_t n,
                     int NB)
{
    for (int32_t R; r0 < r1; r0 += R) {
        R = r1 - r0 < R_MAX ? r1 - r0 : R_MAX;
        rows_n(a, ib, r0, R, j0, n, NB);
    }
}

const kvc_attn_i16_ops kvc_attn_i16_vnni = { convert, rows_all, 2 };
