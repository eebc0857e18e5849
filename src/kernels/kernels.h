/* kernels.h - the arithmetic: matrix multiplication per weight type and the
 * vector kernels of attention, each with a scalar reference and SIMD paths
 * (AVX2, AVX-512) picked at run time.
 *
 * The fidelity rule (DESIGN.md §3) is built here. For a given ISA the value of
 * every output element is a fixed function of its weight row and its one
 * activation row: it does not depend on how many tokens are in the batch, where
 * in the batch the token is, or which rows a thread was given. Prefill (many
 * tokens) and decode (one token) therefore give bitwise-equal results.
 *
 * Activations are float32. On the scalar and avx512 ISAs quantized weights
 * are dequantized exactly (as the GGUF format defines them) to float32 and
 * multiplied in float32. On the avx2 and vnni ISAs the weight types
 * kernels_int8.h's SIMD kernels cover (Q8_0, Q4_0, Q5_0, Q4_K, Q6_K, MXFP4; on avx2
 * also Q4_1, Q5_1, Q5_K) use an integer scheme instead: each activation row
 * is quantized to ~16 bits per 32-element block (two int8 planes; results
 * within ~1e-5 of float32), dot products are exact int32, and the per-block
 * float scaling follows one fixed order, so prefill and decode kernels give
 * the same bits. Other weight types keep the float path. */
#ifndef KVC_KERNELS_H
#define KVC_KERNELS_H

#include "common.h"
#include "quant.h"

typedef enum kvc_isa {
    KVC_ISA_SCALAR = 0,
    KVC_ISA_AVX2   = 1,   /* AVX2 + FMA + F16C; the integer scheme (kernels_int8.h) */
    KVC_ISA_AVX512 = 2,   /* AVX-512 F/BW/VL/DQ */
    KVC_ISA_VNNI   = 3,   /* avx512 + AVX512-VNNI: the integer scheme (kernels_int8.h) */
} kvc_isa;

/* The ISA the kernels use: the best the CPU supports, unless the environment
 * variable KVC_ISA=scalar|avx2|avx512|vnni asks for a lower level it has.
 * Vector kernels other than matmul are avx512's on vnni (test
 * isa >= KVC_ISA_AVX512, not ==). Thread-safe. */
kvc_isa kvc_kernels_isa(void);
const char *kvc_isa_name(kvc_isa isa);
/* Force an ISA (tests, benchmarks); returns KVC_ERR_UNSUPPORTED if the CPU
 * lacks it. Not while other threads run kernels. */
int kvc_kernels_set_isa(kvc_isa isa);

/* The identity of the arithmetic the current ISA performs: the ISA and the
 * version of the kernels' order of operations. Two processes whose ids are
 * equal compute the same bits for the same model and tokens; KV blocks kept
 * beyond the process (disk, Redis) carry it in their keys (prefix_cache.c),
 * so that a cache written by another ISA, or by a build whose kernels round
 * differently, is never taken for a fresh computation. */
uint64_t kvc_kernels_arith_id(void);

/* A 2-D weight matrix as stored in the file: n_out rows of n_in elements. */
typedef struct kvc_weight {
    uint32_t    type;       /* enum kvc_type */
    int64_t     n_in;       /* row length (GGUF ne[0]) */
    int64_t     n_out;      /* rows (GGUF ne[1]) */
    size_t      row_bytes;  /* kvc_row_size(type, n_in) */
    const void *data;       /* n_out * row_bytes bytes */
} kvc_weight;

/* Floats of scratch one thread needs for kvc_matmul_rows on rows of n_in. */
size_t kvc_matmul_scratch_floats(int64_t n_in);

/* y[t * ldy + r] = sum_k W[r][k] * x[t * ldx + k]  for t in [0, n_tok), r in [r0, r1).
 * x: float32 activations (n_tok rows of W->n_in, stride ldx >= n_in).
 * scratch: kvc_matmul_scratch_floats(W->n_in) floats, 64-byte aligned, owned by the
 * calling thread. Writes only the y elements named. See the invariance rule above. */
void kvc_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch);

/* Prepared activations (optional). On the vnni ISA kvc_matmul_rows quantizes
 * its activations on every call, that is once per row range. A caller
 * splitting one product into many row ranges can quantize once:
 *
 *   size_t n = kvc_matmul_act_bytes(n_in, n_tok);
 *       bytes for n_tok rows of n_in; 0 when this ISA never uses them.
 *       A buffer sized for (max n_in, max n_tok) serves any smaller call.
 *   if (n && kvc_matmul_uses_act(w)) {
 *       kvc_matmul_act_quantize(n_in, x, ldx, n_tok, t0, t1, act);
 *           tokens [t0, t1); calls for disjoint ranges covering [0, n_tok)
 *           may run on different threads at once.
 *       kvc_matmul_rows_act(w, act, n_tok, y, ldy, r0, r1, scratch);
 *           then any row ranges: bitwise equal to kvc_matmul_rows.
 *   }
 *
 * act: 64-byte aligned, owned by the caller. It depends on x, n_in and n_tok
 * only, so weights of equal n_in (Q, K and V; gate and up) may share one.
 * The ISA must not change in between. */
size_t kvc_matmul_act_bytes(int64_t n_in, int64_t n_tok);
bool kvc_matmul_uses_act(const kvc_weight *w);
/* Rows kvc_matmul_rows_act takes at a time for n_tok tokens: row ranges in
 * multiples of it leave no group partly empty. */
int64_t kvc_matmul_act_row_group(int64_t n_tok);
void kvc_matmul_act_quantize(int64_t n_in, const float *x, int64_t ldx, int64_t n_tok,
                             int64_t t0, int64_t t1, void *act);
void kvc_matmul_rows_act(const kvc_weight *w, const void *act, int64_t n_tok, float *y, int64_t ldy,
                         int64_t r0, int64_t r1, float *scratch);
/* The same for a subset of act's rows, without copying them: token t of the
 * product is act's row tok[t] (tok NULL: row t), y's row t. Bitwise
 * kvc_matmul_rows on those rows of x (a mixture of experts quantizes its
 * batch once and hands each expert its tokens' rows). */
void kvc_matmul_rows_act_tok(const kvc_weight *w, const void *act, const int32_t *tok, int64_t n_tok, float *y,
                             int64_t ldy, int64_t r0, int64_t r1, float *scratch);

/* Dequantize n elements (a multiple of the block size) of a row to float32 with
 * the selected ISA. Bitwise equal to kvc_dequantize_row_ref. */
void kvc_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* Dot products for attention, fixed reduction order for a given ISA and n. */
float kvc_dot_f32(const float *a, const float *b, int64_t n);
float kvc_dot_f16_f32(const kvc_fp16 *a, const float *b, int64_t n);
/* y[i] += a * x[i] */
void kvc_axpy_f32(float a, const float *x, float *y, int64_t n);
void kvc_axpy_f16(float a, const kvc_fp16 *x, float *y, int64_t n);
/* One row of a Gated DeltaNet head's state (forward_gdn.c), in place, n the
 * head size:
 *   s[i] *= decay;  kv = sum_i s[i] k[i];  d = (v - kv) * beta;
 *   s[i] += d * k[i];  returns sum_i s[i] q[i]
 * in two passes over s. A fixed order per ISA and n: the scalar reference
 * multiplies then adds (two roundings) and sums as kvc_dot_f32's reference
 * (eight partial sums); the SIMD paths use fused multiply-adds, one lane per
 * element of their width, and their horizontal sum. */
float kvc_gdn_row(float *s, const float *k, const float *q, float decay, float v, float beta, int64_t n);
/* The FFN's SwiGLU in place: g[i] = silu(g[i]) * u[i], the same bits on every
 * ISA:
 *   e = |g| <= 80 ? kvc_exp_neg(-|g|) : 0     (= exp(-|g|), attention.h's exp,
 *                                              every step spelled out)
 *   s = (g >= 0 ? g : g * e) / (1 + e)        (silu: g / (1 + exp(-g)))
 *   g = s * u
 * Past |g| = 80, exp(-|g|) < 2e-35 changes nothing next to 1, and g * e
 * (|silu(g)| < 1e-32 there) becomes -0. No step overflows for finite g. */
void kvc_swiglu(float *g, const float *u, int64_t n);
/* Convert n floats to fp16 (round to nearest even) and back. */
void kvc_fp32_to_fp16_row(const float *x, kvc_fp16 *y, int64_t n);
void kvc_fp16_to_fp32_row(const kvc_fp16 *x, float *y, int64_t n);

#endif
