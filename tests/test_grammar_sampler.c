/* test_grammar_sampler.c - the sampler's hooks for constrained decoding and
 * the OpenAI request fields: token masks, logit_bias (and its place before
 * the penalties), logprobs / top_logprobs against a reference computed here,
 * and a masked generation that the grammar matcher accepts token by token.
 * Needs nothing from ../shared. */
#include "test.h"

#include "gguf.h"
#include "grammar.h"
#include "model_gen.h"
#include "sampler.h"
#include "tokenizer.h"

static uint64_t rng = 777;

static double uniform(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int32_t n, float scale)
{
    for (int32_t i = 0; i < n; i++)
        l[i] = (float)((uniform() * 2.0 - 1.0) * scale);
}

static void set_bit(uint32_t *mask, int32_t id)
{
    mask[id >> 5] |= 1u << (id & 31);
}

/* Setting and clearing a mask and biases leaves a sampler exactly as one
 * that never had them: the same tokens, greedy and sampled, with penalties. */
static void test_unchanged_without_mask(void)
{
    enum { N = 3000 };
    float *l = malloc(N * sizeof(*l));
    uint32_t *mask = calloc(kvc_mask_words(N), sizeof(*mask));
    for (int mode = 0; mode < 3; mode++) {
        kvc_sampler_params p = kvc_sampler_default_params();
        p.temperature = mode == 0 ? 0.0f : 0.9f;
        p.top_k = mode == 2 ? 0 : 40;
        p.repeat_penalty = mode == 2 ? 1.3f : 1.0f;
        kvc_sampler *a = kvc_sampler_new(&p, N), *b = kvc_sampler_new(&p, N);
        kvc_logit_bias lb = { 5, 3.0f };
        CHECK(kvc_sampler_set_mask(b, mask) == KVC_OK);
        CHECK(kvc_sampler_set_logit_bias(b, &lb, 1, NULL) == KVC_OK);
        CHECK(kvc_sampler_set_mask(b, NULL) == KVC_OK);
        CHECK(kvc_sampler_set_logit_bias(b, NULL, 0, NULL) == KVC_OK);
        int same = 0;
        for (int i = 0; i < 200; i++) {
            random_logits(l, N, 6.0f);
            int32_t ta = kvc_sampler_sample(a, l), tb = kvc_sampler_sample(b, l);
            same += ta == tb;
            kvc_sampler_accept(a, ta);
            kvc_sampler_accept(b, tb);
        }
        CHECK_EQ_INT(same, 200);
        kvc_sampler_free(a);
        kvc_sampler_free(b);
    }
    /* a mask that allows everything changes nothing either */
    memset(mask, 0xff, kvc_mask_words(N) * sizeof(*mask));
    kvc_sampler_params p = kvc_sampler_default_params();
    kvc_sampler *a = kvc_sampler_new(&p, N), *b = kvc_sampler_new(&p, N);
    kvc_sampler_set_mask(b, mask);
    int same = 0;
    for (int i = 0; i < 200; i++) {
        random_logits(l, N, 6.0f);
        same += kvc_sampler_sample(a, l) == kvc_sampler_sample(b, l);
    }
    CHECK_EQ_INT(same, 200);
    kvc_sampler_free(a);
    kvc_sampler_free(b);
    free(mask);
    free(l);
}

static void test_mask(void)
{
    enum { N = 1000 };
    float l[N];
    uint32_t mask[(N + 31) / 32];
    for (int mode = 0; mode < 3; mode++) {
        kvc_sampler_params p = kvc_sampler_default_params();
        p.temperature = mode == 0 ? 0.0f : 1.5f;
        p.top_k = mode == 2 ? 0 : 40;
        p.top_p = mode == 2 ? 1.0f : 0.95f;
        p.min_p = 0.0f;
        kvc_sampler *s = kvc_sampler_new(&p, N);
        int bad = 0, allowed_total = 0;
        for (int i = 0; i < 300; i++) {
            random_logits(l, N, 8.0f);
            memset(mask, 0, sizeof(mask));
            int32_t best = -1;
            for (int32_t id = 0; id < N; id++)
                if (uniform() < 0.05) {
                    set_bit(mask, id);
                    allowed_total++;
                    if (best < 0 || l[id] > l[best])
                        best = id;
                }
            if (best < 0)
                continue;
            kvc_sampler_set_mask(s, mask);
            int32_t t = kvc_sampler_sample(s, l);
            bad += t < 0 || !kvc_mask_test(mask, t);
            if (mode == 0)
                CHECK_EQ_INT(t, best);
        }
        CHECK_EQ_INT(bad, 0);
        CHECK(allowed_total > 0);
        /* nothing allowed: -1; allowed tokens all at -inf: the lowest allowed */
        memset(mask, 0, sizeof(mask));
        kvc_sampler_set_mask(s, mask);
        CHECK_EQ_INT(kvc_sampler_sample(s, l), -1);
        set_bit(mask, 77);
        set_bit(mask, 500);
        kvc_logit_bias ban[2] = { { 500, -INFINITY }, { 77, -INFINITY } };
        CHECK(kvc_sampler_set_logit_bias(s, ban, 2, NULL) == KVC_OK);
        CHECK_EQ_INT(kvc_sampler_sample(s, l), 77);
        kvc_sampler_free(s);
    }
}

static void test_logit_bias(void)
{
    enum { N = 50 };
    float l[N];
    for (int i = 0; i < N; i++)
        l[i] = (float)i / 10.0f;          /* 49 is the best */
    kvc_sampler_params p = kvc_sampler_default_params();
    p.temperature = 0.0f;
    kvc_sampler *s = kvc_sampler_new(&p, N);
    kvc_err err = { 0 };
    kvc_logit_bias b[3] = { { 49, -100.0f }, { 3, 2.0f }, { 3, 3.0f } };   /* 3 gets 5 */
    CHECK(kvc_sampler_set_logit_bias(s, b, 1, &err) == KVC_OK);
    CHECK_EQ_INT(kvc_sampler_sample(s, l), 48);
    CHECK(kvc_sampler_set_logit_bias(s, b, 3, &err) == KVC_OK);
    CHECK_EQ_INT(kvc_sampler_sample(s, l), 3);               /* 0.3 + 5 > 4.8 */
    CHECK(kvc_sampler_set_logit_bias(s, b + 1, 1, &err) == KVC_OK);
    CHECK_EQ_INT(kvc_sampler_sample(s, l), 49);              /* 2.3 < 4.9: the old biases are gone */
    kvc_logit_bias bad[2] = { { N, 1.0f }, { 2, NAN } };
    CHECK(kvc_sampler_set_logit_bias(s, bad, 1, &err) == KVC_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "token 50") != NULL);
    CHECK(kvc_sampler_set_logit_bias(s, bad + 1, 1, &err) == KVC_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "token 2") != NULL);
    CHECK_EQ_INT(kvc_sampler_sample(s, l), 49);              /* a refused call changed nothing */
    CHECK(kvc_sampler_set_logit_bias(s, NULL, 0, &err) == KVC_OK);
    CHECK_EQ_INT(kvc_sampler_sample(s, l), 49);
    kvc_sampler_free(s);

    /* bias comes before the penalties (llama.cpp's order): token 0 at logit 1
     * with bias -3 is -2, then penalized (in the window) to -4, below token 1
     * at -3; penalizing first would give 0.5 - 3 = -2.5 and pick token 0 */
    float l2[4] = { 1.0f, -3.0f, -10.0f, -10.0f };
    p.repeat_penalty = 2.0f;
    s = kvc_sampler_new(&p, 4);
    kvc_sampler_accept(s, 0);
    kvc_logit_bias b2 = { 0, -3.0f };
    kvc_sampler_set_logit_bias(s, &b2, 1, NULL);
    CHECK_EQ_INT(kvc_sampler_sample(s, l2), 1);
    kvc_sampler_free(s);
}

static void test_logprobs(void)
{
    enum { N = 5000 };
    float *l = malloc(N * sizeof(*l));
    random_logits(l, N, 10.0f);
    l[10] = l[11] = 30.0f;               /* a tie at the top: the lower id first */
    l[20] = -INFINITY;
    long double z = 0;
    for (int i = 0; i < N; i++)
        if (l[i] != -INFINITY)
            z += expl((long double)l[i] - 30.0L);
    kvc_logprob top[20];
    int32_t n_top = -1;
    float lp = kvc_logprobs(l, N, 123, top, 20, &n_top);
    CHECK_NEAR(lp, (double)((long double)l[123] - 30.0L - logl(z)), 1e-5);
    CHECK_EQ_INT(n_top, 20);
    CHECK(top[0].token == 10 && top[1].token == 11);
    for (int i = 0; i < 20; i++) {
        CHECK_NEAR(top[i].logprob, (double)((long double)l[top[i].token] - 30.0L - logl(z)), 1e-5);
        if (i)
            CHECK(top[i].logprob <= top[i - 1].logprob);
    }
    /* the 20 best really are the 20 best */
    int above = 0;
    for (int i = 0; i < N; i++)
        above += l[i] > l[top[19].token];
    CHECK_EQ_INT(above, 19);
    CHECK(kvc_logprobs(l, N, 20, NULL, 0, NULL) == -INFINITY);
    CHECK(isnan(kvc_logprobs(l, N, N, NULL, 0, NULL)));
    /* probabilities sum to 1 */
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += exp(kvc_logprobs(l, N, i, NULL, 0, NULL));
    CHECK_NEAR(sum, 1.0, 1e-4);
    /* top_n above the vocabulary size */
    float small[3] = { 0.0f, 1.0f, 0.0f };
    CHECK_NEAR(kvc_logprobs(small, 3, 1, top, 20, &n_top), 1.0 - log(exp(1.0) + 2.0), 1e-6);
    CHECK_EQ_INT(n_top, 3);
    CHECK(top[0].token == 1 && top[1].token == 0 && top[2].token == 2);
    free(l);
}

/* Random logits through the sampler with the grammar's mask, greedy and
 * sampled: every token is accepted by the matcher, and the output parses. */
static void test_masked_generation(void)
{
    kvc_tokenizer *t = NULL;
    kvc_err err = { 0 };
    if (kvc_gen_tokenizer("demo", &t, &err) != KVC_OK) {
        CHECKF(false, "%s", err.msg);
        return;
    }
    const char *schema = "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"n\":{\"enum\":[1,2]}},"
                         "\"required\":[\"ok\",\"n\"]}";
    kvc_grammar *g = NULL;
    kvc_gvocab *v = NULL;
    CHECK(kvc_grammar_from_schema(schema, strlen(schema), &g, &err) == KVC_OK);
    CHECK(kvc_gvocab_new(t, &v, &err) == KVC_OK);
    int32_t n = kvc_tokenizer_n_vocab(t);
    float *l = malloc((size_t)n * sizeof(*l));
    uint32_t *mask = malloc(kvc_mask_words(n) * sizeof(*mask));
    for (int mode = 0; mode < 2 && g && v; mode++) {
        kvc_sampler_params p = kvc_sampler_default_params();
        p.temperature = mode == 0 ? 0.0f : 1.0f;
        kvc_sampler *s = kvc_sampler_new(&p, n);
        kvc_gmatch *m = kvc_gmatch_new(g, v);
        kvc_sampler_set_mask(s, mask);
        int32_t ids[256];
        int n_ids = 0, rejected = 0;
        while (!kvc_gmatch_is_done(m) && n_ids < 256) {
            random_logits(l, n, 5.0f);
            CHECK(kvc_gmatch_mask(m, mask) > 0);
            int32_t tok = kvc_sampler_sample(s, l);
            rejected += kvc_gmatch_accept_token(m, tok) != KVC_OK;
            if (!kvc_tokenizer_is_eog(t, tok))
                ids[n_ids++] = tok;
        }
        CHECK_EQ_INT(rejected, 0);
        /* the structure is forced by the enum and booleans: it always ends */
        CHECK(kvc_gmatch_is_done(m));
        char *text = kvc_detokenize(t, ids, n_ids, false);
        CHECKF(text && strstr(text, "\"ok\"") && strstr(text, "\"n\""), "output: %s", text ? text : "");
        free(text);
        kvc_gmatch_free(m);
        kvc_sampler_free(s);
    }
    free(l);
    free(mask);
    kvc_gvocab_free(v);
    kvc_grammar_free(g);
    kvc_tokenizer_free(t);
}

int main(void)
{
    test_unchanged_without_mask();
    test_mask();
    test_logit_bias();
    test_logprobs();
    test_masked_generation();
    return test_done("test_grammar_sampler");
}
