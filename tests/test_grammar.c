/* test_grammar.c - the grammar dialect and the byte matcher: what parses,
 * what is refused (with the error naming it), which strings match, UTF-8
 * classes and partial characters, bounded repetition, rollback and clone.
 * Needs nothing from ../shared. */
#include "test.h"

#include "grammar.h"

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
        { "root ::= x | \"z\"\nx ::= \"y\"? root", "left recursion" },
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
        { "root ::= (\"\")*", "left recursion" },
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

int main(void)
{
    test_refused();
    test_basics();
    test_utf8();
    test_steps();
    return test_done("test_grammar");
}
