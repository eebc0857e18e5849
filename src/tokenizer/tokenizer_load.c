/* tokenizer_load.c - building a kvc_tokenizer from a GGUF's tokenizer.* keys.
 *
 * Everything is copied out of the file: token texts, scores and types, the
 * text -> id map, the merges (tokenizer_bpe.c) and the decoded bytes of every
 * token. Defaults follow llama.cpp: "llama" has BOS 1, EOS 2, UNK 0, add_bos
 * and add_space_prefix on; "gpt2" has no default ids, add_bos only for the
 * pre-tokenizers that llama.cpp turns it on for. A token id key out of range
 * is ignored (the default stays). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

/* Texts that mark the end of generation (llama.cpp's list); a token with one
 * of them is treated as a control token whatever its stored type. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
    "<turn|>", "<|tool_response>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "[e~[",
};

static int opt_bool(const gguf_file *f, const char *key, bool *v, kvc_err *err)
{
    kvc_err e = {0};
    int rc = gguf_get_bool(f, key, v, &e);
    if (rc == KVC_ERR_NOT_FOUND)
        return KVC_OK;
    if (rc != KVC_OK && err)
        *err = e;
    return rc;
}

/* A token id key: kept when in range, else the default stays (as llama.cpp). */
static int opt_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *id, kvc_err *err)
{
    kvc_err e = {0};
    int64_t v;
    int rc = gguf_get_i64(f, key, &v, &e);
    if (rc == KVC_ERR_NOT_FOUND)
        return KVC_OK;
    if (rc != KVC_OK) {
        if (err)
            *err = e;
        return rc;
    }
    if (v >= 0 && v < n_vocab)
        *id = (int32_t)v;
    return KVC_OK;
}

/* An optional numeric array with at least n entries. */
static int opt_array(const gguf_file *f, const char *key, uint64_t n, const gguf_kv **out, kvc_err *err)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    *out = NULL;
    if (!kv)
        return KVC_OK;
    if (kv->type != GGUF_TYPE_ARRAY || kv->v.arr.type == GGUF_TYPE_STRING ||
        kv->v.arr.type == GGUF_TYPE_ARRAY || kv->v.arr.type == GGUF_TYPE_BOOL)
        return kvc_fail(err, KVC_ERR_FORMAT, "%s: not a numeric array", key);
    if (kv->v.arr.n < n)
        return kvc_fail(err, KVC_ERR_FORMAT, "%s: %llu entries for %llu tokens", key,
                        (unsigned long long)kv->v.arr.n, (unsigned long long)n);
    *out = kv;
    return KVC_OK;
}

static uint16_t attr_of_type(int64_t type)
{
    switch (type) {
    case KVC_TOKEN_NORMAL:       return TOK_ATTR_NORMAL;
    case KVC_TOKEN_UNKNOWN:      return TOK_ATTR_UNKNOWN;
    case KVC_TOKEN_CONTROL:      return TOK_ATTR_CONTROL;
    case KVC_TOKEN_USER_DEFINED: return TOK_ATTR_USER_DEFINED;
    case KVC_TOKEN_UNUSED:       return TOK_ATTR_UNUSED;
    case KVC_TOKEN_BYTE:         return TOK_ATTR_BYTE;
    default:                     return TOK_ATTR_UNDEFINED;
    }
}

/* Allocate the per-token arrays and copy texts (an empty text becomes
 * "[EMPTY_<id>]", as in llama.cpp). */
static int copy_texts(kvc_tokenizer *t, const gguf_kv *toks, kvc_err *err)
{
    uint64_t n = toks->v.arr.n, total = 0;
    if (n == 0 || n > INT32_MAX)
        return kvc_fail(err, KVC_ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        total += (toks->v.arr.strs[i].len ? toks->v.arr.strs[i].len : 20) + 1;
    if (total >= UINT32_MAX)
        return kvc_fail(err, KVC_ERR_FORMAT, "tokenizer.ggml.tokens: %llu bytes", (unsigned long long)total);
    t->n_vocab = (int32_t)n;
    t->text = malloc(total);
    t->piece = malloc(total);
    t->text_off = malloc(n * sizeof(uint32_t));
    t->text_len = malloc(n * sizeof(uint32_t));
    t->piece_off = malloc(n * sizeof(uint32_t));
    t->piece_len = malloc(n * sizeof(uint32_t));
    t->score = calloc(n, sizeof(float));
    t->type = calloc(n, 1);
    t->attr = calloc(n, sizeof(uint16_t));
    if (!t->text || !t->piece || !t->text_off || !t->text_len || !t->piece_off ||
        !t->piece_len || !t->score || !t->type || !t->attr)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory for %llu tokens", (unsigned long long)n);
    uint32_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        const gguf_str *s = &toks->v.arr.strs[i];
        int len = (int)s->len;
        if (s->len)
            memcpy(t->text + off, s->s, s->len);
        else
            len = snprintf(t->text + off, 21, "[EMPTY_%llu]", (unsigned long long)i);
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)len;
        t->text[off + (uint32_t)len] = 0;
        off += (uint32_t)len + 1;
    }
    return KVC_OK;
}

/* tokens, scores, token_type, and the text -> id map. */
static int load_vocab(kvc_tokenizer *t, const gguf_file *f, kvc_err *err)
{
    const gguf_kv *toks, *scores, *types;
    int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, err);
    if (rc == KVC_ERR_NOT_FOUND)
        return kvc_fail(err, rc, "tokenizer.ggml.tokens missing");
    if (rc == KVC_OK)
        rc = copy_texts(t, toks, err);
    if (rc == KVC_OK)
        rc = opt_array(f, "tokenizer.ggml.scores", toks->v.arr.n, &scores, err);
    if (rc == KVC_OK)
        rc = opt_array(f, "tokenizer.ggml.token_type", toks->v.arr.n, &types, err);
    if (rc == KVC_OK && kvc_tok_map_init(&t->vocab, (size_t)t->n_vocab) != KVC_OK)
        rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory for the vocabulary map");
    if (rc != KVC_OK)
        return rc;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->score[i] = scores ? (float)gguf_arr_f64(scores, (uint64_t)i) : 0.0f;
        int64_t ty = types ? gguf_arr_i64(types, (uint64_t)i) : KVC_TOKEN_NORMAL;
        t->attr[i] = attr_of_type(ty);
        t->type[i] = (ty >= KVC_TOKEN_NORMAL && ty <= KVC_TOKEN_BYTE) ? (uint8_t)ty : KVC_TOKEN_UNDEFINED;
        uint32_t slot;
        const char *s = t->text + t->text_off[i];
        kvc_tok_probe(t, s, t->text_len[i], &slot);
        t->vocab.hash[slot] = tok_hash_fold(tok_hash(s, t->text_len[i], TOK_HASH_SEED));
        t->vocab.val[slot] = i;                    /* a later duplicate wins */
    }
    return KVC_OK;
}

/* Model-dependent defaults, then the tokenizer.ggml.* keys that override them. */
static int load_flags(kvc_tokenizer *t, const gguf_file *f, kvc_err *err)
{
    int32_t n = t->n_vocab;
    if (t->model == TOK_SPM) {
        t->bos = 1 < n ? 1 : -1;
        t->eos = 2 < n ? 2 : -1;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    }
    int rc = KVC_OK;
    static const char *const id_keys[] = {
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
    };
    int32_t *ids[] = { &t->bos, &t->eos, &t->eot, &t->eom, &t->unk, &t->pad };
    for (size_t i = 0; i < KVC_ARRAY_LEN(id_keys) && rc == KVC_OK; i++)
        rc = opt_id(f, id_keys[i], n, ids[i], err);
    if (rc == KVC_OK)
        rc = opt_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
    if (rc == KVC_OK)
        rc = opt_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err);
    if (rc == KVC_OK)
        rc = opt_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
    return rc;
}

static bool is_eog_text(const char *s, size_t len)
{
    for (size_t i = 0; i < KVC_ARRAY_LEN(eog_texts); i++)
        if (strlen(eog_texts[i]) == len && memcmp(eog_texts[i], s, len) == 0)
            return true;
    return false;
}

/* End-of-generation marks, and the control type they force (as llama.cpp). */
static void mark_eog(kvc_tokenizer *t)
{
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (is_eog_text(t->text + t->text_off[i], t->text_len[i])) {
            t->attr[i] |= TOK_ATTR_CONTROL | TOK_ATTR_EOG;
            t->type[i] = KVC_TOKEN_CONTROL;
        }
    }
    int32_t ids[] = { t->eos, t->eot, t->eom };
    for (size_t i = 0; i < KVC_ARRAY_LEN(ids); i++)
        if (ids[i] >= 0)
            t->attr[ids[i]] |= TOK_ATTR_EOG;
}

/* o200k_harmony (gpt-oss): a reply is a run of messages, "<|channel|>analysis
 * <|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...", and
 * only <|return|> and <|call|> end it. A vocabulary with both (llama.cpp's
 * test) takes <|end|> off the end-of-generation list, and marks the harmony
 * markup (<|channel|>, <|message|>, <|start|>, <|constrain|>, <|end|>) as
 * text a reply keeps: they stay control tokens for tokenizing (caller text
 * never becomes markup), but are written into the reply, where the harmony
 * parsers (reasoning.h, tool_calls.h) read them and the client never sees them. */
static void mark_harmony(kvc_tokenizer *t)
{
    static const char *const markup[] = { "<|channel|>", "<|message|>", "<|start|>",
                                          "<|constrain|>", "<|end|>" };
    int32_t ret = kvc_tokenizer_find(t, "<|return|>"), call = kvc_tokenizer_find(t, "<|call|>");
    if (ret < 0 || call < 0 || !(t->attr[ret] & TOK_ATTR_EOG) || !(t->attr[call] & TOK_ATTR_EOG))
        return;
    for (size_t i = 0; i < KVC_ARRAY_LEN(markup); i++) {
        int32_t id = kvc_tokenizer_find(t, markup[i]);
        if (id >= 0 && (t->attr[id] & TOK_ATTR_CONTROL))
            t->attr[id] = (uint16_t)((t->attr[id] & ~TOK_ATTR_EOG) | TOK_ATTR_MARKUP);
    }
}

static int cmp_special(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Control, user-defined and unknown tokens, longest text first (ties by id). */
static int collect_specials(kvc_tokenizer *t)
{
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n += (t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)) != 0;
    uint64_t *keys = malloc((size_t)(n ? n : 1) * sizeof(*keys));
    t->special = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!keys || !t->special) {
        free(keys);
        return KVC_ERR_NOMEM;
    }
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN))
            keys[n++] = ((uint64_t)(UINT32_MAX - t->text_len[i]) << 32) | (uint32_t)i;
    qsort(keys, (size_t)n, sizeof(*keys), cmp_special);
    for (int32_t i = 0; i < n; i++)
        t->special[i] = (int32_t)(keys[i] & 0xFFFFFFFFu);
    t->n_special = n;
    free(keys);
    return KVC_OK;
}

/* Whitespace stripping next to special tokens, which llama.cpp sets by model
 * name: Phi-3's special tokens eat the whitespace that follows them. */
static void set_strip_attrs(kvc_tokenizer *t, const gguf_file *f)
{
    char *name = NULL;
    if (gguf_get_str(f, "general.name", &name, NULL) != KVC_OK)
        return;
    for (char *p = name; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    if (strstr(name, "phi-3") || strstr(name, "phi3")) {
        for (int32_t i = 0; i < t->n_special; i++)
            t->attr[t->special[i]] |= TOK_ATTR_RSTRIP;
        static const char *const keep[] = { "<unk>", "<s>", "<|endoftext|>" };
        int32_t id = kvc_tok_lookup(t, "</s>", 4);
        if (id >= 0)
            t->attr[id] |= TOK_ATTR_RSTRIP;
        for (size_t i = 0; i < KVC_ARRAY_LEN(keep); i++)
            if ((id = kvc_tok_lookup(t, keep[i], strlen(keep[i]))) >= 0)
                t->attr[id] &= (uint16_t)~TOK_ATTR_RSTRIP;
    }
    free(name);
}

/* The token of each raw byte: <0xXX> (SPM; else the one-byte text), or the
 * byte's GPT-2 code point (BPE). */
static void find_byte_tokens(kvc_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char s[8];
        int32_t id;
        if (t->model == TOK_SPM) {
            snprintf(s, sizeof(s), "<0x%02X>", b);
            id = kvc_tok_lookup(t, s, 6);
            if (id < 0) {
                s[0] = (char)b;
                id = kvc_tok_lookup(t, s, 1);
            }
        } else {
            int n = kvc_utf8_encode(kvc_gpt2_byte_to_cpt((uint8_t)b), s);
            id = kvc_tok_lookup(t, s, (size_t)n);
        }
        t->byte_tok[b] = id;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Decode one token's text into out (room for len bytes); returns the length. */
static uint32_t decode_piece(const kvc_tokenizer *t, int32_t id, char *out)
{
    const char *s = t->text + t->text_off[id];
    uint32_t len = t->text_len[id], n = 0;
    uint16_t a = t->attr[id];
    if (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN | TOK_ATTR_USER_DEFINED)) {
        memcpy(out, s, len);
        return len;
    }
    if (a & TOK_ATTR_NORMAL) {
        for (uint32_t i = 0; i < len;) {
            uint32_t cp = 0;
            int u = kvc_utf8_decode(s + i, len - i, &cp);
            int b = u > 0 ? (t->model == TOK_SPM ? (cp == 0x2581 ? ' ' : -1) : kvc_gpt2_cpt_to_byte(cp)) : -1;
            u = u > 0 ? u : 1;
            if (b >= 0)
                out[n++] = (char)b;
            else
                for (int k = 0; k < u; k++)
                    out[n++] = s[i + (uint32_t)k];
            i += (uint32_t)u;
        }
        return n;
    }
    if (a & TOK_ATTR_BYTE) {
        if (len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
            out[0] = (char)(hexval(s[3]) * 16 + hexval(s[4]));
            return 1;
        }
        memcpy(out, s, len);
        return len;
    }
    return 0;                    /* unused and undefined tokens decode to nothing */
}

static void build_pieces(kvc_tokenizer *t)
{
    uint32_t off = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->piece_off[i] = off;
        t->piece_len[i] = decode_piece(t, i, t->piece + off);
        off += t->piece_len[i];
    }
}

static int load_model(kvc_tokenizer *t, const gguf_file *f, kvc_err *err)
{
    char *model = NULL, *pre = NULL;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
    if (rc == KVC_ERR_NOT_FOUND)
        return kvc_fail(err, rc, "tokenizer.ggml.model missing");
    if (rc != KVC_OK)
        return rc;
    if (strcmp(model, "llama") == 0)
        t->model = TOK_SPM;
    else if (strcmp(model, "gpt2") == 0)
        t->model = TOK_BPE;
    else
        rc = kvc_fail(err, KVC_ERR_UNSUPPORTED, "tokenizer.ggml.model '%s' not supported", model);
    free(model);
    if (rc == KVC_OK)
        rc = load_vocab(t, f, err);
    if (rc == KVC_OK && t->model == TOK_BPE) {
        int prc = gguf_get_str(f, "tokenizer.ggml.pre", &pre, err);
        if (prc != KVC_OK && prc != KVC_ERR_NOT_FOUND)
            return prc;
        rc = kvc_tok_bpe_load(t, f, pre, err);
        free(pre);
    }
    return rc;
}

int kvc_tokenizer_load(const gguf_file *f, kvc_tokenizer **out, kvc_err *err)
{
    *out = NULL;
    kvc_tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = -1;
    int rc = load_model(t, f, err);
    if (rc == KVC_OK)
        rc = load_flags(t, f, err);
    if (rc == KVC_OK) {
        mark_eog(t);
        mark_harmony(t);
        rc = collect_specials(t);
        if (rc != KVC_OK)
            kvc_fail(err, rc, "out of memory");
    }
    if (rc != KVC_OK) {
        kvc_tokenizer_free(t);
        return rc;
    }
    set_strip_attrs(t, f);
    find_byte_tokens(t);
    build_pieces(t);
    *out = t;
    return KVC_OK;
}

void kvc_tokenizer_free(kvc_tokenizer *t)
{
    if (!t)
        return;
    if (t->model == TOK_BPE)
        kvc_tok_bpe_free(t);
    kvc_tok_map_free(&t->vocab);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->score);
    free(t->type);
    free(t->attr);
    free(t->special);
    free(t);
}
