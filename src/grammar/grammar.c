/* grammar.c - grammar text -> kvc_grammar, and the checks that make every
 * accepted grammar safe to match (no undefined rule, no left recursion, every
 * reachable rule can finish). The dialect is described in grammar.h. */
#include "grammar_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_REPEAT = 10000,          /* m and n of x{m,n} */
    MAX_ELEMS  = 1 << 22,        /* elements of a compiled grammar */
    MAX_DEPTH  = 200,            /* nesting of ( ) */
};

/* ---------------------------------------------------------------- building */

typedef struct ivec {
    int32_t *v;
    size_t   n, cap;
} ivec;

static bool ivec_push(ivec *a, int32_t x)
{
    if (!kvc_grow((void **)&a->v, &a->cap, a->n, sizeof(*a->v)))
        return false;
    a->v[a->n++] = x;
    return true;
}

typedef struct builder {
    kvc_grammar *g;
    size_t cap_elem, cap_alts, cap_rules, cap_classes, cap_ranges, cap_names, n_names;
    bool   *defined;          /* (n_rules) a "name ::=" was seen */
    int32_t *first_line;      /* (n_rules) line of the first mention */
    size_t  cap_defined;
    int32_t *hash;            /* open addressing over named rules: rule index or -1 */
    size_t   hash_cap;        /* a power of two */
    int32_t  ascii_class[128];/* the single-character class of each ASCII byte, or -1 */
    const char *p, *end;
    int      line;
    int      depth;
    int32_t  cur;             /* the rule being defined, -1 before the first */
    kvc_err *err;
    int      status;          /* first failure, KVC_OK while none */
} builder;

static int fail(builder *b, int code, const char *what, const char *arg)
{
    if (b->status == KVC_OK)
        b->status = kvc_fail(b->err, code, "grammar line %d: %s%s%s%s", b->line, what,
                             arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    return b->status;
}

static int nomem(builder *b)
{
    if (b->status == KVC_OK)
        b->status = kvc_fail(b->err, KVC_ERR_NOMEM, "grammar: out of memory");
    return b->status;
}

static const char *rule_name(const kvc_grammar *g, int32_t r)
{
    return g->names + g->rules[r].name;
}

static uint32_t hash_str(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* A new rule named name[0, n) (helper rules get "" and are not hashed). */
static int32_t new_rule(builder *b, const char *name, size_t n)
{
    kvc_grammar *g = b->g;
    size_t cap = b->cap_defined;
    if (!kvc_grow((void **)&g->rules, &b->cap_rules, (size_t)g->n_rules, sizeof(*g->rules)) ||
        !kvc_grow((void **)&b->defined, &b->cap_defined, (size_t)g->n_rules, sizeof(*b->defined)))
        return nomem(b), -1;
    if (b->cap_defined != cap) {            /* first_line grows with defined */
        int32_t *fl = realloc(b->first_line, b->cap_defined * sizeof(*fl));
        if (!fl)
            return nomem(b), -1;
        b->first_line = fl;
    }
    while (b->n_names + n + 1 > b->cap_names) {
        size_t cap = b->cap_names ? 2 * b->cap_names : 256;
        char *p = realloc(g->names, cap);
        if (!p)
            return nomem(b), -1;
        g->names = p;
        b->cap_names = cap;
    }
    memcpy(g->names + b->n_names, name, n);
    g->names[b->n_names + n] = 0;
    int32_t r = g->n_rules++;
    g->rules[r] = (grule){ 0, 0, (int32_t)b->n_names };
    b->n_names += n + 1;
    b->defined[r] = false;
    b->first_line[r] = b->line;
    return r;
}

/* The rule named s[0, n), created (undefined) at its first mention. */
static int32_t rule_by_name(builder *b, const char *s, size_t n)
{
    if ((size_t)b->g->n_rules * 2 >= b->hash_cap) {
        size_t cap = b->hash_cap ? 2 * b->hash_cap : 256;
        int32_t *h = malloc(cap * sizeof(*h));
        if (!h)
            return nomem(b), -1;
        memset(h, 0xff, cap * sizeof(*h));
        for (size_t i = 0; i < b->hash_cap; i++) {
            int32_t r = b->hash[i];
            if (r < 0)
                continue;
            const char *nm = rule_name(b->g, r);
            size_t j = hash_str(nm, strlen(nm)) & (cap - 1);
            while (h[j] >= 0)
                j = (j + 1) & (cap - 1);
            h[j] = r;
        }
        free(b->hash);
        b->hash = h;
        b->hash_cap = cap;
    }
    size_t j = hash_str(s, n) & (b->hash_cap - 1);
    for (; b->hash[j] >= 0; j = (j + 1) & (b->hash_cap - 1)) {
        const char *nm = rule_name(b->g, b->hash[j]);
        if (strlen(nm) == n && memcmp(nm, s, n) == 0)
            return b->hash[j];
    }
    int32_t r = new_rule(b, s, n);
    if (r >= 0)
        b->hash[j] = r;
    return r;
}

/* Give rule r its alternatives (each a sequence of elements). */
static int set_alts(builder *b, int32_t r, const ivec *seqs, size_t n_seqs)
{
    kvc_grammar *g = b->g;
    g->rules[r].alt_first = g->n_alts;
    g->rules[r].n_alts = (int32_t)n_seqs;
    for (size_t i = 0; i < n_seqs; i++) {
        if ((size_t)g->n_elem + seqs[i].n + 1 > MAX_ELEMS)
            return fail(b, KVC_ERR_FORMAT, "grammar too large", NULL);
        if (!kvc_grow((void **)&g->alts, &b->cap_alts, (size_t)g->n_alts, sizeof(*g->alts)))
            return nomem(b);
        g->alts[g->n_alts++] = g->n_elem;
        for (size_t k = 0; k <= seqs[i].n; k++) {
            if (!kvc_grow((void **)&g->elem, &b->cap_elem, (size_t)g->n_elem, sizeof(*g->elem)))
                return nomem(b);
            g->elem[g->n_elem++] = k < seqs[i].n ? seqs[i].v[k] : GE_MAKE(GE_END, 0);
        }
    }
    return KVC_OK;
}

/* A class from sorted, merged ranges r[0, 2n). */
static int32_t add_class(builder *b, const uint32_t *r, size_t n)
{
    kvc_grammar *g = b->g;
    if (!kvc_grow((void **)&g->classes, &b->cap_classes, (size_t)g->n_classes, sizeof(*g->classes)))
        return nomem(b), -1;
    gclass k = { { 0 }, g->n_ranges, (int32_t)n };
    for (size_t i = 0; i < n; i++) {
        for (uint32_t c = r[2 * i]; c <= r[2 * i + 1] && c < 128; c++)
            k.ascii[c >> 5] |= 1u << (c & 31);
        for (int j = 0; j < 2; j++) {
            if (!kvc_grow((void **)&g->ranges, &b->cap_ranges, 2 * (size_t)g->n_ranges + j,
                           sizeof(*g->ranges)))
                return nomem(b), -1;
            g->ranges[2 * g->n_ranges + j] = r[2 * i + j];
        }
        g->n_ranges++;
    }
    g->classes[g->n_classes] = k;
    return g->n_classes++;
}

static int32_t char_class(builder *b, uint32_t cp)
{
    if (cp < 128 && b->ascii_class[cp] >= 0)
        return b->ascii_class[cp];
    uint32_t r[2] = { cp, cp };
    int32_t c = add_class(b, r, 1);
    if (cp < 128)
        b->ascii_class[cp] = c;
    return c;
}

/* A helper rule (a group or a repetition), named after the rule being
 * defined so that errors point somewhere: "value(helper)". */
static int32_t helper_rule(builder *b)
{
    char name[80];
    const char *cur = b->cur >= 0 ? rule_name(b->g, b->cur) : "";
    int n = snprintf(name, sizeof(name), "%.60s(helper)", cur);
    int32_t r = new_rule(b, name, (size_t)n);
    if (r >= 0)
        b->defined[r] = true;
    return r;
}

/* ---------------------------------------------------------------- lexing */

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

/* Skip spaces, newlines and comments. */
static void skip_space(builder *b)
{
    while (b->p < b->end) {
        char c = *b->p;
        if (c == '\n') {
            b->line++;
            b->p++;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            b->p++;
        } else if (c == '#') {
            while (b->p < b->end && *b->p != '\n')
                b->p++;
        } else {
            return;
        }
    }
}

/* At "name ::=" (after spaces): the start of the next rule. */
static bool at_rule_start(const builder *b)
{
    const char *q = b->p;
    while (q < b->end && is_name_char(*q))
        q++;
    if (q == b->p)
        return false;
    while (q < b->end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n'))
        q++;
    return b->end - q >= 3 && memcmp(q, "::=", 3) == 0;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point at b->p, advanced; invalid UTF-8 is an error. */
static bool read_utf8(builder *b, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)b->p;
    size_t left = (size_t)(b->end - b->p);
    uint32_t c = s[0];
    int n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
          : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (n < 0 || (size_t)n + 1 > left)
        return fail(b, KVC_ERR_FORMAT, "invalid UTF-8", NULL), false;
    c = n ? c & (0x3Fu >> n) : c;
    for (int i = 1; i <= n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return fail(b, KVC_ERR_FORMAT, "invalid UTF-8", NULL), false;
        c = c << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[4] = { 0, 0x80, 0x800, 0x10000 };
    if (c < min[n] || c > KVC_MAX_CP || (c >= 0xD800 && c <= 0xDFFF))
        return fail(b, KVC_ERR_FORMAT, "invalid UTF-8", NULL), false;
    b->p += n + 1;
    *cp = c;
    return true;
}

/* A character inside "..." or [...], escapes resolved. */
static bool read_char(builder *b, uint32_t *cp)
{
    if (b->p >= b->end)
        return fail(b, KVC_ERR_FORMAT, "unterminated literal or class", NULL), false;
    if (*b->p != '\\')
        return read_utf8(b, cp);
    if (b->end - b->p < 2)
        return fail(b, KVC_ERR_FORMAT, "unterminated escape", NULL), false;
    char e = b->p[1];
    b->p += 2;
    int digits = 0;
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'':
        *cp = (uint8_t)e;
        return true;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default: {
        char s[2] = { e, 0 };
        return fail(b, KVC_ERR_FORMAT, "unknown escape \\", s), false;
    }
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = b->p < b->end ? hex_value(*b->p) : -1;
        if (h < 0)
            return fail(b, KVC_ERR_FORMAT, "bad hex escape", NULL), false;
        v = v << 4 | (uint32_t)h;
        b->p++;
    }
    if (v > KVC_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
        return fail(b, KVC_ERR_FORMAT, "escape outside Unicode scalar values", NULL), false;
    *cp = v;
    return true;
}

static int cmp_range(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sort and merge ranges r[0, 2n) in place, then complement them over
 * [0, U+10FFFF] when negate; returns the new count (r has room for n + 1). */
static size_t normalize_ranges(uint32_t *r, size_t n, bool negate)
{
    qsort(r, n, 2 * sizeof(*r), cmp_range);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && r[2 * i] <= r[2 * (k - 1) + 1] + 1) {
            if (r[2 * i + 1] > r[2 * (k - 1) + 1])
                r[2 * (k - 1) + 1] = r[2 * i + 1];
        } else {
            r[2 * k] = r[2 * i];
            r[2 * k + 1] = r[2 * i + 1];
            k++;
        }
    }
    if (!negate)
        return k;
    uint32_t next = 0;
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {       /* writes never pass the read position + 1 */
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (lo > next) {
            r[2 * m] = next;
            r[2 * m + 1] = lo - 1;
            m++;
        }
        next = hi + 1;
    }
    if (next <= KVC_MAX_CP) {
        r[2 * m] = next;
        r[2 * m + 1] = KVC_MAX_CP;
        m++;
    }
    return m;
}

/* [...] after the '[': a CHARS element. */
static int32_t parse_class(builder *b)
{
    bool negate = b->p < b->end && *b->p == '^';
    b->p += negate;
    ivec r = { 0 };
    while (b->p < b->end && *b->p != ']') {
        uint32_t lo, hi;
        if (!read_char(b, &lo))
            goto out;
        hi = lo;
        if (b->end - b->p >= 2 && b->p[0] == '-' && b->p[1] != ']') {
            b->p++;
            if (!read_char(b, &hi))
                goto out;
            if (hi < lo) {
                fail(b, KVC_ERR_FORMAT, "class range out of order", NULL);
                goto out;
            }
        }
        if (!ivec_push(&r, (int32_t)lo) || !ivec_push(&r, (int32_t)hi)) {
            nomem(b);
            goto out;
        }
    }
    if (b->p >= b->end) {
        fail(b, KVC_ERR_FORMAT, "unterminated class", NULL);
        goto out;
    }
    b->p++;
    if (!ivec_push(&r, 0) || !ivec_push(&r, 0)) {     /* room for the complement's extra range */
        nomem(b);
        goto out;
    }
    size_t n = normalize_ranges((uint32_t *)r.v, r.n / 2 - 1, negate);
    if (n == 0) {
        fail(b, KVC_ERR_FORMAT, "empty character class", NULL);
        goto out;
    }
    int32_t c = add_class(b, (uint32_t *)r.v, n);
    free(r.v);
    return c < 0 ? -1 : GE_MAKE(GE_CHARS, c);
out:
    free(r.v);
    return -1;
}

/* ---------------------------------------------------------------- parsing */

static int parse_alternatives(builder *b, int32_t rule);

/* A rule whose one alternative is seq[0, n). */
static int32_t rule_of_seq(builder *b, const int32_t *seq, size_t n)
{
    int32_t r = helper_rule(b);
    if (r < 0)
        return -1;
    ivec s = { (int32_t *)seq, n, n };
    return set_alts(b, r, &s, 1) == KVC_OK ? r : -1;
}

/* Append x{m,n} (n < 0: unbounded) to seq, x being one element:
 * m copies of x, then for x{m,} a rule r ::= x r | "", for x{m,n} a chain
 * t_1 ::= x | "", t_k ::= x t_(k-1) | "" and a reference to t_(n-m). */
static int repeat(builder *b, ivec *seq, int32_t x, long m, long n)
{
    for (long i = 0; i < m; i++)
        if (!ivec_push(seq, x))
            return nomem(b);
    if (n == m)
        return KVC_OK;
    int32_t tail = -1;
    long chain = n < 0 ? 1 : n - m;
    for (long k = 0; k < chain; k++) {
        int32_t r = helper_rule(b);
        if (r < 0)
            return b->status;
        int32_t s[2] = { x, GE_MAKE(GE_REF, n < 0 ? r : tail) };
        ivec alts[2] = { { s, n < 0 || tail >= 0 ? 2 : 1, 2 }, { 0 } };
        if (set_alts(b, r, alts, 2) != KVC_OK)
            return b->status;
        tail = r;
    }
    return ivec_push(seq, GE_MAKE(GE_REF, tail)) ? KVC_OK : nomem(b);
}

static bool read_count(builder *b, long *v)
{
    skip_space(b);
    if (b->p >= b->end || *b->p < '0' || *b->p > '9')
        return false;
    *v = 0;
    while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
        *v = *v * 10 + (*b->p++ - '0');
        if (*v > MAX_REPEAT)
            return false;
    }
    skip_space(b);
    return true;
}

/* A quantifier after an item whose elements are seq[from, seq->n). */
static int quantify(builder *b, ivec *seq, size_t from)
{
    char q = *b->p++;
    long m = 0, n = -1;
    if (q == '+')
        m = 1;
    else if (q == '?')
        n = 1;
    else if (q == '{') {
        if (!read_count(b, &m))
            return fail(b, KVC_ERR_FORMAT, "bad repetition count (0 to 10000)", NULL);
        n = m;
        if (b->p < b->end && *b->p == ',') {
            b->p++;
            skip_space(b);
            n = -1;
            if (b->p < b->end && *b->p != '}' && (!read_count(b, &n) || n < m))
                return fail(b, KVC_ERR_FORMAT, "bad repetition count (0 to 10000)", NULL);
        }
        if (b->p >= b->end || *b->p != '}')
            return fail(b, KVC_ERR_FORMAT, "expected '}'", NULL);
        b->p++;
    }
    if (seq->n == from)
        return fail(b, KVC_ERR_FORMAT, "quantifier after nothing", NULL);
    int32_t x = seq->v[from];
    if (seq->n - from > 1) {        /* a multi-character literal: one rule */
        int32_t r = rule_of_seq(b, seq->v + from, seq->n - from);
        if (r < 0)
            return b->status;
        x = GE_MAKE(GE_REF, r);
    }
    seq->n = from;
    return repeat(b, seq, x, m, n);
}

/* One item (literal, class, '.', name or group) appended to seq. */
static int parse_item(builder *b, ivec *seq)
{
    char c = *b->p;
    if (c == '"') {
        b->p++;
        while (b->p < b->end && *b->p != '"') {
            uint32_t cp;
            if (!read_char(b, &cp))
                return b->status;
            int32_t k = char_class(b, cp);
            if (k < 0 || !ivec_push(seq, GE_MAKE(GE_CHARS, k)))
                return nomem(b);
        }
        if (b->p >= b->end)
            return fail(b, KVC_ERR_FORMAT, "unterminated literal", NULL);
        b->p++;
    } else if (c == '[') {
        b->p++;
        int32_t e = parse_class(b);
        if (e < 0)
            return b->status;
        if (!ivec_push(seq, e))
            return nomem(b);
    } else if (c == '.') {
        b->p++;
        uint32_t all[2] = { 0, KVC_MAX_CP };
        int32_t k = add_class(b, all, 1);
        if (k < 0 || !ivec_push(seq, GE_MAKE(GE_CHARS, k)))
            return nomem(b);
    } else if (c == '(') {
        if (++b->depth > MAX_DEPTH)
            return fail(b, KVC_ERR_FORMAT, "groups nested too deep", NULL);
        b->p++;
        int32_t r = helper_rule(b);
        if (r < 0 || parse_alternatives(b, r) != KVC_OK)
            return b->status;
        if (b->p >= b->end || *b->p != ')')
            return fail(b, KVC_ERR_FORMAT, "expected ')'", NULL);
        b->p++;
        b->depth--;
        if (!ivec_push(seq, GE_MAKE(GE_REF, r)))
            return nomem(b);
    } else if (is_name_char(c)) {
        const char *s = b->p;
        while (b->p < b->end && is_name_char(*b->p))
            b->p++;
        int32_t r = rule_by_name(b, s, (size_t)(b->p - s));
        if (r < 0 || !ivec_push(seq, GE_MAKE(GE_REF, r)))
            return nomem(b);
    } else {
        char s[2] = { c, 0 };
        return fail(b, KVC_ERR_FORMAT, "unexpected character", s);
    }
    return KVC_OK;
}

/* Alternatives up to ')' or the next rule or the end, into rule `rule`. */
static int parse_alternatives(builder *b, int32_t rule)
{
    ivec seqs[64];
    size_t n_seqs = 0;
    ivec *all = seqs, *heap = NULL;
    size_t cap = KVC_ARRAY_LEN(seqs);
    memset(seqs, 0, sizeof(seqs));
    int rc = KVC_OK;
    for (;;) {
        ivec *seq = &all[n_seqs++];
        for (;;) {
            skip_space(b);
            if (b->p >= b->end || *b->p == '|' || *b->p == ')' || at_rule_start(b))
                break;
            size_t from = seq->n;
            if ((rc = parse_item(b, seq)) != KVC_OK)
                goto out;
            if (b->p < b->end && (*b->p == '*' || *b->p == '+' || *b->p == '?' || *b->p == '{'))
                if ((rc = quantify(b, seq, from)) != KVC_OK)
                    goto out;
        }
        if (b->p >= b->end || *b->p != '|')
            break;
        b->p++;
        if (n_seqs == cap) {
            ivec *grown = realloc(heap, 2 * cap * sizeof(*grown));
            if (!grown) {
                rc = nomem(b);
                goto out;
            }
            if (!heap)
                memcpy(grown, seqs, sizeof(seqs));
            memset(grown + cap, 0, cap * sizeof(*grown));
            all = heap = grown;
            cap *= 2;
        }
    }
    rc = set_alts(b, rule, all, n_seqs);
out:
    for (size_t i = 0; i < n_seqs; i++)
        free(all[i].v);
    free(heap);
    return rc != KVC_OK ? rc : b->status;
}

static int parse_rules(builder *b)
{
    for (;;) {
        skip_space(b);
        if (b->p >= b->end)
            return KVC_OK;
        if (!at_rule_start(b))
            return fail(b, KVC_ERR_FORMAT, "expected 'name ::='", NULL);
        const char *s = b->p;
        while (is_name_char(*b->p))
            b->p++;
        int32_t r = rule_by_name(b, s, (size_t)(b->p - s));
        if (r < 0)
            return b->status;
        if (b->defined[r])
            return fail(b, KVC_ERR_FORMAT, "rule defined twice", rule_name(b->g, r));
        b->defined[r] = true;
        b->cur = r;
        skip_space(b);
        b->p += 3;           /* "::=" */
        if (parse_alternatives(b, r) != KVC_OK)
            return b->status;
        if (b->p < b->end && *b->p == ')')
            return fail(b, KVC_ERR_FORMAT, "unbalanced ')'", NULL);
    }
}

/* ---------------------------------------------------------------- checks */

/* Fixpoints over the rules: nullable (derives ""), productive (derives some
 * finite string). */
static void fixpoint(const kvc_grammar *g, bool *set, bool chars_ok)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (set[r])
                continue;
            for (int32_t a = 0; a < g->rules[r].n_alts && !set[r]; a++) {
                const int32_t *e = g->elem + g->alts[g->rules[r].alt_first + a];
                bool ok = true;
                for (; GE_KIND(*e) != GE_END && ok; e++)
                    ok = GE_KIND(*e) == GE_CHARS ? chars_ok : set[GE_ARG(*e)];
                if (ok)
                    set[r] = changed = true;
            }
        }
    }
}

/* The "r can start with s" edges of rule r: for each reference s at the
 * left edge of an alternative (only nullable rules before it), fn(ctx, r, s,
 * tail), tail when s ends the alternative (no continuation is pushed). */
typedef void left_edge_fn(void *ctx, int32_t r, int32_t s, bool tail);

static void left_edges(const kvc_grammar *g, int32_t r, const bool *nullable, left_edge_fn *fn,
                       void *ctx)
{
    for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
        const int32_t *e = g->elem + g->alts[g->rules[r].alt_first + a];
        for (; GE_KIND(*e) == GE_REF; e++) {
            fn(ctx, r, GE_ARG(*e), GE_KIND(e[1]) == GE_END);
            if (!nullable[GE_ARG(*e)])
                break;
        }
    }
}

/* Tarjan's strongly connected components over the left edges. A cycle of
 * left edges that are all tail calls (r ::= x r | "" with x nullable, what
 * (a*)* and (a?)+ compile to) comes back to the same stack, which the
 * matcher's closure stops at; a cycle with a non-tail edge would grow the
 * stack forever: left recursion. */
typedef struct scc {
    builder *b;
    const bool *nullable;
    int32_t *index, *low, *stack, *comp;
    bool    *on;
    int32_t  n_stack, next, n_comp, depth;
    int32_t  bad;                /* a rule on a left-recursive cycle, -1 none */
} scc;

static void strong(scc *c, int32_t r);

static void scc_edge(void *ctx, int32_t r, int32_t s, bool tail)
{
    scc *c = ctx;
    (void)tail;
    if (c->index[s] < 0) {
        strong(c, s);
        c->low[r] = KVC_MIN(c->low[r], c->low[s]);
    } else if (c->on[s]) {
        c->low[r] = KVC_MIN(c->low[r], c->index[s]);
    }
}

static void strong(scc *c, int32_t r)
{
    if (++c->depth > 20000) {
        if (c->b->status == KVC_OK)
            fail(c->b, KVC_ERR_FORMAT, "grammar nested too deep", NULL);
        c->depth--;
        c->index[r] = c->low[r] = c->next++;
        c->comp[r] = c->n_comp++;
        return;
    }
    c->index[r] = c->low[r] = c->next++;
    c->stack[c->n_stack++] = r;
    c->on[r] = true;
    left_edges(c->b->g, r, c->nullable, scc_edge, c);
    if (c->low[r] == c->index[r]) {
        int32_t s;
        do {
            s = c->stack[--c->n_stack];
            c->on[s] = false;
            c->comp[s] = c->n_comp;
        } while (s != r);
        c->n_comp++;
    }
    c->depth--;
}

static void nontail_in_cycle(void *ctx, int32_t r, int32_t s, bool tail)
{
    scc *c = ctx;
    if (!tail && c->comp[r] == c->comp[s] && c->bad < 0)
        c->bad = r;
}

static int check_left_recursion(builder *b, const bool *nullable)
{
    size_t n = (size_t)b->g->n_rules + 1;
    scc c = { .b = b, .nullable = nullable, .bad = -1 };
    c.index = malloc(n * sizeof(int32_t));
    c.low = malloc(n * sizeof(int32_t));
    c.stack = malloc(n * sizeof(int32_t));
    c.comp = malloc(n * sizeof(int32_t));
    c.on = calloc(n, sizeof(bool));
    if (!c.index || !c.low || !c.stack || !c.comp || !c.on) {
        nomem(b);
    } else {
        for (size_t r = 0; r < n; r++)
            c.index[r] = -1;
        for (int32_t r = 0; r < b->g->n_rules && b->status == KVC_OK; r++)
            if (c.index[r] < 0)
                strong(&c, r);
        for (int32_t r = 0; r < b->g->n_rules && b->status == KVC_OK && c.bad < 0; r++)
            left_edges(b->g, r, nullable, nontail_in_cycle, &c);
        if (b->status == KVC_OK && c.bad >= 0)
            fail(b, KVC_ERR_FORMAT, "left recursion through rule", rule_name(b->g, c.bad));
    }
    free(c.index);
    free(c.low);
    free(c.stack);
    free(c.comp);
    free(c.on);
    return b->status;
}

/* Depth-first search over "r can start with s" edges, finding a reachable
 * rule that cannot finish (left recursion is check_left_recursion's).
 * state: 0 new, 1 on the path, 2 done. */
static int check_rule(builder *b, int32_t r, const bool *nullable, const bool *productive,
                      uint8_t *state, int depth)
{
    const kvc_grammar *g = b->g;
    if (state[r] != 0)
        return KVC_OK;
    if (!productive[r])
        return fail(b, KVC_ERR_FORMAT, "rule can never finish:", rule_name(g, r));
    if (depth > 20000)
        return fail(b, KVC_ERR_FORMAT, "grammar nested too deep", NULL);
    state[r] = 1;
    for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
        const int32_t *e = g->elem + g->alts[g->rules[r].alt_first + a];
        bool left = true;           /* still at the alternative's left edge */
        for (; GE_KIND(*e) != GE_END; e++) {
            if (GE_KIND(*e) == GE_CHARS) {
                left = false;
                continue;
            }
            int32_t s = GE_ARG(*e);
            if (left) {
                if (check_rule(b, s, nullable, productive, state, depth + 1) != KVC_OK)
                    return b->status;
                left = nullable[s];
            }
        }
    }
    state[r] = 2;
    return KVC_OK;
}

static int check_grammar(builder *b)
{
    kvc_grammar *g = b->g;
    for (int32_t r = 0; r < g->n_rules; r++)
        if (!b->defined[r]) {
            b->line = b->first_line[r];
            return fail(b, KVC_ERR_FORMAT, "undefined rule", rule_name(g, r));
        }
    size_t n = (size_t)g->n_rules;
    bool *nullable = calloc(n + 1, sizeof(bool));
    bool *productive = calloc(n + 1, sizeof(bool));
    uint8_t *state = calloc(n + 1, 1);
    if (!nullable || !productive || !state) {
        nomem(b);
    } else {
        fixpoint(g, nullable, false);
        fixpoint(g, productive, true);
        /* every rule is checked (not only the reachable ones): a rule that
         * cannot finish is a mistake wherever it is */
        for (int32_t r = 0; r < g->n_rules && b->status == KVC_OK; r++)
            check_rule(b, r, nullable, productive, state, 0);
        if (b->status == KVC_OK)
            check_left_recursion(b, nullable);
    }
    free(nullable);
    free(productive);
    free(state);
    return b->status;
}

/* The fewest characters each rule can match, then suffix[] (every rule is
 * productive by now, so the fixpoint ends with finite lengths). */
static int min_lengths(builder *b)
{
    kvc_grammar *g = b->g;
    enum { LARGE = 1 << 28 };
    int32_t *minlen = malloc(((size_t)g->n_rules + 1) * sizeof(*minlen));
    g->suffix = malloc(((size_t)g->n_elem + 1) * sizeof(*g->suffix));
    if (!minlen || !g->suffix) {
        free(minlen);
        return nomem(b);
    }
    for (int32_t r = 0; r < g->n_rules; r++)
        minlen[r] = LARGE;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++)
            for (int32_t a = 0; a < g->rules[r].n_alts; a++) {
                int64_t len = 0;
                for (const int32_t *e = g->elem + g->alts[g->rules[r].alt_first + a]; GE_KIND(*e) != GE_END; e++)
                    len += GE_KIND(*e) == GE_CHARS ? 1 : minlen[GE_ARG(*e)];
                if (len < minlen[r]) {
                    minlen[r] = (int32_t)len;
                    changed = true;
                }
            }
    }
    for (int32_t i = g->n_elem - 1; i >= 0; i--) {
        int32_t e = g->elem[i];
        g->suffix[i] = GE_KIND(e) == GE_END ? 0
                     : KVC_MIN(LARGE, g->suffix[i + 1] + (GE_KIND(e) == GE_CHARS ? 1 : minlen[GE_ARG(e)]));
    }
    free(minlen);
    return KVC_OK;
}

/* ---------------------------------------------------------------- entry points */

int kvc_grammar_parse(const char *text, size_t len, kvc_grammar **out, kvc_err *err)
{
    if (out)
        *out = NULL;
    if (!text || !out)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "grammar: NULL argument");
    builder b = { .p = text, .end = text + len, .line = 1, .cur = -1, .err = err };
    memset(b.ascii_class, 0xff, sizeof(b.ascii_class));
    b.g = calloc(1, sizeof(*b.g));
    if (!b.g)
        return kvc_fail(err, KVC_ERR_NOMEM, "grammar: out of memory");
    if (parse_rules(&b) == KVC_OK) {
        int32_t root = -1;
        for (int32_t r = 0; r < b.g->n_rules && root < 0; r++)
            if (strcmp(rule_name(b.g, r), "root") == 0)
                root = r;
        if (root < 0)
            fail(&b, KVC_ERR_FORMAT, "no rule", "root");
        b.g->root = root;
        if (b.status == KVC_OK && check_grammar(&b) == KVC_OK)
            min_lengths(&b);
    }
    free(b.defined);
    free(b.first_line);
    free(b.hash);
    if (b.status != KVC_OK) {
        kvc_grammar_free(b.g);
        return b.status;
    }
    *out = b.g;
    return KVC_OK;
}

void kvc_grammar_free(kvc_grammar *g)
{
    if (!g)
        return;
    free(g->elem);
    free(g->alts);
    free(g->rules);
    free(g->classes);
    free(g->ranges);
    free(g->names);
    free(g->suffix);
    free(g);
}

int32_t kvc_grammar_n_rules(const kvc_grammar *g)
{
    return g ? g->n_rules : 0;
}
