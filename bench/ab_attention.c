/* ab_attention.c - the AVX2 integer attention kernel (attention_avx2_i16.c)
 * of an older revision against the working tree's, in one process,
 * alternating call by call (ab_kernels.c says why). Not a test; built and
 * run by `bench/ab_kernels.sh REV attention ...`, which compiles both
 * revisions' kernel file with its ops renamed old_attn_ops and new_attn_ops.
 *
 * The shape is Qwen2.5-0.5B's (7 query heads per KV head, head dim 64, F16
 * K/V): a tile of TILE_TOK tokens after DEPTH cached positions, through the
 * blocks every row sees whole (the bulk of a prefill at depth; the diagonal
 * blocks are left out), the way attention.c's walk takes them. Each copy of
 * K/V has its blocks in a scattered order, as in the pool. Both sides must
 * give the same bits; if not, the harness says so and exits 1. A revision
 * whose block layout in the scratch (attention.h) differs cannot be compared.
 *
 * Usage: ab_attention DEPTH TILE_TOK [PAIRS (15)] [COPIES (1)] */
#include "attention.h"
#include "kernels.h"
#include "quant.h"
#include "ab_common.h"

#include <math.h>
#include <string.h>

extern const kvc_attn_i16_ops old_attn_ops, new_attn_ops;

enum { N_Q = 7, HD = 64, B = KVC_ATTN_B };

/* The scratch accessors for a revision that calls them (ab_kernels.sh points
 * its calls here): attention.h has them inline now. */
int16_t *ab_attn_i16_q(const kvc_attn_args *a);
float *ab_attn_i16_cq(const kvc_attn_args *a);
uint8_t *ab_attn_i16_slot(const kvc_attn_args *a, int i);
int16_t *ab_attn_i16_q(const kvc_attn_args *a) { return kvc_attn_i16_q(a); }
float *ab_attn_i16_cq(const kvc_attn_args *a) { return kvc_attn_i16_cq(a); }
uint8_t *ab_attn_i16_slot(const kvc_attn_args *a, int i) { return kvc_attn_i16_slot(a, i); }

/* Blocks [0, n_full) into every row of the tile, as attention.c's full_i16
 * does, from the state walk starts with. */
static double run(const kvc_attn_i16_ops *ops, const kvc_attn_args *a, int64_t n_full)
{
    const double t0 = now_s();
    const int32_t rows = a->n_tok * a->n_q;
    kvc_attn_state_init(a, true);
    kvc_attn_i16_block ib[KVC_ATTN_I16_SLOTS];
    for (int i = 0; i < KVC_ATTN_I16_SLOTS; i++)
        ib[i] = kvc_attn_i16_block_at(a, i);
    for (int64_t b = 0, nb; b < n_full; b += nb) {
        nb = KVC_MIN(n_full - b, (int64_t)ops->max_nb);
        for (int i = 0; i < nb; i++)
            ops->convert(a, b + i, 0, B, &ib[i]);
        ops->rows(a, ib, 0, rows, 0, B, (int)nb);
    }
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s DEPTH TILE_TOK [PAIRS] [COPIES]\n", argv[0]);
        return 2;
    }
    if (kvc_kernels_isa() < KVC_ISA_AVX2) {
        fprintf(stderr, "ab_attention: this CPU has no AVX2\n");
        return 2;
    }
    const int64_t depth = atoll(argv[1]);
    const int n_tok = atoi(argv[2]), pairs = argc > 3 ? atoi(argv[3]) : 15, n_copies = argc > 4 ? atoi(argv[4]) : 1;
    if (depth < B || n_tok < 1 || n_tok > 4096 || pairs < 1 || pairs > MAX_PAIRS || n_copies < 1 || n_copies > 256) {
        fprintf(stderr, "ab_attention: bad arguments (DEPTH >= %d, TILE_TOK 1-4096, PAIRS 1-%d, COPIES 1-256)\n", B,
                MAX_PAIRS);
        return 2;
    }
    const int64_t n_blk = (depth + n_tok + B - 1) / B, n_full = (depth + 1) / B, blk = (int64_t)B * HD;
    const int64_t ld = (int64_t)N_Q * HD, n_x = n_tok * ld;
    kvc_fp16 *kv = malloc((size_t)(2 * n_blk * blk * n_copies) * sizeof(kvc_fp16));
    const void **ptr = malloc((size_t)(2 * n_blk * n_copies) * sizeof(void *));
    float *q = malloc((size_t)n_x * sizeof(float));
    float *o_old = malloc((size_t)n_x * sizeof(float)), *o_new = malloc((size_t)n_x * sizeof(float));
    float *scratch = aligned_alloc(64, (kvc_attn_scratch_floats((int64_t)n_tok * N_Q, HD) * sizeof(float) + 63) / 64 * 64);
    if (!kv || !ptr || !q || !o_old || !o_new || !scratch) {
        fprintf(stderr, "ab_attention: out of memory\n");
        return 2;
    }
    srand(1);
    for (int64_t i = 0; i < 2 * n_blk * blk; i++)
        kv[i] = kvc_fp32_to_fp16((float)rand() / (float)RAND_MAX - 0.5f);
    for (int c = 0; c < n_copies; c++) {
        kvc_fp16 *k = kv + (size_t)c * 2 * n_blk * blk, *v = k + n_blk * blk;
        if (c > 0)
            memcpy(k, kv, (size_t)(2 * n_blk * blk) * sizeof(kvc_fp16));
        /* block b of the sequence at slot (b * 7919) % n_blk: scattered (a
         * permutation while n_blk is not a multiple of the prime 7919) */
        for (int64_t b = 0; b < n_blk; b++) {
            const int64_t at = n_blk % 7919 ? b * 7919 % n_blk : b;
            ptr[(size_t)c * 2 * n_blk + b] = k + at * blk;
            ptr[(size_t)c * 2 * n_blk + n_blk + b] = v + at * blk;
        }
    }
    for (int64_t i = 0; i < n_x; i++)
        q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    kvc_attn_args a = { .n_tok = n_tok, .n_q = N_Q, .hd = HD, .n_pos = depth + 1, .f16 = true, .q = q, .ldq = ld,
                        .scale = 1.0f / sqrtf((float)HD), .ldo = ld, .scratch = scratch };
    kvc_attn_i16_quantize_q_simd(&a);   /* the q rows in integer form, which both sides read */

    printf("attention: %d tokens x %d heads after %lld positions, hd %d, F16 K/V, %d cop%s of K/V\n", n_tok, N_Q,
           (long long)depth, HD, n_copies, n_copies > 1 ? "ies" : "y");
    a.k = ptr;
    a.v = ptr + n_blk;
    a.out = o_old;
    run(&old_attn_ops, &a, n_full);
    a.out = o_new;
    run(&new_attn_ops, &a, n_full);
    if (memcmp(o_old, o_new, (size_t)n_x * sizeof(float)) != 0) {
        printf("the outputs DIFFER\n");
        return 1;
    }
    printf("same bits\n");
    double t_old[MAX_PAIRS], t_new[MAX_PAIRS];
    for (int i = 0; i < pairs; i++) {
        /* each side reads a different copy than the other read last */
        for (int s = 0; s < 2; s++) {
            const size_t c = (size_t)((2 * i + s) % n_copies);
            a.k = ptr + c * 2 * n_blk;
            a.v = a.k + n_blk;
            a.out = s ? o_new : o_old;
            (s ? t_new : t_old)[i] = run(s ? &new_attn_ops : &old_attn_ops, &a, n_full);
        }
    }
    report("attention", 4.0 * HD * N_Q * (double)n_tok * (double)(n_full * B) * 1e-9, "GFLOP/s", t_old, t_new,
           pairs);
    return 0;
}
