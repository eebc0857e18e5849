/* chat_template.h - turn a list of chat messages (with tools) into prompt text.
 *
 * A model's chat template is its own Jinja2 source (`tokenizer.chat_template`,
 * and `tokenizer.chat_template.tool_use` for requests with tools); kvchat runs
 * it with its Jinja engine (jinja.h) exactly as transformers renders it with
 * Python's jinja2. Built-in C formatters remain for models without a template
 * and for a format forced by name (--chat-template NAME).
 *
 * THE TEMPLATE OBJECT (kvc_chat_template_new / _apply) is what callers use:
 *
 *   Variables, as transformers passes them: `messages` (each with role,
 *   content and, when given, name, tool_call_id, tool_calls, reasoning_content;
 *   a tool call's function.arguments given as a JSON string is passed as the
 *   object it encodes, as llama.cpp does, since templates iterate over it),
 *   `tools` (when given; a function without `parameters`, or with null, is
 *   given the empty schema {"type": "object", "properties": {}}, as OpenAI
 *   reads it: templates such as Qwen3-Coder's read tool.parameters.properties
 *   and fail without it, under Python's jinja2 too), `add_generation_prompt`,
 *   `bos_token`, `eos_token`, and every member of the kwargs object
 *   (`enable_thinking`...) as a variable of its own. A message's NULL
 *   content is passed as "".
 *
 *   Provenance: kvc_rendered.content lists the ranges of the text that came
 *   from the caller (message fields, tools, kwargs). Tokenize those without
 *   special-token parsing and the rest with it, so text a user typed never
 *   becomes a control token.
 *
 *   BOS: with params.strip_bos (the tokenizer adds BOS itself), a rendering
 *   that begins with bos_text has it removed, so BOS is not doubled
 *   (llama.cpp's rule). End-of-turn markers in the history are written as
 *   text: tokenize the template ranges with parse_special.
 *
 *   Errors: a template that fails (its raise_exception, an undefined value,
 *   a type error, a limit) gives KVC_ERR_INVALID_ARG with "template line N:
 *   ..."; raise_exception's message follows JINJA_RAISE_PREFIX. A server
 *   answers 400 with it.
 *
 * THE BUILT-IN FORMATS. Rules every built-in format follows:
 *
 *   BOS. The rendered text never contains the BOS token's text ("<s>",
 *   "<|begin_of_text|>", "<bos>"), even where the Jinja template writes
 *   {{ bos_token }} first: tokenize the text with add_special = true and the
 *   tokenizer adds BOS when the vocabulary asks for it (llama.cpp's rule; it
 *   avoids a double BOS). End-of-turn markers inside the history ("<|im_end|>",
 *   "</s>", "<|eot_id|>", ...) are written as text: tokenize with
 *   parse_special = true.
 *
 *   Prefix stability (what the KV cache lives on, DESIGN.md §3). For messages
 *   m[0..k) ending with a user message, and an assistant reply R:
 *       render(m, gen = true) + reply_sep + R
 *   is a byte prefix of
 *       render(m + {assistant: R} + {user: next}, gen = true)
 *   where reply_sep is kvc_chat_template_reply_sep() ("" for most formats).
 *   Two documented exceptions:
 *     - formats that trim message content (llama3, gemma, llama2-sys-strip,
 *       mistral-v3 for assistant turns) hold it only when R has no leading or
 *       trailing whitespace, since the history carries trim(R);
 *     - a system message that is not first: gemma folds it into the next user
 *       turn, so a trailing system message only appears once a user follows.
 *   Where a model's official template rewrites earlier turns we follow
 *   llama.cpp's built-in formatter instead, which does not: Mistral v3's
 *   template moves the system prompt into the *last* user turn (we keep it in
 *   the first); DeepSeek-R1/V3.1 templates strip "<think>...</think>" from
 *   earlier assistant turns (we keep the content as given; a client that
 *   strips it itself breaks the text prefix, and the session falls back to the
 *   token prefix); Llama 3.1+ templates write a dated system header we do not
 *   reproduce.
 *
 *   reply_sep. Some templates write ' ' + content after the generation prompt
 *   ("[/INST] Hi</s>", "Assistant: Hi"). The generation prompt ends without
 *   that space (a prompt ending in a lone space tokenizes into a token the
 *   model never saw there); the model generates it as part of its first
 *   token. So the generated text begins with reply_sep, and the message
 *   content returned to a client is the generated text with one leading
 *   reply_sep removed; sent back, it renders to the same bytes.
 *
 * Roles: "system", "user", "assistant"; "developer" (OpenAI's newer name) is
 * taken as "system". Formats whose markup names the role (chatml, phi4,
 * llama3) also accept any other role made of [A-Za-z0-9_-] ("tool",
 * "ipython") and write it as given; the others reject it with
 * KVC_ERR_INVALID_ARG naming the role. */
#ifndef KVC_CHAT_TEMPLATE_H
#define KVC_CHAT_TEMPLATE_H

#include "common.h"

/* ---------------------------------------------------------------- the template object */

typedef struct kvc_rendered {
    char          *text;       /* malloc'd, NUL-terminated */
    size_t         len;
    kvc_text_span *content;    /* malloc'd; sorted, non-overlapping ranges of text that came
                                  from the caller's data (NULL when none) */
    size_t         n_content;
} kvc_rendered;

void kvc_rendered_free(kvc_rendered *r);   /* NULL ok; zeroes it */

typedef struct kvc_chat_template kvc_chat_template;

typedef struct kvc_chat_template_params {
    const char *jinja;           /* tokenizer.chat_template (borrowed, copied); NULL = none */
    const char *jinja_tool_use;  /* tokenizer.chat_template.tool_use, for requests with tools;
                                    NULL = none */
    const char *name;            /* a built-in format name to use instead; NULL = the model's */
    const char *bos_text;        /* bos_token's text; NULL = "" */
    const char *eos_text;        /* eos_token's text; NULL = "" */
    bool        strip_bos;       /* the tokenizer adds BOS: drop a leading bos_text */
    const char *origin;          /* where jinja came from, for describe(); NULL = "the model's" */
} kvc_chat_template_params;

/* Compile the template to use. With p->name, that built-in format; else the
 * model's Jinja source; else (no template) ChatML. Fails with
 * KVC_ERR_INVALID_ARG for an unknown name or a template that does not
 * compile (err: "chat template line N: ..."). *out is freed with
 * kvc_chat_template_free; it is only read afterwards, so several threads may
 * apply it at once. */
int kvc_chat_template_new(const kvc_chat_template_params *p, kvc_chat_template **out,
                          kvc_err *err);
void kvc_chat_template_free(kvc_chat_template *t);   /* NULL ok */

/* Render msgs[0, n). tools_json: the request's `tools` array as JSON text, or
 * NULL; kwargs_json: a JSON object whose members become template variables
 * (chat_template_kwargs), or NULL. Fills *out (free with kvc_rendered_free);
 * on failure *out is zeroed and err says why (see the header comment).
 * Built-in formats ignore tools and kwargs. */
int kvc_chat_template_apply(const kvc_chat_template *t, const kvc_chat_message *msgs, size_t n,
                            const char *tools_json, const char *kwargs_json,
                            bool add_generation_prompt, kvc_rendered *out, kvc_err *err);

/* Template kwargs: the members of `defaults` then those of `request` (which
 * win per key when both have one), as one JSON object's text; malloc'd.
 * Either may be NULL (then a copy of the other; NULL when both are).
 * Returns KVC_ERR_INVALID_ARG when one is not a JSON object. */
int kvc_chat_kwargs_merge(const char *defaults, const char *request, char **out, kvc_err *err);

/* What is in use, for logs: "jinja (the model's tokenizer.chat_template)",
 * "built-in chatml (the model has no chat template)", ... Static or owned by t. */
const char *kvc_chat_template_describe(const kvc_chat_template *t);
/* Stop strings and reply separator (see below) of the template's family:
 * for Jinja templates those of the built-in format the source is recognised
 * as, else none and "". */
const char *const *kvc_chat_template_stop_list(const kvc_chat_template *t);
const char *kvc_chat_template_sep(const kvc_chat_template *t);

/* ---------------------------------------------------------------- built-in formats */

typedef struct kvc_chat_msg {
    const char *role;      /* "system", "user", "assistant", ... (borrowed) */
    const char *content;   /* UTF-8 text, NUL-terminated; NULL is taken as "" */
} kvc_chat_msg;

enum kvc_chat_tmpl {
    KVC_TMPL_UNKNOWN = -1,
    KVC_TMPL_CHATML,           /* Qwen, SmolLM, Hermes: <|im_start|>role\n...<|im_end|>\n */
    KVC_TMPL_LLAMA3,           /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    KVC_TMPL_LLAMA2,           /* [INST] user [/INST]reply</s>; system as plain "text\n" */
    KVC_TMPL_LLAMA2_SYS,       /* as LLAMA2, system in <<SYS>>\n...\n<</SYS>>\n\n */
    KVC_TMPL_LLAMA2_SYS_BOS,   /* as LLAMA2_SYS, later turns open with <s>[INST] */
    KVC_TMPL_LLAMA2_SYS_STRIP, /* as LLAMA2_SYS, every content trimmed (Meta's Llama-2-chat) */
    KVC_TMPL_MISTRAL_V1,       /* " [INST] user [/INST] reply</s>" */
    KVC_TMPL_MISTRAL_V3,       /* "[INST] user[/INST] reply</s>", reply trimmed */
    KVC_TMPL_MISTRAL_V3_TEKKEN,/* "[INST]user[/INST]reply</s>" */
    KVC_TMPL_MISTRAL_V7,       /* "[SYSTEM_PROMPT] s[/SYSTEM_PROMPT][INST] u[/INST] reply</s>" */
    KVC_TMPL_MISTRAL_V7_TEKKEN,/* as V7 without the spaces */
    KVC_TMPL_PHI3,             /* <|role|>\n...<|end|>\n */
    KVC_TMPL_PHI4,             /* <|im_start|>role<|im_sep|>...<|im_end|> */
    KVC_TMPL_GEMMA,            /* <start_of_turn>user|model\n...<end_of_turn>\n, system folded */
    KVC_TMPL_ZEPHYR,           /* <|role|>\n...</s>\n (HuggingFaceH4 zephyr) */
    KVC_TMPL_ZEPHYR_ENDOFTEXT, /* <|role|>\n...<|endoftext|>\n (StableLM 2 zephyr) */
    KVC_TMPL_DEEPSEEK,         /* deepseek-coder: ### Instruction:\n...\n### Response:\n;
                                  without a system message, the template's own */
    KVC_TMPL_DEEPSEEK2,        /* User: ...\n\nAssistant: reply<｜end▁of▁sentence｜> */
    KVC_TMPL_DEEPSEEK3,        /* <｜User｜>...<｜Assistant｜>reply<｜end▁of▁sentence｜> (V3, R1) */
    KVC_TMPL_COUNT
};

/* The format a Jinja chat template string belongs to, or KVC_TMPL_UNKNOWN for
 * NULL, "" and templates we do not recognise (callers fall back to ChatML).
 * A string that is exactly a format name ("llama3") gives that format. Only
 * substrings are inspected; nothing is executed. The markers are llama.cpp's
 * (llm_chat_detect_template) with two differences: a "<|user|>" /
 * "<|assistant|>" template that ends turns with eos_token or "</s>" is Zephyr
 * (llama.cpp: GLM-Edge), one with a literal "<|endoftext|>" is
 * zephyr-endoftext; and Mistral v7 templates writing '[INST]' without the
 * space are v7-tekken. A Zephyr template that writes {{ eos_token }} is
 * taken as "</s>" (zephyr-7b); a model whose EOS is "<|endoftext|>" (StableLM
 * 2 Zephyr) needs the name "zephyr-endoftext". */
int kvc_chat_template_detect(const char *jinja);

/* The format named `name` ("chatml", "llama3", "llama2", "llama2-sys",
 * "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
 * "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4",
 * "gemma", "zephyr", "zephyr-endoftext", "deepseek", "deepseek2",
 * "deepseek3"), or KVC_TMPL_UNKNOWN. The names are llama.cpp's where it has
 * the format, except that "zephyr" here ends turns with "</s>" (llama.cpp's
 * "zephyr" is our "zephyr-endoftext"). */
int kvc_chat_template_from_name(const char *name);

/* Static name of a format ("chatml"); "unknown" for anything out of range. */
const char *kvc_chat_template_name(int tmpl);

/* Render msgs[0, n) as prompt text in format `tmpl`. With
 * add_generation_prompt the text ends with the opening of an assistant turn
 * ("<|im_start|>assistant\n"); formats whose user turn already ends where the
 * reply begins ("[/INST]") add nothing.
 * On success returns KVC_OK and stores in *out a malloc'd NUL-terminated
 * string the caller frees. On failure *out is NULL and the return is
 * KVC_ERR_INVALID_ARG (unknown tmpl, NULL msgs with n > 0, a NULL, empty or
 * unsupported role; err names the message index and role) or
 * KVC_ERR_NOMEM. msgs is only read. */
int kvc_chat_render(int tmpl, const kvc_chat_msg *msgs, size_t n,
                    bool add_generation_prompt, char **out, kvc_err *err);
/* As kvc_chat_render, with the ranges of message content in out->content. */
int kvc_chat_render_spans(int tmpl, const kvc_chat_msg *msgs, size_t n,
                          bool add_generation_prompt, kvc_rendered *out, kvc_err *err);

/* NULL-terminated list of static strings that end an assistant turn in this
 * format, or open the next one ("<|im_end|>", "<|im_start|>"), to match
 * against generated text in addition to the tokenizer's end-of-generation
 * tokens. Only the format's markup is listed, never plain words ("User:").
 * An empty list (never NULL) for unknown formats. */
const char *const *kvc_chat_template_stops(int tmpl);

/* The text a format writes between its generation prompt and the reply
 * content (see reply_sep above): " " for mistral-v1, mistral-v3, mistral-v7
 * and deepseek2, "" for the others and for unknown formats. Static. */
const char *kvc_chat_template_reply_sep(int tmpl);

#endif
