/* kernels_vnni.c - the integer scheme of kernels_int8.h with AVX-512 VNNI:
 * activation quantization, the matmul for few tokens (decode), which streams
 * the weights once and is memory-bound, and the matmul for many (prefill),
 * which repacks 32 weight rows (two vectors of 16) so that each lane holds
 * one row.
 *
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma
 * -mf16c -mavx2; called only after kernels.c found AVX-512 VNNI at run time.
 *
 * HOW A BLOCK'S DOT PRODUCTS ARE FORMED in decode (prefill: see its section,
 * one int16 product per element instead). VPDPBUSD multiplies unsigned by
 * signed bytes, so (as llama.cpp) we multiply |w| by x with w's sign: for
 * w = -128, |w| = 128 fits the unsigned byte, and x never is -128 (the planes
 * are clamped to [-127, 127]), so the negation cannot overflow. One zmm holds
 * 32 weights of two rows; a lane holds 256 * (4 products with hi) + (4 products
 * with lo), exact in int32. A reduction tree then sums the 8 lanes of each row,
 * giving D for 16 rows (one lane per row), and the float step of the scheme
 * follows, lane-wise. Integer sums are exact in any order, and the float step
 * is the scheme's, so the results are bitwise those of kvc_i8_matmul_ref. */
#include "kernels_int8.h"
#include "kernels_simd.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#define GR        16              /* weight rows per group: one lane each */
#define TC        4               /* tokens per pass over a group */

/* ------------------------------------------------------------ activations */

AI __m512 clamp127(__m512 v)
{
    /* MAXPS returns its second operand when the first is NaN: NaN -> -127 */
    return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
}

static void quantize_row(const float *x, int64_t n_in, uint8_t *dst)
{
    const int64_t nb = n_in / 32;
    int8_t *hi = (int8_t *)dst, *lo = (int8_t *)dst + n_in;
    float *dd = (float *)(void *)(dst + 2 * n_in);
    int32_t *ss = (int32_t *)(void *)(dst + 2 * n_in + 4 * nb), *hs = ss + nb;
    int16_t *aa = (int16_t *)(void *)(hs + 2 * nb);
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        /* max(|v|, 0) turns NaN into 0, as fmaxf in the reference */
        const __m512 a = _mm512_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), zero), _mm512_max_ps(_mm512_abs_ps(v1), zero));
        const float amax = _mm512_reduce_max_ps(a);
        if (!(amax >= KVC_I8_AMIN)) {
            memset(hi + 32 * b, 0, 32);
            memset(lo + 32 * b, 0, 32);
            memset(aa + 32 * b, 0, 64);
            dd[b] = 0.0f;
            ss[b] = hs[2 * b] = hs[2 * b + 1] = 0;
            continue;
        }
        const float dh = amax / 127.0f, id = 127.0f / amax;
        const __m512 vdh = _mm512_set1_ps(dh), vid = _mm512_set1_ps(id), vid2 = _mm512_set1_ps(id * 256.0f);
        const __m512i h0 = _mm512_cvtps_epi32(clamp127(_mm512_mul_ps(v0, vid)));
        const __m512i h1 = _mm512_cvtps_epi32(clamp127(_mm512_mul_ps(v1, vid)));
        const __m512 r0 = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(h0), vdh, v0);
        const __m512 r1 = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(h1), vdh, v1);
        const __m512i l0 = _mm512_cvtps_epi32(clamp127(_mm512_mul_ps(r0, vid2)));
        const __m512i l1 = _mm512_cvtps_epi32(clamp127(_mm512_mul_ps(r1, vid2)));
        _mm_storeu_si128((__m128i *)(hi + 32 * b), _mm512_cvtepi32_epi8(h0));
        _mm_storeu_si128((__m128i *)(hi + 32 * b + 16), _mm512_cvtepi32_epi8(h1));
        _mm_storeu_si128((__m128i *)(lo + 32 * b), _mm512_cvtepi32_epi8(l0));
        _mm_storeu_si128((__m128i *)(lo + 32 * b + 16), _mm512_cvtepi32_epi8(l1));
        const __m512i a0 = _mm512_add_epi32(_mm512_slli_epi32(h0, 8), l0);
        const __m512i a1 = _mm512_add_epi32(_mm512_slli_epi32(h1, 8), l1);
        _mm256_storeu_si256((__m256i *)(aa + 32 * b), _mm512_cvtepi32_epi16(a0));
        _mm256_storeu_si256((__m256i *)(aa + 32 * b + 16), _mm512_cvtepi32_epi16(a1));
        hs[2 * b] = _mm512_reduce_add_epi32(a0);
        hs[2 * b + 1] = _mm512_reduce_add_epi32(a1);
        ss[b] = hs[2 * b] + hs[2 * b + 1];
        dd[b] = dh / 256.0f;
    }
    const size_t used = kvc_i8_act_used_bytes(n_in);
    memset(dst + used, 0, kvc_i8_act_row_bytes(n_in) - used);
}

void kvc_vnni_quantize_rows(const float *x, int64_t ldx, int64_t n_in, int64_t t0, int64_t t1, uint8_t *act)
{
    const size_t as = kvc_i8_act_row_bytes(n_in);
    for (int64_t t = t0; t < t1; t++)
        quantize_row(x + t * ldx, n_in, act + (size_t)t * as);
}

/* ------------------------------------------------------------------ decode */

/* Row of each half of the 8 pair vectors, chosen so that the reduction tree
 * below leaves row l in lane l. */
static const int pair_lo[8] = { 0, 1, 2, 3, 8, 9, 10, 11 };
static const int pair_hi[8] = { 4, 5, 6, 7, 12, 13, 14, 15 };

/* The row sums of z[0..8) in two halves: h0 lane l = row l's sum over the
 * 128-bit lanes 0 and 2 of z (the low 128 bits of each row's half), h1 over
 * lanes 1 and 3. */
AI void reduce_rows_halves(const __m512i z[8], __m512i *h0, __m512i *h1)
{
    __m512i c[4], e[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]),
                                _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        e[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(c[2 * i], c[2 * i + 1]),
                                _mm512_unpackhi_epi64(c[2 * i], c[2 * i + 1]));
    *h0 = _mm512_shuffle_i32x4(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0));
    *h1 = _mm512_shuffle_i32x4(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1));
}

/* Sum the 8 lanes of each row-half of z[0..8): result lane l = row l. */
AI __m512i reduce_rows(const __m512i z[8])
{
    __m512i h0, h1;
    reduce_rows_halves(z, &h0, &h1);
    return _mm512_add_epi32(h0, h1);
}

/* The weights of a block as bytes, two rows per vector (32 + 32).
 *   I8_Q8_0: signed q; dotted with the sign trick (|w| times x with w's sign:
 *           |-128| = 128 fits the unsigned byte, and x is never -128, so the
 *           negation cannot overflow).
 *   I8_Q4_0, I8_Q5_0: unsigned codes c = q + off; dotted as they are, and
 *           off * S (S = the activation block's sum of a) subtracted after.
 *   I8_Q4_K: unsigned codes (off 0); the scales d * sc_j and mins dmin * m_j
 *           come from the super-block (8 blocks of 32), and the min step
 *           follows the block's dot product.
 *   I8_Q6_K: unsigned codes c = q + 32, two dot products per block (halves
 *           of 16 with scales of their own), each less 32 H (the half's sum
 *           of a, kernels_int8.h).
 *   I8_MXFP4: unsigned codes c = q + 12 (0 .. 24), looked up from the
 *           nibbles in one byte shuffle (the table's 16 entries in every
 *           128-bit lane), less 12 S as Q4_0's; the scale 2^(e - 128) made
 *           from the block's first byte (e8m0_half16). */
/* p[q] lane l = dword q of r[l], for 16 vectors r of 8 dwords: an 8 x 8
 * dword transpose in each 256-bit half (rows l and l + 8 share a vector). */
AI void transpose_16x8(const __m256i r[GR], __m512i *p)
{
    __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++)
        z[l] = _mm512_inserti64x4(_mm512_castsi256_si512(r[l]), r[l + 8], 1);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {          /* u[4i + k]: dwords k (low 128) and k + 4 (high) */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        _mm512_store_si512(p + k, _mm512_permutex2var_epi64(u[k], lo, u[k + 4]));
        _mm512_store_si512(p + k + 4, _mm512_permutex2var_epi64(u[k], hi, u[k + 4]));
    }
}

/* The dword at byte off of each of 16 rows, row l in lane l: 16 scalar
 * loads through the stack, which cost the vector ports nothing, where a
 * VPGATHERDD took a fifth of the Q8_0 kernel's time (Zen 5). */
AI __m512i row_dwords(const uint8_t *const rows[GR], size_t off)
{
    _Alignas(64) uint32_t v[GR];
#pragma GCC unroll 16
    for (int l = 0; l < GR; l++)
        memcpy(&v[l], rows[l] + off, 4);
    return _mm512_load_si512(v);
}

/* Scales of the halves of Q6_K super-block s of 16 rows: ds[j][l], dm[j][l]
 * for the first and second half of block j of row l (d * sc, as the
 * reference). ds, dm: 64-byte aligned. */
AI void k6_group_scales(const uint8_t *const rows[GR], int64_t s, float ds[8][GR], float dm[8][GR])
{
    const __m512i even_odd = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256i r0[GR], r1[GR];
#pragma GCC unroll 16
    for (int l = 0; l < GR; l++) {
        const block_q6_K *k = (const block_q6_K *)(const void *)rows[l] + s;
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)k->scales)));
        const __m512 v = _mm512_permutexvar_ps(even_odd, _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(k->d)), sc));
        r0[l] = _mm256_castps_si256(_mm512_castps512_ps256(v));
        r1[l] = _mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1);
    }
    transpose_16x8(r0, (__m512i *)(void *)ds);
    transpose_16x8(r1, (__m512i *)(void *)dm);
}

/* Scales and mins of Q4_K super-block s of 16 rows: ds[j][l], dm[j][l] for
 * sub-block j of row l. ds, dm: 64-byte aligned. Row l in lane l from the
 * start: the dwords of d/dmin and of the 12 scale bytes, 16 rows at a time
 * (row_dwords), unpacked as kvc_k4_scales unpacks one row and multiplied in
 * the same single-precision product d * sc, so the same bits. Done per row
 * and transposed, this took about as many instructions as the super-block's
 * dot products. */
AI void k4_group_scales(const uint8_t *const rows[GR], int64_t s, float ds[8][GR], float dm[8][GR])
{
    const size_t at = (size_t)s * sizeof(block_q4_K);
    const __m512i h = row_dwords(rows, at + offsetof(block_q4_K, d));
    const __m512i u0 = row_dwords(rows, at + offsetof(block_q4_K, scales));
    const __m512i u1 = row_dwords(rows, at + offsetof(block_q4_K, scales) + 4);
    const __m512i u2 = row_dwords(rows, at + offsetof(block_q4_K, scales) + 8);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    const __m512i m6 = _mm512_set1_epi32(0x3f), m4 = _mm512_set1_epi32(0x0f), m2 = _mm512_set1_epi32(0x30);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(u0, 8 * j), m6);
        const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(u1, 8 * j), m6);
        /* bytes j of u2 (low / high nibble) below bits 6-7 of bytes j of u0 / u1 */
        const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 8 * j), m4),
                                              _mm512_and_si512(_mm512_srli_epi32(u0, 8 * j + 2), m2));
        const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 8 * j + 4), m4),
                                              _mm512_and_si512(_mm512_srli_epi32(u1, 8 * j + 2), m2));
        _mm512_store_ps(ds[j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        _mm512_store_ps(dm[j], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
        _mm512_store_ps(ds[j + 4], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_hi)));
        _mm512_store_ps(dm[j + 4], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn_hi)));
    }
}

AI int code_offset(const int kind)
{
    return kind == I8_Q4_0 ? 8 : kind == I8_Q5_0 ? 16 : kind == I8_MXFP4 ? 12 : 0;
}

/* kvc_e8m0_half of the low byte of each dword lane of e, as kvc_i8_e8m0_half8. */
AI __m512 e8m0_half16(__m512i e)
{
    e = _mm512_and_si512(e, _mm512_set1_epi32(0xff));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_sllv_epi32(normal, small, _mm512_set1_epi32(0x00200000), e));
}

/* The block's scales, row l in lane l, from the dwords at each row's block
 * start (h): F16 d in the low half, or MXFP4's exponent byte. */
AI __m512 block_scales(const int kind, __m512i h)
{
    return kind == I8_MXFP4 ? e8m0_half16(h) : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
}

/* 16 nibble bytes -> 32 codes (low nibbles, then high), for rows a and b. */
AI __m512i nibbles2(const uint8_t *qa, const uint8_t *qb)
{
    const __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb)), 1);
    const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004ll, 0x0004000400040004ll, 0, 0,
                                         0x0004000400040004ll, 0x0004000400040004ll);
    return _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(0x0f));
}

AI __m512i load_pair(const int kind, const uint8_t *ba, const uint8_t *bb)
{
    if (kind == I8_Q4_K)      /* ba, bb: kvc_i8_k4_codes; the odd blocks' nibbles are shifted down by the caller */
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)ba)),
                                  _mm256_loadu_si256((const __m256i *)bb), 1);
    if (kind == I8_Q8_0)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ba + 2))),
                                  _mm256_loadu_si256((const __m256i *)(bb + 2)), 1);
    if (kind == I8_Q4_0)
        return nibbles2(ba + 2, bb + 2);
    if (kind == I8_MXFP4) {   /* code -> q + 12: kvc_mxfp4_values + 12 */
        const __m512i lut =
            _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
        const size_t qs = offsetof(block_mxfp4, qs);
        return _mm512_shuffle_epi8(lut, nibbles2(ba + qs, bb + qs));
    }
    /* Q5_0: d, qh (bit j: 5th bit of element j), qs */
    uint32_t ha, hb;
    memcpy(&ha, ba + 2, 4);
    memcpy(&hb, bb + 2, 4);
    const __m512i c = nibbles2(ba + 6, bb + 6);
    return _mm512_mask_add_epi8(c, (__mmask64)ha | (__mmask64)hb << 32, c, _mm512_set1_epi8(0x10));  /* bit 4 is clear: add = or */
}

/* 256 * (w . hi) + (w . lo) per lane for a signed pair (sign trick) ... */
AI __m512i dot_signed(__m512i uw, __mmask64 neg, __m512i xh, __m512i xl)
{
    const __m512i z = _mm512_setzero_si512();
    __m512i a = _mm512_dpbusd_epi32(z, uw, _mm512_mask_sub_epi8(xh, neg, z, xh));
    a = _mm512_slli_epi32(a, 8);
    return _mm512_dpbusd_epi32(a, uw, _mm512_mask_sub_epi8(xl, neg, z, xl));
}

/* ... and for unsigned codes. */
AI __m512i dot_codes(__m512i c, __m512i xh, __m512i xl)
{
    __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, xh);
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(a, 8), c, xl);
}

/* Decode streams the weights from DRAM: while a group of 16 contiguous rows
 * is consumed, the next group (if this call has one) is prefetched into L2
 * at the same pace. Also for long rows (4864 inputs: an 82 KB group), where
 * it beat a prefetch some distance ahead in each of the 16 rows by 1.3-1.7x
 * (bench/bench_kernels.c, decode cold). */
typedef struct {
    const uint8_t *next;          /* next group's first byte, or NULL */
} prefetch_plan;

/* The 32 codes q + 32 of Q6_K block b of rows ra (low 256 bits) and rb
 * (high), as kvc_i8_k6_codes does for one row, both rows in each step. */
AI __m512i k6_codes2(const uint8_t *ra, const uint8_t *rb, int64_t b)
{
    const block_q6_K *ka = (const block_q6_K *)(const void *)ra + b / 8, *kb = (const block_q6_K *)(const void *)rb + b / 8;
    const int j = (int)(b % 8), h = j / 4, kq = j % 4;
    const size_t ql = (size_t)(64 * h + 32 * (kq & 1));
    __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ka->ql + ql))),
                                    _mm256_loadu_si256((const __m256i *)(kb->ql + ql)), 1);
    if (kq >= 2)
        lo = _mm512_srli_epi16(lo, 4);
    __m512i hb = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ka->qh + 32 * h))),
                                    _mm256_loadu_si256((const __m256i *)(kb->qh + 32 * h)), 1);
    /* bits 2kq, 2kq + 1 of each qh byte to bits 4, 5 */
    hb = kq <= 2 ? _mm512_slli_epi16(hb, 4 - 2 * kq) : _mm512_srli_epi16(hb, 2);
    /* (lo & 0x0f) | (hb & 0x30) */
    return _mm512_ternarylogic_epi32(_mm512_and_si512(lo, _mm512_set1_epi8(0x0f)), hb, _mm512_set1_epi8(0x30), 0xf8);
}

/* Block b of a group (see decode_group) against T tokens: acc[t] lane l
 * accumulates y[t][row l]. ks, km: the K-quants' current super-block scales. */
AI void decode_block(const int kind, const int T, const uint8_t *const rows[GR], int64_t b,
                     const float ks[8][GR], const float km[8][GR], const uint8_t *const *a, int64_t n_in,
                     __m512 acc[TC])
{
    const size_t off = (size_t)b * kvc_i8_block_bytes(kind);
    /* the 16 rows' scales: low half of the dword at each block start */
    __m512 dw, dm = _mm512_setzero_ps();
    if (kvc_i8_k_quant(kind)) {
        dw = _mm512_load_ps(ks[b % 8]);
        dm = _mm512_load_ps(km[b % 8]);
    } else {
        dw = block_scales(kind, row_dwords(rows, off));
    }
    __m512i w[8];
    __mmask64 neg[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        if (kind == I8_Q4_K) {
            const __m512i c = load_pair(kind, kvc_i8_k4_codes(kind, rows[pair_lo[p]], b),
                                        kvc_i8_k4_codes(kind, rows[pair_hi[p]], b));
            w[p] = _mm512_and_si512(b & 1 ? _mm512_srli_epi16(c, 4) : c, _mm512_set1_epi8(0x0f));
        } else if (kind == I8_Q6_K) {
            w[p] = k6_codes2(rows[pair_lo[p]], rows[pair_hi[p]], b);
        } else {
            w[p] = load_pair(kind, rows[pair_lo[p]] + off, rows[pair_hi[p]] + off);
        }
        if (kind == I8_Q8_0) {
            neg[p] = _mm512_movepi8_mask(w[p]);
            w[p] = _mm512_abs_epi8(w[p]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m512i xh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(kvc_i8_hi(a[t]) + 32 * b)));
        const __m512i xl = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(kvc_i8_lo(a[t], n_in) + 32 * b)));
        __m512i z[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++)
            z[p] = kind == I8_Q8_0 ? dot_signed(w[p], neg[p], xh, xl) : dot_codes(w[p], xh, xl);
        if (kind == I8_Q6_K) {
            /* 128-bit lanes 0 and 2 of a pair vector hold its rows' first
             * halves, 1 and 3 the second: reduce_rows but for its last add */
            __m512i h0, h1;
            reduce_rows_halves(z, &h0, &h1);
            const int32_t *hx = kvc_i8_h(a[t], n_in) + 2 * b;
            const __m512i d0 = _mm512_sub_epi32(h0, _mm512_set1_epi32(32 * hx[0]));
            const __m512i d1 = _mm512_sub_epi32(h1, _mm512_set1_epi32(32 * hx[1]));
            const __m512 xs = _mm512_set1_ps(kvc_i8_d(a[t], n_in)[b]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(dw, xs), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(dm, xs), acc[t]);
            continue;
        }
        __m512i d = reduce_rows(z);
        if (code_offset(kind))
            d = _mm512_sub_epi32(d, _mm512_set1_epi32(code_offset(kind) * kvc_i8_s(a[t], n_in)[b]));
        const __m512 xs = _mm512_set1_ps(kvc_i8_d(a[t], n_in)[b]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(dw, xs), acc[t]);
        if (kind == I8_Q4_K)
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(-(float)kvc_i8_s(a[t], n_in)[b]), _mm512_mul_ps(dm, xs), acc[t]);
    }
}

/* One group of up to 16 rows (rows[l]: row l's bytes; missing rows repeat the
 * last) against T <= TC tokens; out[t] lane l accumulates y[t][row l].
 * K-quants go a super-block at a time, its 8 blocks unrolled, so that where
 * a block's codes sit in the super-block is known when compiling. */
AI void decode_group(const int kind, const int T, const uint8_t *const rows[GR], prefetch_plan pf,
                     const uint8_t *const *a, int64_t n_in, __m512 out[TC])
{
    __m512 acc[TC];       /* in registers (see prefill_pass) */
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = out[t];
    const int64_t nb = n_in / 32;
    const size_t bsz = kvc_i8_block_bytes(kind);
    _Alignas(64) float ks[8][GR], km[8][GR];          /* K-quants: the current super-block's scales */
    if (kvc_i8_k_quant(kind)) {
        for (int64_t b0 = 0; b0 < nb; b0 += 8) {
            if (kind == I8_Q4_K)
                k4_group_scales(rows, b0 / 8, ks, km);
            else
                k6_group_scales(rows, b0 / 8, ks, km);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                if (pf.next) {
                    for (int i = 0; i < GR * (int)bsz; i += 64)
                        _mm_prefetch((const char *)pf.next + i, _MM_HINT_T1);
                    pf.next += GR * bsz;
                }
                decode_block(kind, T, rows, b0 + j, ks, km, a, n_in, acc);
            }
        }
    } else {
        for (int64_t b = 0; b < nb; b++) {
            if (pf.next) {
                for (int i = 0; i < GR * (int)bsz; i += 64)
                    _mm_prefetch((const char *)pf.next + i, _MM_HINT_T1);
                pf.next += GR * bsz;
            }
            decode_block(kind, T, rows, b, ks, km, a, n_in, acc);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        out[t] = acc[t];
}

typedef void (*group_fn)(const uint8_t *const rows[GR], prefetch_plan pf, const uint8_t *const *a,
                         int64_t n_in, __m512 acc[TC]);

#define GROUP_FN(name, kind, T)                                                                       \
    static void name##T(const uint8_t *const rows[GR], prefetch_plan pf,                              \
                        const uint8_t *const *a, int64_t n_in, __m512 acc[TC])                        \
    {                                                                                                 \
        decode_group(kind, T, rows, pf, a, n_in, acc);                                                \
    }
#define GROUP_FNS(name, kind) GROUP_FN(name, kind, 1) GROUP_FN(name, kind, 2) GROUP_FN(name, kind, 3) \
                              GROUP_FN(name, kind, 4)
GROUP_FNS(q8_0_group, I8_Q8_0)
GROUP_FNS(q4_0_group, I8_Q4_0)
GROUP_FNS(q5_0_group, I8_Q5_0)
GROUP_FNS(q4_K_group, I8_Q4_K)
GROUP_FNS(q6_K_group, I8_Q6_K)
GROUP_FNS(mxfp4_group, I8_MXFP4)

static const group_fn group_fns[I8_N_VNNI][TC] = {
    { q8_0_group1, q8_0_group2, q8_0_group3, q8_0_group4 },
    { q4_0_group1, q4_0_group2, q4_0_group3, q4_0_group4 },
    { q5_0_group1, q5_0_group2, q5_0_group3, q5_0_group4 },
    { q4_K_group1, q4_K_group2, q4_K_group3, q4_K_group4 },
    { q6_K_group1, q6_K_group2, q6_K_group3, q6_K_group4 },
    { mxfp4_group1, mxfp4_group2, mxfp4_group3, mxfp4_group4 },
};

static void decode_act(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok, float *y,
                       int64_t ldy, int64_t r0, int64_t r1)
{
    const int kind = kvc_i8_kind(w->type);
    const size_t as = kvc_i8_act_row_bytes(w->n_in), rb = w->row_bytes;
    const uint8_t *base = w->data;
    for (int64_t rg = r0; rg < r1; rg += GR) {
        const int nr = (int)KVC_MIN(GR, r1 - rg);
        const uint8_t *rows[GR];
        for (int l = 0; l < GR; l++)
            rows[l] = base + (size_t)(rg + KVC_MIN(l, nr - 1)) * rb;
        prefetch_plan pf = { NULL };   /* for the first pass, which brings the rows in */
        if (rg + GR < r1)
            pf.next = base + (size_t)(rg + GR) * rb;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TC) {
            const int T = (int)KVC_MIN(TC, n_tok - t0);
            __m512 acc[TC];
            const uint8_t *a[TC];
            for (int t = 0; t < TC; t++) {
                acc[t] = _mm512_setzero_ps();
                a[t] = kvc_i8_tok_row(act, as, tok, t0 + KVC_MIN(t, T - 1));
            }
            group_fns[kind][T - 1](rows, pf, a, w->n_in, acc);
            for (int t = 0; t < T; t++)
                _mm512_mask_storeu_ps(y + (t0 + t) * ldy + rg, (__mmask16)((1u << nr) - 1), acc[t]);
            pf = (prefetch_plan){ NULL };
        }
    }
}

/* ----------------------------------------------------------------- prefill
 *
 * The weights of a group of up to 32 rows (two "row vectors" of 16) are
 * repacked once per call, block by block, into signed int16 weights q (the
 * scheme's integer weights, offsets already taken off) laid out so that dword
 * k of lane l of vector (b, v, k) holds q_2k, q_2k+1 of block b of row 16v + l.
 * Then a token's block dot products come out one row per lane, with no
 * reduction and no correction:
 *   D = sum_k VPDPWSSD(q_k, a_k)        (a_k: the token's int16 pair 2k, 2k+1, broadcast)
 *     = sum_i q_i a_i
 * exact in int32, and the float step of the scheme follows. (VPDPWSSD forms
 * the same number of products per instruction as VPDPBUSD on the two int8
 * planes, but needs no shift between the planes and, weights being signed,
 * no offset correction.) A pass keeps PT tokens x 2 row vectors of
 * accumulators in registers: per step, 2 weight vectors and PT broadcasts
 * feed 2 PT multiplies, so loads stay below the multiplies. */

#define PT 6    /* tokens a pass */
#define RV 2    /* row vectors a group */
#define KS 16   /* int16 pairs (dwords) of a block */

/* Rows [rg, rg + nr) of W, nr <= 16 nv, into pack (per block: nv x KS dword
 * vectors) and their scales into dsc (per block: nv x 16 floats; K-quants:
 * Q4_K's mins or Q6_K's second scales into msc likewise); rows past nr are
 * zero. */
AI void repack(const int kind, const kvc_weight *w, int64_t rg, int nr, int nv, __m512i *pack, float *dsc,
               float *msc)
{
    const int64_t nb = w->n_in / 32;
    const size_t rb = w->row_bytes;
    const uint8_t *base = (const uint8_t *)w->data + (size_t)rg * rb;
    int32_t offs[GR];
    for (int l = 0; l < GR; l++)
        offs[l] = (int32_t)((size_t)l * rb);
    const __m512i goff = _mm512_loadu_si512(offs);
    for (int v = 0; v < nv; v++) {
        const int n = KVC_MIN(GR, nr - v * GR);
        const __mmask16 have = (__mmask16)(n >= GR ? 0xffff : (1u << n) - 1);
        const uint8_t *vb = base + (size_t)(v * GR) * rb;
        _Alignas(64) float ks[8][GR], km[8][GR];
        for (int64_t b = 0; b < nb; b++) {
            const size_t off = (size_t)b * kvc_i8_block_bytes(kind);
            __m256i r0[GR], r1[GR];     /* q_0..15 and q_16..31 of each row as int16 */
#pragma GCC unroll 16
            for (int l = 0; l < GR; l++) {
                const __m512i q = l < n ? _mm512_cvtepi8_epi16(kvc_i8_block_q(kind, vb + (size_t)l * rb, b))
                                        : _mm512_setzero_si512();
                r0[l] = _mm512_castsi512_si256(q);
                r1[l] = _mm512_extracti64x4_epi64(q, 1);
            }
            transpose_16x8(r0, pack + (b * nv + v) * KS);
            transpose_16x8(r1, pack + (b * nv + v) * KS + 8);
            if (kvc_i8_k_quant(kind)) {
                if (b % 8 == 0) {
                    const uint8_t *rows[GR];
                    for (int l = 0; l < GR; l++)
                        rows[l] = vb + (size_t)KVC_MIN(l, n - 1) * rb;
                    if (kind == I8_Q4_K)
                        k4_group_scales(rows, b / 8, ks, km);
                    else
                        k6_group_scales(rows, b / 8, ks, km);
                }
                _mm512_store_ps(dsc + (b * nv + v) * GR, _mm512_maskz_loadu_ps(have, ks[b % 8]));
                _mm512_store_ps(msc + (b * nv + v) * GR, _mm512_maskz_loadu_ps(have, km[b % 8]));
                continue;
            }
            const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), have, goff, vb + off, 1);
            _mm512_store_ps(dsc + (b * nv + v) * GR, block_scales(kind, h));
        }
    }
}

/* d[v][t] = the dot products over pairs [k0, k0 + nk) of a block (u: its
 * repacked weights; a[t] + po: the token's int16 values of the block). */
AI void block_dots(const int NV, const int T, const int k0, const int nk, const __m512i *u,
                   const int16_t *const a[PT], int64_t po, __m512i d[RV][PT])
{
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            d[v][t] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int k = k0; k < k0 + nk; k++) {
        __m512i wv[RV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            wv[v] = _mm512_load_si512(u + v * KS + k);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            int32_t x2;
            memcpy(&x2, a[t] + po + 2 * k, 4);
            const __m512i x = _mm512_set1_epi32(x2);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++)
                d[v][t] = _mm512_dpwssd_epi32(d[v][t], wv[v], x);
        }
    }
}

/* T <= PT tokens against a repacked group of NV row vectors: out[v][t]
 * lane l = y[t][row 16v + l]. dsc: the blocks' scales (Q6_K: of the first
 * halves); msc: Q4_K's mins, Q6_K's scales of the second halves. */
AI void prefill_pass(const int kind, const int NV, const int T, const __m512i *pack, const float *dsc,
                     const float *msc, int64_t nb, const uint8_t *const *ar, int64_t n_in,
                     __m512 out[RV][PT])
{
    /* the sums live in registers: out could alias the scales the loop loads,
     * so sums kept in out would be stored and reloaded every block */
    __m512 acc[RV][PT];
    const int n_sub = kind == I8_Q6_K ? 2 : 1;
    const int16_t *a[PT];
    const float *dx[PT];
    const int32_t *sx[PT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        a[t] = kvc_i8_a(ar[t], n_in);
        dx[t] = kvc_i8_d(ar[t], n_in);
        sx[t] = kvc_i8_s(ar[t], n_in);
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            acc[v][t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const __m512i *u = pack + b * NV * KS;
#pragma GCC unroll 2
        for (int j = 0; j < n_sub; j++) {
            __m512i d[RV][PT];
            block_dots(NV, T, j * KS / n_sub, KS / n_sub, u, a, 32 * b, d);
            const float *sc = (j ? msc : dsc) + b * NV * GR;
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const __m512 xs = _mm512_set1_ps(dx[t][b]);
#pragma GCC unroll 2
                for (int v = 0; v < NV; v++) {
                    const __m512 ws = _mm512_mul_ps(_mm512_load_ps(sc + v * GR), xs);
                    acc[v][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[v][t]), ws, acc[v][t]);
                    if (kind == I8_Q4_K)           /* the min step */
                        acc[v][t] = _mm512_fmadd_ps(_mm512_set1_ps(-(float)sx[t][b]),
                                                    _mm512_mul_ps(_mm512_load_ps(msc + (b * NV + v) * GR), xs),
                                                    acc[v][t]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            out[v][t] = acc[v][t];
}

typedef void (*pass_fn)(const __m512i *pack, const float *dsc, const float *msc, int64_t nb,
                        const uint8_t *const *ar, int64_t n_in, __m512 acc[RV][PT]);

#define PASS_FN(name, kind, NV, T)                                                                   \
    static void name##_##NV##_##T(const __m512i *pack, const float *dsc, const float *msc, int64_t nb, \
                                  const uint8_t *const *ar, int64_t n_in, __m512 acc[RV][PT])        \
    {                                                                                                \
        prefill_pass(kind, NV, T, pack, dsc, msc, nb, ar, n_in, acc);                                \
    }
#define PASS_FNS_NV(name, kind, NV) PASS_FN(name, kind, NV, 1) PASS_FN(name, kind, NV, 2)              \
    PASS_FN(name, kind, NV, 3) PASS_FN(name, kind, NV, 4) PASS_FN(name, kind, NV, 5)                 \
    PASS_FN(name, kind, NV, 6)
#define PASS_FNS(name, kind) PASS_FNS_NV(name, kind, 1) PASS_FNS_NV(name, kind, 2)
#define PASS_ROW(name, NV) { name##_##NV##_1, name##_##NV##_2, name##_##NV##_3, name##_##NV##_4,      \
                             name##_##NV##_5, name##_##NV##_6 }
PASS_FNS(q8_0_pass, I8_Q8_0)
PASS_FNS(q4_0_pass, I8_Q4_0)
PASS_FNS(q5_0_pass, I8_Q5_0)
PASS_FNS(q4_K_pass, I8_Q4_K)
PASS_FNS(q6_K_pass, I8_Q6_K)
PASS_FNS(mxfp4_pass, I8_MXFP4)

_Static_assert(PT == 6, "pass_fns lists PT functions per row");
static const pass_fn pass_fns[I8_N_VNNI][RV][PT] = {
    { PASS_ROW(q8_0_pass, 1), PASS_ROW(q8_0_pass, 2) },
    { PASS_ROW(q4_0_pass, 1), PASS_ROW(q4_0_pass, 2) },
    { PASS_ROW(q5_0_pass, 1), PASS_ROW(q5_0_pass, 2) },
    { PASS_ROW(q4_K_pass, 1), PASS_ROW(q4_K_pass, 2) },
    { PASS_ROW(q6_K_pass, 1), PASS_ROW(q6_K_pass, 2) },
    { PASS_ROW(mxfp4_pass, 1), PASS_ROW(mxfp4_pass, 2) },
};

typedef void (*repack_fn)(const kvc_weight *w, int64_t rg, int nr, int nv, __m512i *p, float *d, float *m);
#define REPACK_FN(name, kind)                                                                        \
    static void name(const kvc_weight *w, int64_t rg, int nr, int nv, __m512i *p, float *d, float *m) \
    {                                                                                                \
        repack(kind, w, rg, nr, nv, p, d, m);                                                        \
    }
REPACK_FN(repack_q8_0, I8_Q8_0)
REPACK_FN(repack_q4_0, I8_Q4_0)
REPACK_FN(repack_q5_0, I8_Q5_0)
REPACK_FN(repack_q4_K, I8_Q4_K)
REPACK_FN(repack_q6_K, I8_Q6_K)
REPACK_FN(repack_mxfp4, I8_MXFP4)
static const repack_fn repack_fns[I8_N_VNNI] = { repack_q8_0, repack_q4_0, repack_q5_0, repack_q4_K, repack_q6_K,
                                                 repack_mxfp4 };

/* Bytes of a repacked group in scratch (the scales follow). */
static size_t pack_bytes(int64_t n_in) { return (size_t)n_in / 32 * RV * KS * 64; }

static void prefill_act(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    const int kind = kvc_i8_kind(w->type);
    const int64_t nb = w->n_in / 32;
    const size_t as = kvc_i8_act_row_bytes(w->n_in);
    __m512i *pack = (__m512i *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *dsc = (float *)(void *)((uint8_t *)pack + pack_bytes(w->n_in)), *msc = dsc + nb * RV * GR;
    const int64_t n_pass = (n_tok + PT - 1) / PT;
    for (int64_t rg = r0; rg < r1; rg += RV * GR) {
        const int nr = (int)KVC_MIN(RV * GR, r1 - rg), nv = (nr + GR - 1) / GR;
        repack_fns[kind](w, rg, nr, nv, pack, dsc, msc);
        /* the next group's rows come from memory into L2 a slice per pass, so
         * that its repack does not wait for them */
        const char *next = (const char *)w->data + (size_t)(rg + nr) * w->row_bytes;
        const size_t next_bytes = (size_t)KVC_MIN(RV * GR, r1 - rg - nr) * w->row_bytes;
        const size_t slice = (next_bytes / (size_t)n_pass + 63) & ~(size_t)63;
        size_t fetched = 0;
        for (int64_t t0 = 0; t0 < n_tok; t0 += PT) {
            const int T = (int)KVC_MIN(PT, n_tok - t0);
            for (size_t i = 0; i < slice && fetched < next_bytes; i += 64, fetched += 64)
                _mm_prefetch(next + fetched, _MM_HINT_T1);
            __m512 acc[RV][PT];
            const uint8_t *ar[PT];
            for (int t = 0; t < T; t++)
                ar[t] = kvc_i8_tok_row(act, as, tok, t0 + t);
            pass_fns[kind][nv - 1][T - 1](pack, dsc, msc, nb, ar, w->n_in, acc);
            for (int v = 0; v < nv; v++) {
                const int left = nr - v * GR;
                const __mmask16 keep = (__mmask16)(left >= GR ? 0xffff : (1u << left) - 1);
                for (int t = 0; t < T; t++)
                    _mm512_mask_storeu_ps(y + (t0 + t) * ldy + rg + v * GR, keep, acc[v][t]);
            }
        }
    }
}

/* The repacked group, its scales and (K-quants) second scales or mins. */
static size_t prefill_scratch_bytes(int64_t n_in)
{
    return pack_bytes(n_in) + (size_t)n_in / 32 * RV * GR * 2 * sizeof(float);
}

_Static_assert(RV * GR == KVC_VNNI_PREFILL_ROWS, "a prefill group is KVC_VNNI_PREFILL_ROWS rows");

void kvc_vnni_matmul_act(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok, float *y,
                         int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    if (n_tok >= KVC_VNNI_PREFILL_MIN_TOK)       /* from here on, repacking pays */
        prefill_act(w, act, tok, n_tok, y, ldy, r0, r1, scratch);
    else
        decode_act(w, act, tok, n_tok, y, ldy, r0, r1);
}

/* ------------------------------------------------------------ entry point */

/* This file's steps (kernels_int8.h); the types they do not take go to
 * kvc_kernels_avx512. */
const kvc_i8_isa kvc_i8_vnni = { kvc_vnni_quantize_rows, kvc_vnni_matmul_act, prefill_scratch_bytes,
                                 &kvc_kernels_avx512, kvc_i8_vnni_type_ok };

size_t kvc_vnni_scratch_floats(int64_t n_in)
{
    return kvc_i8_scratch_floats(&kvc_i8_vnni, n_in);
}

void kvc_vnni_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                          int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    kvc_i8_matmul_rows(&kvc_i8_vnni, w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
}
