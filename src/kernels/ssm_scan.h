/* ssm_scan.h - the per-token kernels of the recurrent mixers (ARCHITECTURES.md
 * §3.4-§3.6), each with a scalar reference and an AVX2 path chosen at run time
 * (kvc_kernels_isa). Every path gives the same bits, so a state does not
 * depend on the ISA level in use.
 *
 * The Mamba-2 selective-scan step of one head for one token (ggml_ssm_scan's
 * inner loop):
 *   for each row r < hd of the head's state S [hd][N]:
 *     S[r][k] = S[r][k] * dA + B[k] * (x[r] * dt)     (multiply, multiply, add)
 *     y[r]    = sum over k of S[r][k] * C[k]          (kernels.c's order: eight
 *               partial sums, k going to sum k % 8, then the tree
 *               ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)))
 * WHY no AVX-512 path: the loop streams the state once per token (load, two
 * multiplies, add, store per element); on Zen 4 a 512-bit operation takes the
 * same 256-bit units twice, so 16 lanes gained nothing measurable over 8.
 *
 * The causal convolution of one token (ggml_ssm_conv; the short convolution of
 * lfm2, Mamba-2's and Gated DeltaNet's conv), channel by channel:
 *   x = u[ch], or u[ch] * u_mul[ch] when there is a u_mul (lfm2's b * x)
 *   acc = 0;  acc = acc + w[k][ch] * s_k  for k = 0 .. K-1      (multiply, add)
 *     where s_0 .. s_{K-2} are the state's rows (oldest first) and s_{K-1} = x
 *   acc = acc + bias[ch]                        (when there is a bias)
 *   acc = silu(acc)                             (when asked), with
 *     e = |a| <= 80 ? kvc_exp_neg(-|a|) : 0,  silu(a) = (a >= 0 ? a : a * e) / (1 + e)
 *     (kernels.h's kvc_swiglu with u = 1)
 *   y[ch] = acc, or acc * y_mul[ch] when there is a y_mul (lfm2's gate c)
 *   the state moves on: row k takes row k + 1, row K-2 takes x.
 * Channels are independent, so the SIMD path runs 8 of them per vector with
 * exactly these operations. */
#ifndef KVC_SSM_SCAN_H
#define KVC_SSM_SCAN_H

#include "kernels.h"

#include <stdbool.h>

/* One token's step of one head: S [hd][N] updated in place, y [hd] written.
 * x [hd], B [N], C [N]. */
void kvc_ssm_scan_head(float *S, const float *x, const float *B, const float *C, float dA, float dt,
                       int32_t hd, int32_t N, float *y);

/* The same on a given path (tests): KVC_ISA_SCALAR, or a level the CPU has
 * (AVX2 and above take the AVX2 path). */
void kvc_ssm_scan_head_isa(kvc_isa isa, float *S, const float *x, const float *B, const float *C, float dA,
                           float dt, int32_t hd, int32_t N, float *y);

/* The AVX2 path (ssm_scan_avx2.c): N a multiple of 8. */
void kvc_ssm_scan_head_avx2(float *S, const float *x, const float *B, const float *C, float dA, float dt,
                            int32_t hd, int32_t N, float *y);

/* The convolution's arguments for n channels of one token (pointers at the
 * first channel). */
typedef struct kvc_conv_args {
    float       *st;      /* [K - 1][ld_st] the state, oldest row first; advanced in place */
    int64_t      ld_st;
    const float *wt;      /* [K][ld_w] the taps transposed: tap k of channel ch at wt[k * ld_w + ch] */
    int64_t      ld_w;
    int32_t      K;       /* taps, >= 1 (K = 1: no state) */
    const float *u;       /* [n] the token's inputs */
    const float *u_mul;   /* [n] or NULL: factors of the inputs */
    const float *bias;    /* [n] or NULL */
    bool         silu;
    const float *y_mul;   /* [n] or NULL: factors of the outputs */
    float       *y;       /* [n] the output; may be u, u_mul or y_mul */
    int64_t      n;
} kvc_conv_args;

/* The convolution above on the ISA in use, or on a given path (tests). */
void kvc_conv_step(const kvc_conv_args *a);
void kvc_conv_step_isa(kvc_isa isa, const kvc_conv_args *a);

/* The scalar reference from channel ch0 on (the AVX2 path's tail), and the
 * AVX2 path (ssm_scan_avx2.c). */
void kvc_conv_step_ref(const kvc_conv_args *a, int64_t ch0);
void kvc_conv_step_avx2(const kvc_conv_args *a);

/* wt [K][n] = w [n][K] transposed (the file's conv1d weights to kvc_conv_args' taps). */
void kvc_conv_taps_transpose(const float *w, int64_t n, int32_t K, float *wt);

#endif
