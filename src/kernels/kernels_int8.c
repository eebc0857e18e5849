/* kernels_int8.c - the scalar reference of the integer matmul scheme
 * (kernels_int8.h): activation quantization to two int8 planes, weights in
 * integer form, and the matmul in the scheme's fixed order. The SIMD kernels
 * (kernels_vnni.c, kernels_avx2_int8.c) are tested bitwise against these;
 * their shared entry point (kvc_i8_matmul_rows) is at the end. */
#include "kernels_int8.h"

#include <math.h>
#include <string.h>

bool kvc_i8_type_ok(uint32_t type)
{
    switch (type) {
    case KVC_TYPE_Q8_0: case KVC_TYPE_Q4_0: case KVC_TYPE_Q5_0: case KVC_TYPE_Q4_1: case KVC_TYPE_Q5_1:
    case KVC_TYPE_Q4_K: case KVC_TYPE_Q5_K: case KVC_TYPE_Q6_K: case KVC_TYPE_MXFP4:
        return true;
    default:
        return false;
    }
}

/* ------------------------------------------------------------ activations */

static inline float clamp127(float v) { return fminf(fmaxf(v, -127.0f), 127.0f); }

void kvc_i8_quantize_row_ref(const float *x, int64_t n_in, uint8_t *dst)
{
    const int64_t nb = n_in / 32;
    int8_t *hi = (int8_t *)dst, *lo = (int8_t *)dst + n_in;
    int16_t a[32];
    float d[1];
    int32_t s[1], h2[2];
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(xb[i]));     /* fmaxf ignores a NaN */
        int32_t sum = 0, half[2] = { 0, 0 };
        if (!(amax >= KVC_I8_AMIN)) {
            memset(hi + 32 * b, 0, 32);
            memset(lo + 32 * b, 0, 32);
            memset(a, 0, sizeof(a));
            d[0] = 0.0f;
        } else {
            const float dh = amax / 127.0f, id = 127.0f / amax, id2 = id * 256.0f;
            for (int i = 0; i < 32; i++) {
                const float h = nearbyintf(clamp127(xb[i] * id));
                const float r = fmaf(-h, dh, xb[i]);
                const float l = nearbyintf(clamp127(r * id2));
                hi[32 * b + i] = (int8_t)h;
                lo[32 * b + i] = (int8_t)l;
                a[i] = (int16_t)(256 * (int32_t)h + (int32_t)l);
                sum += a[i];
                half[i / 16] += a[i];
            }
            d[0] = dh / 256.0f;
        }
        s[0] = sum;
        h2[0] = half[0];
        h2[1] = half[1];
        memcpy(dst + 2 * n_in + 4 * b, d, 4);
        memcpy(dst + 2 * n_in + 4 * nb + 4 * b, s, 4);
        memcpy(dst + 2 * n_in + 8 * nb + 8 * b, h2, 8);
        memcpy(dst + 2 * n_in + 16 * nb + 64 * b, a, sizeof(a));
    }
    const size_t used = kvc_i8_act_used_bytes(n_in);
    memset(dst + used, 0, kvc_i8_act_row_bytes(n_in) - used);
}

/* ---------------------------------------------------------------- weights */

/* q of a block of Q4_0, Q5_0, Q4_1 or Q5_1: element i the low nibble of
 * qs[i], element 16 + i its high one, bit j of qh (little-endian; none:
 * NULL) the fifth bit of element j, minus off. */
static void small_codes(const uint8_t qs[16], const uint8_t *qh, int off, int8_t q[32])
{
    const uint32_t h = qh ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24 : 0;
    for (int i = 0; i < 16; i++) {
        q[i] = (int8_t)((int)((qs[i] & 0x0f) | ((h >> i) & 1) << 4) - off);
        q[i + 16] = (int8_t)((int)((qs[i] >> 4) | ((h >> (i + 16)) & 1) << 4) - off);
    }
}

/* The scales of Q4_1 and Q5_1, x = d q + m: the min step subtracts m S, so
 * the scheme's m is the block's negated. */
static void added_min(kvc_i8_wblock *o, kvc_fp16 d, kvc_fp16 m)
{
    o->d[0] = kvc_fp16_to_fp32(d);
    o->m = -kvc_fp16_to_fp32(m);
    o->has_min = true;
}

void kvc_i8_unpack_block_ref(uint32_t type, const void *row, int64_t b, kvc_i8_wblock *o)
{
    o->n_sub = 1;
    o->has_min = false;
    o->d[1] = 0.0f;
    o->m = 0.0f;
    switch (type) {
    case KVC_TYPE_Q8_0: {
        const block_q8_0 *k = (const block_q8_0 *)row + b;
        memcpy(o->q, k->qs, 32);
        o->d[0] = kvc_fp16_to_fp32(k->d);
        break;
    }
    case KVC_TYPE_Q4_0: {
        const block_q4_0 *k = (const block_q4_0 *)row + b;
        small_codes(k->qs, NULL, 8, o->q);
        o->d[0] = kvc_fp16_to_fp32(k->d);
        break;
    }
    case KVC_TYPE_Q5_0: {
        const block_q5_0 *k = (const block_q5_0 *)row + b;
        small_codes(k->qs, k->qh, 16, o->q);
        o->d[0] = kvc_fp16_to_fp32(k->d);
        break;
    }
    case KVC_TYPE_Q4_1: {
        const block_q4_1 *k = (const block_q4_1 *)row + b;
        small_codes(k->qs, NULL, 0, o->q);
        added_min(o, k->d, k->m);
        break;
    }
    case KVC_TYPE_Q5_1: {
        const block_q5_1 *k = (const block_q5_1 *)row + b;
        small_codes(k->qs, k->qh, 0, o->q);
        added_min(o, k->d, k->m);
        break;
    }
    case KVC_TYPE_Q4_K: case KVC_TYPE_Q5_K: {
        const int j = (int)(b % 8), c = j / 2, half = j % 2;
        const uint8_t *qs, *scales, *qh = NULL;
        float d, dmin;
        if (type == KVC_TYPE_Q4_K) {
            const block_q4_K *k = (const block_q4_K *)row + b / 8;
            qs = k->qs, scales = k->scales, d = kvc_fp16_to_fp32(k->d), dmin = kvc_fp16_to_fp32(k->dmin);
        } else {
            const block_q5_K *k = (const block_q5_K *)row + b / 8;
            qs = k->qs, scales = k->scales, qh = k->qh;
            d = kvc_fp16_to_fp32(k->d), dmin = kvc_fp16_to_fp32(k->dmin);
        }
        for (int l = 0; l < 32; l++) {
            int q = half ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0x0f;
            if (qh)
                q |= ((qh[l] >> j) & 1) << 4;
            o->q[l] = (int8_t)q;
        }
        uint8_t sc, m;
        kvc_k4_scale_min(j, scales, &sc, &m);
        o->d[0] = d * (float)sc;
        o->m = dmin * (float)m;
        o->has_min = true;
        break;
    }
    case KVC_TYPE_Q6_K: {
        const block_q6_K *k = (const block_q6_K *)row + b / 8;
        const int e0 = 32 * (int)(b % 8), h = e0 / 128, kq = (e0 % 128) / 32;
        const uint8_t *ql = k->ql + 64 * h, *qh = k->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            const int nib = kq & 1 ? ql[l + 32] : ql[l];
            const int q = (kq < 2 ? nib & 0x0f : nib >> 4) | ((qh[l] >> (2 * kq)) & 3) << 4;
            o->q[l] = (int8_t)(q - 32);
        }
        const float d = kvc_fp16_to_fp32(k->d);
        o->n_sub = 2;
        o->d[0] = d * (float)k->scales[e0 / 16];
        o->d[1] = d * (float)k->scales[e0 / 16 + 1];
        break;
    }
    case KVC_TYPE_MXFP4: {
        const block_mxfp4 *k = (const block_mxfp4 *)row + b;
        for (int i = 0; i < 16; i++) {
            o->q[i] = kvc_mxfp4_values[k->qs[i] & 0x0f];
            o->q[i + 16] = kvc_mxfp4_values[k->qs[i] >> 4];
        }
        o->d[0] = kvc_e8m0_half(k->e);
        break;
    }
    default:
        memset(o->q, 0, 32);
        o->d[0] = 0.0f;
        break;
    }
}

bool kvc_i8_avx2_type_ok(uint32_t type) { return kvc_i8_type_ok(type); }

bool kvc_i8_vnni_type_ok(uint32_t type)
{
    return kvc_i8_type_ok(type) && kvc_i8_kind(type) < I8_N_VNNI;
}

/* ----------------------------------------------------------------- matmul */

void kvc_i8_matmul_ref(const kvc_weight *w, const uint8_t *act, const int32_t *tok, int64_t n_tok, float *y,
                       int64_t ldy, int64_t r0, int64_t r1)
{
    const int64_t n_in = w->n_in, nb = n_in / 32;
    const size_t as = kvc_i8_act_row_bytes(n_in);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t++) {
            const uint8_t *a = kvc_i8_tok_row(act, as, tok, t);
            const int8_t *hi = kvc_i8_hi(a), *lo = kvc_i8_lo(a, n_in);
            const float *dx = kvc_i8_d(a, n_in);
            const int32_t *sx = kvc_i8_s(a, n_in);
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                kvc_i8_wblock wb;
                kvc_i8_unpack_block_ref(w->type, row, b, &wb);
                const int len = 32 / wb.n_sub;
                for (int j = 0; j < wb.n_sub; j++) {
                    int32_t dot = 0;
                    for (int i = j * len; i < (j + 1) * len; i++)
                        dot += (int32_t)wb.q[i] * (256 * (int32_t)hi[32 * b + i] + (int32_t)lo[32 * b + i]);
                    acc = fmaf((float)dot, wb.d[j] * dx[b], acc);
                }
                if (wb.has_min)
                    acc = fmaf(-(float)sx[b], wb.m * dx[b], acc);
            }
            y[t * ldy + r] = acc;
        }
    }
}

/* ------------------------------------------- the SIMD ISAs' entry point */

/* The ISA's own bytes, then KVC_I8_TB_ACT quantized tokens, each start
 * 64-byte aligned. */
static uint8_t *act_area(const kvc_i8_isa *isa, int64_t n_in, float *scratch)
{
    uintptr_t p = (((uintptr_t)scratch + 63) & ~(uintptr_t)63) + isa->own_bytes(n_in);
    return (uint8_t *)((p + 63) & ~(uintptr_t)63);
}

size_t kvc_i8_scratch_floats(const kvc_i8_isa *isa, int64_t n_in)
{
    size_t n = 16;
    if (n_in > 0 && n_in % 32 == 0)
        n += (isa->own_bytes(n_in) + KVC_I8_TB_ACT * kvc_i8_act_row_bytes(n_in) + 128) / sizeof(float);
    return KVC_MAX(n, isa->fallback->matmul_scratch_floats(n_in));   /* the types it hands on */
}

void kvc_i8_matmul_rows(const kvc_i8_isa *isa, const kvc_weight *w, const float *x, int64_t ldx,
                        int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch)
{
    if (!isa->type_ok(w->type)) {
        isa->fallback->matmul_rows(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
        return;
    }
    uint8_t *act = act_area(isa, w->n_in, scratch);
    for (int64_t t0 = 0; t0 < n_tok; t0 += KVC_I8_TB_ACT) {
        const int64_t nt = KVC_MIN(KVC_I8_TB_ACT, n_tok - t0);
        isa->quantize(x + t0 * ldx, ldx, w->n_in, 0, nt, act);
        isa->matmul_act(w, act, NULL, nt, y + t0 * ldy, ldy, r0, r1, scratch);
    }
}
