/* prompt.h - a request's prompt tokens, a function of the request alone
 * (DESIGN.md §3), and the canonical tokens of the conversation as its next
 * request will carry it.
 *
 * The tokens of a chat request are tokenize(render(messages)): the cold run's
 * tokens. Nothing here looks at what a session cached or generated before; the
 * cache is found afterwards by the longest common token prefix of these tokens
 * with what the pool holds. So a warm server and a fresh process feed the model
 * the same tokens, and the answer cannot depend on the cache.
 *
 * Everything here reads only the model's tokenizer and the chat format, both
 * immutable: any thread may call it (the server calls it on its HTTP threads,
 * so the engine thread only computes). */
#ifndef KVC_PROMPT_H
#define KVC_PROMPT_H

#include "chat_template.h"
#include "model.h"

/* A growable token array. */
typedef struct kvc_tokbuf {
    int32_t *v;
    int64_t  n, cap;
} kvc_tokbuf;

int  kvc_tokbuf_reserve(kvc_tokbuf *b, int64_t need);   /* KVC_ERR_NOMEM */
int  kvc_tokbuf_push(kvc_tokbuf *b, int32_t token);     /* KVC_ERR_NOMEM */
void kvc_tokbuf_free(kvc_tokbuf *b);                    /* frees v, zeroes b */

/* Render msgs[0, n) with chat template `tmpl`, with the generation prompt and
 * p's tools and template kwargs (p may be NULL), into a malloc'd string (*out;
 * NULL on failure). KVC_ERR_INVALID_ARG: a bad role, a template that fails
 * (its raise_exception...); KVC_ERR_NOMEM. */
int kvc_prompt_render(const kvc_chat_template *tmpl, const kvc_chat_message *msgs, size_t n,
                      const kvc_chat_params *p, char **out, kvc_err *err);

/* Tokens of prompt text as a cold run has them: BOS as the vocabulary asks,
 * template markup (control-token strings) parsed as control tokens. Appends
 * to *out. KVC_ERR_NOMEM. */
int kvc_prompt_tokenize(const kvc_model *m, const char *text, size_t len, kvc_tokbuf *out,
                        kvc_err *err);

/* The tokens of a chat request into *out (empty): render, tokenize as
 * llama.cpp and transformers do (kvc_tokenize_data: cut only at the
 * template's own control tokens, message content never read as markup unless
 * p->special_in_content, each piece between them tokenized whole). With
 * p->overflow KVC_OVERFLOW_SHIFT, when they plus max_tokens (at least 1)
 * exceed n_ctx, the oldest whole turns (a user message and what follows it up
 * to the next user message) are dropped, a leading system message kept, until
 * they fit; *dropped gets the tokens removed (0 when none were).
 * KVC_ERR_CONTEXT_LENGTH (with the sizes) when even the system prompt and the
 * last user message do not fit; KVC_ERR_INVALID_ARG (a bad role);
 * KVC_ERR_NOMEM. starts (may be NULL; emptied) gets, ascending, where the
 * caller's text of each message begins in *out (the template marks it): the
 * index of the token holding its first byte, less one (a margin for a
 * SentencePiece space or a BOS counted ahead), for recurrent models'
 * snapshots at message starts. */
int kvc_prompt_chat(const kvc_model *m, const kvc_chat_template *tmpl, const kvc_chat_message *msgs, size_t n,
                    const kvc_chat_params *p, int64_t n_ctx, kvc_tokbuf *out, int32_t *dropped,
                    kvc_tokbuf *starts, kvc_err *err);

/* The conversation msgs[0, n) followed by the assistant's `reply`, as the next
 * request will carry it: rendered with a user message after the reply (a
 * tool message when the reply has tool calls; the template may rewrite the
 * reply in history: trim it, drop a reasoning block) and cut where that
 * message's text (its content or call id) begins, so the end-of-turn markup
 * and the next turn's header are included. *out (empty) gets the tokens of
 * that text that begin the next request's tokens whatever its user message
 * says: up to and including the last control token (text is tokenized in
 * runs between control tokens, so nothing after one changes the tokens before
 * it), or, when later, up to the last token that begins a word. Used only to
 * compute ahead of time, never as a request's tokens. reply NULL: msgs[n - 1]
 * is the assistant's reply (e.g. with its tool_calls). p: the request's tools
 * and template kwargs (may be NULL). KVC_ERR_NOMEM,
 * KVC_ERR_INVALID_ARG (a bad role). */
int kvc_prompt_next_turn(const kvc_model *m, const kvc_chat_template *tmpl,
                         const kvc_chat_message *msgs, size_t n, const kvc_chat_params *p,
                         const char *reply, kvc_tokbuf *out, kvc_err *err);

#endif
