/* chat_template.c - recognise a Jinja chat template, render messages with a
 * built-in formatter. See chat_template.h for the rules every format keeps. */
#include "chat_template.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- formats */

typedef struct tmpl_info {
    const char        *name;       /* kvc_chat_template_from_name key */
    const char *const *stops;      /* NULL-terminated, see kvc_chat_template_stops */
    const char        *reply_sep;  /* see kvc_chat_template_reply_sep */
    bool               any_role;   /* roles other than system/user/assistant pass through */
} tmpl_info;

#define STOPS(...) (const char *const[]){ __VA_ARGS__, NULL }

static const char *const no_stops[] = { NULL };

static const tmpl_info TMPL[KVC_TMPL_COUNT] = {
    [KVC_TMPL_CHATML]            = { "chatml",            STOPS("<|im_end|>", "<|im_start|>"), "", true },
    [KVC_TMPL_LLAMA3]            = { "llama3",            STOPS("<|eot_id|>", "<|start_header_id|>", "<|eom_id|>"), "", true },
    [KVC_TMPL_LLAMA2]            = { "llama2",            STOPS("</s>", "[INST]"), "", false },
    [KVC_TMPL_LLAMA2_SYS]        = { "llama2-sys",        STOPS("</s>", "[INST]"), "", false },
    [KVC_TMPL_LLAMA2_SYS_BOS]    = { "llama2-sys-bos",    STOPS("</s>", "[INST]"), "", false },
    [KVC_TMPL_LLAMA2_SYS_STRIP]  = { "llama2-sys-strip",  STOPS("</s>", "[INST]"), "", false },
    [KVC_TMPL_MISTRAL_V1]        = { "mistral-v1",        STOPS("</s>", "[INST]"), " ", false },
    [KVC_TMPL_MISTRAL_V3]        = { "mistral-v3",        STOPS("</s>", "[INST]"), " ", false },
    [KVC_TMPL_MISTRAL_V3_TEKKEN] = { "mistral-v3-tekken", STOPS("</s>", "[INST]"), "", false },
    [KVC_TMPL_MISTRAL_V7]        = { "mistral-v7",        STOPS("</s>", "[INST]"), " ", false },
    [KVC_TMPL_MISTRAL_V7_TEKKEN] = { "mistral-v7-tekken", STOPS("</s>", "[INST]"), "", false },
    [KVC_TMPL_PHI3]              = { "phi3",              STOPS("<|end|>", "<|endoftext|>", "<|user|>"), "", false },
    [KVC_TMPL_PHI4]              = { "phi4",              STOPS("<|im_end|>", "<|im_start|>"), "", true },
    [KVC_TMPL_GEMMA]             = { "gemma",             STOPS("<end_of_turn>", "<start_of_turn>"), "", false },
    [KVC_TMPL_ZEPHYR]            = { "zephyr",            STOPS("</s>", "<|user|>"), "", false },
    [KVC_TMPL_ZEPHYR_ENDOFTEXT]  = { "zephyr-endoftext",  STOPS("<|endoftext|>", "<|user|>"), "", false },
    [KVC_TMPL_DEEPSEEK]          = { "deepseek",          STOPS("<|EOT|>"), "", false },
    [KVC_TMPL_DEEPSEEK2]         = { "deepseek2",         STOPS("<｜end▁of▁sentence｜>"), " ", false },
    [KVC_TMPL_DEEPSEEK3]         = { "deepseek3",         STOPS("<｜end▁of▁sentence｜>", "<｜User｜>"), "", false },
};

static bool tmpl_valid(int tmpl)
{
    return tmpl >= 0 && tmpl < KVC_TMPL_COUNT;
}

const char *kvc_chat_template_name(int tmpl)
{
    return tmpl_valid(tmpl) ? TMPL[tmpl].name : "unknown";
}

int kvc_chat_template_from_name(const char *name)
{
    if (!name)
        return KVC_TMPL_UNKNOWN;
    for (int i = 0; i < KVC_TMPL_COUNT; i++)
        if (strcmp(name, TMPL[i].name) == 0)
            return i;
    return KVC_TMPL_UNKNOWN;
}

const char *const *kvc_chat_template_stops(int tmpl)
{
    return tmpl_valid(tmpl) ? TMPL[tmpl].stops : no_stops;
}

const char *kvc_chat_template_reply_sep(int tmpl)
{
    return tmpl_valid(tmpl) ? TMPL[tmpl].reply_sep : "";
}

/* ---------------------------------------------------------------- detection */

static bool has(const char *s, const char *needle)
{
    return strstr(s, needle) != NULL;
}

/* The [INST] family: Mistral's official v1/v3/v7 templates, then Llama 2 and
 * the templates derived from it. The markers are llama.cpp's. */
static int detect_inst(const char *t)
{
    if (has(t, "[SYSTEM_PROMPT]")) {
        /* v7 writes '[INST] ' + content, v7-tekken '[INST]' + content */
        if (has(t, "[INST]'") || has(t, "[INST]\""))
            return KVC_TMPL_MISTRAL_V7_TEKKEN;
        return KVC_TMPL_MISTRAL_V7;
    }
    if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
        if (has(t, " [INST]"))
            return KVC_TMPL_MISTRAL_V1;
        if (has(t, "\"[INST]\""))
            return KVC_TMPL_MISTRAL_V3_TEKKEN;
        return KVC_TMPL_MISTRAL_V3;
    }
    if (has(t, "content.strip()"))
        return KVC_TMPL_LLAMA2_SYS_STRIP;
    if (has(t, "bos_token + '[INST]"))
        return KVC_TMPL_LLAMA2_SYS_BOS;
    if (has(t, "<<SYS>>"))
        return KVC_TMPL_LLAMA2_SYS;
    return KVC_TMPL_LLAMA2;
}

/* "<|user|>" + "<|assistant|>" templates: Zephyr, but also GLM-Edge, Falcon 3
 * and EXAONE MoE, which we do not render. Zephyr ends every turn with EOS. */
static int detect_role_pipes(const char *t)
{
    if (has(t, "[gMASK]") || has(t, "<|tool_declare|>") || has(t, "<|begin_of_image|>"))
        return KVC_TMPL_UNKNOWN;
    if (has(t, "<|endoftext|>"))
        return KVC_TMPL_ZEPHYR_ENDOFTEXT;
    if (has(t, "</s>") || has(t, "eos_token"))
        return KVC_TMPL_ZEPHYR;
    return KVC_TMPL_UNKNOWN;
}

int kvc_chat_template_detect(const char *t)
{
    if (!t || !*t)
        return KVC_TMPL_UNKNOWN;
    int byname = kvc_chat_template_from_name(t);
    if (byname != KVC_TMPL_UNKNOWN)
        return byname;

    if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>"))
            return KVC_TMPL_PHI4;
        if (has(t, "<end_of_utterance>"))   /* SmolVLM: <|im_start|> is its BOS, not ChatML */
            return KVC_TMPL_UNKNOWN;
        return KVC_TMPL_CHATML;
    }
    if (strncmp(t, "mistral", 7) == 0 || has(t, "[INST]"))
        return detect_inst(t);
    if (has(t, "<|assistant|>") && has(t, "<|end|>"))
        return KVC_TMPL_PHI3;
    if (has(t, "<|user|>") && (has(t, "<|assistant|>") || has(t, "<|endoftext|>")))
        return detect_role_pipes(t);
    if (has(t, "<start_of_turn>"))
        return KVC_TMPL_GEMMA;
    if (has(t, "### Instruction:") && has(t, "<|EOT|>"))
        return KVC_TMPL_DEEPSEEK;
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
        return KVC_TMPL_LLAMA3;
    if (has(t, "'Assistant: ' + message['content'] + eos_token"))
        return KVC_TMPL_DEEPSEEK2;
    if (has(t, "<｜Assistant｜>") && has(t, "<｜User｜>") && has(t, "<｜end▁of▁sentence｜>")) {
        if (has(t, "<｜hy_"))                /* Hunyuan borrows the markers */
            return KVC_TMPL_UNKNOWN;
        return KVC_TMPL_DEEPSEEK3;
    }
    return KVC_TMPL_UNKNOWN;
}

/* ---------------------------------------------------------------- text builder */

typedef struct sbuf {
    char  *p;       /* NUL-terminated once anything was appended */
    size_t len;
    size_t cap;
    bool   oom;     /* an append failed; the text is incomplete */
    kvc_text_span *sp;   /* ranges of p that are message content (sorted, merged) */
    size_t nsp, capsp;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n)
{
    kvc_text_append(&b->p, &b->len, &b->cap, &b->oom, s, n);
}

static void sb_add(sbuf *b, const char *s)
{
    sb_addn(b, s, strlen(s));
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Append s without leading and trailing ASCII whitespace (Jinja's |trim,
 * Python's str.strip() on the text these templates see). */
static void sb_add_trim(sbuf *b, const char *s)
{
    size_t n = strlen(s);
    while (n && is_space(*s))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    sb_addn(b, s, n);
}

/* Record [off, off + n) as message content, merging with an adjacent range. */
static void sb_mark(sbuf *b, size_t off, size_t n)
{
    if (b->oom || !n)
        return;
    if (b->nsp && b->sp[b->nsp - 1].off + b->sp[b->nsp - 1].len == off) {
        b->sp[b->nsp - 1].len += n;
        return;
    }
    if (!kvc_grow((void **)&b->sp, &b->capsp, b->nsp, sizeof(*b->sp))) {
        b->oom = true;
        return;
    }
    b->sp[b->nsp++] = (kvc_text_span){ off, n };
}

/* Append message content (trimmed when trim), recording its range. */
static void sb_content(sbuf *b, const char *s, bool trim)
{
    size_t at = b->len;
    if (trim)
        sb_add_trim(b, s);
    else
        sb_add(b, s);
    sb_mark(b, at, b->len - at);
}

static void sb_content_n(sbuf *b, const char *s, size_t n)
{
    size_t at = b->len;
    sb_addn(b, s, n);
    sb_mark(b, at, b->len - at);
}

/* ---------------------------------------------------------------- roles */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_OTHER };

typedef struct msg {
    enum role   role;
    const char *name;      /* role as written in markup ("developer" -> "system") */
    const char *content;   /* never NULL */
} msg;

static bool role_name_ok(const char *r)
{
    size_t n = 0;
    for (; r[n]; n++) {
        char c = r[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return n > 0 && n <= 64;
}

/* Classify msgs[i] for format tmpl; fills *m or fails naming the message. */
static int classify(int tmpl, const kvc_chat_msg *in, size_t i, msg *m, kvc_err *err)
{
    const char *r = in->role;
    if (!r || !*r)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "chat message %zu: empty role", i);
    m->content = in->content ? in->content : "";
    m->name = r;
    if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0) {
        m->role = ROLE_SYSTEM;
        m->name = "system";
    } else if (strcmp(r, "user") == 0) {
        m->role = ROLE_USER;
    } else if (strcmp(r, "assistant") == 0) {
        m->role = ROLE_ASSISTANT;
    } else if (TMPL[tmpl].any_role && role_name_ok(r)) {
        m->role = ROLE_OTHER;
    } else {
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "chat message %zu: role '%.64s' not supported by the %s template",
                        i, r, TMPL[tmpl].name);
    }
    return KVC_OK;
}

/* ---------------------------------------------------------------- formatters
 *
 * Each writes msgs[0, n) and, when gen, the opening of the assistant turn.
 * Facts about the formats (markers, spacing, trimming) follow llama.cpp's
 * built-in formatters (src/llama-chat.cpp) and the official templates. */

typedef void (*format_fn)(int tmpl, const msg *m, size_t n, bool gen, sbuf *b);

/* <|im_start|>role\ncontent<|im_end|>\n  (phi4: role<|im_sep|>content<|im_end|>) */
static void fmt_chatml(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    const char *sep = tmpl == KVC_TMPL_PHI4 ? "<|im_sep|>" : "\n";
    const char *end = tmpl == KVC_TMPL_PHI4 ? "<|im_end|>" : "<|im_end|>\n";
    for (size_t i = 0; i < n; i++) {
        sb_add(b, "<|im_start|>");
        sb_add(b, m[i].name);
        sb_add(b, sep);
        sb_content(b, m[i].content, false);
        sb_add(b, end);
    }
    if (gen) {
        sb_add(b, "<|im_start|>assistant");
        sb_add(b, sep);
    }
}

/* <|start_header_id|>role<|end_header_id|>\n\n trim(content) <|eot_id|>
 * The official template begins with {{ bos_token }}: left to the tokenizer. */
static void fmt_llama3(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        sb_add(b, "<|start_header_id|>");
        sb_add(b, m[i].name);
        sb_add(b, "<|end_header_id|>\n\n");
        sb_content(b, m[i].content, true);
        sb_add(b, "<|eot_id|>");
    }
    if (gen)
        sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST]reply</s>[INST] user [/INST]
 * The generation prompt is empty: a user turn already ends at [/INST]. */
static void fmt_llama2(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    bool sys_tags = tmpl != KVC_TMPL_LLAMA2;
    bool bos_in_history = tmpl == KVC_TMPL_LLAMA2_SYS_BOS;
    bool strip = tmpl == KVC_TMPL_LLAMA2_SYS_STRIP;
    bool in_turn = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_turn) {
            /* the first turn's <s> is the tokenizer's BOS */
            sb_add(b, bos_in_history && i > 0 ? "<s>[INST] " : "[INST] ");
            in_turn = true;
        }
        if (m[i].role == ROLE_SYSTEM) {
            sb_add(b, sys_tags ? "<<SYS>>\n" : "");
            sb_content(b, m[i].content, strip);
            sb_add(b, sys_tags ? "\n<</SYS>>\n\n" : "\n");
        } else if (m[i].role == ROLE_USER) {
            sb_content(b, m[i].content, strip);
            sb_add(b, " [/INST]");
        } else {
            sb_content(b, m[i].content, strip);
            sb_add(b, "</s>");
            in_turn = false;
        }
    }
    (void)gen;
}

/* Mistral's official v1 / v3 / v3-tekken layouts (llama.cpp's formatter: the
 * system prompt stays where it is instead of moving to the last user turn).
 *   v1:        " [INST] sys\n\nuser [/INST] reply</s>"
 *   v3:        "[INST] sys\n\nuser[/INST] trim(reply)</s>"
 *   v3-tekken: "[INST]sys\n\nuser[/INST]reply</s>" */
static void fmt_mistral(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    const char *lead = tmpl == KVC_TMPL_MISTRAL_V1 ? " " : "";
    const char *trail = tmpl == KVC_TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
    bool trim_reply = tmpl == KVC_TMPL_MISTRAL_V3;
    bool in_turn = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_turn) {
            sb_add(b, lead);
            sb_add(b, "[INST]");
            sb_add(b, trail);
            in_turn = true;
        }
        if (m[i].role == ROLE_SYSTEM) {
            sb_content(b, m[i].content, false);
            sb_add(b, "\n\n");
        } else if (m[i].role == ROLE_USER) {
            sb_content(b, m[i].content, false);
            sb_add(b, lead);
            sb_add(b, "[/INST]");
        } else {
            sb_add(b, trail);
            sb_content(b, m[i].content, trim_reply);
            sb_add(b, "</s>");
            in_turn = false;
        }
    }
    (void)gen;
}

/* v7:  "[SYSTEM_PROMPT] sys[/SYSTEM_PROMPT][INST] user[/INST] reply</s>"
 * v7-tekken: the same without the spaces. */
static void fmt_mistral_v7(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    const char *sp = tmpl == KVC_TMPL_MISTRAL_V7 ? " " : "";
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == ROLE_SYSTEM) {
            sb_add(b, "[SYSTEM_PROMPT]");
            sb_add(b, sp);
            sb_content(b, m[i].content, false);
            sb_add(b, "[/SYSTEM_PROMPT]");
        } else if (m[i].role == ROLE_USER) {
            sb_add(b, "[INST]");
            sb_add(b, sp);
            sb_content(b, m[i].content, false);
            sb_add(b, "[/INST]");
        } else {
            sb_add(b, sp);
            sb_content(b, m[i].content, false);
            sb_add(b, "</s>");
        }
    }
    (void)gen;
}

/* <|role|>\ncontent END\n, generation prompt <|assistant|>\n
 *   phi3: END = <|end|>;  zephyr: </s>;  zephyr-endoftext: <|endoftext|> */
static void fmt_role_pipes(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    const char *end = tmpl == KVC_TMPL_PHI3   ? "<|end|>\n"
                    : tmpl == KVC_TMPL_ZEPHYR ? "</s>\n"
                                              : "<|endoftext|>\n";
    for (size_t i = 0; i < n; i++) {
        sb_add(b, "<|");
        sb_add(b, m[i].name);
        sb_add(b, "|>\n");
        sb_content(b, m[i].content, false);
        sb_add(b, end);
    }
    if (gen)
        sb_add(b, "<|assistant|>\n");
}

/* <start_of_turn>user\n[trim(sys)\n\n]trim(content)<end_of_turn>\n
 * <start_of_turn>model\ntrim(reply)<end_of_turn>\n
 * Gemma has no system role: system text waits for the next user turn. */
static void fmt_gemma(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    sbuf sys = { 0 };
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == ROLE_SYSTEM) {
            sb_add_trim(&sys, m[i].content);
            continue;
        }
        bool model = m[i].role == ROLE_ASSISTANT;
        sb_add(b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (!model && sys.len) {
            sb_content_n(b, sys.p, sys.len);
            sb_add(b, "\n\n");
            sys.len = 0;
        }
        sb_content(b, m[i].content, true);
        sb_add(b, "<end_of_turn>\n");
    }
    if (sys.oom)
        b->oom = true;
    free(sys.p);
    if (gen)
        sb_add(b, "<start_of_turn>model\n");
}

/* deepseek-coder-instruct: system text as is, then
 * "### Instruction:\nuser\n" "### Response:\nreply\n<|EOT|>\n".
 * Without a system message the official template writes its own; so do we. */
static const char DEEPSEEK_CODER_SYSTEM[] =
    "You are an AI programming assistant, utilizing the Deepseek Coder model, developed by "
    "Deepseek Company, and you only answer questions related to computer science. For "
    "politically sensitive questions, security and privacy issues, and other non-computer "
    "science questions, you will refuse to answer\n";

static void fmt_deepseek(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    bool has_system = false;
    for (size_t i = 0; i < n; i++)
        has_system |= m[i].role == ROLE_SYSTEM;
    if (!has_system)
        sb_add(b, DEEPSEEK_CODER_SYSTEM);
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == ROLE_SYSTEM) {
            sb_content(b, m[i].content, false);
        } else if (m[i].role == ROLE_USER) {
            sb_add(b, "### Instruction:\n");
            sb_content(b, m[i].content, false);
            sb_add(b, "\n");
        } else {
            sb_add(b, "### Response:\n");
            sb_content(b, m[i].content, false);
            sb_add(b, "\n<|EOT|>\n");
        }
    }
    if (gen)
        sb_add(b, "### Response:\n");
}

/* DeepSeek-V2: "sys\n\nUser: user\n\nAssistant: reply<｜end▁of▁sentence｜>",
 * generation prompt "Assistant:" (reply_sep " "). */
static void fmt_deepseek2(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == ROLE_SYSTEM) {
            sb_content(b, m[i].content, false);
            sb_add(b, "\n\n");
        } else if (m[i].role == ROLE_USER) {
            sb_add(b, "User: ");
            sb_content(b, m[i].content, false);
            sb_add(b, "\n\n");
        } else {
            sb_add(b, "Assistant: ");
            sb_content(b, m[i].content, false);
            sb_add(b, "<｜end▁of▁sentence｜>");
        }
    }
    if (gen)
        sb_add(b, "Assistant:");
}

/* DeepSeek-V3 / R1: "sys<｜User｜>user<｜Assistant｜>reply<｜end▁of▁sentence｜>".
 * The official templates write the system prompt right after BOS with no
 * separator (llama.cpp's formatter adds "\n\n"; we follow the templates). */
static void fmt_deepseek3(int tmpl, const msg *m, size_t n, bool gen, sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == ROLE_SYSTEM) {
            sb_content(b, m[i].content, false);
        } else if (m[i].role == ROLE_USER) {
            sb_add(b, "<｜User｜>");
            sb_content(b, m[i].content, false);
        } else {
            sb_add(b, "<｜Assistant｜>");
            sb_content(b, m[i].content, false);
            sb_add(b, "<｜end▁of▁sentence｜>");
        }
    }
    if (gen)
        sb_add(b, "<｜Assistant｜>");
}

static const format_fn FORMAT[KVC_TMPL_COUNT] = {
    [KVC_TMPL_CHATML]            = fmt_chatml,
    [KVC_TMPL_LLAMA3]            = fmt_llama3,
    [KVC_TMPL_LLAMA2]            = fmt_llama2,
    [KVC_TMPL_LLAMA2_SYS]        = fmt_llama2,
    [KVC_TMPL_LLAMA2_SYS_BOS]    = fmt_llama2,
    [KVC_TMPL_LLAMA2_SYS_STRIP]  = fmt_llama2,
    [KVC_TMPL_MISTRAL_V1]        = fmt_mistral,
    [KVC_TMPL_MISTRAL_V3]        = fmt_mistral,
    [KVC_TMPL_MISTRAL_V3_TEKKEN] = fmt_mistral,
    [KVC_TMPL_MISTRAL_V7]        = fmt_mistral_v7,
    [KVC_TMPL_MISTRAL_V7_TEKKEN] = fmt_mistral_v7,
    [KVC_TMPL_PHI3]              = fmt_role_pipes,
    [KVC_TMPL_PHI4]              = fmt_chatml,
    [KVC_TMPL_GEMMA]             = fmt_gemma,
    [KVC_TMPL_ZEPHYR]            = fmt_role_pipes,
    [KVC_TMPL_ZEPHYR_ENDOFTEXT]  = fmt_role_pipes,
    [KVC_TMPL_DEEPSEEK]          = fmt_deepseek,
    [KVC_TMPL_DEEPSEEK2]         = fmt_deepseek2,
    [KVC_TMPL_DEEPSEEK3]         = fmt_deepseek3,
};

/* ---------------------------------------------------------------- render */

int kvc_chat_render(int tmpl, const kvc_chat_msg *msgs, size_t n,
                    bool add_generation_prompt, char **out, kvc_err *err)
{
    if (!out)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "chat render: out is NULL");
    *out = NULL;
    kvc_rendered r;
    int rc = kvc_chat_render_spans(tmpl, msgs, n, add_generation_prompt, &r, err);
    if (rc == KVC_OK) {
        *out = r.text;
        free(r.content);
    }
    return rc;
}

int kvc_chat_render_spans(int tmpl, const kvc_chat_msg *msgs, size_t n,
                          bool add_generation_prompt, kvc_rendered *out, kvc_err *err)
{
    memset(out, 0, sizeof(*out));
    if (!tmpl_valid(tmpl))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "chat render: unknown template %d", tmpl);
    if (!msgs && n > 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "chat render: %zu messages but msgs is NULL", n);
    if (n > SIZE_MAX / sizeof(msg))
        return kvc_fail(err, KVC_ERR_NOMEM, "chat render: %zu messages", n);

    msg *m = malloc((n ? n : 1) * sizeof(*m));
    if (!m)
        return kvc_fail(err, KVC_ERR_NOMEM, "chat render: %zu messages", n);
    for (size_t i = 0; i < n; i++) {
        int rc = classify(tmpl, &msgs[i], i, &m[i], err);
        if (rc < 0) {
            free(m);
            return rc;
        }
    }

    sbuf b = { 0 };
    sb_add(&b, "");                 /* "" for an empty rendering, not NULL */
    FORMAT[tmpl](tmpl, m, n, add_generation_prompt, &b);
    free(m);
    if (b.oom) {
        free(b.p);
        free(b.sp);
        return kvc_fail(err, KVC_ERR_NOMEM, "chat render: out of memory (%zu bytes)", b.len);
    }
    out->text = b.p;
    out->len = b.len;
    out->content = b.sp;
    out->n_content = b.nsp;
    return KVC_OK;
}
