/* tool_calls.h - the tool-call syntax of a chat template: which one a
 * template uses, parsing a model's reply into OpenAI tool_calls, and the
 * grammar that forces a valid call (tool_choice "required" or a named
 * function).
 *
 * Formats (what the template corpus uses):
 *   HERMES   Hermes / Qwen 2.5+ / many others:
 *                <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *            one block per call; text outside the blocks is content.
 *   LLAMA3   Llama 3.1-3.3 JSON calls: the whole reply is a JSON object
 *                {"name": "f", "parameters": {...}}
 *            (optionally after <|python_tag|>; several joined by ";").
 *   MISTRAL  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
 *            and the newer [TOOL_CALLS]f[ARGS]{...}.
 *   HARMONY  gpt-oss: a commentary message addressed to the function,
 *                <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>
 *            (the recipient may also stand before the channel); the text
 *            before the call's message is content (reasoning.h splits it).
 *   QWEN_XML Qwen3-Coder(-Next), Qwen3.5, Qwen3.6 (vLLM's qwen3_coder parser):
 *                <tool_call>\n<function=f>\n<parameter=a>\nvalue\n</parameter>\n
 *                </function>\n</tool_call>
 *            a value is the text between the tags less one newline at each
 *            end, typed by the parameter's schema (kvc_tool_calls_parse);
 *            the templates render past calls' arguments as a mapping.
 * The format of a template is found by rendering a conversation with one
 * tool call through it and looking at what surrounds the call. Each format
 * is a row of one table (tool_calls_internal.h): its parser, hold-back and
 * grammar rules; Qwen3-Coder's XML row is in tool_calls_xml.c. */
#ifndef KVC_TOOL_CALLS_H
#define KVC_TOOL_CALLS_H

#include "chat_template.h"

enum kvc_tool_format {
    KVC_TOOLS_HERMES = 0,    /* also the default when nothing is recognised */
    KVC_TOOLS_LLAMA3 = 1,
    KVC_TOOLS_MISTRAL = 2,
    KVC_TOOLS_HARMONY = 3,   /* forcing: one commentary message to=functions.NAME */
    KVC_TOOLS_QWEN_XML = 4,  /* Qwen3-Coder, Qwen3.5 / 3.6 */
};

/* Append to the cJSON array `calls` one tool call in OpenAI's shape: {"id",
 * "type": "function", "function": {"name", "arguments"}} (args: JSON text),
 * as kvc_tool_calls_parse writes them; the server's dialects translate
 * their clients' calls into it too. */
struct cJSON;
void kvc_tool_call_add(struct cJSON *calls, const char *id, const char *name, const char *args);

/* The format template t renders tool calls in (HERMES when not recognised). */
int kvc_tool_format_detect(const kvc_chat_template *t);
const char *kvc_tool_format_name(int format);       /* "hermes", "llama3-json", "mistral",
                                                       "harmony", "qwen3-coder-xml" */
int kvc_tool_format_from_name(const char *name);    /* -1 when unknown */

/* Parse reply (len bytes) in `format`, keeping at most max_calls calls (0 =
 * all; later ones are dropped, not turned into content). When it holds at
 * least one call:
 * *calls_json gets the OpenAI tool_calls array text ([{"id": "call_...",
 * "type": "function", "function": {"name", "arguments": JSON text}}]) and
 * *content the text outside the calls (trimmed; "" when none); both
 * malloc'd. With none, both are NULL. ids are "call_" + 24 hex digits from
 * id_seed and the call's index. tools_json (the request's tools array, or
 * NULL) types QWEN_XML's parameter values by their schema: "null" is null;
 * a parameter not declared keeps its text; string types keep it; integer /
 * number types are numbers when the text is one; boolean ones are true when
 * the text is "true" (any case), else false; other types are JSON when the
 * text parses (else the text), as vLLM's qwen3_coder parser does.
 * KVC_OK or KVC_ERR_NOMEM. */
int kvc_tool_calls_parse(int format, const char *reply, size_t len, const char *tools_json,
                         uint64_t id_seed, int max_calls, char **calls_json, char **content);

/* Bytes at the end of text[0, len) to hold back from a stream because they
 * are, or may begin, a tool call in `format` (len when a call has begun:
 * nothing more is content until the reply ends). QWEN_XML also holds back
 * the spaces at the end (before those bytes, or alone): the content before
 * a call ends trimmed, as the whole reply's does. */
size_t kvc_tool_calls_holdback(int format, const char *text, size_t len);

/* The grammar (grammar.h dialect, start "root") of a reply that is only tool
 * calls in `format`: one call (several when parallel, up to 8; harmony:
 * always one, a commentary message to=functions.NAME) of the
 * functions of tools_json (the request's tools array) whose name is `only`
 * (NULL = any of them); each call's arguments follow the function's
 * "parameters" schema. *out malloc'd. KVC_ERR_INVALID_ARG naming what is
 * wrong (an unsupported schema keyword and the function, an unknown name, a
 * schema no finite call can follow), KVC_ERR_NOMEM. */
int kvc_tool_calls_grammar(int format, const char *tools_json, const char *only, bool parallel,
                           char **out, kvc_err *err);

#endif
