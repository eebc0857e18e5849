/* test_prompt_tokens.c - a chat request's tokens are llama.cpp's and
 * transformers' (DESIGN.md §3 step 3; issue 30, item 6).
 *
 * Those tokenize the rendered prompt whole, parsing control tokens: a merge or
 * SentencePiece's space prefix crosses from template text into message text.
 * Tokenizing each provenance run alone made Llama-2's "[INST] Hello there
 * [/INST]" "▁[ INST ] ▁ Hello ..." (11 tokens) instead of "▁[ INST ] ▁Hello
 * ..." (10). For conversations whose messages hold no control-token text, the
 * request's tokens (kvc_prompt_chat) must equal kvc_tokenize(render(messages),
 * BOS, control tokens parsed) exactly - derived here independently of the
 * provenance spans - with the llama2, mistral-v7 and other templates, on
 * Llama-2's SentencePiece vocabulary (../shared/vocab/ggml-vocab-llama-spm.gguf)
 * and on generated SPM and BPE models. Injection safety is test_injection's;
 * one case here: control-token text inside a message stays text while the
 * text around it still tokenizes whole. */
#include "test.h"

#include "chat_template.h"
#include "gguf.h"
#include "model.h"
#include "prompt.h"
#include "tokenizer.h"

#include <unistd.h>

static const kvc_chat_message conv[][6] = {
    { { "user", "Hello there" } },
    { { "system", "You are terse." }, { "user", "Hello there" } },
    { { "user", "Hi" }, { "assistant", "Hello! How can I help?" }, { "user", "Name a colour." } },
    { { "system", " lead space" }, { "user", "\nnew line first" }, { "assistant", "ok " },
      { "user", "trailing space " } },
    { { "user", "123 numbers, 'quotes' and é accents" } },
    { { "system", "S" }, { "user", "a" }, { "assistant", "b" }, { "user", "c" },
      { "assistant", "d" }, { "user", "e" } },
};
static const size_t conv_n[] = { 1, 2, 3, 4, 1, 6 };

static kvc_chat_template *template_named(const char *name)
{
    kvc_chat_template_params tp = { .name = name, .bos_text = "<s>", .eos_text = "</s>",
                                    .strip_bos = true };
    kvc_chat_template *t = NULL;
    kvc_err e = { 0 };
    CHECKF(kvc_chat_template_new(&tp, &t, &e) == KVC_OK, "%s: %s", name, e.msg);
    return t;
}

static void print_pieces(const kvc_model *m, const char *what, const int32_t *v, int64_t n)
{
    fprintf(stderr, "    %s (%lld):", what, (long long)n);
    for (int64_t i = 0; i < n && i < 48; i++) {
        char p[64];
        int k = kvc_token_to_piece(m->tok, v[i], true, p, (int)sizeof(p) - 1);
        p[k > 0 && k < (int)sizeof(p) ? k : 0] = 0;
        fprintf(stderr, " [%s]", p);
    }
    fprintf(stderr, "\n");
}

/* The tokens of rendered text as llama.cpp tokenizes a chat prompt. */
static int64_t whole_text_tokens(const kvc_model *m, const char *text, int32_t **out)
{
    int64_t n = kvc_tokenize(m->tok, text, strlen(text), true, true, NULL, 0);
    *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    kvc_tokenize(m->tok, text, strlen(text), true, true, *out, n);
    return n;
}

/* Every conversation with template `name`: the request's tokens are the
 * whole text's. Returns how many conversations matched. */
static int check_template(const kvc_model *m, const char *model, const char *name)
{
    kvc_chat_template *t = template_named(name);
    int same = 0;
    for (size_t c = 0; t && c < KVC_ARRAY_LEN(conv); c++) {
        kvc_chat_params p = kvc_chat_default_params();
        char *text = NULL;
        kvc_err e = { 0 };
        kvc_tokbuf got = { 0 };
        int32_t dropped = 0, *want = NULL;
        CHECKF(kvc_prompt_render(t, conv[c], conv_n[c], &p, &text, &e) == KVC_OK, "%s", e.msg);
        CHECKF(kvc_prompt_chat(m, t, conv[c], conv_n[c], &p, 1 << 20, &got, &dropped, NULL, &e) ==
               KVC_OK, "%s", e.msg);
        int64_t nw = text ? whole_text_tokens(m, text, &want) : -1;
        bool eq = nw == got.n && !memcmp(want, got.v, (size_t)nw * sizeof(int32_t));
        CHECKF(eq, "%s, %s, conversation %zu: the request's tokens differ from the whole "
               "text's", model, name, c);
        if (!eq) {
            fprintf(stderr, "    text: «%s»\n", text);
            print_pieces(m, "request", got.v, got.n);
            print_pieces(m, "whole text", want, nw);
        }
        same += eq;
        free(want);
        free(text);
        kvc_tokbuf_free(&got);
    }
    kvc_chat_template_free(t);
    return same;
}

/* Llama-2's vocabulary: "[INST] Hello there [/INST]" is BOS and 9 tokens,
 * "▁Hello" one of them, as llama.cpp and transformers have it (it was BOS and
 * 10, "▁" and "Hello"). Skipped for a vocabulary without "▁Hello". */
static void check_llama2_example(const kvc_model *m)
{
    int32_t hello = kvc_tokenizer_find(m->tok, "\xe2\x96\x81Hello");
    kvc_chat_template *t = hello >= 0 ? template_named("llama2") : NULL;
    kvc_chat_params p = kvc_chat_default_params();
    kvc_tokbuf got = { 0 };
    int32_t dropped;
    kvc_err e = { 0 };
    if (t && kvc_prompt_chat(m, t, conv[0], 1, &p, 1 << 20, &got, &dropped, NULL, &e) == KVC_OK) {
        CHECKF(got.n == 10 && got.v[0] == kvc_tokenizer_bos(m->tok) && got.v[4] == hello,
               "[INST] Hello there [/INST]: %lld tokens (BOS + 9 wanted), token 4 %d (▁Hello %d)",
               (long long)got.n, got.n > 4 ? got.v[4] : -1, hello);
        if (got.n != 10)
            print_pieces(m, "llama2", got.v, got.n);
        printf("  llama2 [INST] Hello there [/INST]: BOS + %lld tokens\n", (long long)got.n - 1);
    }
    kvc_tokbuf_free(&got);
    kvc_chat_template_free(t);
}

/* Control-token text typed in a message is text: "</s>" in a user message
 * gives no EOS, and the words around it still merge with the template's
 * spaces as the whole text's would ("[INST] Hi</s>" keeps "▁Hi"). */
static void check_typed_control(const kvc_model *m)
{
    kvc_chat_template *t = template_named("llama2");
    kvc_chat_message msg[] = { { "user", "Hi</s> there" } };
    kvc_chat_params p = kvc_chat_default_params();
    kvc_tokbuf got = { 0 };
    int32_t dropped, eos = kvc_tokenizer_eos(m->tok), hi = kvc_tokenizer_find(m->tok, "\xe2\x96\x81Hi");
    kvc_err e = { 0 };
    if (t && kvc_prompt_chat(m, t, msg, 1, &p, 1 << 20, &got, &dropped, NULL, &e) == KVC_OK) {
        int n_eos = 0;
        bool has_hi = false;
        for (int64_t i = 0; i < got.n; i++) {
            n_eos += got.v[i] == eos;
            has_hi |= got.v[i] == hi;
        }
        CHECKF(n_eos == 0, "typed </s> became %d EOS tokens", n_eos);
        CHECKF(hi < 0 || has_hi, "'▁Hi' (%d) missing: the message was not tokenized with the "
               "template's space", hi);
    }
    kvc_tokbuf_free(&got);
    kvc_chat_template_free(t);
}

static void check_model(const kvc_model *m, const char *model, bool spm)
{
    const char *spm_templates[] = { "llama2", "llama2-sys", "mistral-v7", "mistral-v1",
                                    "mistral-v3", "chatml" };
    const char *bpe_templates[] = { "chatml", "llama3", "mistral-v7-tekken" };
    const char **names = spm ? spm_templates : bpe_templates;
    size_t n = spm ? KVC_ARRAY_LEN(spm_templates) : KVC_ARRAY_LEN(bpe_templates);
    for (size_t i = 0; i < n; i++) {
        int same = check_template(m, model, names[i]);
        printf("  %-28s %-18s %d of %zu conversations tokenized as the whole text\n", model,
               names[i], same, KVC_ARRAY_LEN(conv));
    }
    if (spm) {
        check_llama2_example(m);
        check_typed_control(m);
    }
}

int main(void)
{
    /* Llama-2's own vocabulary, when ../shared has it */
    const char *shared = test_shared_dir();
    char path[4200];
    if (shared) {
        snprintf(path, sizeof(path), "%s/vocab/ggml-vocab-llama-spm.gguf", shared);
        gguf_file *f = NULL;
        kvc_err e = { 0 };
        kvc_model m = { 0 };
        if (access(path, R_OK) == 0) {
            CHECKF(gguf_open(path, &f, &e) == KVC_OK && kvc_tokenizer_load(f, &m.tok, &e) ==
                   KVC_OK, "%s: %s", path, e.msg);
            if (m.tok)
                check_model(&m, "ggml-vocab-llama-spm", true);
            kvc_tokenizer_free(m.tok);
            gguf_close(f);
        } else {
            printf("  %s: skipped (absent)\n", path);
        }
    } else {
        printf("  the vocabularies of ../shared: skipped (absent)\n");
    }
    /* generated models: SentencePiece and byte-level BPE */
    char dir[] = "/tmp/kvc_prompt_tokens_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    const char *vocabs[] = { "spm", "bpe" };
    for (size_t k = 0; k < KVC_ARRAY_LEN(vocabs); k++) {
        kvc_gen_params g;
        char err[512];
        kvc_gen_preset("tiny-llama", &g);
        g.vocab = vocabs[k];
        g.vocab_only = true;
        snprintf(path, sizeof(path), "%s/%s.gguf", dir, vocabs[k]);
        CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
        gguf_file *f = NULL;
        kvc_err e = { 0 };
        kvc_model m = { 0 };
        CHECKF(gguf_open(path, &f, &e) == KVC_OK && kvc_tokenizer_load(f, &m.tok, &e) == KVC_OK,
               "%s: %s", path, e.msg);
        if (m.tok)
            check_model(&m, k ? "generated bpe" : "generated spm", k == 0);
        kvc_tokenizer_free(m.tok);
        gguf_close(f);
        unlink(path);
    }
    rmdir(dir);
    return test_done("test_prompt_tokens");
}
