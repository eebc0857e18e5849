/* tokenizer.h - text <-> token ids, as the model's GGUF vocabulary defines them.
 *
 * Two models (tokenizer.ggml.model):
 *   "llama": SentencePiece-style. Spaces become U+2581, a leading one is added
 *            (tokenizer.ggml.add_space_prefix, default true); pieces are merged
 *            by score; characters not in the vocabulary fall back to byte tokens
 *            <0xXX> when the vocabulary has them, else to the unknown token.
 *   "gpt2":  byte-level BPE: the text is split by the pre-tokenizer named in
 *            tokenizer.ggml.pre (default/gpt-2, llama-bpe, qwen2, smollm,
 *            deepseek-coder, falcon, starcoder, ...), bytes are mapped to
 *            printable code points, and merges (tokenizer.ggml.merges) are applied
 *            by rank.
 * Special tokens are matched in the text as whole strings before the model
 * splits it, longest first (llama.cpp's order): control (token_type 3) and
 * unknown (2) tokens only when parse_special is true, user-defined (4) tokens
 * always (as llama.cpp and Hugging Face do). With "llama", each text run at the
 * start or after a special token gets the add_space_prefix space.
 *
 * A kvc_tokenizer is immutable after load and safe to share between threads. */
#ifndef KVC_TOKENIZER_H
#define KVC_TOKENIZER_H

#include "common.h"
#include "gguf.h"

typedef struct kvc_tokenizer kvc_tokenizer;

enum kvc_token_type {          /* tokenizer.ggml.token_type values */
    KVC_TOKEN_UNDEFINED    = 0,
    KVC_TOKEN_NORMAL       = 1,
    KVC_TOKEN_UNKNOWN      = 2,
    KVC_TOKEN_CONTROL      = 3,
    KVC_TOKEN_USER_DEFINED = 4,
    KVC_TOKEN_UNUSED       = 5,
    KVC_TOKEN_BYTE         = 6,
};

/* Build a tokenizer from a GGUF's tokenizer.* keys (the file may be closed
 * afterwards: everything needed is copied). Errors name the missing or bad key:
 * KVC_ERR_NOT_FOUND ("tokenizer.ggml.tokens missing"), KVC_ERR_FORMAT,
 * KVC_ERR_UNSUPPORTED (an unknown tokenizer model or pre-tokenizer). */
int  kvc_tokenizer_load(const gguf_file *f, kvc_tokenizer **out, kvc_err *err);
void kvc_tokenizer_free(kvc_tokenizer *t);   /* NULL ok */

int32_t kvc_tokenizer_n_vocab(const kvc_tokenizer *t);
int32_t kvc_tokenizer_bos(const kvc_tokenizer *t);   /* -1 when none */
int32_t kvc_tokenizer_eos(const kvc_tokenizer *t);   /* -1 when none */
bool    kvc_tokenizer_add_bos(const kvc_tokenizer *t); /* the vocabulary asks for BOS */
bool    kvc_tokenizer_add_eos(const kvc_tokenizer *t);
/* End of generation: EOS, EOT (tokenizer.ggml.eot_token_id), EOM, and tokens
 * whose text is in llama.cpp's list (<|im_end|>, <|eot_id|>, <|end|>,
 * <end_of_turn>, <|endoftext|>, </s>, <|eom_id|>, <|end_of_text|>, <eos>, ...);
 * like llama.cpp, such a token is made a control token whatever its stored type. */
bool    kvc_tokenizer_is_eog(const kvc_tokenizer *t, int32_t id);
/* Markup a reply keeps: a control token that does not end the reply and whose
 * text is written into it (kvc_token_to_piece renders it whatever
 * render_special says), for a parser of the template's format to read. Only
 * o200k_harmony's (gpt-oss) <|channel|> <|message|> <|start|> <|constrain|>
 * <|end|>, in a vocabulary whose <|return|> and <|call|> end generation; its
 * <|end|> is then not an end of generation (llama.cpp's rule). Tokenizing
 * still reads them as control tokens (parse_special only). */
bool    kvc_tokenizer_is_markup(const kvc_tokenizer *t, int32_t id);
int     kvc_tokenizer_token_type(const kvc_tokenizer *t, int32_t id); /* after that override */
/* The token's text as stored in the vocabulary (not decoded); NULL if id is out of range. */
const char *kvc_tokenizer_token_text(const kvc_tokenizer *t, int32_t id);
/* Id of a token whose vocabulary text is exactly `text`, or -1. */
int32_t kvc_tokenizer_find(const kvc_tokenizer *t, const char *text);

/* Tokenize len bytes of text (need not be NUL-terminated; invalid UTF-8 is
 * taken byte by byte and comes back unchanged from kvc_detokenize). add_special:
 * add BOS/EOS as the vocabulary's add_bos / add_eos flags ask (and when it has
 * that token). parse_special: recognise control and unknown token strings in
 * the text (user-defined ones are always recognised).
 * Returns the number of tokens; when that is more than cap, nothing beyond cap
 * was written and the caller retries with a larger buffer. Negative status on
 * error: KVC_ERR_NOMEM, KVC_ERR_INVALID_ARG (NULL arguments, len > 256 MiB). */
int64_t kvc_tokenize(const kvc_tokenizer *t, const char *text, size_t len,
                     bool add_special, bool parse_special,
                     int32_t *out, int64_t cap);

/* The same for text that continues earlier text (continuation = true): the
 * SentencePiece add_space_prefix space is not put before its first run, so a
 * suffix can be tokenized after the tokens of its prefix. Its tokens equal
 * those of the whole text only when no merge would cross the boundary.
 * kvc_tokenize is kvc_tokenize_ex with continuation = false. */
int64_t kvc_tokenize_ex(const kvc_tokenizer *t, const char *text, size_t len,
                        bool add_special, bool parse_special, bool continuation,
                        int32_t *out, int64_t cap);

/* Tokens of a rendered chat prompt, as llama.cpp and transformers tokenize
 * it, except that caller text is never read as markup: control (and unknown)
 * token strings are recognised only where they lie wholly outside the ranges
 * data[0, n_data) (sorted, non-overlapping: message content and other caller
 * data), and the text between two recognised special tokens is tokenized as
 * one piece, template text and data together, so a merge or SentencePiece's
 * space prefix crosses their boundary as in a whole-text tokenization.
 * User-defined tokens are recognised everywhere (as kvc_tokenize does).
 * Returns and errors as kvc_tokenize (also KVC_ERR_INVALID_ARG: data NULL
 * with n_data > 0). */
int64_t kvc_tokenize_data(const kvc_tokenizer *t, const char *text, size_t len,
                          bool add_special, const kvc_text_span *data, size_t n_data,
                          int32_t *out, int64_t cap);

/* The bytes a token stands for: U+2581 -> ' ', <0xXX> -> the byte, byte-level
 * BPE code points -> bytes; unused tokens give "". Control and unknown tokens
 * give "" unless render_special (then their text), except markup a reply
 * keeps (kvc_tokenizer_is_markup): always its text. No NUL is written.
 * Returns the length; when it exceeds cap nothing is written (call again with
 * a bigger buffer). Negative for an id out of range. */
int kvc_token_to_piece(const kvc_tokenizer *t, int32_t id, bool render_special,
                       char *buf, int cap);

/* Streaming detokenizer: turns a token stream into text, releasing only whole
 * UTF-8 characters (a character split across tokens is held back; bytes that
 * cannot form one become U+FFFD, so the output is always valid UTF-8). With the
 * SentencePiece model and add_space_prefix, the space tokenization put at the
 * start of a text run (the first one, and each after a control or
 * user-defined token) is removed. Init with kvc_detok_init; holds no heap
 * memory. To continue text that is already shown (a completion after its
 * prompt), set at_start = false after init. */
typedef struct kvc_detok {
    const kvc_tokenizer *tok;
    bool   render_special;
    bool   at_start;       /* the next text token starts a text run */
    int    n_pending;
    char   pending[8];     /* an incomplete UTF-8 sequence */
} kvc_detok;

void kvc_detok_init(kvc_detok *d, const kvc_tokenizer *t, bool render_special);
/* Write the text that token `id` completes to out. Returns the bytes written;
 * a return above cap means out was too small: nothing was written or consumed,
 * call again with that much room (3 * the piece length + 4 always suffices).
 * Negative on a bad id. */
int  kvc_detok_feed(kvc_detok *d, int32_t id, char *out, int cap);
/* Release what is held back (an incomplete trailing sequence becomes U+FFFD,
 * 3 bytes; a return above cap: too small, nothing done). */
int  kvc_detok_flush(kvc_detok *d, char *out, int cap);

/* Decode a whole token array to a malloc'd NUL-terminated string, the exact
 * bytes of the pieces (no UTF-8 repair; leading-space rule as kvc_detok), so
 * that kvc_detokenize(kvc_tokenize(x)) == x, except where tokenization loses
 * text: a character that became the unknown token, a U+2581 in SentencePiece
 * text (it reads as a space), whitespace a special token
 * with the strip attribute ate (Phi-3), special tokens when render_special is
 * off. NULL on OOM or an id out of range; caller frees. */
char *kvc_detokenize(const kvc_tokenizer *t, const int32_t *ids, int64_t n, bool render_special);

#endif
