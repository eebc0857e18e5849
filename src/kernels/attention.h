/* attention.h - causal attention of one query token over a sequence's cached
 * K/V blocks, for the query heads that share one KV head (GQA).
 *
 * Layout of one (block, layer, KV head) in the pool, B positions a block:
 *   K: [head_dim][B]  transposed, so 16 positions of one dimension are contiguous
 *   V: [B][head_dim]
 * in F16 or F32.
 *
 * Arithmetic, the same on every ISA (the SIMD lanes run the scalar order):
 *   s_j  = fma chain over d = 0 .. hd-1 of q[d] * K[d][j], then s_j * scale
 *   m    = max_j s_j;  e_j = kvc_exp_neg(s_j - m)  (a polynomial exp, the same fmas on every ISA)
 *   sum  = 16 partial sums, lane j % 16 adding e_j in j order, then halves added pairwise
 *   o[d] = fma chain over j = 0 .. n-1 of e_j * V[j][d];  o[d] *= (float)(1 / sum)
 * Every value depends only on the query and the positions [0, n): not on the
 * batch, the thread, or the ISA. */
#ifndef KVC_ATTENTION_H
#define KVC_ATTENTION_H

#include "common.h"

typedef struct kvc_attn_args {
    int32_t         n_q;       /* query heads sharing this KV head, <= 16 */
    int32_t         hd;        /* head dim, a multiple of 16 */
    int32_t         B;         /* positions per block, 16 */
    int64_t         n_pos;     /* attend to positions [0, n_pos) */
    bool            f16;       /* K/V are F16 (else F32) */
    const void    *const *k;   /* per block: its K [hd][B] */
    const void    *const *v;   /* per block: its V [B][hd] */
    const float    *q;         /* [n_q][hd] */
    float           scale;     /* 1/sqrt(hd) */
    float          *out;       /* [n_q][hd] */
    float          *scores;    /* scratch: n_q * round_up(n_pos, B) floats */
} kvc_attn_args;

/* Floats of scratch for n_q heads over n_pos positions. */
size_t kvc_attn_scratch_floats(int32_t n_q, int64_t n_pos, int32_t B);

void kvc_attention(const kvc_attn_args *a);
/* The scalar reference, for tests. */
void kvc_attention_ref(const kvc_attn_args *a);

/* exp(x) for x <= 0 as the attention computes it: clamped at -80, Cephes'
 * range reduction and polynomial, every step an explicit fma or multiply. */
float kvc_exp_neg(float x);

/* Internal: SIMD passes (attention_avx512.c, attention_avx2.c). The softmax
 * pass turns scores into e_j in place and returns 1 / sum per head. */
void kvc_attn_softmax_avx512(const kvc_attn_args *a, float *inv);
void kvc_attn_softmax_avx2(const kvc_attn_args *a, float *inv);
void kvc_attn_scores_avx512(const kvc_attn_args *a);
void kvc_attn_output_avx512(const kvc_attn_args *a);
void kvc_attn_scores_avx2(const kvc_attn_args *a);
void kvc_attn_output_avx2(const kvc_attn_args *a);

#endif
