/* gguf_internal.h - what the GGUF reader (gguf.c) and writer (gguf_write.c) share. */
#ifndef KVC_GGUF_INTERNAL_H
#define KVC_GGUF_INTERNAL_H

#include "gguf.h"
#include "quant.h"

#include <stdlib.h>
#include <string.h>

/* How a value of each type is decoded; kind NUM_NONE for STRING and ARRAY. */
enum num_kind { NUM_NONE, NUM_UINT, NUM_INT, NUM_FLOAT, NUM_BOOL };

static const struct vtype {
    const char *name;
    uint8_t     size;         /* bytes of one element; 0 for STRING and ARRAY */
    uint8_t     kind;         /* enum num_kind */
} vtypes[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8]   = { "uint8", 1, NUM_UINT },    [GGUF_TYPE_INT8]    = { "int8", 1, NUM_INT },
    [GGUF_TYPE_UINT16]  = { "uint16", 2, NUM_UINT },   [GGUF_TYPE_INT16]   = { "int16", 2, NUM_INT },
    [GGUF_TYPE_UINT32]  = { "uint32", 4, NUM_UINT },   [GGUF_TYPE_INT32]   = { "int32", 4, NUM_INT },
    [GGUF_TYPE_FLOAT32] = { "float32", 4, NUM_FLOAT }, [GGUF_TYPE_BOOL]    = { "bool", 1, NUM_BOOL },
    [GGUF_TYPE_STRING]  = { "string", 0, NUM_NONE },   [GGUF_TYPE_ARRAY]   = { "array", 0, NUM_NONE },
    [GGUF_TYPE_UINT64]  = { "uint64", 8, NUM_UINT },   [GGUF_TYPE_INT64]   = { "int64", 8, NUM_INT },
    [GGUF_TYPE_FLOAT64] = { "float64", 8, NUM_FLOAT },
};

static inline const char *vtype_name(uint32_t t) { return t < GGUF_TYPE_COUNT ? vtypes[t].name : "unknown"; }
static inline int vtype_kind(uint32_t t) { return t < GGUF_TYPE_COUNT ? vtypes[t].kind : NUM_NONE; }

static inline uint64_t load_le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

static inline void store_le(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

/* Bytes of a tensor of type tt and shape ne[0..n_dims) (ne[0] a multiple of
 * the block size); SIZE_MAX when a dimension is negative or the size overflows. */
static inline size_t shape_bytes(const kvc_type_traits *tt, uint32_t n_dims, const int64_t *ne)
{
    if (ne[0] < 0)
        return SIZE_MAX;
    size_t size = (size_t)(ne[0] / tt->block_size);
    if (size && tt->type_size > (SIZE_MAX - 1) / size)
        return SIZE_MAX;
    size *= tt->type_size;
    for (uint32_t d = 1; d < n_dims; d++) {
        if (ne[d] < 0 || (ne[d] && size > (SIZE_MAX - 1) / (size_t)ne[d]))
            return SIZE_MAX;
        size *= (size_t)ne[d];
    }
    return size;
}

/* Makes room for one more element in a growing array (*arr, *cap). Growing as
 * entries are parsed keeps memory proportional to the bytes actually read. */
static inline bool grow(void **arr, size_t *cap, size_t n, size_t elsize)
{
    return kvc_grow(arr, cap, n, elsize);
}

#endif
