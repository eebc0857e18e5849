/* ssm_scan.h - the Mamba-2 selective-scan step of one head for one token
 * (ggml_ssm_scan's inner loop; ARCHITECTURES.md §3.6), with a scalar
 * reference and an AVX2 path chosen at run time (kvc_kernels_isa). Every path
 * gives the same bits, so a state does not depend on the ISA level in use:
 *   for each row r < hd of the head's state S [hd][N]:
 *     S[r][k] = S[r][k] * dA + B[k] * (x[r] * dt)     (multiply, multiply, add)
 *     y[r]    = sum over k of S[r][k] * C[k]          (kernels.c's order: eight
 *               partial sums, k going to sum k % 8, then the tree
 *               ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)))
 * WHY no AVX-512 path: the loop streams the state once per token (load, two
 * multiplies, add, store per element); on Zen 4 a 512-bit operation takes the
 * same 256-bit units twice, so 16 lanes gained nothing measurable over 8. */
#ifndef KVC_SSM_SCAN_H
#define KVC_SSM_SCAN_H

#include "kernels.h"

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

#endif
