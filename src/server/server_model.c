/* server_model.c - what the server tells of the model it serves (server.h):
 * one description, made at start, that every route reads - GET /props as
 * llama-server has it (the generation defaults, n_ctx, the model's path,
 * the chat template, the build, total_slots), the /v1/models entries with
 * the model's metadata (llama-server's meta: n_ctx_train, n_params, size,
 * ...; vLLM's max_model_len), and Ollama's /api/tags, /api/show and /api/ps
 * (server_ollama.c). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "common.h"
#include "gguf.h"
#include "quant.h"
#include "sampler.h"
#include "server.h"

/* The weight type holding the largest share of the tensor bytes of the GGUF
 * at path, as Ollama names quantizations ("Q8_0", "F16"), into buf; "" when
 * the file cannot be read. */
static void main_weight_type(const char *path, char *buf, size_t size)
{
    enum { MAX_TYPES = 64 };
    uint64_t bytes[MAX_TYPES] = { 0 };
    gguf_file *f = NULL;
    kvc_err err = { 0 };
    buf[0] = 0;
    if (!path || gguf_open(path, &f, &err) != KVC_OK)
        return;
    int best = -1;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->type < MAX_TYPES && (bytes[t->type] += t->size) > (best < 0 ? 0 : bytes[best]))
            best = (int)t->type;
    }
    gguf_close(f);
    const kvc_type_traits *tr = best >= 0 ? kvc_type_info((uint32_t)best) : NULL;
    snprintf(buf, size, "%s", tr ? tr->name : "");
    for (char *p = buf; *p; p++)
        *p = (char)toupper((unsigned char)*p);
}

/* The text of token id (control tokens rendered); "" when none. Malloc'd. */
static char *token_text(const kvc_model *m, int32_t id)
{
    char buf[256];
    int n = id >= 0 ? kvc_model_token_to_piece(m, id, true, buf, (int)sizeof(buf) - 1) : -1;
    buf[n > 0 && n < (int)sizeof(buf) ? n : 0] = 0;
    return strdup(buf);
}

int srv_model_desc_init(srv_model_desc *d, kvc_engine *engine, const char *name,
                        const char *path, const char *version, time_t started,
                        const kvc_sampler_params *sampling)
{
    memset(d, 0, sizeof(*d));
    const kvc_model *m = kvc_engine_model(engine);
    kvc_model_get_info(m, &d->info);
    struct stat st;
    d->name = name;
    d->path = path;
    d->version = version;
    d->started = started;
    d->modified = path && stat(path, &st) == 0 ? st.st_mtime : started;
    d->file_bytes = path && stat(path, &st) == 0 ? (uint64_t)st.st_size : d->info.weight_bytes;
    d->n_ctx = kvc_engine_n_ctx(engine);
    d->n_parallel = kvc_engine_n_parallel(engine);
    d->sampling = *sampling;
    d->chat_template = kvc_engine_chat_template(engine);
    main_weight_type(path, d->weight_type, sizeof(d->weight_type));
    /* a digest that names this model file: its identity, not its bytes (hashing
     * gigabytes at start would delay serving) */
    char id[1200];
    int n = snprintf(id, sizeof(id), "%s|%s|%llu|%llu|%lld", path ? path : "", d->info.arch,
                     (unsigned long long)d->info.n_params, (unsigned long long)d->file_bytes,
                     (long long)d->modified);
    XXH128_hash_t h = XXH3_128bits(id, (size_t)KVC_MIN(n, (int)sizeof(id) - 1));
    snprintf(d->digest, sizeof(d->digest), "%016llx%016llx%016llx%016llx",
             (unsigned long long)h.high64, (unsigned long long)h.low64,
             (unsigned long long)XXH3_64bits_withSeed(id, strlen(id), 1),
             (unsigned long long)XXH3_64bits_withSeed(id, strlen(id), 2));
    d->bos = token_text(m, kvc_model_token_bos(m));
    d->eos = token_text(m, kvc_model_token_eos(m));
    return d->bos && d->eos ? KVC_OK : KVC_ERR_NOMEM;
}

void srv_model_desc_free(srv_model_desc *d)
{
    if (!d)
        return;
    free(d->bos);
    free(d->eos);
    d->bos = d->eos = NULL;
}

void srv_param_size(uint64_t n, char *buf, size_t size)
{
    if (n >= 1000000000ull)
        snprintf(buf, size, "%.2fB", (double)n / 1e9);
    else if (n >= 1000000ull)
        snprintf(buf, size, "%.2fM", (double)n / 1e6);
    else
        snprintf(buf, size, "%.2fK", (double)n / 1e3);
}

/* ============================================================= /props */

/* A float setting as it was written (0.95, not 0.949999988). */
static double f6(float x)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%.6g", (double)x);
    return strtod(buf, NULL);
}

/* llama-server's sampling parameters of a slot: the defaults requests get. */
static cJSON *params_object(const srv_model_desc *d)
{
    const kvc_sampler_params *s = &d->sampling;
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "n_predict", -1);
    cJSON_AddNumberToObject(p, "max_tokens", -1);
    cJSON_AddNumberToObject(p, "seed", s->seed == KVC_SEED_RANDOM ? -1 : (double)s->seed);
    cJSON_AddNumberToObject(p, "temperature", f6(s->temperature));
    cJSON_AddNumberToObject(p, "top_k", s->top_k);
    cJSON_AddNumberToObject(p, "top_p", f6(s->top_p));
    cJSON_AddNumberToObject(p, "min_p", f6(s->min_p));
    cJSON_AddNumberToObject(p, "typical_p", 1);
    cJSON_AddNumberToObject(p, "repeat_last_n", s->repeat_last_n);
    cJSON_AddNumberToObject(p, "repeat_penalty", f6(s->repeat_penalty));
    cJSON_AddNumberToObject(p, "presence_penalty", f6(s->presence_penalty));
    cJSON_AddNumberToObject(p, "frequency_penalty", f6(s->frequency_penalty));
    cJSON_AddNumberToObject(p, "mirostat", 0);
    cJSON_AddArrayToObject(p, "stop");
    cJSON_AddFalseToObject(p, "ignore_eos");
    cJSON_AddFalseToObject(p, "stream");
    cJSON_AddNumberToObject(p, "n_probs", 0);
    cJSON *samplers = cJSON_AddArrayToObject(p, "samplers");
    static const char *const order[] = { "penalties", "top_k", "top_p", "min_p", "temperature" };
    for (size_t i = 0; i < KVC_ARRAY_LEN(order); i++)
        cJSON_AddItemToArray(samplers, cJSON_CreateString(order[i]));
    return p;
}

char *srv_props_json(const srv_model_desc *d)
{
    cJSON *o = cJSON_CreateObject(), *g = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(g, "id", 0);
    cJSON_AddNumberToObject(g, "n_ctx", d->n_ctx);
    cJSON_AddFalseToObject(g, "speculative");
    cJSON_AddFalseToObject(g, "is_processing");
    cJSON_AddItemToObject(g, "params", params_object(d));
    cJSON_AddNumberToObject(o, "n_ctx", d->n_ctx);
    cJSON_AddNumberToObject(o, "total_slots", d->n_parallel);
    cJSON_AddStringToObject(o, "model_path", d->path ? d->path : "");
    cJSON_AddStringToObject(o, "model_alias", d->name);
    cJSON *mod = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddFalseToObject(mod, "vision");
    cJSON_AddFalseToObject(mod, "audio");
    cJSON_AddStringToObject(o, "chat_template", d->chat_template ? d->chat_template : "chatml");
    cJSON_AddStringToObject(o, "bos_token", d->bos);
    cJSON_AddStringToObject(o, "eos_token", d->eos);
    cJSON_AddStringToObject(o, "build_info", d->version);
    return srv_json_print(o);
}

/* ========================================================= /v1/models */

static cJSON *model_entry(const srv_model_desc *d)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", d->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)d->modified);
    cJSON_AddStringToObject(m, "owned_by", "kvchat");
    cJSON_AddNumberToObject(m, "max_model_len", d->n_ctx);      /* vLLM's */
    cJSON_AddNumberToObject(m, "context_length", d->n_ctx);
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");            /* llama-server's */
    cJSON_AddNumberToObject(meta, "vocab_type", 0);
    cJSON_AddNumberToObject(meta, "n_vocab", d->info.n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", d->info.n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_ctx", d->n_ctx);
    cJSON_AddNumberToObject(meta, "n_embd", d->info.n_embd);
    cJSON_AddNumberToObject(meta, "n_layer", d->info.n_layer);
    cJSON_AddNumberToObject(meta, "n_params", (double)d->info.n_params);
    cJSON_AddNumberToObject(meta, "size", (double)d->info.weight_bytes);
    cJSON_AddStringToObject(meta, "arch", d->info.arch);
    if (d->weight_type[0])
        cJSON_AddStringToObject(meta, "weight_type", d->weight_type);
    return m;
}

char *srv_models_desc_json(const srv_model_desc *d, bool one)
{
    if (one)
        return srv_json_print(model_entry(d));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_entry(d));
    return srv_json_print(o);
}
