/* gguf_edit.h - for tests that make a variant of a generated GGUF file: its
 * metadata copied into a writer, the tensors then added as the test wants. */
#ifndef KVC_TEST_GGUF_EDIT_H
#define KVC_TEST_GGUF_EDIT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

/* Copy every key of f but those of skip (NULL-terminated; NULL: none) into
 * w (the types the generator writes). */
static inline bool test_gguf_copy_keys_except(const gguf_file *f, gguf_writer *w,
                                              const char *const *skip)
{
    bool ok = true;
    for (int64_t i = 0; ok && i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof(key), "%.*s", (int)kv->key.len, kv->key.s);
        bool skipped = false;
        for (const char *const *s = skip; s && *s && !skipped; s++)
            skipped = strcmp(key, *s) == 0;
        if (skipped)
            continue;
        switch (kv->type) {
        case GGUF_TYPE_UINT32:  ok = gguf_writer_set_u32(w, key, (uint32_t)kv->v.u64) == KVC_OK; break;
        case GGUF_TYPE_INT32:   ok = gguf_writer_set_i32(w, key, (int32_t)kv->v.i64) == KVC_OK; break;
        case GGUF_TYPE_FLOAT32: ok = gguf_writer_set_f32(w, key, (float)kv->v.f64) == KVC_OK; break;
        case GGUF_TYPE_BOOL:    ok = gguf_writer_set_bool(w, key, kv->v.u64 != 0) == KVC_OK; break;
        case GGUF_TYPE_STRING: {
            char *v = strndup(kv->v.str.s, kv->v.str.len);
            ok = v && gguf_writer_set_str(w, key, v) == KVC_OK;
            free(v);
            break;
        }
        case GGUF_TYPE_ARRAY:
            if (kv->v.arr.type == GGUF_TYPE_STRING) {
                char **v = calloc(kv->v.arr.n + 1, sizeof(char *));
                for (uint64_t k = 0; v && k < kv->v.arr.n; k++)
                    v[k] = strndup(kv->v.arr.strs[k].s, kv->v.arr.strs[k].len);
                ok = v && gguf_writer_set_arr_str(w, key, (const char *const *)v, kv->v.arr.n) == KVC_OK;
                for (uint64_t k = 0; v && k < kv->v.arr.n; k++)
                    free(v[k]);
                free(v);
            } else {
                ok = gguf_writer_set_arr(w, key, kv->v.arr.type, kv->v.arr.data, kv->v.arr.n) == KVC_OK;
            }
            break;
        default:
            ok = false;
        }
    }
    return ok;
}

/* Copy every key of f but `skip` (NULL: none) into w. */
static inline bool test_gguf_copy_keys(const gguf_file *f, gguf_writer *w, const char *skip)
{
    const char *const list[] = { skip, NULL };
    return test_gguf_copy_keys_except(f, w, list);
}

/* Add every tensor of f to w as it is (the data stays f's: keep f open until
 * w is written). */
static inline bool test_gguf_copy_tensors(const gguf_file *f, gguf_writer *w)
{
    bool ok = true;
    for (int64_t i = 0; ok && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[256];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.s);
        ok = gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->size) == KVC_OK;
    }
    return ok;
}

#endif
