/* attention.c - tiled online-softmax attention over paged K/V: the walk over
 * the blocks, dispatch, and the scalar reference (attention.h gives the
 * arithmetic every ISA follows). */
#include "attention.h"
#include "kernels.h"
#include "quant.h"

#include <math.h>
#include <string.h>

size_t kvc_attn_scratch_floats(int64_t n_rows)
{
    return (size_t)(n_rows > 0 ? n_rows : 0) * (1 + 16);
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

static inline float kv_at(const kvc_attn_args *a, const void *base, int64_t i)
{
    return a->f16 ? kvc_fp16_to_fp32(((const kvc_fp16 *)base)[i]) : ((const float *)base)[i];
}

/* Block b folded into row r, the operations of attention.h one by one. */
static void block_row_ref(const kvc_attn_args *a, int64_t b, int32_t r)
{
    enum { B = KVC_ATTN_B };
    const int32_t rows = a->n_tok * a->n_q, n = kvc_attn_seen(a, b, r);
    const float *q = kvc_attn_q_row(a, r);
    float *o = kvc_attn_o_row(a, r), *m = a->scratch + r, *l = a->scratch + rows + 16 * r;
    float s[B], e[B], mb = -INFINITY;
    for (int32_t j = 0; j < B; j++) {
        float acc = 0.0f;
        for (int32_t d = 0; d < a->hd; d++)
            acc = fmaf(q[d], kv_at(a, a->k[b], (int64_t)d * B + j), acc);
        s[j] = j < n ? acc * a->scale : -INFINITY;
        mb = s[j] > mb ? s[j] : mb;
    }
    const float mn = mb > *m ? mb : *m, alpha = kvc_exp_neg(*m - mn);
    *m = mn;
    for (int32_t j = 0; j < B; j++) {
        e[j] = j < n ? kvc_exp_neg(s[j] - mn) : 0.0f;
        l[j] = l[j] * alpha + e[j];
    }
    for (int32_t d = 0; d < a->hd; d++) {
        float acc = o[d] * alpha;
        for (int32_t j = 0; j < n; j++)
            acc = fmaf(e[j], kv_at(a, a->v[b], (int64_t)j * a->hd + d), acc);
        o[d] = acc;
    }
}

static void block_ref(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++)
        block_row_ref(a, b, r);
}

typedef void block_fn(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1);
typedef void full_fn(const kvc_attn_args *a, int64_t b0, int64_t b1);

/* Blocks in order; block b goes to the rows whose token sees part of it. The
 * blocks that every row sees whole, [0, n_pos / B), go to full (if not NULL)
 * at once, which may then take several blocks per pass. */
static void walk(const kvc_attn_args *a, block_fn *block, full_fn *full)
{
    const int32_t rows = a->n_tok * a->n_q;
    float *m = a->scratch, *l = a->scratch + rows;
    for (int32_t r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        memset(l + 16 * r, 0, 16 * sizeof(float));
        memset(kvc_attn_o_row(a, r), 0, (size_t)a->hd * sizeof(float));
    }
    const int64_t nb = (a->n_pos + a->n_tok - 1 + KVC_ATTN_B - 1) / KVC_ATTN_B;
    int64_t b = 0;
    if (full) {
        b = a->n_pos / KVC_ATTN_B;
        full(a, 0, b);
    }
    for (; b < nb; b++) {
        int64_t t0 = b * KVC_ATTN_B - a->n_pos + 1;   /* the first token that sees block b */
        block(a, b, (int32_t)(t0 > 0 ? t0 : 0) * a->n_q, rows);
    }
    for (int32_t r = 0; r < rows; r++) {
        float lane[16];
        memcpy(lane, l + 16 * r, sizeof(lane));
        for (int w = 8; w >= 1; w /= 2)
            for (int i = 0; i < w; i++)
                lane[i] += lane[i + w];
        const float inv = 1.0f / lane[0];
        float *o = kvc_attn_o_row(a, r);
        for (int32_t d = 0; d < a->hd; d++)
            o[d] *= inv;
    }
}

void kvc_attention_ref(const kvc_attn_args *a)
{
    walk(a, block_ref, NULL);
}

void kvc_attention(const kvc_attn_args *a)
{
    kvc_isa isa = kvc_kernels_isa();
    if (isa >= KVC_ISA_AVX512 && a->hd % 16 == 0)
        walk(a, kvc_attn_block_avx512, kvc_attn_full_avx512);
    else if (isa >= KVC_ISA_AVX2 && a->hd % 8 == 0)
        walk(a, kvc_attn_block_avx2, NULL);
    else
        walk(a, block_ref, NULL);
}
