/* kernels_avx2_int8.c - the integer scheme of kernels_int8.h with AVX2: the
 * activation quantization, the matmul for few tokens (decode), which streams
 * the weights, and the matmul for many (prefill), which repacks 16 weight
 * rows (two vectors of 8) so that each lane holds one row.
 *
 * Built with -mavx2 -mfma -mf16c; called only after kernels.c found those
 * features at run time.
 *
 * WHY ON AVX2. The float scheme converts every weight to float in registers:
 * a conversion, a multiply by the block's scale and an FMA for 8 weights. On
 * Zen 3 that made decode compute-bound (q8_0: 10 GB/s of weights a thread
 * from L3, q4_K 4.6, against 31 for f32). Here a weight is sign-extended to
 * int16 once and VPMADDWD forms 16 products an instruction against the
 * activations' int16 values a_i, exact in int32 (|q| <= 128, |a| <= 32639,
 * 32 products fit); the float step of the scheme follows per block. Integer
 * sums are exact in any order and the float step is the scheme's, so both
 * kernels give the bits of kvc_i8_matmul_ref, and those of the vnni ISA.
 *
 * DECODE keeps 8 rows of a group in flight: per block and row, two VPMADDWD
 * (elements 0-15 and 16-31) and an add leave 8 partial sums of that row, and
 * a tree of unpacks and adds (reduce8) puts the 8 rows' block sums D into
 * one vector, row r in lane r. The weights are widened to int16 as codes,
 * so those of Q4_0, Q5_0 and Q6_K keep their offset, which comes off D as
 * offset * S (Q6_K: per half, H; block_w16). PREFILL repacks the weights once a call so
 * that dword k of lane l of a vector holds the int16 pair q_2k, q_2k+1 of row
 * l: VPMADDWD against the token's pair k, broadcast, then gives every row's
 * products in its own lane, with no reduction. */
#include "kernels_int8.h"
#include "kernels_simd.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#define GR     8        /* weight rows per row vector: one lane each */
#define TC     3        /* decode: tokens a pass over a group */

/* ------------------------------------------------------------ activations */

AI __m256 clamp127(__m256 v)
{
    /* MAXPS returns its second operand when the first is NaN: NaN -> -127 */
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}

AI __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

AI int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* 16 int32 (two vectors, in order) -> 16 int16 in order; values fit. */
AI __m256i pack16(__m256i a, __m256i b)
{
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));
}

static void quantize_row(const float *x, int64_t n_in, uint8_t *dst)
{
    const int64_t nb = n_in / 32;
    int8_t *hi = (int8_t *)dst, *lo = (int8_t *)dst + n_in;
    float *dd = (float *)(void *)(dst + 2 * n_in);
    int32_t *ss = (int32_t *)(void *)(dst + 2 * n_in + 4 * nb), *hs = ss + nb;
    int16_t *aa = (int16_t *)(void *)(hs + 2 * nb);
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        /* (the loops over v unrolled, so that v stays in registers: GCC
         * would otherwise copy it to the stack in halves and read it back
         * whole, which the store forwarding cannot serve) */
        __m256 v[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
        /* max(|v|, 0) turns NaN into 0, as fmaxf in the reference */
        __m256 m = _mm256_max_ps(_mm256_max_ps(abs8(v[0]), zero), _mm256_max_ps(abs8(v[1]), zero));
        m = _mm256_max_ps(m, _mm256_max_ps(_mm256_max_ps(abs8(v[2]), zero), _mm256_max_ps(abs8(v[3]), zero)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if (!(amax >= KVC_I8_AMIN)) {
            memset(hi + 32 * b, 0, 32);
            memset(lo + 32 * b, 0, 32);
            memset(aa + 32 * b, 0, 64);
            dd[b] = 0.0f;
            ss[b] = hs[2 * b] = hs[2 * b + 1] = 0;
            continue;
        }
        const float dh = amax / 127.0f, id = 127.0f / amax;
        const __m256 vdh = _mm256_set1_ps(dh), vid = _mm256_set1_ps(id), vid2 = _mm256_set1_ps(id * 256.0f);
        __m256i h[4], l[4], a[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            h[i] = _mm256_cvtps_epi32(clamp127(_mm256_mul_ps(v[i], vid)));
            const __m256 r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(h[i]), vdh, v[i]);
            l[i] = _mm256_cvtps_epi32(clamp127(_mm256_mul_ps(r, vid2)));
            a[i] = _mm256_add_epi32(_mm256_slli_epi32(h[i], 8), l[i]);
        }
        const __m256i bytes_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_storeu_si256((__m256i *)(hi + 32 * b),
                            _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(h[0], h[1]),
                                                                           _mm256_packs_epi32(h[2], h[3])),
                                                        bytes_order));
        _mm256_storeu_si256((__m256i *)(lo + 32 * b),
                            _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(l[0], l[1]),
                                                                           _mm256_packs_epi32(l[2], l[3])),
                                                        bytes_order));
        _mm256_storeu_si256((__m256i *)(aa + 32 * b), pack16(a[0], a[1]));
        _mm256_storeu_si256((__m256i *)(aa + 32 * b + 16), pack16(a[2], a[3]));
        hs[2 * b] = hsum_i32(_mm256_add_epi32(a[0], a[1]));
        hs[2 * b + 1] = hsum_i32(_mm256_add_epi32(a[2], a[3]));
        ss[b] = hs[2 * b] + hs[2 * b + 1];
        dd[b] = dh / 256.0f;
    }
    const size_t used = kvc_i8_act_used_bytes(n_in);
    memset(dst + used, 0, kvc_i8_act_row_bytes(n_in) - used);
}

void kvc_avx2_i8_quantize_rows(const float *x, int64_t ldx, int64_t n_in, int64_t t0, int64_t t1, uint8_t *act)
{
    const size_t as = kvc_i8_act_row_bytes(n_in);
    for (int64_t t = t0; t < t1; t++)
        quantize_row(x + t * ldx, n_in, act + (size_t)t * as);
}

/* ------------------------------------------------------- weight blocks */

/* p[k] lane l = dword k of r[l]: an 8 x 8 dword transpose. */
AI void transpose_8x8(const __m256i r[GR], __m256i *p)
{
    __m256i t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {     /* u[4i + k]: dword k (low half) and k + 4 (high) of rows 4i .. 4i + 3 */
        u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        _mm256_store_si256(p + k, _mm256_permute2x128_si256(u[k], u[k + 4], 0x20));
        _mm256_store_si256(p + k + 4, _mm256_permute2x128_si256(u[k], u[k + 4], 0x31));
    }
}

/* The scales of blocks 8s .. 8s + 7 (super-block s) of up to 8 rows:
 * ds[j][r], dm[j][r] (Q4_K, Q5_K: d * sc_j and dmin * m_j; Q6_K: d * sc of
 * the block's first and second half), as the reference computes them; rows
 * past n are zero. ds, dm: 32-byte aligned. */
AI void k_scales(const int kind, const uint8_t *const rows[GR], int n, int64_t s, float ds[8][GR], float dm[8][GR])
{
    __m256i a[GR], m[GR];
#pragma GCC unroll 8
    for (int r = 0; r < GR; r++) {
        a[r] = m[r] = _mm256_setzero_si256();
        if (r >= n)
            continue;
        if (kind == I8_Q4_K || kind == I8_Q5_K) {   /* d, dmin and the scales where both have them */
            _Static_assert(offsetof(block_q4_K, scales) == offsetof(block_q5_K, scales), "Q4_K / Q5_K heads");
            const block_q4_K *k = (const block_q4_K *)(const void *)(
                rows[r] + (size_t)s * (kind == I8_Q4_K ? sizeof(block_q4_K) : sizeof(block_q5_K)));
            _Alignas(32) float fa[8], fm[8];
            kvc_k4_scales(k->scales, _cvtsh_ss(k->d), _cvtsh_ss(k->dmin), fa, fm);
            a[r] = _mm256_castps_si256(_mm256_load_ps(fa));
            m[r] = _mm256_castps_si256(_mm256_load_ps(fm));
        } else {                   /* Q6_K: the 16 int8 scales, even ones first */
            const block_q6_K *k = (const block_q6_K *)(const void *)rows[r] + s;
            const __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)k->scales),
                                                _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(k->d));
            a[r] = _mm256_castps_si256(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
            m[r] = _mm256_castps_si256(
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc)))));
        }
    }
    transpose_8x8(a, (__m256i *)(void *)ds);
    transpose_8x8(m, (__m256i *)(void *)dm);
}

/* The F16 scale d of block b of up to 8 rows (the blocks of Q8_0, Q4_0,
 * Q5_0, Q4_1 and Q5_1 start with it; MXFP4's, 2^(e - 128), comes from its
 * first byte e), row r in lane r, and for Q4_1 and
 * Q5_1 their min as the scheme has it, -m (the F16 after d), in *neg_m
 * (rows past n repeat the last one, whose scales then fill their lanes,
 * unused). The dwords come by 8 scalar loads through the stack, which cost
 * the vector ports nothing (a VPGATHERDD is microcoded on AMD's cores). */
AI __m256 block_scales(const int kind, const uint8_t *const rows[GR], int64_t b, __m256 *neg_m)
{
    const size_t off = (size_t)b * kvc_i8_block_bytes(kind);
    _Alignas(32) uint32_t v[GR];
#pragma GCC unroll 8
    for (int r = 0; r < GR; r++)
        memcpy(&v[r], rows[r] + off, 4);
    const __m256i g = _mm256_load_si256((const __m256i *)(const void *)v);
    if (kind == I8_MXFP4)
        return kvc_i8_e8m0_half8(g);
    /* the low halves of the dwords (d) in the low 8 bytes of each lane, the high ones (m) in the others */
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, split), _MM_SHUFFLE(3, 1, 2, 0));
    if (kind == I8_Q4_1 || kind == I8_Q5_1)
        *neg_m = _mm256_xor_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), _mm256_set1_ps(-0.0f));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(h));
}

/* ------------------------------------------------------------------ decode */

/* Sum the 8 lanes of each z[r]: result lane r. */
AI __m256i reduce8(const __m256i z[GR])
{
    __m256i c[4], e[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)          /* c[i]: per 128-bit half [z2i (2), z2i+1 (2)], interleaved */
        c[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(z[2 * i], z[2 * i + 1]),
                                _mm256_unpackhi_epi32(z[2 * i], z[2 * i + 1]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)          /* e[i]: per half, the half-sums of z4i .. z4i+3 */
        e[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(c[2 * i], c[2 * i + 1]),
                                _mm256_unpackhi_epi64(c[2 * i], c[2 * i + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(e[0], e[1], 0x20),
                            _mm256_permute2x128_si256(e[0], e[1], 0x31));
}

/* What decode takes off each block dot product, in units of the token's
 * block sum S (Q6_K: of each half, H): the codes it multiplies are q +
 * code_offset (Q4_0, Q5_0, Q6_K). */
AI int code_offset(const int kind) { return kind == I8_Q4_0 ? 8 : kind == I8_Q5_0 ? 16 : kind == I8_Q6_K ? 32 : 0; }

/* The 32 weights of block b of a row as int16, elements 0-15 in *w0 and
 * 16-31 in *w1: q + code_offset(kind). Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and
 * Q4_K are widened straight from the stored bytes (VPMOVSXBW / VPMOVZXBW
 * from memory): decode makes them for every row of every block, and through
 * kvc_i8_block_q's byte form they took twice the instructions. Q5_K and
 * Q6_K (its codes, kvc_i8_k6_codes) are made as bytes first: widened from
 * the bytes, their extra bits made them no faster (Q5_K) or 15% slower
 * (Q6_K). MXFP4's signed values come from a byte shuffle of its codes
 * (offset 0), then widen. */
AI void block_w16(const int kind, const uint8_t *row, int64_t b, __m256i *w0, __m256i *w1)
{
    const __m256i nib = _mm256_set1_epi16(0x0f);
    if (kind == I8_Q8_0) {
        const uint8_t *qs = row + (size_t)b * sizeof(block_q8_0) + offsetof(block_q8_0, qs);
        *w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs));
        *w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
    } else if (kind == I8_MXFP4) {    /* q looked up from the codes, low nibbles then high */
        const __m128i c = _mm_loadu_si128((const __m128i *)(row + (size_t)b * sizeof(block_mxfp4) +
                                                             offsetof(block_mxfp4, qs)));
        const __m128i lut = _mm256_castsi256_si128(kvc_i8_mxfp4_lut()), m4 = _mm_set1_epi8(0x0f);
        *w0 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, _mm_and_si128(c, m4)));
        *w1 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(c, 4), m4)));
    } else if (kind == I8_Q5_K || kind == I8_Q6_K) {
        const __m256i q = kind == I8_Q6_K ? kvc_i8_k6_codes(row, b) : kvc_i8_block_q(kind, row, b);
        *w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
        *w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
    } else if (kind == I8_Q4_K) {   /* element l: one nibble of byte l of the 32 */
        const uint8_t *c = kvc_i8_k4_codes(kind, row, b);
        const __m256i c0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)c));
        const __m256i c1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(c + 16)));
        *w0 = b & 1 ? _mm256_srli_epi16(c0, 4) : _mm256_and_si256(c0, nib);
        *w1 = b & 1 ? _mm256_srli_epi16(c1, 4) : _mm256_and_si256(c1, nib);
    } else {   /* Q4_0, Q4_1, Q5_0, Q5_1: element i the low nibble of byte i, element 16 + i its high one */
        const uint8_t *k = row + (size_t)b * kvc_i8_block_bytes(kind);
        const size_t at = kvc_i8_nibbles_at(kind);
        const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(k + at)));
        *w0 = _mm256_and_si256(c, nib);
        *w1 = _mm256_srli_epi16(c, 4);
        if (kind == I8_Q5_0 || kind == I8_Q5_1) {       /* bit j of qh (the 4 bytes before): 16 */
            int16_t h[2];
            memcpy(h, k + at - 4, 4);
            const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                                  16384, (short)0x8000);
            const __m256i five = _mm256_set1_epi16(0x10);
            const __m256i h0 = _mm256_and_si256(_mm256_set1_epi16(h[0]), bit);
            const __m256i h1 = _mm256_and_si256(_mm256_set1_epi16(h[1]), bit);
            *w0 = _mm256_or_si256(*w0, _mm256_and_si256(_mm256_cmpeq_epi16(h0, bit), five));
            *w1 = _mm256_or_si256(*w1, _mm256_and_si256(_mm256_cmpeq_epi16(h1, bit), five));
        }
    }
}

/* Decode streams the weights from memory: while a group of 8 rows is
 * consumed, the next group (if this call has one) is prefetched into L2 at
 * the same pace. */
typedef struct {
    const uint8_t *next;          /* next group's first byte, or NULL */
} prefetch_plan;

/* One group of n <= 8 rows (rows[r]: row r's bytes; missing rows repeat the
 * last) against T <= TC tokens; out[t] lane r accumulates y[t][row r]. */
AI void decode_group(const int kind, const int T, const uint8_t *const rows[GR], int n, prefetch_plan pf,
                     const uint8_t *const *ar, int64_t n_in, __m256 out[TC])
{
    __m256 acc[TC];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = out[t];
    const int64_t nb = n_in / 32;
    const size_t bsz = kvc_i8_block_bytes(kind);
    const int16_t *a[TC];
    const float *dx[TC];
    const int32_t *sx[TC], *hx[TC];
    for (int t = 0; t < T; t++) {
        a[t] = kvc_i8_a(ar[t], n_in);
        dx[t] = kvc_i8_d(ar[t], n_in);
        sx[t] = kvc_i8_s(ar[t], n_in);
        hx[t] = kvc_i8_h(ar[t], n_in);
    }
    _Alignas(32) float ks[8][GR], km[8][GR];          /* K-quants: the current super-block's scales */
    for (int64_t b = 0; b < nb; b++) {
        if (kvc_i8_k_quant(kind) && b % 8 == 0)
            k_scales(kind, rows, n, b / 8, ks, km);
        if (pf.next) {
            for (int i = 0; i < GR * (int)bsz; i += 64)
                _mm_prefetch((const char *)pf.next + i, _MM_HINT_T1);
            pf.next += GR * bsz;
        }
        __m256 dw, dm = _mm256_setzero_ps();
        if (kvc_i8_k_quant(kind)) {
            dw = _mm256_load_ps(ks[b % 8]);
            dm = _mm256_load_ps(km[b % 8]);
        } else {
            dw = block_scales(kind, rows, b, &dm);
        }
        /* One token: each row's weights go from the bytes into the madds.
         * More (and Q6_K, two dot products a row): the weights of elements
         * 0..15, 16..31 of each row as int16, through memory: VPMADDWD takes
         * them from there, and 16 vectors would not fit the registers. */
        _Alignas(32) int16_t w[GR][2][16];
        if (T > 1 || kind == I8_Q6_K)
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) {
                __m256i w0, w1;
                block_w16(kind, rows[r], b, &w0, &w1);
                _mm256_store_si256((__m256i *)w[r][0], w0);
                _mm256_store_si256((__m256i *)w[r][1], w1);
            }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(a[t] + 32 * b));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(a[t] + 32 * b + 16));
            const __m256 xs = _mm256_set1_ps(dx[t][b]);
            if (kind == I8_Q6_K) {        /* the halves have scales of their own: one after the other,
                                             * in 8 registers rather than 16 (1.07x) */
#pragma GCC unroll 2
                for (int j2 = 0; j2 < 2; j2++) {
                    __m256i z[GR];
#pragma GCC unroll 8
                    for (int r = 0; r < GR; r++)
                        z[r] = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)w[r][j2]), j2 ? x1 : x0);
                    const __m256i d =
                        _mm256_sub_epi32(reduce8(z), _mm256_set1_epi32(code_offset(kind) * hx[t][2 * b + j2]));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(j2 ? dm : dw, xs), acc[t]);
                }
                continue;
            }
            __m256i z[GR];
#pragma GCC unroll 8
            for (int r = 0; r < GR; r++) {
                __m256i w0, w1;
                if (T == 1) {
                    block_w16(kind, rows[r], b, &w0, &w1);
                } else {
                    w0 = _mm256_load_si256((const __m256i *)w[r][0]);
                    w1 = _mm256_load_si256((const __m256i *)w[r][1]);
                }
                z[r] = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
            }
            __m256i d = reduce8(z);   /* the codes' sums, then q's: exact in int32 */
            if (code_offset(kind))
                d = _mm256_sub_epi32(d, _mm256_set1_epi32(code_offset(kind) * sx[t][b]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(dw, xs), acc[t]);
            if (kvc_i8_has_min(kind))     /* the min step */
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-(float)sx[t][b]), _mm256_mul_ps(dm, xs), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        out[t] = acc[t];
}

typedef void (*group_fn)(const uint8_t *const rows[GR], int n, prefetch_plan pf, const uint8_t *const *ar,
                         int64_t n_in, __m256 acc[TC]);

#define GROUP_FN(name, kind, T)                                                                         \
    static void name##T(const uint8_t *const rows[GR], int n, prefetch_plan pf, const uint8_t *const *ar, \
                        int64_t n_in, __m256 acc[TC])                                                   \
    {                                                                                                   \
        decode_group(kind, T, rows, n, pf, ar, n_in, acc);                                              \
    }
#define GROUP_FNS(name, kind) GROUP_FN(name, kind, 1) GROUP_FN(name, kind, 2) GROUP_FN(name, kind, 3)
GROUP_FNS(q8_0_group, I8_Q8_0)
GROUP_FNS(q4_0_group, I8_Q4_0)
GROUP_FNS(q5_0_group, I8_Q5_0)
GROUP_FNS(q4_K_group, I8_Q4_K)
GROUP_FNS(q6_K_group, I8_Q6_K)
GROUP_FNS(q4_1_group, I8_Q4_1)
GROUP_FNS(q5_1_group, I8_Q5_1)
GROUP_FNS(q5_K_group, I8_Q5_K)
GROUP_FNS(mxfp4_group, I8_MXFP4)

_Static_assert(TC == 3, "group_fns lists TC functions per kind");
static const group_fn group_fns[I8_N_KINDS][TC] = {
    [I8_Q8_0] = { q8_0_group1, q8_0_group2, q8_0_group3 }, [I8_Q4_0] = { q4_0_group1, q4_0_group2, q4_0_group3 },
    [I8_Q5_0] = { q5_0_group1, q5_0_group2, q5_0_group3 }, [I8_Q4_K] = { q4_K_group1, q4_K_group2, q4_K_group3 },
    [I8_Q6_K] = { q6_K_group1, q6_K_group2, q6_K_group3 }, [I8_Q4_1] = { q4_1_group1, q4_1_group2, q4_1_group3 },
    [I8_Q5_1] = { q5_1_group1, q5_1_group2, q5_1_group3 }, [I8_Q5_K] = { q5_K_group1, q5_K_group2, q5_K_group3 },
    [I8_MXFP4] = { mxfp4_group1, mxfp4_group2, mxfp4_group3 },
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
        for (int r = 0; r < GR; r++)
            rows[r] = base + (size_t)(rg + KVC_MIN(r, nr - 1)) * rb;
        prefetch_plan pf = { NULL };   /* for the first pass, which brings the rows in */
        if (rg + GR < r1)
            pf.next = base + (size_t)(rg + GR) * rb;
        for (int64_t t0 = 0; t0 < n_tok; t0 += TC) {
            const int T = (int)KVC_MIN(TC, n_tok - t0);
            __m256 acc[TC];
            const uint8_t *ar[TC];
            for (int t = 0; t < TC; t++) {
                acc[t] = _mm256_setzero_ps();
                ar[t] = kvc_i8_tok_row(act, as, tok, t0 + KVC_MIN(t, T - 1));
            }
            group_fns[kind][T - 1](rows, nr, pf, ar, w->n_in, acc);
            for (int t = 0; t < T; t++) {
                _Alignas(32) float v[GR];
                _mm256_store_ps(v, acc[t]);
                memcpy(y + (t0 + t) * ldy + rg, v, (size_t)nr * sizeof(float));
            }
            pf = (prefetch_plan){ NULL };
        }
    }
}

/* ----------------------------------------------------------------- prefill
 *
 * The weights of a group of up to 16 rows (two row vectors of 8) are
 * repacked once per call, block by block: dword k of lane l of vector
 * (b, v, k) holds q_2k, q_2k+1 of block b of row 8v + l, as int16. Then
 *   D = sum_k VPMADDWD(q_k, a_k)      (a_k: the token's int16 pair 2k, 2k+1, broadcast)
 * gives each row's block dot product in its lane, exact in int32. A pass
 * keeps PT tokens x 2 row vectors of sums in registers: per pair, 2 weight
 * vectors and PT broadcasts feed 2 PT multiplies. */

#define PT 4    /* tokens a pass */
#define RV 2    /* row vectors a group */
#define KS 16   /* int16 pairs (dwords) of a block */

/* Rows [rg, rg + nr) of W, nr <= 8 nv, into pack (per block: nv x KS
 * vectors) and their scales into dsc (per block: nv x 8 floats; the mins of
 * Q4_1, Q5_1, Q4_K and Q5_K or Q6_K's second scales into msc likewise); rows
 * past nr are zero. */
AI void repack(const int kind, const kvc_weight *w, int64_t rg, int nr, int nv, __m256i *pack, float *dsc,
               float *msc)
{
    const int64_t nb = w->n_in / 32;
    const size_t rb = w->row_bytes;
    const uint8_t *base = (const uint8_t *)w->data + (size_t)rg * rb;
    for (int v = 0; v < nv; v++) {
        const int n = KVC_MIN(GR, nr - v * GR);
        const uint8_t *rows[GR];
        for (int l = 0; l < GR; l++)
            rows[l] = base + (size_t)(v * GR + KVC_MIN(l, n - 1)) * rb;
        _Alignas(32) float ks[8][GR], km[8][GR];
        for (int64_t b = 0; b < nb; b++) {
            __m256i r0[GR], r1[GR];     /* q_0..15 and q_16..31 of each row as int16 */
#pragma GCC unroll 8
            for (int l = 0; l < GR; l++) {
                const __m256i q = l < n ? kvc_i8_block_q(kind, rows[l], b) : _mm256_setzero_si256();
                r0[l] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
                r1[l] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
            }
            transpose_8x8(r0, pack + (b * nv + v) * KS);
            transpose_8x8(r1, pack + (b * nv + v) * KS + 8);
            if (kvc_i8_k_quant(kind)) {
                if (b % 8 == 0)
                    k_scales(kind, rows, n, b / 8, ks, km);
                _mm256_store_ps(dsc + (b * nv + v) * GR, _mm256_load_ps(ks[b % 8]));
                _mm256_store_ps(msc + (b * nv + v) * GR, _mm256_load_ps(km[b % 8]));
            } else {
                __m256 neg_m = _mm256_setzero_ps();
                _mm256_store_ps(dsc + (b * nv + v) * GR, block_scales(kind, rows, b, &neg_m));
                if (kvc_i8_has_min(kind))
                    _mm256_store_ps(msc + (b * nv + v) * GR, neg_m);
            }
        }
    }
}

/* d[v][t] = the dot products over pairs [k0, k0 + nk) of a block (u: its
 * repacked weights; a[t] + po: the token's int16 values of the block). */
AI void block_dots(const int NV, const int T, const int k0, const int nk, const __m256i *u,
                   const int16_t *const a[PT], int64_t po, __m256i d[RV][PT])
{
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            d[v][t] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int k = k0; k < k0 + nk; k++) {
        __m256i wv[RV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            wv[v] = _mm256_load_si256(u + v * KS + k);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            int32_t x2;
            memcpy(&x2, a[t] + po + 2 * k, 4);
            const __m256i x = _mm256_set1_epi32(x2);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) {
                d[v][t] = _mm256_add_epi32(d[v][t], _mm256_madd_epi16(wv[v], x));
                /* keeps the sum a chain in a register: GCC would otherwise
                 * reassociate the integer adds into a tree and spill every
                 * product to the stack first */
                __asm__("" : "+x"(d[v][t]));
            }
        }
    }
}

/* T <= PT tokens against a repacked group of NV row vectors (nr rows):
 * y[t][row l] for the group's rows. The block's 2 PT integer sums take the
 * registers; the float sums stay in out, in memory, loaded and stored once a
 * block. */
AI void prefill_pass(const int kind, const int NV, const int T, const __m256i *pack, const float *dsc,
                     const float *msc, int64_t nb, const uint8_t *const *ar, int64_t n_in, float *y,
                     int64_t ldy, int nr)
{
    const int n_sub = kind == I8_Q6_K ? 2 : 1;
    const int16_t *a[PT];
    const float *dx[PT];
    const int32_t *sx[PT];
    __m256 out[RV][PT];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        a[t] = kvc_i8_a(ar[t], n_in);
        dx[t] = kvc_i8_d(ar[t], n_in);
        sx[t] = kvc_i8_s(ar[t], n_in);
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            out[v][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const __m256i *u = pack + b * NV * KS;
#pragma GCC unroll 2
        for (int j = 0; j < n_sub; j++) {
            __m256i d[RV][PT];
            block_dots(NV, T, j * KS / n_sub, KS / n_sub, u, a, 32 * b, d);
            const float *sc = (j ? msc : dsc) + b * NV * GR;
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const __m256 xs = _mm256_set1_ps(dx[t][b]);
#pragma GCC unroll 2
                for (int v = 0; v < NV; v++) {
                    const __m256 ws = _mm256_mul_ps(_mm256_load_ps(sc + v * GR), xs);
                    __m256 acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[v][t]), ws, out[v][t]);
                    if (kvc_i8_has_min(kind))      /* the min step */
                        acc = _mm256_fmadd_ps(_mm256_set1_ps(-(float)sx[t][b]),
                                              _mm256_mul_ps(_mm256_load_ps(msc + (b * NV + v) * GR), xs), acc);
                    out[v][t] = acc;
                }
            }
        }
    }
    /* the rows past nr belong to the next call's range (maybe another
     * thread's): the last vector is stored masked unless the group is whole */
    const __m256i tail = kvc_first_lanes8(nr - (NV - 1) * GR);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *yv = y + t * ldy + v * GR;
            if (nr == NV * GR || v < NV - 1)
                _mm256_storeu_ps(yv, out[v][t]);
            else
                _mm256_maskstore_ps(yv, tail, out[v][t]);
        }
}

typedef void (*pass_fn)(const __m256i *pack, const float *dsc, const float *msc, int64_t nb,
                        const uint8_t *const *ar, int64_t n_in, float *y, int64_t ldy, int nr);

#define PASS_FN(name, kind, NV, T)                                                                   \
    static void name##_##NV##_##T(const __m256i *pack, const float *dsc, const float *msc, int64_t nb, \
                                  const uint8_t *const *ar, int64_t n_in, float *y, int64_t ldy,     \
                                  int nr)                                                            \
    {                                                                                                \
        prefill_pass(kind, NV, T, pack, dsc, msc, nb, ar, n_in, y, ldy, nr);                         \
    }
#define PASS_FNS_NV(name, kind, NV) PASS_FN(name, kind, NV, 1) PASS_FN(name, kind, NV, 2)              \
    PASS_FN(name, kind, NV, 3) PASS_FN(name, kind, NV, 4)
#define PASS_FNS(name, kind) PASS_FNS_NV(name, kind, 1) PASS_FNS_NV(name, kind, 2)
#define PASS_ROW(name, NV) { name##_##NV##_1, name##_##NV##_2, name##_##NV##_3, name##_##NV##_4 }
PASS_FNS(q8_0_pass, I8_Q8_0)
PASS_FNS(q4_0_pass, I8_Q4_0)
PASS_FNS(q5_0_pass, I8_Q5_0)
PASS_FNS(q4_K_pass, I8_Q4_K)
PASS_FNS(q6_K_pass, I8_Q6_K)
PASS_FNS(q4_1_pass, I8_Q4_1)
PASS_FNS(q5_1_pass, I8_Q5_1)
PASS_FNS(q5_K_pass, I8_Q5_K)
PASS_FNS(mxfp4_pass, I8_MXFP4)

_Static_assert(PT == 4, "pass_fns lists PT functions per row");
static const pass_fn pass_fns[I8_N_KINDS][RV][PT] = {
    [I8_Q8_0] = { PASS_ROW(q8_0_pass, 1), PASS_ROW(q8_0_pass, 2) },
    [I8_Q4_0] = { PASS_ROW(q4_0_pass, 1), PASS_ROW(q4_0_pass, 2) },
    [I8_Q5_0] = { PASS_ROW(q5_0_pass, 1), PASS_ROW(q5_0_pass, 2) },
    [I8_Q4_K] = { PASS_ROW(q4_K_pass, 1), PASS_ROW(q4_K_pass, 2) },
    [I8_Q6_K] = { PASS_ROW(q6_K_pass, 1), PASS_ROW(q6_K_pass, 2) },
    [I8_Q4_1] = { PASS_ROW(q4_1_pass, 1), PASS_ROW(q4_1_pass, 2) },
    [I8_Q5_1] = { PASS_ROW(q5_1_pass, 1), PASS_ROW(q5_1_pass, 2) },
    [I8_Q5_K] = { PASS_ROW(q5_K_pass, 1), PASS_ROW(q5_K_pass, 2) },
    [I8_MXFP4] = { PASS_ROW(mxfp4_pass, 1), PASS_ROW(mxfp4_pass, 2) },
};

typedef void (*repack_fn)(const kvc_weight *w, int64_t rg, int nr, int nv, __m256i *p, float *d, float *m);
#define REPACK_FN(name, kind)                                                                        \
    static void name(const kvc_weight *w, int64_t rg, int nr, int nv, __m256i *p, float *d, float *m) \
    {                                                                                                \
        repack(kind, w, rg, nr, nv, p, d, m);                                                        \
    }
REPACK_FN(repack_q8_0, I8_Q8_0)
REPACK_FN(repack_q4_0, I8_Q4_0)
REPACK_FN(repack_q5_0, I8_Q5_0)
REPACK_FN(repack_q4_K, I8_Q4_K)
REPACK_FN(repack_q6_K, I8_Q6_K)
REPACK_FN(repack_q4_1, I8_Q4_1)
REPACK_FN(repack_q5_1, I8_Q5_1)
REPACK_FN(repack_q5_K, I8_Q5_K)
REPACK_FN(repack_mxfp4, I8_MXFP4)
static const repack_fn repack_fns[I8_N_KINDS] = {
    [I8_Q8_0] = repack_q8_0, [I8_Q4_0] = repack_q4_0, [I8_Q5_0] = repack_q5_0, [I8_Q4_K] = repack_q4_K,
    [I8_Q6_K] = repack_q6_K, [I8_Q4_1] = repack_q4_1, [I8_Q5_1] = repack_q5_1, [I8_Q5_K] = repack_q5_K,
    [I8_MXFP4] = repack_mxfp4,
};

/* Bytes of a repacked group in scratch (the scales follow). */
static size_t pack_bytes(int64_t n_in) { return (size_t)n_in / 32 * RV * KS * 32; }

/* The repacked group, its scales and (K-quants) second scales or mins. */
static size_t prefill_scratch_bytes(int64_t n_in)
{
    return pack_bytes(n_in) + (size_t)n_in / 32 * RV * GR * 2 * sizeof(float);
}

static void prefill_act(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok, float *y,
                        int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    const int kind = kvc_i8_kind(w->type);
    const int64_t nb = w->n_in / 32;
    const size_t as = kvc_i8_act_row_bytes(w->n_in);
    __m256i *pack = (__m256i *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
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
            const uint8_t *ar[PT];
            for (int t = 0; t < T; t++)
                ar[t] = kvc_i8_tok_row(act, as, tok, t0 + t);
            pass_fns[kind][nv - 1][T - 1](pack, dsc, msc, nb, ar, w->n_in, y + t0 * ldy + rg, ldy, nr);
        }
    }
}

_Static_assert(RV * GR == KVC_AVX2_I8_PREFILL_ROWS, "a prefill group is KVC_AVX2_I8_PREFILL_ROWS rows");

void kvc_avx2_i8_matmul_act(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok,
                            float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    if (n_tok >= KVC_AVX2_I8_PREFILL_MIN_TOK)     /* from here on, repacking pays */
        prefill_act(w, act, tok, n_tok, y, ldy, r0, r1, scratch);
    else
        decode_act(w, act, tok, n_tok, y, ldy, r0, r1);
}

/* ------------------------------------------------------------ entry point */

/* This file's steps (kernels_int8.h); the types they do not take go to
 * kvc_kernels_avx2. */
const kvc_i8_isa kvc_i8_avx2 = { kvc_avx2_i8_quantize_rows, kvc_avx2_i8_matmul_act, prefill_scratch_bytes,
                                 &kvc_kernels_avx2, kvc_i8_avx2_type_ok };

size_t kvc_avx2_i8_scratch_floats(int64_t n_in)
{
    return kvc_i8_scratch_floats(&kvc_i8_avx2, n_in);
}

void kvc_avx2_i8_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                             int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    kvc_i8_matmul_rows(&kvc_i8_avx2, w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
}
