/* gguf.h - GGUF v2/v3 files: a validating reader (mmap) and a writer.
 *
 * Reader: gguf_open() maps the file and checks every count, length, offset and
 * size against the file before anything is returned, so a truncated or hostile
 * file yields KVC_ERR_FORMAT with a message naming the bad field, never a
 * crash. Strings returned by the reader point into the mapping (not
 * NUL-terminated; use the .len) and live as long as the gguf_file.
 *
 * Writer: builds a file in memory (keys in insertion order, tensors aligned to
 * general.alignment, default 32) and writes it at once; used by make-model and
 * the tests. */
#ifndef KVC_GGUF_H
#define KVC_GGUF_H

#include "common.h"

#define GGUF_MAGIC             0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4

enum gguf_vtype {
    GGUF_TYPE_UINT8   = 0,
    GGUF_TYPE_INT8    = 1,
    GGUF_TYPE_UINT16  = 2,
    GGUF_TYPE_INT16   = 3,
    GGUF_TYPE_UINT32  = 4,
    GGUF_TYPE_INT32   = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL    = 7,
    GGUF_TYPE_STRING  = 8,
    GGUF_TYPE_ARRAY   = 9,
    GGUF_TYPE_UINT64  = 10,
    GGUF_TYPE_INT64   = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

typedef struct gguf_str {
    uint64_t    len;
    const char *s;          /* not NUL-terminated */
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;          /* enum gguf_vtype */
    union {
        uint64_t u64;       /* UINT8/16/32/64, BOOL (0/1) */
        int64_t  i64;       /* INT8/16/32/64 */
        double   f64;       /* FLOAT32/64 */
        gguf_str str;       /* STRING */
        struct {
            uint32_t        type;   /* element type, never ARRAY */
            uint64_t        n;      /* element count */
            const void     *data;   /* numeric elements, packed little-endian, possibly unaligned */
            const gguf_str *strs;   /* STRING elements: n entries (owned by the gguf_file) */
        } arr;
    } v;
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str    name;
    uint32_t    n_dims;
    int64_t     ne[GGUF_MAX_DIMS]; /* ne[0] is the row length; unused dims are 1 */
    uint32_t    type;              /* ggml type id (quant.h) */
    uint64_t    offset;            /* relative to the data section */
    const void *data;              /* into the mapping */
    size_t      size;              /* bytes, from type and shape */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Map and validate `path`. On success *out owns the mapping; free with gguf_close.
 * Errors: KVC_ERR_IO (cannot open/map), KVC_ERR_FORMAT (malformed; message names
 * the field), KVC_ERR_UNSUPPORTED (version other than 2/3, unknown tensor type),
 * KVC_ERR_NOMEM. */
int gguf_open(const char *path, gguf_file **out, kvc_err *err);

/* Same, over a caller-owned buffer that must outlive the gguf_file (fuzzing, tests). */
int gguf_open_memory(const void *data, size_t size, gguf_file **out, kvc_err *err);

void gguf_close(gguf_file *f);              /* NULL ok */

uint32_t           gguf_version(const gguf_file *f);
size_t             gguf_alignment(const gguf_file *f);
int64_t            gguf_n_kv(const gguf_file *f);
const gguf_kv     *gguf_kv_at(const gguf_file *f, int64_t i);
const gguf_kv     *gguf_find_kv(const gguf_file *f, const char *key);  /* NULL if absent */
int64_t            gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

/* Typed getters. Return KVC_OK, KVC_ERR_NOT_FOUND when the key is absent (out
 * untouched), or KVC_ERR_FORMAT when the value has a type that cannot be
 * represented (a string asked as a number, a negative value asked as unsigned,
 * an out-of-range value). Integers of any width convert; floats accept any
 * float or integer type. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, kvc_err *err);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, kvc_err *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, kvc_err *err);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, kvc_err *err);
/* *out is malloc'd and NUL-terminated; caller frees. */
int gguf_get_str(const gguf_file *f, const char *key, char **out, kvc_err *err);
/* An array of the given element type (STRING arrays use kv->v.arr.strs). */
int gguf_get_arr(const gguf_file *f, const char *key, uint32_t elem_type,
                 const gguf_kv **out, kvc_err *err);

/* Read element i of a numeric array as double / int64 (handles unaligned data). */
double  gguf_arr_f64(const gguf_kv *kv, uint64_t i);
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i);

/* ------------------------------------------------------------------ writer */

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);         /* NULL on allocation failure */
void gguf_writer_free(gguf_writer *w);      /* NULL ok */

/* Setters copy key and value. Setting a key twice is a KVC_ERR_INVALID_ARG. */
int gguf_writer_set_u32 (gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32 (gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64 (gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32 (gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str (gguf_writer *w, const char *key, const char *v);
/* Numeric array of `n` elements of `elem_type`, packed little-endian in `data`. */
int gguf_writer_set_arr (gguf_writer *w, const char *key, uint32_t elem_type,
                         const void *data, uint64_t n);
int gguf_writer_set_arr_str(gguf_writer *w, const char *key,
                            const char *const *strs, uint64_t n);

/* Add a tensor; `data` (size bytes, which must equal the size implied by type
 * and shape) is copied. ne[0] is the row length. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const int64_t *ne,
                           const void *data, size_t size);

/* Write version 3 to `path` (overwrites). KVC_ERR_IO on failure. */
int gguf_writer_write(const gguf_writer *w, const char *path, kvc_err *err);

/* For tests and fuzzing: serialise into a malloc'd buffer (*out, *out_size). */
int gguf_writer_to_memory(const gguf_writer *w, void **out, size_t *out_size, kvc_err *err);

#endif
