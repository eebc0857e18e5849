/* kernels.c - run-time ISA selection, dispatch, and the scalar reference kernels.
 *
 * The scalar kernels define the reference arithmetic every SIMD path is tested
 * against (with a tolerance: each ISA fixes its own order of float operations,
 * see kernels_avx2.c and kernels_avx512.c). */
#include "attention.h"
#include "kernels_int8.h"

#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* --------------------------------------------------------- ISA selection */

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static kvc_isa isa_best = KVC_ISA_SCALAR;              /* set once by isa_init */
static _Atomic(const kvc_kernel_ops *) isa_ops = NULL; /* the table in use */
static _Atomic int isa_current = KVC_ISA_SCALAR;

static int isa_from_name(const char *s)
{
    if (strcasecmp(s, "scalar") == 0) return KVC_ISA_SCALAR;
    if (strcasecmp(s, "avx2") == 0)   return KVC_ISA_AVX2;
    if (strcasecmp(s, "avx512") == 0) return KVC_ISA_AVX512;
    if (strcasecmp(s, "vnni") == 0)   return KVC_ISA_VNNI;
    return -1;
}

/* F16C from CPUID directly: not every compiler's __builtin_cpu_supports knows it. */
static bool cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static void isa_init(void)
{
    __builtin_cpu_init();
    kvc_isa best = KVC_ISA_SCALAR;
    /* The compiler runtime's checks include the OS saving the ymm/zmm state
     * (XGETBV); F16C needs no more than AVX's. */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
        best = KVC_ISA_AVX2;
    if (best == KVC_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        best = KVC_ISA_AVX512;
    if (best == KVC_ISA_AVX512 && __builtin_cpu_supports("avx512vnni"))
        best = KVC_ISA_VNNI;
    isa_best = best;

    /* The best level the CPU has. On Zen 5 vnni's integer prefill is ~1.5x
     * avx512's float one (bench/bench_kernels.c); its decode is 1.5x on Q5_0,
     * ~1.2x on Q4_0 and Q4_K, ~1.1x on Q6_K, about even on Q8_0 (one thread,
     * cold). */
    kvc_isa use = best;
    const char *env = getenv("KVC_ISA");     /* any level the CPU has; unknown names ignored */
    int want = env ? isa_from_name(env) : -1;
    if (want >= 0 && want <= (int)best)
        use = (kvc_isa)want;
    atomic_store(&isa_current, (int)use);
    atomic_store(&isa_ops, kvc_kernel_ops_for(use));
}

static inline const kvc_kernel_ops *ops(void)
{
    const kvc_kernel_ops *o = atomic_load_explicit(&isa_ops, memory_order_acquire);
    if (o)
        return o;
    pthread_once(&isa_once, isa_init);
    return atomic_load(&isa_ops);
}

/* vnni: the AVX-512 vector kernels with its own matmul. Built once; read-only
 * afterwards. */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static kvc_kernel_ops ops_vnni, ops_avx2;

static void tables_init(void)
{
    ops_vnni = kvc_kernels_avx512;
    ops_vnni.matmul_rows = kvc_vnni_matmul_rows;
    ops_vnni.matmul_scratch_floats = kvc_vnni_scratch_floats;
    ops_vnni.act_quantize = kvc_i8_vnni.quantize;
    ops_vnni.matmul_act = kvc_i8_vnni.matmul_act;
    ops_vnni.act_type_ok = kvc_i8_vnni.type_ok;
    ops_vnni.act_prefill_min_tok = KVC_VNNI_PREFILL_MIN_TOK;
    ops_vnni.act_prefill_rows = KVC_VNNI_PREFILL_ROWS;
    /* avx2: the AVX2 vector kernels with the integer matmul of kernels_avx2_int8.c
     * (which keeps kvc_kernels_avx2's float matmul for the types it does not take) */
    ops_avx2 = kvc_kernels_avx2;
    ops_avx2.matmul_rows = kvc_avx2_i8_matmul_rows;
    ops_avx2.matmul_scratch_floats = kvc_avx2_i8_scratch_floats;
    ops_avx2.act_quantize = kvc_i8_avx2.quantize;
    ops_avx2.matmul_act = kvc_i8_avx2.matmul_act;
    ops_avx2.act_type_ok = kvc_i8_avx2.type_ok;
    ops_avx2.act_prefill_min_tok = KVC_AVX2_I8_PREFILL_MIN_TOK;
    ops_avx2.act_prefill_rows = KVC_AVX2_I8_PREFILL_ROWS;
}

const kvc_kernel_ops *kvc_kernel_ops_for(kvc_isa isa)
{
    pthread_once(&tables_once, tables_init);
    switch (isa) {
    case KVC_ISA_VNNI:   return &ops_vnni;
    case KVC_ISA_AVX512: return &kvc_kernels_avx512;
    case KVC_ISA_AVX2:   return &ops_avx2;
    default:             return &kvc_kernels_scalar;
    }
}

kvc_isa kvc_kernels_isa(void)
{
    pthread_once(&isa_once, isa_init);
    return (kvc_isa)atomic_load(&isa_current);
}

/* Raised whenever a kernel's bits change on some ISA (a new order of
 * operations, another scheme), so that caches written before are not reused. */
#define KVC_ARITH_VERSION 5   /* 5: MXFP4 joins the integer scheme */

uint64_t kvc_kernels_arith_id(void)
{
    return (uint64_t)KVC_ARITH_VERSION << 8 | (uint64_t)kvc_kernels_isa();
}

const char *kvc_isa_name(kvc_isa isa)
{
    switch (isa) {
    case KVC_ISA_SCALAR: return "scalar";
    case KVC_ISA_AVX2:   return "avx2";
    case KVC_ISA_AVX512: return "avx512";
    case KVC_ISA_VNNI:   return "vnni";
    }
    return "unknown";
}

int kvc_kernels_set_isa(kvc_isa isa)
{
    pthread_once(&isa_once, isa_init);
    if ((int)isa < KVC_ISA_SCALAR || isa > KVC_ISA_VNNI)
        return KVC_ERR_INVALID_ARG;
    if (isa > isa_best)
        return KVC_ERR_UNSUPPORTED;
    atomic_store(&isa_current, (int)isa);
    atomic_store(&isa_ops, kvc_kernel_ops_for(isa));
    return KVC_OK;
}

/* -------------------------------------------------------------- dispatch */

size_t kvc_matmul_scratch_floats(int64_t n_in)
{
    /* The largest need of any ISA this CPU has, so a buffer sized before kvc_kernels_set_isa
     * stays valid (it refuses an ISA the CPU lacks). Only those: each ISA's file is compiled
     * for its ISA, and GCC may use its instructions even in a function that only sizes. */
    pthread_once(&isa_once, isa_init);
    size_t n = 0;
    for (int isa = KVC_ISA_SCALAR; isa <= (int)isa_best; isa++)
        n = KVC_MAX(n, kvc_kernel_ops_for((kvc_isa)isa)->matmul_scratch_floats(n_in));
    return n;
}

void kvc_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    if (n_tok <= 0 || r0 >= r1 || w->n_in <= 0 || !kvc_matmul_type_ok(w->type))
        return;
    ops()->matmul_rows(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
}

/* Prepared activations: the integer scheme's quantized rows (kernels_int8.h),
 * on the ISAs whose table has them (avx2, vnni; not avx512 without VNNI). */
static bool act_isa(void) { return ops()->matmul_act != NULL; }

size_t kvc_matmul_act_bytes(int64_t n_in, int64_t n_tok)
{
    if (n_tok <= 0 || n_in <= 0 || n_in % 32 != 0 || !act_isa())
        return 0;
    return (size_t)n_tok * kvc_i8_act_row_bytes(n_in);
}

bool kvc_matmul_uses_act(const kvc_weight *w)
{
    return act_isa() && ops()->act_type_ok(w->type) && w->n_in > 0 && w->n_in % 32 == 0;
}

int64_t kvc_matmul_act_row_group(int64_t n_tok)
{
    const kvc_kernel_ops *o = ops();
    return o->matmul_act && n_tok >= o->act_prefill_min_tok ? o->act_prefill_rows : 16;
}

void kvc_matmul_act_quantize(int64_t n_in, const float *x, int64_t ldx, int64_t n_tok,
                             int64_t t0, int64_t t1, void *act)
{
    if (act_isa() && n_in > 0 && n_in % 32 == 0 && 0 <= t0 && t0 < t1 && t1 <= n_tok)
        ops()->act_quantize(x, ldx, n_in, t0, t1, act);
}

void kvc_matmul_rows_act(const kvc_weight *w, const void *act, int64_t n_tok, float *y, int64_t ldy,
                         int64_t r0, int64_t r1, float *scratch)
{
    kvc_matmul_rows_act_tok(w, act, NULL, n_tok, y, ldy, r0, r1, scratch);
}

void kvc_matmul_rows_act_tok(const kvc_weight *w, const void *act, const int32_t *tok, int64_t n_tok, float *y,
                             int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    if (n_tok <= 0 || r0 >= r1 || !kvc_matmul_uses_act(w))
        return;
    ops()->matmul_act(w, act, tok, n_tok, y, ldy, r0, r1, scratch);
}

void kvc_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const kvc_type_traits *t = kvc_type_info(type);
    if (!t || !t->supported || n <= 0 || n % t->block_size != 0)
        return;
    ops()->dequantize_row(type, src, dst, n);
}

float kvc_dot_f32(const float *a, const float *b, int64_t n) { return ops()->dot_f32(a, b, n); }
float kvc_dot_f16_f32(const kvc_fp16 *a, const float *b, int64_t n) { return ops()->dot_f16_f32(a, b, n); }
void kvc_axpy_f32(float a, const float *x, float *y, int64_t n) { ops()->axpy_f32(a, x, y, n); }
void kvc_axpy_f16(float a, const kvc_fp16 *x, float *y, int64_t n) { ops()->axpy_f16(a, x, y, n); }
void kvc_fp32_to_fp16_row(const float *x, kvc_fp16 *y, int64_t n) { ops()->fp32_to_fp16_row(x, y, n); }
void kvc_fp16_to_fp32_row(const kvc_fp16 *x, float *y, int64_t n) { ops()->fp16_to_fp32_row(x, y, n); }
void kvc_swiglu(float *g, const float *u, int64_t n) { ops()->swiglu(g, u, n); }
float kvc_gdn_row(float *s, const float *k, const float *q, float decay, float v, float beta, int64_t n)
{
    return ops()->gdn_row(s, k, q, decay, v, beta, n);
}

/* ----------------------------------------------------- scalar reference
 *
 * Scalar order of one dot product of length n: eight partial sums, element k
 * going to sum k % 8 (multiply, then add: two roundings), then the tree
 * s4[i] = p[i] + p[i+4], s2[i] = s4[i] + s4[i+2], result s2[0] + s2[1].
 * The compiler may vectorize these loops; it cannot change the result, since
 * every lane's operations and their order are spelled out. */

static inline float sum_tree8(const float p[8])
{
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

static float scalar_dot_f32(const float *a, const float *b, int64_t n)
{
    float p[8] = { 0 };
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++)
            p[j] += a[k + j] * b[k + j];
    for (int j = 0; k + j < n; j++)
        p[j] += a[k + j] * b[k + j];
    return sum_tree8(p);
}

static float scalar_dot_f16_f32(const kvc_fp16 *a, const float *b, int64_t n)
{
    float p[8] = { 0 };
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++)
            p[j] += kvc_fp16_to_fp32(a[k + j]) * b[k + j];
    for (int j = 0; k + j < n; j++)
        p[j] += kvc_fp16_to_fp32(a[k + j]) * b[k + j];
    return sum_tree8(p);
}

static float scalar_gdn_row(float *s, const float *k, const float *q, float decay, float v, float beta,
                            int64_t n)
{
    float p[8] = { 0 };
    for (int64_t i = 0; i < n; i++) {
        s[i] *= decay;
        p[i % 8] += s[i] * k[i];
    }
    const float d = (v - sum_tree8(p)) * beta;
    memset(p, 0, sizeof(p));
    for (int64_t i = 0; i < n; i++) {
        s[i] += d * k[i];
        p[i % 8] += s[i] * q[i];
    }
    return sum_tree8(p);
}

static void scalar_axpy_f32(float a, const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void scalar_axpy_f16(float a, const kvc_fp16 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * kvc_fp16_to_fp32(x[i]);
}

static void scalar_fp32_to_fp16_row(const float *x, kvc_fp16 *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = kvc_fp32_to_fp16(x[i]);
}

static void scalar_fp16_to_fp32_row(const kvc_fp16 *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = kvc_fp16_to_fp32(x[i]);
}

static void scalar_swiglu(float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float e = fabsf(g[i]) <= 80.0f ? kvc_exp_neg(-fabsf(g[i])) : 0.0f;
        g[i] = (g[i] >= 0.0f ? g[i] : g[i] * e) / (1.0f + e) * u[i];
    }
}

static size_t scalar_scratch_floats(int64_t n_in) { return (size_t)(n_in > 0 ? n_in : 0) + 16; }

/* Row by row: dequantize the row once (into scratch) and dot it with every
 * token. Each y element is scalar_dot_f32(row, token), whatever the batch. */
static void scalar_matmul_rows(const kvc_weight *w, const float *x, int64_t ldx, int64_t n_tok,
                               float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    const uint8_t *base = w->data;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src = base + (size_t)r * w->row_bytes;
        const float *row = scratch;
        if (w->type == KVC_TYPE_F32)
            row = (const float *)(const void *)src;
        else
            kvc_dequantize_row_ref(w->type, src, scratch, w->n_in);
        for (int64_t t = 0; t < n_tok; t++)
            y[t * ldy + r] = scalar_dot_f32(row, x + t * ldx, w->n_in);
    }
}

const kvc_kernel_ops kvc_kernels_scalar = {
    .matmul_rows           = scalar_matmul_rows,
    .matmul_scratch_floats = scalar_scratch_floats,
    .dequantize_row        = kvc_dequantize_row_ref,
    .dot_f32               = scalar_dot_f32,
    .dot_f16_f32           = scalar_dot_f16_f32,
    .axpy_f32              = scalar_axpy_f32,
    .gdn_row               = scalar_gdn_row,
    .axpy_f16              = scalar_axpy_f16,
    .fp32_to_fp16_row      = scalar_fp32_to_fp16_row,
    .fp16_to_fp32_row      = scalar_fp16_to_fp32_row,
    .swiglu                = scalar_swiglu,
};
