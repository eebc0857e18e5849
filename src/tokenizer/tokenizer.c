/* tokenizer.c - the tokenize and detokenize entry points (see tokenizer.h),
 * the special-token partition, and the hash map and merge queue the parts
 * share. Loading is in tokenizer_load.c, the two algorithms in
 * tokenizer_spm.c and tokenizer_bpe.c, the BPE pre-tokenizers in
 * tokenizer_pre.c.
 *
 * Behaviour follows llama.cpp's (src/llama-vocab.cpp) where it is observable:
 * the special-token partition (longest token first, user-defined tokens
 * always), the space prefix of each SentencePiece text run, the bytes each
 * token decodes to. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

/* Longest text kvc_tokenize accepts: symbol indices are int32 and an escaped
 * SentencePiece text is up to 3x the input. */
#define TOK_MAX_TEXT ((size_t)1 << 28)

/* ================================================================ helpers */

int kvc_tok_map_init(tok_map *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    m->mask = (uint32_t)(cap - 1);
    m->hash = malloc(cap * sizeof(*m->hash));
    m->val = malloc(cap * sizeof(*m->val));
    if (!m->hash || !m->val)
        return KVC_ERR_NOMEM;
    memset(m->val, 0xFF, cap * sizeof(*m->val));   /* -1: empty */
    return KVC_OK;
}

void kvc_tok_map_free(tok_map *m)
{
    free(m->hash);
    free(m->val);
    m->hash = NULL;
    m->val = NULL;
}

int32_t kvc_tok_probe(const kvc_tokenizer *t, const char *s, size_t len, uint32_t *slot)
{
    uint32_t hf = tok_hash_fold(tok_hash(s, len, TOK_HASH_SEED));
    const tok_map *m = &t->vocab;
    for (uint32_t i = hf & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->val[i];
        if (id < 0 || (m->hash[i] == hf && t->text_len[id] == len &&
                       memcmp(t->text + t->text_off[id], s, len) == 0)) {
            if (slot)
                *slot = i;
            return id;
        }
    }
}

int32_t kvc_tok_lookup(const kvc_tokenizer *t, const char *s, size_t len)
{
    return kvc_tok_probe(t, s, len, NULL);
}

int kvc_tok_heap_push(tok_heap *h, tok_bigram b)
{
    if (!kvc_grow((void **)&h->a, &h->cap, h->n, sizeof(*h->a)))
        return KVC_ERR_NOMEM;
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        const tok_bigram *q = &h->a[p];
        if (q->key < b.key || (q->key == b.key && q->left <= b.left))
            break;
        h->a[i] = *q;
        i = p;
    }
    h->a[i] = b;
    return KVC_OK;
}

static bool bigram_before(const tok_bigram *x, const tok_bigram *y)
{
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}

tok_bigram kvc_tok_heap_pop(tok_heap *h)
{
    tok_bigram top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && bigram_before(&h->a[c + 1], &h->a[c]))
            c++;
        if (!bigram_before(&h->a[c], &last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0)
        h->a[i] = last;
    return top;
}

int kvc_tok_merge(tok_heap *heap, tok_sym *sym, int32_t count, tok_pair_fn pair, void *ctx)
{
    heap->n = 0;
    for (int32_t i = 1; i < count; i++)
        if (pair(ctx, i - 1, i) != KVC_OK)
            return KVC_ERR_NOMEM;
    while (heap->n > 0) {
        tok_bigram b = kvc_tok_heap_pop(heap);
        tok_sym *L = &sym[b.left], *R = &sym[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size)
            continue;            /* stale: one side has merged since */
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0)
            sym[R->next].prev = b.left;
        if (pair(ctx, L->prev, b.left) != KVC_OK || pair(ctx, b.left, L->next) != KVC_OK)
            return KVC_ERR_NOMEM;
    }
    return KVC_OK;
}

/* ================================================================ accessors */

int32_t kvc_tokenizer_n_vocab(const kvc_tokenizer *t) { return t->n_vocab; }
int32_t kvc_tokenizer_bos(const kvc_tokenizer *t) { return t->bos; }
int32_t kvc_tokenizer_eos(const kvc_tokenizer *t) { return t->eos; }
bool kvc_tokenizer_add_bos(const kvc_tokenizer *t) { return t->add_bos; }
bool kvc_tokenizer_add_eos(const kvc_tokenizer *t) { return t->add_eos; }

bool kvc_tokenizer_is_eog(const kvc_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_ATTR_EOG);
}

bool kvc_tokenizer_is_markup(const kvc_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_ATTR_MARKUP);
}

int kvc_tokenizer_token_type(const kvc_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->type[id] : KVC_TOKEN_UNDEFINED;
}

const char *kvc_tokenizer_token_text(const kvc_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->text + t->text_off[id] : NULL;
}

int32_t kvc_tokenizer_find(const kvc_tokenizer *t, const char *text)
{
    return text ? kvc_tok_lookup(t, text, strlen(text)) : -1;
}

/* ================================================================ tokenize */

/* A piece of the input: raw text [start, start + len) when id < 0, else a
 * special token. */
typedef struct frag {
    size_t  start, len;
    int32_t id;
} frag;

typedef struct frags {
    frag  *a;
    size_t n, cap;
} frags;

static int frags_push(frags *f, size_t start, size_t len, int32_t id)
{
    if (!kvc_grow((void **)&f->a, &f->cap, f->n, sizeof(*f->a)))
        return KVC_ERR_NOMEM;
    f->a[f->n++] = (frag){ start, len, id };
    return KVC_OK;
}

static bool c_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Text ranges where control and unknown tokens are not recognised (caller
 * data inside a rendered prompt); sorted, non-overlapping. */
typedef struct guard {
    const kvc_text_span *span;
    size_t               n;
} guard;

/* Does [pos, pos + n) overlap a guarded range? */
static bool guarded(const guard *g, size_t pos, size_t n)
{
    size_t lo = 0, hi = g->n;            /* the first range ending after pos */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->span[mid].off + g->span[mid].len <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g->n && g->span[lo].off < pos + n && g->span[lo].len > 0;
}

/* Split one raw fragment at every occurrence of special token id, appending
 * the pieces to out (llama.cpp's tokenizer_st_partition for one token). An
 * occurrence that overlaps g (control and unknown tokens only) is text. */
static int split_at_token(const kvc_tokenizer *t, int32_t id, const char *text,
                          const frag *in, const guard *g, frags *out)
{
    const char *tok = t->text + t->text_off[id];
    size_t tlen = t->text_len[id], base = in->start, blen = in->len, from = base;
    uint16_t a = t->attr[id];
    bool check = g && g->n && (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN));
    for (;;) {
        const char *m = memmem(text + from, base + blen - from, tok, tlen);
        if (!m)
            return blen ? frags_push(out, base, blen, -1) : KVC_OK;
        size_t mpos = (size_t)(m - text), left = mpos - base;
        if (check && guarded(g, mpos, tlen)) {
            from = mpos + 1;                 /* caller text: not a token; look further */
            continue;
        }
        if (a & TOK_ATTR_LSTRIP)
            while (left > 0 && c_space(text[base + left - 1]))
                left--;
        if (left > 0 && frags_push(out, base, left, -1) != KVC_OK)
            return KVC_ERR_NOMEM;
        if (frags_push(out, 0, 0, id) != KVC_OK)
            return KVC_ERR_NOMEM;
        size_t rstart = mpos + tlen, rlen = base + blen - rstart;
        if (a & TOK_ATTR_RSTRIP)
            while (rlen > 0 && c_space(text[rstart])) {
                rstart++;
                rlen--;
            }
        if (rlen == 0)
            return KVC_OK;
        base = from = rstart;
        blen = rlen;
    }
}

/* Cut the text into raw runs and special tokens: each special token in turn,
 * longest first, splits every raw run it occurs in. Control and unknown
 * tokens only when parse_special, and not inside g's ranges; user-defined
 * tokens always (llama.cpp). */
static int partition(const kvc_tokenizer *t, const char *text, size_t len,
                     bool parse_special, const guard *g, frags *cur)
{
    frags next = {0};
    int rc = len ? frags_push(cur, 0, len, -1) : KVC_OK;
    for (int32_t s = 0; s < t->n_special && rc == KVC_OK; s++) {
        int32_t id = t->special[s];
        if (!parse_special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)))
            continue;
        if (!memmem(text, len, t->text + t->text_off[id], t->text_len[id]))
            continue;            /* cheap test before rebuilding the list */
        next.n = 0;
        for (size_t i = 0; i < cur->n && rc == KVC_OK; i++)
            rc = cur->a[i].id >= 0 ? frags_push(&next, 0, 0, cur->a[i].id)
                                   : split_at_token(t, id, text, &cur->a[i], g, &next);
        frags tmp = *cur;
        *cur = next;
        next = tmp;
    }
    free(next.a);
    return rc;
}

/* The tokens of the partition's pieces: special tokens as they are, each
 * raw run encoded whole (SentencePiece: with the space prefix at the start
 * unless continuation, and after each special token). */
static int64_t tokenize_guarded(const kvc_tokenizer *t, const char *text, size_t len,
                                bool add_special, bool parse_special, bool continuation,
                                const guard *g, int32_t *out, int64_t cap)
{
    if (!t || (!text && len) || cap < 0 || (!out && cap > 0) || len > TOK_MAX_TEXT)
        return KVC_ERR_INVALID_ARG;
    tok_out o = { out, cap, 0 };
    frags fr = {0};
    int rc = partition(t, text, len, parse_special, g, &fr);
    if (add_special && t->add_bos && t->bos >= 0)
        tok_push(&o, t->bos);
    bool after_special = !continuation;   /* SPM: a run at the start or after a special token gets the prefix */
    for (size_t i = 0; i < fr.n && rc == KVC_OK; i++) {
        const frag *f = &fr.a[i];
        if (f->id >= 0) {
            tok_push(&o, f->id);
            after_special = true;
            continue;
        }
        if (t->model == TOK_SPM)
            rc = kvc_tok_spm_encode(t, text + f->start, f->len, t->add_space_prefix && after_special, &o);
        else
            rc = kvc_tok_bpe_encode(t, text + f->start, f->len, &o);
        after_special = false;
    }
    if (add_special && t->add_eos && t->eos >= 0)
        tok_push(&o, t->eos);
    free(fr.a);
    return rc != KVC_OK ? rc : o.n;
}

int64_t kvc_tokenize(const kvc_tokenizer *t, const char *text, size_t len,
                     bool add_special, bool parse_special,
                     int32_t *out, int64_t cap)
{
    return tokenize_guarded(t, text, len, add_special, parse_special, false, NULL, out, cap);
}

int64_t kvc_tokenize_ex(const kvc_tokenizer *t, const char *text, size_t len,
                        bool add_special, bool parse_special, bool continuation,
                        int32_t *out, int64_t cap)
{
    return tokenize_guarded(t, text, len, add_special, parse_special, continuation, NULL, out,
                            cap);
}

int64_t kvc_tokenize_data(const kvc_tokenizer *t, const char *text, size_t len,
                          bool add_special, const kvc_text_span *data, size_t n_data,
                          int32_t *out, int64_t cap)
{
    if (n_data && !data)
        return KVC_ERR_INVALID_ARG;
    guard g = { data, n_data };
    return tokenize_guarded(t, text, len, add_special, true, false, &g, out, cap);
}

/* ================================================================ detokenize */

/* The bytes token id stands for; "" for control/unknown unless render (or
 * markup a reply keeps). */
static const char *piece_of(const kvc_tokenizer *t, int32_t id, bool render, size_t *n)
{
    if (!render && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)) &&
        !(t->attr[id] & TOK_ATTR_MARKUP)) {
        *n = 0;
        return "";
    }
    *n = t->piece_len[id];
    return t->piece + t->piece_off[id];
}

int kvc_token_to_piece(const kvc_tokenizer *t, int32_t id, bool render_special, char *buf, int cap)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return KVC_ERR_INVALID_ARG;
    size_t n;
    const char *p = piece_of(t, id, render_special, &n);
    if (n > INT_MAX)
        return KVC_ERR_INVALID_ARG;
    if ((int)n <= cap && n > 0)
        memcpy(buf, p, n);
    return (int)n;
}

/* SentencePiece with add_space_prefix: tokenization put a space before the
 * first text run and before each run that follows a special token. */
static bool is_special_attr(uint16_t a)
{
    return (a & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) != 0;
}

/* Piece of id as the text stream shows it, updating *at_start (a text run
 * begins). */
static const char *stream_piece(const kvc_tokenizer *t, int32_t id, bool render,
                                bool *at_start, size_t *n)
{
    const char *p = piece_of(t, id, render, n);
    uint16_t a = t->attr[id];
    if (is_special_attr(a)) {
        if (a & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED))
            *at_start = true;
        return p;
    }
    if (*n == 0)
        return p;
    if (*at_start && t->model == TOK_SPM && t->add_space_prefix && p[0] == ' ') {
        p++;
        (*n)--;
    }
    *at_start = false;
    return p;
}

/* Release the whole characters of pending + p[0..n): writes them to out when
 * out is not NULL (invalid bytes as U+FFFD), stores an incomplete tail in
 * tail/ntail. Returns the bytes produced. */
static size_t utf8_release(const char *pending, int np, const char *p, size_t n,
                           char *out, char *tail, int *ntail)
{
    size_t w = 0, i = 0;
    *ntail = 0;
    if (np > 0) {                /* complete the held-back character first */
        char tmp[4];
        size_t take = KVC_MIN(n, (size_t)(4 - np));
        memcpy(tmp, pending, (size_t)np);
        memcpy(tmp + np, p, take);
        int r = kvc_utf8_decode(tmp, (size_t)np + take, NULL);
        if (r == 0) {            /* still incomplete: everything is held back */
            memcpy(tail, tmp, (size_t)np + take);
            *ntail = np + (int)take;
            return 0;
        }
        if (r > 0) {
            if (out)
                memcpy(out, tmp, (size_t)r);
            w = (size_t)r;
            i = (size_t)(r - np);
        } else {                 /* the held-back bytes lead nowhere */
            if (out)
                memcpy(out, KVC_UTF8_REPLACEMENT, 3);
            w = 3;
        }
    }
    while (i < n) {
        int r = kvc_utf8_decode(p + i, n - i, NULL);
        if (r == 0) {
            memcpy(tail, p + i, n - i);
            *ntail = (int)(n - i);
            break;
        }
        const char *src = r > 0 ? p + i : KVC_UTF8_REPLACEMENT;
        size_t len = r > 0 ? (size_t)r : 3;
        if (out)
            memcpy(out + w, src, len);
        w += len;
        i += r > 0 ? (size_t)r : 1;
    }
    return w;
}

void kvc_detok_init(kvc_detok *d, const kvc_tokenizer *t, bool render_special)
{
    memset(d, 0, sizeof(*d));
    d->tok = t;
    d->render_special = render_special;
    d->at_start = true;
}

int kvc_detok_feed(kvc_detok *d, int32_t id, char *out, int cap)
{
    const kvc_tokenizer *t = d->tok;
    if (!t || id < 0 || id >= t->n_vocab)
        return KVC_ERR_INVALID_ARG;
    bool at_start = d->at_start;
    size_t n;
    const char *p = stream_piece(t, id, d->render_special, &at_start, &n);
    char tail[8];
    int ntail;
    size_t need = utf8_release(d->pending, d->n_pending, p, n, NULL, tail, &ntail);
    if (need > INT_MAX)
        return KVC_ERR_INVALID_ARG;
    if (need > (size_t)(cap > 0 ? cap : 0))
        return (int)need;        /* too small: nothing consumed */
    utf8_release(d->pending, d->n_pending, p, n, out, tail, &ntail);
    memcpy(d->pending, tail, (size_t)ntail);
    d->n_pending = ntail;
    d->at_start = at_start;
    return (int)need;
}

int kvc_detok_flush(kvc_detok *d, char *out, int cap)
{
    if (d->n_pending == 0)
        return 0;
    if (cap < 3)
        return 3;
    memcpy(out, KVC_UTF8_REPLACEMENT, 3);
    d->n_pending = 0;
    return 3;
}

char *kvc_detokenize(const kvc_tokenizer *t, const int32_t *ids, int64_t n, bool render_special)
{
    size_t total = 0, len;
    bool at_start = true;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return NULL;
        stream_piece(t, ids[i], render_special, &at_start, &len);
        total += len;
    }
    char *s = malloc(total + 1);
    if (!s)
        return NULL;
    size_t w = 0;
    at_start = true;
    for (int64_t i = 0; i < n; i++) {
        const char *p = stream_piece(t, ids[i], render_special, &at_start, &len);
        memcpy(s + w, p, len);
        w += len;
    }
    s[w] = 0;
    return s;
}
