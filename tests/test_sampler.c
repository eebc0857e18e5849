/* test_sampler.c - greedy, determinism, each filter, penalties, and sampled
 * frequencies against a reference distribution computed here the slow way. */
#include "sampler.h"
#include "test.h"

#include <time.h>

/* ---------------------------------------------------------------- helpers */

/* The test's own generator (not the sampler's): splitmix64 to floats. */
static uint64_t test_rng = 12345;

static double test_uniform(void)
{
    uint64_t z = (test_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int32_t n, float scale)
{
    for (int32_t i = 0; i < n; i++)
        l[i] = (float)((test_uniform() * 2.0 - 1.0) * scale);
}

static int32_t ref_argmax(const float *l, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

static kvc_sampler_params params_plain(float temperature)
{
    kvc_sampler_params p = kvc_sampler_default_params();
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static kvc_sampler *new_sampler(const kvc_sampler_params *p, int32_t n)
{
    kvc_sampler *s = kvc_sampler_new(p, n);
    CHECK(s != NULL);
    return s;
}

/* Sample `draws` times and return the frequency of each token in freq[n]. */
static void frequencies(kvc_sampler *s, const float *l, int32_t n, int draws, double *freq)
{
    int bad = 0;
    for (int32_t i = 0; i < n; i++)
        freq[i] = 0;
    for (int d = 0; d < draws; d++) {
        int32_t t = kvc_sampler_sample(s, l);
        if (t >= 0 && t < n)
            freq[t] += 1.0 / draws;
        else
            bad++;
    }
    CHECKF(bad == 0, "%d draws out of range", bad);
}

/* ---------------------------------------------------------------- reference chain
 *
 * llama.cpp's order, literally: full sort, top-k, softmax + top-p, min-p,
 * temperature, softmax. Returns the probability of each token in prob[n]. */

static const float *ref_logits;

static int ref_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (ref_logits[a] != ref_logits[b])
        return ref_logits[a] > ref_logits[b] ? -1 : 1;
    return a < b ? -1 : 1;
}

static void ref_distribution(const float *l, int32_t n, const kvc_sampler_params *p, double *prob)
{
    int32_t *idx = malloc((size_t)n * sizeof(*idx));
    for (int32_t i = 0; i < n; i++)
        idx[i] = i;
    ref_logits = l;
    qsort(idx, (size_t)n, sizeof(*idx), ref_cmp);
    int32_t m = n;
    if (p->top_k > 0 && p->top_k < m)
        m = p->top_k;
    if (p->top_p < 1.0f) {
        double z = 0, cum = 0;
        for (int32_t i = 0; i < m; i++)
            z += exp((double)l[idx[i]] - l[idx[0]]);
        for (int32_t i = 0; i < m; i++) {
            cum += exp((double)l[idx[i]] - l[idx[0]]) / z;
            if (cum >= p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        int32_t k = 1;
        while (k < m && l[idx[k]] >= l[idx[0]] + logf(p->min_p))
            k++;
        m = k;
    }
    double z = 0;
    for (int32_t i = 0; i < n; i++)
        prob[i] = 0;
    for (int32_t i = 0; i < m; i++)
        z += exp(((double)l[idx[i]] - l[idx[0]]) / p->temperature);
    for (int32_t i = 0; i < m; i++)
        prob[idx[i]] = exp(((double)l[idx[i]] - l[idx[0]]) / p->temperature) / z;
    free(idx);
}

/* ---------------------------------------------------------------- params */

static void test_params(void)
{
    kvc_sampler_params p = kvc_sampler_default_params();
    CHECK_NEAR(p.temperature, 0.8, 1e-7);
    CHECK_EQ_INT(p.top_k, 40);
    CHECK_NEAR(p.top_p, 0.95, 1e-7);
    CHECK_NEAR(p.min_p, 0.05, 1e-7);
    CHECK_NEAR(p.repeat_penalty, 1.0, 0);
    CHECK_EQ_INT(p.repeat_last_n, 64);
    CHECK(p.seed == KVC_SEED_DEFAULT);
    CHECK_EQ_INT(kvc_sampler_params_check(&p, NULL), KVC_OK);

    kvc_err err = { 0 };
    kvc_sampler_params bad = p;
    bad.top_p = NAN;
    CHECK_EQ_INT(kvc_sampler_params_check(&bad, &err), KVC_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "top_p") != NULL, "%s", err.msg);
    CHECK(kvc_sampler_new(&bad, 10) == NULL);
    bad = p;
    bad.temperature = NAN;
    CHECK_EQ_INT(kvc_sampler_params_check(&bad, &err), KVC_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "temperature") != NULL, "%s", err.msg);
    bad = p;
    bad.min_p = NAN;
    CHECK_EQ_INT(kvc_sampler_params_check(&bad, &err), KVC_ERR_INVALID_ARG);
    bad = p;
    bad.repeat_penalty = 0.0f;
    CHECK_EQ_INT(kvc_sampler_params_check(&bad, &err), KVC_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "repeat_penalty") != NULL, "%s", err.msg);
    /* out-of-range filters are "off" or "best only" (kvchat.h), not errors */
    kvc_sampler_params lax = p;
    lax.top_p = 1.5f;
    lax.min_p = -0.1f;
    lax.top_k = -3;
    CHECK_EQ_INT(kvc_sampler_params_check(&lax, &err), KVC_OK);
    bad = p;
    bad.repeat_last_n = -2;
    CHECK_EQ_INT(kvc_sampler_params_check(&bad, &err), KVC_ERR_INVALID_ARG);
    bad = p;
    bad.frequency_penalty = INFINITY;
    CHECK_EQ_INT(kvc_sampler_params_check(&bad, &err), KVC_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvc_sampler_params_check(NULL, &err), KVC_ERR_INVALID_ARG);

    CHECK(kvc_sampler_new(&p, 0) == NULL);
    CHECK(kvc_sampler_new(NULL, 10) == NULL);
    kvc_sampler_free(NULL);
    CHECK_EQ_INT(kvc_sampler_sample(NULL, NULL), -1);
}

/* ---------------------------------------------------------------- greedy */

static void test_greedy(void)
{
    enum { N = 5000 };
    static float l[N], copy[N];
    kvc_sampler_params p = kvc_sampler_default_params();
    p.temperature = 0.0f;
    p.repeat_penalty = 1.3f;          /* configured, but nothing accepted yet */
    kvc_sampler *s = new_sampler(&p, N);
    kvc_sampler_params pn = p;
    pn.temperature = -1.0f;
    kvc_sampler *neg = new_sampler(&pn, N);
    for (int trial = 0; trial < 50; trial++) {
        random_logits(l, N, 10.0f);
        memcpy(copy, l, sizeof(l));
        CHECK_EQ_INT(kvc_sampler_sample(s, l), ref_argmax(l, N));
        CHECK_EQ_INT(kvc_sampler_sample(neg, l), ref_argmax(l, N));
        CHECK(memcmp(copy, l, sizeof(l)) == 0);
    }
    /* ties go to the lowest id; -inf is never chosen over a finite logit */
    for (int32_t i = 0; i < N; i++)
        l[i] = -INFINITY;
    CHECK_EQ_INT(kvc_sampler_sample(s, l), 0);
    l[4000] = 3.0f;
    l[17] = 3.0f;
    l[4999] = 3.0f;
    l[100] = -5.0f;
    CHECK_EQ_INT(kvc_sampler_sample(s, l), 17);
    kvc_sampler_free(s);
    kvc_sampler_free(neg);
}

/* ---------------------------------------------------------------- determinism */

static void test_seed(void)
{
    enum { N = 1000, STEPS = 300 };
    static float l[N];
    random_logits(l, N, 3.0f);
    kvc_sampler_params p = params_plain(1.0f);
    p.seed = 42;
    kvc_sampler *a = new_sampler(&p, N), *b = new_sampler(&p, N);
    p.seed = 43;
    kvc_sampler *c = new_sampler(&p, N);
    int32_t seq[STEPS];
    int same_ab = 0, same_ac = 0, distinct = 0;
    for (int i = 0; i < STEPS; i++) {
        seq[i] = kvc_sampler_sample(a, l);
        same_ab += seq[i] == kvc_sampler_sample(b, l);
        same_ac += seq[i] == kvc_sampler_sample(c, l);
        distinct += i > 0 && seq[i] != seq[i - 1];
    }
    CHECK_EQ_INT(same_ab, STEPS);
    CHECKF(same_ac < STEPS / 4, "seeds 42 and 43 agree on %d of %d draws", same_ac, STEPS);
    CHECK(distinct > STEPS / 2);

    /* reset replays the sequence */
    kvc_sampler_reset(a);
    int replay = 0;
    for (int i = 0; i < STEPS; i++)
        replay += seq[i] == kvc_sampler_sample(a, l);
    CHECK_EQ_INT(replay, STEPS);
    CHECK(kvc_sampler_seed(a) == 42);

    /* a fixed, documented default; a drawn seed is reported and replayable */
    kvc_sampler_params d = params_plain(1.0f);
    kvc_sampler *def = new_sampler(&d, N);
    CHECK(kvc_sampler_seed(def) == 0xC0FFEE);
    d.seed = KVC_SEED_RANDOM;
    kvc_sampler *r1 = new_sampler(&d, N), *r2 = new_sampler(&d, N);
    CHECK(kvc_sampler_seed(r1) != KVC_SEED_RANDOM);
    CHECK(kvc_sampler_seed(r1) != kvc_sampler_seed(r2));
    d.seed = kvc_sampler_seed(r1);
    kvc_sampler *r1_again = new_sampler(&d, N);
    int agree = 0;
    for (int i = 0; i < 50; i++)
        agree += kvc_sampler_sample(r1, l) == kvc_sampler_sample(r1_again, l);
    CHECK_EQ_INT(agree, 50);

    kvc_sampler_free(a);
    kvc_sampler_free(b);
    kvc_sampler_free(c);
    kvc_sampler_free(def);
    kvc_sampler_free(r1);
    kvc_sampler_free(r2);
    kvc_sampler_free(r1_again);
}

/* ---------------------------------------------------------------- limits that are greedy */

static void test_greedy_limits(void)
{
    enum { N = 3000 };
    static float l[N];
    kvc_sampler_params cold = params_plain(1e-3f);
    kvc_sampler_params k1 = params_plain(1.0f);
    k1.top_k = 1;
    kvc_sampler_params p0 = params_plain(1.5f);
    p0.top_p = 1e-6f;
    kvc_sampler_params p00 = params_plain(1.5f);
    p00.top_p = 0.0f;
    kvc_sampler_params m1 = params_plain(2.0f);
    m1.min_p = 1.0f;
    kvc_sampler_params m2 = params_plain(2.0f);
    m2.min_p = 2.0f;
    kvc_sampler_params pneg = params_plain(2.0f);
    pneg.top_p = -1.0f;
    kvc_sampler *s[] = { new_sampler(&cold, N), new_sampler(&k1, N), new_sampler(&p0, N),
                         new_sampler(&p00, N), new_sampler(&m1, N), new_sampler(&m2, N),
                         new_sampler(&pneg, N) };
    const char *name[] = { "temperature 1e-3", "top_k 1", "top_p 1e-6", "top_p 0", "min_p 1",
                            "min_p 2", "top_p -1" };
    for (int trial = 0; trial < 200; trial++) {
        random_logits(l, N, 5.0f);
        int32_t want = ref_argmax(l, N);
        /* the temperature limit needs a gap: (max - second) / T must be large */
        float second = -INFINITY;
        for (int32_t i = 0; i < N; i++)
            if (i != want && l[i] > second)
                second = l[i];
        for (size_t j = 0; j < KVC_ARRAY_LEN(s); j++) {
            if (j == 0 && l[want] - second < 0.05f)
                continue;
            int32_t got = kvc_sampler_sample(s[j], l);
            CHECKF(got == want, "%s: got %d, argmax %d", name[j], got, want);
        }
    }
    for (size_t j = 0; j < KVC_ARRAY_LEN(s); j++)
        kvc_sampler_free(s[j]);
}

/* ---------------------------------------------------------------- distributions */

/* The brief's check: temperature 1 over logits log .5, .3, .2; the defaults
 * (top-k 40, top-p .95, min-p .05) keep all three, so they must agree. */
static void test_frequencies(void)
{
    const float l[3] = { logf(0.5f), logf(0.3f), logf(0.2f) };
    const double want[3] = { 0.5, 0.3, 0.2 };
    double f[3];
    kvc_sampler_params plain = params_plain(1.0f);
    kvc_sampler_params dflt = kvc_sampler_default_params();
    dflt.temperature = 1.0f;
    const kvc_sampler_params *ps[] = { &plain, &dflt };
    for (size_t j = 0; j < 2; j++) {
        kvc_sampler *s = new_sampler(ps[j], 3);
        frequencies(s, l, 3, 20000, f);
        for (int i = 0; i < 3; i++)
            CHECKF(fabs(f[i] - want[i]) <= 0.02, "params %zu token %d: %.4f vs %.2f", j, i, f[i], want[i]);
        kvc_sampler_free(s);
    }

    /* temperature 2 flattens: p_i ~ sqrt(q_i) */
    kvc_sampler_params hot = params_plain(2.0f);
    kvc_sampler *s = new_sampler(&hot, 3);
    frequencies(s, l, 3, 20000, f);
    double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.2);
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(f[i], sqrt(want[i]) / z, 0.02);
    kvc_sampler_free(s);
}

/* Filters one at a time and together, on 8 tokens, against ref_distribution. */
static void test_filters_against_reference(void)
{
    enum { N = 8, DRAWS = 40000 };
    /* probabilities .30 .20 .15 .12 .10 .07 .04 .02, with a tie added below */
    const float q[N] = { 0.12f, 0.30f, 0.02f, 0.20f, 0.10f, 0.15f, 0.07f, 0.04f };
    float l[N];
    for (int i = 0; i < N; i++)
        l[i] = logf(q[i]);
    struct { int32_t top_k; float top_p, min_p, temp; } cases[] = {
        { 3, 1.0f, 0.0f, 1.0f },    /* top-k: ids 1, 3, 5 */
        { 0, 0.6f, 0.0f, 1.0f },    /* top-p: .30 + .20 + .15 >= .6 */
        { 0, 1.0f, 0.4f, 1.0f },    /* min-p: p >= .12 */
        { 5, 0.7f, 0.3f, 0.7f },    /* all three, llama.cpp's order */
        { 0, 0.9f, 0.45f, 1.3f },   /* min-p tighter than top-p */
        { 6, 0.5f, 0.05f, 1.0f },   /* top-p tighter than min-p */
    };
    for (size_t c = 0; c < KVC_ARRAY_LEN(cases); c++) {
        kvc_sampler_params p = params_plain(cases[c].temp);
        p.top_k = cases[c].top_k;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.seed = 1000 + c;
        double want[N], got[N];
        ref_distribution(l, N, &p, want);
        kvc_sampler *s = new_sampler(&p, N);
        frequencies(s, l, N, DRAWS, got);
        for (int i = 0; i < N; i++) {
            if (want[i] == 0.0)
                CHECKF(got[i] == 0.0, "case %zu: token %d drawn (%.4f) but filtered out", c, i, got[i]);
            else
                CHECKF(fabs(got[i] - want[i]) <= 0.015, "case %zu token %d: %.4f vs %.4f", c, i, got[i], want[i]);
        }
        kvc_sampler_free(s);
    }

    /* top-k boundary tie: the lower id is kept */
    const float tie[4] = { 1.0f, 2.0f, 2.0f, 2.0f };
    kvc_sampler_params p = params_plain(1.0f);
    p.top_k = 2;
    kvc_sampler *s = new_sampler(&p, 4);
    double f[4];
    frequencies(s, tie, 4, 4000, f);
    CHECK(f[0] == 0.0 && f[3] == 0.0);
    CHECK_NEAR(f[1], 0.5, 0.04);
    kvc_sampler_free(s);
}

/* ---------------------------------------------------------------- large vocabularies */

static void test_large_vocab(void)
{
    enum { N = 152064 };
    float *l = malloc(N * sizeof(*l));
    double *want = malloc(N * sizeof(*want));

    /* defaults: the draw is one of the 40 best */
    random_logits(l, N, 8.0f);
    kvc_sampler_params p = kvc_sampler_default_params();
    kvc_sampler *s = new_sampler(&p, N);
    ref_distribution(l, N, &p, want);
    int outside = 0;
    int64_t t0 = kvc_time_us();
    for (int i = 0; i < 200; i++)
        outside += want[kvc_sampler_sample(s, l)] == 0.0;
    int64_t t1 = kvc_time_us();
    CHECK_EQ_INT(outside, 0);
    printf("default chain, n_vocab %d: %.1f us/token\n", N, (t1 - t0) / 200.0);
    kvc_sampler_free(s);

    /* top-k off, a flat distribution: the nucleus is far wider than the first
     * 256 the partial sort looks at, so the full-sort fallback runs */
    random_logits(l, N, 0.5f);
    p = params_plain(1.0f);
    p.top_p = 0.9f;
    s = new_sampler(&p, N);
    ref_distribution(l, N, &p, want);
    int32_t nucleus = 0;
    for (int32_t i = 0; i < N; i++)
        nucleus += want[i] > 0.0;
    CHECKF(nucleus > 10000, "nucleus %d", nucleus);
    outside = 0;
    t0 = kvc_time_us();
    for (int i = 0; i < 20; i++)
        outside += want[kvc_sampler_sample(s, l)] == 0.0;
    t1 = kvc_time_us();
    CHECK_EQ_INT(outside, 0);
    printf("top-p 0.9 over a flat n_vocab %d: %.1f us/token\n", N, (t1 - t0) / 20.0);
    kvc_sampler_free(s);

    /* top-k off, a peaked distribution: the partial sort suffices */
    random_logits(l, N, 1.0f);
    for (int32_t i = 0; i < 50; i++)
        l[(i * 7919) % N] = 15.0f + (float)i * 0.01f;
    p.top_p = 0.95f;
    s = new_sampler(&p, N);
    ref_distribution(l, N, &p, want);
    outside = 0;
    for (int i = 0; i < 200; i++)
        outside += want[kvc_sampler_sample(s, l)] == 0.0;
    CHECK_EQ_INT(outside, 0);
    kvc_sampler_free(s);

    /* the crossing point inside one logit bucket holding 100 tokens a hair
     * above 0 and 200 tied at 0: top-p keeps the best token, the 100, and
     * exactly the lowest ids among the tied ones that its mass needs (~47).
     * 5000 draws hit each kept token ~32 times, so the drawn set must equal
     * the kept set. 16k entries are enough to leave the small-set sizes
     * behind and keep the test quick under sanitizers. */
    enum { NT = 16384 };
    for (int32_t i = 0; i < NT; i++)
        l[i] = (float)(-12.0 + 4.0 * test_uniform());
    l[777] = 2.0f;
    for (int32_t i = 0; i < 300; i++)
        l[(i * 151 + 3) % NT] = i % 3 == 0 ? (float)(0.0005 * (1.0 + test_uniform())) : 0.0f;
    p = params_plain(1.0f);
    p.top_p = 0.5f;
    s = new_sampler(&p, NT);
    ref_distribution(l, NT, &p, want);
    char *drawn = calloc(NT, 1);
    for (int i = 0; i < 5000; i++)
        drawn[kvc_sampler_sample(s, l)] = 1;
    int kept = 0, mismatch = 0;
    for (int32_t i = 0; i < NT; i++) {
        kept += want[i] > 0.0;
        mismatch += (want[i] > 0.0) != (drawn[i] != 0);
    }
    CHECKF(kept > 120 && kept < 180, "kept %d", kept);
    CHECKF(mismatch == 0, "%d tokens differ between the drawn and the kept set", mismatch);
    free(drawn);
    kvc_sampler_free(s);

    /* greedy fast path */
    p = kvc_sampler_default_params();
    p.temperature = 0.0f;
    s = new_sampler(&p, N);
    t0 = kvc_time_us();
    int ok = 0;
    for (int i = 0; i < 200; i++)
        ok += kvc_sampler_sample(s, l) == ref_argmax(l, N);
    t1 = kvc_time_us();
    CHECK_EQ_INT(ok, 200);
    printf("greedy, n_vocab %d: %.1f us/token (with a reference argmax)\n", N, (t1 - t0) / 200.0);
    kvc_sampler_free(s);
    free(l);
    free(want);
}

/* ---------------------------------------------------------------- penalties */

static int32_t greedy_after(const kvc_sampler_params *base, const float *l, int32_t n,
                            const int32_t *hist, int n_hist)
{
    kvc_sampler_params p = *base;
    p.temperature = 0.0f;
    kvc_sampler *s = new_sampler(&p, n);
    for (int i = 0; i < n_hist; i++)
        kvc_sampler_accept(s, hist[i]);
    int32_t t = kvc_sampler_sample(s, l);
    kvc_sampler_free(s);
    return t;
}

static void test_penalties(void)
{
    kvc_sampler_params p = kvc_sampler_default_params();
    const int32_t once[] = { 0 }, twice[] = { 0, 0 };

    /* repeat penalty divides a positive logit: 2.0 / 1.5 = 1.33 < 1.9 */
    const float pos[4] = { 2.0f, 1.9f, -1.0f, 0.5f };
    CHECK_EQ_INT(greedy_after(&p, pos, 4, once, 1), 0);         /* off by default */
    p.repeat_penalty = 1.5f;
    CHECK_EQ_INT(greedy_after(&p, pos, 4, NULL, 0), 0);
    CHECK_EQ_INT(greedy_after(&p, pos, 4, once, 1), 1);
    p.repeat_penalty = 1.04f;                                    /* 2.0 / 1.04 = 1.92 > 1.9 */
    CHECK_EQ_INT(greedy_after(&p, pos, 4, once, 1), 0);

    /* ... and multiplies a negative one: -1.0 * 1.5 = -1.5 < -1.2 */
    const float neg[2] = { -1.0f, -1.2f };
    p.repeat_penalty = 1.5f;
    CHECK_EQ_INT(greedy_after(&p, neg, 2, once, 1), 1);
    p.repeat_penalty = 1.1f;                                     /* -1.1 > -1.2 */
    CHECK_EQ_INT(greedy_after(&p, neg, 2, once, 1), 0);

    /* presence: once per token; frequency: per occurrence */
    const float two[2] = { 1.0f, 0.8f };
    p = kvc_sampler_default_params();
    p.presence_penalty = 0.3f;
    CHECK_EQ_INT(greedy_after(&p, two, 2, once, 1), 1);
    p.presence_penalty = 0.1f;
    CHECK_EQ_INT(greedy_after(&p, two, 2, twice, 2), 0);        /* still only 0.1 */
    p = kvc_sampler_default_params();
    p.frequency_penalty = 0.15f;
    CHECK_EQ_INT(greedy_after(&p, two, 2, once, 1), 0);         /* 0.85 > 0.8 */
    CHECK_EQ_INT(greedy_after(&p, two, 2, twice, 2), 1);        /* 0.70 < 0.8 */
    p.frequency_penalty = -0.5f;                                 /* negative encourages */
    CHECK_EQ_INT(greedy_after(&p, (const float[]){ 0.8f, 1.0f }, 2, once, 1), 0);

    /* the window: with repeat_last_n 2, token 0 falls out after two more */
    p = kvc_sampler_default_params();
    p.presence_penalty = 0.3f;
    p.repeat_last_n = 2;
    const int32_t hist[] = { 0, 5, 6 };
    const float wide[8] = { 1.0f, 0.8f, 0, 0, 0, 0, 0, 0 };
    CHECK_EQ_INT(greedy_after(&p, wide, 8, hist, 2), 1);         /* 0 in the window */
    CHECK_EQ_INT(greedy_after(&p, wide, 8, hist, 3), 0);         /* 0 fell out */
    p.repeat_last_n = -1;                                        /* unbounded */
    CHECK_EQ_INT(greedy_after(&p, wide, 8, hist, 3), 1);
    p.repeat_last_n = 0;                                         /* off */
    CHECK_EQ_INT(greedy_after(&p, wide, 8, hist, 1), 0);

    /* a long history through the ring, against counts kept here */
    p = kvc_sampler_default_params();
    p.temperature = 0.0f;
    p.frequency_penalty = 1.0f;
    p.repeat_last_n = 16;
    enum { V = 8 };
    kvc_sampler *s = new_sampler(&p, V);
    int32_t hist_all[500];
    for (int i = 0; i < 500; i++) {
        hist_all[i] = (int32_t)(test_uniform() * V);
        kvc_sampler_accept(s, hist_all[i]);
        if (i % 7 == 0) {
            float flat[V], pen[V];
            for (int j = 0; j < V; j++)
                flat[j] = pen[j] = (float)j * 0.1f;
            for (int j = i + 1 - 16 < 0 ? 0 : i + 1 - 16; j <= i; j++)
                pen[hist_all[j]] -= 1.0f;
            CHECK_EQ_INT(kvc_sampler_sample(s, flat), ref_argmax(pen, V));
        }
    }
    kvc_sampler_accept(s, -1);                                    /* ignored */
    kvc_sampler_accept(s, V);
    /* reset forgets */
    kvc_sampler_reset(s);
    const float up[V] = { 0, 0, 0, 0, 0, 0, 0, 1.0f };
    kvc_sampler_accept(s, 7);
    CHECK_EQ_INT(kvc_sampler_sample(s, up), 0);
    kvc_sampler_reset(s);
    CHECK_EQ_INT(kvc_sampler_sample(s, up), 7);
    kvc_sampler_free(s);

    /* penalties never write to the caller's logits */
    float mine[4] = { 2.0f, 1.9f, -1.0f, 0.5f };
    p = kvc_sampler_default_params();
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 1.0f;
    s = new_sampler(&p, 4);
    kvc_sampler_accept(s, 0);
    kvc_sampler_accept(s, 2);
    kvc_sampler_sample(s, mine);
    CHECK(mine[0] == 2.0f && mine[1] == 1.9f && mine[2] == -1.0f && mine[3] == 0.5f);
    kvc_sampler_free(s);
}

int main(void)
{
    test_params();
    test_greedy();
    test_seed();
    test_greedy_limits();
    test_frequencies();
    test_filters_against_reference();
    test_penalties();
    test_large_vocab();
    return test_done("test_sampler");
}
