/* kernels_int8.h - the integer matmul scheme of the "vnni" and "avx2" ISAs: activations
 * quantized to two int8 planes, integer dot products per block, float scaling
 * in one fixed order. Internal to the kernels.
 *
 * WHY. Converting quantized weights to float costs more than reading them;
 * llama.cpp instead quantizes the activations to int8 (Q8_0) and uses VNNI,
 * at the price of ~8 bits of activation precision. Two int8 planes keep ~16
 * bits: results stay within ~1e-5 of the float path, and integer sums are
 * exact in any order, so the prefill kernel (weights repacked, many tokens)
 * and the decode kernel (weights streamed once) agree bit for bit, and so
 * would an AMX kernel, should one be added for CPUs that have it.
 *
 * ACTIVATIONS (per token row of n_in floats, n_in a multiple of 32; per block
 * of 32 elements x[0..32)). All operations are float32 and round to nearest:
 *
 *   amax = max |x_i|             (NaN elements count as 0)
 *   if !(amax >= 2^-96):         hi_i = lo_i = 0, d = 0, S = 0   (also amax NaN)
 *   else:
 *     dh  = amax / 127           id = 127 / amax           id2 = id * 256 (exact)
 *     hi_i = rint(clamp(x_i * id))                 clamp(v) = min(max(v, -127), 127)
 *     r_i  = fma(-hi_i, dh, x_i)                   (the residual, one rounding)
 *     lo_i = rint(clamp(r_i * id2))
 *     d    = dh / 256 (exact)    S = sum_i (256 hi_i + lo_i)   (exact int32)
 *
 * so x_i ~= d * a_i with a_i = 256 hi_i + lo_i, |a_i| <= 32639, and
 * |x_i - d a_i| <= ~0.5 d = amax / 65024 (at most ~1.0 d where lo is clamped).
 * clamp(NaN) is -127 (max(NaN, -127) = -127, as fmaxf and MAXPS with NaN first).
 * max(v, -127) then min(., 127), then rint: clamping first or rounding first
 * agree because the bounds are integers.
 *
 * A token row is stored as (act_row_bytes(n_in) bytes, 64-byte aligned):
 *   int8 hi[n_in] | int8 lo[n_in] | float d[nb] | int32 S[nb] | int32 H[2 nb] | int16 a[n_in] | pad
 * where H[2b], H[2b + 1] are the sums of a over the halves of block b (S_b =
 * their sum; kernels that offset the codes of 16-element sub-blocks need
 * them), and a holds the same values as the planes, a_i = 256 hi_i + lo_i,
 * for kernels that multiply int16 pairs (the prefill: one product per
 * element instead of two).
 *
 * WEIGHTS. Each 32-element block b of a weight row is read in integer form:
 * integer weights q_i and scales (kvc_i8_wblock). Per type:
 *   Q8_0  q = qs                d0 = d
 *   Q4_0  q = nibble - 8        d0 = d
 *   Q5_0  q = 5-bit code - 16   d0 = d
 *   Q4_1  q = nibble            d0 = d, min: m = -(the block's m)
 *   Q5_1  q = 5-bit code        d0 = d, min: m = -(the block's m)
 *   Q4_K  (sub-block j = b % 8) q = 4-bit code, d0 = d * sc_j, min: m = dmin * m_j
 *   Q5_K  as Q4_K, q = 5-bit code
 *   Q6_K  (two sub-blocks of 16) q = 6-bit code - 32, d0 = d * sc_2j, d1 = d * sc_2j+1
 *   MXFP4 q = kvc_mxfp4_values[4-bit code] (the E2M1 value doubled: 0, +-1,
 *         2, 3, 4, 6, 8, 12), d0 = kvc_e8m0_half(e) = 2^(e - 128) (exact)
 * (the products d * sc as quant.c's reference dequantization computes them;
 * Q4_1 and Q5_1 add their m where the K-quants subtract theirs, hence the
 * sign).
 *
 * THE ORDER OF ONE OUTPUT ELEMENT y[t][r] (every ISA that uses this scheme):
 *
 *   acc = 0.0f
 *   for b = 0, 1, ..., nb - 1:                       (blocks in order)
 *     one scale (n_sub == 1):  D  = sum_{i<32} q_i a_i          (exact int32)
 *                              acc = fma((float)D, d0 * dx_b, acc)
 *     two scales (Q6_K):       D0 = sum_{i<16} q_i a_i,  D1 = sum_{16<=i<32} q_i a_i
 *                              acc = fma((float)D0, d0 * dx_b, acc)
 *                              acc = fma((float)D1, d1 * dx_b, acc)
 *     with a min (Q4_K):       then acc = fma(-(float)S_b, m * dx_b, acc)
 *   y = acc
 *
 * where dx_b, S_b are the token's block scale and block sum, "d0 * dx_b" is
 * one float multiply (rounded), and (float)D rounds to nearest. Integer sums
 * cannot overflow: |q| <= 128, |a| <= 32639, 32 * 128 * 32639 < 2^31.
 *
 * Nothing in this sequence depends on other tokens, other rows or the way the
 * dot products are formed, so the scalar reference and every VNNI kernel
 * produce the same bits for every element. */
#ifndef KVC_KERNELS_INT8_H
#define KVC_KERNELS_INT8_H

#include "kernels_internal.h"

#include <stddef.h>
#include <string.h>

#define KVC_I8_AMIN 0x1p-96f          /* blocks with a smaller max |x| quantize to 0 */

/* Bytes of one quantized token row of n_in elements (n_in % 32 == 0): a
 * multiple of 64, but an odd one, so token rows read together do not crowd
 * into a few L1 sets (n_in = 896 would give 2048). */
static inline size_t kvc_i8_act_row_bytes(int64_t n_in)
{
    const size_t nb = (size_t)n_in / 32;
    const size_t r = ((size_t)n_in * 4 + nb * 16 + 63) & ~(size_t)63;
    return r % 128 ? r : r + 64;
}

/* Accessors of a token row. */
static inline const int8_t *kvc_i8_hi(const uint8_t *row) { return (const int8_t *)row; }
static inline const int8_t *kvc_i8_lo(const uint8_t *row, int64_t n_in) { return (const int8_t *)row + n_in; }
static inline const float *kvc_i8_d(const uint8_t *row, int64_t n_in)
{
    return (const float *)(const void *)(row + 2 * n_in);
}
static inline const int32_t *kvc_i8_s(const uint8_t *row, int64_t n_in)
{
    return (const int32_t *)(const void *)(row + 2 * n_in + n_in / 8);
}
static inline const int32_t *kvc_i8_h(const uint8_t *row, int64_t n_in)
{
    return (const int32_t *)(const void *)(row + 2 * n_in + n_in / 4);
}
static inline const int16_t *kvc_i8_a(const uint8_t *row, int64_t n_in)
{
    return (const int16_t *)(const void *)(row + 2 * n_in + n_in / 2);
}
/* Bytes of a row before its pad. */
static inline size_t kvc_i8_act_used_bytes(int64_t n_in) { return (size_t)n_in * 4 + (size_t)n_in / 2; }

/* One 32-element block of a weight row in integer form (see above). */
typedef struct kvc_i8_wblock {
    int8_t q[32];
    int    n_sub;       /* 1 or 2 scales (2: q[0..16) and q[16..32)) */
    bool   has_min;     /* the min step applies */
    float  d[2];
    float  m;
} kvc_i8_wblock;

/* Weight types the scheme covers (the reference handles all of them; an ISA
 * may use it for fewer, see kvc_i8_avx2_type_ok). */
bool kvc_i8_type_ok(uint32_t type);

/* Reference quantization of one token row (n_in floats) into dst
 * (kvc_i8_act_row_bytes(n_in) bytes; the pad is zeroed). */
void kvc_i8_quantize_row_ref(const float *x, int64_t n_in, uint8_t *dst);

/* Block b of a weight row of `type` in integer form. */
void kvc_i8_unpack_block_ref(uint32_t type, const void *row, int64_t b, kvc_i8_wblock *out);

/* The scalar reference of the whole scheme: y[t * ldy + r] for t < n_tok,
 * r in [r0, r1), from quantized rows act (stride kvc_i8_act_row_bytes),
 * token t's being row tok[t] (tok NULL: row t). */
void kvc_i8_matmul_ref(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok, float *y,
                       int64_t ldy, int64_t r0, int64_t r1);

/* Where token t's quantized row is (kvc_matmul_act_fn's tok rule). */
static inline const uint8_t *kvc_i8_tok_row(const uint8_t *act, size_t as, const int32_t *tok, int64_t t)
{
    return act + (size_t)(tok ? tok[t] : t) * as;
}

/* Types the SIMD kernels of each ISA handle with this scheme; others keep
 * their ISA's float path. The AVX2 kernels take every type of the scheme;
 * the VNNI kernels Q8_0, Q4_0, Q5_0, Q4_K, Q6_K and MXFP4 (the first
 * I8_N_VNNI kinds below). */
bool kvc_i8_avx2_type_ok(uint32_t type);
bool kvc_i8_vnni_type_ok(uint32_t type);

/* A SIMD ISA's steps of the scheme, for the entry points below: its
 * quantize and matmul_act (as in kvc_kernel_ops), the bytes of scratch its
 * matmul_act needs ahead of the activations, the float ops table that
 * takes the types it does not, and which types it takes. */
typedef struct kvc_i8_isa {
    kvc_act_quantize_fn  *quantize;
    kvc_matmul_act_fn    *matmul_act;
    size_t              (*own_bytes)(int64_t n_in);
    const kvc_kernel_ops *fallback;
    kvc_act_type_ok_fn   *type_ok;
} kvc_i8_isa;

/* The SIMD ISAs' steps, each named once here: kernels.c's ops tables and
 * the tests take them from these (kernels_avx2_int8.c, kernels_vnni.c). */
extern const kvc_i8_isa kvc_i8_avx2, kvc_i8_vnni;

#define KVC_I8_TB_ACT 64   /* tokens kvc_i8_matmul_rows quantizes at a time */

/* matmul_rows of such an ISA: x quantized KVC_I8_TB_ACT tokens at a time
 * into the scratch after the ISA's own bytes, then its matmul_act; types
 * outside isa->type_ok go to the fallback's matmul_rows. Scratch:
 * kvc_i8_scratch_floats(isa, n_in) floats, which covers the fallback's need
 * too, so the ISA's ops table sizes its own matmul_rows whole. */
void   kvc_i8_matmul_rows(const kvc_i8_isa *isa, const kvc_weight *w, const float *x, int64_t ldx,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch);
size_t kvc_i8_scratch_floats(const kvc_i8_isa *isa, int64_t n_in);

/* The weight types of the SIMD kernels as kinds, for tables indexed by kind:
 * kvc_i8_vnni_type_ok's types first (I8_N_VNNI of them), then the others of
 * kvc_i8_avx2_type_ok. */
enum {
    I8_Q8_0, I8_Q4_0, I8_Q5_0, I8_Q4_K, I8_Q6_K, I8_MXFP4, I8_N_VNNI,
    I8_Q4_1 = I8_N_VNNI, I8_Q5_1, I8_Q5_K, I8_N_KINDS
};

static inline int kvc_i8_kind(uint32_t type)
{
    switch (type) {
    case KVC_TYPE_Q8_0: return I8_Q8_0;
    case KVC_TYPE_Q4_0: return I8_Q4_0;
    case KVC_TYPE_Q5_0: return I8_Q5_0;
    case KVC_TYPE_Q4_K: return I8_Q4_K;
    case KVC_TYPE_Q4_1: return I8_Q4_1;
    case KVC_TYPE_Q5_1: return I8_Q5_1;
    case KVC_TYPE_Q5_K: return I8_Q5_K;
    case KVC_TYPE_MXFP4: return I8_MXFP4;
    default:            return I8_Q6_K;
    }
}

/* Scales per 256-element super-block (read by super-block). */
static inline bool kvc_i8_k_quant(const int kind) { return kind == I8_Q4_K || kind == I8_Q5_K || kind == I8_Q6_K; }

/* The min step applies (kvc_i8_wblock.has_min). */
static inline bool kvc_i8_has_min(const int kind)
{
    return kind == I8_Q4_K || kind == I8_Q5_K || kind == I8_Q4_1 || kind == I8_Q5_1;
}

/* Bytes a block of 32 weights takes (K-quants: an eighth of the super-block,
 * rounded up, for prefetching; their blocks are addressed by super-block). */
static inline size_t kvc_i8_block_bytes(const int kind)
{
    return kind == I8_Q8_0   ? sizeof(block_q8_0)
           : kind == I8_Q4_0 ? sizeof(block_q4_0)
           : kind == I8_Q5_0 ? sizeof(block_q5_0)
           : kind == I8_Q4_1 ? sizeof(block_q4_1)
           : kind == I8_Q5_1 ? sizeof(block_q5_1)
           : kind == I8_MXFP4 ? sizeof(block_mxfp4)
           : kind == I8_Q4_K ? sizeof(block_q4_K) / 8
           : kind == I8_Q5_K ? sizeof(block_q5_K) / 8
                             : (sizeof(block_q6_K) + 7) / 8;
}

/* The 32 nibble bytes of Q4_K or Q5_K block b of a row (low nibbles for
 * even b, high for odd; Q5_K's fifth bits are in qh: kvc_i8_block_q). */
static inline const uint8_t *kvc_i8_k4_codes(const int kind, const uint8_t *row, int64_t b)
{
    const size_t super = kind == I8_Q4_K ? sizeof(block_q4_K) : sizeof(block_q5_K);
    const size_t qs = kind == I8_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs);
    return row + (size_t)(b / 8) * super + qs + 32 * (size_t)((b % 8) / 2);
}

/* Where the 16 nibble bytes of a block of Q4_0, Q4_1, Q5_0 or Q5_1 start
 * (after d; d and m; Q5_*: the 4 bytes of fifth bits just before them). */
static inline size_t kvc_i8_nibbles_at(const int kind)
{
    _Static_assert(offsetof(block_q5_0, qs) == offsetof(block_q5_0, qh) + 4, "Q5_0: qh, then qs");
    _Static_assert(offsetof(block_q5_1, qs) == offsetof(block_q5_1, qh) + 4, "Q5_1: qh, then qs");
    return kind == I8_Q4_0   ? offsetof(block_q4_0, qs)
           : kind == I8_Q4_1 ? offsetof(block_q4_1, qs)
           : kind == I8_Q5_0 ? offsetof(block_q5_0, qs)
                             : offsetof(block_q5_1, qs);
}

#ifdef __AVX2__
/* Weight blocks in integer form for the SIMD files (all built with AVX2 at
 * least): the same values as kvc_i8_unpack_block_ref. */
#include <immintrin.h>

/* The 32 codes q + 32 of Q6_K block b of a row: 4 low bits from ql, 2 high
 * from qh, as quant.c lays them out (blocks 4h + kq of the super-block's
 * half h). */
static inline __attribute__((always_inline)) __m256i kvc_i8_k6_codes(const uint8_t *row, int64_t b)
{
    const block_q6_K *k = (const block_q6_K *)(const void *)row + b / 8;
    const int j = (int)(b % 8), h = j / 4, kq = j % 4;
    __m256i lo = _mm256_loadu_si256((const __m256i *)(k->ql + 64 * h + 32 * (kq & 1)));
    if (kq >= 2)
        lo = _mm256_srli_epi16(lo, 4);
    lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0f));
    __m256i hb = _mm256_loadu_si256((const __m256i *)(k->qh + 32 * h));
    hb = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * kq), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
}

/* kvc_mxfp4_values in both 128-bit lanes (a byte shuffle's table). */
static inline __attribute__((always_inline)) __m256i kvc_i8_mxfp4_lut(void)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)kvc_mxfp4_values));
}

/* kvc_e8m0_half of the low byte of each dword lane of e (the other bytes
 * ignored): 2^(e - 128), whose bits are (e - 1) << 23 from e = 2 on and the
 * subnormals 2^21 << e below. */
static inline __attribute__((always_inline)) __m256 kvc_i8_e8m0_half8(__m256i e)
{
    e = _mm256_and_si256(e, _mm256_set1_epi32(0xff));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

/* Bit i of m as byte i (0 or 0xff) of a vector. */
static inline __attribute__((always_inline)) __m256i kvc_i8_bits_to_bytes(uint32_t m)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* The 32 integer weights q of block b of a row of `kind`, as signed bytes
 * (offsets already taken off). */
static inline __attribute__((always_inline)) __m256i kvc_i8_block_q(const int kind, const uint8_t *row, int64_t b)
{
    if (kind == I8_Q6_K)
        return _mm256_sub_epi8(kvc_i8_k6_codes(row, b), _mm256_set1_epi8(32));
    if (kind == I8_Q4_K || kind == I8_Q5_K) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)kvc_i8_k4_codes(kind, row, b));
        const __m256i q = _mm256_and_si256(b & 1 ? _mm256_srli_epi16(c, 4) : c, _mm256_set1_epi8(0x0f));
        if (kind == I8_Q4_K)
            return q;
        /* Q5_K: bit b % 8 of qh[l] is the 5th bit of element l */
        const block_q5_K *k = (const block_q5_K *)(const void *)row + b / 8;
        const __m256i h = _mm256_loadu_si256((const __m256i *)k->qh);
        const __m256i bit = _mm256_set1_epi8((char)(1 << (b % 8)));
        return _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit),
                                                   _mm256_set1_epi8(0x10)));
    }
    const uint8_t *k = row + (size_t)b * kvc_i8_block_bytes(kind);
    if (kind == I8_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(k + 2));
    if (kind == I8_MXFP4) {      /* the codes looked up in the table of doubled E2M1 values */
        const __m128i nib = _mm_loadu_si128((const __m128i *)(k + offsetof(block_mxfp4, qs)));
        const __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nib, 4), nib), _mm256_set1_epi8(0x0f));
        return _mm256_shuffle_epi8(kvc_i8_mxfp4_lut(), c);
    }
    const size_t at = kvc_i8_nibbles_at(kind);
    const __m128i nib = _mm_loadu_si128((const __m128i *)(k + at));
    __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nib, 4), nib), _mm256_set1_epi8(0x0f));
    if (kind == I8_Q4_0)
        return _mm256_sub_epi8(c, _mm256_set1_epi8(8));
    if (kind == I8_Q4_1)
        return c;
    uint32_t qh;                 /* Q5_0, Q5_1: bit j of qh is the 5th bit of element j */
    memcpy(&qh, k + at - 4, 4);
    c = _mm256_or_si256(c, _mm256_and_si256(kvc_i8_bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
    return kind == I8_Q5_0 ? _mm256_sub_epi8(c, _mm256_set1_epi8(16)) : c;
}
#endif

/* ------------------------------------------------ the AVX-512 VNNI parts
 * kernels_vnni.c; call only when the CPU has AVX-512 VNNI (kernels.c checks). */

/* Quantize token rows [t0, t1) of x (ldx floats apart) into act (rows
 * kvc_i8_act_row_bytes(n_in) apart), bitwise as kvc_i8_quantize_row_ref. */
void kvc_vnni_quantize_rows(const float *x, int64_t ldx, int64_t n_in, int64_t t0, int64_t t1, uint8_t *act);

/* y = W x on quantized activations (any n_tok), bitwise kvc_i8_matmul_ref.
 * scratch: kvc_vnni_scratch_floats(n_in) floats, 64-byte aligned. Few tokens
 * stream the weights (decode); more repack KVC_VNNI_PREFILL_ROWS rows at a
 * time (two vectors of 16) so that the tokens find one row per lane (prefill). */
void kvc_vnni_matmul_act(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok, float *y,
                         int64_t ldy, int64_t r0, int64_t r1, float *scratch);

/* From this many tokens on kvc_vnni_matmul_act repacks the weights and takes
 * KVC_VNNI_PREFILL_ROWS rows at a time; fewer stream 16. */
#define KVC_VNNI_PREFILL_MIN_TOK 4
#define KVC_VNNI_PREFILL_ROWS    32

/* The matmul entry of the "vnni" ISA (kernels.c puts it in a table beside
 * the AVX-512 vector kernels): quantizes x, then kvc_vnni_matmul_act. */
void   kvc_vnni_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                            int64_t ldy, int64_t r0, int64_t r1, float *scratch);
size_t kvc_vnni_scratch_floats(int64_t n_in);

/* ---------------------------------------------------------- the AVX2 parts
 * kernels_avx2_int8.c, the same entries for the "avx2" ISA; call only when
 * the CPU has AVX2, FMA and F16C (kernels.c checks). Bitwise the reference,
 * as the VNNI kernels. Decode takes 8 rows at a time; prefill repacks
 * KVC_AVX2_I8_PREFILL_ROWS. */
#define KVC_AVX2_I8_PREFILL_MIN_TOK 4
#define KVC_AVX2_I8_PREFILL_ROWS    16

void   kvc_avx2_i8_quantize_rows(const float *x, int64_t ldx, int64_t n_in, int64_t t0, int64_t t1,
                                 uint8_t *act);
void   kvc_avx2_i8_matmul_act(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok,
                              float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch);
void   kvc_avx2_i8_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                               int64_t ldy, int64_t r0, int64_t r1, float *scratch);
size_t kvc_avx2_i8_scratch_floats(int64_t n_in);

#endif
