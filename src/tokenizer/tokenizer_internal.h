/* tokenizer_internal.h - what the tokenizer*.c files share. Not an interface
 * for other parts: use tokenizer.h.
 *
 *   tokenizer.c      special-token partition, dispatch, detokenizer, map, queue
 *   tokenizer_load.c reading the vocabulary from GGUF
 *   tokenizer_spm.c  SentencePiece-style merges by score, byte fallback
 *   tokenizer_bpe.c  merges table, byte-level BPE by rank
 *   tokenizer_pre.c  the pre-tokenizer regexes (PCRE2) and the text splitter */
#ifndef KVC_TOKENIZER_INTERNAL_H
#define KVC_TOKENIZER_INTERNAL_H

#include "tokenizer.h"

enum tok_model { TOK_SPM = 1, TOK_BPE = 2 };

/* Per-token attribute bits, derived from token_type as llama.cpp derives them
 * (a token whose text marks end of generation is forced to CONTROL). */
enum tok_attr {
    TOK_ATTR_UNDEFINED    = 1 << 0,
    TOK_ATTR_NORMAL       = 1 << 1,
    TOK_ATTR_UNKNOWN      = 1 << 2,
    TOK_ATTR_CONTROL      = 1 << 3,
    TOK_ATTR_USER_DEFINED = 1 << 4,
    TOK_ATTR_UNUSED       = 1 << 5,
    TOK_ATTR_BYTE         = 1 << 6,
    TOK_ATTR_LSTRIP       = 1 << 7,  /* eat whitespace left of the special token */
    TOK_ATTR_RSTRIP       = 1 << 8,  /* eat whitespace right of it */
    TOK_ATTR_EOG          = 1 << 9,  /* ends generation */
    TOK_ATTR_MARKUP       = 1 << 10, /* a control token a reply keeps as text (harmony) */
};

/* Open-addressing hash table from a string key to an int32 value. The keys
 * live elsewhere (token texts, merge strings); the table keeps the hash and the
 * value (an index into the key store), so a probe compares hashes first. */
typedef struct tok_map {
    uint32_t  mask;          /* capacity - 1, capacity a power of two */
    uint32_t *hash;          /* (capacity) key hash, for a quick reject */
    int32_t  *val;           /* (capacity) value; -1 marks an empty slot */
} tok_map;

typedef struct tok_pretok tok_pretok;   /* compiled regexes, tokenizer_pre.c */

struct kvc_tokenizer {
    int       model;             /* enum tok_model */
    int32_t   n_vocab;
    char     *text;              /* every token text, each NUL-terminated */
    uint32_t *text_off;          /* (n_vocab) offset in text */
    uint32_t *text_len;          /* (n_vocab) */
    char     *piece;             /* decoded bytes of every token (rendered as special) */
    uint32_t *piece_off;         /* (n_vocab) */
    uint32_t *piece_len;         /* (n_vocab) */
    float    *score;             /* (n_vocab) SPM merge priority */
    uint8_t  *type;              /* (n_vocab) enum kvc_token_type after overrides */
    uint16_t *attr;              /* (n_vocab) TOK_ATTR_* */
    tok_map   vocab;             /* token text -> id (a later duplicate wins) */
    int32_t   byte_tok[256];     /* token of one raw byte, -1 when none */
    int32_t  *special;           /* control/user-defined/unknown ids, longest text first */
    int32_t   n_special;
    int32_t   bos, eos, eot, eom, unk, pad;   /* -1 when none */
    bool      add_bos, add_eos, add_space_prefix;

    /* byte-level BPE only */
    char     *merge_text;        /* merges "left right", NUL-separated */
    uint32_t *merge_off;         /* (n_merges) offset of the left part */
    uint32_t *merge_llen;        /* (n_merges) length of the left part */
    uint32_t *merge_rlen;        /* (n_merges) length of the right part */
    int32_t   n_merges;
    tok_map   merges;            /* (left, right) -> rank; the first of duplicates wins */
    bool      ignore_merges;     /* a word that is a whole token is taken as is */
    tok_pretok *pre;
};

/* A caller's output array: ids beyond cap are counted, not written. */
typedef struct tok_out {
    int32_t *ids;
    int64_t  cap;
    int64_t  n;
} tok_out;

static inline void tok_push(tok_out *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

/* ------------------------------------------------------------ hashing */

/* FNV-1a, 64-bit, continued from h (start with TOK_HASH_SEED). */
#define TOK_HASH_SEED 0xcbf29ce484222325ull
static inline uint64_t tok_hash(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
static inline uint32_t tok_hash_fold(uint64_t h) { return (uint32_t)(h ^ (h >> 32)); }

/* Allocate an empty map for n keys (load <= 1/2). KVC_OK or KVC_ERR_NOMEM. */
int  kvc_tok_map_init(tok_map *m, size_t n);
void kvc_tok_map_free(tok_map *m);

/* Id of the token whose text is s[0..len), or -1. */
int32_t kvc_tok_lookup(const kvc_tokenizer *t, const char *s, size_t len);
/* The same, and *slot (may be NULL) receives the map slot where the text is,
 * or the empty slot where it would go (used while loading). */
int32_t kvc_tok_probe(const kvc_tokenizer *t, const char *s, size_t len, uint32_t *slot);

/* ------------------------------------------------------------ merge queue */

/* A candidate merge of two adjacent symbols; the queue pops the lowest key,
 * ties by the leftmost symbol (llama.cpp's order for both SPM and BPE). */
typedef struct tok_bigram {
    double  key;                 /* SPM: -score; BPE: rank (exact in a double) */
    int32_t left, right;         /* symbol indices */
    int32_t size;                /* bytes of the merged text, to detect stale entries */
} tok_bigram;

typedef struct tok_heap {
    tok_bigram *a;
    size_t      n, cap;
} tok_heap;

int  kvc_tok_heap_push(tok_heap *h, tok_bigram b);      /* KVC_OK or KVC_ERR_NOMEM */
tok_bigram kvc_tok_heap_pop(tok_heap *h);                /* h->n > 0 */

/* A text symbol: a run of bytes that merges grow to the right. */
typedef struct tok_sym {
    int32_t start;               /* byte offset in the working text */
    int32_t n;                   /* bytes; 0 once merged into its left neighbour */
    int32_t prev, next;          /* neighbours, -1 at the ends */
} tok_sym;

/* Offer the pair of symbols l and r (either may be -1: no pair) for merging:
 * push a tok_bigram onto the queue when the pair may merge (SPM: their text
 * is a token; BPE: they form a merge rule). KVC_OK or KVC_ERR_NOMEM. */
typedef int (*tok_pair_fn)(void *ctx, int32_t l, int32_t r);

/* Merge the linked symbols sym[0, count) pair by pair, in the queue's order:
 * each adjacent pair is offered to pair(ctx, l, r), which pushes onto heap
 * those that may merge; then the lowest is merged (its right symbol's n
 * becomes 0, the links skip it), stale entries skipped, and the new pairs
 * on both sides offered, until the queue is empty. heap is emptied first.
 * KVC_OK or KVC_ERR_NOMEM (sym then partly merged). */
int  kvc_tok_merge(tok_heap *heap, tok_sym *sym, int32_t count, tok_pair_fn pair, void *ctx);

/* ------------------------------------------------------------ the parts */

/* SentencePiece: tokenize one text run (no special tokens in it). prefix_space
 * prepends the U+2581 that add_space_prefix asks for. KVC_OK or KVC_ERR_NOMEM. */
int kvc_tok_spm_encode(const kvc_tokenizer *t, const char *text, size_t len,
                       bool prefix_space, tok_out *o);

/* Byte-level BPE: read tokenizer.ggml.merges and the pre-tokenizer. */
int  kvc_tok_bpe_load(kvc_tokenizer *t, const gguf_file *f, const char *pre, kvc_err *err);
void kvc_tok_bpe_free(kvc_tokenizer *t);
/* Tokenize one text run. KVC_OK, KVC_ERR_NOMEM, or KVC_ERR_FORMAT when a regex
 * fails to run (reported, not expected). */
int  kvc_tok_bpe_encode(const kvc_tokenizer *t, const char *text, size_t len, tok_out *o);

/* Pre-tokenizer by tokenizer.ggml.pre name (NULL = "default").
 * KVC_ERR_UNSUPPORTED naming an unknown name. Sets *ignore_merges and
 * *add_bos_default as llama.cpp does for that name. */
int  kvc_pretok_new(const char *name, tok_pretok **out, bool *ignore_merges,
                    bool *add_bos_default, kvc_err *err);
void kvc_pretok_free(tok_pretok *p);

/* Split text[0..len) into words: calls word(ctx, start, end) for each, in
 * order, the words covering the text. Invalid UTF-8 bytes are classified as
 * U+FFFD but kept as they are. Returns KVC_OK or the first negative status
 * (from word() or the regex engine). */
typedef int (*tok_word_fn)(void *ctx, size_t start, size_t end);
int kvc_pretok_split(const tok_pretok *p, const char *text, size_t len,
                     tok_word_fn word, void *ctx);

#endif
