/* test_attention.c - the tiled attention kernel: every ISA the CPU has gives
 * the bits of its scheme's scalar reference (the float one, or on "vnni"
 * and "avx2", for head dims that are multiples of 32 up to 256, the integer
 * one), for F16 and F32 K/V, GQA groups, head sizes, tiles of 1 to 40 tokens and lengths
 * that end inside a block; a tile's rows equal the same tokens run one at a
 * time (prefill = decode); positions a token does not see may hold inf or NaN
 * without effect; and the result is a softmax-weighted mean of V within float
 * rounding of a float64 computation (the integer scheme: within 1e-3 of
 * the largest output, also when K has a few dimensions 20 times larger).
 * The same with a sliding window (smaller and larger than a block and than
 * the tile; blocks wholly below the window are NULL, so reading one
 * crashes; positions below the window are poisoned), attention sinks and
 * another scale; a window wider than everything gives the bits of none.
 *
 * Under valgrind (test_attention_valgrind, when valgrind is installed) the
 * poisoned positions are also marked undefined, as a block's positions the
 * pool never wrote are: any use of them, even one that cannot change a bit
 * (times 0, or a lane blended away after a VCVTPH2PS valgrind taints whole),
 * is an error; a smaller set of cases runs (valgrind hides AVX-512: the
 * avx2 kernels, float and integer, and the scalar ones). */
#include "attention.h"
#include "kernels.h"
#include "quant.h"
#include "test.h"

#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#define VALGRIND_MAKE_MEM_UNDEFINED(p, n) ((void)(p), (void)(n))
#endif

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

typedef struct kv_case {
    int      hd;
    int64_t  nb;
    bool     f16;
    uint8_t *kmem, *vmem;
    const void **kb, **vb;
    double  *kd, *vd;     /* [position][hd] as the kernel sees them */
} kv_case;

/* n_total positions of random K/V; the rest of the last block is poisoned,
 * and so are the positions below lo; the blocks wholly below lo are NULL.
 * outliers: K's dimensions 3 and hd - 5 are 20 times larger (as real keys
 * have a few). */
static void kv_make(kv_case *c, int hd, int64_t n_total, int64_t lo, bool f16, bool outliers)
{
    const int B = KVC_ATTN_B;
    c->hd = hd;
    c->f16 = f16;
    c->nb = (n_total + B - 1) / B;
    size_t elt = f16 ? 2 : 4, blk = (size_t)hd * B * elt;
    c->kmem = malloc((size_t)c->nb * blk);
    c->vmem = malloc((size_t)c->nb * blk);
    c->kb = malloc((size_t)c->nb * sizeof(void *));
    c->vb = malloc((size_t)c->nb * sizeof(void *));
    c->kd = malloc((size_t)c->nb * B * hd * sizeof(double));
    c->vd = malloc((size_t)c->nb * B * hd * sizeof(double));
    for (int64_t b = 0; b < c->nb; b++) {
        c->kb[b] = c->kmem + (size_t)b * blk;
        c->vb[b] = c->vmem + (size_t)b * blk;
        for (int r = 0; r < B; r++)
            for (int d = 0; d < hd; d++) {
                float k = 2 * frand(), v = frand();
                if (outliers && (d == 3 || d == hd - 5))
                    k *= 20;
                if (b * B + r >= n_total || b * B + r < lo)   /* never seen: must not matter */
                    k = (r & 1) ? INFINITY : NAN, v = (r & 1) ? NAN : INFINITY;
                size_t ki = (size_t)d * B + r, vi = (size_t)r * hd + d;
                if (f16) {
                    ((kvc_fp16 *)c->kb[b])[ki] = kvc_fp32_to_fp16(k);
                    ((kvc_fp16 *)c->vb[b])[vi] = kvc_fp32_to_fp16(v);
                    k = kvc_fp16_to_fp32(kvc_fp32_to_fp16(k));
                    v = kvc_fp16_to_fp32(kvc_fp32_to_fp16(v));
                } else {
                    ((float *)c->kb[b])[ki] = k;
                    ((float *)c->vb[b])[vi] = v;
                }
                if (b * B + r >= n_total || b * B + r < lo) {   /* as never written */
                    VALGRIND_MAKE_MEM_UNDEFINED((const uint8_t *)c->kb[b] + ki * elt, elt);
                    VALGRIND_MAKE_MEM_UNDEFINED((const uint8_t *)c->vb[b] + vi * elt, elt);
                }
                c->kd[(b * B + r) * hd + d] = k;
                c->vd[(b * B + r) * hd + d] = v;
            }
        if ((b + 1) * B <= lo)
            c->kb[b] = c->vb[b] = NULL;
    }
}

static void kv_free(kv_case *c)
{
    free(c->kmem); free(c->vmem); free(c->kb); free(c->vb); free(c->kd); free(c->vd);
}

/* The float64 attention of one query over positions [lo, n_pos) with the
 * scores times scale and (sink not NULL) *sink in the denominator: worst
 * error of out, relative to the largest |output| when rel. */
static double f64_error(const kv_case *c, const float *q, int64_t lo, int64_t n_pos, double scale,
                        const float *sink, const float *out, bool rel)
{
    const int hd = c->hd;
    double *s = malloc((size_t)n_pos * sizeof(double)), mx = sink ? *sink : -1e300, sum = 0, worst = 0;
    for (int64_t j = lo; j < n_pos; j++) {
        double t = 0;
        for (int d = 0; d < hd; d++)
            t += (double)q[d] * c->kd[j * hd + d];
        s[j] = t * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int64_t j = lo; j < n_pos; j++)
        sum += (s[j] = exp(s[j] - mx));
    if (sink)
        sum += exp(*sink - mx);
    double big = 0;
    for (int d = 0; d < hd; d++) {
        double o = 0;
        for (int64_t j = lo; j < n_pos; j++)
            o += s[j] * c->vd[j * hd + d];
        double e = fabs(o / sum - out[d]);
        worst = e > worst ? e : worst;
        big = fabs(o / sum) > big ? fabs(o / sum) : big;
    }
    free(s);
    return rel ? worst / big : worst;
}

/* A tile of n_tok tokens, the first at position n_pos - 1, n_q heads each. */
static double i16_worst;   /* the integer scheme's largest relative error from float64 */

typedef struct attn_opts {
    int32_t window;   /* 0: none */
    bool    sinks;    /* a random sink per head */
    float   scale;    /* 0: 1/sqrt(hd) */
} attn_opts;

static int64_t first_seen(int64_t p, int32_t w)
{
    return w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
}

static void run_case_opts(int n_q, int hd, int64_t n_pos, int n_tok, bool f16, bool outliers, attn_opts op)
{
    kv_case c;
    kv_make(&c, hd, n_pos + n_tok - 1, first_seen(n_pos - 1, op.window), f16, outliers);
    float sinks[16];
    for (int h = 0; h < n_q; h++)
        sinks[h] = 3.0f * frand();   /* from well below the scores to well above */
    const float scale = op.scale != 0.0f ? op.scale : 1.0f / sqrtf((float)hd);
    const int64_t ld = (int64_t)n_q * hd + 3;    /* rows of a batch are wider than the tile */
    const size_t nf = (size_t)n_tok * ld;
    float *q = malloc(nf * sizeof(float)), *ref = calloc(nf, sizeof(float));
    float *out = calloc(nf, sizeof(float)), *one = calloc(nf, sizeof(float));
    float *sc = malloc(kvc_attn_scratch_floats((int64_t)n_tok * n_q, hd) * sizeof(float));
    for (size_t i = 0; i < nf; i++)
        q[i] = frand();
    kvc_attn_args a = { .n_tok = n_tok, .n_q = n_q, .hd = hd, .n_pos = n_pos, .window = op.window, .f16 = f16,
                        .k = c.kb, .v = c.vb, .q = q, .ldq = ld, .scale = scale,
                        .sinks = op.sinks ? sinks : NULL, .out = ref, .ldo = ld, .scratch = sc };
    kvc_attention_ref(&a);
    float *ref_i16 = calloc(nf, sizeof(float));
    const bool i16 = kvc_attn_i16_ok(hd);
    if (i16) {
        a.out = ref_i16;
        kvc_attention_ref_i16(&a);
    }
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        const float *want = kvc_attn_uses_i16(hd) ? ref_i16 : ref;
        a.out = out;
        memset(out, 0xff, nf * sizeof(float));
        kvc_attention(&a);
        bool same = true;
        for (int t = 0; t < n_tok; t++)
            same = same && memcmp(out + t * ld, want + t * ld, (size_t)n_q * hd * sizeof(float)) == 0;
        CHECKF(same, "%s: n_q %d hd %d n_pos %lld n_tok %d w %d%s %s differs from the reference",
               kvc_isa_name((kvc_isa)isa), n_q, hd, (long long)n_pos, n_tok, op.window, op.sinks ? " sinks" : "",
               f16 ? "f16" : "f32");
        /* the same tokens one at a time, as decode steps */
        for (int t = 0; t < n_tok; t++) {
            kvc_attn_args d = a;
            d.n_tok = 1;
            d.n_pos = n_pos + t;
            d.q = q + t * ld;
            d.out = one + t * ld;
            kvc_attention(&d);
        }
        same = true;
        for (int t = 0; t < n_tok; t++)
            same = same && memcmp(one + t * ld, want + t * ld, (size_t)n_q * hd * sizeof(float)) == 0;
        CHECKF(same, "%s: n_q %d hd %d n_pos %lld w %d: a tile of %d differs from its tokens one by one",
               kvc_isa_name((kvc_isa)isa), n_q, hd, (long long)n_pos, op.window, n_tok);
        /* a window wider than every token's past: the bits of no window */
        if (op.window > 0 && op.window >= n_pos + n_tok - 1) {
            kvc_attn_args n = a;
            n.window = 0;
            n.out = one;
            kvc_attention(&n);
            same = true;
            for (int t = 0; t < n_tok; t++)
                same = same && memcmp(one + t * ld, out + t * ld, (size_t)n_q * hd * sizeof(float)) == 0;
            CHECKF(same, "%s: window %d wider than n_pos %lld + %d changes bits",
                   kvc_isa_name((kvc_isa)isa), op.window, (long long)n_pos, n_tok);
        }
    }
    double worst = 0, worst_i16 = 0;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_q; h++) {
            const float *qr = q + t * ld + h * hd, *sk = op.sinks ? &sinks[h] : NULL;
            const int64_t lo = first_seen(n_pos - 1 + t, op.window);
            double e = f64_error(&c, qr, lo, n_pos + t, scale, sk, ref + t * ld + h * hd, false);
            worst = e > worst ? e : worst;
            if (i16) {
                e = f64_error(&c, qr, lo, n_pos + t, scale, sk, ref_i16 + t * ld + h * hd, true);
                worst_i16 = e > worst_i16 ? e : worst_i16;
            }
        }
    CHECKF(worst < (outliers ? 1e-4 : 1e-5), "n_q %d hd %d n_pos %lld n_tok %d: %.3g from float64", n_q, hd,
           (long long)n_pos, n_tok, worst);
    /* measured: 5.8e-4 at most, outliers or not (K's scale follows its
     * norm, which a few large dimensions do not take from the others) */
    CHECKF(worst_i16 < 1e-3, "n_q %d hd %d n_pos %lld n_tok %d%s: integer scheme %.3g (relative) from float64",
           n_q, hd, (long long)n_pos, n_tok, outliers ? " outliers" : "", worst_i16);
    i16_worst = worst_i16 > i16_worst ? worst_i16 : i16_worst;
    kv_free(&c);
    free(q); free(ref); free(ref_i16); free(out); free(one); free(sc);
}

static void run_case(int n_q, int hd, int64_t n_pos, int n_tok, bool f16, bool outliers)
{
    run_case_opts(n_q, hd, n_pos, n_tok, f16, outliers, (attn_opts){ 0 });
}

/* Sliding windows, sinks and scales, in every ISA: windows of 1 (a token
 * sees itself), inside one block, a block and a bit, wider than the tile,
 * and wider than everything; Gemma's scale 1.0 and head dims 256 and 512
 * (Gemma 4's global layers), gpt-oss's 64 with sinks. */
static void window_cases(void)
{
    const int64_t lens[] = { 1, 7, 16, 33, 100, 333 };
    const int toks[] = { 1, 5, 16, 40 };
    const int32_t wins[] = { 1, 5, 16, 23, 128, 1000 };
    for (int f16 = 0; f16 <= 1; f16++)
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
            for (size_t t = 0; t < sizeof(toks) / sizeof(toks[0]); t++)
                for (size_t w = 0; w < sizeof(wins) / sizeof(wins[0]); w++) {
                    const attn_opts plain = { wins[w], false, 0.0f }, sink = { wins[w], true, 0.0f };
                    run_case_opts(8, 64, lens[l], toks[t], f16, false, sink);      /* gpt-oss */
                    run_case_opts(7, 64, lens[l], toks[t], f16, true, plain);
                    run_case_opts(2, 256, lens[l], toks[t], f16, false, (attn_opts){ wins[w], false, 1.0f / 16 });
                    run_case_opts(4, 32, lens[l], toks[t], f16, false, sink);
                    run_case_opts(3, 80, lens[l], toks[t], f16, false, sink);     /* float on every ISA */
                    run_case_opts(2, 8, lens[l], toks[t], f16, false, plain);
                    run_case_opts(3, 12, lens[l], toks[t], f16, false, sink);     /* scalar everywhere */
                }
    /* Gemma: scale 1.0 with small q/k (QK-normed in the model), head dims 256
     * and 512, window and none */
    for (int f16 = 0; f16 <= 1; f16++)
        for (int32_t w = 0; w <= 20; w += 20) {
            run_case_opts(2, 256, 50, 9, f16, false, (attn_opts){ w, false, 1.0f / 16 });
            run_case_opts(2, 512, 50, 9, f16, false, (attn_opts){ w, false, 1.0f / 22.6f });
            run_case_opts(1, 512, 97, 1, f16, false, (attn_opts){ w, true, 1.0f / 22.6f });
        }
}

/* Under valgrind: lengths ending inside a block and windows whose lower
 * edge cuts one, on the integer scheme (hd 64, 32) and the float one (80). */
static void valgrind_cases(void)
{
    const int64_t lens[] = { 5, 17, 33 };
    const int toks[] = { 1, 5 };
    const int32_t wins[] = { 0, 5, 23 };
    for (int f16 = 0; f16 <= 1; f16++)
        for (size_t l = 0; l < KVC_ARRAY_LEN(lens); l++)
            for (size_t t = 0; t < KVC_ARRAY_LEN(toks); t++)
                for (size_t w = 0; w < KVC_ARRAY_LEN(wins); w++) {
                    const attn_opts op = { wins[w], w == 1, 0.0f };
                    run_case_opts(8, 64, lens[l], toks[t], f16, false, op);
                    run_case_opts(4, 32, lens[l], toks[t], f16, false, op);
                    run_case_opts(3, 80, lens[l], toks[t], f16, false, op);
                }
}

int main(void)
{
    if (RUNNING_ON_VALGRIND) {
        valgrind_cases();
        return test_done("test_attention (valgrind)");
    }
    kvc_isa best = kvc_kernels_isa();
    const int64_t lens[] = { 1, 5, 16, 17, 60, 100, 333 };   /* 60: whole blocks two at a time and one alone */
    const int toks[] = { 1, 3, 16, 40 };
    for (int f16 = 0; f16 <= 1; f16++)
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
            for (size_t t = 0; t < sizeof(toks) / sizeof(toks[0]); t++) {
                run_case(1, 64, lens[l], toks[t], f16, false);
                run_case(7, 64, lens[l], toks[t], f16, false);
                run_case(7, 64, lens[l], toks[t], f16, true);
                run_case(4, 32, lens[l], toks[t], f16, false);
                run_case(16, 128, lens[l], toks[t], f16, false);
                run_case(5, 80, lens[l], toks[t], f16, false);  /* output chunks of 64, 32 and 16 */
                run_case(2, 8, lens[l], toks[t], f16, false);   /* avx2 only; scalar on avx512 */
                run_case(2, 288, lens[l], toks[t], f16, false); /* past the integer scheme: float, whole blocks */
                run_case(3, 12, lens[l], toks[t], f16, false);  /* not a multiple of 8: scalar everywhere */
            }
    window_cases();
    printf("integer scheme: largest error relative to the largest output, from float64: %.3g\n", i16_worst);
    kvc_kernels_set_isa(best);
    return test_done("test_attention");
}
