/* attention.c - tiled online-softmax attention over paged K/V: the walk over
 * the blocks, dispatch, and the scalar reference (attention.h gives the
 * arithmetic every ISA follows). */
#include "attention.h"
#include "kernels.h"
#include "kernels_int8.h"
#include "quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

size_t kvc_attn_scratch_floats(int64_t n_rows, int32_t hd)
{
    const size_t rows = (size_t)(n_rows > 0 ? n_rows : 0);
    size_t n = rows * (1 + 16), tail = 0;
    if (kvc_attn_i16_ok(hd))   /* alignment, q rows, cq (rounded up to 64 bytes), slots */
        tail = (64 + rows * (size_t)hd * 2 + (rows * 4 + 63) / 64 * 64 +
                KVC_ATTN_I16_SLOTS * kvc_attn_i16_block_bytes(hd)) / sizeof(float);
    if (hd > 0)   /* alignment, the F32 slots of the avx2 ISA */
        tail = KVC_MAX(tail, 8 + 2 * (size_t)hd * KVC_ATTN_B * 2);
    return n + tail;
}

float kvc_attn_i16_vec(const float *x, int64_t stride, int32_t hd, int16_t *xi)
{
    float c[4] = { 0 }, amax = 0.0f;
    for (int32_t d = 0; d < hd; d++) {
        c[d % 4] = fmaf(x[d * stride], x[d * stride], c[d % 4]);
        amax = fmaxf(amax, fabsf(x[d * stride]));   /* fmaxf ignores a NaN */
    }
    const float n2 = (c[0] + c[1]) + (c[2] + c[3]);
    if (!(amax >= KVC_I8_AMIN) || !(n2 <= FLT_MAX)) {
        memset(xi, 0, (size_t)hd * sizeof(*xi));
        return 0.0f;
    }
    const float inv = fminf(46000.0f / sqrtf(n2), 32767.0f / amax);
    for (int32_t d = 0; d < hd; d++)
        xi[d] = (int16_t)nearbyintf(x[d * stride] * inv);   /* |.| <= 32767, no NaN: n2 is finite */
    return 1.0f / inv;
}

void kvc_attn_i16_quantize_q(const kvc_attn_args *a)
{
    const int32_t rows = a->n_tok * a->n_q;
    int16_t *qi = kvc_attn_i16_q(a);
    float *cq = kvc_attn_i16_cq(a);
    for (int32_t r = 0; r < rows; r++)
        cq[r] = (kvc_attn_i16_vec(kvc_attn_q_row(a, r), 1, a->hd, qi + (size_t)r * a->hd) * a->scale) *
                KVC_LOG2E;
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

float kvc_exp2_neg(float x)
{
    x = x < -120.0f ? -120.0f : x;
    const float n = nearbyintf(x), f = x - n;
    float p = fmaf(KVC_EXP2_C4, f, KVC_EXP2_C3);
    p = fmaf(p, f, KVC_EXP2_C2);
    p = fmaf(p, f, KVC_EXP2_C1);
    return ldexpf(fmaf(p, f, 1.0f), (int)n);
}

static inline float kv_at(const kvc_attn_args *a, const void *base, int64_t i)
{
    return a->f16 ? kvc_fp16_to_fp32(((const kvc_fp16 *)base)[i]) : ((const float *)base)[i];
}

/* Block b folded into row r, the operations of attention.h one by one. */
static void block_row_ref(const kvc_attn_args *a, int64_t b, int32_t r)
{
    enum { B = KVC_ATTN_B };
    const int32_t rows = a->n_tok * a->n_q, n = kvc_attn_seen(a, b, r), j0 = kvc_attn_seen_lo(a, b, r);
    const float *q = kvc_attn_q_row(a, r);
    float *o = kvc_attn_o_row(a, r), *m = a->scratch + r, *l = a->scratch + rows + 16 * r;
    float s[B], e[B], mb = -INFINITY;
    for (int32_t j = 0; j < B; j++) {
        float acc = 0.0f;
        for (int32_t d = 0; d < a->hd && j >= j0 && j < n; d++)
            acc = fmaf(q[d], kv_at(a, a->k[b], (int64_t)d * B + j), acc);
        s[j] = j >= j0 && j < n ? acc * a->scale : -INFINITY;
        mb = s[j] > mb ? s[j] : mb;
    }
    const float mn = mb > *m ? mb : *m, alpha = kvc_exp_neg(*m - mn);
    *m = mn;
    for (int32_t j = 0; j < B; j++) {
        e[j] = j >= j0 && j < n ? kvc_exp_neg(s[j] - mn) : 0.0f;
        l[j] = l[j] * alpha + e[j];
    }
    for (int32_t d = 0; d < a->hd; d++) {
        float acc = o[d] * alpha;
        for (int32_t j = j0; j < n; j++)
            acc = fmaf(e[j], kv_at(a, a->v[b], (int64_t)j * a->hd + d), acc);
        o[d] = acc;
    }
}

static void block_ref(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++)
        block_row_ref(a, b, r);
}

/* ------------------------------------------------ the integer scheme's reference */

/* Block b folded into row r, the integer scheme of attention.h op by op. */
static void block_row_ref_i16(const kvc_attn_args *a, int64_t b, int32_t r)
{
    enum { B = KVC_ATTN_B, H = KVC_ATTN_I16_MAX_HD };
    const int32_t rows = a->n_tok * a->n_q, n = kvc_attn_seen(a, b, r), j0 = kvc_attn_seen_lo(a, b, r), hd = a->hd;
    const int16_t *q = kvc_attn_i16_q(a) + (size_t)r * hd;
    const float cq = kvc_attn_i16_cq(a)[r];
    float *o = kvc_attn_o_row(a, r), *m = a->scratch + r, *l = a->scratch + rows + 16 * r;
    float x[H], sK[B] = { 0 }, cv[H], s[B], e[B], mb = -INFINITY;
    int16_t Ki[B][H], Vi[B][H];
    memset(Ki, 0, sizeof(Ki));
    memset(Vi, 0, sizeof(Vi));
    for (int32_t j = j0; j < n; j++) {
        for (int32_t d = 0; d < hd; d++)
            x[d] = kv_at(a, a->k[b], (int64_t)d * B + j);
        sK[j] = kvc_attn_i16_vec(x, 1, hd, Ki[j]);
    }
    for (int32_t d = 0; d < hd; d++) {
        float vmax = 0.0f;
        for (int32_t j = j0; j < n; j++)
            vmax = fmaxf(vmax, fabsf(kv_at(a, a->v[b], (int64_t)j * hd + d)));
        if (!(vmax >= KVC_I8_AMIN)) {
            cv[d] = 0.0f;
            continue;
        }
        const float iv = 4095.0f / vmax;
        cv[d] = vmax / 4095.0f;
        for (int32_t j = j0; j < n; j++) {
            const float v = kv_at(a, a->v[b], (int64_t)j * hd + d) * iv;
            Vi[j][d] = isnan(v) ? 0 : (int16_t)nearbyintf(v);   /* NaN: V[j][d] infinite */
        }
    }
    for (int32_t j = 0; j < B; j++) {
        int32_t dot = 0;
        for (int32_t d = 0; d < hd; d++)
            dot += (int32_t)q[d] * Ki[j][d];
        s[j] = j >= j0 && j < n ? ((float)dot * sK[j]) * cq : -INFINITY;
        mb = s[j] > mb ? s[j] : mb;
    }
    const float mn = mb > *m ? mb : *m, alpha = kvc_exp2_neg(*m - mn), emax = kvc_exp2_neg(mb - mn);
    const float w = emax >= KVC_I8_AMIN ? emax * (1.0f / 32767.0f) : 0.0f;
    *m = mn;
    int32_t pi[B];
    for (int32_t j = 0; j < B; j++) {
        e[j] = j >= j0 && j < n ? kvc_exp2_neg(s[j] - mb) : 0.0f;
        l[j] = fmaf(emax, e[j], l[j] * alpha);
        pi[j] = (int32_t)nearbyintf(e[j] * 32767.0f);
    }
    for (int32_t d = 0; d < hd; d++) {
        int32_t dot = 0;
        for (int32_t j = 0; j < B; j++)
            dot += pi[j] * Vi[j][d];
        o[d] = fmaf((float)dot, cv[d] * w, o[d] * alpha);
    }
}

static void block_ref_i16(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1)
{
    for (int32_t r = r0; r < r1; r++)
        block_row_ref_i16(a, b, r);
}

/* ------------------------------------------------ the integer scheme's walk */

static const kvc_attn_i16_ops *i16_ops(void)
{
    return kvc_kernels_isa() == KVC_ISA_VNNI ? &kvc_attn_i16_vnni : &kvc_attn_i16_avx2;
}

/* Block b into rows [r0, r1) (whole tokens): the tokens that see part of it
 * one at a time, each with the block in integer form for what it sees; the
 * tokens that see it whole (consecutive ones) together. */
static void block_i16(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1)
{
    const kvc_attn_i16_ops *ops = i16_ops();
    const kvc_attn_i16_block ib = kvc_attn_i16_block_at(a, 0);
    while (r0 < r1) {
        const int32_t n = kvc_attn_seen(a, b, r0), j0 = kvc_attn_seen_lo(a, b, r0);
        int32_t end = r0 + a->n_q;
        if (n == KVC_ATTN_B && j0 == 0)   /* the later tokens see all of it until the window's edge passes */
            while (end < r1 && kvc_attn_seen_lo(a, b, end) == 0)
                end += a->n_q;
        ops->convert(a, b, j0, n, &ib);
        ops->rows(a, &ib, r0, end, j0, n, 1);
        r0 = end;
    }
}

/* Blocks [b0, b1) that every row sees whole: max_nb at a time, each put in
 * integer form once, then folded into every row. */
static void full_i16(const kvc_attn_args *a, int64_t b0, int64_t b1)
{
    const kvc_attn_i16_ops *ops = i16_ops();
    kvc_attn_i16_block ib[KVC_ATTN_I16_SLOTS];
    for (int i = 0; i < KVC_ATTN_I16_SLOTS; i++)
        ib[i] = kvc_attn_i16_block_at(a, i);
    for (int64_t b = b0, nb; b < b1; b += nb) {
        nb = KVC_MIN(b1 - b, (int64_t)ops->max_nb);
        for (int i = 0; i < nb; i++)
            ops->convert(a, b + i, 0, KVC_ATTN_B, &ib[i]);
        ops->rows(a, ib, 0, a->n_tok * a->n_q, 0, KVC_ATTN_B, (int)nb);
    }
}

/* ------------------------------------------------------------------ walk */

typedef void block_fn(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1);
typedef void full_fn(const kvc_attn_args *a, int64_t b0, int64_t b1);

void kvc_attn_state_init(const kvc_attn_args *a, bool base2)
{
    const int32_t rows = a->n_tok * a->n_q;
    float *m = a->scratch, *l = a->scratch + rows;
    for (int32_t r = 0; r < rows; r++) {
        m[r] = a->sinks ? (base2 ? a->sinks[r % a->n_q] * KVC_LOG2E : a->sinks[r % a->n_q]) : -INFINITY;
        memset(l + 16 * r, 0, 16 * sizeof(float));
        l[16 * r] = a->sinks ? 1.0f : 0.0f;
        memset(kvc_attn_o_row(a, r), 0, (size_t)a->hd * sizeof(float));
    }
}

/* The first position token t sees. */
static int64_t seen_from(const kvc_attn_args *a, int64_t t)
{
    const int64_t lo = a->n_pos + t - a->window;
    return a->window > 0 && lo > 0 ? lo : 0;
}

/* Blocks in order from the first any row sees (those wholly below every
 * row's window are not touched); block b goes to the rows whose token sees
 * part of it, a run of consecutive tokens. The blocks that every row sees
 * whole (from the last token's window edge to n_pos) go to full (if not
 * NULL) at once, which may then take several blocks per pass. */
static void walk(const kvc_attn_args *a, block_fn *block, full_fn *full, bool base2)
{
    enum { B = KVC_ATTN_B };
    const int32_t rows = a->n_tok * a->n_q;
    float *l = a->scratch + rows;
    kvc_attn_state_init(a, base2);
    const int64_t nb = (a->n_pos + a->n_tok - 1 + B - 1) / B;
    const int64_t f0 = (seen_from(a, a->n_tok - 1) + B - 1) / B, f1 = a->n_pos / B;
    for (int64_t b = seen_from(a, 0) / B; b < nb; b++) {
        if (full && b == f0 && f0 < f1) {
            full(a, f0, f1);
            b = f1 - 1;
            continue;
        }
        const int64_t t0 = b * B - a->n_pos + 1;   /* the first token that sees block b */
        int64_t t1 = a->n_tok;                     /* and the last one's successor */
        if (a->window > 0)
            t1 = KVC_MIN(t1, (b + 1) * B - a->n_pos + a->window);
        block(a, b, (int32_t)(t0 > 0 ? t0 : 0) * a->n_q, (int32_t)t1 * a->n_q);
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
    walk(a, block_ref, NULL, false);
}

void kvc_attention_ref_i16(const kvc_attn_args *a)
{
    kvc_attn_i16_quantize_q(a);
    walk(a, block_ref_i16, NULL, true);
}

bool kvc_attn_uses_i16(int32_t hd)
{
    const kvc_isa isa = kvc_kernels_isa();
    return (isa == KVC_ISA_VNNI || isa == KVC_ISA_AVX2) && kvc_attn_i16_ok(hd);
}

int32_t kvc_attn_tile_rows(int32_t hd)
{
    return kvc_attn_uses_i16(hd) ? 256 : 128;
}

void kvc_attention(const kvc_attn_args *a)
{
    kvc_isa isa = kvc_kernels_isa();
    if (kvc_attn_uses_i16(a->hd)) {
        kvc_attn_i16_quantize_q_simd(a);
        walk(a, block_i16, full_i16, true);
    } else if (isa >= KVC_ISA_AVX512 && a->hd % 16 == 0)
        walk(a, kvc_attn_block_avx512, kvc_attn_full_avx512, false);
    else if (isa >= KVC_ISA_AVX2 && a->hd % 8 == 0)
        walk(a, kvc_attn_block_avx2, a->hd % 32 == 0 ? kvc_attn_full_avx2 : NULL, false);
    else
        walk(a, block_ref, NULL, false);
}
