/* reasoning.c - where a reply's <think>...</think> block is (reasoning.h). */
#include <string.h>

#include "reasoning.h"

static const char OPEN_TAG[] = "<think>", CLOSE_TAG[] = "</think>";

static bool space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* The length of the longest suffix of text[from, len) that is a proper
 * prefix of tag: bytes that may still become it. */
static size_t partial_tag(const char *text, size_t from, size_t len, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = t - 1 < len - from ? t - 1 : len - from; k > 0; k--)
        if (!memcmp(text + len - k, tag, k))
            return k;
    return 0;
}

/* The first occurrence of tag in text[from, len), or len when none. */
static size_t find_tag(const char *text, size_t from, size_t len, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t i = from; i + t <= len; i++)
        if (text[i] == tag[0] && !memcmp(text + i, tag, t))
            return i;
    return len;
}

static const char CHANNEL[] = "<|channel|>", ANALYSIS[] = "<|channel|>analysis<|message|>",
                  FINAL[] = "<|channel|>final<|message|>", END[] = "<|end|>",
                  START[] = "<|start|>assistant", RECIPIENT[] = " to=";

/* Whether text[0, len) and tag agree as far as both go. */
static bool prefix_of(const char *text, size_t len, const char *tag)
{
    size_t t = strlen(tag);
    return !memcmp(text, tag, len < t ? len : t);
}

static const char *const MARKUP[] = { "<|end|>", "<|start|>", "<|channel|>", "<|message|>",
                                      "<|constrain|>", "<|return|>", "<|call|>" };

/* Where harmony content from `from` ends: at the first markup, else len (not
 * final: before a tail that may still become markup). */
static size_t harmony_content_end(const char *text, size_t from, size_t len, bool final)
{
    size_t end = len, hold = 0;
    for (size_t i = 0; i < sizeof(MARKUP) / sizeof(MARKUP[0]); i++) {
        size_t at = find_tag(text, from, end, MARKUP[i]);
        end = at < end ? at : end;
    }
    for (size_t i = 0; !final && end == len && i < sizeof(MARKUP) / sizeof(MARKUP[0]); i++) {
        size_t k = partial_tag(text, from, len, MARKUP[i]);
        hold = k > hold ? k : hold;
    }
    return end - hold;
}

static kvc_think_span harmony_find(const char *text, size_t len, bool final)
{
    kvc_think_span s = { 0 };
    size_t at = 0, t = sizeof(START) - 1;
    if (len >= t && !memcmp(text, START, t))
        at = t;                                /* a reply may repeat its header */
    const char *p = text + at;
    size_t rest = len - at;
    if (!final && ((rest < sizeof(ANALYSIS) - 1 && prefix_of(p, rest, ANALYSIS)) ||
                   (rest < sizeof(FINAL) - 1 && prefix_of(p, rest, FINAL)) ||
                   (rest < sizeof(RECIPIENT) - 1 && prefix_of(p, rest, RECIPIENT)))) {
        s.state = KVC_THINK_UNDECIDED;         /* "<|chan", "<|channel|>analy", " t", ... */
        return s;
    }
    if (rest >= sizeof(RECIPIENT) - 1 && !memcmp(p, RECIPIENT, sizeof(RECIPIENT) - 1)) {
        /* the header names a recipient ("<|start|>assistant to=functions.f
         * <|channel|>commentary json<|message|>..."): a call, not content */
        s.state = KVC_THINK_CLOSED;
        s.r_begin = s.r_end = at;
        size_t f = find_tag(text, at, len, FINAL);
        s.c_begin = f == len ? len : f + sizeof(FINAL) - 1;
        s.c_end = harmony_content_end(text, s.c_begin, len, final);
        return s;
    }
    if (rest < sizeof(CHANNEL) - 1 || memcmp(p, CHANNEL, sizeof(CHANNEL) - 1)) {
        s.state = KVC_THINK_NONE;              /* no channel: content up to any markup */
        s.c_end = harmony_content_end(text, 0, len, final);
        return s;
    }
    size_t after = at;                         /* where the reasoning ends */
    s.r_begin = s.r_end = at;
    if (rest >= sizeof(ANALYSIS) - 1 && !memcmp(p, ANALYSIS, sizeof(ANALYSIS) - 1)) {
        s.r_begin = at + sizeof(ANALYSIS) - 1;
        size_t end = find_tag(text, s.r_begin, len, END);
        if (end == len) {
            s.state = KVC_THINK_OPEN;
            s.r_end = final ? len : len - partial_tag(text, s.r_begin, len, END);
            s.c_begin = s.c_end = len;
            return s;
        }
        s.r_end = end;
        after = end + sizeof(END) - 1;
    }
    s.state = KVC_THINK_CLOSED;
    size_t f = find_tag(text, after, len, FINAL);
    s.c_begin = f == len ? len : f + sizeof(FINAL) - 1;
    s.c_end = harmony_content_end(text, s.c_begin, len, final);
    return s;
}

kvc_think_span kvc_think_find(const char *text, size_t len, int mode, bool final)
{
    if (mode == KVC_THINK_HARMONY)
        return harmony_find(text, len, final);
    bool open = mode == KVC_THINK_INSIDE;
    kvc_think_span s = { .c_end = len };
    size_t at = 0;
    if (!open) {
        while (at < len && space(text[at]))
            at++;
        size_t rest = len - at, t = sizeof(OPEN_TAG) - 1;
        if (rest >= t && !memcmp(text + at, OPEN_TAG, t)) {
            at += t;
        } else if (!final && prefix_of(text + at, rest, OPEN_TAG)) {
            s.state = KVC_THINK_UNDECIDED;     /* "", "  <th", ...: it may still open */
            return s;
        } else {
            s.state = KVC_THINK_NONE;
            return s;                          /* c_begin 0: all of it is content */
        }
    }
    s.r_begin = at;
    size_t end = find_tag(text, at, len, CLOSE_TAG);
    if (end == len) {
        s.state = KVC_THINK_OPEN;
        s.r_end = final ? len : len - partial_tag(text, at, len, CLOSE_TAG);
        s.c_begin = len;
        return s;
    }
    s.state = KVC_THINK_CLOSED;
    s.r_end = end;
    s.c_begin = end + sizeof(CLOSE_TAG) - 1;
    while (s.c_begin < len && space(text[s.c_begin]))
        s.c_begin++;
    return s;
}

bool kvc_think_prompt_open(const char *prompt)
{
    size_t n = strlen(prompt), t = sizeof(OPEN_TAG) - 1;
    while (n > 0 && space(prompt[n - 1]))
        n--;
    return n >= t && !memcmp(prompt + n - t, OPEN_TAG, t);
}
