/* model_gen_vocab.c - the built-in tokenizer vocabularies of generated models.
 *
 * Both vocabularies come from one BPE training run over the English text below:
 * the text is split as GPT-2's pre-tokenizer would (a word keeps its leading
 * space; letters, punctuation and whitespace runs apart; digits are left out so
 * that pre-tokenizers that split numbers differently all agree), and the most
 * frequent adjacent pair is merged until no pair occurs twice or the merge
 * budget is spent. Ties go to the lowest symbol ids, so the result is fixed.
 *
 *   "bpe": byte-level BPE, tokenizer.ggml.model "gpt2". Ids 0-255 are the 256
 *          byte tokens in GPT-2's order (bytes_to_unicode), then one token per
 *          learned merge, then <|endoftext|> <|im_start|> <|im_end|> (control).
 *          BOS <|endoftext|> (not added), EOS and EOT <|im_end|>.
 *   "spm": SentencePiece-style, tokenizer.ggml.model "llama". <unk> <s> </s>,
 *          the 256 byte tokens <0x00>..<0xFF>, the learned pieces (space as
 *          U+2581, score -rank), the printable ASCII characters, then
 *          <|im_start|> <|im_end|> (control). BOS <s> (added), EOS </s>,
 *          EOT <|im_end|>.
 * Any text tokenizes: bpe is byte-level, spm falls back to byte tokens.
 * Tokens past the natural size are "<|filler_N|>" of type UNUSED: no merge
 * produces them and special-token parsing ignores them, so they never come
 * out of tokenizing text. */
#include "model_gen.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GEN_MAX_MERGES 2000

static bool vocab_is(const char *vocab, const char *name);

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_UNUSED = 5, TT_BYTE = 6 };

/* ------------------------------------------------------------------ corpus */

static const char corpus[] =
    "Once upon a time, in a small town by the sea, there lived a girl who loved to ask questions. "
    "Every morning she walked to the harbor with her little brown dog and watched the boats come in. "
    "The fishermen were kind to her. They told her stories about the weather, the wind and the water, "
    "and about the strange things they had seen far away from the shore.\n\n"
    "One day she found an old machine in her grandfather's house. It could talk! "
    "\"Hello,\" said the machine. \"I am a helpful assistant. What would you like to know?\" "
    "The girl was surprised, but she was not afraid. \"How do you know so many things?\" she asked. "
    "\"I have read a lot of books,\" the assistant answered, \"and I remember what people tell me. "
    "When you talk with me, I keep our whole conversation in my memory, "
    "so I never have to read it again.\"\n\n"
    "They became good friends. She asked about the stars and the moon, about animals and plants, "
    "about numbers and words. The assistant always tried to give a clear and honest answer, and when it "
    "did not know something, it said so. \"It's better to say that you don't know,\" it told her, "
    "\"than to make up an answer that sounds right but isn't.\"\n\n"
    "The user asks a question, and the assistant writes a reply. The system sets the rules for the "
    "conversation: who the assistant is, what it should do and what it should not do. "
    "A good assistant is helpful, honest and harmless. It thinks about the question before it answers, "
    "and it explains its reasoning step by step when the problem is hard. "
    "Can you help me write a short story about a cat and a mouse? Of course! Here is a story for you. "
    "Please tell me more about the history of this town. Thank you very much for your help. "
    "You're welcome. Let me know if there is anything else I can do for you.\n\n"
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. "
    "Yesterday it was raining all day, so we stayed inside and read books by the fire. "
    "Tomorrow the weather will be sunny and warm, and the children will play in the park. "
    "They will run, jump and laugh, and when the sun goes down they will come home tired and happy. "
    "Their mother will make a warm dinner, and their father will tell them a story before they sleep.\n\n"
    "A computer is a machine that follows instructions. A program is a list of those instructions, "
    "written in a language that people and computers can both read. The model reads the text as tokens, "
    "computes the next token, and repeats this until the answer is complete. Keeping the cache of what "
    "it has already computed makes the next turn of the conversation much faster, because only the new "
    "tokens need to be processed. This is the idea behind the engine: remember everything, and compute "
    "only what is new.\n\n"
    "The girl grew up and became a teacher. She still asked many questions, and now she also answered "
    "them. Her students loved her, because she was patient and kind, and because she always said: "
    "\"There are no stupid questions. The only mistake is to stop asking.\" "
    "And the old machine? It still sits on a shelf in her classroom, and sometimes, when the room is "
    "quiet, it says hello to the children who come to visit.\n";

const char *kvc_gen_corpus(void) { return corpus; }

/* ----------------------------------------------------------------- trainer */

typedef struct gen_word {
    int32_t *sym;            /* symbol ids; bytes are 0-255 */
    int32_t  n;
    int32_t  freq;
} gen_word;

typedef struct gen_pair { int32_t a, b, count; } gen_pair;

typedef struct gen_bpe {
    int32_t n_sym;           /* 256 + distinct merged symbols */
    char  **str;             /* [n_sym] raw bytes of each symbol, NUL-terminated */
    int32_t n_merges;
    int32_t (*merges)[2];    /* [n_merges] (left, right) symbol ids, in rank order */
} gen_bpe;

static void bpe_free(gen_bpe *b)
{
    if (!b->str)
        return;
    for (int32_t i = 0; i < b->n_sym; i++)
        free(b->str[i]);
    free(b->str);
    free(b->merges);
    memset(b, 0, sizeof(*b));
}

static bool is_alpha(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Length of the GPT-2 pre-token at s (ASCII text): a contraction, " ?letters",
 * " ?digits", " ?punctuation", or a whitespace run that leaves its last space
 * to a following word. */
static size_t pretoken_len(const char *s)
{
    static const char *const contractions[] = { "'s", "'t", "'re", "'ve", "'m", "'ll", "'d" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(contractions); i++) {
        size_t n = strlen(contractions[i]);
        if (strncmp(s, contractions[i], n) == 0)
            return n;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t i = (u[0] == ' ' && u[1] && !is_space(u[1])) ? 1 : 0;
    if (is_alpha(u[i])) {
        while (is_alpha(u[i])) i++;
        return i;
    }
    if (is_digit(u[i])) {
        while (is_digit(u[i])) i++;
        return i;
    }
    if (u[i] && !is_space(u[i])) {
        while (u[i] && !is_space(u[i]) && !is_alpha(u[i]) && !is_digit(u[i])) i++;
        return i;
    }
    i = 0;
    while (is_space(u[i])) i++;
    if (i > 1 && u[i] && u[i - 1] == ' ')
        i--;                                 /* "\s+(?!\S)": the last space goes with the word */
    return i;
}

/* The corpus as distinct pre-tokens with their counts (digit pre-tokens left out). */
static int split_words(gen_word **out, int32_t *n_out)
{
    int32_t n = 0, cap = 0;
    gen_word *w = NULL;
    char **texts = NULL;
    for (const char *s = corpus; *s; ) {
        size_t len = pretoken_len(s);
        const char *t = s;
        s += len;
        if (len < 2 || is_digit((unsigned char)t[t[0] == ' ']))
            continue;                        /* nothing to merge */
        int32_t j = 0;
        while (j < n && !(strlen(texts[j]) == len && memcmp(texts[j], t, len) == 0))
            j++;
        if (j < n) {
            w[j].freq++;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            gen_word *nw = realloc(w, (size_t)cap * sizeof(*w));
            char **nt = nw ? realloc(texts, (size_t)cap * sizeof(*texts)) : NULL;
            if (nw) w = nw;
            if (nt) texts = nt;
            if (!nw || !nt)
                goto nomem;
        }
        texts[n] = strndup(t, len);
        w[n].sym = malloc(len * sizeof(int32_t));
        if (!texts[n] || !w[n].sym) {
            free(texts[n]);
            free(w[n].sym);
            goto nomem;
        }
        for (size_t k = 0; k < len; k++)
            w[n].sym[k] = (unsigned char)t[k];
        w[n].n = (int32_t)len;
        w[n].freq = 1;
        n++;
    }
    for (int32_t j = 0; j < n; j++)
        free(texts[j]);
    free(texts);
    *out = w;
    *n_out = n;
    return KVC_OK;
nomem:
    for (int32_t j = 0; j < n; j++) {
        free(texts[j]);
        free(w[j].sym);
    }
    free(texts);
    free(w);
    return KVC_ERR_NOMEM;
}

/* Pair counts: an open-addressing table keyed by (a, b), cleared per round. */
typedef struct gen_pair_table {
    gen_pair *slot;          /* [cap]; count 0 = empty */
    size_t    cap;           /* a power of two, at least twice the adjacencies */
    size_t   *used;          /* [cap / 2] slots filled this round, to clear */
    size_t    n_used;
} gen_pair_table;

/* The most frequent adjacent pair over all words (lowest ids on a tie);
 * count 0 when there is none. */
static gen_pair best_pair(const gen_word *w, int32_t n_words, gen_pair_table *tab)
{
    for (size_t i = 0; i < tab->n_used; i++)
        tab->slot[tab->used[i]].count = 0;
    tab->n_used = 0;
    gen_pair best = { 0, 0, 0 };
    for (int32_t i = 0; i < n_words; i++) {
        for (int32_t k = 0; k + 1 < w[i].n; k++) {
            int32_t a = w[i].sym[k], b = w[i].sym[k + 1];
            size_t h = (size_t)(((uint64_t)(uint32_t)a * 0x9E3779B1u) ^ (uint32_t)b * 0x85EBCA77u);
            gen_pair *s = &tab->slot[h & (tab->cap - 1)];
            while (s->count && (s->a != a || s->b != b))
                s = &tab->slot[(size_t)(s - tab->slot + 1) & (tab->cap - 1)];
            if (!s->count)
                tab->used[tab->n_used++] = (size_t)(s - tab->slot);
            s->a = a, s->b = b, s->count += w[i].freq;
            if (s->count > best.count ||
                (s->count == best.count && (a < best.a || (a == best.a && b < best.b))))
                best = *s;
        }
    }
    return best;
}

static void apply_merge(gen_word *w, int32_t n_words, gen_pair p, int32_t id)
{
    for (int32_t i = 0; i < n_words; i++) {
        int32_t o = 0;
        for (int32_t k = 0; k < w[i].n; k++) {
            if (k + 1 < w[i].n && w[i].sym[k] == p.a && w[i].sym[k + 1] == p.b) {
                w[i].sym[o++] = id;
                k++;
            } else {
                w[i].sym[o++] = w[i].sym[k];
            }
        }
        w[i].n = o;
    }
}

/* Learn the merges. A merge whose result equals an existing symbol's bytes
 * reuses that symbol, so every symbol's text is distinct. */
static int bpe_train(gen_bpe *b)
{
    memset(b, 0, sizeof(*b));
    gen_word *w = NULL;
    int32_t n_words = 0;
    int rc = split_words(&w, &n_words);
    if (rc != KVC_OK)
        return rc;
    size_t n_adj = 0;
    for (int32_t i = 0; i < n_words; i++)
        n_adj += (size_t)w[i].n;
    gen_pair_table tab = { NULL, 64, NULL, 0 };
    while (tab.cap < 2 * n_adj)
        tab.cap *= 2;
    tab.slot = calloc(tab.cap, sizeof(*tab.slot));
    tab.used = malloc(tab.cap / 2 * sizeof(*tab.used));
    b->str = calloc(256 + GEN_MAX_MERGES, sizeof(char *));
    b->merges = malloc(GEN_MAX_MERGES * sizeof(*b->merges));
    rc = KVC_ERR_NOMEM;
    if (!tab.slot || !tab.used || !b->str || !b->merges)
        goto done;
    for (b->n_sym = 0; b->n_sym < 256; b->n_sym++) {
        if (!(b->str[b->n_sym] = malloc(2)))
            goto done;
        b->str[b->n_sym][0] = (char)b->n_sym;
        b->str[b->n_sym][1] = 0;
    }
    while (b->n_merges < GEN_MAX_MERGES) {
        gen_pair p = best_pair(w, n_words, &tab);
        if (p.count < 2)
            break;
        size_t la = strlen(b->str[p.a]), lb = strlen(b->str[p.b]);
        char *s = malloc(la + lb + 1);
        if (!s)
            goto done;
        memcpy(s, b->str[p.a], la);
        memcpy(s + la, b->str[p.b], lb + 1);
        int32_t id = 256;
        while (id < b->n_sym && strcmp(b->str[id], s) != 0)
            id++;
        if (id == b->n_sym)
            b->str[b->n_sym++] = s;
        else
            free(s);
        b->merges[b->n_merges][0] = p.a;
        b->merges[b->n_merges][1] = p.b;
        b->n_merges++;
        apply_merge(w, n_words, p, id);
    }
    rc = KVC_OK;
done:
    for (int32_t i = 0; i < n_words; i++)
        free(w[i].sym);
    free(w);
    free(tab.slot);
    free(tab.used);
    if (rc != KVC_OK)
        bpe_free(b);
    return rc;
}

/* ------------------------------------------------------------ token lists */

typedef struct gen_vocab {
    int32_t n, cap;
    char   **text;               /* [n] owned, NUL-terminated */
    int32_t *type;               /* [n] token_type */
    float   *score;              /* [n] */
} gen_vocab;

static void vocab_free(gen_vocab *v)
{
    for (int32_t i = 0; i < v->n; i++)
        free(v->text[i]);
    free(v->text);
    free(v->type);
    free(v->score);
    memset(v, 0, sizeof(*v));
}

/* Append a token; takes ownership of `text` (freed on failure). */
static int vocab_push(gen_vocab *v, char *text, int32_t type, float score)
{
    if (!text)
        return KVC_ERR_NOMEM;
    if (v->n == v->cap) {
        int32_t cap = v->cap ? 2 * v->cap : 1024;
        char **t = realloc(v->text, (size_t)cap * sizeof(*t));
        if (t) v->text = t;
        int32_t *ty = t ? realloc(v->type, (size_t)cap * sizeof(*ty)) : NULL;
        if (ty) v->type = ty;
        float *sc = ty ? realloc(v->score, (size_t)cap * sizeof(*sc)) : NULL;
        if (sc) v->score = sc;
        if (!sc) {
            free(text);
            return KVC_ERR_NOMEM;
        }
        v->cap = cap;
    }
    v->text[v->n] = text;
    v->type[v->n] = type;
    v->score[v->n] = score;
    v->n++;
    return KVC_OK;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to
 * U+0100 upwards in byte order. `order` receives the bytes in GPT-2's token id
 * order (the printable ones first). */
static void byte_unicode(uint32_t cp[256], uint8_t order[256])
{
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (printable) {
            cp[b] = (uint32_t)b;
            order[n++] = (uint8_t)b;
        }
    }
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!printable) {
            cp[b] = 256 + (uint32_t)extra++;
            order[n++] = (uint8_t)b;
        }
    }
}

static size_t utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* Raw bytes -> byte-level BPE text (each byte one code point). Malloc'd. */
static char *bytes_to_bpe_text(const char *s, const uint32_t cp[256])
{
    size_t n = strlen(s);
    char *out = malloc(2 * n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++)
        o += utf8_put(o, cp[(unsigned char)s[i]]);
    *o = 0;
    return out;
}

/* Raw ASCII bytes -> SentencePiece text (space -> U+2581). Malloc'd. */
static char *bytes_to_spm_text(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(3 * n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++)
        o += s[i] == ' ' ? utf8_put(o, 0x2581) : utf8_put(o, (unsigned char)s[i]);
    *o = 0;
    return out;
}

static bool spm_piece_ok(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7E)
            return false;
    return true;
}

/* BPE tokens and merges ("left right" in byte-level text). */
static int build_bpe(const gen_bpe *b, gen_vocab *v, char ***merges_out)
{
    uint32_t cp[256];
    uint8_t order[256];
    byte_unicode(cp, order);
    int rc = KVC_OK;
    for (int i = 0; i < 256 && rc == KVC_OK; i++) {
        char one[4] = { 0 };                 /* byte 0 too, so not through bytes_to_bpe_text */
        utf8_put(one, cp[order[i]]);
        rc = vocab_push(v, strdup(one), TT_NORMAL, 0.0f);
    }
    for (int32_t id = 256; id < b->n_sym && rc == KVC_OK; id++)
        rc = vocab_push(v, bytes_to_bpe_text(b->str[id], cp), TT_NORMAL, 0.0f);
    static const char *const specials[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(specials) && rc == KVC_OK; i++)
        rc = vocab_push(v, strdup(specials[i]), TT_CONTROL, 0.0f);
    if (rc != KVC_OK)
        return rc;

    char **m = calloc((size_t)b->n_merges + 1, sizeof(char *));
    if (!m)
        return KVC_ERR_NOMEM;
    for (int32_t i = 0; i < b->n_merges; i++) {
        char *l = bytes_to_bpe_text(b->str[b->merges[i][0]], cp);
        char *r = bytes_to_bpe_text(b->str[b->merges[i][1]], cp);
        m[i] = (l && r) ? malloc(strlen(l) + strlen(r) + 2) : NULL;
        if (m[i])
            sprintf(m[i], "%s %s", l, r);
        free(l);
        free(r);
        if (!m[i]) {
            for (int32_t j = 0; j < i; j++)
                free(m[j]);
            free(m);
            return KVC_ERR_NOMEM;
        }
    }
    *merges_out = m;
    return KVC_OK;
}

/* SentencePiece tokens: specials, bytes, learned pieces by rank, characters. */
static int build_spm(const gen_bpe *b, gen_vocab *v)
{
    int rc = vocab_push(v, strdup("<unk>"), TT_UNKNOWN, 0.0f);
    if (rc == KVC_OK) rc = vocab_push(v, strdup("<s>"), TT_CONTROL, 0.0f);
    if (rc == KVC_OK) rc = vocab_push(v, strdup("</s>"), TT_CONTROL, 0.0f);
    for (int i = 0; i < 256 && rc == KVC_OK; i++) {
        char buf[8];
        snprintf(buf, sizeof(buf), "<0x%02X>", i);
        rc = vocab_push(v, strdup(buf), TT_BYTE, 0.0f);
    }
    int32_t rank = 0;
    for (int32_t id = 256; id < b->n_sym && rc == KVC_OK; id++)
        if (spm_piece_ok(b->str[id]))
            rc = vocab_push(v, bytes_to_spm_text(b->str[id]), TT_NORMAL, (float)-rank++);
    char one[2] = { 0, 0 };
    for (int c = 0x20; c <= 0x7E && rc == KVC_OK; c++) {
        one[0] = (char)c;
        rc = vocab_push(v, bytes_to_spm_text(one), TT_NORMAL, (float)-rank++);
    }
    if (rc == KVC_OK) rc = vocab_push(v, strdup("<|im_start|>"), TT_CONTROL, 0.0f);
    if (rc == KVC_OK) rc = vocab_push(v, strdup("<|im_end|>"), TT_CONTROL, 0.0f);
    return rc;
}

static int32_t vocab_find(const gen_vocab *v, const char *text)
{
    for (int32_t i = v->n - 1; i >= 0; i--)
        if (strcmp(v->text[i], text) == 0)
            return i;
    return -1;
}

bool kvc_gen_token_quiet(const char *vocab, int32_t n_real, int32_t id)
{
    if (id < 0 || id >= n_real)
        return true;                         /* fillers */
    if (vocab_is(vocab, "spm"))              /* <unk> <s> </s>, bytes; <|im_start|> */
        return id < 3 + 256 || id == n_real - 2;
    if (id >= n_real - 3)                    /* <|endoftext|> <|im_start|> */
        return id != n_real - 1;
    if (id >= 256)
        return false;
    uint32_t cp[256];
    uint8_t order[256];
    byte_unicode(cp, order);
    return order[id] < 0x20 || order[id] >= 0x7F;
}

/* ------------------------------------------------------------------ writer */

static const char chat_template[] =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static bool vocab_is(const char *vocab, const char *name)
{
    return vocab && strcasecmp(vocab, name) == 0;
}

/* Build the token list for `vocab`; *merges (BPE only) may stay NULL. */
static int build_vocab(const char *vocab, gen_vocab *v, char ***merges, int32_t *n_merges)
{
    gen_bpe b;
    int rc = bpe_train(&b);
    if (rc != KVC_OK)
        return rc;
    *merges = NULL;
    *n_merges = 0;
    if (vocab_is(vocab, "bpe")) {
        rc = build_bpe(&b, v, merges);
        *n_merges = b.n_merges;
    } else {
        rc = build_spm(&b, v);
    }
    bpe_free(&b);
    return rc;
}

static void merges_free(char **m, int32_t n)
{
    if (!m)
        return;
    for (int32_t i = 0; i < n; i++)
        free(m[i]);
    free(m);
}

int32_t kvc_gen_vocab_size(const char *vocab)
{
    if (!vocab_is(vocab, "bpe") && !vocab_is(vocab, "spm"))
        return -1;
    gen_vocab v = { 0 };
    char **m = NULL;
    int32_t nm = 0;
    int rc = build_vocab(vocab, &v, &m, &nm);
    int32_t n = rc == KVC_OK ? v.n : -1;
    merges_free(m, nm);
    vocab_free(&v);
    return n;
}

static int write_keys(gguf_writer *w, const kvc_gen_params *p, const gen_vocab *v,
                      char **merges, int32_t n_merges)
{
    bool bpe = vocab_is(p->vocab, "bpe");
    const char *pre = "default";
    if (bpe && p->bpe_pre)
        pre = p->bpe_pre;
    else if (bpe)
        pre = p->arch && strcasecmp(p->arch, "llama") == 0 ? "llama-bpe" : "qwen2";
    int rc = gguf_writer_set_str(w, "tokenizer.ggml.model", bpe ? "gpt2" : "llama");
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    if (!rc) rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                          (const char *const *)v->text, (uint64_t)v->n);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type",
                                      GGUF_TYPE_INT32, v->type, (uint64_t)v->n);
    if (!rc && bpe)
        rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges",
                                     (const char *const *)merges, (uint64_t)n_merges);
    if (!rc && !bpe)
        rc = gguf_writer_set_arr(w, "tokenizer.ggml.scores",
                                 GGUF_TYPE_FLOAT32, v->score, (uint64_t)v->n);

    int32_t im_end = vocab_find(v, "<|im_end|>");
    int32_t bos = bpe ? vocab_find(v, "<|endoftext|>") : 1;
    int32_t eos = bpe ? im_end : 2;
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)im_end);
    if (!rc && bpe) rc = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)bos);
    if (!rc && !bpe) rc = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (!rc) rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", !bpe);
    if (!rc) rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (!rc && !bpe) rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", true);
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.chat_template", chat_template);
    return rc;
}

int kvc_gen_vocab_write(gguf_writer *w, const kvc_gen_params *p,
                        kvc_gen_vocab_info *info, kvc_err *err)
{
    if (!vocab_is(p->vocab, "bpe") && !vocab_is(p->vocab, "spm"))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "vocab \"%s\": expected \"bpe\" or \"spm\"",
                        p->vocab ? p->vocab : "(null)");
    gen_vocab v = { 0 };
    char **merges = NULL;
    int32_t n_merges = 0;
    int rc = build_vocab(p->vocab, &v, &merges, &n_merges);
    int32_t n_real = v.n;
    if (rc == KVC_OK && p->n_vocab > 0 && p->n_vocab < n_real) {
        rc = kvc_fail(err, KVC_ERR_INVALID_ARG, "n_vocab %d is below the %s vocabulary's %d tokens",
                      (int)p->n_vocab, p->vocab, (int)n_real);
        goto done;
    }
    for (int32_t i = n_real; rc == KVC_OK && i < p->n_vocab; i++) {
        char buf[32];
        snprintf(buf, sizeof(buf), "<|filler_%d|>", (int)(i - n_real));
        rc = vocab_push(&v, strdup(buf), TT_UNUSED, 0.0f);
    }
    if (rc == KVC_OK)
        rc = write_keys(w, p, &v, merges, n_merges);
    if (rc != KVC_OK)
        kvc_fail(err, rc, "writing the %s vocabulary: %s", p->vocab, kvc_strerror(rc));
    else if (info)
        *info = (kvc_gen_vocab_info){ v.n, n_real, n_merges };
done:
    merges_free(merges, n_merges);
    vocab_free(&v);
    return rc;
}

int kvc_gen_tokenizer(const char *preset, kvc_tokenizer **out, kvc_err *err)
{
    kvc_gen_params p;
    *out = NULL;
    if (kvc_gen_preset(preset, &p) != KVC_OK)
        return kvc_fail(err, KVC_ERR_NOT_FOUND, "unknown preset '%s'", preset ? preset : "(null)");
    p.vocab_only = true;
    void *buf = NULL;
    size_t size = 0;
    gguf_file *f = NULL;
    int rc = kvc_gen_model_memory(&p, &buf, &size, err);
    if (rc == KVC_OK)
        rc = gguf_open_memory(buf, size, &f, err);
    if (rc == KVC_OK)
        rc = kvc_tokenizer_load(f, out, err);
    gguf_close(f);
    free(buf);
    return rc;
}
