/* ab_kernels.c - an AVX2 matmul kernel of an older revision against the
 * working tree's, in one process, alternating call by call. Not a test; built
 * and run by bench/ab_kernels.sh, which compiles both revisions' kernel files
 * with their entry points renamed old_* and new_*. (-DKVC_BENCH=ON links it
 * with both sides bound to the tree's kernels, so CI keeps it building.)
 *
 * WHY. The machines are shared and noisy: the same binary's speed moves by
 * 10-20% from one run to the next, more than most kernel changes. Timing the
 * two versions one call after the other, many times, and taking the median of
 * the per-pair ratios cancels most of that.
 *
 * Types the AVX2 integer scheme takes (kernels_int8.h) run through its two
 * steps: the activations are quantized once (by each side, timed and compared
 * too), then old and new matmul_act read them. Other types run through the
 * float ops table's matmul_rows. Both sides must give the same bits (the
 * kernels' contract): if not, the harness says so and exits 1. The quantized
 * activations' layout is the working tree's, so a revision whose layout
 * differs cannot be compared, nor one older than matmul_act's tok argument.
 *
 * Usage: ab_kernels TYPE N_IN N_OUT N_TOK [PAIRS (15)] [COPIES (1)]
 * COPIES > 1 rotates through that many copies of the weights (cold caches). */
#include "kernels.h"
#include "kernels_int8.h"
#include "kernels_internal.h"
#include "quant.h"
#include "ab_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern const kvc_kernel_ops old_float_ops, new_float_ops;
kvc_act_quantize_fn old_i8_quantize, new_i8_quantize;
kvc_matmul_act_fn old_i8_act, new_i8_act;
size_t old_i8_scratch(int64_t n_in);
size_t new_i8_scratch(int64_t n_in);

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

/* One side's call: float ops or the integer scheme's matmul_act. */
typedef struct side {
    const kvc_kernel_ops *ops;
    kvc_matmul_act_fn    *act;
} side;

typedef struct problem {
    kvc_weight   w;
    const uint8_t *copies;
    int          n_copies;
    const float *x;
    const uint8_t *qx;   /* quantized x, integer scheme */
    int64_t      n_tok;
    float       *scratch;
} problem;

static double run(const side *s, problem *p, int copy, float *y)
{
    p->w.data = p->copies + (size_t)copy * p->w.row_bytes * (size_t)p->w.n_out;
    const double t0 = now_s();
    if (s->act)
        s->act(&p->w, p->qx, NULL, p->n_tok, y, p->w.n_out, 0, p->w.n_out, p->scratch);
    else
        s->ops->matmul_rows(&p->w, p->x, p->w.n_in, p->n_tok, y, p->w.n_out, 0, p->w.n_out, p->scratch);
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s TYPE N_IN N_OUT N_TOK [PAIRS] [COPIES]\n", argv[0]);
        return 2;
    }
    if (kvc_kernels_isa() < KVC_ISA_AVX2) {
        fprintf(stderr, "ab_kernels: this CPU has no AVX2\n");
        return 2;
    }
    uint32_t type = UINT32_MAX;
    for (uint32_t t = 0; t < 64; t++) {
        const kvc_type_traits *tt = kvc_type_info(t);
        if (tt && tt->supported && strcmp(tt->name, argv[1]) == 0)
            type = t;
    }
    const int64_t n_in = atoll(argv[2]), n_out = atoll(argv[3]), n_tok = atoll(argv[4]);
    const int pairs = argc > 5 ? atoi(argv[5]) : 15, n_copies = argc > 6 ? atoi(argv[6]) : 1;
    if (type == UINT32_MAX || n_in <= 0 || n_in % 32 || n_out <= 0 || n_tok <= 0 || pairs < 1 ||
        pairs > MAX_PAIRS || n_copies < 1 || kvc_row_size(type, n_in) == 0) {
        fprintf(stderr, "ab_kernels: bad arguments (TYPE a supported type name, N_IN a multiple of 32 and of "
                        "the type's block, PAIRS 1-%d)\n", MAX_PAIRS);
        return 2;
    }
    const bool int8 = kvc_i8_avx2_type_ok(type);
    const size_t rb = kvc_row_size(type, n_in), mat = rb * (size_t)n_out;

    srand(1);
    float *wf = malloc((size_t)n_in * sizeof(float));
    uint8_t *copies = malloc(mat * (size_t)n_copies);
    float *x = malloc((size_t)(n_in * n_tok) * sizeof(float));
    const size_t as = kvc_i8_act_row_bytes(n_in);
    uint8_t *qx_old = aligned_alloc(64, as * (size_t)n_tok), *qx_new = aligned_alloc(64, as * (size_t)n_tok);
    size_t sf = int8 ? KVC_MAX(old_i8_scratch(n_in), new_i8_scratch(n_in))
                     : KVC_MAX(old_float_ops.matmul_scratch_floats(n_in), new_float_ops.matmul_scratch_floats(n_in));
    float *scratch = aligned_alloc(64, (sf * sizeof(float) + 63) / 64 * 64);
    float *y_old = malloc((size_t)(n_out * n_tok) * sizeof(float)), *y_new = malloc((size_t)(n_out * n_tok) * sizeof(float));
    if (!wf || !copies || !x || !qx_old || !qx_new || !scratch || !y_old || !y_new) {
        fprintf(stderr, "ab_kernels: out of memory\n");
        return 2;
    }
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++)
            wf[i] = frand();
        kvc_quantize_row_ref(type, wf, copies + (size_t)r * rb, n_in);
    }
    for (int c = 1; c < n_copies; c++)
        memcpy(copies + (size_t)c * mat, copies, mat);
    for (int64_t i = 0; i < n_in * n_tok; i++)
        x[i] = frand() * (i % 97 == 0 ? 40.0f : 1.0f);   /* some outliers, as real activations have */

    double t_old[MAX_PAIRS], t_new[MAX_PAIRS];
    printf("%s %lld->%lld x%lld, %s path, %d cop%s of the weights\n", argv[1], (long long)n_in, (long long)n_out,
           (long long)n_tok, int8 ? "integer" : "float", n_copies, n_copies > 1 ? "ies" : "y");
    if (int8) {
        old_i8_quantize(x, n_in, n_in, 0, n_tok, qx_old);
        new_i8_quantize(x, n_in, n_in, 0, n_tok, qx_new);
        if (memcmp(qx_old, qx_new, as * (size_t)n_tok) != 0) {
            printf("the quantized activations DIFFER\n");
            return 1;
        }
        for (int i = 0; i < pairs; i++) {
            double t0 = now_s();
            old_i8_quantize(x, n_in, n_in, 0, n_tok, qx_old);
            t_old[i] = now_s() - t0;
            t0 = now_s();
            new_i8_quantize(x, n_in, n_in, 0, n_tok, qx_new);
            t_new[i] = now_s() - t0;
        }
        report("quantize", (double)(n_in * n_tok) * 1e-9, "G elements/s", t_old, t_new, pairs);
    }
    const side s_old = { &old_float_ops, int8 ? old_i8_act : NULL };
    const side s_new = { &new_float_ops, int8 ? new_i8_act : NULL };
    problem p = { { type, n_in, n_out, rb, NULL }, copies, n_copies, x, qx_new, n_tok, scratch };
    run(&s_old, &p, 0, y_old);
    run(&s_new, &p, 0, y_new);
    if (memcmp(y_old, y_new, (size_t)(n_out * n_tok) * sizeof(float)) != 0) {
        printf("the outputs DIFFER\n");
        return 1;
    }
    printf("same bits\n");
    for (int i = 0; i < pairs; i++) {
        /* each side reads a different copy than the other read last */
        t_old[i] = run(&s_old, &p, (2 * i) % n_copies, y_old);
        t_new[i] = run(&s_new, &p, (2 * i + 1) % n_copies, y_new);
    }
    report("matmul", 2.0 * (double)n_in * (double)n_out * (double)n_tok * 1e-9, "GFLOP/s", t_old, t_new, pairs);
    return 0;
}
