/* kernels_avx512.c - AVX-512 kernels (F, BW, VL, DQ, with FMA and F16C).
 *
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2 and
 * only called after kernels.c found those features at run time.
 *
 * THE ORDER OF ONE DOT PRODUCT (the invariance contract of kernels.h). On this
 * ISA every matmul output y[t][r] = dot(W[r], x[t]) of length n is computed as
 *
 *   acc = 0 (16 lanes)
 *   for k = 0, 16, 32, ... < n:   acc = fma(w[k..k+16), x[k..k+16), acc)
 *       (the last step, when n % 16 != 0, loads zeros past n in both operands)
 *   y = tree(acc): s8[i] = a[i] + a[i+8], s4[i] = s8[i] + s8[i+4],
 *                  s2[i] = s4[i] + s4[i+2], y = s2[0] + s2[1]
 *
 * where w holds the exact float values of the weights (bitwise those of
 * kvc_dequantize_row_ref). The decode kernels (fused, and in lanes for
 * float weights), the register-blocked GEMM tiles and the k-blocked path
 * (which parks acc in scratch between k-blocks) all perform exactly this
 * sequence per element, so a token's results do not depend on its batch,
 * its place in it, or the row split.
 * kvc_dot_f32 and kvc_dot_f16_f32 follow the same order. */
#include "kernels_internal.h"
#include "kernels_simd.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#define MR       8                  /* weight rows per tile and per panel */
#define NT       3                  /* tokens per tile: MR * NT = 24 zmm accumulators */
#define KC_MAX   1024               /* floats of a row per k-block */
#define PANEL_LD (KC_MAX + 16)      /* panel row stride; the pad avoids 4 KiB set aliasing */
#define X_BUDGET (1u << 20)         /* bytes of activations kept hot (L2) per token block */
#define TB_MAX   192                /* tokens per token block */
#define FUSED_MAX_TOK 4             /* batches smaller than this skip the panel (when they can) */

/* ------------------------------------------------------ horizontal sums */

/* The fixed tree of one vector (see the top of the file). */
AI float hsum16(__m512 v)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* The same tree for eight vectors at once: [hsum16(v0), ..., hsum16(v7)].
 * Every addition pairs the same lanes as hsum16 does (a + b == b + a). */
AI __m256 reduce8(const __m512 v[MR])
{
    __m512 a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xee));
    __m512 a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xee));
    __m512 a45 = _mm512_add_ps(_mm512_shuffle_f32x4(v[4], v[5], 0x44), _mm512_shuffle_f32x4(v[4], v[5], 0xee));
    __m512 a67 = _mm512_add_ps(_mm512_shuffle_f32x4(v[6], v[7], 0x44), _mm512_shuffle_f32x4(v[6], v[7], 0xee));
    /* 128-bit lane j of b0: s4 of v[j]; of b1: s4 of v[j + 4] */
    __m512 b0 = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0x88), _mm512_shuffle_f32x4(a01, a23, 0xdd));
    __m512 b1 = _mm512_add_ps(_mm512_shuffle_f32x4(a45, a67, 0x88), _mm512_shuffle_f32x4(a45, a67, 0xdd));
    /* lane j: [s2 of v[j] (2), s2 of v[j + 4] (2)] */
    __m512 c = _mm512_add_ps(_mm512_shuffle_ps(b0, b1, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 d = _mm512_add_ps(c, _mm512_shuffle_ps(c, c, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, d));
}

/* Store the first nr of 8 results. */
AI void store_rows(float *y, __m256 s, int nr)
{
    if (nr == MR)
        _mm256_storeu_ps(y, s);
    else
        _mm256_mask_storeu_ps(y, (__mmask8)((1u << nr) - 1), s);
}

static inline __mmask16 tail_mask(int64_t left) { return (__mmask16)((1u << left) - 1); }

/* Keep a loaded vector in a register: otherwise GCC folds the load into each
 * FMA that uses it, and a tile turns load-bound (27 loads per 24 FMAs). */
AI void in_register(__m512 *v) { __asm__("" : "+v"(*v)); }

/* --------------------------------------------------------- dequantization
 * Bitwise equal to kvc_dequantize_row_ref: the same float operations (the
 * scale products computed as scalars exactly as there, then one multiply and
 * one add or subtract per element). */

static void dq_f16(const kvc_fp16 *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}

AI __m512 bf16x16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

static void dq_bf16(const kvc_bf16 *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, bf16x16(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, bf16x16(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}

AI __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
AI __m512 i32f(__m512i v) { return _mm512_cvtepi32_ps(v); }

/* The 4- and 5-bit formats have at most 32 distinct values per block or
 * sub-block. We compute that table with the reference's own operations,
 * applied to the codes 0..31 as floats (exact), and look every element up with
 * vpermps / vpermi2ps: one shuffle instead of convert, scale and offset. */

AI __m512 iota_lo(void) { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
AI __m512 iota_hi(void) { return _mm512_setr_ps(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31); }

/* Table lookups: vpermps uses index bits 0-3 (so a byte's high nibble above
 * them does not matter), vpermi2ps bits 0-4. */
AI __m512 lut16(__m512i idx, __m512 t) { return _mm512_permutexvar_ps(idx, t); }
AI __m512 lut32(__m512i idx, __m512 t_lo, __m512 t_hi) { return _mm512_permutex2var_ps(t_lo, idx, t_hi); }

static void dq_q4_0(const block_q4_0 *b, float *y, int64_t nb)
{
    const __m512 codes = _mm512_sub_ps(iota_lo(), _mm512_set1_ps(8.0f));     /* (float)(q - 8) */
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m512 t = _mm512_mul_ps(codes, _mm512_set1_ps(_cvtsh_ss(b->d)));
        __m512i v = u8x16(b->qs);
        _mm512_storeu_ps(y, lut16(v, t));
        _mm512_storeu_ps(y + 16, lut16(_mm512_srli_epi32(v, 4), t));
    }
}

static void dq_q4_1(const block_q4_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m512 t = _mm512_add_ps(_mm512_mul_ps(iota_lo(), _mm512_set1_ps(_cvtsh_ss(b->d))),
                                       _mm512_set1_ps(_cvtsh_ss(b->m)));
        __m512i v = u8x16(b->qs);
        _mm512_storeu_ps(y, lut16(v, t));
        _mm512_storeu_ps(y + 16, lut16(_mm512_srli_epi32(v, 4), t));
    }
}

/* Q5_*: 5-bit codes of the 32 elements: nibble plus bit j of qh. */
AI void q5_codes(const uint8_t qs[16], const uint8_t qh[4], __m512i *lo, __m512i *hi)
{
    const __m512i c15 = _mm512_set1_epi32(15), c16 = _mm512_set1_epi32(16);
    uint32_t h;
    memcpy(&h, qh, 4);
    __m512i v = u8x16(qs);
    __m512i l = _mm512_and_si512(v, c15), u = _mm512_srli_epi32(v, 4);
    *lo = _mm512_mask_or_epi32(l, (__mmask16)(h & 0xffff), l, c16);
    *hi = _mm512_mask_or_epi32(u, (__mmask16)(h >> 16), u, c16);
}

static void dq_q5_0(const block_q5_0 *b, float *y, int64_t nb)
{
    const __m512 c16 = _mm512_set1_ps(16.0f);
    const __m512 codes_lo = _mm512_sub_ps(iota_lo(), c16), codes_hi = _mm512_sub_ps(iota_hi(), c16);
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
        const __m512 t_lo = _mm512_mul_ps(codes_lo, d), t_hi = _mm512_mul_ps(codes_hi, d);
        __m512i lo, hi;
        q5_codes(b->qs, b->qh, &lo, &hi);
        _mm512_storeu_ps(y, lut32(lo, t_lo, t_hi));
        _mm512_storeu_ps(y + 16, lut32(hi, t_lo, t_hi));
    }
}

static void dq_q5_1(const block_q5_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d)), m = _mm512_set1_ps(_cvtsh_ss(b->m));
        const __m512 t_lo = _mm512_add_ps(_mm512_mul_ps(iota_lo(), d), m);
        const __m512 t_hi = _mm512_add_ps(_mm512_mul_ps(iota_hi(), d), m);
        __m512i lo, hi;
        q5_codes(b->qs, b->qh, &lo, &hi);
        _mm512_storeu_ps(y, lut32(lo, t_lo, t_hi));
        _mm512_storeu_ps(y + 16, lut32(hi, t_lo, t_hi));
    }
}

static void dq_q8_0(const block_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
        __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
        __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16)));
        _mm512_storeu_ps(y, _mm512_mul_ps(i32f(q0), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(i32f(q1), d));
    }
}

/* MXFP4: the block's 16 values (float)kvc_mxfp4_values[c] * d, the
 * reference's product, as a table; each element looked up by its code. */
static void dq_mxfp4(const block_mxfp4 *b, float *y, int64_t nb)
{
    const __m512 values = i32f(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)kvc_mxfp4_values)));
    for (int64_t i = 0; i < nb; i++, b++, y += QK_MXFP4) {
        const __m512 t = _mm512_mul_ps(values, _mm512_set1_ps(kvc_e8m0_half(b->e)));
        const __m512i c = u8x16(b->qs);            /* lut16 reads bits 0-3: the low nibble */
        _mm512_storeu_ps(y, lut16(c, t));
        _mm512_storeu_ps(y + QK_MXFP4 / 2, lut16(_mm512_srli_epi32(c, 4), t));
    }
}

/* The table of sub-block values d1 * q - m1 for codes q = 0..15 (or 16..31). */
AI __m512 k4_table(__m512 codes, float ds, float dm)
{
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(ds), codes), _mm512_set1_ps(dm));
}

static void dq_q4_K(const block_q4_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++) {
        float ds[8], dm[8];
        kvc_k4_scales(b->scales, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), ds, dm);
        for (int c = 0; c < 4; c++, y += 64) {
            const __m512 t1 = k4_table(iota_lo(), ds[2 * c], dm[2 * c]);
            const __m512 t2 = k4_table(iota_lo(), ds[2 * c + 1], dm[2 * c + 1]);
            __m512i v0 = u8x16(b->qs + 32 * c), v1 = u8x16(b->qs + 32 * c + 16);
            _mm512_storeu_ps(y,      lut16(v0, t1));
            _mm512_storeu_ps(y + 16, lut16(v1, t1));
            _mm512_storeu_ps(y + 32, lut16(_mm512_srli_epi32(v0, 4), t2));
            _mm512_storeu_ps(y + 48, lut16(_mm512_srli_epi32(v1, 4), t2));
        }
    }
}

/* Q5_K: the 5-bit codes of a block in element order, assembled with byte
 * operations one 64-element chunk at a time: the chunk's 32 bytes of qs
 * serve both halves (low nibbles, then high ones), qh bits 2c / 2c + 1 give
 * their 5th bits. (16-bit shifts are safe: the masks drop what they carry
 * across bytes.) */
AI void q5k_codes(const block_q5_K *b, uint8_t q[QK_K])
{
    const __m512i c0f = _mm512_set1_epi8(0x0f), c10 = _mm512_set1_epi8(0x10);
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->qh));
    const __m512i nib = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + 32 * c))), nib);
        const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
        const __m512i hb = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(h, cnt), 4), c10);
        /* (v & 0x0f) | hb: 0xec = (A & C) | B */
        _mm512_storeu_si512(q + 64 * c, _mm512_ternarylogic_epi32(v, hb, c0f, 0xec));
    }
}

static void dq_q5_K(const block_q5_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
        float ds[8], dm[8];
        uint8_t q[QK_K];
        kvc_k4_scales(b->scales, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), ds, dm);
        q5k_codes(b, q);
        for (int g = 0; g < QK_K / 16; g++)
            _mm512_storeu_ps(y + 16 * g, _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(ds[g / 2]), i32f(u8x16(q + 16 * g))),
                                                       _mm512_set1_ps(dm[g / 2])));
    }
}

/* Q6_K: the 6-bit codes of a 128-element half, minus 32, in element order
 * in q. They are assembled with byte operations, 64 at a time (ql's 64 bytes
 * hold elements 0..63 in their low nibbles, 64..127 in their high ones). */
AI void q6_codes(const uint8_t *ql, const uint8_t *qh, int8_t q[128])
{
    const __m512i c0f = _mm512_set1_epi8(0x0f), c30 = _mm512_set1_epi8(0x30), c32 = _mm512_set1_epi8(32);
    /* qh bits 0-1 / 2-3 go to bits 4-5 for elements 0..31 / 32..63: shift left 4 / 2;
     * bits 4-5 / 6-7 for elements 64..95 / 96..127: shift right 0 / 2 */
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i l = _mm512_loadu_si512(ql);
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i h_lo = _mm512_and_si512(_mm512_sllv_epi16(h, sh_lo), c30);
    const __m512i h_hi = _mm512_and_si512(_mm512_srlv_epi16(h, sh_hi), c30);
    /* (a & c0f) | h as one ternary-logic op: 0xec = (A & C) | B */
    const __m512i q_lo = _mm512_ternarylogic_epi32(l, h_lo, c0f, 0xec);
    const __m512i q_hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l, 4), h_hi, c0f, 0xec);
    _mm512_storeu_si512(q, _mm512_sub_epi8(q_lo, c32));
    _mm512_storeu_si512(q + 64, _mm512_sub_epi8(q_hi, c32));
}

/* d * (float)sc for the 16 scales of a Q6_K block: the reference's first product. */
AI void q6_scales(const block_q6_K *b, float ds[16])
{
    const __m512 sc = i32f(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->scales)));
    _mm512_storeu_ps(ds, _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b->d)), sc));
}

/* 16 weights of Q6_K: (d * sc) * (q - 32), as the reference. */
AI __m512 q6_w16(const int8_t *q, float ds)
{
    return _mm512_mul_ps(_mm512_set1_ps(ds), i32f(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))));
}

static void dq_q6_K(const block_q6_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++) {
        float ds[16];
        q6_scales(b, ds);
        for (int h = 0; h < 2; h++, y += 128) {
            int8_t q[128];
            q6_codes(b->ql + 64 * h, b->qh + 32 * h, q);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++)
                _mm512_storeu_ps(y + 16 * g, q6_w16(q + 16 * g, ds[8 * h + g]));
        }
    }
}

static void avx512_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const kvc_type_traits *t = kvc_type_info(type);
    const int64_t nb = n / t->block_size;
    switch (type) {
    case KVC_TYPE_F32:  memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KVC_TYPE_F16:  dq_f16(src, dst, n); break;
    case KVC_TYPE_BF16: dq_bf16(src, dst, n); break;
    case KVC_TYPE_Q4_0: dq_q4_0(src, dst, nb); break;
    case KVC_TYPE_Q4_1: dq_q4_1(src, dst, nb); break;
    case KVC_TYPE_Q5_0: dq_q5_0(src, dst, nb); break;
    case KVC_TYPE_Q5_1: dq_q5_1(src, dst, nb); break;
    case KVC_TYPE_Q8_0: dq_q8_0(src, dst, nb); break;
    case KVC_TYPE_Q4_K: dq_q4_K(src, dst, nb); break;
    case KVC_TYPE_Q5_K: dq_q5_K(src, dst, nb); break;
    case KVC_TYPE_Q6_K: dq_q6_K(src, dst, nb); break;
    case KVC_TYPE_MXFP4: dq_mxfp4(src, dst, nb); break;
    default:            kvc_dequantize_row_ref(type, src, dst, n); break;
    }
}

/* ------------------------------------------------ GEMM through a panel
 * Prefill: MR rows of weights, k-block [kb, kb + kn), are dequantized once
 * into an aligned float panel and reused by every token of the token block.
 * A tile holds MR x T accumulators (T <= NT tokens) in registers; between
 * k-blocks they are parked in scratch (accbuf), which does not change the
 * per-element sequence of FMAs. */

AI void tile_fma(const int T, const float *pw, const float *x, int64_t ldx, int64_t n,
                 __m512 acc[MR][NT])
{
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512 xv[NT];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            xv[t] = _mm512_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512 wv = _mm512_load_ps(pw + r * PANEL_LD + k);
            in_register(&wv);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (k < n) {
        const __mmask16 m = tail_mask(n - k);
        __m512 xv[NT];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + k);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512 wv = _mm512_maskz_load_ps(m, pw + r * PANEL_LD + k);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
}

/* One tile over one k-block. accbuf: T * MR vectors, read unless `first`,
 * written unless `last`; when `last`, the sums go to y (nr valid rows). */
AI void panel_tile(const int T, const float *panel, const float *x, int64_t ldx, int64_t kn,
                   float *accbuf, bool first, bool last, float *y, int64_t ldy, int nr)
{
    __m512 acc[MR][NT];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = first ? _mm512_setzero_ps() : _mm512_load_ps(accbuf + (t * MR + r) * 16);
    tile_fma(T, panel, x, ldx, kn, acc);
    if (!last) {
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                _mm512_store_ps(accbuf + (t * MR + r) * 16, acc[r][t]);
        return;
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m512 col[MR];
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++)
            col[r] = acc[r][t];
        store_rows(y + t * ldy, reduce8(col), nr);
    }
}

#define PANEL_TILE_FN(T)                                                                     \
    static void panel_tile##T(const float *panel, const float *x, int64_t ldx, int64_t kn,  \
                              float *accbuf, bool first, bool last, float *y, int64_t ldy,  \
                              int nr)                                                       \
    {                                                                                       \
        panel_tile(T, panel, x, ldx, kn, accbuf, first, last, y, ldy, nr);                  \
    }
PANEL_TILE_FN(1)
PANEL_TILE_FN(2)
PANEL_TILE_FN(3)

/* Floats per k-block: at most KC_MAX, a multiple of 16 and of the block size,
 * k-blocks of about equal size. */
static int64_t k_block(uint32_t type, int64_t n_in)
{
    const int64_t unit = KVC_MAX(16, kvc_type_info(type)->block_size);
    const int64_t nkb = (n_in + KC_MAX - 1) / KC_MAX;
    const int64_t per = (n_in + nkb - 1) / nkb;
    return (per + unit - 1) / unit * unit;
}

/* Tokens per token block: as many as keep X_BUDGET bytes of activations. */
static int64_t tok_block(int64_t n_in)
{
    int64_t tb = (int64_t)X_BUDGET / (n_in * (int64_t)sizeof(float));
    tb = KVC_MAX(NT, KVC_MIN(TB_MAX, tb));
    return tb / NT * NT;
}

static size_t avx512_scratch_floats(int64_t n_in)
{
    size_t acc = n_in > KC_MAX ? (size_t)tok_block(n_in) * MR * 16 : 0;
    return (size_t)MR * PANEL_LD + acc + 16;
}

static void fill_panel(const kvc_weight *w, int64_t rg, int nr, int64_t kb, int64_t kn, float *panel)
{
    const kvc_type_traits *tt = kvc_type_info(w->type);
    const size_t off = (size_t)(kb / tt->block_size) * tt->type_size;
    const uint8_t *base = (const uint8_t *)w->data + (size_t)rg * w->row_bytes + off;
    for (int r = 0; r < nr; r++)
        avx512_dequantize_row(w->type, base + (size_t)r * w->row_bytes, panel + r * PANEL_LD, kn);
    for (int r = nr; r < MR; r++)
        memset(panel + r * PANEL_LD, 0, (size_t)kn * sizeof(float));
}

static void matmul_panel(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    const int64_t n_in = w->n_in, kc = k_block(w->type, n_in), tb = tok_block(n_in);
    /* 64-byte alignment even if the caller's scratch lacks it (the +16 floats of slack) */
    float *panel = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63), *accbuf = panel + MR * PANEL_LD;
    for (int64_t t0 = 0; t0 < n_tok; t0 += tb) {
        const int64_t nt = KVC_MIN(tb, n_tok - t0);
        for (int64_t rg = r0; rg < r1; rg += MR) {
            const int nr = (int)KVC_MIN(MR, r1 - rg);
            for (int64_t kb = 0; kb < n_in; kb += kc) {
                const int64_t kn = KVC_MIN(kc, n_in - kb);
                const bool first = kb == 0, last = kb + kn == n_in;
                fill_panel(w, rg, nr, kb, kn, panel);
                for (int64_t t = 0; t < nt;) {
                    const int64_t T = KVC_MIN(NT, nt - t);
                    const float *xt = x + (t0 + t) * ldx + kb;
                    float *yt = y + (t0 + t) * ldy + rg, *ab = accbuf + t * MR * 16;
                    if (T == 3)
                        panel_tile3(panel, xt, ldx, kn, ab, first, last, yt, ldy, nr);
                    else if (T == 2)
                        panel_tile2(panel, xt, ldx, kn, ab, first, last, yt, ldy, nr);
                    else
                        panel_tile1(panel, xt, ldx, kn, ab, first, last, yt, ldy, nr);
                    t += T;
                }
            }
        }
    }
}

/* ------------------------------------------------ fused decode kernels
 * Few tokens of quantized weights: stream MR weight rows once per token,
 * converting in registers (no panel). Same per-element sequence as the panel
 * path. (Float weights have their own row order: the next section.)
 *
 * Decode streams weights from DRAM, and prefetching decides its speed. Rows
 * of a few KiB (896 halves) end before the hardware prefetcher has ramped up,
 * so while a group of MR contiguous rows is consumed, the next group is
 * prefetched at the same pace into L2. Longer rows get a prefetch PF_AHEAD
 * bytes ahead in each row instead: the hardware streams them well, and a
 * next-group prefetch there caps near the fill-buffer limit (~12 GB/s). */

#define PF_GROUP_MAX (48 << 10)   /* group bytes up to which the next group is prefetched */
#define PF_AHEAD     512          /* bytes ahead within each row otherwise */

typedef struct {
    const uint8_t *next;          /* next group's first byte, or NULL */
    int            ahead;         /* in-row distance in bytes, or 0 */
} prefetch_plan;

AI void prefetch_next(prefetch_plan *pf, int bytes)
{
    for (int i = 0; i < bytes; i += 64)
        _mm_prefetch((const char *)pf->next + i, _MM_HINT_T1);
    pf->next += bytes;
}

AI void prefetch_ahead(const uint8_t *const rows[MR], size_t off)
{
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
        _mm_prefetch((const char *)rows[r] + off, _MM_HINT_T0);
}

/* Q8_0: the weight vector is (float)q * d, exactly the reference's value. */
static void fused_q8_0(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        const __m512 x0 = _mm512_loadu_ps(x + ib * QK8_0), x1 = _mm512_loadu_ps(x + ib * QK8_0 + 16);
        if (pf.next)
            prefetch_next(&pf, MR * (int)sizeof(block_q8_0));
        if (pf.ahead)
            prefetch_ahead(rows, (size_t)ib * sizeof(block_q8_0) + (size_t)pf.ahead);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const block_q8_0 *b = (const block_q8_0 *)(const void *)rows[r] + ib;
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
            __m512 w0 = _mm512_mul_ps(i32f(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs))), d);
            __m512 w1 = _mm512_mul_ps(i32f(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16)))), d);
            acc[r] = _mm512_fmadd_ps(w0, x0, acc[r]);
            acc[r] = _mm512_fmadd_ps(w1, x1, acc[r]);
        }
    }
}

/* K-quants: per super-block and row, the scales as dq_q4_K / dq_q6_K make
 * them, then each 16 weights built in registers and used at once. */
AI void prefetch_block(prefetch_plan *pf, const uint8_t *const rows[MR], int64_t ib, int bytes)
{
    if (pf->next)
        prefetch_next(pf, MR * bytes);
    if (pf->ahead)
        for (int i = 0; i < bytes; i += 64)
            prefetch_ahead(rows, (size_t)(ib * bytes + i + pf->ahead));
}

static void fused_q4_K(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q4_K));
        const block_q4_K *b[MR];
        float ds[MR][8], dm[MR][8];
        for (int r = 0; r < MR; r++) {
            b[r] = (const block_q4_K *)(const void *)rows[r] + ib;
            kvc_k4_scales(b[r]->scales, _cvtsh_ss(b[r]->d), _cvtsh_ss(b[r]->dmin), ds[r], dm[r]);
        }
        /* rows innermost: MR independent FMA chains in flight */
        for (int c = 0; c < 4; c++) {
            const float *xc = xb + 64 * c;
            const __m512 x0 = _mm512_loadu_ps(xc), x1 = _mm512_loadu_ps(xc + 16);
            const __m512 x2 = _mm512_loadu_ps(xc + 32), x3 = _mm512_loadu_ps(xc + 48);
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                const __m512 t1 = k4_table(iota_lo(), ds[r][2 * c], dm[r][2 * c]);
                const __m512 t2 = k4_table(iota_lo(), ds[r][2 * c + 1], dm[r][2 * c + 1]);
                const __m512i v0 = u8x16(b[r]->qs + 32 * c), v1 = u8x16(b[r]->qs + 32 * c + 16);
                acc[r] = _mm512_fmadd_ps(lut16(v0, t1), x0, acc[r]);
                acc[r] = _mm512_fmadd_ps(lut16(v1, t1), x1, acc[r]);
                acc[r] = _mm512_fmadd_ps(lut16(_mm512_srli_epi32(v0, 4), t2), x2, acc[r]);
                acc[r] = _mm512_fmadd_ps(lut16(_mm512_srli_epi32(v1, 4), t2), x3, acc[r]);
            }
        }
    }
}

/* Each Q5_K weight is one fmsub: d1 * q is exact (see quant.c), so
 * fmsub(d1, q, m1) rounds once, exactly as the reference's multiply-then-subtract. */
static void fused_q5_K(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q5_K));
        float ds[MR][8], dm[MR][8];
        uint8_t q[MR][QK_K];
        for (int r = 0; r < MR; r++) {
            const block_q5_K *b = (const block_q5_K *)(const void *)rows[r] + ib;
            kvc_k4_scales(b->scales, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), ds[r], dm[r]);
            q5k_codes(b, q[r]);
        }
        for (int g = 0; g < QK_K / 16; g++) {       /* rows innermost: MR chains in flight */
            const __m512 xv = _mm512_loadu_ps(xb + 16 * g);
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                const __m512 w = _mm512_fmsub_ps(_mm512_set1_ps(ds[r][g / 2]), i32f(u8x16(q[r] + 16 * g)),
                                                 _mm512_set1_ps(dm[r][g / 2]));
                acc[r] = _mm512_fmadd_ps(w, xv, acc[r]);
            }
        }
    }
}

static void fused_q6_K(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q6_K));
        const block_q6_K *b[MR];
        float ds[MR][16];
        for (int r = 0; r < MR; r++) {
            b[r] = (const block_q6_K *)(const void *)rows[r] + ib;
            q6_scales(b[r], ds[r]);
        }
        for (int h = 0; h < 2; h++) {
            int8_t q[MR][128];
            for (int r = 0; r < MR; r++)
                q6_codes(b[r]->ql + 64 * h, b[r]->qh + 32 * h, q[r]);
            for (int g = 0; g < 8; g++) {            /* rows innermost: MR chains in flight */
                const __m512 xv = _mm512_loadu_ps(xb + 128 * h + 16 * g);
#pragma GCC unroll 8
                for (int r = 0; r < MR; r++)
                    acc[r] = _mm512_fmadd_ps(q6_w16(q[r] + 16 * g, ds[r][8 * h + g]), xv, acc[r]);
            }
        }
    }
}

static void fused_q4_0(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    const __m512 codes = _mm512_sub_ps(iota_lo(), _mm512_set1_ps(8.0f));     /* as dq_q4_0 */
    for (int64_t ib = 0; ib < n / QK4_0; ib++) {
        const __m512 x0 = _mm512_loadu_ps(x + ib * QK4_0), x1 = _mm512_loadu_ps(x + ib * QK4_0 + 16);
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q4_0));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const block_q4_0 *b = (const block_q4_0 *)(const void *)rows[r] + ib;
            const __m512 t = _mm512_mul_ps(codes, _mm512_set1_ps(_cvtsh_ss(b->d)));
            const __m512i v = u8x16(b->qs);
            acc[r] = _mm512_fmadd_ps(lut16(v, t), x0, acc[r]);
            acc[r] = _mm512_fmadd_ps(lut16(_mm512_srli_epi32(v, 4), t), x1, acc[r]);
        }
    }
}

/* Q4_1, Q5_0, Q5_1: the block's value table as dq_q4_1 / dq_q5_0 / dq_q5_1
 * make it, the codes looked up in registers. */
static void fused_q4_1(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    for (int64_t ib = 0; ib < n / QK4_1; ib++) {
        const __m512 x0 = _mm512_loadu_ps(x + ib * QK4_1), x1 = _mm512_loadu_ps(x + ib * QK4_1 + 16);
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q4_1));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const block_q4_1 *b = (const block_q4_1 *)(const void *)rows[r] + ib;
            const __m512 t = _mm512_add_ps(_mm512_mul_ps(iota_lo(), _mm512_set1_ps(_cvtsh_ss(b->d))),
                                           _mm512_set1_ps(_cvtsh_ss(b->m)));
            const __m512i v = u8x16(b->qs);
            acc[r] = _mm512_fmadd_ps(lut16(v, t), x0, acc[r]);
            acc[r] = _mm512_fmadd_ps(lut16(_mm512_srli_epi32(v, 4), t), x1, acc[r]);
        }
    }
}

AI void fused_q5(const bool with_min, const uint8_t *const rows[MR], prefetch_plan pf, const float *x,
                 int64_t n, __m512 acc[MR])
{
    const int bytes = with_min ? (int)sizeof(block_q5_1) : (int)sizeof(block_q5_0);
    const __m512 c16 = _mm512_set1_ps(16.0f);
    const __m512 codes_lo = _mm512_sub_ps(iota_lo(), c16), codes_hi = _mm512_sub_ps(iota_hi(), c16);
    for (int64_t ib = 0; ib < n / 32; ib++) {
        const __m512 x0 = _mm512_loadu_ps(x + ib * 32), x1 = _mm512_loadu_ps(x + ib * 32 + 16);
        prefetch_block(&pf, rows, ib, bytes);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512 t_lo, t_hi;
            __m512i lo, hi;
            if (with_min) {
                const block_q5_1 *b = (const block_q5_1 *)(const void *)rows[r] + ib;
                const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d)), m = _mm512_set1_ps(_cvtsh_ss(b->m));
                t_lo = _mm512_add_ps(_mm512_mul_ps(iota_lo(), d), m);
                t_hi = _mm512_add_ps(_mm512_mul_ps(iota_hi(), d), m);
                q5_codes(b->qs, b->qh, &lo, &hi);
            } else {
                const block_q5_0 *b = (const block_q5_0 *)(const void *)rows[r] + ib;
                const __m512 d = _mm512_set1_ps(_cvtsh_ss(b->d));
                t_lo = _mm512_mul_ps(codes_lo, d);
                t_hi = _mm512_mul_ps(codes_hi, d);
                q5_codes(b->qs, b->qh, &lo, &hi);
            }
            acc[r] = _mm512_fmadd_ps(lut32(lo, t_lo, t_hi), x0, acc[r]);
            acc[r] = _mm512_fmadd_ps(lut32(hi, t_lo, t_hi), x1, acc[r]);
        }
    }
}

static void fused_q5_0(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    fused_q5(false, rows, pf, x, n, acc);
}

static void fused_q5_1(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n, __m512 acc[MR])
{
    fused_q5(true, rows, pf, x, n, acc);
}

typedef void (*fused_fn)(const uint8_t *const rows[MR], prefetch_plan pf, const float *x, int64_t n,
                         __m512 acc[MR]);

static fused_fn fused_for(uint32_t type)
{
    switch (type) {
    case KVC_TYPE_Q8_0: return fused_q8_0;
    case KVC_TYPE_Q4_0: return fused_q4_0;
    case KVC_TYPE_Q4_1: return fused_q4_1;
    case KVC_TYPE_Q5_0: return fused_q5_0;
    case KVC_TYPE_Q5_1: return fused_q5_1;
    case KVC_TYPE_Q4_K: return fused_q4_K;
    case KVC_TYPE_Q5_K: return fused_q5_K;
    case KVC_TYPE_Q6_K: return fused_q6_K;
    default:            return NULL;
    }
}

static void matmul_fused(fused_fn fn, const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1)
{
    const uint8_t *base = w->data;
    for (int64_t rg = r0; rg < r1; rg += MR) {
        const int nr = (int)KVC_MIN(MR, r1 - rg);
        const uint8_t *rows[MR];
        for (int r = 0; r < MR; r++)      /* missing rows repeat the last one; not stored */
            rows[r] = base + (size_t)(rg + KVC_MIN(r, nr - 1)) * w->row_bytes;
        prefetch_plan pf = { NULL, 0 };   /* for the first token, which brings the rows in */
        if (MR * w->row_bytes > PF_GROUP_MAX)
            pf.ahead = PF_AHEAD;
        else if (rg + MR < r1)
            pf.next = base + (size_t)(rg + MR) * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t++) {
            __m512 acc[MR];
            for (int r = 0; r < MR; r++)
                acc[r] = _mm512_setzero_ps();
            fn(rows, pf, x + t * ldx, w->n_in, acc);
            store_rows(y + t * ldy + rg, reduce8(acc), nr);
            pf = (prefetch_plan){ NULL, 0 };
        }
    }
}

/* ------------------------------------------ decode of float weights
 * Few tokens of F32, F16 or BF16 weights: KVC_LANES rows per pass, in the
 * lane order of kernels_internal.h, converted in registers. Same per-element
 * sequence as the panel path. */

enum { W_F32, W_F16, W_BF16 };

AI __m512 load_w(const int kind, const uint8_t *row, int64_t k)
{
    if (kind == W_F32)
        return _mm512_loadu_ps((const float *)(const void *)row + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)(const void *)row + k));
    return kind == W_F16 ? _mm512_cvtph_ps(h) : bf16x16(h);
}

AI __m512 load_w_tail(const int kind, const uint8_t *row, int64_t k, __mmask16 m)
{
    if (kind == W_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)(const void *)row + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)(const void *)row + k);
    return kind == W_F16 ? _mm512_cvtph_ps(h) : bf16x16(h);
}

/* The dot products of x with one row per lane (kernels_internal.h) into
 * dot[KVC_LANES]: KVC_LANES FMA chains in flight, as many as keep up with
 * memory. No software prefetch: each lane is a sequential stream, which the
 * hardware prefetchers follow best alone. */
_Static_assert(KVC_LANES <= MR, "lanes_float reduces its accumulators with reduce8");

AI void lanes_float(const int kind, const uint8_t *const rows[KVC_LANES], const float *x, int64_t n,
                    float dot[KVC_LANES])
{
    __m512 acc[MR];                  /* lanes 0..3, then 4..7 repeating them for reduce8 */
    for (int j = 0; j < KVC_LANES; j++)
        acc[j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 4
        for (int j = 0; j < KVC_LANES; j++)
            acc[j] = _mm512_fmadd_ps(load_w(kind, rows[j], k), xv, acc[j]);
    }
    if (k < n) {
        const __mmask16 m = tail_mask(n - k);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 4
        for (int j = 0; j < KVC_LANES; j++)
            acc[j] = _mm512_fmadd_ps(load_w_tail(kind, rows[j], k, m), xv, acc[j]);
    }
    for (int j = KVC_LANES; j < MR; j++)
        acc[j] = acc[j - KVC_LANES];
    _mm_storeu_ps(dot, _mm256_castps256_ps128(reduce8(acc)));
}

KVC_FLOAT_LANES(lanes_float)

static void avx512_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                               float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    kvc_lanes_fn lanes = n_tok < FUSED_MAX_TOK ? lanes_for(w->type) : NULL;
    fused_fn fn = n_tok < FUSED_MAX_TOK ? fused_for(w->type) : NULL;
    if (lanes)
        kvc_matmul_lanes(lanes, w, x, ldx, n_tok, y, ldy, r0, r1);
    else if (fn)
        matmul_fused(fn, w, x, ldx, n_tok, y, ldy, r0, r1);
    else
        matmul_panel(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
}

/* ------------------------------------------------------ attention helpers */

static float avx512_dot_f32(const float *a, const float *b, int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc);
    if (k < n) {
        const __mmask16 m = tail_mask(n - k);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc);
    }
    return hsum16(acc);
}

static float avx512_dot_f16_f32(const kvc_fp16 *a, const float *b, int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + k))),
                              _mm512_loadu_ps(b + k), acc);
    if (k < n) {
        const __mmask16 m = tail_mask(n - k);
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + k)),
                              _mm512_maskz_loadu_ps(m, b + k), acc);
    }
    return hsum16(acc);
}

/* y[i] = fma(a, x[i], y[i]): one rounding per element. */
static void avx512_axpy_f32(float a, const float *x, float *y, int64_t n)
{
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i),
                                                        _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* kernels.h's GDN row, 16 lanes (masked tail). */
static float avx512_gdn_row(float *s, const float *k, const float *q, float decay, float v, float beta,
                            int64_t n)
{
    const __m512 dv = _mm512_set1_ps(decay);
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(s + i), dv);
        _mm512_storeu_ps(s + i, r);
        acc = _mm512_fmadd_ps(r, _mm512_loadu_ps(k + i), acc);
    }
    const __mmask16 m = i < n ? tail_mask(n - i) : 0;
    if (i < n) {
        const __m512 r = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + i), dv);
        _mm512_mask_storeu_ps(s + i, m, r);
        acc = _mm512_fmadd_ps(r, _mm512_maskz_loadu_ps(m, k + i), acc);
    }
    const __m512 d = _mm512_set1_ps((v - hsum16(acc)) * beta);
    acc = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 r = _mm512_fmadd_ps(d, _mm512_loadu_ps(k + i), _mm512_loadu_ps(s + i));
        _mm512_storeu_ps(s + i, r);
        acc = _mm512_fmadd_ps(r, _mm512_loadu_ps(q + i), acc);
    }
    if (i < n) {
        const __m512 r = _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(m, k + i), _mm512_maskz_loadu_ps(m, s + i));
        _mm512_mask_storeu_ps(s + i, m, r);
        acc = _mm512_fmadd_ps(r, _mm512_maskz_loadu_ps(m, q + i), acc);
    }
    return hsum16(acc);
}

static void avx512_axpy_f16(float a, const kvc_fp16 *x, float *y, int64_t n)
{
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                                                _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)),
                                                        _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static void avx512_fp32_to_fp16_row(const float *x, kvc_fp16 *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i),
                                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

static void avx512_fp16_to_fp32_row(const kvc_fp16 *x, float *y, int64_t n) { dq_f16(x, y, n); }

/* kernels.h's SwiGLU, 16 elements at a time. */
static inline __m512 swiglu16(__m512 g, __m512 u)
{
    const __m512 nabs = _mm512_or_ps(g, _mm512_set1_ps(-0.0f));            /* -|g| */
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(nabs, _mm512_set1_ps(-80.0f), _CMP_GE_OQ),
                                         kvc_exp_neg16(nabs));
    const __mmask16 pos = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ);
    const __m512 num = _mm512_mask_mov_ps(_mm512_mul_ps(g, e), pos, g);
    return _mm512_mul_ps(_mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

static void avx512_swiglu(float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(g + i, swiglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(g + i, m, swiglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

const kvc_kernel_ops kvc_kernels_avx512 = {
    .matmul_rows           = avx512_matmul_rows,
    .matmul_scratch_floats = avx512_scratch_floats,
    .dequantize_row        = avx512_dequantize_row,
    .dot_f32               = avx512_dot_f32,
    .dot_f16_f32           = avx512_dot_f16_f32,
    .axpy_f32              = avx512_axpy_f32,
    .gdn_row               = avx512_gdn_row,
    .axpy_f16              = avx512_axpy_f16,
    .fp32_to_fp16_row      = avx512_fp32_to_fp16_row,
    .fp16_to_fp32_row      = avx512_fp16_to_fp32_row,
    .swiglu                = avx512_swiglu,
};
