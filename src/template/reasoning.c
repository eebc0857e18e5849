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

kvc_think_span kvc_think_find(const char *text, size_t len, bool open, bool final)
{
    kvc_think_span s = { 0 };
    size_t at = 0;
    if (!open) {
        while (at < len && space(text[at]))
            at++;
        size_t rest = len - at, t = sizeof(OPEN_TAG) - 1;
        if (rest >= t && !memcmp(text + at, OPEN_TAG, t)) {
            at += t;
        } else if (!final && !memcmp(text + at, OPEN_TAG, rest)) {
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
