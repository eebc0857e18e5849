/* grammar_vocab.c - the trie over a vocabulary's token bytes that token masks
 * walk (see kvc_gvocab_new in grammar.h). */
#include "grammar_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct build {
    kvc_gvocab *v;
    int32_t    *order;        /* text token ids sorted by their bytes */
    size_t      cap_nodes;
    int32_t     n_toks;
} build;

static int cmp_piece(const void *a, const void *b, void *ctx)
{
    const kvc_gvocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->piece_off[x + 1] - v->piece_off[x], ly = v->piece_off[y + 1] - v->piece_off[y];
    int c = memcmp(v->pieces + v->piece_off[x], v->pieces + v->piece_off[y], KVC_MIN(lx, ly));
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static uint32_t piece_len(const kvc_gvocab *v, int32_t id)
{
    return v->piece_off[id + 1] - v->piece_off[id];
}

/* Fill node k from order[lo, hi): tokens sharing their first d bytes. Its
 * children are allocated as one block before any of them is filled, so they
 * stay consecutive. */
static bool fill_node(build *b, int32_t k, size_t lo, size_t hi, uint32_t d)
{
    kvc_gvocab *v = b->v;
    size_t i = lo;
    v->nodes[k].tok_first = b->n_toks;
    while (i < hi && piece_len(v, b->order[i]) == d)
        v->toks[b->n_toks++] = b->order[i++];
    v->nodes[k].n_toks = (uint16_t)(b->n_toks - v->nodes[k].tok_first);
    size_t groups = 0;
    for (size_t j = i; j < hi; j++)
        if (j == i || v->pieces[v->piece_off[b->order[j]] + d] != v->pieces[v->piece_off[b->order[j - 1]] + d])
            groups++;
    int32_t first = v->n_nodes;
    while ((size_t)v->n_nodes + groups > b->cap_nodes) {
        size_t cap = 2 * b->cap_nodes;
        gtrie_node *p = realloc(v->nodes, cap * sizeof(*p));
        if (!p)
            return false;
        v->nodes = p;
        b->cap_nodes = cap;
    }
    v->n_nodes += (int32_t)groups;
    v->nodes[k].first_child = first;
    v->nodes[k].n_children = (uint16_t)groups;
    int32_t c = first;
    for (size_t j = i; j < hi; c++) {
        uint8_t byte = (uint8_t)v->pieces[v->piece_off[b->order[j]] + d];
        size_t e = j;
        while (e < hi && (uint8_t)v->pieces[v->piece_off[b->order[e]] + d] == byte)
            e++;
        v->nodes[c] = (gtrie_node){ 0, 0, 0, 0, byte };
        if (!fill_node(b, c, j, e, d + 1))
            return false;
        j = e;
    }
    return true;
}

/* Each token's bytes and kind (text, end of generation, or never allowed). */
static int read_pieces(kvc_gvocab *v, const kvc_tokenizer *tok, kvc_err *err)
{
    size_t cap = 1 << 16, len = 0;
    v->pieces = malloc(cap);
    if (!v->pieces)
        return kvc_fail(err, KVC_ERR_NOMEM, "token trie: out of memory");
    for (int32_t id = 0; id < v->n_vocab; id++) {
        v->piece_off[id] = (uint32_t)len;
        int type = kvc_tokenizer_token_type(tok, id);
        if (kvc_tokenizer_is_eog(tok, id)) {
            v->kind[id] = GTOK_EOG;
            v->eog[v->n_eog++] = id;
            continue;
        }
        if ((type == KVC_TOKEN_CONTROL && !kvc_tokenizer_is_markup(tok, id)) ||
            type == KVC_TOKEN_UNKNOWN || type == KVC_TOKEN_UNUSED)
            continue;                          /* markup a reply keeps is text (harmony) */
        int n;
        while ((n = kvc_token_to_piece(tok, id, false, v->pieces + len, (int)(cap - len))) > (int)(cap - len)) {
            char *p = realloc(v->pieces, 2 * cap);
            if (!p)
                return kvc_fail(err, KVC_ERR_NOMEM, "token trie: out of memory");
            v->pieces = p;
            cap *= 2;
        }
        if (n < 0)
            return kvc_fail(err, n, "token trie: token %d has no text", id);
        len += (size_t)n;
        v->kind[id] = n > 0 ? GTOK_TEXT : GTOK_NONE;
    }
    v->piece_off[v->n_vocab] = (uint32_t)len;
    return KVC_OK;
}

int kvc_gvocab_new(const kvc_tokenizer *tok, kvc_gvocab **out, kvc_err *err)
{
    if (out)
        *out = NULL;
    if (!tok || !out)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "token trie: NULL argument");
    kvc_gvocab *v = calloc(1, sizeof(*v));
    if (!v)
        return kvc_fail(err, KVC_ERR_NOMEM, "token trie: out of memory");
    v->n_vocab = kvc_tokenizer_n_vocab(tok);
    size_t n = (size_t)v->n_vocab;
    v->kind = calloc(n, 1);
    v->piece_off = malloc((n + 1) * sizeof(*v->piece_off));
    v->eog = malloc(n * sizeof(*v->eog));
    v->toks = malloc(n * sizeof(*v->toks));
    build b = { .v = v, .order = malloc(n * sizeof(*b.order)), .cap_nodes = n + 16 };
    v->nodes = malloc(b.cap_nodes * sizeof(*v->nodes));
    int rc = KVC_OK;
    if (!v->kind || !v->piece_off || !v->eog || !v->toks || !b.order || !v->nodes)
        rc = kvc_fail(err, KVC_ERR_NOMEM, "token trie: out of memory");
    if (rc == KVC_OK)
        rc = read_pieces(v, tok, err);
    if (rc == KVC_OK) {
        size_t n_text = 0;
        for (int32_t id = 0; id < v->n_vocab; id++)
            if (v->kind[id] == GTOK_TEXT)
                b.order[n_text++] = id;
        qsort_r(b.order, n_text, sizeof(*b.order), cmp_piece, v);
        v->nodes[0] = (gtrie_node){ 0 };
        v->n_nodes = 1;
        if (!fill_node(&b, 0, 0, n_text, 0))
            rc = kvc_fail(err, KVC_ERR_NOMEM, "token trie: out of memory");
    }
    free(b.order);
    if (rc != KVC_OK) {
        kvc_gvocab_free(v);
        return rc;
    }
    *out = v;
    return KVC_OK;
}

void kvc_gvocab_free(kvc_gvocab *v)
{
    if (!v)
        return;
    free(v->nodes);
    free(v->toks);
    free(v->eog);
    free(v->kind);
    free(v->piece_off);
    free(v->pieces);
    free(v);
}

int32_t kvc_gvocab_n_vocab(const kvc_gvocab *v)
{
    return v ? v->n_vocab : 0;
}

int32_t kvc_gvocab_n_nodes(const kvc_gvocab *v)
{
    return v ? v->n_nodes : 0;
}
