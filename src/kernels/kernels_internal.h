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

#endif
