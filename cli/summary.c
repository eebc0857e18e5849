/* summary.c - what `kvchat serve` says once at start: the model, its weights,
 * the context, the KV budget, threads and ISA, the template, the tiers and
 * whether an API key is needed; one fact a line, so that a person sees what
 * runs before the first request does. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "block_store.h"
#include "cli.h"
#include "gguf.h"
#include "kernels.h"
#include "kvc_version.h"
#include "quant.h"
#include "server.h"

#define MIB (1024.0 * 1024.0)

/* "3.2 MiB", "4.37 GiB" */
static const char *bytes_str(double b, char *buf, size_t size)
{
    if (b >= 1024.0 * MIB)
        snprintf(buf, size, "%.2f GiB", b / (1024.0 * MIB));
    else
        snprintf(buf, size, "%.1f MiB", b / MIB);
    return buf;
}

/* "494.0 M", "7.62 B" */
static const char *count_str(double n, char *buf, size_t size)
{
    if (n >= 1e9)
        snprintf(buf, size, "%.2f B", n / 1e9);
    else
        snprintf(buf, size, "%.1f M", n / 1e6);
    return buf;
}

/* The weight types of the GGUF at path, by their share of the tensor bytes,
 * largest first: "q4_K 71%, q6_K 22%, f32 7%". "?" when the file cannot be read. */
static void weight_types(const char *path, char *buf, size_t size)
{
    enum { MAX_TYPES = 64 };
    uint64_t bytes[MAX_TYPES] = { 0 }, total = 0;
    gguf_file *f = NULL;
    kvc_err err = { 0 };
    snprintf(buf, size, "?");
    if (!path || gguf_open(path, &f, &err) != KVC_OK)
        return;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->type < MAX_TYPES) {
            bytes[t->type] += t->size;
            total += t->size;
        }
    }
    gguf_close(f);
    size_t len = 0;
    for (int k = 0; k < 4 && total; k++) {     /* the four largest shares */
        int best = -1;
        for (int t = 0; t < MAX_TYPES; t++)
            if (bytes[t] && (best < 0 || bytes[t] > bytes[best]))
                best = t;
        if (best < 0)
            break;
        const kvc_type_traits *tr = kvc_type_info((uint32_t)best);
        double pct = 100.0 * (double)bytes[best] / (double)total;
        len += (size_t)snprintf(buf + len, size - len, pct >= 0.5 ? "%s%s %.0f%%" : "%s%s <1%%",
                                k ? ", " : "", tr ? tr->name : "?", pct);
        bytes[best] = 0;
        if (len >= size)
            break;
    }
}

/* The Redis URL without its password: redis://user:***@host:port/db */
static void redis_masked(const char *url, char *buf, size_t size)
{
    const char *at = strrchr(url, '@'), *scheme = strstr(url, "://");
    const char *creds = scheme ? scheme + 3 : url;
    const char *colon = at && at > creds ? memchr(creds, ':', (size_t)(at - creds)) : NULL;
    if (colon)
        snprintf(buf, size, "%.*s:***%s", (int)(colon - url), url, at);
    else
        snprintf(buf, size, "%s", url);
}

static const char *kv_type_name(int32_t t)
{
    return t == KVC_KV_F32 ? "f32" : t == KVC_KV_Q8_0 ? "q8_0" : "f16";
}

void cli_serve_summary(FILE *out, const cli_serve_info *s)
{
    kvc_model_info mi;
    kvc_model_get_info(s->model, &mi);
    kvc_engine_metrics em;
    kvc_engine_get_metrics(s->engine, &em);
    char a[64], b[64], types[160];
    struct stat st;
    double file_bytes = s->model_path && stat(s->model_path, &st) == 0 ? (double)st.st_size : 0;

    fprintf(out, "kvchat %s%s%s%s\n", KVC_VERSION, *KVC_GIT_DESCRIBE ? " (git " : "",
            KVC_GIT_DESCRIBE, *KVC_GIT_DESCRIBE ? ")" : "");
    fprintf(out, "  model      %s: %s (%s)\n", s->served_name, s->model_path ? s->model_path : "?",
            bytes_str(file_bytes, a, sizeof(a)));
    fprintf(out, "  arch       %s, %d layers, n_embd %d, %d heads (%d KV) of %d, vocabulary %d\n",
            mi.arch, mi.n_layer, mi.n_embd, mi.n_head, mi.n_head_kv, mi.head_dim, mi.n_vocab);
    weight_types(s->model_path, types, sizeof(types));
    fprintf(out, "  weights    %s parameters, %s: %s\n", count_str((double)mi.n_params, a, sizeof(a)),
            bytes_str((double)mi.weight_bytes, b, sizeof(b)), types);

    int32_t n_ctx = kvc_engine_n_ctx(s->engine);
    if (s->params->n_ctx <= 0 && n_ctx < mi.n_ctx_train)
        fprintf(out, "  context    %d tokens per conversation: the model's %d capped to what the KV\n"
                     "             budget holds (set --kv-budget or -c to choose)\n", n_ctx, mi.n_ctx_train);
    else
        fprintf(out, "  context    %d tokens per conversation (the model's: %d)\n", n_ctx,
                mi.n_ctx_train);
    int64_t kv_tokens = em.blocks_total * em.block_tokens;
    fprintf(out, "  KV cache   %lld tokens, %s of %s (blocks of %d tokens; %.1f full contexts)%s\n",
            (long long)kv_tokens, bytes_str((double)(em.blocks_total * em.block_bytes), a, sizeof(a)),
            kv_type_name(s->params->kv_type), em.block_tokens,
            n_ctx > 0 ? (double)kv_tokens / n_ctx : 0.0,
            s->params->no_cache ? "; --no-cache: nothing reused" : "");
    if (em.window_chunks_total > 0)
        fprintf(out, "  windows    sliding-window layers: %lld chunks of %d tokens, %s%s\n",
                (long long)em.window_chunks_total, em.block_tokens,
                bytes_str((double)(em.window_chunks_total * em.window_chunk_bytes), a, sizeof(a)),
                em.window_chunks_total >= em.blocks_total ? " (--swa-full)" : " (the running windows, twice)");
    int32_t n_threads = kvc_engine_n_threads(s->engine);
    fprintf(out, "  compute    %d thread%s, %s kernels\n", n_threads, n_threads == 1 ? "" : "s",
            kvc_isa_name(kvc_kernels_isa()));
    fprintf(out, "  template   %s\n", kvc_engine_template(s->engine));

    if (s->params->cache_disk_mib > 0) {
        char dir[1024];
        kvc_err err = { 0 };
        if (s->params->cache_dir)
            snprintf(dir, sizeof(dir), "%s", s->params->cache_dir);
        else if (kvc_cache_default_dir(dir, sizeof(dir), &err) != KVC_OK)
            snprintf(dir, sizeof(dir), "?");
        fprintf(out, "  disk tier  %s: %s in %lld blocks, of a %s budget (--cache-disk; 0 = off)\n",
                dir, bytes_str((double)em.disk_bytes_used, a, sizeof(a)), (long long)em.disk_blocks,
                bytes_str((double)em.disk_bytes_budget, b, sizeof(b)));
    } else {
        fprintf(out, "  disk tier  off: the KV cache lives in RAM only\n");
    }
    if (s->params->cache_redis) {
        char url[512];
        redis_masked(s->params->cache_redis, url, sizeof(url));
        fprintf(out, "  Redis      %s, %s\n", url,
                em.redis_up ? "connected" : "not reachable now (requests go on without it)");
    } else {
        fprintf(out, "  Redis      none\n");
    }
    if (s->n_api_keys > 0)
        fprintf(out, "  API keys   required: %d key%s; %s\n", s->n_api_keys, s->n_api_keys > 1 ? "s" : "",
                s->server->share_cache_across_keys ? "one cache shared by all keys"
                                                   : "each key its own cache namespace");
    else
        fprintf(out, "  API keys   none: whoever reaches the port may call (--api-key)\n");
}
