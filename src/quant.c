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
    [39]            = { "mxfp4",   32,   17,               false },
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
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (man << 13));
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
