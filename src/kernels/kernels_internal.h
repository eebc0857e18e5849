/* kernels_internal.h - what the per-ISA kernel files share with the dispatcher
 * in kernels.c. Not part of any other module's interface.
 *
 * Each ISA provides one table of kernels. A table may be referenced on any
 * CPU, but its functions may only be called when the CPU supports the ISA:
 * kernels.c checks that once (kvc_kernels_isa) before it calls through. */
#ifndef KVC_KERNELS_INTERNAL_H
#define KVC_KERNELS_INTERNAL_H

#include "kernels.h"

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

#endif
