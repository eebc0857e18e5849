/* quant.c - type traits, half/bfloat conversions, reference (de)quantization. */
#include "quant.h"

#include <math.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------------ traits */

static const kvc_type_traits type_traits[KVC_TYPE_COUNT] = {
    [KVC_TYPE_F32]  = { "f32",  1,     4,                  true  },
    [KVC_TYPE_F16]  = { "f16",  1,     2,                  true  },
    [KVC_TYPE_Q4_0] = { "q4_0", QK4_0, sizeof(block_q4_0), true  },
    [KVC_TYPE_Q4_1] = { "q4_1", QK4_1, sizeof(block_q4_1), true  },
    [4]             = { "q4_2 (removed)", 0, 0,            false },
    [5]             = { "q4_3 (removed)", 0, 0,            false },
    [KVC_TYPE_Q5_0] = { "q5_0", QK5_0, sizeof(block_q5_0), true  },
    [KVC_TYPE_Q5_1] = { "q5_1", QK5_1, sizeof(block_q5_1), true  },
    [KVC_TYPE_Q8_0] = { "q8_0", QK8_0, sizeof(block_q8_0), true  },
    [KVC_TYPE_Q8_1] = { "q8_1", 32,    36,                 false },
    [KVC_TYPE_Q2_K] = { "q2_K", QK_K,  84,                 false },
    [KVC_TYPE_Q3_K] = { "q3_K", QK_K,  110,                false },
    [KVC_TYPE_Q4_K] = { "q4_K", QK_K,  sizeof(block_q4_K), true  },
    [KVC_TYPE_Q5_K] = { "q5_K", QK_K,  sizeof(block_q5_K), true  },
    [KVC_TYPE_Q6_K] = { "q6_K", QK_K,  sizeof(block_q6_K), true  },
    [KVC_TYPE_Q8_K] = { "q8_K", QK_K,  292,                false },
    [16]            = { "iq2_xxs", QK_K, 66,               false },
    [17]            = { "iq2_xs",  QK_K, 74,               false },
    [18]            = { "iq3_xxs", QK_K, 98,               false },
    [19]            = { "iq1_s",   QK_K, 50,               false },
    [20]            = { "iq4_nl",  32,   18,               false },
    [21]            = { "iq3_s",   QK_K, 110,              false },
    [22]            = { "iq2_s",   QK_K, 82,               false },
    [23]            = { "iq4_xs",  QK_K, 136,              false },
    [24]            = { "i8",      1,    1,                false },
    [25]            = { "i16",     1,    2,                false },
    [26]            = { "i32",     1,    4,                false },
    [27]            = { "i64",     1,    8,                false },
    [28]            = { "f64",     1,    8,                false },
    [29]            = { "iq1_m",   QK_K, 56,               false },
    [KVC_TYPE_BF16] = { "bf16", 1,     2,                  true  },
    [34]            = { "tq1_0",   QK_K, 54,               false },
    [35]            = { "tq2_0",   QK_K, 66,               false },
    [KVC_TYPE_MXFP4] = { "mxfp4", QK_MXFP4, sizeof(block_mxfp4), true },
};

const kvc_type_traits *kvc_type_info(uint32_t type)
{
    if (type >= KVC_TYPE_COUNT || type_traits[type].name == NULL || type_traits[type].block_size == 0)
        return NULL;
    return &type_traits[type];
}

size_t kvc_row_size(uint32_t type, int64_t n)
{
    const kvc_type_traits *t = kvc_type_info(type);
    if (!t || n < 0 || n % t->block_size != 0)
        return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

int kvc_type_from_name(const char *name)
{
    for (int i = 0; i < KVC_TYPE_COUNT; i++)
        if (type_traits[i].name && type_traits[i].block_size && strcasecmp(type_traits[i].name, name) == 0)
            return i;
    return -1;
}

/* ------------------------------------------------------- half and bfloat16 */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float kvc_fp16_to_fp32(kvc_fp16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: man * 2^-24 is exact in float */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)   /* inf, or NaN made quiet as F16C's vcvtph2ps does */
        return bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

kvc_fp16 kvc_fp32_to_fp16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u)                       /* NaN: keep it quiet NaN */
        return (kvc_fp16)(sign | 0x7e00 | ((au >> 13) & 0x3ff));
    if (au >= 0x477ff000u)                      /* rounds to >= 65520: inf */
        return (kvc_fp16)(sign | 0x7c00);
    if (au < 0x38800000u) {                     /* below 2^-14: subnormal or zero */
        /* value * 2^24 rounded to nearest even is the subnormal mantissa */
        float v = bits_f32(au) * 0x1p24f;
        float r = nearbyintf(v);                /* default rounding: nearest even */
        return (kvc_fp16)(sign | (uint32_t)r);
    }
    uint32_t mant_odd = (au >> 13) & 1;
    au += 0xfff + mant_odd;                     /* round to nearest even */
    return (kvc_fp16)(sign | ((au - 0x38000000u) >> 13));
}

float kvc_bf16_to_fp32(kvc_bf16 h) { return bits_f32((uint32_t)h << 16); }

kvc_bf16 kvc_fp32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (kvc_bf16)((u >> 16) | 64);     /* quiet NaN */
    return (kvc_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

/* ------------------------------------------------- reference dequantization
 *
 * Each formula is the GGUF format's definition evaluated with the same float
 * operations, in the same order, as ggml's dequantize_row_*, so the values are
 * bitwise identical to ggml's. Every product below is exact in float (an fp16
 * scale has 11 significant bits; the integer factors add at most 7 + 5), so
 * only a final add or subtract rounds: a SIMD version may use FMA for
 * "a * b + c" and still match these bits. */

static void dequant_q4_0(const block_q4_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK4_0) {
        const float d = kvc_fp16_to_fp32(b->d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j]             = (float)((b->qs[j] & 0x0f) - 8) * d;
            y[j + QK4_0 / 2] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const block_q4_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK4_1) {
        const float d = kvc_fp16_to_fp32(b->d), m = kvc_fp16_to_fp32(b->m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j]             = (float)(b->qs[j] & 0x0f) * d + m;
            y[j + QK4_1 / 2] = (float)(b->qs[j] >> 4) * d + m;
        }
    }
}

/* Q5_*: the 5th bit of element j is bit j of qh (little-endian u32). */
static inline uint32_t q5_high_bits(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void dequant_q5_0(const block_q5_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK5_0) {
        const float d = kvc_fp16_to_fp32(b->d);
        const uint32_t qh = q5_high_bits(b->qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            int lo = (int)(b->qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int hi = (int)(b->qs[j] >> 4) | (int)((qh >> (j + QK5_0 / 2)) & 1) << 4;
            y[j]             = (float)(lo - 16) * d;
            y[j + QK5_0 / 2] = (float)(hi - 16) * d;
        }
    }
}

static void dequant_q5_1(const block_q5_1 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK5_1) {
        const float d = kvc_fp16_to_fp32(b->d), m = kvc_fp16_to_fp32(b->m);
        const uint32_t qh = q5_high_bits(b->qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            int lo = (int)(b->qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int hi = (int)(b->qs[j] >> 4) | (int)((qh >> (j + QK5_1 / 2)) & 1) << 4;
            y[j]             = (float)lo * d + m;
            y[j + QK5_1 / 2] = (float)hi * d + m;
        }
    }
}

static void dequant_q8_0(const block_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK8_0) {
        const float d = kvc_fp16_to_fp32(b->d);
        for (int j = 0; j < QK8_0; j++)
            y[j] = (float)b->qs[j] * d;
    }
}

const int8_t kvc_mxfp4_values[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

static void dequant_mxfp4(const block_mxfp4 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, y += QK_MXFP4) {
        const float d = kvc_e8m0_half(b->e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[j] = (float)kvc_mxfp4_values[b->qs[j] & 15] * d;
            y[j + QK_MXFP4 / 2] = (float)kvc_mxfp4_values[b->qs[j] >> 4] * d;
        }
    }
}

/* Q4_K: 4 chunks of 64; in chunk c byte qs[32c + l] holds element 64c + l in
 * its low nibble (sub-block 2c) and element 64c + 32 + l in its high nibble. */
static void dequant_q4_K(const block_q4_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++) {
        const float d = kvc_fp16_to_fp32(b->d), dmin = kvc_fp16_to_fp32(b->dmin);
        const uint8_t *q = b->qs;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            uint8_t sc, m;
            kvc_k4_scale_min(2 * c, b->scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kvc_k4_scale_min(2 * c + 1, b->scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                y[l]      = d1 * (float)(q[l] & 0x0f) - m1;
                y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
            }
        }
    }
}

/* Q5_K: as Q4_K; the 5th bit of element 64c + l is bit 2c of qh[l], of
 * element 64c + 32 + l bit 2c + 1. */
static void dequant_q5_K(const block_q5_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++) {
        const float d = kvc_fp16_to_fp32(b->d), dmin = kvc_fp16_to_fp32(b->dmin);
        const uint8_t *q = b->qs;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            uint8_t sc, m;
            kvc_k4_scale_min(2 * c, b->scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            kvc_k4_scale_min(2 * c + 1, b->scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int lo = (q[l] & 0x0f) | ((b->qh[l] >> (2 * c)) & 1) << 4;
                int hi = (q[l] >> 4) | ((b->qh[l] >> (2 * c + 1)) & 1) << 4;
                y[l]      = d1 * (float)lo - m1;
                y[l + 32] = d2 * (float)hi - m2;
            }
        }
    }
}

/* Q6_K: 2 halves of 128. In a half, for l < 32: ql[l] holds the low nibbles of
 * elements l (low) and l + 64 (high), ql[l + 32] those of l + 32 and l + 96;
 * qh[l] holds their top 2 bits at shifts 0, 2, 4, 6 (for l, l+32, l+64, l+96).
 * Scales: one int8 per 16 elements, in element order. */
static void dequant_q6_K(const block_q6_K *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++) {
        const float d = kvc_fp16_to_fp32(b->d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            const int8_t *sc = b->scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                int s = l / 16;
                int q1 = ((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
                int q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
                int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l]      = d * (float)sc[s + 0] * (float)q1;
                y[l + 32] = d * (float)sc[s + 2] * (float)q2;
                y[l + 64] = d * (float)sc[s + 4] * (float)q3;
                y[l + 96] = d * (float)sc[s + 6] * (float)q4;
            }
        }
    }
}

void kvc_dequantize_row_ref(uint32_t type, const void *src, float *dst, int64_t n)
{
    const kvc_type_traits *t = kvc_type_info(type);
    if (!t || !t->supported || n <= 0 || n % t->block_size != 0)
        return;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case KVC_TYPE_F32:  memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KVC_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = kvc_fp16_to_fp32(((const kvc_fp16 *)src)[i]);
        break;
    case KVC_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = kvc_bf16_to_fp32(((const kvc_bf16 *)src)[i]);
        break;
    case KVC_TYPE_Q4_0: dequant_q4_0(src, dst, nb); break;
    case KVC_TYPE_Q4_1: dequant_q4_1(src, dst, nb); break;
    case KVC_TYPE_Q5_0: dequant_q5_0(src, dst, nb); break;
    case KVC_TYPE_Q5_1: dequant_q5_1(src, dst, nb); break;
    case KVC_TYPE_Q8_0: dequant_q8_0(src, dst, nb); break;
    case KVC_TYPE_Q4_K: dequant_q4_K(src, dst, nb); break;
    case KVC_TYPE_Q5_K: dequant_q5_K(src, dst, nb); break;
    case KVC_TYPE_Q6_K: dequant_q6_K(src, dst, nb); break;
    case KVC_TYPE_MXFP4: dequant_mxfp4(src, dst, nb); break;
    default: break;
    }
}

/* --------------------------------------------------- reference quantization
 *
 * Round-to-nearest quantizers. The block-32 ones use the formats' canonical
 * reference formulas (the same as ggml's quantize_row_*_ref), so a row
 * quantizes to the same bytes as with ggml. The K-quant ones are our own
 * simple fits: a small search of the sub-block grid followed by a
 * least-squares refit, then codes recomputed from the stored scales. */

static inline int round_int(float v) { return (int)lrintf(v); }  /* ties to even */
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The element of largest magnitude (its sign kept), first one on ties. */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void min_max(const float *x, int n, float *lo, float *hi)
{
    *lo = x[0];
    *hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < *lo) *lo = x[j];
        if (x[j] > *hi) *hi = x[j];
    }
}

static void quant_q4_0(const float *x, block_q4_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8.0f;   /* the extreme maps to q = 0 */
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b->d = kvc_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int lo = KVC_MIN(15, (int)(x[j] * id + 8.5f));
            int hi = KVC_MIN(15, (int)(x[j + QK4_0 / 2] * id + 8.5f));
            b->qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

static void quant_q4_1(const float *x, block_q4_1 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK4_1) {
        float lo, hi;
        min_max(x, QK4_1, &lo, &hi);
        const float d = (hi - lo) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b->d = kvc_fp32_to_fp16(d);
        b->m = kvc_fp32_to_fp16(lo);
        for (int j = 0; j < QK4_1 / 2; j++) {
            int q0 = KVC_MIN(15, (int)((x[j] - lo) * id + 0.5f));
            int q1 = KVC_MIN(15, (int)((x[j + QK4_1 / 2] - lo) * id + 0.5f));
            b->qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

/* Store 5-bit codes q[0..32) as Q5_* nibbles plus the qh bit field. */
static void pack_q5(const int q[32], uint8_t qs[16], uint8_t qh[4])
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
        h |= (uint32_t)(q[j] >> 4) << j;
        h |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        qh[k] = (uint8_t)(h >> (8 * k));
}

static void quant_q5_0(const float *x, block_q5_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[QK5_0];
        b->d = kvc_fp32_to_fp16(d);
        for (int j = 0; j < QK5_0; j++)
            q[j] = KVC_MIN(31, (int)(x[j] * id + 16.5f));
        pack_q5(q, b->qs, b->qh);
    }
}

static void quant_q5_1(const float *x, block_q5_1 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK5_1) {
        float lo, hi;
        min_max(x, QK5_1, &lo, &hi);
        const float d = (hi - lo) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[QK5_1];
        b->d = kvc_fp32_to_fp16(d);
        b->m = kvc_fp32_to_fp16(lo);
        for (int j = 0; j < QK5_1; j++)
            q[j] = KVC_MIN(31, (int)((x[j] - lo) * id + 0.5f));
        pack_q5(q, b->qs, b->qh);
    }
}

static void quant_q8_0(const float *x, block_q8_0 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = KVC_MAX(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b->d = kvc_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++)
            b->qs[j] = (int8_t)roundf(x[j] * id);      /* ties away from zero, as ggml */
    }
}

/* |x - v d| for the value v of magnitude index k (0-7) on x's side (neg:
 * x < 0), as best_index_mxfp4 measures it. */
static inline float mxfp4_err(float x, float d, int k, bool neg)
{
    const float v = (float)kvc_mxfp4_values[k] * d;
    return neg ? fabsf(x + v) : fabsf(x - v);
}

/* The code of the value nearest x / d (the lower code on a tie), as ggml's
 * best_index_mxfp4, which measures |x - v d| for all 16 codes in order and
 * keeps the first least. Here only x's side is searched (the other side's
 * errors are no smaller, and its codes come later, but for value 0, code 0):
 * from m, the largest magnitude <= |x|, the rounded error does not grow
 * towards m and does not shrink away from m + 1, so the first least is the
 * lowest magnitude whose error equals m's (usually m itself; in a block
 * whose scale dwarfs nothing, e.g. next to an infinity, all are equal), or
 * m + 1 if strictly less. NaN and infinities get code 0, as there. */
static uint8_t mxfp4_code(float x, float d)
{
    const float ax = fabsf(x);
    if (!(ax < INFINITY))
        return 0;
    const bool neg = x < 0.0f;
    int m = 0;
    while (m < 7 && (float)kvc_mxfp4_values[m + 1] * d <= ax)
        m++;
    const float err = mxfp4_err(x, d, m, neg);
    int k = m;
    while (k > 0 && mxfp4_err(x, d, k - 1, neg) == err)
        k--;
    if (m < 7 && mxfp4_err(x, d, m + 1, neg) < err)
        k = m + 1;
    return (uint8_t)(k == 0 ? 0 : neg ? 8 + k : k);
}

/* The shared exponent puts the block's largest magnitude in [4, 8) times
 * 2^(e - 128), so it maps onto the top codes (6 and its neighbours). */
static void quant_mxfp4(const float *x, block_mxfp4 *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            amax = KVC_MAX(amax, fabsf(x[j]));
        const int e = amax > 0.0f ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
        b->e = (uint8_t)(e < 0 ? 0 : e > 254 ? 254 : e);
        const float d = kvc_e8m0_half(b->e);
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            b->qs[j] = (uint8_t)(mxfp4_code(x[j], d) | mxfp4_code(x[j + QK_MXFP4 / 2], d) << 4);
    }
}

/* Fit x[0..n) ~ scale * L - mn with integer L in [0, nmax], scale >= 0 and
 * mn >= 0 (a K-quant sub-block). Tries grids slightly finer and coarser than
 * the min-max one; for each, the least-squares (scale, mn) of its codes; keeps
 * the one of least squared error. Returns scale; *mn_out gets mn. */
static float fit_affine(const float *x, int n, int nmax, float *mn_out)
{
    float lo, hi;
    min_max(x, n, &lo, &hi);
    if (lo > 0.0f)
        lo = 0.0f;                    /* the offset can only be subtracted */
    *mn_out = -lo;
    if (!(hi > lo))
        return 0.0f;
    float best_s = (hi - lo) / (float)nmax, best_m = -lo;
    double best_err = INFINITY;
    for (int step = -8; step <= 8; step++) {
        const float is = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        int L[QK_K];
        double sl = 0, sll = 0, sx = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            L[i] = clampi(round_int((x[i] - lo) * is), 0, nmax);
            sl += L[i];
            sll += (double)L[i] * L[i];
            sx += x[i];
            sxl += (double)x[i] * L[i];
        }
        const double det = n * sll - sl * sl;
        if (det <= 0)
            continue;
        double s = (n * sxl - sl * sx) / det, off = (sll * sx - sl * sxl) / det;
        if (off > 0) {                /* mn would be negative: fit scale alone */
            off = 0;
            s = sxl / sll;
        }
        if (s <= 0)
            continue;
        double err = 0;
        for (int i = 0; i < n; i++) {
            double e = s * L[i] + off - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = (float)s;
            best_m = (float)-off;
        }
    }
    *mn_out = best_m;
    return best_s;
}

/* 6-bit code of v on a grid of step d (0 when d is 0). */
static inline int code6(float v, float d) { return d > 0.0f ? clampi(round_int(v / d), 0, 63) : 0; }

/* Q4_K and Q5_K share everything but the code width and the packing. */
static void quant_k_affine(const float *x, uint8_t scales[K_SCALE_SIZE], kvc_fp16 *d_out,
                           kvc_fp16 *dmin_out, int nmax, int L[QK_K])
{
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        sc[j] = fit_affine(x + 32 * j, 32, nmax, &mn[j]);
        max_sc = KVC_MAX(max_sc, sc[j]);
        max_mn = KVC_MAX(max_mn, mn[j]);
    }
    *d_out = kvc_fp32_to_fp16(max_sc / 63.0f);
    *dmin_out = kvc_fp32_to_fp16(max_mn / 63.0f);
    const float d = kvc_fp16_to_fp32(*d_out), dmin = kvc_fp16_to_fp32(*dmin_out);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)code6(sc[j], d);
        lm[j] = (uint8_t)code6(mn[j], dmin);
    }
    for (int j = 0; j < 4; j++) {
        scales[j]     = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((ls[j + 4] & 0x0f) | (lm[j + 4] & 0x0f) << 4);
    }
    /* codes from the scales as stored, so dequantization sees what we fit */
    for (int j = 0; j < 8; j++) {
        const float ds = d * (float)ls[j], dm = dmin * (float)lm[j];
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = ds > 0.0f ? clampi(round_int((x[32 * j + i] + dm) / ds), 0, nmax) : 0;
    }
}

static void quant_q4_K(const float *x, block_q4_K *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK_K) {
        int L[QK_K];
        quant_k_affine(x, b->scales, &b->d, &b->dmin, 15, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b->qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
    }
}

static void quant_q5_K(const float *x, block_q5_K *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK_K) {
        int L[QK_K];
        quant_k_affine(x, b->scales, &b->d, &b->dmin, 31, L);
        memset(b->qh, 0, sizeof(b->qh));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                b->qs[32 * c + l] = (uint8_t)((lo & 0x0f) | (hi & 0x0f) << 4);
                b->qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
            }
    }
}

/* Signed scale for 16 values, codes in [-32, 31]: the larger-magnitude
 * extreme maps to -32; then a least-squares refit of the scale to those codes
 * if it lowers the error. */
static float fit_symmetric16(const float *x)
{
    const float max = signed_absmax(x, 16);
    if (max == 0.0f)
        return 0.0f;
    float s0 = max / -32.0f;
    double sxl = 0, sll = 0, e0 = 0;
    for (int i = 0; i < 16; i++) {
        int l = clampi(round_int(x[i] / s0), -32, 31);
        sxl += (double)x[i] * l;
        sll += (double)l * l;
        e0 += ((double)s0 * l - x[i]) * ((double)s0 * l - x[i]);
    }
    float s1 = (float)(sxl / sll);
    double e1 = 0;
    for (int i = 0; i < 16; i++) {
        int l = clampi(round_int(x[i] / s1), -32, 31);
        e1 += ((double)s1 * l - x[i]) * ((double)s1 * l - x[i]);
    }
    return e1 < e0 ? s1 : s0;
}

static void quant_q6_K(const float *x, block_q6_K *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b++, x += QK_K) {
        float sc[16], amax = 0.0f;
        for (int s = 0; s < 16; s++) {
            sc[s] = fit_symmetric16(x + 16 * s);
            amax = KVC_MAX(amax, fabsf(sc[s]));
        }
        b->d = kvc_fp32_to_fp16(amax / 127.0f);
        const float d = kvc_fp16_to_fp32(b->d);
        int L[QK_K];
        for (int s = 0; s < 16; s++) {
            b->scales[s] = (int8_t)(d > 0.0f ? clampi(round_int(sc[s] / d), -127, 127) : 0);
            const float ds = d * (float)b->scales[s];
            for (int j = 0; j < 16; j++)
                L[16 * s + j] = (ds != 0.0f ? clampi(round_int(x[16 * s + j] / ds), -32, 31) : 0) + 32;
        }
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            const int *q = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l]      = (uint8_t)((q[l] & 0x0f) | (q[l + 64] & 0x0f) << 4);
                ql[l + 32] = (uint8_t)((q[l + 32] & 0x0f) | (q[l + 96] & 0x0f) << 4);
                qh[l] = (uint8_t)(q[l] >> 4 | (q[l + 32] >> 4) << 2 | (q[l + 64] >> 4) << 4 |
                                  (q[l + 96] >> 4) << 6);
            }
        }
    }
}

size_t kvc_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n)
{
    const kvc_type_traits *t = kvc_type_info(type);
    if (!t || !t->supported || n <= 0 || n % t->block_size != 0)
        return 0;
    const int64_t nb = n / t->block_size;
    switch (type) {
    case KVC_TYPE_F32:  memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KVC_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            ((kvc_fp16 *)dst)[i] = kvc_fp32_to_fp16(src[i]);
        break;
    case KVC_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            ((kvc_bf16 *)dst)[i] = kvc_fp32_to_bf16(src[i]);
        break;
    case KVC_TYPE_Q4_0: quant_q4_0(src, dst, nb); break;
    case KVC_TYPE_Q4_1: quant_q4_1(src, dst, nb); break;
    case KVC_TYPE_Q5_0: quant_q5_0(src, dst, nb); break;
    case KVC_TYPE_Q5_1: quant_q5_1(src, dst, nb); break;
    case KVC_TYPE_Q8_0: quant_q8_0(src, dst, nb); break;
    case KVC_TYPE_Q4_K: quant_q4_K(src, dst, nb); break;
    case KVC_TYPE_Q5_K: quant_q5_K(src, dst, nb); break;
    case KVC_TYPE_Q6_K: quant_q6_K(src, dst, nb); break;
    case KVC_TYPE_MXFP4: quant_mxfp4(src, dst, nb); break;
    default: return 0;
    }
    return (size_t)nb * t->type_size;
}
