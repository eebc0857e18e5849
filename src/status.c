/* status.c - names of the public status codes. */
#include "kvchat.h"

const char *kvc_strerror(int status)
{
    switch (status) {
    case KVC_OK:                 return "ok";
    case KVC_ERR_NOMEM:          return "out of memory";
    case KVC_ERR_IO:             return "input/output error";
    case KVC_ERR_FORMAT:         return "malformed data";
    case KVC_ERR_UNSUPPORTED:    return "not supported";
    case KVC_ERR_INVALID_ARG:    return "invalid argument";
    case KVC_ERR_CONTEXT_LENGTH: return "context length exceeded";
    case KVC_ERR_NOT_FOUND:      return "not found";
    case KVC_ERR_KV_FULL:        return "KV cache full";
    case KVC_ERR_CANCELLED:      return "cancelled";
    case KVC_ERR_BUSY:           return "busy";
    }
    return "unknown status";
}
