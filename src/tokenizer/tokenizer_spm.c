/* tokenizer_spm.c - SentencePiece-style tokenization ("llama"), as llama.cpp does it.
 *
 * Spaces become U+2581 ("▁"), one is prepended when add_space_prefix asks for
 * it, and the text is split into UTF-8 characters (an invalid byte is a
 * character of its own). Adjacent symbols whose concatenation is a vocabulary
 * token are merged, the one with the highest score first (ties: leftmost),
 * until no pair forms a token. A final symbol that is not a token (a character
 * outside the vocabulary) becomes its bytes as <0xXX> tokens, or when the
 * vocabulary has no such byte token, the unknown token. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

#define SPM_SPACE     "\xE2\x96\x81"   /* U+2581 */
#define SPM_SPACE_LEN 3

typedef struct spm_ctx {
    const kvc_tokenizer *t;
    const char *buf;          /* escaped text */
    tok_sym    *sym;
    tok_heap    heap;
} spm_ctx;

/* Queue the merge of symbols l and r when their text is a token (tok_pair_fn). */
static int try_bigram(void *ctx, int32_t l, int32_t r)
{
    spm_ctx *c = ctx;
    if (l < 0 || r < 0)
        return KVC_OK;
    const tok_sym *L = &c->sym[l], *R = &c->sym[r];
    int32_t size = L->n + R->n;
    int32_t id = kvc_tok_lookup(c->t, c->buf + L->start, (size_t)size);
    if (id < 0)
        return KVC_OK;
    tok_bigram b = { .key = -(double)c->t->score[id], .left = l, .right = r, .size = size };
    return kvc_tok_heap_push(&c->heap, b);
}

/* Byte fallback for a symbol that is not a token: all its bytes as byte
 * tokens, or one unknown token when a byte has none (nothing if no unk). */
static void emit_fallback(const kvc_tokenizer *t, const char *p, int32_t n, tok_out *o)
{
    for (int32_t i = 0; i < n; i++) {
        if (t->byte_tok[(uint8_t)p[i]] < 0) {
            if (t->unk >= 0)
                tok_push(o, t->unk);
            return;
        }
    }
    for (int32_t i = 0; i < n; i++)
        tok_push(o, t->byte_tok[(uint8_t)p[i]]);
}

/* The escaped text: every ' ' as U+2581, with one in front if asked. */
static char *escape(const char *text, size_t len, bool prefix_space, size_t *out_len)
{
    char *buf = malloc(len * SPM_SPACE_LEN + SPM_SPACE_LEN + 1);
    if (!buf)
        return NULL;
    size_t n = 0;
    if (prefix_space) {
        memcpy(buf, SPM_SPACE, SPM_SPACE_LEN);
        n = SPM_SPACE_LEN;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + n, SPM_SPACE, SPM_SPACE_LEN);
            n += SPM_SPACE_LEN;
        } else {
            buf[n++] = text[i];
        }
    }
    *out_len = n;
    return buf;
}

int kvc_tok_spm_encode(const kvc_tokenizer *t, const char *text, size_t len,
                       bool prefix_space, tok_out *o)
{
    size_t n = 0;
    char *buf = escape(text, len, prefix_space, &n);
    tok_sym *sym = malloc((n ? n : 1) * sizeof(*sym));
    spm_ctx c = { .t = t, .buf = buf, .sym = sym };
    int rc = buf && sym ? KVC_OK : KVC_ERR_NOMEM;
    int32_t count = 0;
    for (size_t i = 0; rc == KVC_OK && i < n; count++) {
        int u = kvc_utf8_unit(buf + i, n - i);
        sym[count] = (tok_sym){ .start = (int32_t)i, .n = u, .prev = count - 1, .next = count + 1 };
        i += (size_t)u;
    }
    if (count > 0)
        sym[count - 1].next = -1;
    if (rc == KVC_OK)
        rc = kvc_tok_merge(&c.heap, c.sym, count, try_bigram, &c);
    for (int32_t i = 0; rc == KVC_OK && i < count; i++) {
        if (sym[i].n == 0)
            continue;
        int32_t id = kvc_tok_lookup(t, buf + sym[i].start, (size_t)sym[i].n);
        if (id >= 0)
            tok_push(o, id);
        else
            emit_fallback(t, buf + sym[i].start, sym[i].n, o);
    }
    free(c.heap.a);
    free(sym);
    free(buf);
    return rc;
}
