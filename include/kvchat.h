/* kvchat.h - the public C API of kvchat.
 *
 * An LLM inference engine that keeps the KV cache of everything it has computed
 * and, for each request, computes only the tokens it has not seen before.
 *
 * Conventions (as in llama.h):
 *   - opaque handles: kvc_model, kvc_context, kvc_sampler, ...
 *   - functions are named kvc_<noun>_<verb>;
 *   - functions return an int status: KVC_OK (0) or a negative KVC_ERR_*;
 *     kvc_strerror() names it; functions that take `char *err, size_t err_size`
 *     also write a message saying what was wrong;
 *   - params structs are initialised with kvc_<noun>_default_params();
 *   - ranges are half-open [p0, p1);
 *   - a function that fills a caller-owned buffer returns the size it needed
 *     when the buffer was too small;
 *   - every *_free() accepts NULL.
 * The library never prints and never exits. */
#ifndef KVCHAT_H
#define KVCHAT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

enum kvc_status {
    KVC_OK                  =  0,
    KVC_ERR_NOMEM           = -1,  /* an allocation failed */
    KVC_ERR_IO              = -2,  /* open/read/write/mmap failed */
    KVC_ERR_FORMAT          = -3,  /* malformed input file or data */
    KVC_ERR_UNSUPPORTED     = -4,  /* valid but not supported (type, architecture) */
    KVC_ERR_INVALID_ARG     = -5,  /* a caller passed an invalid value */
    KVC_ERR_CONTEXT_LENGTH  = -6,  /* prompt + max tokens exceed the context */
    KVC_ERR_NOT_FOUND       = -7,  /* a key, tensor or name does not exist */
    KVC_ERR_KV_FULL         = -8,  /* the KV pool has no free block */
    KVC_ERR_CANCELLED       = -9,  /* a callback asked to stop */
    KVC_ERR_BUSY            = -10, /* queue full; try again later */
};

/* A static English name for a status ("invalid argument"); never NULL. */
const char *kvc_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif /* KVCHAT_H */
