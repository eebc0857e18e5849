/* unicode.c - UTF-8 and GPT-2's byte map (see unicode.h). */
#include "unicode.h"

#include <string.h>

int kvc_utf8_decode(const char *s, size_t len, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (len == 0)
        return 0;
    unsigned c = u[0];
    if (c < 0x80) {
        if (cp)
            *cp = c;
        return 1;
    }
    int n;
    unsigned lo = 0x80, hi = 0xBF;     /* allowed range of the second byte */
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2; v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
        if (c == 0xED) hi = 0x9F;      /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;      /* <= U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= len)
            return 0;
        unsigned b = u[i];
        unsigned blo = i == 1 ? lo : 0x80, bhi = i == 1 ? hi : 0xBF;
        if (b < blo || b > bhi)
            return -1;
        v = (v << 6) | (b & 0x3F);
    }
    if (cp)
        *cp = v;
    return n;
}

int kvc_utf8_unit(const char *s, size_t len)
{
    int n = kvc_utf8_decode(s, len, NULL);
    return n > 0 ? n : 1;
}

int kvc_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        o[0] = (unsigned char)(0xF0 | (cp >> 18));
        o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (unsigned char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

int kvc_utf8_valid(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        int n = kvc_utf8_decode(s + i, len - i, NULL);
        if (n <= 0)
            return 0;
        i += (size_t)n;
    }
    return 1;
}

size_t kvc_utf8_incomplete_tail(const char *s, size_t len)
{
    for (size_t k = 1; k <= 3 && k <= len; k++) {
        unsigned char c = (unsigned char)s[len - k];
        if ((c & 0xC0) != 0x80)             /* a lead byte (or ASCII): decide here */
            return c >= 0xC0 && kvc_utf8_decode(s + len - k, k, NULL) == 0 ? k : 0;
    }
    return 0;
}

size_t kvc_utf8_repair(const char *s, size_t len, char *out)
{
    size_t i = 0, o = 0;
    while (i < len) {
        int n = (unsigned char)s[i] < 0x80 ? 1 : kvc_utf8_decode(s + i, len - i, NULL);
        if (n > 0) {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(out + o, KVC_UTF8_REPLACEMENT, 3);
            o += 3;
            i++;
        }
    }
    return o;
}

/* The 68 bytes GPT-2 remaps: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD (1). */
uint32_t kvc_gpt2_byte_to_cpt(uint8_t b)
{
    if (b <= 0x20)
        return 0x100u + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100u + 33 + (b - 0x7Fu);
    if (b == 0xAD)
        return 0x100u + 67;
    return b;
}

int kvc_gpt2_cpt_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return (cp > 0x20 && cp != 0xAD && !(cp >= 0x7F && cp <= 0xA0)) ? (int)cp : -1;
    if (cp < 0x100 + 33)
        return (int)(cp - 0x100);
    if (cp < 0x100 + 67)
        return (int)(cp - 0x100 - 33 + 0x7F);
    if (cp == 0x100 + 67)
        return 0xAD;
    return -1;
}
