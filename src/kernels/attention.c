/* attention.c - softmax attention over paged K/V: dispatch and the scalar reference.
 *
 * Two passes over the blocks, with a softmax between them. The passes are SIMD
 * (16 positions or 16 dimensions at a time); the scalar reference performs the
 * very same fused multiply-adds in the same order, so every ISA gives the same
 * bits. */
#include "attention.h"
#include "kernels.h"
#include "quant.h"

#include <math.h>
#include <string.h>

size_t kvc_attn_scratch_floats(int32_t n_q, int64_t n_pos, int32_t B)
{
    return (size_t)n_q * (size_t)((n_pos + B - 1) / B * B);
}

static inline float kv_at(const kvc_attn_args *a, const void *base, int64_t i)
{
    return a->f16 ? kvc_fp16_to_fp32(((const kvc_fp16 *)base)[i]) : ((const float *)base)[i];
}

/* scores[h][j] = scale * sum_d q[h][d] K[d][j], the sum a chain of fmaf in d order */
static void scores_ref(const kvc_attn_args *a)
{
    const int64_t nb = (a->n_pos + a->B - 1) / a->B, stride = nb * a->B;
    for (int64_t b = 0; b < nb; b++)
        for (int32_t j = 0; j < a->B; j++)
            for (int32_t h = 0; h < a->n_q; h++) {
                float s = 0.0f;
                for (int32_t d = 0; d < a->hd; d++)
                    s = fmaf(a->q[h * a->hd + d], kv_at(a, a->k[b], (int64_t)d * a->B + j), s);
                a->scores[h * stride + b * a->B + j] = s * a->scale;
            }
}

/* out[h][d] = sum_j e[h][j] V[j][d], a chain of fmaf in j order (unnormalised) */
static void output_ref(const kvc_attn_args *a)
{
    const int64_t nb = (a->n_pos + a->B - 1) / a->B, stride = nb * a->B;
    for (int32_t h = 0; h < a->n_q; h++)
        for (int32_t d = 0; d < a->hd; d++) {
            float o = 0.0f;
            for (int64_t j = 0; j < a->n_pos; j++)
                o = fmaf(a->scores[h * stride + j], kv_at(a, a->v[j / a->B], (j % a->B) * a->hd + d), o);
            a->out[h * a->hd + d] = o;
        }
}

float kvc_exp_neg(float x)
{
    x = x < -80.0f ? -80.0f : x;
    float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float y = fmaf(p, r * r, r) + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return y * scale;
}

/* e_j = kvc_exp_neg(s_j - max) in place; inv = 1 / sum with the lane order of
 * attention.h. */
static void softmax_ref(const kvc_attn_args *a, float *inv)
{
    const int64_t stride = (a->n_pos + a->B - 1) / a->B * a->B;
    for (int32_t h = 0; h < a->n_q; h++) {
        float *s = a->scores + h * stride;
        float mx = -INFINITY;
        for (int64_t j = 0; j < a->n_pos; j++)
            mx = s[j] > mx ? s[j] : mx;
        float lane[16] = { 0 };
        for (int64_t j = 0; j < a->n_pos; j++) {
            s[j] = kvc_exp_neg(s[j] - mx);
            lane[j % 16] += s[j];
        }
        for (int w = 8; w >= 1; w /= 2)
            for (int i = 0; i < w; i++)
                lane[i] += lane[i + w];
        inv[h] = 1.0f / lane[0];
    }
}

static void normalise(const kvc_attn_args *a, const float *inv)
{
    for (int32_t h = 0; h < a->n_q; h++)
        for (int32_t d = 0; d < a->hd; d++)
            a->out[h * a->hd + d] *= inv[h];
}

void kvc_attention_ref(const kvc_attn_args *a)
{
    float inv[16];
    scores_ref(a);
    softmax_ref(a, inv);
    output_ref(a);
    normalise(a, inv);
}

void kvc_attention(const kvc_attn_args *a)
{
    float inv[16];
    kvc_isa isa = kvc_kernels_isa();
    bool simd = a->hd % 16 == 0 && a->B == 16 && a->n_q <= 16;
    if (simd && isa == KVC_ISA_AVX512)
        kvc_attn_scores_avx512(a);
    else if (simd && isa == KVC_ISA_AVX2)
        kvc_attn_scores_avx2(a);
    else
        scores_ref(a);
    if (simd && isa == KVC_ISA_AVX512)
        kvc_attn_softmax_avx512(a, inv);
    else if (simd && isa == KVC_ISA_AVX2)
        kvc_attn_softmax_avx2(a, inv);
    else
        softmax_ref(a, inv);
    if (simd && isa == KVC_ISA_AVX512)
        kvc_attn_output_avx512(a);
    else if (simd && isa == KVC_ISA_AVX2)
        kvc_attn_output_avx2(a);
    else
        output_ref(a);
    normalise(a, inv);
}
