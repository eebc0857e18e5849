/* tokenizer_bpe.c - byte-level BPE ("gpt2"): the merges table and the merge loop.
 *
 * A text run is split into words by the pre-tokenizer (tokenizer_pre.c). Each
 * word's bytes are mapped to GPT-2's printable code points, one symbol per
 * byte; then, as in llama.cpp, the adjacent pair with the lowest merge rank
 * (ties: leftmost) is merged until no pair is in tokenizer.ggml.merges. Each
 * final symbol is looked up in the vocabulary; a symbol that is not there
 * (only in an inconsistent vocabulary) falls back to one token per byte. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

/* ------------------------------------------------------------ merges table */

/* Rank of merging l[0..ln) with r[0..rn), or -1. */
static int32_t merge_rank(const kvc_tokenizer *t, const char *l, size_t ln,
                          const char *r, size_t rn)
{
    uint64_t h = tok_hash(l, ln, TOK_HASH_SEED);
    h = tok_hash(" ", 1, h);
    uint32_t hf = tok_hash_fold(tok_hash(r, rn, h));
    const tok_map *m = &t->merges;
    for (uint32_t i = hf & m->mask;; i = (i + 1) & m->mask) {
        int32_t v = m->val[i];
        if (v < 0)
            return -1;
        if (m->hash[i] != hf || t->merge_llen[v] != ln || t->merge_rlen[v] != rn)
            continue;
        const char *s = t->merge_text + t->merge_off[v];
        if (memcmp(s, l, ln) == 0 && memcmp(s + ln + 1, r, rn) == 0)
            return v;
    }
}

/* Insert merge i unless an equal pair is already there (the lower rank wins). */
static void merge_insert(kvc_tokenizer *t, int32_t i)
{
    const char *s = t->merge_text + t->merge_off[i];
    size_t ln = t->merge_llen[i], rn = t->merge_rlen[i];
    if (merge_rank(t, s, ln, s + ln + 1, rn) >= 0)
        return;
    uint32_t hf = tok_hash_fold(tok_hash(s, ln + 1 + rn, TOK_HASH_SEED));
    tok_map *m = &t->merges;
    uint32_t j = hf & m->mask;
    while (m->val[j] >= 0)
        j = (j + 1) & m->mask;
    m->hash[j] = hf;
    m->val[j] = i;
}

/* Copy the merge strings; "a b" splits at the first space after the first
 * byte (llama.cpp's rule); a string without one never matches. */
static int load_merges(kvc_tokenizer *t, const gguf_kv *kv, kvc_err *err)
{
    uint64_t n = kv->v.arr.n, total = 0;
    if (n > INT32_MAX)
        return kvc_fail(err, KVC_ERR_FORMAT, "tokenizer.ggml.merges: %llu entries", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        total += kv->v.arr.strs[i].len + 1;
    if (total >= UINT32_MAX)
        return kvc_fail(err, KVC_ERR_FORMAT, "tokenizer.ggml.merges: %llu bytes", (unsigned long long)total);
    t->n_merges = (int32_t)n;
    t->merge_text = malloc(total + 1);
    t->merge_off = malloc((n + 1) * sizeof(uint32_t));
    t->merge_llen = malloc((n + 1) * sizeof(uint32_t));
    t->merge_rlen = malloc((n + 1) * sizeof(uint32_t));
    if (!t->merge_text || !t->merge_off || !t->merge_llen || !t->merge_rlen ||
        kvc_tok_map_init(&t->merges, n) != KVC_OK)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory for %llu merges", (unsigned long long)n);
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        const gguf_str *s = &kv->v.arr.strs[i];
        const char *sp = s->len > 1 ? memchr(s->s + 1, ' ', s->len - 1) : NULL;
        memcpy(t->merge_text + off, s->s, s->len);
        t->merge_text[off + s->len] = 0;
        t->merge_off[i] = off;
        t->merge_llen[i] = sp ? (uint32_t)(sp - s->s) : 0;
        t->merge_rlen[i] = sp ? (uint32_t)(s->len - (uint64_t)(sp - s->s) - 1) : 0;
        off += (uint32_t)s->len + 1;
        if (sp)
            merge_insert(t, (int32_t)i);
    }
    return KVC_OK;
}

int kvc_tok_bpe_load(kvc_tokenizer *t, const gguf_file *f, const char *pre, kvc_err *err)
{
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!kv)
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "tokenizer.ggml.merges missing");
    if (kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type != GGUF_TYPE_STRING)
        return kvc_fail(err, KVC_ERR_FORMAT, "tokenizer.ggml.merges: not an array of strings");
    int rc = load_merges(t, kv, err);
    if (rc != KVC_OK)
        return rc;
    bool add_bos = false;
    rc = kvc_pretok_new(pre, &t->pre, &t->ignore_merges, &add_bos, err);
    if (rc == KVC_OK)
        t->add_bos = add_bos;
    return rc;
}

void kvc_tok_bpe_free(kvc_tokenizer *t)
{
    free(t->merge_text);
    free(t->merge_off);
    free(t->merge_llen);
    free(t->merge_rlen);
    kvc_tok_map_free(&t->merges);
    kvc_pretok_free(t->pre);
}

/* ------------------------------------------------------------ encoding */

typedef struct bpe_ctx {
    const kvc_tokenizer *t;
    const char *text;
    tok_out    *o;
    char       *buf;          /* the word in GPT-2 code points (UTF-8), <= 2 bytes per byte */
    size_t      buf_cap;
    tok_sym    *sym;          /* (word bytes) one symbol per original byte */
    size_t      sym_cap;
    tok_heap    heap;
} bpe_ctx;

static int reserve(bpe_ctx *c, size_t n)
{
    if (n * 2 > c->buf_cap) {
        char *b = realloc(c->buf, n * 2);
        if (!b)
            return KVC_ERR_NOMEM;
        c->buf = b;
        c->buf_cap = n * 2;
    }
    if (n > c->sym_cap) {
        tok_sym *s = realloc(c->sym, n * sizeof(*s));
        if (!s)
            return KVC_ERR_NOMEM;
        c->sym = s;
        c->sym_cap = n;
    }
    return KVC_OK;
}

/* Queue the merge of symbols l and r when the pair is a merge rule (tok_pair_fn). */
static int add_bigram(void *ctx, int32_t l, int32_t r)
{
    bpe_ctx *c = ctx;
    if (l < 0 || r < 0)
        return KVC_OK;
    const tok_sym *L = &c->sym[l], *R = &c->sym[r];
    int32_t rank = merge_rank(c->t, c->buf + L->start, (size_t)L->n, c->buf + R->start, (size_t)R->n);
    if (rank < 0)
        return KVC_OK;
    tok_bigram b = { .key = rank, .left = l, .right = r, .size = L->n + R->n };
    return kvc_tok_heap_push(&c->heap, b);
}

/* A symbol that is not a token: one token per byte, else the unknown token. */
static void emit_bytes(bpe_ctx *c, const tok_sym *s)
{
    const char *p = c->buf + s->start;
    for (int32_t i = 0; i < s->n;) {
        uint32_t cp = 0;
        int n = kvc_utf8_decode(p + i, (size_t)(s->n - i), &cp);
        int b = n > 0 ? kvc_gpt2_cpt_to_byte(cp) : -1;
        int32_t id = b >= 0 ? c->t->byte_tok[b] : -1;
        if (id < 0)
            id = c->t->unk;
        if (id >= 0)
            tok_push(c->o, id);
        i += n > 0 ? n : 1;
    }
}

static int bpe_word(void *ctx, size_t start, size_t end)
{
    bpe_ctx *c = ctx;
    size_t n = end - start;
    if (reserve(c, n) != KVC_OK)
        return KVC_ERR_NOMEM;
    int32_t len = 0;
    for (size_t i = 0; i < n; i++) {
        tok_sym *s = &c->sym[i];
        s->start = len;
        s->n = kvc_utf8_encode(kvc_gpt2_byte_to_cpt((uint8_t)c->text[start + i]), c->buf + len);
        s->prev = (int32_t)i - 1;
        s->next = i + 1 < n ? (int32_t)i + 1 : -1;
        len += s->n;
    }
    if (c->t->ignore_merges) {
        int32_t id = kvc_tok_lookup(c->t, c->buf, (size_t)len);
        if (id >= 0) {
            tok_push(c->o, id);
            return KVC_OK;
        }
    }
    if (kvc_tok_merge(&c->heap, c->sym, (int32_t)n, add_bigram, c) != KVC_OK)
        return KVC_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const tok_sym *s = &c->sym[i];
        if (s->n == 0)
            continue;
        int32_t id = kvc_tok_lookup(c->t, c->buf + s->start, (size_t)s->n);
        if (id >= 0)
            tok_push(c->o, id);
        else
            emit_bytes(c, s);
    }
    return KVC_OK;
}

int kvc_tok_bpe_encode(const kvc_tokenizer *t, const char *text, size_t len, tok_out *o)
{
    bpe_ctx c = { .t = t, .text = text, .o = o };
    int rc = kvc_pretok_split(t->pre, text, len, bpe_word, &c);
    free(c.buf);
    free(c.sym);
    free(c.heap.a);
    return rc;
}
