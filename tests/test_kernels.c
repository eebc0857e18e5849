/* test_kernels.c - the kernels against their scalar reference, and the
 * invariance contract of kernels.h checked bitwise.
 *
 * For every ISA this CPU has and every weight type:
 *   - matmul vs the scalar ISA and vs a float64 dot, within a tolerance
 *     relative to sum |w||x| (each ISA has its own summation order);
 *   - bitwise: a token alone (decode) == the same token inside batches of
 *     1..37 at any position == the same rows computed in other r0/r1 splits,
 *     across shapes that exercise tails, k-blocks and token blocks;
 *   - only y[t][r0..r1) is written;
 *   - kvc_dequantize_row == kvc_dequantize_row_ref bitwise;
 *   - attention helpers vs scalar; fp16 row conversions bitwise. */
#include "test.h"
#include "kernels.h"
#include "quant.h"
#include "kernels_int8.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

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
    return p;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static const uint32_t all_types[] = {
    KVC_TYPE_F32, KVC_TYPE_F16, KVC_TYPE_BF16, KVC_TYPE_Q4_0, KVC_TYPE_Q4_1, KVC_TYPE_Q5_0,
    KVC_TYPE_Q5_1, KVC_TYPE_Q8_0, KVC_TYPE_Q4_K, KVC_TYPE_Q5_K, KVC_TYPE_Q6_K, KVC_TYPE_MXFP4,
};

typedef struct {
    kvc_weight w;
    void      *data;  /* n_out * row_bytes */
    float     *deq;   /* n_out * n_in, the reference dequantization */
} wmat;

/* Random weights quantized to `type`, rows of varying magnitude. */
static void make_weight(wmat *m, uint32_t type, int64_t n_in, int64_t n_out)
{
    size_t rb = kvc_row_size(type, n_in);
    m->data = xalloc(rb * (size_t)n_out);
    m->deq = xalloc(sizeof(float) * (size_t)(n_in * n_out));
    float *row = xalloc(sizeof(float) * (size_t)n_in);
    for (int64_t r = 0; r < n_out; r++) {
        float scale = 0.02f + (float)(r % 7) * 0.3f;
        for (int64_t k = 0; k < n_in; k++)
            row[k] = rnd_f() * scale;
        size_t got = kvc_quantize_row_ref(type, row, (uint8_t *)m->data + rb * (size_t)r, n_in);
        CHECK_EQ_INT(got, rb);
        kvc_dequantize_row_ref(type, (uint8_t *)m->data + rb * (size_t)r, m->deq + r * n_in, n_in);
    }
    free(row);
    m->w = (kvc_weight){ .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rb, .data = m->data };
}

static void free_weight(wmat *m)
{
    free(m->data);
    free(m->deq);
}

/* kvc_matmul_rows with a scratch buffer of exactly the advertised size
 * (so ASan sees any overrun); every other call gets it misaligned by 4 bytes,
 * which the kernels must tolerate. */
static void matmul(const wmat *m, const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                   int64_t r0, int64_t r1)
{
    static unsigned calls;
    const int skew = (int)(calls++ & 1);
    size_t n = kvc_matmul_scratch_floats(m->w.n_in);
    float *scratch = xalloc((n + (size_t)skew) * sizeof(float));
    kvc_matmul_rows(&m->w, x, ldx, n_tok, y, ldy, r0, r1, scratch + skew);
    free(scratch);
}

/* ------------------------------------------------------- matmul checks */

#define MAX_TOK 37

/* What the two-plane activations of one dot may add to its error:
 * sum over blocks of max|x| / 32512 * sum |w| (|x - d a| <= d, d = max|x| / 32512). */
static double i8_bound(const float *w, const float *x, int64_t n)
{
    double e = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        double amax = 0, sw = 0;
        for (int i = 0; i < 32; i++) {
            amax = fmax(amax, fabs(x[32 * b + i]));
            sw += fabs(w[32 * b + i]);
        }
        e += amax / 32512.0 * sw;
    }
    return e * 1.01;
}

/* One weight type and shape on the current ISA. */
static void check_matmul(uint32_t type, int64_t n_in, int64_t n_out)
{
    const kvc_isa isa = kvc_kernels_isa();
    const char *tn = kvc_type_info(type)->name;
    wmat m;
    make_weight(&m, type, n_in, n_out);
    const bool int8 = kvc_matmul_uses_act(&m.w);   /* the integer scheme on this ISA */
    const int64_t ldx = n_in + 5, ldy = n_out + 3;
    float *x = xalloc(sizeof(float) * (size_t)(ldx * MAX_TOK));
    for (int64_t i = 0; i < ldx * MAX_TOK; i++)
        x[i] = rnd_f();

    /* decode: each token alone */
    float *y1 = xalloc(sizeof(float) * (size_t)(ldy * MAX_TOK));
    for (int t = 0; t < MAX_TOK; t++)
        matmul(&m, x + t * ldx, ldx, 1, y1 + t * ldy, ldy, 0, n_out);

    /* against float64 and against the scalar reference */
    float *yref = xalloc(sizeof(float) * (size_t)(ldy * MAX_TOK));
    kvc_kernels_set_isa(KVC_ISA_SCALAR);
    matmul(&m, x, ldx, MAX_TOK, yref, ldy, 0, n_out);
    kvc_kernels_set_isa(isa);
    int bad = 0;
    for (int t = 0; t < MAX_TOK; t++)
        for (int64_t r = 0; r < n_out; r++) {
            double exact = 0, mag = 0;
            for (int64_t k = 0; k < n_in; k++) {
                exact += (double)m.deq[r * n_in + k] * x[t * ldx + k];
                mag += fabs((double)m.deq[r * n_in + k] * x[t * ldx + k]);
            }
            double tol = 2e-6 * mag + 1e-30;
            if (int8) /* and the two-plane activations' error, bounded per block (kernels_int8.h) */
                tol += i8_bound(m.deq + r * n_in, x + t * ldx, n_in);
            double v = y1[t * ldy + r], ref = yref[t * ldy + r];
            if (fabs(v - exact) > tol || fabs(ref - exact) > 2e-6 * mag + 1e-30 || fabs(v - ref) > tol)
                if (bad++ < 3)
                    fprintf(stderr, "%s %s n_in %lld: y[%d][%lld] = %.9g, scalar %.9g, exact %.9g (tol %g)\n",
                            kvc_isa_name(isa), tn, (long long)n_in, t, (long long)r, v, ref, exact, tol);
        }
    CHECKF(bad == 0, "%s %s n_in %lld: %d elements off", kvc_isa_name(isa), tn, (long long)n_in, bad);

    /* bitwise: batches of every size at several offsets */
    float *yb = xalloc(sizeof(float) * (size_t)(ldy * MAX_TOK));
    bad = 0;
    for (int nt = 1; nt <= MAX_TOK; nt++) {
        const int starts[] = { 0, (MAX_TOK - nt) / 2, MAX_TOK - nt };
        for (int s = 0; s < 3; s++) {
            const int t0 = starts[s];
            matmul(&m, x + t0 * ldx, ldx, nt, yb, ldy, 0, n_out);
            for (int t = 0; t < nt; t++)
                for (int64_t r = 0; r < n_out; r++)
                    if (!same_bits(yb[t * ldy + r], y1[(t0 + t) * ldy + r]) && bad++ < 3)
                        fprintf(stderr, "%s %s n_in %lld: batch %d token %d row %lld: %.9g vs alone %.9g\n",
                                kvc_isa_name(isa), tn, (long long)n_in, nt, t0 + t, (long long)r,
                                yb[t * ldy + r], y1[(t0 + t) * ldy + r]);
        }
    }
    CHECKF(bad == 0, "%s %s n_in %lld: batch results differ from decode", kvc_isa_name(isa), tn, (long long)n_in);

    /* bitwise: row splits, and nothing outside [r0, r1) written */
    const int64_t cuts[] = { 0, 1, n_out / 3, n_out / 3 + 5, n_out - 2, n_out };
    for (int i = 0; i < ldy * MAX_TOK; i++)
        yb[i] = -12345.0f;
    bad = 0;
    for (int c = 0; c + 1 < (int)KVC_ARRAY_LEN(cuts); c++)
        if (cuts[c] < cuts[c + 1])
            matmul(&m, x, ldx, MAX_TOK, yb, ldy, cuts[c], cuts[c + 1]);
    for (int t = 0; t < MAX_TOK; t++) {
        for (int64_t r = 0; r < n_out; r++)
            if (!same_bits(yb[t * ldy + r], y1[t * ldy + r]))
                bad++;
        for (int64_t r = n_out; r < ldy; r++)
            if (yb[t * ldy + r] != -12345.0f)
                bad++;
    }
    CHECKF(bad == 0, "%s %s n_in %lld: row splits differ (%d)", kvc_isa_name(isa), tn, (long long)n_in, bad);

    /* kvc_dot_f32 follows the same order as an F32 matmul element */
    if (type == KVC_TYPE_F32) {
        bad = 0;
        for (int64_t r = 0; r < n_out; r++)
            if (!same_bits(kvc_dot_f32(m.deq + r * n_in, x, n_in), y1[r]))
                bad++;
        CHECKF(bad == 0, "%s dot_f32 != matmul f32 element (n %lld)", kvc_isa_name(isa), (long long)n_in);
    }

    free(x);
    free(y1);
    free(yref);
    free(yb);
    free_weight(&m);
}

/* A batch longer than one token block, partial last row group, many k-blocks. */
static void check_long_batch(uint32_t type, int64_t n_in, int64_t n_out, int64_t n_tok)
{
    const kvc_isa isa = kvc_kernels_isa();
    wmat m;
    make_weight(&m, type, n_in, n_out);
    float *x = xalloc(sizeof(float) * (size_t)(n_in * n_tok));
    for (int64_t i = 0; i < n_in * n_tok; i++)
        x[i] = rnd_f();
    float *yb = xalloc(sizeof(float) * (size_t)(n_out * n_tok));
    float *y1 = xalloc(sizeof(float) * (size_t)n_out);
    matmul(&m, x, n_in, n_tok, yb, n_out, 0, n_out);
    int bad = 0;
    for (int64_t t = 0; t < n_tok; t += 7) {
        matmul(&m, x + t * n_in, n_in, 1, y1, n_out, 0, n_out);
        for (int64_t r = 0; r < n_out; r++)
            if (!same_bits(y1[r], yb[t * n_out + r]))
                bad++;
    }
    CHECKF(bad == 0, "%s %s n_in %lld n_tok %lld: long batch differs from decode (%d)", kvc_isa_name(isa),
           kvc_type_info(type)->name, (long long)n_in, (long long)n_tok, bad);
    free(x);
    free(yb);
    free(y1);
    free_weight(&m);
}

/* ------------------------------------------------------ other kernels */

/* Random block bytes whose fp16 scales are finite. */
static void random_blocks(uint32_t type, uint8_t *buf, int64_t n)
{
    size_t bytes = kvc_row_size(type, n);
    for (size_t i = 0; i < bytes; i++)
        buf[i] = (uint8_t)rnd_u32();
    const kvc_type_traits *t = kvc_type_info(type);
    for (int64_t b = 0; b < n / t->block_size; b++) {
        uint8_t *blk = buf + (size_t)b * t->type_size;
        kvc_fp16 *h = NULL;
        int nh = 0;
        switch (type) {
        case KVC_TYPE_F16:  h = (kvc_fp16 *)blk; nh = 1; break;
        case KVC_TYPE_Q4_0: case KVC_TYPE_Q5_0: case KVC_TYPE_Q8_0: h = (kvc_fp16 *)blk; nh = 1; break;
        case KVC_TYPE_Q4_1: case KVC_TYPE_Q5_1: case KVC_TYPE_Q4_K: case KVC_TYPE_Q5_K:
            h = (kvc_fp16 *)blk; nh = 2; break;
        case KVC_TYPE_Q6_K: h = &((block_q6_K *)blk)->d; nh = 1; break;
        case KVC_TYPE_MXFP4: blk[0] = (uint8_t)(90 + blk[0] % 64); break;   /* 12 * 2^(e-128) finite */
        default: break;
        }
        for (int i = 0; i < nh; i++)
            if (((h[i] >> 10) & 0x1f) == 0x1f)
                h[i] &= 0xbfff;          /* exponent 31 -> 15: finite */
    }
    if (type == KVC_TYPE_F32 || type == KVC_TYPE_BF16)
        for (int64_t i = 0; i < n; i++) {   /* finite floats */
            if (type == KVC_TYPE_F32)
                ((float *)buf)[i] = rnd_f() * 100.0f;
            else if ((((kvc_bf16 *)buf)[i] & 0x7f80) == 0x7f80)
                ((kvc_bf16 *)buf)[i] &= 0xbfff;
        }
}

static void check_dequant(void)
{
    const kvc_isa isa = kvc_kernels_isa();
    const int64_t ns[] = { 256, 512, 4864 + 256, 7, 100 };
    uint8_t *buf = xalloc(6000 * 4);
    float *a = xalloc(6000 * 4), *b = xalloc(6000 * 4);
    for (size_t ti = 0; ti < KVC_ARRAY_LEN(all_types); ti++)
        for (size_t ni = 0; ni < KVC_ARRAY_LEN(ns); ni++) {
            const uint32_t type = all_types[ti];
            const int64_t n = ns[ni];
            if (n % kvc_type_info(type)->block_size != 0)
                continue;
            random_blocks(type, buf, n);
            kvc_dequantize_row_ref(type, buf, a, n);
            kvc_dequantize_row(type, buf, b, n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++)
                if (!same_bits(a[i], b[i]) && bad++ < 2)
                    fprintf(stderr, "%s dequant %s [%lld]: %.9g vs ref %.9g\n", kvc_isa_name(isa),
                            kvc_type_info(type)->name, (long long)i, b[i], a[i]);
            CHECKF(bad == 0, "%s dequant %s n %lld", kvc_isa_name(isa), kvc_type_info(type)->name, (long long)n);
        }
    free(buf);
    free(a);
    free(b);
}

static void check_attention_helpers(void)
{
    const kvc_isa isa = kvc_kernels_isa();
    const int64_t ns[] = { 1, 7, 8, 15, 16, 17, 64, 128, 131 };
    float a[160], b[160], y[160], y0[160];
    kvc_fp16 h[160];
    for (size_t ni = 0; ni < KVC_ARRAY_LEN(ns); ni++) {
        const int64_t n = ns[ni];
        double mag = 0, exact = 0, exact_h = 0;
        for (int64_t i = 0; i < n; i++) {
            a[i] = rnd_f();
            b[i] = rnd_f();
            h[i] = kvc_fp32_to_fp16(a[i]);
            exact += (double)a[i] * b[i];
            exact_h += (double)kvc_fp16_to_fp32(h[i]) * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        CHECK_NEAR(kvc_dot_f32(a, b, n), exact, 1e-6 * mag);
        CHECK_NEAR(kvc_dot_f16_f32(h, b, n), exact_h, 1e-6 * mag);
        kvc_kernels_set_isa(KVC_ISA_SCALAR);
        float ds = kvc_dot_f32(a, b, n), dhs = kvc_dot_f16_f32(h, b, n);
        kvc_kernels_set_isa(isa);
        CHECK_NEAR(kvc_dot_f32(a, b, n), ds, 1e-6 * mag);
        CHECK_NEAR(kvc_dot_f16_f32(h, b, n), dhs, 1e-6 * mag);
        /* same inputs, same ISA: same bits */
        CHECK(same_bits(kvc_dot_f32(a, b, n), kvc_dot_f32(a, b, n)));

        /* axpy: one rounding (fma) or two (scalar): within 1 ulp-ish of exact */
        const float alpha = 0.37f;
        for (int pass = 0; pass < 2; pass++) {
            for (int64_t i = 0; i < n + 8; i++)
                y[i] = y0[i] = rnd_f();
            if (pass == 0)
                kvc_axpy_f32(alpha, a, y, n);
            else
                kvc_axpy_f16(alpha, h, y, n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double xi = pass == 0 ? a[i] : kvc_fp16_to_fp32(h[i]);
                double e = (double)y0[i] + (double)alpha * xi;
                if (fabs(y[i] - e) > 3e-7 * (fabs(y0[i]) + fabs(alpha * xi)))
                    bad++;
            }
            for (int64_t i = n; i < n + 8; i++)
                if (!same_bits(y[i], y0[i]))
                    bad++;
            CHECKF(bad == 0, "%s axpy %s n %lld", kvc_isa_name(isa), pass ? "f16" : "f32", (long long)n);
        }
    }
}

/* SwiGLU: bitwise the scalar kernel on every ISA (kernels.h), and within a
 * few ulp of silu(g) * u in double; tails of every length. */
static void check_swiglu(void)
{
    const kvc_isa isa = kvc_kernels_isa();
    enum { N = 4096 + 13 };
    float *g = xalloc(N * 4), *u = xalloc(N * 4), *y = xalloc(N * 4), *ys = xalloc(N * 4);
    for (int i = 0; i < N; i++) {
        /* magnitudes from 1e-6 to ~200: both signs, past exp's -80 clamp */
        const float mag = powf(10.0f, -6.0f + 8.3f * (float)((i * 7919) % N) / N);
        g[i] = (i % 2 ? -mag : mag);
        u[i] = rnd_f();
    }
    const float special[] = { 0.0f, -0.0f, 1e-40f, -1e-40f, 80.0f, -80.0f, 88.0f, -88.0f, 1e30f, -1e30f };
    memcpy(g, special, sizeof(special));
    const int64_t ns[] = { 1, 7, 8, 15, 16, 17, 31, N };
    int bad = 0, far = 0;
    for (size_t k = 0; k < KVC_ARRAY_LEN(ns); k++) {
        const int64_t n = ns[k];
        memcpy(ys, g, (size_t)N * 4);
        memcpy(y, g, (size_t)N * 4);
        kvc_kernels_set_isa(KVC_ISA_SCALAR);
        kvc_swiglu(ys, u, n);
        kvc_kernels_set_isa(isa);
        kvc_swiglu(y, u, n);
        for (int64_t i = 0; i < N; i++)
            if (!same_bits(y[i], ys[i]) || (i >= n && !same_bits(y[i], g[i])))
                bad++;
    }
    for (int i = 0; i < N; i++) {
        const double gi = g[i], want = gi / (1.0 + exp(-gi)) * u[i];
        if (fabs(y[i] - want) > 4 * FLT_EPSILON * fabs(want) + 1e-32)   /* -0 past |g| = 80 */
            far++;
    }
    CHECKF(bad == 0, "%s swiglu: %d elements differ from the scalar kernel", kvc_isa_name(isa), bad);
    CHECKF(far == 0, "%s swiglu: %d elements off silu(g) * u", kvc_isa_name(isa), far);
    free(g);
    free(u);
    free(y);
    free(ys);
}

/* The Gated DeltaNet row (kernels.h): against the same steps in double, and
 * against the scalar reference, for head sizes with and without tails; the
 * elements past n untouched; the same bits twice. */
static void check_gdn_row(void)
{
    const kvc_isa isa = kvc_kernels_isa();
    const int64_t ns[] = { 1, 7, 8, 15, 16, 17, 64, 128, 131 };
    float s[160], s0[160], ss[160], k[160], q[160];
    for (size_t ni = 0; ni < KVC_ARRAY_LEN(ns); ni++) {
        const int64_t n = ns[ni];
        for (int64_t i = 0; i < n + 8; i++) {
            s0[i] = rnd_f();
            k[i] = rnd_f() / sqrtf((float)n);
            q[i] = rnd_f() / sqrtf((float)n);
        }
        const float decay = 0.93f, v = 0.4f, beta = 0.7f;
        double e[160], kv = 0, o = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            e[i] = (double)s0[i] * decay;
            kv += e[i] * k[i];
        }
        const double d = ((double)v - kv) * beta;
        for (int64_t i = 0; i < n; i++) {
            e[i] += d * k[i];
            o += e[i] * q[i];
            mag += fabs(e[i] * q[i]) + fabs(e[i]);
        }
        memcpy(s, s0, sizeof(s));
        const float got = kvc_gdn_row(s, k, q, decay, v, beta, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += fabs(s[i] - e[i]) > 1e-6 * (fabs(e[i]) + 1);
        for (int64_t i = n; i < n + 8; i++)
            bad += !same_bits(s[i], s0[i]);
        CHECKF(bad == 0, "%s gdn_row n %lld: %d state elements off", kvc_isa_name(isa), (long long)n, bad);
        CHECK_NEAR(got, o, 1e-5 * mag);
        memcpy(ss, s0, sizeof(ss));
        kvc_kernels_set_isa(KVC_ISA_SCALAR);
        const float ref = kvc_gdn_row(ss, k, q, decay, v, beta, n);
        kvc_kernels_set_isa(isa);
        CHECK_NEAR(got, ref, 1e-5 * mag);
        memcpy(ss, s0, sizeof(ss));
        CHECK(same_bits(kvc_gdn_row(ss, k, q, decay, v, beta, n), got) && memcmp(ss, s, sizeof(s)) == 0);
    }
}

/* fp16 row conversions: bitwise the scalar conversions of quant.c. */
static void check_fp16_rows(void)
{
    const kvc_isa isa = kvc_kernels_isa();
    enum { N = 65536 };
    kvc_fp16 *h = xalloc(N * 2), *h2 = xalloc(N * 2);
    float *f = xalloc(N * 4), *g = xalloc(N * 4);
    for (int i = 0; i < N; i++)
        h[i] = (kvc_fp16)i;                    /* every half, NaNs included */
    kvc_fp16_to_fp32_row(h, f, N - 3);
    int bad = 0;
    for (int i = 0; i < N - 3; i++) {
        float r = kvc_fp16_to_fp32(h[i]);
        if (!same_bits(f[i], r))
            bad++;
    }
    CHECKF(bad == 0, "%s fp16->fp32 row: %d differ", kvc_isa_name(isa), bad);

    /* floats: random bit patterns plus the edges of rounding, overflow and subnormals */
    static const uint32_t edges[] = { 0x477fefffu, 0x477ff000u, 0x477fe000u, 0x38800000u, 0x387fffffu,
                                      0x33000000u, 0x33000001u, 0x32ffffffu, 0x3f801000u, 0x3f803000u,
                                      0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u, 0x00000001u,
                                      0x80000000u, 0x3f800fffu, 0x387fc000u, 0x38001000u };
    for (int i = 0; i < N; i++) {
        uint32_t u = i < (int)KVC_ARRAY_LEN(edges) ? edges[i] : rnd_u32() ^ (rnd_u32() << 16);
        if (i >= 1000 && i < 40000)
            u = (u & 0x807fffffu) | (uint32_t)(0x60 + i % 0x30) << 23;  /* 2^-31 .. 2^16: half's range */
        memcpy(&g[i], &u, 4);
    }
    kvc_fp32_to_fp16_row(g, h2, N - 5);
    bad = 0;
    for (int i = 0; i < N - 5; i++)
        if (h2[i] != kvc_fp32_to_fp16(g[i]) && bad++ < 3) {
            uint32_t u;
            memcpy(&u, &g[i], 4);
            fprintf(stderr, "%s fp32->fp16 %08x: %04x vs scalar %04x\n", kvc_isa_name(isa), u, h2[i],
                    kvc_fp32_to_fp16(g[i]));
        }
    CHECKF(bad == 0, "%s fp32->fp16 row: %d differ", kvc_isa_name(isa), bad);
    free(h);
    free(h2);
    free(f);
    free(g);
}

/* ---------------------------------------------------------------- main */

int main(void)
{
    const kvc_isa best = kvc_kernels_isa();
    printf("kernels: default ISA %s\n", kvc_isa_name(best));
    CHECK_EQ_INT(kvc_kernels_set_isa((kvc_isa)7), KVC_ERR_INVALID_ARG);

    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK) {
            printf("  %s: not supported here, skipped\n", kvc_isa_name((kvc_isa)isa));
            continue;
        }
        CHECK_EQ_INT(kvc_kernels_isa(), isa);
        check_dequant();
        check_attention_helpers();
        check_fp16_rows();
        check_swiglu();
        check_gdn_row();
        for (size_t ti = 0; ti < KVC_ARRAY_LEN(all_types); ti++) {
            const uint32_t type = all_types[ti];
            const int bs = kvc_type_info(type)->block_size;
            if (bs == 1) {
                const int64_t shapes[][2] = { { 13, 9 }, { 896, 37 }, { 1037, 11 }, { 4864, 13 } };
                for (size_t s = 0; s < KVC_ARRAY_LEN(shapes); s++)
                    check_matmul(type, shapes[s][0], shapes[s][1]);
            } else if (bs == 32) {
                const int64_t shapes[][2] = { { 32, 9 }, { 896, 37 }, { 4864, 13 } };
                for (size_t s = 0; s < KVC_ARRAY_LEN(shapes); s++)
                    check_matmul(type, shapes[s][0], shapes[s][1]);
            } else {
                const int64_t shapes[][2] = { { 256, 21 }, { 512, 10 }, { 2304, 11 } };
                for (size_t s = 0; s < KVC_ARRAY_LEN(shapes); s++)
                    check_matmul(type, shapes[s][0], shapes[s][1]);
            }
        }
        check_long_batch(KVC_TYPE_Q8_0, 4864, 11, 130);
        check_long_batch(KVC_TYPE_F16, 896, 9, 400);
        check_long_batch(KVC_TYPE_Q4_K, 2048, 5, 200);
    }
    kvc_kernels_set_isa(best);
    return test_done("test_kernels");
}
