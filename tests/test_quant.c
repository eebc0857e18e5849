/* test_quant.c - type traits, half/bfloat conversion, reference
 * (de)quantization: hand-built blocks decode to hand-computed values, and every
 * type round-trips within its error bound. */
#include "test.h"
#include "quant.h"

#include <stdint.h>

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rnd_uniform(void) { return (float)((double)rnd_u32() / 4294967296.0); }

/* Roughly Gaussian (sum of 4 uniforms), like trained weights. */
static float rnd_weight(void)
{
    return (rnd_uniform() + rnd_uniform() + rnd_uniform() + rnd_uniform() - 2.0f) * 0.05f;
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ------------------------------------------------------------- traits */

static void test_traits(void)
{
    CHECK_EQ_INT(kvc_row_size(KVC_TYPE_Q8_0, 896), 28 * 34);
    CHECK_EQ_INT(kvc_row_size(KVC_TYPE_Q4_K, 4864), 19 * 144);
    CHECK_EQ_INT(kvc_row_size(KVC_TYPE_Q6_K, 256), 210);
    CHECK_EQ_INT(kvc_row_size(KVC_TYPE_F16, 7), 14);
    CHECK_EQ_INT(kvc_row_size(KVC_TYPE_Q4_0, 33), 0);
    CHECK_EQ_INT(kvc_row_size(99, 32), 0);
    CHECK_EQ_INT(kvc_type_from_name("Q4_K"), KVC_TYPE_Q4_K);
    CHECK_EQ_INT(kvc_type_from_name("bf16"), KVC_TYPE_BF16);
    CHECK_EQ_INT(kvc_type_from_name("q7_0"), -1);
    CHECK(kvc_type_info(KVC_TYPE_Q2_K) && !kvc_type_info(KVC_TYPE_Q2_K)->supported);
    CHECK_EQ_INT(kvc_row_size(KVC_TYPE_MXFP4, 2880), 90 * 17);      /* gpt-oss's rows */
    CHECK_EQ_INT(kvc_type_from_name("MXFP4"), KVC_TYPE_MXFP4);
    CHECK(kvc_type_info(KVC_TYPE_MXFP4)->supported);
    CHECK(kvc_type_info(4) == NULL);  /* removed q4_2 has no size */
}

/* --------------------------------------------------- half and bfloat16 */

static void test_half(void)
{
    CHECK(kvc_fp16_to_fp32(0x3c00) == 1.0f);
    CHECK(kvc_fp16_to_fp32(0xc000) == -2.0f);
    CHECK(kvc_fp16_to_fp32(0x7bff) == 65504.0f);
    CHECK(kvc_fp16_to_fp32(0x0001) == 0x1p-24f);
    CHECK(kvc_fp16_to_fp32(0x0400) == 0x1p-14f);
    CHECK(isinf(kvc_fp16_to_fp32(0xfc00)) && kvc_fp16_to_fp32(0xfc00) < 0);
    CHECK_EQ_INT(f32_bits(kvc_fp16_to_fp32(0x7c01)), 0x7fc02000u);   /* NaN comes out quiet, as F16C */

    CHECK_EQ_INT(kvc_fp32_to_fp16(1.0f), 0x3c00);
    CHECK_EQ_INT(kvc_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);          /* tie -> even */
    CHECK_EQ_INT(kvc_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);      /* tie -> even (up) */
    CHECK_EQ_INT(kvc_fp32_to_fp16(65519.0f), 0x7bff);
    CHECK_EQ_INT(kvc_fp32_to_fp16(65520.0f), 0x7c00);                 /* rounds to inf */
    CHECK_EQ_INT(kvc_fp32_to_fp16(0x1p-25f), 0x0000);                 /* tie with 0 -> 0 */
    CHECK_EQ_INT(kvc_fp32_to_fp16(0x1.8p-25f), 0x0001);
    CHECK_EQ_INT(kvc_fp32_to_fp16(-0.0f), 0x8000);
    /* every finite half survives fp16 -> fp32 -> fp16 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 10) & 0x1f) == 0x1f)
            continue;
        if (kvc_fp32_to_fp16(kvc_fp16_to_fp32((kvc_fp16)h)) != h)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);

    CHECK(kvc_bf16_to_fp32(0x3f80) == 1.0f);
    CHECK_EQ_INT(kvc_fp32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(kvc_fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);           /* tie -> even */
    CHECK_EQ_INT(kvc_fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    CHECK(isnan(kvc_bf16_to_fp32(kvc_fp32_to_bf16(NAN))));
}

/* ---------------------------------------------- hand-built blocks
 * Each block is filled field by field from the layout, and its expected
 * values are computed here from the format's definition (all exact). */

static void expect_row(const char *what, uint32_t type, const void *blk, int n, const double *want)
{
    float y[QK_K];
    kvc_dequantize_row_ref(type, blk, y, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if ((double)y[i] != want[i] && bad++ < 3)
            fprintf(stderr, "%s[%d] = %.9g, want %.9g\n", what, i, y[i], want[i]);
    CHECKF(bad == 0, "%s", what);
}

static void test_blocks_32(void)
{
    double want[32];

    block_q4_0 a = { .d = 0x3800 };           /* d = 0.5 */
    for (int j = 0; j < 16; j++)
        a.qs[j] = (uint8_t)(j | (15 - j) << 4);
    for (int j = 0; j < 16; j++) {
        want[j] = (j - 8) * 0.5;
        want[j + 16] = (7 - j) * 0.5;
    }
    expect_row("q4_0", KVC_TYPE_Q4_0, &a, 32, want);
    CHECK(want[0] == -4.0 && want[15] == 3.5 && want[31] == -4.0);

    /* MXFP4: e = 126 scales the E2M1 values (kvalues / 2) by 2^-1; e = 0 and 1
     * are the subnormal scales 2^-128, 2^-127 (ggml's E8M0 "half") */
    static const double e2m1[16] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6 };
    const uint8_t exps[] = { 126, 0, 1, 127, 200 };
    for (size_t k = 0; k < KVC_ARRAY_LEN(exps); k++) {
        block_mxfp4 x = { .e = exps[k] };
        for (int j = 0; j < 16; j++)
            x.qs[j] = (uint8_t)(j | (15 - j) << 4);
        for (int j = 0; j < 16; j++) {
            want[j] = e2m1[j] * ldexp(1.0, exps[k] - 127);
            want[j + 16] = e2m1[15 - j] * ldexp(1.0, exps[k] - 127);
        }
        expect_row("mxfp4", KVC_TYPE_MXFP4, &x, 32, want);
    }

    block_q4_1 b = { .d = 0x3400, .m = 0xbc00 };   /* d = 0.25, m = -1 */
    memcpy(b.qs, a.qs, 16);
    for (int j = 0; j < 16; j++) {
        want[j] = j * 0.25 - 1;
        want[j + 16] = (15 - j) * 0.25 - 1;
    }
    expect_row("q4_1", KVC_TYPE_Q4_1, &b, 32, want);

    /* Q5: qh = 0xaaaa5555: element j < 16 has its 5th bit when j is even,
     * element 16 + j when j is odd. */
    block_q5_0 c = { .d = 0x3c00, .qh = { 0x55, 0x55, 0xaa, 0xaa } };
    for (int j = 0; j < 16; j++)
        c.qs[j] = (uint8_t)(j | j << 4);
    for (int j = 0; j < 16; j++) {
        want[j] = (j % 2 == 0) ? j : j - 16;
        want[j + 16] = (j % 2 == 1) ? j : j - 16;
    }
    expect_row("q5_0", KVC_TYPE_Q5_0, &c, 32, want);
    CHECK(want[0] == 0 && want[1] == -15 && want[16] == -16 && want[17] == 1);

    block_q5_1 e = { .d = 0x3800, .m = 0x4000, .qh = { 0x55, 0x55, 0xaa, 0xaa } };  /* 0.5, 2 */
    memcpy(e.qs, c.qs, 16);
    for (int j = 0; j < 16; j++) {
        want[j] = ((j % 2 == 0) ? j + 16 : j) * 0.5 + 2;
        want[j + 16] = ((j % 2 == 1) ? j + 16 : j) * 0.5 + 2;
    }
    expect_row("q5_1", KVC_TYPE_Q5_1, &e, 32, want);

    block_q8_0 f = { .d = 0x4000 };           /* d = 2 */
    for (int j = 0; j < 32; j++) {
        f.qs[j] = (int8_t)(j * 8 - 128);
        want[j] = (j * 8 - 128) * 2.0;
    }
    expect_row("q8_0", KVC_TYPE_Q8_0, &f, 32, want);
}

static const int k_sc[8] = { 1, 2, 3, 4, 17, 33, 50, 63 };
static const int k_mn[8] = { 0, 5, 10, 63, 16, 20, 1, 40 };

/* 6-bit scale and min of sub-block j into the 12-byte field. */
static void put_scale_min(uint8_t s[12], int j, int sc, int m)
{
    if (j < 4) {
        s[j] = (uint8_t)((s[j] & 0xc0) | sc);
        s[j + 4] = (uint8_t)((s[j + 4] & 0xc0) | m);
    } else {
        s[j + 4] = (uint8_t)((sc & 15) | (m & 15) << 4);
        s[j - 4] |= (uint8_t)((sc >> 4) << 6);
        s[j] |= (uint8_t)((m >> 4) << 6);
    }
}

static void test_blocks_k(void)
{
    double want[QK_K];

    block_q4_K a;
    memset(&a, 0, sizeof a);
    a.d = 0x3800;      /* 0.5 */
    a.dmin = 0x3400;   /* 0.25 */
    for (int j = 0; j < 8; j++)
        put_scale_min(a.scales, j, k_sc[j], k_mn[j]);
    for (int e = 0; e < QK_K; e++) {
        int j = e / 32, i = e % 32, q = (e * 7) % 16;
        a.qs[32 * (j / 2) + i] |= (uint8_t)(q << (4 * (j % 2)));
        want[e] = 0.5 * k_sc[j] * q - 0.25 * k_mn[j];
    }
    expect_row("q4_K", KVC_TYPE_Q4_K, &a, QK_K, want);
    CHECK(want[33] == 5.75 && want[200] == 199.75);

    block_q5_K b;
    memset(&b, 0, sizeof b);
    b.d = 0x3800;
    b.dmin = 0x3400;
    memcpy(b.scales, a.scales, 12);
    for (int e = 0; e < QK_K; e++) {
        int j = e / 32, i = e % 32, q = (e * 13) % 32;
        b.qs[32 * (j / 2) + i] |= (uint8_t)((q & 15) << (4 * (j % 2)));
        b.qh[i] |= (uint8_t)((q >> 4) << j);
        want[e] = 0.5 * k_sc[j] * q - 0.25 * k_mn[j];
    }
    expect_row("q5_K", KVC_TYPE_Q5_K, &b, QK_K, want);
    CHECK(want[33] == 11.75 && want[255] == 588.5);

    block_q6_K c;
    memset(&c, 0, sizeof c);
    c.d = 0x3000;      /* 0.125 */
    for (int s = 0; s < 16; s++)
        c.scales[s] = (int8_t)(s * 9 - 70);
    for (int e = 0; e < QK_K; e++) {
        int h = e / 128, p = e % 128, quarter = p / 32, l = p % 32, q = (e * 5) % 64;
        uint8_t *ql = c.ql + 64 * h + l + 32 * (quarter % 2);
        *ql |= (uint8_t)((q & 15) << (4 * (quarter / 2)));
        c.qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * quarter));
        want[e] = 0.125 * c.scales[e / 16] * (q - 32);
    }
    expect_row("q6_K", KVC_TYPE_Q6_K, &c, QK_K, want);
    CHECK(want[0] == 280 && want[100] == -40 && want[255] == 219.375);
}

static void test_float_rows(void)
{
    const kvc_fp16 h[3] = { 0x3c00, 0xc200, 0x0001 };
    const kvc_bf16 g[3] = { 0x3f80, 0xc040, 0x0000 };
    const float f[3] = { 1.5f, -0.0f, 3e38f };
    float y[3];
    kvc_dequantize_row_ref(KVC_TYPE_F16, h, y, 3);
    CHECK(y[0] == 1.0f && y[1] == -3.0f && y[2] == 0x1p-24f);
    kvc_dequantize_row_ref(KVC_TYPE_BF16, g, y, 3);
    CHECK(y[0] == 1.0f && y[1] == -3.0f && y[2] == 0.0f);
    kvc_dequantize_row_ref(KVC_TYPE_F32, f, y, 3);
    CHECK(memcmp(y, f, sizeof f) == 0);
}

/* ------------------------------------------------------- round trips */

typedef struct {
    uint32_t type;
    double   max_rel_rms;   /* bound on rms(error) / rms(x) */
} rt_case;

static void test_round_trip(void)
{
    /* bounds: about 1.5x what these quantizers reach on Gaussian-like data */
    static const rt_case cases[] = {
        { KVC_TYPE_F32, 0.0 },      { KVC_TYPE_F16, 3.2e-4 },   { KVC_TYPE_BF16, 2.6e-3 },
        { KVC_TYPE_Q8_0, 0.008 },   { KVC_TYPE_Q4_0, 0.12 },    { KVC_TYPE_Q4_1, 0.115 },
        { KVC_TYPE_Q5_0, 0.06 },    { KVC_TYPE_Q5_1, 0.056 },   { KVC_TYPE_Q4_K, 0.105 },
        { KVC_TYPE_Q5_K, 0.053 },   { KVC_TYPE_Q6_K, 0.027 },   { KVC_TYPE_MXFP4, 0.17 },
    };
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (int i = 0; i < N; i++)
        x[i] = rnd_weight() * (1.0f + (float)((i / 256) % 5));   /* varying block magnitudes */
    double sx = 0;
    for (int i = 0; i < N; i++)
        sx += (double)x[i] * x[i];

    for (size_t c = 0; c < KVC_ARRAY_LEN(cases); c++) {
        const uint32_t type = cases[c].type;
        const char *name = kvc_type_info(type)->name;
        size_t got = kvc_quantize_row_ref(type, x, q, N);
        CHECKF(got == kvc_row_size(type, N), "%s: wrote %zu bytes", name, got);
        kvc_dequantize_row_ref(type, q, y, N);
        double se = 0;
        for (int i = 0; i < N; i++)
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        double rel = sqrt(se / sx);
        CHECKF(rel <= cases[c].max_rel_rms, "%s: relative rms error %.4g > %.4g", name, rel,
               cases[c].max_rel_rms);
        if (getenv("KVC_TEST_VERBOSE"))
            printf("  %-5s rel rms error %.5f\n", name, rel);

        /* deterministic */
        static uint8_t q2[N * 4];
        kvc_quantize_row_ref(type, x, q2, N);
        CHECKF(memcmp(q, q2, got) == 0, "%s: quantization not deterministic", name);

        /* zeros stay zeros */
        static const float zero[256];
        float z[256];
        kvc_quantize_row_ref(type, zero, q2, 256);
        kvc_dequantize_row_ref(type, q2, z, 256);
        int nz = 0;
        for (int i = 0; i < 256; i++)
            nz += z[i] != 0.0f;
        CHECKF(nz == 0, "%s: zero row dequantizes to %d nonzeros", name, nz);
    }

    /* Q8_0: the canonical formula (d = amax / 127, q = round(x / d)); every
     * element within half a step plus the fp16 rounding of d (127 * 2^-11 d);
     * quantizing its own output is a fixed point. */
    block_q8_0 b8[N / 32], b8b[N / 32];
    kvc_quantize_row_ref(KVC_TYPE_Q8_0, x, b8, N);
    kvc_dequantize_row_ref(KVC_TYPE_Q8_0, b8, y, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float d = kvc_fp16_to_fp32(b8[i / 32].d);
        if (fabs((double)y[i] - x[i]) > (0.5 + 127.0 / 2048) * d)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    float amax = 0;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    CHECK_EQ_INT(b8[0].d, kvc_fp32_to_fp16(amax / 127.0f));
    kvc_quantize_row_ref(KVC_TYPE_Q8_0, y, b8b, N);
    CHECK(memcmp(b8, b8b, sizeof b8) == 0);

    /* bad sizes are refused */
    CHECK_EQ_INT(kvc_quantize_row_ref(KVC_TYPE_Q4_K, x, q, 200), 0);
    CHECK_EQ_INT(kvc_quantize_row_ref(KVC_TYPE_Q2_K, x, q, 256), 0);
}

/* K-quants: a block with one large outlier sub-block still codes the others. */
static void test_k_dynamic_range(void)
{
    float x[QK_K], y[QK_K];
    uint8_t q[256];
    for (int i = 0; i < QK_K; i++)
        x[i] = (i < 32 ? 10.0f : 0.1f) * (rnd_uniform() - 0.3f);
    const uint32_t types[] = { KVC_TYPE_Q4_K, KVC_TYPE_Q5_K, KVC_TYPE_Q6_K };
    for (size_t t = 0; t < 3; t++) {
        kvc_quantize_row_ref(types[t], x, q, QK_K);
        kvc_dequantize_row_ref(types[t], q, y, QK_K);
        double se = 0, sx = 0;
        for (int i = 32; i < QK_K; i++) {
            se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        CHECKF(sqrt(se / sx) < 0.25, "%s: small sub-blocks lost next to a large one (%.3f)",
               kvc_type_info(types[t])->name, sqrt(se / sx));
    }
}

/* MXFP4's quantizer picks, for each element, the code whose value is
 * nearest x / d, the lower code on a tie (ggml's best_index_mxfp4, a search
 * over all 16): checked against that search, on elements at the values,
 * at the midpoints between them (ties), just beside them, random ones, and
 * zeros, subnormals, NaN and infinities. */
static void test_mxfp4_codes(void)
{
    enum { NB = 512 };
    static float x[NB * 32];
    static block_mxfp4 q[NB];
    static const int mag[8] = { 0, 1, 2, 3, 4, 6, 8, 12 };
    for (int b = 0; b < NB; b++) {
        const float s = ldexpf(1.0f, b % 40 - 20);           /* the block's scale, d around s / 2 */
        for (int j = 0; j < 32; j++) {
            const int k = (b * 7 + j * 3) % 8, sign = (b + j) % 2 ? -1 : 1;
            float v;
            switch ((b + j) % 6) {
            case 0: v = (float)mag[k] * 0.5f * s; break;                                   /* a value */
            case 1: v = (float)(mag[k] + mag[KVC_MIN(k + 1, 7)]) * 0.25f * s; break;     /* a midpoint */
            case 2: v = nextafterf((float)(mag[k] + mag[KVC_MIN(k + 1, 7)]) * 0.25f * s, 0.0f); break;
            case 3: v = nextafterf((float)(mag[k] + mag[KVC_MIN(k + 1, 7)]) * 0.25f * s, INFINITY); break;
            default: v = rnd_weight() * 8.0f * s; break;
            }
            x[32 * b + j] = (float)sign * v;
        }
        x[32 * b + (b % 32)] = 7.0f * s;                     /* the block's largest */
    }
    const float odd[] = { 0.0f, -0.0f, 1e-45f, -1e-45f, 1e-39f, NAN, INFINITY, -INFINITY };
    for (size_t i = 0; i < KVC_ARRAY_LEN(odd); i++)
        x[32 * (NB - 1) + 3 * i + 1] = x[32 * (NB - 2) + 3 * i + 1] = odd[i];
    for (int j = 0; j < 32; j++)
        x[32 * (NB - 3) + j] = j % 2 ? 1e-40f : -3e-41f;   /* a subnormal block: e = 0 */
    kvc_quantize_row_ref(KVC_TYPE_MXFP4, x, q, NB * 32);
    int bad = 0;
    for (int b = 0; b < NB; b++) {
        const float d = kvc_e8m0_half(q[b].e);
        for (int j = 0; j < 32; j++) {
            const float v = x[32 * b + j];
            int best = 0;
            float best_err = fabsf(v - (float)kvc_mxfp4_values[0] * d);
            for (int c = 1; c < 16; c++) {
                const float err = fabsf(v - (float)kvc_mxfp4_values[c] * d);
                if (err < best_err)
                    best = c, best_err = err;
            }
            const int got = j < 16 ? q[b].qs[j] & 15 : q[b].qs[j - 16] >> 4;
            if (got != best && bad++ < 3)
                fprintf(stderr, "mxfp4 block %d [%d]: x %.9g, d %g: code %d, nearest %d\n", b, j, v, d, got, best);
        }
    }
    CHECKF(bad == 0, "mxfp4: %d codes not the nearest (lower on ties)", bad);
    CHECK_EQ_INT(q[NB - 3].e, 0);
}

int main(void)
{
    test_traits();
    test_half();
    test_blocks_32();
    test_blocks_k();
    test_float_rows();
    test_round_trip();
    test_mxfp4_codes();
    test_k_dynamic_range();
    return test_done("test_quant");
}
