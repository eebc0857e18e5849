/* test_mxfp4.c - gpt-oss with MXFP4 experts, end to end, on every ISA this
 * CPU has: the avx2 and vnni ISAs run the experts through the integer
 * scheme (kernels_int8.h: the E2M1 values as integers, 2^(e - 128) as the
 * block scale), the scalar and avx512 ISAs through the float path (the
 * weights dequantized). Both must compute the same model:
 *   - the expert weights (and the dense Q8_0 ones) take the integer path
 *     exactly where the ISA has it (kvc_matmul_uses_act);
 *   - every position's logits of a 48-token prompt, fed in one batch
 *     (prefill kernels) and one token at a time (decode kernels), are within
 *     2e-3 of the logits' scale of the scalar ISA's, and the argmax agrees
 *     where the scalar top two are apart by more than that.
 * A kernel that misread MXFP4 (a wrong scale, a wrong code table) moves the
 * logits by far more: the kernels' bitwise checks are in test_kernels_int8,
 * their float comparison in test_kernels. Needs nothing from ../shared. */
#include "forward.h"
#include "kernels.h"
#include "kvchat.h"
#include "model_gen.h"
#include "test.h"

#include <math.h>
#include <unistd.h>

#define N_TOK 48

/* All logits [N_TOK][V], fed in chunks of `chunk`; NULL on failure. */
static float *logits_of(kvc_model *m, const int32_t *toks, int chunk)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 2;
    return test_chunked_logits(m, cp, toks, N_TOK, chunk);
}

/* Logits l of the current ISA against the scalar ISA's ref: the largest
 * difference relative to each position's largest |logit|, and the positions
 * whose clear argmax (top two apart by more than tol of the scale) moved. */
static void compare(const float *l, const float *ref, int64_t n_vocab, const char *what, double tol)
{
    double worst = 0.0;
    int moved = 0, clear = 0;
    for (int t = 0; t < N_TOK; t++) {
        const float *a = l + (size_t)t * n_vocab, *r = ref + (size_t)t * n_vocab;
        double scale = 0.0, diff = 0.0;
        int64_t best = 0, best_a = 0;
        for (int64_t v = 0; v < n_vocab; v++) {
            scale = fmax(scale, fabs(r[v]));
            diff = fmax(diff, fabs((double)a[v] - r[v]));
            best = r[v] > r[best] ? v : best;
            best_a = a[v] > a[best_a] ? v : best_a;
        }
        double second = -INFINITY;
        for (int64_t v = 0; v < n_vocab; v++)
            if (v != best)
                second = fmax(second, r[v]);
        worst = fmax(worst, diff / fmax(scale, 1e-30));
        if (r[best] - second > tol * scale) {
            clear++;
            moved += best_a != best;
        }
    }
    printf("  %-8s %-7s max |dlogit| / max |logit| %.2e, argmax moved at %d of %d clear positions\n",
           kvc_isa_name(kvc_kernels_isa()), what, worst, moved, clear);
    CHECKF(worst <= tol, "%s %s: logits off the scalar ISA's by %.3g of their scale", kvc_isa_name(kvc_kernels_isa()),
           what, worst);
    CHECKF(moved == 0 && clear >= N_TOK / 2, "%s %s: argmax moved at %d of %d clear positions",
           kvc_isa_name(kvc_kernels_isa()), what, moved, clear);
}

int main(void)
{
    char dir[] = "/tmp/kvc_test_mxfp4_XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/gpt-oss.gguf", dir);
    kvc_gen_params p;
    CHECK_EQ_INT(kvc_gen_preset("tiny-gpt-oss", &p), KVC_OK);
    p.ftype = "mxfp4_moe";                   /* experts MXFP4, the rest Q8_0 (gpt-oss's release) */
    p.n_embd = 256, p.n_ff_exp = 192, p.n_ff = 192, p.head_dim = 64;
    p.n_threads = 2;
    char err[512];
    CHECKF(kvc_gen_write(&p, path, err, sizeof(err)) == KVC_OK, "gen: %s", err);
    kvc_model *m = NULL;
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load: %s", err);
    if (!m)
        return test_done("test_mxfp4");
    const kvc_layer *L = &m->layers[0];
    const kvc_weight gate = kvc_expert(&L->gate_exps, 1), down = kvc_expert(&L->down_exps, 2);
    CHECK(gate.type == KVC_TYPE_MXFP4 && down.type == KVC_TYPE_MXFP4 && L->wq.type == KVC_TYPE_Q8_0);

    kvc_model_info info;
    kvc_model_get_info(m, &info);
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((2654435761u * (uint32_t)(i + 3)) % (uint32_t)info.n_vocab);
    const kvc_isa def = kvc_kernels_isa();
    kvc_kernels_set_isa(KVC_ISA_SCALAR);
    float *ref = logits_of(m, toks, N_TOK);
    for (int isa = KVC_ISA_SCALAR; ref && isa <= KVC_ISA_VNNI; isa++) {
        if (kvc_kernels_set_isa((kvc_isa)isa) != KVC_OK)
            continue;
        const bool integer = isa == KVC_ISA_AVX2 || isa == KVC_ISA_VNNI;
        CHECKF(kvc_matmul_uses_act(&gate) == integer && kvc_matmul_uses_act(&down) == integer &&
               kvc_matmul_uses_act(&L->wq) == integer,
               "%s: the MXFP4 experts %s the integer path", kvc_isa_name((kvc_isa)isa),
               integer ? "do not take" : "take");
        float *batch = logits_of(m, toks, N_TOK), *one = logits_of(m, toks, 1);
        if (batch && one) {
            compare(batch, ref, info.n_vocab, "prefill", 2e-3);
            compare(one, ref, info.n_vocab, "decode", 2e-3);
        }
        free(batch);
        free(one);
    }
    kvc_kernels_set_isa(def);
    free(ref);
    kvc_model_free(m);
    unlink(path);
    rmdir(dir);
    return test_done("test_mxfp4");
}
