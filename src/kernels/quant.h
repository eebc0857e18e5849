/* quant.h - weight types: ids, block layouts, reference (de)quantization.
 *
 * Type ids and block layouts are GGUF's (ggml's), so files people download load
 * as they are. Every function here is the scalar reference: the SIMD kernels in
 * kernels.h are tested against it. */
#ifndef KVC_QUANT_H
#define KVC_QUANT_H

#include "common.h"

enum kvc_type {
    KVC_TYPE_F32  = 0,
    KVC_TYPE_F16  = 1,
    KVC_TYPE_Q4_0 = 2,
    KVC_TYPE_Q4_1 = 3,
    KVC_TYPE_Q5_0 = 6,
    KVC_TYPE_Q5_1 = 7,
    KVC_TYPE_Q8_0 = 8,
    KVC_TYPE_Q8_1 = 9,
    KVC_TYPE_Q2_K = 10,
    KVC_TYPE_Q3_K = 11,
    KVC_TYPE_Q4_K = 12,
    KVC_TYPE_Q5_K = 13,
    KVC_TYPE_Q6_K = 14,
    KVC_TYPE_Q8_K = 15,
    KVC_TYPE_BF16 = 30,
    KVC_TYPE_MXFP4 = 39,
    KVC_TYPE_COUNT = 40  /* ids below this may be known to GGUF; see kvc_type_traits */
};

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_K  256
#define QK_MXFP4 32
#define K_SCALE_SIZE 12

typedef uint16_t kvc_fp16;  /* IEEE half, raw bits */
typedef uint16_t kvc_bf16;  /* bfloat16, raw bits */

typedef struct { kvc_fp16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;                 /* x = d * (q - 8) */
typedef struct { kvc_fp16 d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;              /* x = d * q + m */
typedef struct { kvc_fp16 d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;  /* x = d * (q - 16) */
typedef struct { kvc_fp16 d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1; /* x = d * q + m */
typedef struct { kvc_fp16 d; int8_t qs[QK8_0]; } block_q8_0;                      /* x = d * q */
typedef struct {                   /* 8 sub-blocks of 32: x = d*sc*q - dmin*m, 6-bit sc/m */
    kvc_fp16 d, dmin;
    uint8_t  scales[K_SCALE_SIZE];
    uint8_t  qs[QK_K / 2];
} block_q4_K;
typedef struct {                   /* as q4_K with a 5th bit in qh */
    kvc_fp16 d, dmin;
    uint8_t  scales[K_SCALE_SIZE];
    uint8_t  qh[QK_K / 8];
    uint8_t  qs[QK_K / 2];
} block_q5_K;
typedef struct {                   /* 16 sub-blocks of 16: x = d * sc * (q - 32), 8-bit sc */
    uint8_t  ql[QK_K / 2];
    uint8_t  qh[QK_K / 4];
    int8_t   scales[QK_K / 16];
    kvc_fp16 d;
} block_q6_K;

/* OCP microscaling FP4 (gpt-oss's experts): x = 2^(e - 127) * E2M1(q), the
 * E2M1 code's value being kvc_mxfp4_values[q] / 2. Element j < 16 is the
 * low nibble of qs[j], element j + 16 its high nibble (as Q4_0). */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 layout");

/* E2M1 values doubled (ggml's kvalues_mxfp4): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
 * their negatives, times 2. */
extern const int8_t kvc_mxfp4_values[16];

/* An MXFP4 block's scale with the E2M1 halving folded in: 2^(e - 128) as a
 * float, exact for every e (e < 2 gives the subnormals), as ggml's
 * GGML_E8M0_TO_FP32_HALF. */
static inline float kvc_e8m0_half(uint8_t e)
{
    union { uint32_t u; float f; } v;
    v.u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return v.f;
}

typedef struct kvc_type_traits {
    const char *name;        /* "q4_K" */
    int         block_size;  /* elements per block (1 for float types) */
    size_t      type_size;   /* bytes per block */
    bool        supported;   /* we can dequantize / compute with it */
} kvc_type_traits;

/* Traits of a ggml type id, or NULL when the id is unknown. A known but
 * unsupported type (Q2_K, IQ*, ...) has traits with supported == false, so a
 * file can be described even when it cannot be run. */
const kvc_type_traits *kvc_type_info(uint32_t type);

/* Bytes taken by n elements of `type`; 0 when n is not a multiple of the block
 * size or the type is unknown. */
size_t kvc_row_size(uint32_t type, int64_t n);

/* Name -> id ("q8_0", "Q4_K", "f16", case-insensitive); -1 when unknown. */
int kvc_type_from_name(const char *name);

float    kvc_fp16_to_fp32(kvc_fp16 h);
kvc_fp16 kvc_fp32_to_fp16(float f);     /* round to nearest even */
float    kvc_bf16_to_fp32(kvc_bf16 h);
kvc_bf16 kvc_fp32_to_bf16(float f);     /* round to nearest even, NaN kept NaN */

/* Sub-block j (of 8) of a Q4_K/Q5_K super-block: 6-bit scale and min packed
 * in 12 bytes. Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of
 * scales 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low nibbles of
 * scales 4-7 (low half) and mins 4-7 (high half). */
static inline void kvc_k4_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m  = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4);
        *m  = (uint8_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
    }
}

/* Reference dequantization of n elements (n a multiple of the block size). */
void kvc_dequantize_row_ref(uint32_t type, const void *src, float *dst, int64_t n);

/* Reference quantization of n elements into `dst` (kvc_row_size bytes).
 * Deterministic; used by make-model and the KV cache's Q8_0 type.
 * Returns bytes written, 0 for an unsupported type or bad n. */
size_t kvc_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n);

#endif
