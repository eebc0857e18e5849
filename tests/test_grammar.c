/* test_grammar.c - the grammar dialect and the byte matcher: what parses,
 * what is refused (with the error naming it), which strings match, UTF-8
 * classes and partial characters, bounded repetition, rollback and clone,
 * nullable repetition ((a*)*, (a?)+), and the matcher's cost limits (issue
 * 30: too ambiguous or too costly is an error, never a silent end).
 * Needs nothing from ../shared. */
#include "test.h"

#include "grammar.h"
#include "model_gen.h"
#include "schema_cases.h"
#include "tokenizer.h"

static kvc_grammar *parse(const char *text)
{
    kvc_grammar *g = NULL;
    kvc_err err = { 0 };
    int rc = kvc_grammar_parse(text, strlen(text), &g, &err);
    CHECKF(rc == KVC_OK, "%s: %s", text, err.msg);
    return g;
}

/* The whole of s matches g (and the grammar can end there). */
static bool matches(const kvc_grammar *g, const char *s, size_t n)
{
    kvc_gmatch *m = kvc_gmatch_new(g, NULL);
    bool ok = m && kvc_gmatch_accept_bytes(m, s, n) == KVC_OK && kvc_gmatch_is_complete(m);
    kvc_gmatch_free(m);
    return ok;
}

/* s is a prefix of something g matches. */
static bool viable(const kvc_grammar *g, const char *s)
{
    kvc_gmatch *m = kvc_gmatch_new(g, NULL);
    bool ok = m && kvc_gmatch_accept_bytes(m, s, strlen(s)) == KVC_OK;
    kvc_gmatch_free(m);
    return ok;
}

#define MATCH(g, s)   CHECKF(matches(g, s, strlen(s)), "should match: \"%s\"", s)
#define NOMATCH(g, s) CHECKF(!matches(g, s, strlen(s)), "should not match: \"%s\"", s)

static void test_refused(void)
{
    static const struct { const char *text, *msg; } bad[] = {
        { "root ::= valu", "undefined rule 'valu'" },
        { "root ::= root \"a\" | \"b\"", "left recursion" },
        { "root ::= x | \"b\"\nx ::= \"y\"? root \"c\"", "left recursion" },
        { "root ::= \"a\" root", "never finish" },
        { "root ::= [b-a]", "out of order" },
        { "root ::= \"abc", "unterminated" },
        { "root ::= [^\\x00-\\U0010FFFF]", "empty character class" },
        { "root ::= \"a\"{3,2}", "repetition" },
        { "root ::= \"a\"{20000}", "repetition" },
        { "root ::= (\"a\"", "expected ')'" },
        { "x ::= \"a\"", "no rule 'root'" },
        { "root ::= \"a\"\nroot ::= \"b\"", "defined twice" },
        { "root ::= \"\\q\"", "unknown escape" },
        { "root ::= \"\\xff\\uD800\"", "Unicode" },
        { "root ::= \"a\" )", "')'" },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        kvc_grammar *g = NULL;
        kvc_err err = { 0 };
        int rc = kvc_grammar_parse(bad[i].text, strlen(bad[i].text), &g, &err);
        CHECKF(rc == KVC_ERR_FORMAT && g == NULL, "accepted: %s", bad[i].text);
        CHECKF(strstr(err.msg, bad[i].msg) != NULL, "%s: message \"%s\" lacks \"%s\"", bad[i].text,
               err.msg, bad[i].msg);
    }
}

static void test_basics(void)
{
    kvc_grammar *g = parse("root ::= \"ab\" | \"a\" x  # comment\n"
                           "x ::= [0-9]+ (\",\" [0-9]+)*\n");
    if (!g)
        return;
    MATCH(g, "ab");
    MATCH(g, "a1");
    MATCH(g, "a12,3,456");
    NOMATCH(g, "a");
    NOMATCH(g, "a1,");
    NOMATCH(g, "abc");
    NOMATCH(g, "");
    CHECK(viable(g, "a1,"));
    CHECK(!viable(g, "b"));
    kvc_grammar_free(g);

    g = parse("root ::= \"x\"{2,4} \"y\"? [^a-c]{0,2} \"!\"");
    if (g) {
        NOMATCH(g, "x!");
        MATCH(g, "xx!");
        MATCH(g, "xxxxy!");
        NOMATCH(g, "xxxxxdd!");
        MATCH(g, "xxdd!");
        NOMATCH(g, "xxa!");
        NOMATCH(g, "xxddd!");
        kvc_grammar_free(g);
    }
    /* a rule body runs until the next "name ::=", across lines */
    g = parse("root ::= a\n  b\na ::= \"1\"\nb ::= \"2\" |\n \"3\"");
    if (g) {
        MATCH(g, "12");
        MATCH(g, "13");
        NOMATCH(g, "1");
        kvc_grammar_free(g);
    }
    /* nullable rules and an empty alternative */
    g = parse("root ::= a b \"!\"\na ::= \"\" | \"a\"\nb ::= c*\nc ::= \"c\" | \"C\"");
    if (g) {
        MATCH(g, "!");
        MATCH(g, "a!");
        MATCH(g, "acC!");
        kvc_grammar_free(g);
    }
}

static void test_utf8(void)
{
    kvc_grammar *g = parse("root ::= [\\u00e0-\\u00ff\\u4e00-\\u9fff\\U0001F600-\\U0001F64F]+ \"\\n\"");
    if (!g)
        return;
    MATCH(g, "\xc3\xa9\n");                         /* é */
    MATCH(g, "\xe4\xb8\xad\xe6\x96\x87\n");         /* 中文 */
    MATCH(g, "\xf0\x9f\x98\x80\xc3\xa0\n");         /* 😀à */
    NOMATCH(g, "\xc3\x80\n");                       /* À, below the range */
    NOMATCH(g, "e\n");
    /* a partial character is kept only if it can still complete into the class */
    CHECK(viable(g, "\xe4"));
    CHECK(viable(g, "\xe4\xb8"));
    CHECK(!viable(g, "\xe3"));                      /* U+3000..U+3FFF: none in the class */
    CHECK(!viable(g, "\xc2"));                      /* U+0080..U+00BF */
    CHECK(!viable(g, "\xc0\xa9"));                  /* overlong */
    CHECK(!viable(g, "\xed\xa0\x80"));              /* a surrogate */
    CHECK(!viable(g, "\xf4\x90"));                  /* above U+10FFFF */
    CHECK(!viable(g, "\xe4\x41"));                  /* not a continuation byte */
    kvc_gmatch *m = kvc_gmatch_new(g, NULL);
    CHECK(kvc_gmatch_accept_bytes(m, "\xe4\xb8\xad\n", 4) == KVC_OK);
    CHECK(kvc_gmatch_is_complete(m));
    CHECK(kvc_gmatch_accept_bytes(m, "\xe4", 1) == KVC_ERR_INVALID_ARG);
    kvc_gmatch_free(m);
    kvc_grammar_free(g);

    /* "." and negated classes take any code point, never invalid UTF-8 */
    g = parse("root ::= \"<\" [^>]* \">\" . ");
    if (g) {
        MATCH(g, "<\xf0\x9f\x98\x80 x>\xe2\x82\xac");
        NOMATCH(g, "<\xff>a");
        kvc_grammar_free(g);
    }
}

/* Closed: complete and nothing may follow (a reply cut there is whole);
 * `[a-z]*` is complete everywhere and never closed. */
static void test_closed(void)
{
    static const struct { const char *gbnf, *text; bool complete, closed; } cases[] = {
        { "root ::= [a-z]*", "", true, false },
        { "root ::= [a-z]*", "abc", true, false },
        { "root ::= \"ab\"", "a", false, false },
        { "root ::= \"ab\"", "ab", true, true },
        { "root ::= \"a\" [b]?", "a", true, false },
        { "root ::= \"a\" [b]?", "ab", true, true },
        { "root ::= \"{\" [a-z]{0,2} \"}\" ws\nws ::= [ ]?", "{a}", true, false },
        { "root ::= \"{\" [a-z]{0,2} \"}\"", "{a}", true, true },
        { "root ::= \"x\" | \"x\" [0-9]+", "x", true, false },
        { "root ::= \"é\"", "\xc3", false, false },
        { "root ::= \"é\"", "é", true, true },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        kvc_grammar *g = parse(cases[i].gbnf);
        kvc_gmatch *m = g ? kvc_gmatch_new(g, NULL) : NULL;
        CHECKF(m && kvc_gmatch_accept_bytes(m, cases[i].text, strlen(cases[i].text)) == KVC_OK,
               "%s: \"%s\" refused", cases[i].gbnf, cases[i].text);
        CHECKF(m && kvc_gmatch_is_complete(m) == cases[i].complete &&
               kvc_gmatch_is_closed(m) == cases[i].closed, "%s after \"%s\": complete %d, "
               "closed %d", cases[i].gbnf, cases[i].text, m && kvc_gmatch_is_complete(m),
               m && kvc_gmatch_is_closed(m));
        kvc_gmatch_free(m);
        kvc_grammar_free(g);
    }
}

static void test_steps(void)
{
    kvc_grammar *g = parse("root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [a-z]+");
    if (!g)
        return;
    kvc_gmatch *m = kvc_gmatch_new(g, NULL);
    CHECK(kvc_gmatch_accept_bytes(m, "[ab", 3) == KVC_OK);
    CHECK(kvc_gmatch_accept_bytes(m, ",c", 2) == KVC_OK);
    CHECK_EQ_INT(kvc_gmatch_n_steps(m), 2);
    /* a refused step changes nothing */
    CHECK(kvc_gmatch_accept_bytes(m, "d,,", 3) == KVC_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvc_gmatch_n_steps(m), 2);
    kvc_gmatch *c = kvc_gmatch_clone(m);
    CHECK(kvc_gmatch_accept_bytes(m, "]", 1) == KVC_OK);
    CHECK(kvc_gmatch_is_complete(m));
    CHECK(!kvc_gmatch_is_complete(c));
    CHECK(kvc_gmatch_rollback(m, 2) == KVC_OK);
    CHECK_EQ_INT(kvc_gmatch_n_steps(m), 1);
    CHECK(kvc_gmatch_accept_bytes(m, "]", 1) == KVC_OK);  /* after "[ab" */
    CHECK(kvc_gmatch_is_complete(m));
    CHECK(kvc_gmatch_rollback(m, 3) == KVC_ERR_INVALID_ARG);
    CHECK(kvc_gmatch_accept_bytes(c, "x]", 2) == KVC_OK);
    CHECK(kvc_gmatch_is_complete(c));
    kvc_gmatch_free(c);
    kvc_gmatch_free(m);
    kvc_grammar_free(g);
}

/* Repetition of what may match nothing is a loop that comes back to the same
 * stack: accepted (issue 30 item 11 refused (a*)* and (a?)+ as "left
 * recursion through rule" naming a helper rule), and matched exactly. */
static void test_nullable_loops(void)
{
    kvc_grammar *g = parse("root ::= (\"\")*");
    if (g) {
        MATCH(g, "");
        NOMATCH(g, "a");
        kvc_grammar_free(g);
    }
    g = parse("root ::= x | \"z\"\nx ::= \"y\"? root");   /* y* z: a loop, not left recursion */
    if (g) {
        MATCH(g, "z");
        MATCH(g, "yyz");
        NOMATCH(g, "yzz");
        kvc_grammar_free(g);
    }
    g = parse("root ::= (\"a\"*)* \"b\" (\"c\"?)+ ((\"d\" | \"\")+)?");
    if (g) {
        MATCH(g, "b");
        MATCH(g, "aaab");
        MATCH(g, "bccc");
        MATCH(g, "abcdd");
        NOMATCH(g, "ab c");
        NOMATCH(g, "bca");
        kvc_grammar_free(g);
    }
    static const struct { const char *pattern, *yes[3], *no[2]; } pats[] = {
        { "^(a*)*$", { "", "a", "aaaa" }, { "b", "ab" } },
        { "^(a?)+$", { "", "a", "aaa" }, { "b", "aab" } },
        { "^x(a?){2,}(b*)+y$", { "xy", "xaaby", "xabbby" }, { "xba", "xay!" } },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(pats); i++) {
        char schema[160];
        snprintf(schema, sizeof(schema), "{\"type\":\"string\",\"pattern\":\"%s\"}", pats[i].pattern);
        kvc_err err = { 0 };
        kvc_grammar *p = NULL;
        CHECKF(kvc_grammar_from_schema(schema, strlen(schema), &p, &err) == KVC_OK, "%s: %s",
               pats[i].pattern, err.msg);
        for (int k = 0; p && k < 3; k++) {
            char s[64];
            snprintf(s, sizeof(s), "\"%s\"", pats[i].yes[k]);
            CHECKF(matches(p, s, strlen(s)), "%s should match %s", pats[i].pattern, s);
        }
        for (int k = 0; p && k < 2; k++) {
            char s[64];
            snprintf(s, sizeof(s), "\"%s\"", pats[i].no[k]);
            CHECKF(!matches(p, s, strlen(s)), "%s should not match %s", pats[i].pattern, s);
        }
        kvc_grammar_free(p);
    }
}

/* The cost limits: a state with too many parses and a call over its budget
 * fail with KVC_ERR_UNSUPPORTED and a message saying so, the state unchanged;
 * the issue's reproducers fit in the default budget. */
static void test_cost_limits(void)
{
    kvc_tokenizer *tok = NULL;
    kvc_gvocab *v = NULL;
    CHECK(kvc_gen_tokenizer("demo", &tok, NULL) == KVC_OK && kvc_gvocab_new(tok, &v, NULL) == KVC_OK);
    if (!v)
        return;
    uint32_t *mask = malloc(kvc_mask_words(kvc_gvocab_n_vocab(v)) * sizeof(*mask));
    kvc_err err = { 0 };
    /* "^(a?){1,10000}$": 10000 ways to read the first "a"; issue 30 found
     * its mask failing silently and the reply ending as "stop" */
    const char *deep = "{\"type\":\"string\",\"pattern\":\"^(a?){1,10000}$\"}";
    kvc_grammar *g = NULL;
    CHECK(kvc_grammar_from_schema(deep, strlen(deep), &g, &err) == KVC_OK);
    int rc = kvc_grammar_check_cost(g, v, 8, 0, &err);
    CHECKF(rc == KVC_ERR_UNSUPPORTED && strstr(err.msg, "ambiguous"), "(a?){1,10000}: %d %s", rc,
           err.msg);
    kvc_grammar_free(g);
    /* the same limit met later: the mask fails, then accepting the byte */
    g = parse("root ::= \"x\" (\"a\"?){1,5000}");
    kvc_gmatch *m = g ? kvc_gmatch_new(g, v) : NULL;
    CHECK(m != NULL);
    if (m) {
        CHECK_EQ_INT(kvc_gmatch_mask(m, mask), KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(kvc_gmatch_error(m), "ambiguous"), "%s", kvc_gmatch_error(m));
        CHECK_EQ_INT(kvc_gmatch_accept_bytes(m, "x", 1), KVC_ERR_UNSUPPORTED);
        CHECK_EQ_INT(kvc_gmatch_n_steps(m), 0);
        CHECK_EQ_INT(kvc_gmatch_min_remaining(m), 1);
    }
    kvc_gmatch_free(m);
    kvc_grammar_free(g);
    /* rules that open inside each other without a character: a depth limit,
     * not a stack overflow (before it, expand recursed until the C stack ran out) */
    g = parse("root ::= \"x\" (e{1,10000}){1,10000} \"y\"\ne ::= \"\"");
    m = g ? kvc_gmatch_new(g, v) : NULL;
    CHECK(m != NULL);
    if (m) {
        CHECK_EQ_INT(kvc_gmatch_mask(m, mask), KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(kvc_gmatch_error(m), "nests too deeply"), "%s", kvc_gmatch_error(m));
    }
    kvc_gmatch_free(m);
    kvc_grammar_free(g);
    /* 150 candidate objects: served in the default budget; a tiny budget
     * refuses the mask (state unchanged) and says so */
    char *any = anyof_schema(150);
    g = NULL;
    CHECK(kvc_grammar_from_schema(any, strlen(any), &g, &err) == KVC_OK);
    CHECKF(g && kvc_grammar_check_cost(g, v, 8, 0, &err) == KVC_OK, "anyOf 150: %s", err.msg);
    m = g ? kvc_gmatch_new(g, v) : NULL;
    rc = m ? kvc_gmatch_accept_bytes(m, "{\"a\":\"", 6) : -100;
    CHECKF(rc == KVC_OK, "anyOf 150 after {\"a\":\": %d %s", rc, m ? kvc_gmatch_error(m) : "");
    for (int i = 0; m && i < 3; i++) {
        int32_t n = kvc_gmatch_mask(m, mask);
        CHECKF(n > 100, "anyOf 150 in the string: %d (%s)", n, kvc_gmatch_error(m));
        CHECK(kvc_gmatch_accept_bytes(m, "q", 1) == KVC_OK);
    }
    kvc_gmatch_free(m);
    m = g ? kvc_gmatch_new_budget(g, v, 20000, &err) : NULL;
    CHECKF(m != NULL, "start within 20000 units: %s", err.msg);
    if (m) {
        CHECK(kvc_gmatch_accept_bytes(m, "{\"a\":\"", 6) == KVC_OK);
        CHECK_EQ_INT(kvc_gmatch_mask(m, mask), KVC_ERR_UNSUPPORTED);
        CHECKF(strstr(kvc_gmatch_error(m), "too costly"), "%s", kvc_gmatch_error(m));
        CHECK_EQ_INT(kvc_gmatch_n_steps(m), 1);
    }
    kvc_gmatch_free(m);
    kvc_grammar_free(g);
    free(any);
    free(mask);
    kvc_gvocab_free(v);
    kvc_tokenizer_free(tok);
}

/* kvc_gmatch_mask_closer is, token by token, the mask's tokens after which
 * kvc_gmatch_min_remaining is smaller (or the EOG); kvc_gmatch_mask_within
 * (budget) those after which it is at most budget; kvc_gmatch_mask_nearest
 * the closer ones after which it is smallest; along random walks over
 * a schema (what the engine's steering to the end used to try one token at
 * a time: ~1 s a step with a 50k vocabulary and 150 candidate objects). */
static void test_closer(void)
{
    kvc_tokenizer *tok = NULL;
    kvc_gvocab *v = NULL;
    CHECK(kvc_gen_tokenizer("demo", &tok, NULL) == KVC_OK && kvc_gvocab_new(tok, &v, NULL) == KVC_OK);
    char *any = anyof_schema(3);
    kvc_grammar *g = NULL;
    kvc_err err = { 0 };
    CHECK(v && kvc_grammar_from_schema(any, strlen(any), &g, &err) == KVC_OK);
    int32_t n_vocab = v ? kvc_gvocab_n_vocab(v) : 0;
    uint32_t *mask = malloc(kvc_mask_words(n_vocab) * sizeof(*mask));
    uint32_t *near = malloc(kvc_mask_words(n_vocab) * sizeof(*near));
    uint32_t *within = malloc(kvc_mask_words(n_vocab) * sizeof(*within));
    uint32_t *best = malloc(kvc_mask_words(n_vocab) * sizeof(*best));
    int32_t *rem = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof(*rem));
    uint64_t rng = 12345;
    int differ = 0, differ_within = 0, differ_best = 0, steps = 0;
    for (int walk = 0; g && walk < 6; walk++) {
        kvc_gmatch *m = kvc_gmatch_new(g, v);
        for (int step = 0; m && step < 40 && !kvc_gmatch_is_done(m); step++, steps++) {
            int32_t n = kvc_gmatch_mask(m, mask), k = kvc_gmatch_mask_closer(m, near);
            int32_t need = kvc_gmatch_min_remaining(m), count = 0, budget = need - 2 + step % 6;
            int32_t kw = budget >= 0 ? kvc_gmatch_mask_within(m, within, budget) : 0;
            int32_t kb = kvc_gmatch_mask_nearest(m, best), fewest = INT32_MAX;
            CHECK(n > 0 && k >= 0 && kw >= 0 && kb >= 0);
            for (int32_t id = 0; id < n_vocab; id++) {
                bool want = false;
                rem[id] = -1;
                if (kvc_mask_test(mask, id) && kvc_gmatch_accept_token(m, id) == KVC_OK) {
                    rem[id] = kvc_gmatch_is_done(m) ? 0 : kvc_gmatch_min_remaining(m);
                    want = kvc_gmatch_is_done(m) || kvc_gmatch_min_remaining(m) < need;
                    kvc_gmatch_rollback(m, 1);
                }
                if (want)
                    fewest = KVC_MIN(fewest, rem[id]);
                else if (rem[id] >= 0)
                    rem[id] = -2 - rem[id];          /* allowed, not closer */
                differ += want != kvc_mask_test(near, id);
                if (budget >= 0)
                    differ_within += ((rem[id] >= 0 && rem[id] <= budget) ||
                                      (rem[id] <= -2 && -2 - rem[id] <= budget)) != kvc_mask_test(within, id);
                count += want;
            }
            for (int32_t id = 0; id < n_vocab; id++)
                differ_best += (rem[id] >= 0 && rem[id] == fewest) != kvc_mask_test(best, id);
            CHECK_EQ_INT(k, count);
            /* a random allowed token; towards the end after a while */
            const uint32_t *from = step > 20 && k > 0 ? near : mask;
            int32_t pick = (int32_t)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) %
                           (from == near ? k : n), id = 0;
            for (; id < n_vocab; id++)
                if (kvc_mask_test(from, id) && pick-- == 0)
                    break;
            CHECK(kvc_gmatch_accept_token(m, id) == KVC_OK);
        }
        kvc_gmatch_free(m);
    }
    CHECKF(differ == 0, "%d tokens differ from the brute-force closer set over %d steps", differ, steps);
    CHECKF(differ_within == 0, "%d tokens differ from the brute-force within set", differ_within);
    CHECKF(differ_best == 0, "%d tokens differ from the brute-force nearest set", differ_best);
    kvc_grammar_free(g);
    free(any);
    free(mask);
    free(near);
    free(within);
    free(best);
    free(rem);
    kvc_gvocab_free(v);
    kvc_tokenizer_free(tok);
}

int main(void)
{
    test_refused();
    test_basics();
    test_utf8();
    test_steps();
    test_closed();
    test_nullable_loops();
    test_cost_limits();
    test_closer();
    return test_done("test_grammar");
}
