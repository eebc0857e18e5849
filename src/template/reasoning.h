/* reasoning.h - where a reply's reasoning (thinking) is, for templates that
 * write it between <think> and </think> (Qwen3, Qwen3.5, DeepSeek-R1 and
 * their distills, QwQ, ...), and for gpt-oss's harmony format, as
 * llama-server's reasoning_format "auto" splits them.
 *
 * Harmony (KVC_THINK_HARMONY): the reply (after the generation prompt
 * "<|start|>assistant") is a run of messages "<|channel|>NAME<|message|>
 * TEXT<|end|><|start|>assistant...". The reasoning is the text of a first
 * "analysis" message, the content the text after "<|channel|>final
 * <|message|>" up to the next markup (<|end|>, <|start|>, ...); anything
 * else (a commentary message that calls a tool: tool_calls.h's HARMONY
 * format) is neither. A reply without a channel is content up to its first
 * markup: no harmony markup is ever part of the reasoning or the content.
 * With a gpt-oss vocabulary the markup comes as whole tokens
 * (kvc_tokenizer_is_markup) that the reply's text keeps for this parser.
 *
 * A reply either begins inside the thinking block (the template's
 * generation prompt ended with "<think>": `open`) or may begin with
 * "<think>" after whitespace. The block ends at "</think>"; the content
 * starts after it and the whitespace that follows. A reply that never opens
 * the block is all content. While a reply is still coming (`final` false)
 * the answer holds back what may still be the start of a tag, so that a
 * stream never sends "</thi" as reasoning or "<thi" as content. */
#ifndef KVC_REASONING_H
#define KVC_REASONING_H

#include <stdbool.h>
#include <stddef.h>

/* How a reply's reasoning is written (the `mode` of kvc_think_find). */
enum kvc_think_mode {
    KVC_THINK_TAGS    = 0,     /* <think>...</think>, the reply may open it */
    KVC_THINK_INSIDE  = 1,     /* ... the reply begins inside it */
    KVC_THINK_HARMONY = 2,     /* harmony channels */
};

enum kvc_think_state {
    KVC_THINK_UNDECIDED = 0,   /* only whitespace or a part of "<think>" so far */
    KVC_THINK_NONE      = 1,   /* no reasoning: everything is content */
    KVC_THINK_OPEN      = 2,   /* inside the block: no content yet */
    KVC_THINK_CLOSED    = 3,   /* the block ended: content from c_begin */
};

typedef struct kvc_think_span {
    int    state;              /* enum kvc_think_state */
    size_t r_begin, r_end;     /* the reasoning text [r_begin, r_end) (empty when none;
                                  while OPEN and not final, up to what may begin
                                  "</think>") */
    size_t c_begin;            /* NONE or CLOSED: where the content starts (len when
                                  nothing of it came yet) */
    size_t c_end;              /* where it ends: len, but for harmony the end of the
                                  final message (the first markup after c_begin), and
                                  while not final, before what may begin markup */
} kvc_think_span;

/* The span of text[0, len) written in `mode` (enum kvc_think_mode; a bool
 * "the reply begins inside <think>" is TAGS or INSIDE). final: the reply is
 * whole (UNDECIDED becomes NONE; an OPEN block runs to the end). Harmony:
 * CLOSED once the analysis message ended (or when the reply began with
 * another channel), its c_begin len while no final channel has begun. */
kvc_think_span kvc_think_find(const char *text, size_t len, int mode, bool final);

/* Whether a rendered prompt leaves the reply inside a thinking block: it
 * ends with "<think>" and whitespace. */
bool kvc_think_prompt_open(const char *prompt);

#endif
