/* test_kernels_int8.c - the integer matmul scheme (kernels_int8.h).
 *
 *   - the reference's integer form of every covered weight type gives the
 *     reference dequantization's values, bitwise;
 *   - SIMD activation quantization == the reference, bitwise, edge cases
 *     included (zeros, the tiny-block threshold, ties, huge values, NaN, inf);
 *     the quantized value is within d (= max|x| / 32512) of x;
 *   - for each ISA that uses the scheme and the CPU has (avx2, vnni): its
 *     kernels (called directly, any n_tok: decode below 4 tokens, prefill
 *     from 4), its kvc_matmul_rows and the prepared-activation API all equal
 *     the scalar emulation kvc_i8_matmul_ref bitwise, for shapes with partial
 *     row groups, partial token passes, 16-row splits and extreme values;
 *   - accuracy against float64, compared with one int8 plane (llama.cpp's
 *     Q8_0 activations) for the record.
 * Skips (77) when the CPU has neither (no AVX2). */
#include "test.h"
#include "kernels.h"
#include "kernels_int8.h"
#include "quant.h"

#include <float.h>
#include <stdint.h>

/* The SIMD kernels of one ISA that uses the scheme. */
typedef struct {
    kvc_isa           isa;
    const char       *name;
    const kvc_i8_isa *k;
} simd_kernels;

static const simd_kernels families[] = {
    { KVC_ISA_AVX2, "avx2", &kvc_i8_avx2 },
    { KVC_ISA_VNNI, "vnni", &kvc_i8_vnni },
};

/* Every weight type of the scheme. */
static const uint32_t scheme_types[] = { KVC_TYPE_Q8_0, KVC_TYPE_Q4_0, KVC_TYPE_Q5_0, KVC_TYPE_Q4_1, KVC_TYPE_Q5_1,
                                         KVC_TYPE_Q4_K, KVC_TYPE_Q5_K, KVC_TYPE_Q6_K, KVC_TYPE_MXFP4 };
static const simd_kernels *fam;    /* the one under test */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rnd_f(void) { return (float)((double)rnd_u32() / 4294967296.0 * 2.0 - 1.0); }

static void *xalloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0)
        abort();
    memset(p, 0, n ? n : 1);
    return p;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* --------------------------------------------------- weights, integer form */

static void check_unpack(void)
{
    enum { N = 1024 };
    float x[N], deq[N];
    uint8_t buf[N * 2];
    for (size_t ti = 0; ti < KVC_ARRAY_LEN(scheme_types); ti++) {
        const uint32_t type = scheme_types[ti];
        CHECK(kvc_i8_type_ok(type));
        for (int i = 0; i < N; i++)
            x[i] = rnd_f() * (float)(1 + i % 5);
        kvc_quantize_row_ref(type, x, buf, N);
        kvc_dequantize_row_ref(type, buf, deq, N);
        int bad = 0;
        for (int b = 0; b < N / 32; b++) {
            kvc_i8_wblock wb;
            kvc_i8_unpack_block_ref(type, buf, b, &wb);
            for (int i = 0; i < 32; i++) {
                const float d = wb.d[wb.n_sub == 2 ? i / 16 : 0];
                const float v = wb.has_min ? d * (float)wb.q[i] - wb.m : d * (float)wb.q[i];
                if (!same_bits(v, deq[32 * b + i]) && bad++ < 3)
                    fprintf(stderr, "%s block %d [%d]: %.9g vs dequant %.9g\n", kvc_type_info(type)->name, b, i,
                            v, deq[32 * b + i]);
            }
        }
        CHECKF(bad == 0, "%s: integer form differs from the dequantization", kvc_type_info(type)->name);
    }
    CHECK(!kvc_i8_type_ok(KVC_TYPE_F16));
    CHECK(!kvc_i8_avx2_type_ok(KVC_TYPE_F16) && !kvc_i8_vnni_type_ok(KVC_TYPE_BF16));
}

/* ------------------------------------------------------------ activations */

/* Rows of n floats with the edge cases of the quantizer, one per block. */
static void edge_row(float *x, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rnd_f();
    for (int64_t b = 0; b < n / 32; b++) {
        float *xb = x + 32 * b;
        switch ((b + kind) % 12) {
        case 0: memset(xb, 0, 32 * sizeof(float)); break;                      /* all zero */
        case 1: for (int i = 0; i < 32; i++) xb[i] *= 0x1p-97f; break;         /* below the threshold */
        case 2: for (int i = 0; i < 32; i++) xb[i] *= 0x1p-95f; break;         /* just above it */
        case 3: for (int i = 0; i < 32; i++) xb[i] = (float)(i - 16) * 0.5f; xb[5] = 63.5f; break; /* ties */
        case 4: for (int i = 0; i < 32; i++) xb[i] *= 3e37f; xb[9] = FLT_MAX; break;
        case 5: xb[7] = NAN; break;
        case 6: xb[3] = INFINITY; break;
        case 7: xb[0] = -INFINITY; xb[1] = NAN; break;
        case 8: for (int i = 0; i < 32; i++) xb[i] = -0.0f; break;
        case 9: for (int i = 0; i < 32; i++) xb[i] *= 1e-40f; break;            /* subnormal */
        case 10: xb[31] = -1.0f; for (int i = 0; i < 31; i++) xb[i] = 1.0f / 127.0f * (float)i; break;
        default: for (int i = 0; i < 32; i++) xb[i] *= 1000.0f; break;
        }
    }
}

static void check_quantize(void)
{
    const int64_t ns[] = { 32, 96, 896, 4864 };
    for (size_t ni = 0; ni < KVC_ARRAY_LEN(ns); ni++) {
        const int64_t n = ns[ni], nt = 21, ldx = n + 3;
        const size_t as = kvc_i8_act_row_bytes(n);
        float *x = xalloc(sizeof(float) * (size_t)(ldx * nt));
        for (int t = 0; t < nt; t++)
            edge_row(x + t * ldx, n, t);
        uint8_t *a = xalloc(as * (size_t)nt), *r = xalloc(as);
        memset(a, 0xa5, as * (size_t)nt);
        fam->k->quantize(x, ldx, n, 0, 7, a);       /* two calls, as threads would */
        fam->k->quantize(x, ldx, n, 7, nt, a);
        int bad = 0;
        for (int t = 0; t < nt; t++) {
            kvc_i8_quantize_row_ref(x + t * ldx, n, r);
            if (memcmp(r, a + (size_t)t * as, as) != 0 && bad++ < 3) {
                size_t i = 0;
                while (r[i] == a[(size_t)t * as + i])
                    i++;
                fprintf(stderr, "quantize n %lld token %d: byte %zu: %d vs ref %d\n", (long long)n, t, i,
                        a[(size_t)t * as + i], r[i]);
            }
        }
        CHECKF(bad == 0, "SIMD quantization differs from the reference (n %lld)", (long long)n);

        /* the value: |x - d a| <= d for finite blocks over the threshold */
        bad = 0;
        for (int t = 0; t < nt; t++) {
            const uint8_t *q = a + (size_t)t * as;
            for (int64_t b = 0; b < n / 32; b++) {
                const float *xb = x + t * ldx + 32 * b;
                double amax = 0;
                bool finite = true;
                for (int i = 0; i < 32; i++) {
                    finite = finite && isfinite(xb[i]);
                    amax = fmax(amax, fabs(xb[i]));
                }
                const double d = kvc_i8_d(q, n)[b];
                int32_t s = 0, h[2] = { 0, 0 };
                for (int i = 0; i < 32; i++) {
                    const int32_t ai = 256 * kvc_i8_hi(q)[32 * b + i] + kvc_i8_lo(q, n)[32 * b + i];
                    s += ai;
                    h[i / 16] += ai;
                    if (kvc_i8_a(q, n)[32 * b + i] != ai)
                        bad++;
                    if (finite && amax >= 0x1p-96 && fabs(xb[i] - d * ai) > d * 1.01)
                        bad++;
                    if (finite && amax < 0x1p-96 && (ai != 0 || d != 0))
                        bad++;
                }
                if (s != kvc_i8_s(q, n)[b] || h[0] != kvc_i8_h(q, n)[2 * b] || h[1] != kvc_i8_h(q, n)[2 * b + 1])
                    bad++;
                if (finite && amax >= 0x1p-96 && !same_bits((float)d, (float)(amax / 127.0f) / 256.0f))
                    bad++;
            }
        }
        CHECKF(bad == 0, "quantized values off by more than d (n %lld): %d", (long long)n, bad);
        free(x);
        free(a);
        free(r);
    }
}

/* ----------------------------------------------------------------- matmul */

typedef struct {
    kvc_weight w;
    uint8_t   *data;
    float     *deq;
} wmat;

static void make_weight(wmat *m, uint32_t type, int64_t n_in, int64_t n_out, bool extreme)
{
    const size_t rb = kvc_row_size(type, n_in);
    m->data = xalloc(rb * (size_t)n_out);
    m->deq = xalloc(sizeof(float) * (size_t)(n_in * n_out));
    float *row = xalloc(sizeof(float) * (size_t)n_in);
    for (int64_t r = 0; r < n_out; r++) {
        const float scale = 0.02f + (float)(r % 7) * 0.3f;
        for (int64_t k = 0; k < n_in; k++)
            row[k] = rnd_f() * scale;
        kvc_quantize_row_ref(type, row, m->data + rb * (size_t)r, n_in);
        if (extreme && r % 3 == 0 && type == KVC_TYPE_Q8_0)            /* -128 and 127 (not from our quantizer, but legal) */
            for (int64_t b = 0; b < n_in / 32; b++) {
                block_q8_0 *k = (block_q8_0 *)(void *)(m->data + rb * (size_t)r) + b;
                for (int i = 0; i < 32; i++)
                    k->qs[i] = (int8_t)((r + b + i) % 2 ? -128 : 127);
            }
        else if (extreme && r % 3 == 0 && type == KVC_TYPE_MXFP4)
            /* values -12 and +12 (codes 15 and 7) under scales from the
             * subnormal 2^-128 (e = 0, 1) to 2^32; every other such row
             * has the three smallest scales only, so that theirs show */
            for (int64_t b = 0; b < n_in / 32; b++) {
                static const uint8_t es[] = { 0, 1, 2, 100, 127, 160 };
                block_mxfp4 *k = (block_mxfp4 *)(void *)(m->data + rb * (size_t)r) + b;
                k->e = es[(r + b) % (r % 2 ? 6 : 3)];
                for (int i = 0; i < 16; i++)
                    k->qs[i] = (uint8_t)((r + b + i) % 2 ? 0xff : 0x77);
            }
        else if (extreme && r % 3 == 0)        /* all-extreme codes: 0 and 15 (31) */
            for (size_t i = 0; i < rb; i++)
                if (i % kvc_type_info(type)->type_size >= 2)
                    m->data[rb * (size_t)r + i] = (uint8_t)((r + i) % 2 ? 0xff : 0x00);
        kvc_dequantize_row_ref(type, m->data + rb * (size_t)r, m->deq + r * n_in, n_in);
    }
    free(row);
    m->w = (kvc_weight){ .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = m->data };
}

static void free_wmat(wmat *m)
{
    free(m->data);
    free(m->deq);
}

static int count_diff(const float *a, const float *b, int64_t n_tok, int64_t ldy, int64_t r0, int64_t r1,
                      const char *what, int64_t n_in)
{
    int bad = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = r0; r < r1; r++)
            if (!same_bits(a[t * ldy + r], b[t * ldy + r]) && bad++ < 3)
                fprintf(stderr, "%s n_in %lld: y[%lld][%lld] = %.9g vs ref %.9g\n", what, (long long)n_in,
                        (long long)t, (long long)r, a[t * ldy + r], b[t * ldy + r]);
    return bad;
}

/* Every way of computing one product against the scalar emulation. */
static void check_matmul(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok, bool extreme)
{
    wmat m;
    make_weight(&m, type, n_in, n_out, extreme);
    const int64_t ldx = n_in + 7, ldy = n_out + 5;
    float *x = xalloc(sizeof(float) * (size_t)(ldx * n_tok));
    for (int64_t i = 0; i < ldx * n_tok; i++)
        x[i] = rnd_f() * (extreme && i % 5 == 0 ? 1000.0f : 1.0f);
    if (extreme)
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t k = 0; k < n_in; k++)   /* a = +-32639 where a block's max sits */
                if (k % 32 == 3)
                    x[t * ldx + k] = t % 2 ? -4000.0f : 4000.0f;
    const size_t as = kvc_i8_act_row_bytes(n_in);
    uint8_t *act = xalloc(as * (size_t)n_tok);
    for (int64_t t = 0; t < n_tok; t++)
        kvc_i8_quantize_row_ref(x + t * ldx, n_in, act + (size_t)t * as);
    float *ref = xalloc(sizeof(float) * (size_t)(ldy * n_tok)), *y = xalloc(sizeof(float) * (size_t)(ldy * n_tok));
    kvc_i8_matmul_ref(&m.w, act, NULL, n_tok, ref, ldy, 0, n_out);
    char what[64];
    snprintf(what, sizeof what, "%s n_tok %lld%s", kvc_type_info(type)->name, (long long)n_tok,
             extreme ? " extreme" : "");

    /* the kernels on the reference's activations, in 16-row-aligned and odd
     * splits, the last range first: a kernel that wrote past its range's end
     * would spoil rows already done */
    const int64_t cuts[] = { 0, 16, 16 + (n_out - 16) / 3, n_out };
    float *scratch = xalloc(kvc_matmul_scratch_floats(n_in) * sizeof(float));
    for (int64_t i = 0; i < ldy * n_tok; i++)
        y[i] = -1.0f;
    for (int c = 2; c >= 0; c--) {
        const int64_t r0 = KVC_MIN(cuts[c], n_out), r1 = KVC_MIN(cuts[c + 1], n_out);
        if (r0 < r1)
            fam->k->matmul_act(&m.w, act, NULL, n_tok, y, ldy, r0, r1, scratch);
    }
    int bad = count_diff(y, ref, n_tok, ldy, 0, n_out, fam->name, n_in);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = n_out; r < ldy; r++)
            if (y[t * ldy + r] != -1.0f)
                bad++;
    CHECKF(bad == 0, "%s kernel != scalar emulation (n_in %lld, n_out %lld, %s)", fam->name, (long long)n_in,
           (long long)n_out, what);

    /* through the public entry points of the ISA (main set it to fam's) */
    kvc_matmul_rows(&m.w, x, ldx, n_tok, y, ldy, 0, n_out, scratch);
    bad = count_diff(y, ref, n_tok, ldy, 0, n_out, fam->name, n_in);
    CHECKF(bad == 0, "%s kvc_matmul_rows != scalar emulation (n_in %lld, %s)", fam->name,
           (long long)n_in, what);

    const size_t nb = kvc_matmul_act_bytes(n_in, n_tok);
    CHECK(nb == as * (size_t)n_tok);
    CHECK(kvc_matmul_uses_act(&m.w));
    uint8_t *pa = xalloc(nb);
    kvc_matmul_act_quantize(n_in, x, ldx, n_tok, 0, n_tok / 2, pa);
    kvc_matmul_act_quantize(n_in, x, ldx, n_tok, n_tok / 2, n_tok, pa);
    CHECK(memcmp(pa, act, as * (size_t)n_tok) == 0);
    for (int64_t i = 0; i < ldy * n_tok; i++)
        y[i] = -1.0f;
    for (int c = 2; c >= 0; c--)
        if (KVC_MIN(cuts[c], n_out) < KVC_MIN(cuts[c + 1], n_out))
            kvc_matmul_rows_act(&m.w, pa, n_tok, y, ldy, KVC_MIN(cuts[c], n_out), KVC_MIN(cuts[c + 1], n_out),
                                scratch);
    bad = count_diff(y, ref, n_tok, ldy, 0, n_out, "prepared", n_in);
    CHECKF(bad == 0, "%s kvc_matmul_rows_act != scalar emulation (n_in %lld, %s)",
           fam->name, (long long)n_in, what);

    /* rows picked by tok (reversed, every other one, one twice): the kernel,
     * the reference and the public entry all give row tok[t]'s results */
    int32_t *tok = xalloc(sizeof(int32_t) * (size_t)(n_tok + 1));
    int64_t n_pick = 0;
    for (int64_t t = n_tok - 1; t >= 0; t -= 2)
        tok[n_pick++] = (int32_t)t;
    tok[n_pick++] = (int32_t)(n_tok - 1);
    float *yp = xalloc(sizeof(float) * (size_t)(ldy * n_pick)), *rp = xalloc(sizeof(float) * (size_t)(ldy * n_pick));
    kvc_i8_matmul_ref(&m.w, act, tok, n_pick, rp, ldy, 0, n_out);
    bad = 0;
    for (int64_t t = 0; t < n_pick; t++)
        for (int64_t r = 0; r < n_out; r++)
            bad += !same_bits(rp[t * ldy + r], ref[tok[t] * ldy + r]);
    CHECKF(bad == 0, "kvc_i8_matmul_ref with tok != without (n_in %lld, %s)", (long long)n_in, what);
    fam->k->matmul_act(&m.w, act, tok, n_pick, yp, ldy, 0, n_out, scratch);
    bad = count_diff(yp, rp, n_pick, ldy, 0, n_out, "tok", n_in);
    kvc_matmul_rows_act_tok(&m.w, pa, tok, n_pick, yp, ldy, 16, n_out, scratch);
    kvc_matmul_rows_act_tok(&m.w, pa, tok, n_pick, yp, ldy, 0, KVC_MIN(16, n_out), scratch);
    bad += count_diff(yp, rp, n_pick, ldy, 0, n_out, "tok public", n_in);
    CHECKF(bad == 0, "%s matmul_act with tok != reference (n_in %lld, %lld rows, %s)", fam->name,
           (long long)n_in, (long long)n_pick, what);
    free(tok);
    free(yp);
    free(rp);
    free(pa);
    free(scratch);
    free(x);
    free(act);
    free(ref);
    free(y);
    free_wmat(&m);
}

/* --------------------------------------------------------------- accuracy */

/* llama.cpp's activations: one int8 plane, d = max|x| / 127, x ~ d q. */
static double one_plane(float v, float amax)
{
    if (amax == 0)
        return 0;
    const float d = amax / 127.0f;
    return (double)d * nearbyintf(v / d);
}

static void check_accuracy(uint32_t type, int64_t n_in)
{
    const int64_t n_out = 64, n_tok = 8;
    wmat m;
    make_weight(&m, type, n_in, n_out, false);
    float *x = xalloc(sizeof(float) * (size_t)(n_in * n_tok)), *y = xalloc(sizeof(float) * (size_t)(n_out * n_tok));
    for (int64_t i = 0; i < n_in * n_tok; i++)   /* activations with outliers, as in real models */
        x[i] = rnd_f() * (i % 97 == 0 ? 20.0f : 1.0f);
    const size_t as = kvc_i8_act_row_bytes(n_in);
    uint8_t *act = xalloc(as * (size_t)n_tok);
    for (int64_t t = 0; t < n_tok; t++)
        kvc_i8_quantize_row_ref(x + t * n_in, n_in, act + (size_t)t * as);
    kvc_i8_matmul_ref(&m.w, act, NULL, n_tok, y, n_out, 0, n_out);
    double worst2 = 0, worst1 = 0;
    int bad = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < n_out; r++) {
            const float *w = m.deq + r * n_in, *xt = x + t * n_in;
            double exact = 0, mag = 0, e1 = 0, bound = 0;
            for (int64_t b = 0; b < n_in / 32; b++) {
                float amax = 0;
                double sw = 0;
                for (int i = 0; i < 32; i++) {
                    amax = fmaxf(amax, fabsf(xt[32 * b + i]));
                    sw += fabs(w[32 * b + i]);
                }
                bound += amax / 32512.0 * sw;
                for (int i = 0; i < 32; i++) {
                    exact += (double)w[32 * b + i] * xt[32 * b + i];
                    mag += fabs((double)w[32 * b + i] * xt[32 * b + i]);
                    e1 += (double)w[32 * b + i] * one_plane(xt[32 * b + i], amax);
                }
            }
            const double err = fabs(y[t * n_out + r] - exact);
            if (err > 1.01 * bound + 2e-6 * mag)
                bad++;
            worst2 = fmax(worst2, err / mag);
            worst1 = fmax(worst1, fabs(e1 - exact) / mag);
        }
    printf("  accuracy, %s n_in %lld: max |error| / sum|w x|: two planes %.2e, one plane (llama.cpp) %.2e\n",
           kvc_type_info(type)->name, (long long)n_in, worst2, worst1);
    CHECKF(bad == 0, "%s: two-plane error over its bound in %d elements", kvc_type_info(type)->name, bad);
    CHECK(worst2 < worst1 / 50);
    free(x);
    free(y);
    free(act);
    free_wmat(&m);
}

static void check_family(void)
{
    check_quantize();
    const int64_t shapes[][3] = { { 32, 9, 1 },     { 32, 40, 17 },   { 896, 37, 1 },   { 896, 37, 3 },
                                  { 896, 33, 16 },  { 896, 100, 37 }, { 4864, 19, 2 },  { 4864, 48, 20 },
                                  { 2048, 67, 130 }, { 896, 64, 512 }, { 128, 64, 1 },  { 128, 2048, 3 },
                                  { 384, 128, 2 },  { 128, 384, 5 },  { 128, 2048, 1 },
                                  { 2880, 35, 1 },  { 2880, 40, 9 } };     /* gpt-oss's rows: 90 blocks */
    int n_types = 0;
    for (size_t ti = 0; ti < KVC_ARRAY_LEN(scheme_types); ti++) {
        const uint32_t type = scheme_types[ti];
        if (!fam->k->type_ok(type))   /* left to the ISA's float path (test_kernels) */
            continue;
        n_types++;
        const int64_t bs = kvc_type_info(type)->block_size;
        for (size_t s = 0; s < KVC_ARRAY_LEN(shapes); s++)
            if (shapes[s][0] % bs == 0)
                check_matmul(type, shapes[s][0], shapes[s][1], shapes[s][2], false);
        if (bs > 32) {                        /* shapes of its own: 256-element blocks */
            check_matmul(type, 256, 21, 1, false);
            check_matmul(type, 768, 53, 7, false);
            check_matmul(type, 1536, 70, 64, false);
        }
        check_matmul(type, bs > 32 ? 768 : 896, 40, 5, true);
        check_matmul(type, bs > 32 ? 768 : 896, 40, 2, true);
        check_matmul(type, 4864, 17, 33, true);
    }
    CHECK(n_types == (fam->isa == KVC_ISA_AVX2 ? 9 : 6));
}

int main(void)
{
    check_unpack();
    const kvc_isa def = kvc_kernels_isa();
    printf("test_kernels_int8: default ISA %s\n", kvc_isa_name(def));
    int tested = 0;
    for (size_t fi = 0; fi < KVC_ARRAY_LEN(families); fi++) {
        fam = &families[fi];
        if (kvc_kernels_set_isa(fam->isa) != KVC_OK) {
            printf("  %s: not supported here, skipped\n", fam->name);
            continue;
        }
        printf("  %s\n", fam->name);
        tested++;
        check_family();
    }
    kvc_kernels_set_isa(def);
    if (!tested) {
        printf("test_kernels_int8: no ISA here uses the scheme, SIMD checks skipped\n");
        return test_failures ? 1 : TEST_SKIP;
    }
    check_accuracy(KVC_TYPE_Q8_0, 4864);
    check_accuracy(KVC_TYPE_MXFP4, 2880);       /* gpt-oss's rows */
    return test_done("test_kernels_int8");
}
