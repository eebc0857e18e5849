/* test_attention.c - the attention kernel: every ISA the CPU has gives the
 * scalar reference's bits (the lanes run the same fma chains), for F16 and
 * F32 K/V, GQA groups, head sizes and lengths that end inside a block; and
 * the result is a softmax-weighted mean of V within float rounding. */
#include "attention.h"
#include "kernels.h"
#include "quant.h"
#include "test.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static void run_case(int n_q, int hd, int64_t n_pos, bool f16)
{
    const int B = 16;
    int64_t nb = (n_pos + B - 1) / B;
    size_t elt = f16 ? 2 : 4;
    uint8_t *kmem = malloc((size_t)nb * hd * B * elt), *vmem = malloc((size_t)nb * hd * B * elt);
    const void **kb = malloc((size_t)nb * sizeof(void *)), **vb = malloc((size_t)nb * sizeof(void *));
    double *kd = malloc((size_t)nb * B * hd * sizeof(double)), *vd = malloc((size_t)nb * B * hd * sizeof(double));
    for (int64_t b = 0; b < nb; b++) {
        kb[b] = kmem + (size_t)b * hd * B * elt;
        vb[b] = vmem + (size_t)b * hd * B * elt;
        for (int r = 0; r < B; r++)
            for (int d = 0; d < hd; d++) {
                float k = 2 * frand(), v = frand();
                size_t ki = (size_t)d * B + r, vi = (size_t)r * hd + d;
                if (f16) {
                    ((kvc_fp16 *)kb[b])[ki] = kvc_fp32_to_fp16(k);
                    ((kvc_fp16 *)vb[b])[vi] = kvc_fp32_to_fp16(v);
                    k = kvc_fp16_to_fp32(kvc_fp32_to_fp16(k));
                    v = kvc_fp16_to_fp32(kvc_fp32_to_fp16(v));
                } else {
                    ((float *)kb[b])[ki] = k;
                    ((float *)vb[b])[vi] = v;
                }
                kd[(b * B + r) * hd + d] = k;
                vd[(b * B + r) * hd + d] = v;
            }
    }
    float *q = malloc((size_t)n_q * hd * sizeof(float));
    for (int i = 0; i < n_q * hd; i++)
        q[i] = frand();
    size_t ns = kvc_attn_scratch_floats(n_q, n_pos, B);
    float *sc = malloc(ns * sizeof(float)), *ref = malloc((size_t)n_q * hd * sizeof(float));
    float *out = malloc((size_t)n_q * hd * sizeof(float));
    kvc_attn_args a = { n_q, hd, B, n_pos, f16, kb, vb, q, 1.0f / sqrtf((float)hd), ref, sc };
    kvc_attention_ref(&a);
    a.out = out;
    for (int isa = KVC_ISA_SCALAR; isa <= KVC_ISA_AVX512; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        memset(out, 0xff, (size_t)n_q * hd * sizeof(float));
        kvc_attention(&a);
        CHECKF(memcmp(out, ref, (size_t)n_q * hd * sizeof(float)) == 0,
               "%s: n_q %d hd %d n_pos %lld %s differs from the reference", kvc_isa_name((kvc_isa)isa),
               n_q, hd, (long long)n_pos, f16 ? "f16" : "f32");
    }
    /* against float64 */
    double worst = 0;
    for (int h = 0; h < n_q; h++) {
        double *s = malloc((size_t)n_pos * sizeof(double)), mx = -1e300, sum = 0;
        for (int64_t j = 0; j < n_pos; j++) {
            double t = 0;
            for (int d = 0; d < hd; d++)
                t += (double)q[h * hd + d] * kd[j * hd + d];
            s[j] = t / sqrt((double)hd);
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int64_t j = 0; j < n_pos; j++)
            sum += (s[j] = exp(s[j] - mx));
        for (int d = 0; d < hd; d++) {
            double o = 0;
            for (int64_t j = 0; j < n_pos; j++)
                o += s[j] * vd[j * hd + d];
            double e = fabs(o / sum - ref[h * hd + d]);
            worst = e > worst ? e : worst;
        }
        free(s);
    }
    CHECKF(worst < 1e-5, "n_q %d hd %d n_pos %lld: %.3g from float64", n_q, hd, (long long)n_pos, worst);
    free(kmem); free(vmem); free(kb); free(vb); free(kd); free(vd);
    free(q); free(sc); free(ref); free(out);
}

int main(void)
{
    kvc_isa best = kvc_kernels_isa();
    const int64_t lens[] = { 1, 5, 16, 17, 100, 333 };
    for (int f16 = 0; f16 <= 1; f16++)
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
            run_case(1, 64, lens[l], f16);
            run_case(7, 64, lens[l], f16);
            run_case(4, 32, lens[l], f16);
            run_case(16, 128, lens[l], f16);
            run_case(2, 8, lens[l], f16);   /* not a multiple of 16: the scalar path everywhere */
        }
    kvc_kernels_set_isa(best);
    return test_done("test_attention");
}
