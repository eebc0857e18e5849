/* sampler.c - penalties, top-k, top-p, min-p, temperature and the draw.
 * See sampler.h for the chain's order and its contracts. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---------------------------------------------------------------- state */

typedef struct kvc_tok {
    float   logit;
    int32_t id;
    double  w;          /* exp(logit - max) for top-p, then exp((logit - max) / T) for the draw */
} kvc_tok;

struct kvc_sampler {
    kvc_sampler_params p;
    int32_t   n_vocab;
    uint64_t  seed;         /* in use (drawn for KVC_SEED_RANDOM) */
    uint64_t  rng[4];       /* xoshiro256** state */

    /* penalty window: the last repeat_last_n accepted tokens (all when -1) */
    bool      penalize;     /* a penalty is in effect */
    int32_t  *count;        /* (n_vocab) occurrences of each token in the window */
    int32_t  *where;        /* (n_vocab) index of the token in distinct[], -1 if absent */
    int32_t  *distinct;     /* (n_distinct_cap) tokens with count > 0, in no order */
    int32_t   n_distinct;
    int32_t  *ring;         /* (repeat_last_n) the window when bounded, else NULL */
    int32_t   ring_len;     /* tokens in ring */
    int32_t   ring_head;    /* index of the oldest token once full */

    float    *work;         /* (n_vocab) logits after bias, penalties and mask; NULL
                             * while none of them is set */
    float    *bias;         /* (n_vocab) logit_bias, or NULL */
    int32_t  *bias_ids;     /* (n_bias) the ids with a bias, to clear them */
    int32_t   n_bias;
    const uint32_t *mask;   /* borrowed, or NULL */
    kvc_tok  *cand;         /* (top_k when on, else n_vocab) candidates */
};

/* ---------------------------------------------------------------- random numbers
 *
 * xoshiro256** (Blackman & Vigna), state filled by splitmix64 from the seed. */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&seed);
}

/* Uniform in [0, 1), 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

static uint64_t seed_from_os(const void *salt)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = (uint64_t)kvc_time_us() ^ (uint64_t)(uintptr_t)salt;
    uint64_t x = seed;
    seed = splitmix64(&x);
    return seed == KVC_SEED_RANDOM ? 0 : seed;
}

/* ---------------------------------------------------------------- params */

kvc_sampler_params kvc_sampler_default_params(void)
{
    return (kvc_sampler_params){
        .temperature       = 0.8f,
        .top_k             = 40,
        .top_p             = 0.95f,
        .min_p             = 0.05f,
        .repeat_penalty    = 1.0f,
        .repeat_last_n     = 64,
        .presence_penalty  = 0.0f,
        .frequency_penalty = 0.0f,
        .seed              = KVC_SEED_DEFAULT,
    };
}

int kvc_sampler_params_check(const kvc_sampler_params *p, kvc_err *err)
{
    if (!p)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "sampler params: NULL");
    if (!isfinite(p->temperature))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "temperature = %g: must be finite", p->temperature);
    if (isnan(p->top_p))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "top_p = %g: must be a number", p->top_p);
    if (isnan(p->min_p))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "min_p = %g: must be a number", p->min_p);
    if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0.0f))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "repeat_penalty = %g: must be > 0", p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "repeat_last_n = %d: must be >= -1", p->repeat_last_n);
    if (!isfinite(p->presence_penalty))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "presence_penalty = %g: must be finite", p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "frequency_penalty = %g: must be finite", p->frequency_penalty);
    return KVC_OK;
}

/* ---------------------------------------------------------------- life cycle */

kvc_sampler *kvc_sampler_new(const kvc_sampler_params *p, int32_t n_vocab)
{
    if (kvc_sampler_params_check(p, NULL) != KVC_OK || n_vocab <= 0)
        return NULL;
    kvc_sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->penalize = p->repeat_last_n != 0 &&
                  (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);

    /* only what these params can use: with top-k on, k candidates (the
     * default chain needs 640 bytes); the penalty arrays only with a penalty */
    size_t n = (size_t)n_vocab;
    size_t n_cand = p->top_k > 0 && p->top_k < n_vocab ? (size_t)p->top_k : n;
    s->cand = malloc(n_cand * sizeof(*s->cand));
    bool ok = s->cand != NULL;
    if (ok && s->penalize) {
        size_t n_distinct_cap = p->repeat_last_n > 0 ? KVC_MIN(n, (size_t)p->repeat_last_n) : n;
        s->work = malloc(n * sizeof(*s->work));
        s->count = calloc(n, sizeof(*s->count));
        s->where = malloc(n * sizeof(*s->where));
        s->distinct = malloc(n_distinct_cap * sizeof(*s->distinct));
        if (p->repeat_last_n > 0)
            s->ring = malloc((size_t)p->repeat_last_n * sizeof(*s->ring));
        ok = s->work && s->count && s->where && s->distinct && (p->repeat_last_n < 0 || s->ring);
        if (ok)
            memset(s->where, 0xff, n * sizeof(*s->where));      /* -1 */
    }
    if (!ok) {
        kvc_sampler_free(s);
        return NULL;
    }
    s->seed = p->seed == KVC_SEED_RANDOM ? seed_from_os(s) : p->seed;
    rng_seed(s->rng, s->seed);
    return s;
}

void kvc_sampler_free(kvc_sampler *s)
{
    if (!s)
        return;
    free(s->count);
    free(s->where);
    free(s->distinct);
    free(s->ring);
    free(s->work);
    free(s->bias);
    free(s->bias_ids);
    free(s->cand);
    free(s);
}

uint64_t kvc_sampler_seed(const kvc_sampler *s)
{
    return s ? s->seed : 0;
}

/* ---------------------------------------------------------------- penalty history */

static void history_add(kvc_sampler *s, int32_t t)
{
    if (s->count[t]++ == 0) {
        s->where[t] = s->n_distinct;
        s->distinct[s->n_distinct++] = t;
    }
}

static void history_remove(kvc_sampler *s, int32_t t)
{
    if (--s->count[t] == 0) {
        int32_t i = s->where[t];
        int32_t last = s->distinct[--s->n_distinct];
        s->distinct[i] = last;
        s->where[last] = i;
        s->where[t] = -1;
    }
}

void kvc_sampler_accept(kvc_sampler *s, int32_t token)
{
    if (!s || !s->penalize || token < 0 || token >= s->n_vocab)
        return;
    int32_t cap = s->p.repeat_last_n;
    if (cap > 0) {
        if (s->ring_len == cap) {
            history_remove(s, s->ring[s->ring_head]);
            s->ring[s->ring_head] = token;
            s->ring_head = (s->ring_head + 1) % cap;
        } else {
            s->ring[s->ring_len++] = token;
        }
    }
    history_add(s, token);
}

void kvc_sampler_reset(kvc_sampler *s)
{
    if (!s)
        return;
    if (s->penalize) {
        for (int32_t i = 0; i < s->n_distinct; i++) {
            s->count[s->distinct[i]] = 0;
            s->where[s->distinct[i]] = -1;
        }
        s->n_distinct = 0;
        s->ring_len = 0;
        s->ring_head = 0;
    }
    rng_seed(s->rng, s->seed);
}

/* Repetition, frequency and presence penalties applied in place to the
 * tokens in the window (llama.cpp's formula). */
static void penalize(kvc_sampler *s, float *work)
{
    const float rp = s->p.repeat_penalty;
    for (int32_t i = 0; i < s->n_distinct; i++) {
        int32_t t = s->distinct[i];
        float l = s->work[t];
        l = l <= 0.0f ? l * rp : l / rp;
        l -= (float)s->count[t] * s->p.frequency_penalty + s->p.presence_penalty;
        work[t] = l;
    }
}

/* The logits with the penalties applied, in s->work. */
static const float *apply_penalties(kvc_sampler *s, const float *logits)
{
    memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(*s->work));
    penalize(s, s->work);
    return s->work;
}

/* The logits with bias, penalties and mask applied, in s->work. */
static const float *apply_all(kvc_sampler *s, const float *logits)
{
    float *w = s->work;
    memcpy(w, logits, (size_t)s->n_vocab * sizeof(*w));
    for (int32_t i = 0; i < s->n_bias; i++)
        w[s->bias_ids[i]] += s->bias[s->bias_ids[i]];
    if (s->penalize && s->n_distinct > 0)
        penalize(s, w);
    if (s->mask)
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (!((s->mask[i >> 5] >> (i & 31)) & 1u))
                w[i] = -INFINITY;
    return w;
}

static bool ensure_work(kvc_sampler *s)
{
    if (!s->work)
        s->work = malloc((size_t)s->n_vocab * sizeof(*s->work));
    return s->work != NULL;
}

int kvc_sampler_set_logit_bias(kvc_sampler *s, const kvc_logit_bias *bias, int32_t n, kvc_err *err)
{
    if (!s || n < 0 || (n > 0 && !bias))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "logit_bias: bad arguments");
    for (int32_t i = 0; i < n; i++) {
        if (bias[i].token < 0 || bias[i].token >= s->n_vocab)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "logit_bias: token %d outside [0, %d)",
                            bias[i].token, s->n_vocab);
        if (isnan(bias[i].bias) || bias[i].bias == INFINITY)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "logit_bias: token %d: bias %g", bias[i].token,
                            bias[i].bias);
    }
    if (n > 0 && (!ensure_work(s) || (!s->bias && !(s->bias = calloc((size_t)s->n_vocab, sizeof(*s->bias))))))
        return kvc_fail(err, KVC_ERR_NOMEM, "logit_bias: out of memory");
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof(*ids)) : NULL;
    if (n > 0 && !ids)
        return kvc_fail(err, KVC_ERR_NOMEM, "logit_bias: out of memory");
    for (int32_t i = 0; i < s->n_bias; i++)
        s->bias[s->bias_ids[i]] = 0.0f;
    free(s->bias_ids);
    s->bias_ids = ids;
    s->n_bias = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = bias[i].token;
        bool seen = false;
        for (int32_t j = 0; j < s->n_bias && !seen; j++)
            seen = ids[j] == t;
        if (!seen)
            ids[s->n_bias++] = t;
        s->bias[t] += bias[i].bias;
    }
    return KVC_OK;
}

int kvc_sampler_set_mask(kvc_sampler *s, const uint32_t *mask)
{
    if (!s)
        return KVC_ERR_INVALID_ARG;
    if (mask && !ensure_work(s))
        return KVC_ERR_NOMEM;
    s->mask = mask;
    return KVC_OK;
}

/* When no candidate is finite: the lowest allowed id (-1 if the mask
 * allows none), or `fallback` without a mask. */
static int32_t lowest_allowed(const kvc_sampler *s, int32_t fallback)
{
    if (!s->mask)
        return fallback;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if ((s->mask[i >> 5] >> (i & 31)) & 1u)
            return i;
    return -1;
}

/* ---------------------------------------------------------------- ordering
 *
 * Candidates are ordered best first: higher logit, then lower id. The order
 * is total, so every selection below is deterministic. Sorting uses a heap in
 * place: no allocation (glibc's qsort may malloc). */

static bool better(const kvc_tok *a, const kvc_tok *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Heap on h[0, n) with the worst candidate at h[0]. */
static void sift_down(kvc_tok *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l]))
            w = l;
        if (r < n && better(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        kvc_tok t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Heapsort c[0, n) best first: each pop moves the worst to the end. */
static void sort_best_first(kvc_tok *c, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(c, n, i);
    for (size_t m = n; m > 1; m--) {
        kvc_tok t = c[0];
        c[0] = c[m - 1];
        c[m - 1] = t;
        sift_down(c, m - 1, 0);
    }
}

/* Offer logits[i] to the k-entry heap whose worst logit is *worst. A later
 * id wins only with a strictly larger logit, so ties keep the lower id. */
static inline void heap_offer(kvc_tok *heap, size_t k, const float *logits, int32_t i, float *worst)
{
    if (logits[i] > *worst) {
        heap[0] = (kvc_tok){ logits[i], i, 0 };
        sift_down(heap, k, 0);
        *worst = heap[0].logit;
    }
}

/* The k best of logits[0, n) into out[0, k), best first; 0 < k < n. One pass
 * with a k-entry heap, O(n log k). Blocks of 8 are first tested together,
 * branch-free (the compiler vectorizes it): most never beat the heap. */
static void top_k_from_logits(const float *logits, int32_t n, int32_t k, kvc_tok *out)
{
    for (int32_t i = 0; i < k; i++)
        out[i] = (kvc_tok){ logits[i], i, 0 };
    for (int32_t i = k / 2; i-- > 0;)
        sift_down(out, (size_t)k, (size_t)i);
    float worst = out[0].logit;     /* a local: out may alias logits */
    int32_t i = k;
    for (; i < n && i % 8 != 0; i++)
        heap_offer(out, (size_t)k, logits, i, &worst);
    for (; i + 8 <= n; i += 8) {
        int any = 0;
        for (int j = 0; j < 8; j++)
            any |= logits[i + j] > worst;
        if (any)
            for (int j = 0; j < 8; j++)
                heap_offer(out, (size_t)k, logits, i + j, &worst);
    }
    for (; i < n; i++)
        heap_offer(out, (size_t)k, logits, i, &worst);
    sort_best_first(out, (size_t)k);
}

static void swap_tok(kvc_tok *a, kvc_tok *b)
{
    kvc_tok t = *a;
    *a = *b;
    *b = t;
}

/* ---------------------------------------------------------------- the chain */

/* The lowest index of the largest logit (0 when none compares larger than
 * -INFINITY). Two passes: the maximum over 8 independent lanes (no chain of
 * dependent compares; the compiler may vectorize it), then its first index. */
static int32_t argmax(const float *l, int32_t n)
{
    float lane[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                      -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] = l[i + j] > lane[j] ? l[i + j] : lane[j];
    for (; i < n; i++)
        lane[0] = l[i] > lane[0] ? l[i] : lane[0];
    float v = lane[0];
    for (int j = 1; j < 8; j++)
        v = lane[j] > v ? lane[j] : v;
    for (i = 0; i < n; i++)
        if (l[i] == v)
            return i;
    return 0;
}

/* Keep the candidates with logit >= max + log(min_p) (llama.cpp's test: p >=
 * min_p * p_max), in their order; min_p in (0, 1], so the best one stays.
 * Returns the new count (>= 1). */
static size_t filter_min_p(kvc_tok *c, size_t n, float max, float min_p)
{
    const float thr = max + logf(min_p);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i].logit >= thr)
            c[k++] = c[i];
    return k;
}

/* Top-p on candidates sorted best first, each with w = exp(logit - max):
 * the shortest prefix whose mass reaches target = top_p * z, where z is the
 * mass of the set top-p was given (before min-p). Returns its length (>= 1). */
static size_t top_p_sorted(const kvc_tok *c, size_t n, double target)
{
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].w;
        if (cum >= target)
            return i + 1;
    }
    return n;
}

/* Top-p on unsorted candidates (top-k off: up to the whole vocabulary)
 * without sorting them: bucket by logit into TOP_P_BUCKETS equal slices of
 * [lowest finite logit, max], find the bucket where the running mass crosses
 * the target, and sort only that bucket. The kept set goes to c[0, len):
 * the buckets above in no order, then the crossing bucket's prefix. O(n).
 * The same set as sorting everything, up to the rounding of the running sum. */
enum { TOP_P_BUCKETS = 1024 };

static size_t bucket_of(float logit, float max, double scale)
{
    if (logit == -INFINITY)
        return TOP_P_BUCKETS - 1;
    size_t b = (size_t)(((double)max - logit) * scale);
    return b < TOP_P_BUCKETS ? b : TOP_P_BUCKETS - 1;
}

static size_t top_p_unsorted(kvc_tok *c, size_t n, float max, double target)
{
    float lo = max;
    for (size_t i = 0; i < n; i++)
        if (c[i].logit < lo && c[i].logit != -INFINITY)
            lo = c[i].logit;
    const double scale = max > lo ? (TOP_P_BUCKETS - 1) / ((double)max - lo) : 0.0;

    double mass[TOP_P_BUCKETS] = { 0 };
    for (size_t i = 0; i < n; i++)
        mass[bucket_of(c[i].logit, max, scale)] += c[i].w;
    double cum = 0.0;
    size_t cross = TOP_P_BUCKETS - 1;
    for (size_t b = 0; b < TOP_P_BUCKETS; b++) {
        if (cum + mass[b] >= target) {
            cross = b;
            break;
        }
        cum += mass[b];
    }

    size_t above = 0, end;
    for (size_t i = 0; i < n; i++)
        if (bucket_of(c[i].logit, max, scale) < cross)
            swap_tok(&c[above++], &c[i]);
    end = above;
    for (size_t i = above; i < n; i++)
        if (bucket_of(c[i].logit, max, scale) == cross)
            swap_tok(&c[end++], &c[i]);
    sort_best_first(c + above, end - above);
    for (size_t i = above; i < end; i++) {
        cum += c[i].w;
        if (cum >= target)
            return i + 1;
    }
    return end;
}

/* Draw from c[0, n) with weights exp((logit - max) / temperature). */
static int32_t draw(kvc_sampler *s, kvc_tok *c, size_t n, float max, float temperature)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        c[i].w = exp(((double)c[i].logit - max) / temperature);
        sum += c[i].w;
    }
    double r = rng_uniform(s->rng) * sum;
    double acc = 0.0;
    size_t last = 0;
    for (size_t i = 0; i < n; i++) {
        if (c[i].w <= 0.0)
            continue;
        acc += c[i].w;
        last = i;
        if (r < acc)
            return c[i].id;
    }
    return c[last].id;        /* r landed on the rounding error of the sum */
}

int32_t kvc_sampler_sample(kvc_sampler *s, const float *logits)
{
    if (!s || !logits)
        return -1;
    const int32_t n_vocab = s->n_vocab;
    const kvc_sampler_params *p = &s->p;
    const float *l = s->n_bias > 0 || s->mask ? apply_all(s, logits)
                   : s->penalize && s->n_distinct > 0 ? apply_penalties(s, logits) : logits;

    if (p->temperature <= 0.0f) {
        int32_t t = argmax(l, n_vocab);
        return l[t] == -INFINITY ? lowest_allowed(s, t) : t;
    }

    /* top-k */
    kvc_tok *c = s->cand;
    size_t n;
    bool sorted;
    if (p->top_k > 0 && p->top_k < n_vocab) {
        top_k_from_logits(l, n_vocab, p->top_k, c);
        n = (size_t)p->top_k;
        sorted = true;
    } else {
        for (int32_t i = 0; i < n_vocab; i++)
            c[i] = (kvc_tok){ l[i], i, 0 };
        n = (size_t)n_vocab;
        sorted = false;
    }
    float max = sorted ? c[0].logit : l[argmax(l, n_vocab)];
    if (max == -INFINITY)       /* everything masked */
        return lowest_allowed(s, c[0].id);

    /* top-p's normalizer is over the top-k set, before min-p removes any */
    double z = 0.0;
    if (p->top_p < 1.0f) {
        for (size_t i = 0; i < n; i++) {
            c[i].w = exp((double)c[i].logit - max);
            z += c[i].w;
        }
    }

    /* min-p, then top-p on what is left: the same set as llama.cpp's top-p
     * then min-p, since both keep a best-first prefix and min-p's threshold
     * depends only on the maximum, which top-p always keeps */
    if (p->min_p > 0.0f)
        n = filter_min_p(c, n, max, KVC_MIN(p->min_p, 1.0f));
    if (p->top_p < 1.0f) {
        double target = (double)KVC_MAX(p->top_p, 0.0f) * z;
        n = sorted ? top_p_sorted(c, n, target) : top_p_unsorted(c, n, max, target);
    }

    return draw(s, c, n, max, p->temperature);
}

/* ---------------------------------------------------------------- logprobs */

float kvc_logprobs(const float *logits, int32_t n_vocab, int32_t token, kvc_logprob *top,
                   int32_t top_n, int32_t *n_top)
{
    if (n_top)
        *n_top = 0;
    if (!logits || n_vocab <= 0)
        return NAN;
    float max = logits[argmax(logits, n_vocab)];
    double z = 0.0;
    if (max != -INFINITY)
        for (int32_t i = 0; i < n_vocab; i++)
            z += exp((double)logits[i] - max);
    const double log_z = max == -INFINITY ? 0.0 : (double)max + log(z);

    /* the top_n best, kept sorted best first by insertion: top_n is small */
    int32_t k = 0;
    top_n = top ? KVC_MAX(0, KVC_MIN(top_n, n_vocab)) : 0;
    for (int32_t i = 0; i < n_vocab && top_n > 0; i++) {
        float l = logits[i];
        if (k == top_n && !(l > top[k - 1].logprob))
            continue;
        int32_t j = k < top_n ? k++ : k - 1;
        while (j > 0 && l > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (kvc_logprob){ i, l };
    }
    for (int32_t i = 0; i < k; i++)
        top[i].logprob = top[i].logprob == -INFINITY ? -INFINITY : (float)((double)top[i].logprob - log_z);
    if (n_top)
        *n_top = k;
    if (token < 0 || token >= n_vocab)
        return NAN;
    return logits[token] == -INFINITY ? -INFINITY : (float)((double)logits[token] - log_z);
}
