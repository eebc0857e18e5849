/* fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Opens the input with gguf_open_memory and, when it opens, touches every byte
 * the reader hands out (keys, string values, string array elements, numeric
 * array elements, tensor data) and runs every lookup and getter on each key,
 * so a length or offset the validator let through shows up as an ASan report.
 * A failure must come with a status and a message. */
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;
static volatile double   fsink;

static uint64_t touch(const void *p, uint64_t n)
{
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++)
        sum += ((const uint8_t *)p)[i];
    return sum;
}

static char *cstr(gguf_str s)
{
    char *c = malloc((size_t)s.len + 1);
    if (!c)
        abort();
    memcpy(c, s.s, (size_t)s.len);
    c[s.len] = 0;
    return c;
}

static uint64_t walk_kv(const gguf_file *f, const gguf_kv *kv)
{
    uint64_t sum = touch(kv->key.s, kv->key.len);
    if (kv->type == GGUF_TYPE_STRING)
        sum += touch(kv->v.str.s, kv->v.str.len);
    if (kv->type == GGUF_TYPE_ARRAY && kv->v.arr.type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < kv->v.arr.n; i++)
            sum += touch(kv->v.arr.strs[i].s, kv->v.arr.strs[i].len);
    } else if (kv->type == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; i < kv->v.arr.n; i++) {
            sum += (uint64_t)gguf_arr_i64(kv, i);
            fsink += gguf_arr_f64(kv, i);
        }
    }
    /* Lookups by name find this key or an earlier one with the same C-string
     * prefix (names with embedded NULs); the getters must not crash either way. */
    char *key = cstr(kv->key);
    kvc_err err;
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    char *s = NULL;
    const gguf_kv *arr;
    if (strlen(key) == kv->key.len && gguf_find_kv(f, key) != kv)
        abort();
    sum += (uint64_t)gguf_get_u32(f, key, &u32, &err) + (uint64_t)gguf_get_i64(f, key, &i64, &err);
    sum += (uint64_t)gguf_get_f32(f, key, &f32, &err) + (uint64_t)gguf_get_bool(f, key, &b, &err);
    if (gguf_get_str(f, key, &s, &err) == KVC_OK)
        sum += strlen(s);
    free(s);
    sum += (uint64_t)gguf_get_arr(f, key, kv->type == GGUF_TYPE_ARRAY ? kv->v.arr.type : 0, &arr, &err);
    free(key);
    return sum;
}

static uint64_t walk_tensor(const gguf_file *f, const gguf_tensor *t)
{
    uint64_t sum = touch(t->name.s, t->name.len) + touch(t->data, t->size);
    char *name = cstr(t->name);
    if (strlen(name) == t->name.len && gguf_find_tensor(f, name) != t)
        abort();
    free(name);
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f = NULL;
    kvc_err err = { 0 };
    int rc = gguf_open_memory(data, size, &f, &err);
    if (rc != KVC_OK) {
        if (f != NULL || err.code != rc || err.msg[0] == 0) {
            fprintf(stderr, "failure without a message: %d '%s'\n", rc, err.msg);
            abort();
        }
        return 0;
    }
    uint64_t sum = gguf_version(f) + gguf_alignment(f);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        sum += walk_kv(f, gguf_kv_at(f, i));
    for (int64_t i = 0; i < gguf_n_tensors(f); i++)
        sum += walk_tensor(f, gguf_tensor_at(f, i));
    sink = sum;
    gguf_close(f);
    return 0;
}
