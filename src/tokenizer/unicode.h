/* unicode.h - UTF-8 decoding and encoding, and GPT-2's byte <-> code point map.
 *
 * Validation is strict (RFC 3629, the same rule PCRE2 applies): no overlong
 * forms, no surrogates, nothing above U+10FFFF. The tokenizer uses it to split
 * text into characters, and the streaming detokenizer to release only whole
 * characters. */
#ifndef KVC_UNICODE_H
#define KVC_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define KVC_UTF8_REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD, 3 bytes */

/* Decode the character at s[0..len).
 * Returns its length (1..4) and sets *cp (cp may be NULL);
 * 0 when s[0..len) is a valid but incomplete start of a character (len too short);
 * -1 when s[0] does not start a valid character (treat that one byte alone). */
int kvc_utf8_decode(const char *s, size_t len, uint32_t *cp);

/* Length of the character starting at s (1..4), or 1 for an invalid or
 * truncated sequence: the unit a tokenizer splits text into. len > 0. */
int kvc_utf8_unit(const char *s, size_t len);

/* Encode cp into out (at least 4 bytes). Returns 1..4, or 0 if cp is not a
 * Unicode scalar value. */
int kvc_utf8_encode(uint32_t cp, char *out);

/* True when all of s[0..len) is valid UTF-8. */
int kvc_utf8_valid(const char *s, size_t len);

/* How many bytes at the end of s[0..len) are a valid but incomplete start of
 * a character (0..3): a stream holds them back until more bytes arrive. */
size_t kvc_utf8_incomplete_tail(const char *s, size_t len);

/* Copy s[0..len) to out, each byte that is not part of a valid whole
 * character (an incomplete one at the end included) replaced by U+FFFD, so
 * the result is valid UTF-8. Repairing a text piece by piece, cut only where
 * kvc_utf8_incomplete_tail is 0, gives the same bytes as repairing it whole.
 * out holds at least 3 * len bytes (it may not overlap s). Returns the bytes
 * written. */
size_t kvc_utf8_repair(const char *s, size_t len, char *out);

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68
 * (0x00-0x20, 0x7F-0xA0, 0xAD) to U+0100.. in byte order. */
uint32_t kvc_gpt2_byte_to_cpt(uint8_t b);
/* The inverse; -1 for a code point that is not in the map. */
int      kvc_gpt2_cpt_to_byte(uint32_t cp);

#endif
