/* kernels_avx2.c - AVX2 kernels (with FMA and F16C).
 *
 * Built with -mavx2 -mfma -mf16c and only called after kernels.c found those
 * features at run time.
 *
 * THE ORDER OF ONE DOT PRODUCT (the invariance contract of kernels.h). On this
 * ISA every matmul output y[t][r] = dot(W[r], x[t]) of length n is computed as
 *
 *   acc = 0 (8 lanes)
 *   for k = 0, 8, 16, ... < n:   acc = fma(w[k..k+8), x[k..k+8), acc)
 *       (the last step, when n % 8 != 0, uses zeros past n in both operands)
 *   y = tree(acc): s4[i] = a[i] + a[i+4], s2[i] = s4[i] + s4[i+2], y = s2[0] + s2[1]
 *
 * where w holds the exact float values of the weights (bitwise those of
 * kvc_dequantize_row_ref). Decode kernels (fused, and in lanes for float
 * weights), register-blocked GEMM tiles and the k-blocked path all perform
 * exactly this sequence per element; kvc_dot_f32 and kvc_dot_f16_f32 follow
 * it too. The structure mirrors kernels_avx512.c, with 4-row tiles for the
 * 16 ymm registers. */
#include "kernels_internal.h"
#include "kernels_simd.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#define MR       4                  /* weight rows per tile and per panel */
#define NT       3                  /* tokens per tile: 12 ymm accumulators */
#define FR       8                  /* rows per fused decode step */
#define KC_MAX   1024               /* floats of a row per k-block */
#define PANEL_LD (KC_MAX + 16)      /* panel row stride; the pad avoids 4 KiB set aliasing */
/* bytes of activations per token block: a panel is converted (and its
 * weights read) once per token block, so wide rows (4864: 105 tokens) are
 * better served by blocks that spill the L2 than by converting more often
 * (1 MiB, 51 tokens, was 11-16% slower on Zen 3) */
#define X_BUDGET (2048u << 10)
#define TB_MAX   192                /* tokens per token block */
#define FUSED_MAX_TOK 4             /* batches smaller than this skip the panel (when they can) */

/* ------------------------------------------------------ horizontal sums */

AI float hsum8(__m256 v)
{
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* The same tree for four vectors: [hsum8(v0), ..., hsum8(v3)]. */
AI __m128 reduce4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    __m256 a01 = _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
    __m256 a23 = _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20), _mm256_permute2f128_ps(v2, v3, 0x31));
    /* 128-bit lane j: [s2 of v[j] (2), s2 of v[j + 2] (2)] */
    __m256 b = _mm256_add_ps(_mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 c = _mm256_add_ps(b, _mm256_shuffle_ps(b, b, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(c, _mm256_setr_epi32(0, 4, 2, 6, 0, 0, 0, 0)));
}

AI void store4(float *y, __m128 s, int nr)
{
    if (nr == 4)
        _mm_storeu_ps(y, s);
    else
        _mm_maskstore_ps(y, _mm_cmpgt_epi32(_mm_set1_epi32(nr), _mm_setr_epi32(0, 1, 2, 3)), s);
}

/* Up to 8 halves, zeros past n. */
AI __m256 f16x8_tail(const kvc_fp16 *x, int64_t n)
{
    kvc_fp16 tmp[8] = { 0 };
    memcpy(tmp, x, (size_t)n * sizeof(kvc_fp16));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp));
}

AI __m256 f16x8(const kvc_fp16 *x) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x)); }
AI __m256 bf16x8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

/* --------------------------------------------------------- dequantization
 * Bitwise equal to kvc_dequantize_row_ref (same float operations). */

static void dq_f16(const kvc_fp16 *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, f16x8(x + i));
    if (i < n)
        _mm256_maskstore_ps(y + i, kvc_first_lanes8(n - i), f16x8_tail(x + i, n - i));
}

static void dq_bf16(const kvc_bf16 *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, bf16x8(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++)
        y[i] = kvc_bf16_to_fp32(x[i]);     /* exact either way */
}

AI __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
AI __m256 i32f(__m256i v) { return _mm256_cvtepi32_ps(v); }

static void dq_q4_0(const block_q4_0 *b, float *y, int64_t nb)
{
    const __m256i c15 = _mm256_set1_epi32(15), c8 = _mm256_set1_epi32(8);
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        for (int g = 0; g < 2; g++) {
            __m256i v = u8x8(b->qs + 8 * g);
            _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(i32f(_mm256_sub_epi32(_mm256_and_si256(v, c15), c8)), d));
            _mm256_storeu_ps(y + 16 + 8 * g, _mm256_mul_ps(i32f(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), c8)), d));
        }
    }
}

static void dq_q4_1(const block_q4_1 *b, float *y, int64_t nb)
{
    const __m256i c15 = _mm256_set1_epi32(15);
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d)), m = _mm256_set1_ps(_cvtsh_ss(b->m));
        for (int g = 0; g < 2; g++) {
            __m256i v = u8x8(b->qs + 8 * g);
            _mm256_storeu_ps(y + 8 * g, _mm256_add_ps(_mm256_mul_ps(i32f(_mm256_and_si256(v, c15)), d), m));
            _mm256_storeu_ps(y + 16 + 8 * g, _mm256_add_ps(_mm256_mul_ps(i32f(_mm256_srli_epi32(v, 4)), d), m));
        }
    }
}

/* 5-bit codes of elements j0 .. j0+7 of a Q5 block (nibbles v, high bits in h). */
AI __m256i q5_or_bit(__m256i v, uint32_t h, int j0)
{
    const __m256i sh = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(j0));
    __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)h), sh), _mm256_set1_epi32(1));
    return _mm256_or_si256(v, _mm256_slli_epi32(bit, 4));
}

static void dq_q5_0(const block_q5_0 *b, float *y, int64_t nb)
{
    const __m256i c15 = _mm256_set1_epi32(15), c16 = _mm256_set1_epi32(16);
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        uint32_t h;
        memcpy(&h, b->qh, 4);
        for (int g = 0; g < 2; g++) {
            __m256i v = u8x8(b->qs + 8 * g);
            __m256i lo = q5_or_bit(_mm256_and_si256(v, c15), h, 8 * g);
            __m256i hi = q5_or_bit(_mm256_srli_epi32(v, 4), h, 16 + 8 * g);
            _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(i32f(_mm256_sub_epi32(lo, c16)), d));
            _mm256_storeu_ps(y + 16 + 8 * g, _mm256_mul_ps(i32f(_mm256_sub_epi32(hi, c16)), d));
        }
    }
}

static void dq_q5_1(const block_q5_1 *b, float *y, int64_t nb)
{
    const __m256i c15 = _mm256_set1_epi32(15);
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d)), m = _mm256_set1_ps(_cvtsh_ss(b->m));
        uint32_t h;
        memcpy(&h, b->qh, 4);
        for (int g = 0; g < 2; g++) {
            __m256i v = u8x8(b->qs + 8 * g);
            __m256i lo = q5_or_bit(_mm256_and_si256(v, c15), h, 8 * g);
            __m256i hi = q5_or_bit(_mm256_srli_epi32(v, 4), h, 16 + 8 * g);
            _mm256_storeu_ps(y + 8 * g, _mm256_add_ps(_mm256_mul_ps(i32f(lo), d), m));
            _mm256_storeu_ps(y + 16 + 8 * g, _mm256_add_ps(_mm256_mul_ps(i32f(hi), d), m));
        }
    }
}

static void dq_q8_0(const block_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        for (int g = 0; g < 4; g++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * g)));
            _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(i32f(q), d));
        }
    }
}

/* Q4_K / Q5_K; qh NULL for Q4_K. */
AI void dq_k4(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, float d, float dmin, float *y)
{
    const __m256i c15 = _mm256_set1_epi32(15), c1 = _mm256_set1_epi32(1);
    float ds[8], dm[8];
    kvc_k4_scales(scales, d, dmin, ds, dm);
    for (int c = 0; c < 4; c++, y += 64) {
        const __m256 d1 = _mm256_set1_ps(ds[2 * c]), m1 = _mm256_set1_ps(dm[2 * c]);
        const __m256 d2 = _mm256_set1_ps(ds[2 * c + 1]), m2 = _mm256_set1_ps(dm[2 * c + 1]);
        for (int g = 0; g < 4; g++) {
            __m256i v = u8x8(qs + 32 * c + 8 * g);
            __m256i lo = _mm256_and_si256(v, c15), hi = _mm256_srli_epi32(v, 4);
            if (qh) {
                __m256i h = u8x8(qh + 8 * g);
                lo = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, _mm256_set1_epi32(2 * c)), c1), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, _mm256_set1_epi32(2 * c + 1)), c1), 4));
            }
            _mm256_storeu_ps(y + 8 * g, _mm256_sub_ps(_mm256_mul_ps(d1, i32f(lo)), m1));
            _mm256_storeu_ps(y + 32 + 8 * g, _mm256_sub_ps(_mm256_mul_ps(d2, i32f(hi)), m2));
        }
    }
}

static void dq_q4_K(const block_q4_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK_K)
        dq_k4(b->scales, b->qs, NULL, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), y);
}

static void dq_q5_K(const block_q5_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK_K)
        dq_k4(b->scales, b->qs, b->qh, _cvtsh_ss(b->d), _cvtsh_ss(b->dmin), y);
}

/* Q6_K: the 6-bit codes of a 128-element half, minus 32, in element order in
 * q, assembled with byte operations 32 at a time (ql[0..31] hold elements
 * 0..31 in their low nibbles and 64..95 in their high ones; ql[32..63] the
 * same for 32..63 and 96..127; qh's bit pairs 0-1, 2-3, 4-5, 6-7 belong to
 * the four quarters). 16-bit shifts are safe: the 0x30 mask drops the bits
 * they carry over from the neighbouring byte. */
AI void q6_codes(const uint8_t *ql, const uint8_t *qh, int8_t q[128])
{
    const __m256i c0f = _mm256_set1_epi8(0x0f), c30 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, c0f), _mm256_and_si256(_mm256_slli_epi16(h, 4), c30));
    __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, c0f), _mm256_and_si256(_mm256_slli_epi16(h, 2), c30));
    __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), c0f), _mm256_and_si256(h, c30));
    __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), c0f),
                                 _mm256_and_si256(_mm256_srli_epi16(h, 2), c30));
    _mm256_storeu_si256((__m256i *)q, _mm256_sub_epi8(q0, c32));
    _mm256_storeu_si256((__m256i *)(q + 32), _mm256_sub_epi8(q1, c32));
    _mm256_storeu_si256((__m256i *)(q + 64), _mm256_sub_epi8(q2, c32));
    _mm256_storeu_si256((__m256i *)(q + 96), _mm256_sub_epi8(q3, c32));
}

/* d * (float)sc for the 16 scales of a Q6_K block: the reference's first product. */
AI void q6_scales(const block_q6_K *b, float ds[16])
{
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
    for (int g = 0; g < 2; g++)
        _mm256_storeu_ps(ds + 8 * g, _mm256_mul_ps(d, i32f(_mm256_cvtepi8_epi32(
                                                          _mm_loadl_epi64((const __m128i *)(b->scales + 8 * g))))));
}

/* 8 weights of Q6_K: (d * sc) * (q - 32), as the reference. */
AI __m256 q6_w8(const int8_t *q, float ds)
{
    return _mm256_mul_ps(_mm256_set1_ps(ds), i32f(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))));
}

static void dq_q6_K(const block_q6_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++) {
        float ds[16];
        q6_scales(b, ds);
        for (int h = 0; h < 2; h++, y += 128) {
            int8_t q[128];
            q6_codes(b->ql + 64 * h, b->qh + 32 * h, q);
            for (int g = 0; g < 16; g++)
                _mm256_storeu_ps(y + 8 * g, q6_w8(q + 8 * g, ds[8 * h + g / 2]));
        }
    }
}

/* MXFP4: the 16 codes of a half-block looked up in one byte shuffle. */
static void dq_mxfp4(const block_mxfp4 *b, float *y, int64_t nb)
{
    const __m128i lut = _mm_loadu_si128((const __m128i *)kvc_mxfp4_values), c15 = _mm_set1_epi8(15);
    for (int64_t i = 0; i < nb; i++, b++, y += QK_MXFP4) {
        const __m256 d = _mm256_set1_ps(kvc_e8m0_half(b->e));
        const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
        const __m128i v[2] = { _mm_shuffle_epi8(lut, _mm_and_si128(q, c15)),
                               _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), c15)) };
        for (int h = 0; h < 2; h++) {
            _mm256_storeu_ps(y + 16 * h, _mm256_mul_ps(i32f(_mm256_cvtepi8_epi32(v[h])), d));
            _mm256_storeu_ps(y + 16 * h + 8,
                             _mm256_mul_ps(i32f(_mm256_cvtepi8_epi32(_mm_srli_si128(v[h], 8))), d));
        }
    }
}

static void avx2_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
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
 * As in kernels_avx512.c: MR rows x k-block dequantized once into an aligned
 * panel, MR x T register tiles, accumulators parked between k-blocks. */

AI void tile_fma(const int T, const float *pw, const float *x, int64_t ldx, int64_t n,
                 __m256 acc[MR][NT])
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256 xv[NT];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            __m256 wv = _mm256_load_ps(pw + r * PANEL_LD + k);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    if (k < n) {
        const __m256i m = kvc_first_lanes8(n - k);
        __m256 xv[NT];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_maskload_ps(x + t * ldx + k, m);
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) {
            __m256 wv = _mm256_maskload_ps(pw + r * PANEL_LD + k, m);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
}

AI void panel_tile(const int T, const float *panel, const float *x, int64_t ldx, int64_t kn,
                   float *accbuf, bool first, bool last, float *y, int64_t ldy, int nr)
{
    __m256 acc[MR][NT];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = first ? _mm256_setzero_ps() : _mm256_load_ps(accbuf + (t * MR + r) * 8);
    tile_fma(T, panel, x, ldx, kn, acc);
    if (!last) {
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                _mm256_store_ps(accbuf + (t * MR + r) * 8, acc[r][t]);
        return;
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        store4(y + t * ldy, reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]), nr);
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

static int64_t k_block(uint32_t type, int64_t n_in)
{
    const int64_t unit = KVC_MAX(8, kvc_type_info(type)->block_size);
    const int64_t nkb = (n_in + KC_MAX - 1) / KC_MAX;
    const int64_t per = (n_in + nkb - 1) / nkb;
    return (per + unit - 1) / unit * unit;
}

static int64_t tok_block(int64_t n_in)
{
    int64_t tb = (int64_t)X_BUDGET / (n_in * (int64_t)sizeof(float));
    tb = KVC_MAX(NT, KVC_MIN(TB_MAX, tb));
    return tb / NT * NT;
}

static size_t avx2_scratch_floats(int64_t n_in)
{
    size_t acc = n_in > KC_MAX ? (size_t)tok_block(n_in) * MR * 8 : 0;
    return (size_t)MR * PANEL_LD + acc + 16;
}

static void fill_panel(const kvc_weight *w, int64_t rg, int nr, int64_t kb, int64_t kn, float *panel)
{
    const kvc_type_traits *tt = kvc_type_info(w->type);
    const size_t off = (size_t)(kb / tt->block_size) * tt->type_size;
    const uint8_t *base = (const uint8_t *)w->data + (size_t)rg * w->row_bytes + off;
    for (int r = 0; r < nr; r++)
        avx2_dequantize_row(w->type, base + (size_t)r * w->row_bytes, panel + r * PANEL_LD, kn);
    for (int r = nr; r < MR; r++)
        memset(panel + r * PANEL_LD, 0, (size_t)kn * sizeof(float));
}

/* The weight bytes of the panel after (rg, kb) (in matmul_panel's order,
 * within one token block), fetched a slice per tile while this panel's tiles
 * run, so that fill_panel finds them in cache: without it, converting the
 * panel waits on memory. */
typedef struct next_panel {
    const uint8_t *base;    /* its first row's bytes */
    size_t         row_bytes, bytes;    /* the row stride; bytes to fetch per row */
    int            nr;      /* its rows */
    size_t         slice, done;   /* bytes a tile (per row), fetched so far (per row) */
} next_panel;

static next_panel plan_next(const kvc_weight *w, int64_t rg, int64_t r1, int64_t kb, int64_t kc, int64_t n_tiles)
{
    next_panel np = { 0 };
    const kvc_type_traits *tt = kvc_type_info(w->type);
    if (kb + kc >= w->n_in) {   /* the next row group, from k = 0 */
        rg += MR;
        kb = 0;
    } else {
        kb += kc;
    }
    if (rg >= r1)
        return np;
    const int64_t kn = KVC_MIN(kc, w->n_in - kb);
    np.base = (const uint8_t *)w->data + (size_t)rg * w->row_bytes + (size_t)(kb / tt->block_size) * tt->type_size;
    np.row_bytes = w->row_bytes;
    np.bytes = (size_t)(kn / tt->block_size) * tt->type_size;
    np.nr = (int)KVC_MIN(MR, r1 - rg);
    np.slice = (np.bytes / (size_t)n_tiles + 63) & ~(size_t)63;
    return np;
}

AI void fetch_next(next_panel *np)
{
    if (np->done >= np->bytes)
        return;
    for (int r = 0; r < np->nr; r++)
        for (size_t i = 0; i < np->slice; i += 64)
            _mm_prefetch((const char *)np->base + (size_t)r * np->row_bytes + np->done + i, _MM_HINT_T0);
    np->done += np->slice;
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
                next_panel np = plan_next(w, rg, r1, kb, kc, (nt + NT - 1) / NT);
                for (int64_t t = 0; t < nt;) {
                    const int64_t T = KVC_MIN(NT, nt - t);
                    fetch_next(&np);
                    const float *xt = x + (t0 + t) * ldx + kb;
                    float *yt = y + (t0 + t) * ldy + rg, *ab = accbuf + t * MR * 8;
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
 * Few tokens of quantized weights: stream FR weight rows once per token,
 * converting in registers. (Float weights: the next section.)
 * Prefetching as in kernels_avx512.c: the next group of contiguous rows at the
 * pace of this one when rows are short, PF_AHEAD bytes ahead in each row
 * otherwise. */

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

AI void prefetch_ahead(const uint8_t *const rows[FR], size_t off)
{
#pragma GCC unroll 8
    for (int r = 0; r < FR; r++)
        _mm_prefetch((const char *)rows[r] + off, _MM_HINT_T0);
}

/* Q8_0: the weight vector is (float)q * d, exactly the reference's value. */
static void fused_q8_0(const uint8_t *const rows[FR], prefetch_plan pf, const float *x, int64_t n, __m256 acc[FR])
{
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        if (pf.next)
            prefetch_next(&pf, FR * (int)sizeof(block_q8_0));
        if (pf.ahead)
            prefetch_ahead(rows, (size_t)ib * sizeof(block_q8_0) + (size_t)pf.ahead);
#pragma GCC unroll 8
        for (int r = 0; r < FR; r++) {
            const block_q8_0 *b = (const block_q8_0 *)(const void *)rows[r] + ib;
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
            for (int g = 0; g < 4; g++) {
                __m256 wv = _mm256_mul_ps(i32f(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * g)))), d);
                acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + ib * QK8_0 + 8 * g), acc[r]);
            }
        }
    }
}

/* K-quants and Q4_0: per block and row, the scales as the dequantizers make
 * them, then each 8 weights built in registers and used at once. A weight
 * d1 * q - m1 comes from one fmsub: d1 * q is exact (see quant.c), so it
 * rounds once, exactly as the reference's multiply-then-subtract. */
AI void prefetch_block(prefetch_plan *pf, const uint8_t *const rows[FR], int64_t ib, int bytes)
{
    if (pf->next)
        prefetch_next(pf, FR * bytes);
    if (pf->ahead)
        for (int i = 0; i < bytes; i += 64)
            prefetch_ahead(rows, (size_t)(ib * bytes + i + pf->ahead));
}

static void fused_q4_0(const uint8_t *const rows[FR], prefetch_plan pf, const float *x, int64_t n, __m256 acc[FR])
{
    const __m256i c15 = _mm256_set1_epi32(15), c8 = _mm256_set1_epi32(8);
    for (int64_t ib = 0; ib < n / QK4_0; ib++) {
        const float *xb = x + ib * QK4_0;
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q4_0));
#pragma GCC unroll 8
        for (int r = 0; r < FR; r++) {
            const block_q4_0 *b = (const block_q4_0 *)(const void *)rows[r] + ib;
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
            const __m256i v0 = u8x8(b->qs), v1 = u8x8(b->qs + 8);
            const __m256i q[4] = { _mm256_and_si256(v0, c15), _mm256_and_si256(v1, c15),
                                   _mm256_srli_epi32(v0, 4), _mm256_srli_epi32(v1, 4) };
            for (int g = 0; g < 4; g++)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(i32f(_mm256_sub_epi32(q[g], c8)), d),
                                         _mm256_loadu_ps(xb + 8 * g), acc[r]);
        }
    }
}

static void fused_q4_K(const uint8_t *const rows[FR], prefetch_plan pf, const float *x, int64_t n, __m256 acc[FR])
{
    const __m256i c15 = _mm256_set1_epi32(15);
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q4_K));
        const block_q4_K *b[FR];
        float ds[FR][8], dm[FR][8];
        for (int r = 0; r < FR; r++) {
            b[r] = (const block_q4_K *)(const void *)rows[r] + ib;
            kvc_k4_scales(b[r]->scales, _cvtsh_ss(b[r]->d), _cvtsh_ss(b[r]->dmin), ds[r], dm[r]);
        }
        /* sub-block j = 2c + hi: elements 32j .. 32j + 31, in k order; rows
         * innermost, so FR independent chains are in flight */
        for (int j = 0; j < 8; j++) {
            const int c = j / 2, hi = j % 2;
            for (int g = 0; g < 4; g++) {
                const __m256 xv = _mm256_loadu_ps(xb + 32 * j + 8 * g);
#pragma GCC unroll 8
                for (int r = 0; r < FR; r++) {
                    const __m256i v = u8x8(b[r]->qs + 32 * c + 8 * g);
                    const __m256i q = hi ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, c15);
                    const __m256 w = _mm256_fmsub_ps(_mm256_set1_ps(ds[r][j]), i32f(q), _mm256_set1_ps(dm[r][j]));
                    acc[r] = _mm256_fmadd_ps(w, xv, acc[r]);
                }
            }
        }
    }
}

static void fused_q6_K(const uint8_t *const rows[FR], prefetch_plan pf, const float *x, int64_t n, __m256 acc[FR])
{
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float *xb = x + ib * QK_K;
        prefetch_block(&pf, rows, ib, (int)sizeof(block_q6_K));
        const block_q6_K *b[FR];
        float ds[FR][16];
        for (int r = 0; r < FR; r++) {
            b[r] = (const block_q6_K *)(const void *)rows[r] + ib;
            q6_scales(b[r], ds[r]);
        }
        for (int h = 0; h < 2; h++) {
            int8_t q[FR][128];
            for (int r = 0; r < FR; r++)
                q6_codes(b[r]->ql + 64 * h, b[r]->qh + 32 * h, q[r]);
            for (int g = 0; g < 16; g++) {           /* rows innermost: FR chains in flight */
                const __m256 xv = _mm256_loadu_ps(xb + 128 * h + 8 * g);
#pragma GCC unroll 8
                for (int r = 0; r < FR; r++)
                    acc[r] = _mm256_fmadd_ps(q6_w8(q[r] + 8 * g, ds[r][8 * h + g / 2]), xv, acc[r]);
            }
        }
    }
}

typedef void (*fused_fn)(const uint8_t *const rows[FR], prefetch_plan pf, const float *x, int64_t n,
                         __m256 acc[FR]);

static fused_fn fused_for(uint32_t type)
{
    switch (type) {
    case KVC_TYPE_Q8_0: return fused_q8_0;
    case KVC_TYPE_Q4_0: return fused_q4_0;
    case KVC_TYPE_Q4_K: return fused_q4_K;
    case KVC_TYPE_Q6_K: return fused_q6_K;
    default:            return NULL;
    }
}

static void matmul_fused(fused_fn fn, const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1)
{
    const uint8_t *base = w->data;
    for (int64_t rg = r0; rg < r1; rg += FR) {
        const int nr = (int)KVC_MIN(FR, r1 - rg);
        const uint8_t *rows[FR];
        for (int r = 0; r < FR; r++)      /* missing rows repeat the last one; not stored */
            rows[r] = base + (size_t)(rg + KVC_MIN(r, nr - 1)) * w->row_bytes;
        prefetch_plan pf = { NULL, 0 };   /* for the first token, which brings the rows in */
        if (FR * w->row_bytes > PF_GROUP_MAX)
            pf.ahead = PF_AHEAD;
        else if (rg + FR < r1)
            pf.next = base + (size_t)(rg + FR) * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t++) {
            __m256 acc[FR];
            for (int r = 0; r < FR; r++)
                acc[r] = _mm256_setzero_ps();
            fn(rows, pf, x + t * ldx, w->n_in, acc);
            float *yt = y + t * ldy + rg;
            store4(yt, reduce4(acc[0], acc[1], acc[2], acc[3]), KVC_MIN(nr, 4));
            if (nr > 4)
                store4(yt + 4, reduce4(acc[4], acc[5], acc[6], acc[7]), nr - 4);
            pf = (prefetch_plan){ NULL, 0 };
        }
    }
}

/* ------------------------------------------ decode of float weights
 * Few tokens of F32, F16 or BF16 weights: KVC_LANES rows per pass, in the
 * lane order of kernels_internal.h, converted in registers. Same per-element
 * sequence as the panel path. */

enum { W_F32, W_F16, W_BF16 };

AI __m256 load_w(const int kind, const uint8_t *row, int64_t k)
{
    if (kind == W_F32)
        return _mm256_loadu_ps((const float *)(const void *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)(const void *)row + k));
    return kind == W_F16 ? _mm256_cvtph_ps(h) : bf16x8(h);
}

AI __m256 load_w_tail(const int kind, const uint8_t *row, int64_t k, int64_t left)
{
    if (kind == W_F32)
        return _mm256_maskload_ps((const float *)(const void *)row + k, kvc_first_lanes8(left));
    uint16_t tmp[8] = { 0 };
    memcpy(tmp, (const uint16_t *)(const void *)row + k, (size_t)left * 2);
    __m128i h = _mm_loadu_si128((const __m128i *)tmp);
    return kind == W_F16 ? _mm256_cvtph_ps(h) : bf16x8(h);
}

/* The dot products of x with one row per lane (kernels_internal.h) into
 * dot[KVC_LANES], with no software prefetch, as in kernels_avx512.c. */
_Static_assert(KVC_LANES == 4, "lanes_float reduces its accumulators with reduce4");

AI void lanes_float(const int kind, const uint8_t *const rows[KVC_LANES], const float *x, int64_t n,
                    float dot[KVC_LANES])
{
    __m256 acc[KVC_LANES];
    for (int j = 0; j < KVC_LANES; j++)
        acc[j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
#pragma GCC unroll 4
        for (int j = 0; j < KVC_LANES; j++)
            acc[j] = _mm256_fmadd_ps(load_w(kind, rows[j], k), xv, acc[j]);
    }
    if (k < n) {
        const __m256 xv = _mm256_maskload_ps(x + k, kvc_first_lanes8(n - k));
#pragma GCC unroll 4
        for (int j = 0; j < KVC_LANES; j++)
            acc[j] = _mm256_fmadd_ps(load_w_tail(kind, rows[j], k, n - k), xv, acc[j]);
    }
    _mm_storeu_ps(dot, reduce4(acc[0], acc[1], acc[2], acc[3]));
}

KVC_FLOAT_LANES(lanes_float)

static void avx2_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
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

static float avx2_dot_f32(const float *a, const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    if (k < n) {
        const __m256i m = kvc_first_lanes8(n - k);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + k, m), _mm256_maskload_ps(b + k, m), acc);
    }
    return hsum8(acc);
}

static float avx2_dot_f16_f32(const kvc_fp16 *a, const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        acc = _mm256_fmadd_ps(f16x8(a + k), _mm256_loadu_ps(b + k), acc);
    if (k < n)
        acc = _mm256_fmadd_ps(f16x8_tail(a + k, n - k), _mm256_maskload_ps(b + k, kvc_first_lanes8(n - k)), acc);
    return hsum8(acc);
}

/* y[i] = fma(a, x[i], y[i]): one rounding per element, tail included. */
static void avx2_axpy_f32(float a, const float *x, float *y, int64_t n)
{
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        const __m256i m = kvc_first_lanes8(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
    }
}

/* kernels.h's GDN row, 8 lanes (masked tail). */
static float avx2_gdn_row(float *s, const float *k, const float *q, float decay, float v, float beta,
                          int64_t n)
{
    const __m256 dv = _mm256_set1_ps(decay);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(s + i), dv);
        _mm256_storeu_ps(s + i, r);
        acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i), acc);
    }
    const __m256i m = kvc_first_lanes8(n - i);
    if (i < n) {
        const __m256 r = _mm256_mul_ps(_mm256_maskload_ps(s + i, m), dv);
        _mm256_maskstore_ps(s + i, m, r);
        acc = _mm256_fmadd_ps(r, _mm256_maskload_ps(k + i, m), acc);
    }
    const __m256 d = _mm256_set1_ps((v - hsum8(acc)) * beta);
    acc = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_fmadd_ps(d, _mm256_loadu_ps(k + i), _mm256_loadu_ps(s + i));
        _mm256_storeu_ps(s + i, r);
        acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + i), acc);
    }
    if (i < n) {
        const __m256 r = _mm256_fmadd_ps(d, _mm256_maskload_ps(k + i, m), _mm256_maskload_ps(s + i, m));
        _mm256_maskstore_ps(s + i, m, r);
        acc = _mm256_fmadd_ps(r, _mm256_maskload_ps(q + i, m), acc);
    }
    return hsum8(acc);
}

static void avx2_axpy_f16(float a, const kvc_fp16 *x, float *y, int64_t n)
{
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, f16x8(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        const __m256i m = kvc_first_lanes8(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(av, f16x8_tail(x + i, n - i), _mm256_maskload_ps(y + i, m)));
    }
}

static void avx2_fp32_to_fp16_row(const float *x, kvc_fp16 *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        kvc_fp16 tmp[8];
        __m256 v = _mm256_maskload_ps(x + i, kvc_first_lanes8(n - i));
        _mm_storeu_si128((__m128i *)tmp, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        memcpy(y + i, tmp, (size_t)(n - i) * sizeof(kvc_fp16));
    }
}

static void avx2_fp16_to_fp32_row(const kvc_fp16 *x, float *y, int64_t n) { dq_f16(x, y, n); }

/* kernels.h's SwiGLU, 8 elements at a time. */
static inline __m256 swiglu8(__m256 g, __m256 u)
{
    const __m256 nabs = _mm256_or_ps(g, _mm256_set1_ps(-0.0f));           /* -|g| */
    const __m256 e = _mm256_and_ps(_mm256_cmp_ps(nabs, _mm256_set1_ps(-80.0f), _CMP_GE_OQ), kvc_exp_neg8(nabs));
    const __m256 pos = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ);  /* g >= 0 */
    const __m256 num = _mm256_blendv_ps(_mm256_mul_ps(g, e), g, pos);
    return _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void avx2_swiglu(float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, swiglu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        const __m256i m = kvc_first_lanes8(n - i);
        _mm256_maskstore_ps(g + i, m, swiglu8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m)));
    }
}

const kvc_kernel_ops kvc_kernels_avx2 = {
    .matmul_rows           = avx2_matmul_rows,
    .matmul_scratch_floats = avx2_scratch_floats,
    .dequantize_row        = avx2_dequantize_row,
    .dot_f32               = avx2_dot_f32,
    .dot_f16_f32           = avx2_dot_f16_f32,
    .axpy_f32              = avx2_axpy_f32,
    .gdn_row               = avx2_gdn_row,
    .axpy_f16              = avx2_axpy_f16,
    .fp32_to_fp16_row      = avx2_fp32_to_fp16_row,
    .fp16_to_fp32_row      = avx2_fp16_to_fp32_row,
    .swiglu                = avx2_swiglu,
};
