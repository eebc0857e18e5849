/* common.h - status codes, error reporting and small helpers shared by every part.
 *
 * Library code never prints or exits: a failing function returns a negative
 * kvc status (see include/kvchat.h) and, when the caller passed a kvc_err,
 * leaves a message there that names what was wrong ("tensor blk.3.ffn_up.weight:
 * type 23 not supported"). */
#ifndef KVC_COMMON_H
#define KVC_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "kvchat.h"

typedef struct kvc_err {
    int  code;          /* last status set, KVC_OK when none */
    char msg[512];      /* NUL-terminated message, "" when none */
} kvc_err;

/* Record `code` and a printf-style message in `err` (which may be NULL).
 * Returns `code`, so a failing path can read `return kvc_fail(err, ...)`. */
int kvc_fail(kvc_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepend context to an existing message: "loading x.gguf: <old message>". */
int kvc_err_prefix(kvc_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* KVC_ASSERT(cond): an invariant of kvchat's own code (a block's reference
 * count, a node's pins), checked in every build whatever NDEBUG says, as
 * llama.cpp's GGML_ASSERT. A false one is a bug, not bad input, so the one
 * exception to "library code never prints or exits": it prints file:line and
 * the condition to stderr and aborts. Keep the condition cheap (no loops, no
 * calls that cost); input errors return a status instead. */
#define KVC_ASSERT(cond) \
    (__builtin_expect(!!(cond), 1) ? (void)0 : kvc_assert_fail(__FILE__, __LINE__, #cond))
_Noreturn void kvc_assert_fail(const char *file, int line, const char *cond);

#define KVC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVC_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVC_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Positions per KV block: the pool's (kv.h, which gives the block layout)
 * and the attention kernel's (attention.h). Here, below both. */
#define KVC_BLOCK_TOKENS 16

/* Make room for one more element in a growing array: *arr holds n elements
 * of elsize bytes with room for *cap; when full, the room doubles (16 at
 * first). false (nothing changed) when memory runs out. */
bool kvc_grow(void **arr, size_t *cap, size_t n, size_t elsize);

/* Append s[0, n) to a malloc'd NUL-terminated text *p of *len bytes in *cap,
 * growing it by doubling (256 at first); on allocation failure sets *oom and
 * leaves the text as it was (later appends do nothing). The string builders
 * of the template, grammar and server parts are made of it. */
void kvc_text_append(char **p, size_t *len, size_t *cap, bool *oom, const char *s, size_t n);

/* A range [off, off + len) of a text: the template's provenance spans (which
 * bytes came from the caller) that the tokenizer keeps from markup. */
typedef struct kvc_text_span { size_t off, len; } kvc_text_span;

/* Monotonic clock in microseconds. */
int64_t kvc_time_us(void);

/* Aligned allocation (64 bytes) for SIMD buffers; free with kvc_free_aligned (NULL ok). */
void *kvc_alloc_aligned(size_t size);
void  kvc_free_aligned(void *p);

#endif
