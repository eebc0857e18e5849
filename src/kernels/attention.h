/* attention.h - causal attention over a sequence's cached K/V blocks, for a
 * tile of queries: n_tok consecutive tokens of one sequence times the n_q
 * query heads that share one KV head (GQA).
 *
 * Layout of one (block, layer, KV head) in the pool, KVC_ATTN_B positions a block:
 *   K: [head_dim][KVC_ATTN_B]  transposed, so the block's positions of one dimension are contiguous
 *   V: [KVC_ATTN_B][head_dim]
 * in F16 or F32.
 *
 * The kernel walks the blocks once, in order 0, 1, 2, ...; each block's K and
 * V are read once for the whole tile (F16 converted in registers, or on
 * avx2 once a tile into the scratch) and folded into every query row that
 * sees part of it, with an online softmax. A row sees one
 * contiguous run of positions (its window, or all before it); block b
 * (positions 16b + j, j < 16) is folded into the rows that see part of it,
 * a row seeing its positions j0 <= j < n (j0 > 0 only at a window's lower
 * edge; blocks a row does not see are skipped, not folded):
 *   s_j   = (fma chain over d = 0 .. hd-1 of q[d] * K[d][j]) * scale,  -inf for j outside [j0, n)
 *   m'    = max(m, max_j s_j);  alpha = kvc_exp_neg(m - m')
 *   e_j   = kvc_exp_neg(s_j - m') for j0 <= j < n, else 0
 *   l[j]  = l[j] * alpha + e_j               (16 lane sums)
 *   o[d]  = fma chain over j0 <= j < n of e_j * V[j][d], starting from o[d] * alpha
 * and after the last block  o[d] *= 1 / (l summed as halves added pairwise: +8, +4, +2, +1).
 * Before the first block: m = -inf, l = 0, o = 0; with a sink (sinks[h] for
 * head h), m = sinks[h] and l[0] = 1, as a position whose V is 0 (in the
 * integer scheme's base 2: m = sinks[h] * KVC_LOG2E).
 * The scalar, avx2 and avx512 ISAs run exactly these operations for every
 * row (vnni and avx2 run the integer scheme below where it applies), so a
 * row's result depends only on its query and the positions it sees: not on
 * the other rows of the tile, the tile size, the batch, the thread, or which
 * of those ISAs ran it. Prefill (big tiles) and decode (one token) therefore
 * agree bit for bit.
 *
 * THE INTEGER SCHEME of the "vnni" and "avx2" ISAs (kvc_attn_i16_ok: hd % 32
 * == 0, hd <= KVC_ATTN_I16_MAX_HD).
 * WHY: VPDPWSSD does 32 int16 multiply-adds per instruction, twice an FMA's
 * work at the same rate (AVX2's VPMADDWD and VPADDD, 16, run about 1.5 times
 * an FMA's rate on Zen 3), and integer sums are exact in any order: the kernels
 * equal their scalar reference (kvc_attention_ref_i16) bit for bit, and a
 * row's result still depends on nothing but its query and what it sees.
 * Float operations are float32, rounding to nearest; rint rounds to nearest
 * even and takes NaN to 0; AMIN = KVC_I8_AMIN (kernels_int8.h).
 *   A vector x of hd values (a q row, or K at one position) in integer form:
 *     n2 = (c0 + c1) + (c2 + c3), c_i = fma chain over d = i, i + 4, ... of x[d] * x[d];
 *     amax = max |x[d]| (NaN counts as 0)
 *     if !(amax >= AMIN) or !(n2 <= FLT_MAX): s = 0, xi = 0
 *     else: inv = min(46000 / sqrt(n2), 32767 / amax),  s = 1 / inv,  xi[d] = rint(x[d] * inv)
 *     So |xi[d]| <= 32767 and |xi| < 46010: by Cauchy-Schwarz the dot product
 *     of two such vectors fits int32 whatever hd is. K keeps ~13-15 bits.
 *   q row: (sq, a) in integer form; cq = (sq * scale) * KVC_LOG2E: the
 *     scores are in base 2, so the softmax's exps are kvc_exp2_neg (cheaper
 *     than kvc_exp_neg, and what the weights' 15 bits need).
 *   K of block b at position j < n: (sK[j], Ki[.][j]) in integer form.
 *   V of block b as a row that sees its positions [j0, n) takes it, per dim d:
 *     vmax = max over j0 <= j < n of |V[j][d]| (NaN counts as 0)
 *     if !(vmax >= AMIN): cv[d] = 0, Vi[.][d] = 0
 *     else: cv[d] = vmax / 4095,  Vi[j][d] = rint(V[j][d] * (4095 / vmax))
 *     for j0 <= j < n, 0 elsewhere. (The scales see only the positions the
 *     row sees, so neither a block that fills up later nor the window's
 *     lower edge passing changes anything for it.)
 *   K of block b at a position the row does not see: sK[j] = 0, Ki[.][j] = 0.
 *   scores: D_j = sum over d of a[d] * Ki[d][j] (exact int32)
 *     s_j = ((float)D_j * sK[j]) * cq for j0 <= j < n, -inf otherwise;  mb = max_j s_j
 *   softmax, with the weights against the block's largest (so that they
 *   need neither m' nor a division):
 *     m' = max(m, mb);  alpha = kvc_exp2_neg(m - m');  emax = kvc_exp2_neg(mb - m')
 *     e_j = kvc_exp2_neg(s_j - mb) for j0 <= j < n, else 0   (<= 1, and 1 where s_j = mb)
 *     l[j] = fma(emax, e_j, l[j] * alpha)
 *     Pi[j] = rint(e_j * 32767);  w = emax * (1 / 32767.0f) if emax >= AMIN, else 0
 *   output: DV[d] = sum over j of Pi[j] * Vi[j][d] (exact int32: 16 * 32767 * 4095 < 2^31)
 *     o[d] = fma((float)DV[d], cv[d] * w, o[d] * alpha)
 *   Multiplying by an alpha of exactly 1 may be skipped: it changes no bit.
 *   and the final 1 / l as above. */
#ifndef KVC_ATTENTION_H
#define KVC_ATTENTION_H

#include "common.h"

#define KVC_ATTN_B KVC_BLOCK_TOKENS   /* positions per KV block the kernel takes (common.h) */

typedef struct kvc_attn_args {
    int32_t             n_tok;    /* tokens: consecutive positions of one sequence */
    int32_t             n_q;      /* query heads per token sharing this KV head */
    int32_t             hd;       /* head dim (the layer's; any, the SIMD paths where a multiple of 8) */
    int64_t             n_pos;    /* token t (at position p = n_pos - 1 + t) attends to positions
                                   * [lo, n_pos + t), lo = 0, or with a window p - window + 1 (not
                                   * below 0); n_pos >= 1 */
    int32_t             window;   /* sliding window w: p sees p - w + 1 .. p (llama.cpp's and vLLM's
                                   * rule); 0: no window (all of [0, p]) */
    bool                f16;      /* K/V are F16 (else F32) */
    const void *const  *k;        /* per block: its K [hd][KVC_ATTN_B]; blocks wholly below every
                                   * token's window are not read (may be NULL) */
    const void *const  *v;        /* per block: its V [KVC_ATTN_B][hd]; the same */
    const float        *q;        /* query of token t, head h: q + t * ldq + h * hd */
    int64_t             ldq;
    float               scale;    /* the scores' factor: 1/sqrt(hd), or the layer's (Gemma: 1.0) */
    const float        *sinks;    /* NULL, or per query head h < n_q a logit (in the scores' units,
                                   * after scale) that takes part in the softmax's denominator only
                                   * (gpt-oss's attention sinks) */
    float              *out;      /* output of token t, head h: out + t * ldo + h * hd */
    int64_t             ldo;
    float              *scratch;  /* kvc_attn_scratch_floats(n_tok * n_q, hd), owned by the caller */
} kvc_attn_args;

#define KVC_ATTN_I16_MAX_HD 256   /* the integer scheme's largest head dim */

/* Floats of scratch for a tile of n_rows query rows (tokens times heads) of
 * head dim hd, enough for every ISA. */
size_t kvc_attn_scratch_floats(int64_t n_rows, int32_t hd);

/* Query rows a tile should hold at most, for head dim hd on the ISA in use:
 * each K/V block is read once a tile. The integer scheme also converts each
 * block once a tile, so it wants bigger tiles. */
int32_t kvc_attn_tile_rows(int32_t hd);

/* Whether the ISA in use runs the integer scheme for head dim hd: vnni or
 * avx2, and kvc_attn_i16_ok(hd). */
bool kvc_attn_uses_i16(int32_t hd);

/* out = attention of every row of the tile (see above): the integer scheme
 * where kvc_attn_uses_i16(hd), the float scheme otherwise. */
void kvc_attention(const kvc_attn_args *a);
/* The scalar references of the float and (hd: kvc_attn_i16_ok) the integer
 * scheme, for tests. */
void kvc_attention_ref(const kvc_attn_args *a);
void kvc_attention_ref_i16(const kvc_attn_args *a);

static inline bool kvc_attn_i16_ok(int32_t hd)
{
    return hd % 32 == 0 && hd > 0 && hd <= KVC_ATTN_I16_MAX_HD;
}

/* exp(x) for x <= 0 as the attention computes it: clamped at -80, Cephes'
 * range reduction and polynomial, every step an explicit fma or multiply. */
float kvc_exp_neg(float x);

/* 2^x for x <= 0 as the integer scheme computes it, in float32 op by op:
 *   x = max(x, -120);  n = rint(x);  f = x - n  (exact, |f| <= 1/2)
 *   p = fma(fma(fma(fma(C4, f, C3), f, C2), f, C1), f, 1);  result p * 2^n (exact)
 * C1..C4 fitted to 2^f on [-1/2, 1/2]: relative error below 3e-6, the result
 * never subnormal. */
#define KVC_LOG2E 1.44269504f
#define KVC_EXP2_C1 0.693124175f
#define KVC_EXP2_C2 0.240240976f
#define KVC_EXP2_C3 0.0559064597f
#define KVC_EXP2_C4 0.00958286133f
float kvc_exp2_neg(float x);

/* ------------------------------------------------ internal: the ISA kernels
 * The running state of row r (= t * n_q + h) lives in scratch: m[r] at
 * scratch[r], l[r][16] at scratch[n_rows + 16 r]; o is the row's output. A
 * block kernel folds block b into rows [r0, r1), each of which sees at least
 * one position of it. kvc_attn_state_init puts every row in its state before
 * block 0 (above; base2: the integer scheme's, whose sink is in base 2). */
void kvc_attn_state_init(const kvc_attn_args *a, bool base2);
void kvc_attn_block_avx512(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1);
void kvc_attn_block_avx2(const kvc_attn_args *a, int64_t b, int32_t r0, int32_t r1);
/* Blocks [b0, b1) into every row of the tile, each of which sees all their
 * positions; the same operations as the block kernel, block after block. */
void kvc_attn_full_avx512(const kvc_attn_args *a, int64_t b0, int64_t b1);
/* The same on avx2 (hd % 32 == 0), with F16 blocks converted once a tile
 * into the scratch after the float state: slot i (< 2, 32-byte aligned)
 * holds a block's K [hd][16] then V [16][hd] in F32. */
void kvc_attn_full_avx2(const kvc_attn_args *a, int64_t b0, int64_t b1);
static inline float *kvc_attn_f32_slot(const kvc_attn_args *a, int i)
{
    uintptr_t p = (uintptr_t)(a->scratch + (size_t)a->n_tok * a->n_q * (1 + 16));
    return (float *)((p + 31) & ~(uintptr_t)31) + (size_t)i * a->hd * KVC_ATTN_B * 2;
}

/* The integer scheme. Scratch: the float state above, then from
 * kvc_attn_i16_q (64-byte aligned) per row its q in integer form (hd int16),
 * then per row cq, then KVC_ATTN_I16_SLOTS blocks in the kernel's integer
 * form (kvc_attn_i16_block_bytes each, 64-byte aligned).
 * kvc_attn_i16_vec puts x[i * stride], i < hd, in integer form (above): xi,
 * and the scale returned. kvc_attn_i16_quantize_q fills the q rows. */
#define KVC_ATTN_I16_SLOTS 2
static inline size_t kvc_attn_i16_block_bytes(int32_t hd) { return (size_t)hd * 68 + 64; }
/* (inline: the row kernels ask for them at every call) */
static inline int16_t *kvc_attn_i16_q(const kvc_attn_args *a)
{
    uintptr_t p = (uintptr_t)(a->scratch + (size_t)a->n_tok * a->n_q * (1 + 16));
    return (int16_t *)((p + 63) & ~(uintptr_t)63);
}

static inline float *kvc_attn_i16_cq(const kvc_attn_args *a)
{
    return (float *)(void *)(kvc_attn_i16_q(a) + (size_t)a->n_tok * a->n_q * a->hd);
}

static inline uint8_t *kvc_attn_i16_slot(const kvc_attn_args *a, int i)
{
    const size_t rows = (size_t)a->n_tok * a->n_q;
    return (uint8_t *)(void *)kvc_attn_i16_cq(a) + (rows * 4 + 63) / 64 * 64 +
           (size_t)i * kvc_attn_i16_block_bytes(a->hd);
}

/* A block in integer form, as the vnni and avx2 kernels keep it in a slot
 * (kvc_attn_i16_block_bytes(hd) bytes):
 *   kp [hd / 2][16]  int16 pairs (Ki[2p][j], Ki[2p + 1][j]), position j
 *   sk [16]          K's scales, position j
 *   vp [8][hd]       int16 pairs (Vi[2k][d], Vi[2k + 1][d]), dimension d
 *   cv [hd]          V's scales */
typedef struct kvc_attn_i16_block {
    int32_t     *kp, *vp;
    float       *sk, *cv;
} kvc_attn_i16_block;

static inline kvc_attn_i16_block kvc_attn_i16_block_at(const kvc_attn_args *a, int i)
{
    uint8_t *p = kvc_attn_i16_slot(a, i);
    const size_t hd = (size_t)a->hd;
    kvc_attn_i16_block ib = { (int32_t *)(void *)p, (int32_t *)(void *)(p + 32 * hd + 64),
                              (float *)(void *)(p + 32 * hd), (float *)(void *)(p + 64 * hd + 64) };
    return ib;
}

float kvc_attn_i16_vec(const float *x, int64_t stride, int32_t hd, int16_t *xi);
void kvc_attn_i16_quantize_q(const kvc_attn_args *a);
void kvc_attn_i16_quantize_q_simd(const kvc_attn_args *a);   /* the same bits, on vnni and avx2 */

/* An ISA's two steps of the integer scheme; attention.c walks the blocks
 * with them. convert puts block b into slot ib as rows that see its
 * positions [j0, n) take it; rows folds the nb <= max_nb blocks of ib (in
 * order, each seen whole when nb > 1) into rows [r0, r1), which see its
 * positions [j0, n). */
typedef struct kvc_attn_i16_ops {
    void (*convert)(const kvc_attn_args *a, int64_t b, int32_t j0, int32_t n, const kvc_attn_i16_block *ib);
    void (*rows)(const kvc_attn_args *a, const kvc_attn_i16_block *ib, int32_t r0, int32_t r1, int32_t j0,
                 int32_t n, int nb);
    int   max_nb;   /* <= KVC_ATTN_I16_SLOTS */
} kvc_attn_i16_ops;
extern const kvc_attn_i16_ops kvc_attn_i16_vnni;   /* attention_vnni.c */
extern const kvc_attn_i16_ops kvc_attn_i16_avx2;   /* attention_avx2_i16.c */

/* The positions [kvc_attn_seen_lo, kvc_attn_seen) of block b that row r
 * sees, for a row that sees part of it: 1 <= n <= KVC_ATTN_B, 0 <= j0 < n
 * (j0 > 0 only at the window's lower edge). */
static inline int32_t kvc_attn_seen(const kvc_attn_args *a, int64_t b, int32_t r)
{
    int64_t n = a->n_pos + r / a->n_q - b * KVC_ATTN_B;
    return (int32_t)(n < KVC_ATTN_B ? n : KVC_ATTN_B);
}

static inline int32_t kvc_attn_seen_lo(const kvc_attn_args *a, int64_t b, int32_t r)
{
    int64_t j0 = a->n_pos + r / a->n_q - a->window - b * KVC_ATTN_B;
    return a->window > 0 && j0 > 0 ? (int32_t)j0 : 0;
}

/* The 16-bit mask of positions [j0, n) of a block. */
static inline uint32_t kvc_attn_span_mask(int32_t j0, int32_t n)
{
    return ((1u << n) - 1) & ~((1u << j0) - 1);
}

static inline const float *kvc_attn_q_row(const kvc_attn_args *a, int32_t r)
{
    return a->q + (int64_t)(r / a->n_q) * a->ldq + (int64_t)(r % a->n_q) * a->hd;
}

static inline float *kvc_attn_o_row(const kvc_attn_args *a, int32_t r)
{
    return a->out + (int64_t)(r / a->n_q) * a->ldo + (int64_t)(r % a->n_q) * a->hd;
}

/* q[r] (if q is not NULL) and o[r] of rows r0 + r, r < R <= 8: one division,
 * not R. Inlined, so that a constant R unrolls. */
static inline __attribute__((always_inline)) void kvc_attn_rows_at(const kvc_attn_args *a, int32_t r0,
                                                                   const int R, const float **q, float **o)
{
    int32_t t = r0 / a->n_q, h = r0 % a->n_q;
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        if (q)
            q[r] = a->q + (int64_t)t * a->ldq + (int64_t)h * a->hd;
        o[r] = a->out + (int64_t)t * a->ldo + (int64_t)h * a->hd;
        const bool next = ++h == a->n_q;
        t += next;
        h = next ? 0 : h;
    }
}

#endif
