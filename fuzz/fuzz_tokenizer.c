/* fuzz_tokenizer.c - libFuzzer target for the tokenizer's text input.
 *
 * Vocabulary: the GGUF named by KVC_FUZZ_VOCAB, loaded once; without it, two
 * small vocabularies built in memory (SentencePiece with byte tokens, byte-level
 * BPE with all 256 byte symbols). The input is tokenized with and without
 * special-token parsing, detokenized whole and streamed.
 *
 * Properties checked (abort on violation):
 *   - token counts are consistent (a retry with the exact size gives the same ids);
 *   - with the in-memory vocabularies, detokenize(tokenize(x)) == x, both with
 *     parse_special off, and on with specials rendered (unless an unknown
 *     token is among the ids: it does not say what it replaced; or the text
 *     has a U+2581, which SentencePiece cannot tell from a space);
 *   - the streaming detokenizer emits valid UTF-8, and when x is valid UTF-8
 *     and round-trips, exactly x. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"
#include "unicode.h"

static kvc_tokenizer *vocabs[2];
static int n_vocabs;
static int exact;                /* vocabularies are the in-memory ones */

/* ---------------------------------------------------------------- vocabularies */

static kvc_tokenizer *from_writer(gguf_writer *w)
{
    void *buf = NULL;
    size_t size = 0;
    gguf_file *f = NULL;
    kvc_tokenizer *t = NULL;
    if (gguf_writer_to_memory(w, &buf, &size, NULL) == KVC_OK &&
        gguf_open_memory(buf, size, &f, NULL) == KVC_OK)
        kvc_tokenizer_load(f, &t, NULL);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
    return t;
}

static const char *const extra[] = {
    "\xE2\x96\x81", "\xE2\x96\x81the", "the", "th", "he", "e", "t", "h", "\xE2\x96\x81t",
    "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<tag>", "<|im",
};
static const int extra_type[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 2, 3, 3, 4, 1 };

static kvc_tokenizer *make_spm(void)
{
    enum { NB = 256, NE = sizeof(extra) / sizeof(extra[0]) };
    static char bytes[NB][8];
    const char *toks[NB + NE];
    float scores[NB + NE];
    int32_t types[NB + NE];
    for (int i = 0; i < NE; i++) {
        toks[i] = extra[i];
        types[i] = extra_type[i];
        scores[i] = -(float)(i % 5);
    }
    for (int b = 0; b < NB; b++) {
        snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
        toks[NE + b] = bytes[b];
        types[NE + b] = 6;
        scores[NE + b] = 0;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NB + NE);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, NB + NE);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, NB + NE);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 9);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 10);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 11);
    return from_writer(w);
}

static kvc_tokenizer *make_bpe(void)
{
    static char bytes[256][4];
    static const char *const merges[] = { "t h", "th e", "\xC4\xA0 t", "\xC4\xA0t he", "i n", "\xC4\xA0 \xC4\xA0" };
    static const char *const more[] = { "th", "the", "\xC4\xA0t", "\xC4\xA0the", "in", "\xC4\xA0\xC4\xA0",
                                        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tag>" };
    enum { NM = sizeof(more) / sizeof(more[0]) };
    const char *toks[256 + NM];
    int32_t types[256 + NM];
    for (int b = 0; b < 256; b++) {
        int n = kvc_utf8_encode(kvc_gpt2_byte_to_cpt((uint8_t)b), bytes[b]);
        bytes[b][n] = 0;
        toks[b] = bytes[b];
        types[b] = 1;
    }
    for (int i = 0; i < NM; i++) {
        toks[256 + i] = more[i];
        types[256 + i] = more[i][0] != '<' ? 1 : strcmp(more[i], "<tag>") == 0 ? 4 : 3;
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 256 + NM);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 256 + NM);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, sizeof(merges) / sizeof(merges[0]));
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 256 + 6);
    return from_writer(w);
}

static void init(void)
{
    const char *path = getenv("KVC_FUZZ_VOCAB");
    if (path) {
        gguf_file *f = NULL;
        kvc_err err = {0};
        if (gguf_open(path, &f, &err) != KVC_OK || kvc_tokenizer_load(f, &vocabs[0], &err) != KVC_OK) {
            fprintf(stderr, "KVC_FUZZ_VOCAB=%s: %s\n", path, err.msg);
            abort();
        }
        gguf_close(f);
        n_vocabs = 1;
        return;
    }
    vocabs[0] = make_spm();
    vocabs[1] = make_bpe();
    if (!vocabs[0] || !vocabs[1])
        abort();
    n_vocabs = 2;
    exact = 1;
}

/* ---------------------------------------------------------------- checks */

static int32_t *tokenize_all(const kvc_tokenizer *t, const char *s, size_t n, bool add,
                             bool parse, int64_t *count)
{
    int32_t small[4];
    int64_t need = kvc_tokenize(t, s, n, add, parse, small, 4);
    if (need < 0)
        abort();
    int32_t *ids = malloc((size_t)(need ? need : 1) * sizeof(*ids));
    if (kvc_tokenize(t, s, n, add, parse, ids, need) != need)
        abort();
    if (need > 0 && memcmp(ids, small, (size_t)(need < 4 ? need : 4) * sizeof(*ids)) != 0)
        abort();
    *count = need;
    return ids;
}

/* Stream ids through kvc_detok; returns the text (malloc'd), *len its length. */
static char *stream(const kvc_tokenizer *t, const int32_t *ids, int64_t n, bool render, size_t *len)
{
    kvc_detok d;
    kvc_detok_init(&d, t, render);
    size_t cap = 64, w = 0;
    char *out = malloc(cap);
    for (int64_t i = 0; i <= n; i++) {
        char tmp[256];
        int r = i < n ? kvc_detok_feed(&d, ids[i], tmp, sizeof(tmp)) : kvc_detok_flush(&d, tmp, sizeof(tmp));
        if (r < 0)
            abort();
        char *big = NULL;
        if (r > (int)sizeof(tmp)) {            /* a long piece: retry with room */
            big = malloc((size_t)r);
            if (kvc_detok_feed(&d, ids[i], big, r) != r)
                abort();
        }
        if (w + (size_t)r > cap) {
            cap = (w + (size_t)r) * 2;
            out = realloc(out, cap);
        }
        memcpy(out + w, big ? big : tmp, (size_t)r);
        w += (size_t)r;
        free(big);
    }
    *len = w;
    return out;
}

static void check_roundtrip(const kvc_tokenizer *t, bool spm, const char *s, size_t n, bool parse)
{
    int64_t count;
    int32_t *ids = tokenize_all(t, s, n, true, parse, &count);    /* BOS/EOS paths */
    if (kvc_tokenize_ex(t, s, n, false, parse, true, ids, count) < 0)
        abort();                                                  /* continuation path */
    free(ids);
    ids = tokenize_all(t, s, n, false, parse, &count);
    char *back = kvc_detokenize(t, ids, count, parse);
    if (!back)
        abort();
    size_t slen;
    char *streamed = stream(t, ids, count, parse, &slen);
    if (!kvc_utf8_valid(streamed, slen))
        abort();
    bool same = strlen(back) == n && memcmp(back, s, n) == 0;
    bool lossy = memchr(s, 0, n) != NULL;   /* kvc_detokenize's string ends at a NUL */
    for (int64_t i = 0; i < count; i++)     /* an unknown token drops what it stood for */
        lossy |= kvc_tokenizer_token_type(t, ids[i]) == KVC_TOKEN_UNKNOWN;
    if (spm)                                /* SentencePiece reads U+2581 as a space */
        lossy |= memmem(s, n, "\xE2\x96\x81", 3) != NULL;
    if (exact && !lossy) {
        if (!same)
            abort();
        if (kvc_utf8_valid(s, n) && (slen != n || memcmp(streamed, s, n) != 0))
            abort();
    }
    free(streamed);
    free(back);
    free(ids);
}

/* kvc_tokenize_data: no ranges is kvc_tokenize with control tokens parsed;
 * one range over the whole text is kvc_tokenize without; a range over the
 * middle third never gives more control tokens than the first and, with the
 * in-memory vocabularies, detokenizes (specials rendered) back to the text. */
static void check_guarded(const kvc_tokenizer *t, const char *s, size_t n)
{
    int64_t na, nb, nc, nd;
    int32_t *a = tokenize_all(t, s, n, true, true, &na), *b = tokenize_all(t, s, n, true, false, &nb);
    kvc_text_span all = { 0, n }, mid = { n / 3, n / 3 };
    nc = kvc_tokenize_data(t, s, n, true, NULL, 0, NULL, 0);
    nd = kvc_tokenize_data(t, s, n, true, &all, 1, NULL, 0);
    int32_t *c = malloc((size_t)(nc > 0 ? nc : 1) * sizeof(*c));
    int32_t *d = malloc((size_t)(nd > 0 ? nd : 1) * sizeof(*d));
    if (nc != na || nd != nb || kvc_tokenize_data(t, s, n, true, NULL, 0, c, nc) != nc ||
        kvc_tokenize_data(t, s, n, true, &all, 1, d, nd) != nd ||
        memcmp(a, c, (size_t)na * sizeof(*a)) || memcmp(b, d, (size_t)nb * sizeof(*b)))
        abort();
    free(c);
    free(d);
    int64_t nm = kvc_tokenize_data(t, s, n, false, &mid, 1, NULL, 0);
    int32_t *m = malloc((size_t)(nm > 0 ? nm : 1) * sizeof(*m));
    if (nm < 0 || kvc_tokenize_data(t, s, n, false, &mid, 1, m, nm) != nm)
        abort();
    int64_t ctl_a = 0, ctl_m = 0;
    bool lossy = memchr(s, 0, n) != NULL || memmem(s, n, "\xE2\x96\x81", 3) != NULL;
    for (int64_t i = 0; i < na; i++)
        ctl_a += kvc_tokenizer_token_type(t, a[i]) == KVC_TOKEN_CONTROL;
    for (int64_t i = 0; i < nm; i++) {
        ctl_m += kvc_tokenizer_token_type(t, m[i]) == KVC_TOKEN_CONTROL;
        lossy |= kvc_tokenizer_token_type(t, m[i]) == KVC_TOKEN_UNKNOWN;
    }
    if (ctl_m > ctl_a)
        abort();
    char *back = kvc_detokenize(t, m, nm, true);
    if (!back || (exact && !lossy && (strlen(back) != n || memcmp(back, s, n) != 0)))
        abort();
    free(back);
    free(m);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!n_vocabs)
        init();
    for (int v = 0; v < n_vocabs; v++) {
        check_roundtrip(vocabs[v], v == 0, (const char *)data, size, false);
        check_roundtrip(vocabs[v], v == 0, (const char *)data, size, true);
        check_guarded(vocabs[v], (const char *)data, size);
    }
    return 0;
}
