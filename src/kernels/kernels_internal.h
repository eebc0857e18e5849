/* kernels_internal.h - what the per-ISA kernel files share with the dispatcher
 * in kernels.c. Not part of any other module's interface.
 *
 * Each ISA provides one table of kernels. A table may be referenced on any
 * CPU, but its functions may only be called when the CPU supports the ISA:
 * kernels.c checks that once (kvc_kernels_isa) before it calls through. */
#ifndef KVC_KERNELS_INTERNAL_H
#define KVC_KERNELS_INTERNAL_H

#include "kernels.h"

/* The integer scheme's two steps (kernels_int8.h): token rows [t0, t1) of x
 * quantized into act; y from quantized rows: token t's row is act's row
 * tok[t] (tok NULL: row t), so a subset of a batch's rows quantized once
 * serves without a copy (an expert's tokens, forward_moe.c). */
typedef void kvc_act_quantize_fn(const float *x, int64_t ldx, int64_t n_in, int64_t t0, int64_t t1,
                                 uint8_t *act);
typedef void kvc_matmul_act_fn(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok,
                               float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch);

/* The weight types an ISA's matmul_act takes. */
typedef bool kvc_act_type_ok_fn(uint32_t type);

typedef struct kvc_kernel_ops {
    void   (*matmul_rows)(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                          float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch);
    size_t (*matmul_scratch_floats)(int64_t n_in);
    void   (*dequantize_row)(uint32_t type, const void *src, float *dst, int64_t n);
    float  (*dot_f32)(const float *a, const float *b, int64_t n);
    float  (*dot_f16_f32)(const kvc_fp16 *a, const float *b, int64_t n);
    void   (*axpy_f32)(float a, const float *x, float *y, int64_t n);
    void   (*axpy_f16)(float a, const kvc_fp16 *x, float *y, int64_t n);
    void   (*fp32_to_fp16_row)(const float *x, kvc_fp16 *y, int64_t n);
    void   (*fp16_to_fp32_row)(const kvc_fp16 *x, float *y, int64_t n);
    void   (*swiglu)(float *g, const float *u, int64_t n);
    float  (*gdn_row)(float *s, const float *k, const float *q, float decay, float v, float beta,
                      int64_t n);
    /* The integer scheme's prepared activations (kernels_int8.h): NULL / 0 on
     * the ISAs of the float scheme. From act_prefill_min_tok tokens on,
     * matmul_act takes act_prefill_rows rows at a time (kvc_matmul_act_row_group),
     * for the weight types act_type_ok takes. */
    kvc_act_quantize_fn *act_quantize;
    kvc_matmul_act_fn   *matmul_act;
    kvc_act_type_ok_fn  *act_type_ok;
    int64_t act_prefill_min_tok, act_prefill_rows;
} kvc_kernel_ops;

extern const kvc_kernel_ops kvc_kernels_scalar;   /* kernels.c */
extern const kvc_kernel_ops kvc_kernels_avx2;     /* kernels_avx2.c */
extern const kvc_kernel_ops kvc_kernels_avx512;   /* kernels_avx512.c */

/* The ops table of `isa` (no CPU check). */
const kvc_kernel_ops *kvc_kernel_ops_for(kvc_isa isa);

/* Weight types every ISA's matmul handles: the supported types of quant.h. */
static inline bool kvc_matmul_type_ok(uint32_t type)
{
    const kvc_type_traits *t = kvc_type_info(type);
    return t && t->supported;
}

/* Decode row order for float weights (F32, F16, BF16), shared by the SIMD
 * files. Their decode is one load and one multiply-add per weight, so its
 * speed is the memory's, and the hardware prefetchers give that only to a few
 * long sequential streams: rows read side by side from one block of adjacent
 * rows (1.8 KiB apart for n_in = 896, several in one 4 KiB page) reach about
 * 25 GB/s on one Zen 5 core where a plain sequential read reaches 41.
 *
 * So the rows [r0, r1) are cut into KVC_LANES chunks of `stride` consecutive
 * rows, and step g of a decode kernel reads row r0 + j * stride + g in lane j:
 * each lane walks its chunk in memory order. Only the row order changes; every
 * row's dot product keeps its ISA's fixed sequence (kernels.h). */
#define KVC_LANES 4

static inline int64_t kvc_lane_stride(int64_t r0, int64_t r1)
{
    return (r1 - r0 + KVC_LANES - 1) / KVC_LANES;
}

/* The rows of step g (0 <= g < kvc_lane_stride(r0, r1)): row[j] is lane j's
 * row, or -1 when its chunk has ended; rows[j] is where to read, lane 0's row
 * for a lane that has none (always valid: g < stride <= r1 - r0). */
static inline void kvc_lane_rows(const kvc_weight *w, int64_t r0, int64_t r1, int64_t g,
                                 const uint8_t *rows[KVC_LANES], int64_t row[KVC_LANES])
{
    const int64_t stride = kvc_lane_stride(r0, r1);
    for (int j = 0; j < KVC_LANES; j++) {
        const int64_t r = r0 + j * stride + g;
        row[j] = r < r1 ? r : -1;
        rows[j] = (const uint8_t *)w->data + (size_t)(r < r1 ? r : r0 + g) * w->row_bytes;
    }
}


/* One decode kernel step: the dot products of x with the KVC_LANES rows. */
typedef void (*kvc_lanes_fn)(const uint8_t *const rows[KVC_LANES], const float *x, int64_t n,
                             float dot[KVC_LANES]);

/* y[t][r] for r in [r0, r1), t < n_tok, with fn, lane by lane as above. */
static inline void kvc_matmul_lanes(kvc_lanes_fn fn, const kvc_weight *w, const float *x, int64_t ldx,
                                    int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1)
{
    for (int64_t g = 0; g < kvc_lane_stride(r0, r1); g++) {
        const uint8_t *rows[KVC_LANES];
        int64_t row[KVC_LANES];
        kvc_lane_rows(w, r0, r1, g, rows, row);
        for (int64_t t = 0; t < n_tok; t++) {
            float dot[KVC_LANES];
            fn(rows, x + t * ldx, w->n_in, dot);
            for (int j = 0; j < KVC_LANES; j++)
                if (row[j] >= 0)
                    y[t * ldy + row[j]] = dot[j];
        }
    }
}


/* The decode steps of the float weight types and lanes_for(type), their table
 * (NULL for other types), from an ISA file's inline
 * lanes_float(kind, rows, x, n, dot) and its kinds W_F32, W_F16, W_BF16. */
#define KVC_FLOAT_LANES(lanes_float)                                                                  \
    static void lanes_f32(const uint8_t *const rows[KVC_LANES], const float *x, int64_t n,            \
                          float dot[KVC_LANES])                                                       \
    {                                                                                                 \
        lanes_float(W_F32, rows, x, n, dot);                                                          \
    }                                                                                                 \
    static void lanes_f16(const uint8_t *const rows[KVC_LANES], const float *x, int64_t n,            \
                          float dot[KVC_LANES])                                                       \
    {                                                                                                 \
        lanes_float(W_F16, rows, x, n, dot);                                                          \
    }                                                                                                 \
    static void lanes_bf16(const uint8_t *const rows[KVC_LANES], const float *x, int64_t n,           \
                           float dot[KVC_LANES])                                                      \
    {                                                                                                 \
        lanes_float(W_BF16, rows, x, n, dot);                                                         \
    }                                                                                                 \
    static kvc_lanes_fn lanes_for(uint32_t type)                                                      \
    {                                                                                                 \
        return type == KVC_TYPE_F32 ? lanes_f32 : type == KVC_TYPE_F16 ? lanes_f16                    \
               : type == KVC_TYPE_BF16 ? lanes_bf16 : NULL;                                           \
    }

#endif
