/* context.c - the public model and context API over model.h, kv.h and forward.c. */
#include "context.h"
#include "snapshot.h"
#include "grammar.h"
#include "chat_template.h"
#include "quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void copy_err(const kvc_err *e, char *err, size_t err_size)
{
    if (err && err_size)
        snprintf(err, err_size, "%s", e->msg[0] ? e->msg : kvc_strerror(e->code));
}

/* ----------------------------------------------------------------- model */

kvc_model_params kvc_model_default_params(void)
{
    kvc_model_params p = { 0 };
    return p;
}

int kvc_model_load(const char *path, const kvc_model_params *params, kvc_model **out,
                   char *err, size_t err_size)
{
    kvc_err e = { 0 };
    kvc_model_params p = params ? *params : kvc_model_default_params();
    int rc = kvc_model_load_file(path, p.progress, p.progress_user, out, &e);
    if (rc)
        copy_err(&e, err, err_size);
    return rc;
}

void kvc_model_free(kvc_model *model) { kvc_model_release(model); }

void kvc_model_get_info(const kvc_model *m, kvc_model_info *out)
{
    const kvc_hparams *hp = &m->hp;
    out->name = m->name;
    out->arch = hp->arch_name;
    out->n_vocab = hp->n_vocab;
    out->n_ctx_train = hp->n_ctx_train;
    out->n_embd = hp->n_embd;
    out->n_layer = hp->n_layer;
    out->n_head = hp->n_head;
    out->n_head_kv = hp->n_head_kv;
    out->head_dim = hp->head_dim;
    out->n_ff = hp->n_ff;
    out->n_params = m->n_params;
    out->weight_bytes = m->weight_bytes;
}

int64_t kvc_model_tokenize(const kvc_model *m, const char *text, size_t len,
                           bool add_special, bool parse_special, int32_t *out, int64_t cap)
{
    return kvc_tokenize(m->tok, text, len, add_special, parse_special, out, cap);
}

int kvc_model_token_to_piece(const kvc_model *m, int32_t token, bool render_special,
                             char *buf, int cap)
{
    return kvc_token_to_piece(m->tok, token, render_special, buf, cap);
}

int32_t kvc_model_token_bos(const kvc_model *m) { return kvc_tokenizer_bos(m->tok); }
int32_t kvc_model_token_eos(const kvc_model *m) { return kvc_tokenizer_eos(m->tok); }
bool kvc_model_token_is_eog(const kvc_model *m, int32_t t) { return kvc_tokenizer_is_eog(m->tok, t); }
const char *kvc_model_chat_template(const kvc_model *m) { return m->chat_template; }

/* --------------------------------------------------------------- context */



kvc_context_params kvc_context_default_params(void)
{
    kvc_context_params p = { 0 };
    p.kv_type = KVC_KV_F16;
    return p;
}

static int kv_type_of(int32_t t)
{
    switch (t) {
    case KVC_KV_F16:  return KVC_TYPE_F16;
    case KVC_KV_F32:  return KVC_TYPE_F32;
    case KVC_KV_Q8_0: return KVC_TYPE_Q8_0;
    }
    return -1;
}

int32_t kvc_context_fit_n_ctx(const kvc_model *model, int32_t kv_type, int64_t kv_blocks,
                              int32_t n_seq)
{
    const int64_t B = KVC_BLOCK_TOKENS, n_train = model->hp.n_ctx_train;
    int64_t blocks = kv_blocks;
    if (blocks <= 0) {              /* no budget given: n_seq contexts in half the RAM */
        size_t bb = kvc_context_block_bytes(model, kv_type);
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 8ull << 30;
        if (bb == 0)                /* a bad type: kvc_context_new says so */
            return (int32_t)n_train;
        blocks = (int64_t)(ram / 2 / bb) / KVC_MAX(n_seq, 1);
    }
    int64_t fit = (blocks - 1) * B;  /* a block stays free for a copy on write */
    return (int32_t)KVC_MAX(KVC_MIN(n_train, fit), B);
}

/* The memory groups of the model's layers (kv.h): a window group per
 * distinct sliding window, every layer with its own KV heads and head dim.
 * Fills groups (window chunks n_blocks 0) and layers[n_layer]; returns the
 * number of groups, 0 when one full group of the pool's shape serves
 * (layers unused). A model kv.h cannot group (no full layer, too many
 * windows) keeps every layer in one full group: its attention is windowed
 * all the same, without the memory saving. Recurrent layers keep their
 * state_floats (kv.h's recurrent layers) in group 0; KV-shared layers
 * (Gemma 4's) say which layer they share, and take no memory. */
static int model_groups(const kvc_model *model, kvc_kv_group *groups, kvc_kv_layer *layers,
                        kvc_err *err)
{
    const kvc_hparams *hp = &model->hp;
    int32_t win[4096], kvh[4096], hd[4096];
    bool plain = true;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const kvc_layer *L = &model->layers[l];
        win[l] = L->window;
        kvh[l] = L->attn == KVC_ATTN_NONE ? -1 : L->n_head_kv;   /* no mixer: no K/V (kv.h) */
        hd[l] = L->head_dim;
        plain = plain && !L->window && !L->state_floats && L->kv_layer == l &&
                L->n_head_kv == hp->n_head_kv && L->head_dim == hp->head_dim;
    }
    if (plain)
        return 0;
    int n = kvc_kv_groups_of_layers(hp->n_layer, win, kvh, hd, groups, layers, NULL);
    if (n <= 0)
        n = kvc_kv_groups_of_layers(hp->n_layer, NULL, kvh, hd, groups, layers, err);
    for (int32_t l = 0; n > 0 && l < hp->n_layer; l++) {   /* recurrent: a state, no K/V */
        layers[l].state_floats = model->layers[l].state_floats;
        layers[l].shares = l - model->layers[l].kv_layer;
    }
    return n;
}

/* Chunks per window group g of a pool of kv_blocks for p (n_run and n_batch
 * resolved), as kvc_context_params.kv_window_blocks says; KVC_ERR_INVALID_ARG
 * when asked for fewer than the running sequences hold. */
static int window_chunks(const kvc_context_params *p, const kvc_kv_group *g, int64_t *out,
                         kvc_err *err)
{
    const int64_t B = KVC_BLOCK_TOKENS;
    const int64_t need = (int64_t)p->n_run * (((int64_t)g->window + p->n_batch + B - 1) / B + 2);
    if (p->kv_window_blocks > 0 && p->kv_window_blocks < KVC_MIN(need, p->kv_blocks))
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "a window pool of %lld chunks is too small: %d running sequences with "
                        "window %d and batches of %d hold up to %lld",
                        (long long)p->kv_window_blocks, p->n_run, g->window, p->n_batch, (long long)need);
    /* by default twice the running windows, unless that is more than half
     * the blocks: then the saving is not worth the hits it loses */
    const int64_t n = p->kv_window_blocks != 0 ? p->kv_window_blocks : 2 * need;
    *out = n < 0 || (p->kv_window_blocks == 0 && 2 * n > p->kv_blocks) ? p->kv_blocks
                                                                         : KVC_MIN(n, p->kv_blocks);
    return KVC_OK;
}

/* The pool of c->p for its model: its memory groups, each window group with
 * window_chunks() chunks (or n_window: kvc_context_set_windows), the layers'
 * windows from win (NULL: the model's). */
static int make_pool(kvc_context *c, uint32_t kt, const int32_t *win, int64_t n_window,
                     kvc_kv_pool **out, kvc_err *err)
{
    const kvc_model *model = c->model;
    const int32_t n_layer = model->hp.n_layer;
    kvc_kv_group groups[KVC_KV_MAX_GROUPS];
    kvc_kv_layer *layers = malloc((size_t)n_layer * sizeof(*layers));
    if (!layers)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    int rc = win ? kvc_kv_groups_of_layers(n_layer, win, NULL, NULL, groups, layers, err)
                 : model_groups(model, groups, layers, err);
    for (int32_t g = 1; rc > 0 && g < rc; g++) {
        int64_t n = n_window;
        int r2 = win ? KVC_OK : window_chunks(&c->p, &groups[g], &n, err);
        if (r2)
            rc = r2;
        else
            groups[g].n_blocks = n;
    }
    if (rc >= 0) {
        kvc_kv_pool_params pp = { model->hp.n_layer, model->hp.n_head_kv, model->hp.head_dim,
                                  KVC_BLOCK_TOKENS, kt, c->p.kv_blocks, rc, groups, layers };
        rc = kvc_kv_pool_new(&pp, out, err);
    }
    free(layers);
    return rc;
}

int kvc_context_new(kvc_model *model, const kvc_context_params *params, kvc_context **out,
                    char *err, size_t err_size)
{
    kvc_err e = { 0 };
    *out = NULL;
    kvc_context_params p = params ? *params : kvc_context_default_params();
    if (p.n_seq <= 0)
        p.n_seq = 1;
    if (p.n_ctx <= 0)
        p.n_ctx = kvc_context_fit_n_ctx(model, p.kv_type, p.kv_blocks, p.n_seq);
    if (p.n_batch <= 0)
        p.n_batch = 512;
    if (p.n_threads <= 0)
        p.n_threads = (int32_t)KVC_MAX(1, sysconf(_SC_NPROCESSORS_ONLN));
    if (p.n_batch > p.n_ctx)
        p.n_batch = p.n_ctx;
    if (p.n_run <= 0 || p.n_run > p.n_seq)
        p.n_run = p.n_seq;
    const int32_t B = KVC_BLOCK_TOKENS;
    if (p.kv_blocks <= 0)   /* and one for a copy-on-write (a shared block being extended) */
        p.kv_blocks = (int64_t)p.n_seq * ((p.n_ctx + B - 1) / B) + 1;
    int kt = kv_type_of(p.kv_type);
    if (kt < 0) {
        kvc_fail(&e, KVC_ERR_INVALID_ARG, "KV type %d not supported", p.kv_type);
        copy_err(&e, err, err_size);
        return e.code;
    }
    kvc_context *c = calloc(1, sizeof(*c));
    int rc = c ? KVC_OK : kvc_fail(&e, KVC_ERR_NOMEM, "out of memory");
    if (!rc) {
        c->model = model;
        c->p = p;
        rc = make_pool(c, (uint32_t)kt, NULL, 0, &c->pool, &e);
    }
    if (!rc)
        rc = kvc_pc_new(c->pool, &c->pc, &e);
    if (!rc && kvc_kv_state_floats(c->pool) > 0) {   /* recurrent layers: snapshots */
        rc = kvc_snaps_new(c->pool, c->pc, model->hp.n_vocab, &c->snaps, &e);
        int32_t S = p.snapshot_interval;
        c->snap_interval = S < 0 ? 0 : S == 0 ? kvc_context_snap_interval(model, p.kv_type)
                                 : (S + B - 1) / B * B;
    }
    if (!rc)
        rc = kvc_compute_new(model, p.n_batch, p.n_ctx, p.n_threads, &c->compute, &e);
    if (!rc) {
        c->seqs = calloc((size_t)p.n_seq, sizeof(kvc_kv_seq));
        c->items = calloc((size_t)p.n_batch, sizeof(kvc_batch_item));
        c->logits = malloc((size_t)model->hp.n_vocab * sizeof(float));
        c->logits_cap = 1;
        if (!c->seqs || !c->items || !c->logits)
            rc = kvc_fail(&e, KVC_ERR_NOMEM, "out of memory");
    }
    if (rc) {
        kvc_context_free(c);
        copy_err(&e, err, err_size);
        return rc;
    }
    *out = c;
    return KVC_OK;
}

void kvc_context_free(kvc_context *c)
{
    if (!c)
        return;
    if (c->seqs && c->pool)
        for (int32_t s = 0; s < c->p.n_seq; s++)
            kvc_kv_seq_release(c->pool, &c->seqs[s]);
    if (c->snaps)
        kvc_snaps_set_tiers(c->snaps, NULL);
    kvc_tiers_free(c->tiers);                /* writes what is queued; unhooks the tree */
    kvc_bs_close(c->store);
    kvc_snaps_free(c->snaps);
    kvc_pc_free(c->pc);
    kvc_chat_template_free(c->chat_tmpl);
    free(c->chat_tmpl_key);
    kvc_gvocab_free(c->gvocab);
    free(c->seqs);
    free(c->items);
    free(c->logits);
    kvc_compute_free(c->compute);
    kvc_kv_pool_free(c->pool);
    free(c);
}

int kvc_context_set_windows(kvc_context *c, const int32_t *window, int64_t n_window, kvc_err *err)
{
    if (c->snaps)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "memory groups: window groups beside recurrent "
                        "layers are not supported");
    bool fresh = !c->tiers && kvc_pc_n_nodes(c->pc) == 0 && n_window >= 0;
    for (int32_t s = 0; fresh && s < c->p.n_seq; s++)
        fresh = c->seqs[s].n_blocks == 0;
    if (!fresh)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "memory groups: %s",
                        n_window < 0 ? "negative window capacity" : "the context's cache is in use already");
    kvc_kv_pool *pool = NULL;
    kvc_prefix_cache *pc = NULL;
    int rc = make_pool(c, kvc_kv_pool_params_of(c->pool)->type, window, n_window, &pool, err);
    if (!rc)
        rc = kvc_pc_new(pool, &pc, err);
    if (rc) {
        kvc_pc_free(pc);
        kvc_kv_pool_free(pool);
        return rc;
    }
    kvc_pc_free(c->pc);
    kvc_kv_pool_free(c->pool);
    c->pc = pc;
    c->pool = pool;
    return KVC_OK;
}

int kvc_context_set_tiers(kvc_context *c, const char *model_path, const char *dir, int64_t mib,
                          const kvc_redis_store_params *redis, kvc_err *err)
{
    const bool shared = redis && redis->url;
    if (c->tiers || kvc_pc_n_nodes(c->pc) > 0 || mib < 0 || !model_path || (!mib && !shared))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "cache tiers: %s",
                        !model_path ? "no model file to fingerprint"
                        : mib < 0   ? "negative size"
                        : !mib && !shared ? "neither disk nor Redis"
                                    : "the context's cache is in use already");
    kvc_disk_store_params dp = { dir, (uint64_t)mib << 20, false, redis ? redis->warn : NULL,
                                 redis ? redis->warn_user : NULL };
    kvc_block_store *store = NULL;
    kvc_tiers *tiers = NULL;
    uint64_t fp = 0;
    char dirbuf[4096];
    int rc = mib ? kvc_disk_store_open(&dp, &store, err) : KVC_OK;
    if (!rc && mib && !dir)
        rc = kvc_cache_default_dir(dirbuf, sizeof(dirbuf), err);
    if (!rc)   /* without a disk tier: computed at each start, not remembered */
        rc = kvc_model_fingerprint(model_path, !mib ? NULL : dir ? dir : dirbuf, &fp, err);
    if (!rc)
        rc = kvc_pc_set_model(c->pc, fp, err);
    if (!rc && shared) {                             /* Redis behind the disk */
        kvc_redis_store_params rp = *redis;
        rp.model_fp = fp;
        kvc_block_store *local = store;
        store = NULL;
        rc = kvc_redis_store_open(&rp, local, &store, err);
    }
    if (!rc)
        rc = kvc_tiers_new(c->pc, c->pool, store, 0, &tiers, err);
    if (rc) {
        kvc_bs_close(store);
        return rc;
    }
    c->store = store;
    c->tiers = tiers;
    if (c->snaps)
        kvc_snaps_set_tiers(c->snaps, tiers);
    return KVC_OK;
}

int kvc_context_set_disk(kvc_context *c, const char *model_path, const char *dir, int64_t mib,
                         kvc_err *err)
{
    return kvc_context_set_tiers(c, model_path, dir, mib, NULL, err);
}

int kvc_context_enable_redis(kvc_context *c, const char *model_path, const char *dir,
                             int64_t mib, const char *url, const char *password,
                             char *err, size_t err_size)
{
    kvc_err e = { 0 };
    kvc_redis_store_params rp = { .url = url, .password = password };
    int rc = kvc_context_set_tiers(c, model_path, dir, mib, &rp, &e);
    if (rc)
        copy_err(&e, err, err_size);
    return rc;
}

int kvc_context_enable_disk(kvc_context *c, const char *model_path, const char *dir,
                            int64_t mib, char *err, size_t err_size)
{
    kvc_err e = { 0 };
    int rc = kvc_context_set_disk(c, model_path, dir, mib, &e);
    if (rc)
        copy_err(&e, err, err_size);
    return rc;
}

/* Bytes of group g's chunk (-1: every group's) of a pool for model, the
 * windows of its groups into window (may be NULL); 0 for a bad type or
 * layout. */
static size_t group_bytes(const kvc_model *model, int32_t kv_type, int32_t g, int32_t *window)
{
    int kt = kv_type_of(kv_type);
    kvc_kv_group groups[KVC_KV_MAX_GROUPS];
    kvc_kv_layer *layers = malloc((size_t)model->hp.n_layer * sizeof(*layers));
    int n = kt < 0 || !layers ? -1 : model_groups(model, groups, layers, NULL);
    size_t bytes = 0;
    if (n >= 0 && g < KVC_MAX(n, 1)) {
        kvc_kv_pool_params pp = { model->hp.n_layer, model->hp.n_head_kv, model->hp.head_dim,
                                  KVC_BLOCK_TOKENS, (uint32_t)kt, 1, n, groups, layers };
        bytes = kvc_kv_group_bytes_for(&pp, g);
        if (window)
            *window = n > 0 ? groups[g].window : 0;
    }
    free(layers);
    return bytes;
}

size_t kvc_context_block_bytes(const kvc_model *model, int32_t kv_type)
{
    return group_bytes(model, kv_type, 0, NULL);
}

int64_t kvc_context_blocks_for(const kvc_model *model, int32_t kv_type, int32_t n_run,
                               int32_t n_batch, uint64_t bytes, int64_t *kv_window_blocks)
{
    const int64_t B = KVC_BLOCK_TOKENS;
    const size_t f0 = group_bytes(model, kv_type, 0, NULL);
    size_t fw = 0, win = 0, b;
    int32_t w = 0;
    bool small = false;                      /* the default would keep every window chunk */
    n_batch = n_batch > 0 ? n_batch : 512;
    int64_t counts[KVC_KV_MAX_GROUPS];
    for (int32_t g = 1; g < KVC_KV_MAX_GROUPS && (b = group_bytes(model, kv_type, g, &w)); g++) {
        counts[g] = *kv_window_blocks > 0 ? *kv_window_blocks
                  : 2 * (int64_t)KVC_MAX(n_run, 1) * ((w + n_batch + B - 1) / B + 2);
        fw += b;
        win += b * (size_t)counts[g];
    }
    if (f0 == 0)
        return 0;
    if (*kv_window_blocks < 0 || fw == 0)
        return (int64_t)(bytes / (f0 + fw));
    int64_t blocks = bytes > win ? (int64_t)((bytes - win) / f0) : 0;
    for (int32_t g = 1; fw && g < KVC_KV_MAX_GROUPS && group_bytes(model, kv_type, g, NULL); g++)
        small = small || 2 * counts[g] > blocks;
    if (*kv_window_blocks == 0 && small) {   /* as window_chunks() would: every one */
        *kv_window_blocks = -1;
        return (int64_t)(bytes / (f0 + fw));
    }
    return blocks;
}

bool kvc_context_make_room(kvc_context *c, int64_t n_free)
{
    int64_t have = kvc_kv_n_free(c->pool);
    if (have >= n_free)
        return true;
    int64_t snaps = c->snaps ? kvc_snaps_evictable(c->snaps) : 0;
    if (have + kvc_pc_evictable(c->pc) + snaps < n_free) {
        c->room_refused++;
        return false;                        /* know before evicting: nothing is lost */
    }
    if (!c->snaps) {
        kvc_pc_evict(c->pc, n_free - have);
        return kvc_kv_n_free(c->pool) >= n_free;
    }
    /* snapshots and the tree's leaves, least recently used first */
    while (kvc_kv_n_free(c->pool) < n_free) {
        const kvc_pc_node *leaf = kvc_pc_lru_next(c->pc, NULL);
        if (leaf && leaf->last_used <= kvc_snaps_oldest(c->snaps))
            kvc_pc_evict(c->pc, 1);
        else if (!kvc_snaps_evict_one(c->snaps))
            break;
    }
    return kvc_kv_n_free(c->pool) >= n_free;
}

int32_t kvc_context_snap_interval(const kvc_model *model, int32_t kv_type)
{
    int64_t state = 0;
    for (int32_t l = 0; l < model->hp.n_layer; l++)
        state += model->layers[l].state_floats;
    const int64_t B = KVC_BLOCK_TOKENS;
    size_t block = kvc_context_block_bytes(model, kv_type);
    if (state == 0 || block == 0)
        return 0;
    int64_t S = (int64_t)((uint64_t)state * sizeof(float) * (uint64_t)B / block);
    S = (S + B - 1) / B * B;
    return (int32_t)KVC_MAX(64, KVC_MIN(S, 4096));
}

int kvc_context_logits_reserve(kvc_context *c, int32_t rows, kvc_err *err)
{
    if (rows <= c->logits_cap)
        return KVC_OK;
    /* grown on demand: a full batch of logits of a large vocabulary is big */
    float *l = realloc(c->logits, (size_t)rows * (size_t)c->model->hp.n_vocab * sizeof(float));
    if (!l)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory for %d x %d logits", rows,
                        c->model->hp.n_vocab);
    c->logits = l;
    c->logits_cap = rows;
    return KVC_OK;
}

int32_t kvc_context_n_ctx(const kvc_context *c) { return c->p.n_ctx; }
int32_t kvc_context_n_batch(const kvc_context *c) { return c->p.n_batch; }
int32_t kvc_context_n_threads(const kvc_context *c) { return c->p.n_threads; }

int kvc_context_decode(kvc_context *c, int32_t seq, const int32_t *tokens, int32_t n,
                       bool all_logits, char *err, size_t err_size)
{
    kvc_err e = { 0 };
    int rc = KVC_OK;
    if (seq < 0 || seq >= c->p.n_seq)
        rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "sequence %d outside [0, %d)", seq, c->p.n_seq);
    else if (n < 1 || (all_logits && n > c->p.n_batch))
        rc = kvc_fail(&e, KVC_ERR_INVALID_ARG, "decode of %d tokens (all logits: at most %d)", n,
                      c->p.n_batch);
    if (!rc && all_logits)
        rc = kvc_context_logits_reserve(c, n, &e);
    kvc_kv_seq *s = rc ? NULL : &c->seqs[seq];
    int64_t len0 = s ? s->n_tokens : 0;
    if (!rc && len0 + n > c->p.n_ctx)
        rc = kvc_fail(&e, KVC_ERR_CONTEXT_LENGTH, "%lld tokens exceed the context of %d",
                      (long long)(len0 + n), c->p.n_ctx);
    if (!rc) {
        /* blocks only the prefix tree holds give way (one more for a copy-on-write) */
        int64_t B = kvc_kv_block_tokens(c->pool);
        kvc_context_make_room(c, c->promised + (len0 + n + B - 1) / B - s->n_blocks + 1);
        rc = kvc_kv_seq_reserve(c->pool, s, len0 + n, &e);
    }
    for (int32_t done = 0; !rc && done < n;) {
        int32_t m = KVC_MIN(n - done, c->p.n_batch);
        for (int32_t i = 0; i < m; i++) {
            kvc_batch_item *it = &c->items[i];
            it->token = tokens[done + i];
            it->pos = (int32_t)(len0 + done + i);
            it->seq = s;
            it->want_logits = all_logits || done + i == n - 1;
        }
        rc = kvc_compute_forward(c->compute, c->pool, c->items, m, c->logits, &e);
        done += m;
    }
    if (rc) {
        if (s)
            kvc_kv_seq_truncate(c->pool, s, len0);
        c->n_logits = 0;
        copy_err(&e, err, err_size);
        return rc;
    }
    c->n_logits = all_logits ? n : 1;
    return KVC_OK;
}

const float *kvc_context_logits(const kvc_context *c, int32_t i)
{
    if (i < 0)
        i = c->n_logits - 1;
    if (i < 0 || i >= c->n_logits)
        return NULL;
    return c->logits + (size_t)i * (size_t)c->model->hp.n_vocab;
}

int32_t kvc_context_seq_len(const kvc_context *c, int32_t seq)
{
    if (seq < 0 || seq >= c->p.n_seq)
        return -1;
    return (int32_t)c->seqs[seq].n_tokens;
}

int kvc_context_seq_truncate(kvc_context *c, int32_t seq, int32_t n_keep)
{
    if (seq < 0 || seq >= c->p.n_seq || n_keep < 0)
        return KVC_ERR_INVALID_ARG;
    kvc_kv_seq_truncate(c->pool, &c->seqs[seq], n_keep);
    return KVC_OK;
}

/* ---------------------------------------------------------- detokenizer */

struct kvc_detokenizer {
    kvc_detok d;
};

kvc_detokenizer *kvc_detokenizer_new(const kvc_model *m, bool render_special)
{
    kvc_detokenizer *d = malloc(sizeof(*d));
    if (d)
        kvc_detok_init(&d->d, m->tok, render_special);
    return d;
}

void kvc_detokenizer_free(kvc_detokenizer *d) { free(d); }

int kvc_detokenizer_feed(kvc_detokenizer *d, int32_t token, char *out, int cap)
{
    return kvc_detok_feed(&d->d, token, out, cap);
}

int kvc_detokenizer_flush(kvc_detokenizer *d, char *out, int cap)
{
    return kvc_detok_flush(&d->d, out, cap);
}
