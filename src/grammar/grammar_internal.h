/* grammar_internal.h - the compiled grammar, shared by the parser (grammar.c)
 * and the matcher (grammar_match.c, grammar_mask.c). Private to src/grammar/.
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an
 * alternative is a run of elements in elem[] ending with an END element.
 * Repetition and groups are compiled into helper rules, so only three element
 * kinds exist: END, CHARS (one code point out of a class) and REF (a rule). */
#ifndef KVC_GRAMMAR_INTERNAL_H
#define KVC_GRAMMAR_INTERNAL_H

#include "grammar.h"

enum { GE_END = 0, GE_CHARS = 1, GE_REF = 2 };

/* An element packed in an int32: kind in the low 2 bits, argument above. */
#define GE_MAKE(kind, arg) ((int32_t)(((uint32_t)(arg) << 2) | (uint32_t)(kind)))
#define GE_KIND(e)         ((int)((uint32_t)(e) & 3u))
#define GE_ARG(e)          ((int32_t)((uint32_t)(e) >> 2))

#define KVC_MAX_CP 0x10FFFFu

typedef struct gclass {
    uint32_t ascii[4];       /* code points 0-127, one bit each */
    int32_t  range_first;    /* into kvc_grammar.ranges: [lo, hi] pairs, sorted, */
    int32_t  n_ranges;       /* disjoint, covering every code point in the class */
} gclass;

typedef struct grule {
    int32_t alt_first;       /* into kvc_grammar.alts */
    int32_t n_alts;
    int32_t name;            /* offset into kvc_grammar.names */
} grule;

struct kvc_grammar {
    int32_t  *elem;          /* (n_elem) packed elements */
    int32_t   n_elem;
    int32_t  *alts;          /* (n_alts) start of each alternative in elem */
    int32_t   n_alts;
    grule    *rules;         /* (n_rules) */
    int32_t   n_rules;
    gclass   *classes;       /* (n_classes) */
    int32_t   n_classes;
    uint32_t *ranges;        /* (2 * n_ranges) lo, hi */
    int32_t   n_ranges;
    char     *names;         /* rule names, NUL-separated */
    int32_t   root;          /* the start rule */
    int32_t  *suffix;        /* (n_elem) fewest characters from an element to the
                              * end of its alternative (for kvc_gmatch_min_remaining) */
};

static inline bool gclass_has(const kvc_grammar *g, int32_t c, uint32_t cp)
{
    const gclass *k = &g->classes[c];
    if (cp < 128)
        return (k->ascii[cp >> 5] >> (cp & 31)) & 1u;
    const uint32_t *r = g->ranges + 2 * k->range_first;
    for (int32_t i = 0; i < k->n_ranges; i++)
        if (cp >= r[2 * i] && cp <= r[2 * i + 1])
            return true;
    return false;
}

/* Some code point in [lo, hi] is in the class. */
static inline bool gclass_meets(const kvc_grammar *g, int32_t c, uint32_t lo, uint32_t hi)
{
    const gclass *k = &g->classes[c];
    const uint32_t *r = g->ranges + 2 * k->range_first;
    for (int32_t i = 0; i < k->n_ranges; i++)
        if (r[2 * i] <= hi && lo <= r[2 * i + 1])
            return true;
    return false;
}

/* ---------------------------------------------------------------- vocabulary trie
 *
 * The children of a node are consecutive in nodes[] and sorted by byte, so a
 * walk reads them in order; node 0 is the root (the empty string). */
typedef struct gtrie_node {
    int32_t  first_child;    /* index of the first child in nodes[] */
    int32_t  tok_first;      /* tokens whose bytes end here: toks[tok_first, +n_toks) */
    uint16_t n_toks;
    uint16_t n_children;
    uint8_t  byte;           /* the byte on the edge from the parent */
} gtrie_node;

enum { GTOK_NONE = 0, GTOK_TEXT = 1, GTOK_EOG = 2 };

struct kvc_gvocab {
    int32_t     n_vocab;
    gtrie_node *nodes;       /* (n_nodes) */
    int32_t     n_nodes;
    int32_t    *toks;        /* token ids grouped by trie node */
    int32_t    *eog;         /* (n_eog) end-of-generation ids */
    int32_t     n_eog;
    uint8_t    *kind;        /* (n_vocab) GTOK_* */
    uint32_t   *piece_off;   /* (n_vocab + 1) token id -> its bytes in pieces */
    char       *pieces;
};

/* ---------------------------------------------------------------- text building
 * (grammar_text.c)
 *
 * A growable string for the schema compiler's output. A failed allocation
 * sets oom and later appends do nothing, so callers check once at the end. */
typedef struct gsbuf {
    char  *s;                /* NUL-terminated when not oom */
    size_t n, cap;
    bool   oom;
} gsbuf;

void gsb_put(gsbuf *b, const char *s, size_t n);
void gsb_puts(gsbuf *b, const char *s);
void gsb_printf(gsbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A GBNF literal "..." for bytes s[0, n) (UTF-8), escaped. */
void gsb_literal(gsbuf *b, const char *s, size_t n);
/* A GBNF expression for every integer in [a, bmax], 0 <= a <= bmax, written
 * without leading zeros (one digit rule per length). */
void gsb_uint_range(gsbuf *b, long long a, long long bmax);

/* The characters a JSON string may hold unescaped: the class of the string
 * rule, which a pattern's classes are limited to. */
#define GRAM_JSON_CHAR_EXCL "\"\\\\\\x00-\\x1f"

/* A regex (the subset kvc_schema_to_gbnf documents) as a GBNF expression
 * for the content between a JSON string's quotes: strings the regex matches
 * (a subset of them: characters that JSON must escape are left out, except
 * literal ones, written escaped). Unanchored ends match anything there.
 * KVC_OK, or KVC_ERR_INVALID_ARG with err naming what is not supported. */
int gram_pattern_to_gbnf(const char *re, gsbuf *expr, kvc_err *err);

#endif
