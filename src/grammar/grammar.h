/* grammar.h - constrained decoding: a grammar, an incremental matcher over
 * bytes, JSON schema -> grammar, and per-step token masks over a vocabulary.
 *
 * The pieces, in the order a request uses them:
 *
 *   1. kvc_schema_to_gbnf / kvc_grammar_from_schema: a JSON schema (the text of
 *      response_format.json_schema.schema, or a tool's "parameters") becomes a
 *      grammar. An unsupported feature is an error naming it (the server turns
 *      it into a 400). kvc_grammar_json_object() is response_format
 *      {"type":"json_object"}: any JSON object.
 *   2. kvc_grammar_parse: grammar text in our GBNF dialect (below). Used by the
 *      schema compiler and for composing, e.g. a tool call wrapped in tags:
 *          root ::= "<tool_call>\n" call "\n</tool_call>"
 *      followed by kvc_schema_to_gbnf(schema, "call", ...).
 *   3. kvc_gvocab_new: a trie over the token texts of a vocabulary, built once
 *      per model (immutable, shared by all threads).
 *   4. kvc_gmatch_new: the state of one generation (one choice of one
 *      request). Per step: kvc_gmatch_mask -> sampler (kvc_sampler_set_mask)
 *      -> kvc_gmatch_accept_token with the token sampled.
 *
 * Grammar text (a GBNF dialect, our own parser):
 *     rule-name ::= alternatives          # a comment
 *   alternatives:  seq | seq | ...        (an empty seq matches "")
 *   seq items:     "literal"  [a-z0-9_]  [^"\\]  .  rule-name  ( alternatives )
 *   quantifiers:   x*  x+  x?  x{m}  x{m,}  x{m,n}     (m, n <= 10000)
 *   escapes in literals and classes: \n \r \t \\ \" \] \[ \- \xHH \uHHHH
 *                  \UHHHHHHHH; text is UTF-8, matched by code point.
 *   A rule's body runs until the next "name ::=". Rule names: [A-Za-z0-9_-]+.
 *   The start rule is "root". Refused: undefined rules, left recursion, and a
 *   reachable rule that can never finish (every grammar we accept can always
 *   be completed from any state the matcher reaches, so a masked generation
 *   can always terminate).
 *
 * Matching is by bytes: a token may end inside a UTF-8 character; the matcher
 * keeps the partial character and allows only continuations that can still
 * complete a code point some rule accepts. Overlong forms, surrogates and
 * code points above U+10FFFF are never accepted.
 *
 * Threads: a kvc_grammar and a kvc_gvocab are immutable after creation and
 * may be shared; a kvc_gmatch is used by one thread at a time.
 *
 * Wiring (what the server and engine call, where):
 *   model load      kvc_gvocab_new(tokenizer) once; kept with the model.
 *   request parse   response_format json_schema -> kvc_grammar_from_schema(
 *                   json_schema.schema as text); json_object ->
 *                   kvc_grammar_json_object; an error is a 400 whose message is
 *                   err.msg (it names the keyword and its place). Forced tool
 *                   calls: per function f, kvc_schema_to_gbnf of {"type":
 *                   "object","properties":{"name":{"const":f},"arguments":
 *                   PARAMS},"required":["name","arguments"],
 *                   "additionalProperties":false} with opts.root "call-f" and
 *                   opts.prefix "f-", then the template's wrapping, e.g.
 *                       root ::= "<tool_call>\n" ( call-a | call-b ) "\n</tool_call>"
 *                   (parallel_tool_calls: several, joined by "\n"), and
 *                   kvc_grammar_parse of the whole text. Special tokens such as
 *                   Qwen's <tool_call> (user-defined) and harmony's markup
 *                   (kvc_tokenizer_is_markup) are in the trie by their text,
 *                   so the model may use them.
 *   admission       kvc_grammar_check_cost(g, vocab, ...) on the worker
 *                   thread: over a cost limit, a 400 with err.msg.
 *   per choice      kvc_gmatch_new(g, vocab); n > 1: kvc_gmatch_clone.
 *   per step        kvc_gmatch_mask(m, buf) -> kvc_sampler_set_mask(s, buf)
 *                   (sampler.h) -> kvc_sampler_sample -> kvc_gmatch_accept_token
 *                   (KVC_OK for a token the mask allowed, unless a cost limit
 *                   is hit); stop when kvc_gmatch_is_done (the EOG was taken:
 *                   finish_reason "stop"). A negative mask or accept ends the
 *                   request as an error (kvc_gmatch_error says why), never as
 *                   "stop". max_tokens may cut the JSON short ("length"), as
 *                   OpenAI does; when the tokens left are about
 *                   kvc_gmatch_min_remaining, kvc_gmatch_mask_closer steers to
 *                   the end.
 *   report          kvc_gmatch_get_stats: mask time per token for timings and
 *                   /metrics. */
#ifndef KVC_GRAMMAR_H
#define KVC_GRAMMAR_H

#include "common.h"
#include "tokenizer.h"

typedef struct kvc_grammar kvc_grammar;
typedef struct kvc_gvocab  kvc_gvocab;
typedef struct kvc_gmatch  kvc_gmatch;

/* ---------------------------------------------------------------- grammars */

/* Parse grammar text (len bytes, need not be NUL-terminated) into *out.
 * KVC_ERR_FORMAT with the line and what was wrong ("line 3: undefined rule
 * 'valu'"), KVC_ERR_NOMEM. *out is NULL on failure. Caller frees. */
int  kvc_grammar_parse(const char *text, size_t len, kvc_grammar **out, kvc_err *err);
void kvc_grammar_free(kvc_grammar *g);            /* NULL ok */
int32_t kvc_grammar_n_rules(const kvc_grammar *g);

/* Options of the schema compiler (zero-initialised = the defaults). */
typedef struct kvc_schema_opts {
    const char *root;        /* name of the rule the schema becomes; NULL = "root" */
    const char *prefix;      /* prefix of every helper rule's name (to compose
                              * several schemas in one grammar); NULL = "" */
    const char *at;          /* the schema to compile, as a local $ref into the
                              * document ("#/properties/x"), whose $refs still
                              * resolve against the whole document; NULL = "#" */
} kvc_schema_opts;

/* The node local reference `ref` ("#", "#/$defs/x", JSON-pointer escapes ~0
 * ~1, array indices) points to in the schema document `root`; borrowed from
 * root. NULL when ref is not local (#...) or does not resolve. The one
 * resolver of $ref: the schema compiler and the tool-call parsers use it. */
struct cJSON;
const struct cJSON *kvc_schema_resolve(const struct cJSON *root, const char *ref);

/* The grammar text for JSON schema `schema` (JSON text, len bytes), as rules
 * of the dialect above, in *out (malloc'd, NUL-terminated; caller frees).
 * KVC_ERR_INVALID_ARG with a message naming the unsupported keyword or bad
 * value and where it is ("unsupported schema keyword 'uniqueItems' at
 * #/properties/tags"), KVC_ERR_FORMAT when schema is not JSON, KVC_ERR_NOMEM.
 *
 * Supported: type (object array string number integer boolean null, and lists
 * of them), properties, required, additionalProperties (false, true, a
 * schema; absent = false, as llama.cpp), items, prefixItems, minItems,
 * maxItems, enum, const, anyOf, oneOf (as anyOf: exclusivity is not
 * enforced), allOf (of object schemas: properties and required merged),
 * $ref to "#", "#/$defs/..." and "#/definitions/..." (recursion allowed),
 * minLength, maxLength, pattern (a regex subset: literals, ., classes,
 * \d \w \s, groups, |, * + ? {m,n}, ^ and $ at the ends), format (date, time,
 * date-time, uuid, email, hostname, ipv4, ipv6, uri, duration; beside a
 * pattern, the pattern when it converts, else the format; lengths only where
 * every string of the format meets them), minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum for integers (within 10^15: a bound
 * beyond that is clamped when it only narrows, else refused), nullable
 * (OpenAPI). Annotations (title,
 * description, default, examples, $schema, $id, $comment, strict...) and
 * unknown keywords are ignored; the known validation keywords not listed
 * here (not, if, uniqueItems, multipleOf, patternProperties, minProperties,
 * ...) are errors.
 *
 * Output shape: properties in the schema's order, required ones always
 * present, optional ones may be left out; between tokens "" or " " or "\n"
 * and up to 20 spaces or tabs (as pretty-printed JSON needs); integers up to
 * 16 digits. Extra properties allowed by additionalProperties may repeat a
 * declared name (not prevented). */
int kvc_schema_to_gbnf(const char *schema, size_t len, const kvc_schema_opts *opts,
                       char **out, kvc_err *err);

/* kvc_schema_to_gbnf then kvc_grammar_parse, start rule "root". */
int kvc_grammar_from_schema(const char *schema, size_t len, kvc_grammar **out, kvc_err *err);

/* Any JSON object (response_format json_object). */
int kvc_grammar_json_object(kvc_grammar **out, kvc_err *err);

/* ---------------------------------------------------------------- vocabulary */

/* The token trie of a vocabulary. Each token stands for the bytes
 * kvc_token_to_piece gives without special rendering; control, unknown and
 * unused tokens and tokens with no bytes are never allowed by a mask, except
 * the end-of-generation tokens (kvc_tokenizer_is_eog), which are allowed
 * exactly when the grammar is complete. The tokenizer is only read during the
 * call. Memory: about 20 bytes per trie node (a 152k vocabulary: ~10 MB).
 * KVC_ERR_NOMEM; KVC_ERR_INVALID_ARG for a NULL tokenizer. Caller frees. */
int  kvc_gvocab_new(const kvc_tokenizer *tok, kvc_gvocab **out, kvc_err *err);
void kvc_gvocab_free(kvc_gvocab *v);              /* NULL ok */
int32_t kvc_gvocab_n_vocab(const kvc_gvocab *v);
int32_t kvc_gvocab_n_nodes(const kvc_gvocab *v);  /* trie nodes, root included */

/* ---------------------------------------------------------------- matching */

/* A matcher at the start of grammar g (borrowed: g and v must outlive it) for
 * vocabulary v (may be NULL when only bytes are fed), with the default
 * budget. NULL on OOM, or when the start itself is over the limits below. */
kvc_gmatch *kvc_gmatch_new(const kvc_grammar *g, const kvc_gvocab *v);

/* Cost limits. Every call (kvc_gmatch_mask, kvc_gmatch_accept_*, the start
 * in kvc_gmatch_new_budget) may spend at most `budget` units of work (a stack
 * moved past a character, an expansion step, a trie node tried: about 10-30
 * ns each), and a state holds at most 4096 stacks (ways to parse the text so
 * far). Past either the call fails with KVC_ERR_UNSUPPORTED, the state is
 * unchanged, and kvc_gmatch_error says which limit was hit: the grammar is
 * too ambiguous to serve, and the caller should end the request with that
 * error. The default bounds one mask to roughly 0.1-0.3 s on one core. */
#define KVC_GMATCH_BUDGET ((int64_t)8000000)

/* kvc_gmatch_new with budget units per call (<= 0: the default); on failure
 * NULL and err says why (KVC_ERR_UNSUPPORTED: over a limit, KVC_ERR_NOMEM,
 * KVC_ERR_INVALID_ARG without a grammar). */
kvc_gmatch *kvc_gmatch_new_budget(const kvc_grammar *g, const kvc_gvocab *v, int64_t budget,
                                  kvc_err *err);

/* Why the last failed call failed ("" when none has); owned by m. */
const char *kvc_gmatch_error(const kvc_gmatch *m);
void        kvc_gmatch_free(kvc_gmatch *m);       /* NULL ok */
/* An independent copy in the same state (for n > 1 choices sharing a
 * prefix); NULL on OOM. Costs a copy of the matcher's memory. */
kvc_gmatch *kvc_gmatch_clone(const kvc_gmatch *m);

/* Feed bytes. Returns KVC_OK, or KVC_ERR_INVALID_ARG when some byte is not
 * allowed (the state is then unchanged: all or nothing), KVC_ERR_NOMEM,
 * KVC_ERR_UNSUPPORTED over a cost limit (kvc_gmatch_error). */
int  kvc_gmatch_accept_bytes(kvc_gmatch *m, const void *bytes, size_t n);
/* The grammar can end here: the root rule is matched and no UTF-8
 * character is left open. */
bool kvc_gmatch_is_complete(const kvc_gmatch *m);
/* An end-of-generation token was accepted: nothing more is allowed. */
bool kvc_gmatch_is_done(const kvc_gmatch *m);
/* Complete, and no character may follow: only the end is allowed (a JSON
 * object closed; not `[a-z]*`, which may always go on). */
bool kvc_gmatch_is_closed(const kvc_gmatch *m);

/* The fewest characters that complete the grammar from here (0 when
 * complete). An engine can steer towards the end with it when a budget
 * runs out; tests use it to end random walks. */
int32_t kvc_gmatch_min_remaining(const kvc_gmatch *m);

/* Accept a sampled token: its bytes, or for an EOG token the end (only when
 * complete). KVC_ERR_INVALID_ARG when the token is not allowed here (state
 * unchanged), KVC_ERR_NOMEM, KVC_ERR_UNSUPPORTED over a cost limit. Each
 * accepted token is one step for rollback. */
int  kvc_gmatch_accept_token(kvc_gmatch *m, int32_t token);
/* Steps (tokens) accepted so far, and undo the last n of them (n <= steps;
 * speculative decoding, regeneration). O(1). */
int32_t kvc_gmatch_n_steps(const kvc_gmatch *m);
int  kvc_gmatch_rollback(kvc_gmatch *m, int32_t n);

/* The tokens allowed next, as a bitset over the vocabulary: bit (id & 31) of
 * mask[id >> 5] (kvc_mask_words(n_vocab) words, all written). Returns the
 * number of tokens allowed (0 only after an EOG was accepted), or a negative
 * status (KVC_ERR_INVALID_ARG without a vocabulary, KVC_ERR_NOMEM,
 * KVC_ERR_UNSUPPORTED over a cost limit: see kvc_gmatch_error). Cost: one
 * walk of the trie below the bytes the grammar allows, each (state, byte)
 * transition computed once per walk; the mask of a state seen in one of the
 * last 8 calls is a copy. See kvc_gmatch_stats. */
int32_t kvc_gmatch_mask(kvc_gmatch *m, uint32_t *mask);

/* The tokens of kvc_gmatch_mask that bring the end closer: after them
 * kvc_gmatch_min_remaining is smaller (or the EOG, when complete). To steer
 * a reply to a valid end when its token budget runs out. Same returns and
 * cost as one uncached kvc_gmatch_mask; 0 when no token is closer (an open
 * UTF-8 character, a string's characters: use the plain mask then). */
int32_t kvc_gmatch_mask_closer(kvc_gmatch *m, uint32_t *mask);
/* The tokens of kvc_gmatch_mask after which kvc_gmatch_min_remaining is at
 * most budget (and the EOG, when complete). A reply with budget + 1 tokens
 * left that only takes these can always still end valid (every byte is a
 * token): steering with it from a few dozen characters before the budget
 * runs out keeps a token that opens more than it closes (a recursive
 * schema's "[{") from making the end unreachable. Returns as
 * kvc_gmatch_mask_closer (0: none, when min_remaining is already over). */
int32_t kvc_gmatch_mask_within(kvc_gmatch *m, uint32_t *mask, int32_t budget);
/* The tokens of kvc_gmatch_mask_closer that leave the fewest characters to
 * the end: when the budget cannot cover the end one byte a token, the
 * longest strides towards it (a "</tool_call>" closed by a few long
 * tokens). Same returns. */
int32_t kvc_gmatch_mask_nearest(kvc_gmatch *m, uint32_t *mask);

static inline size_t kvc_mask_words(int32_t n_vocab) { return ((size_t)n_vocab + 31) / 32; }
static inline bool kvc_mask_test(const uint32_t *mask, int32_t id)
{
    return (mask[id >> 5] >> (id & 31)) & 1u;
}

/* Admission: whether grammar g can be served within the cost limits,
 * measured off the engine thread before a request is queued. Computes the
 * masks of the start and of up to n_steps steps after it, each step taking
 * the longest token allowed (the path that enters the grammar's nested parts
 * soonest), with budget units per call (<= 0: the default). KVC_OK;
 * KVC_ERR_UNSUPPORTED when a limit was hit (err says which: the request
 * should be refused with it), KVC_ERR_NOMEM, KVC_ERR_INVALID_ARG for a NULL
 * grammar or vocabulary. A grammar that passes may still meet a costly state
 * later (kvc_gmatch_mask then fails the same way). */
int kvc_grammar_check_cost(const kvc_grammar *g, const kvc_gvocab *v, int32_t n_steps,
                           int64_t budget, kvc_err *err);

/* What masks cost this matcher so far (to report per request or in metrics). */
typedef struct kvc_gmatch_stats {
    int64_t n_masks;         /* kvc_gmatch_mask calls */
    int64_t mask_us;         /* time spent in them */
    int64_t nodes_visited;   /* trie nodes whose byte was tried */
} kvc_gmatch_stats;
kvc_gmatch_stats kvc_gmatch_get_stats(const kvc_gmatch *m);

#endif
