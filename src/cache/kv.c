/* kv.c - the paged KV pool: per memory group one slab of chunks and a free
 * stack; per block a reference count and (groups past 0) its chunk; the
 * window chunks no sequence holds on two LRU lists for eviction. */
#include "kv.h"
#include "quant.h"

#include <stdlib.h>
#include <string.h>

/* The eviction lists of the chunks no sequence holds, evicted in this
 * order: untagged blocks' (no hit but their resting sequence's), tagged
 * ones', tagged kept ones' (kvc_kv_seq_keep: where a request is likely to
 * diverge). */
enum { LIST_DEAD = 0, LIST_LIVE = 1, LIST_KEPT = 2, N_LISTS = 3, NO_LIST = -1 };

typedef struct kv_slab {
    kvc_kv_group g;           /* n_blocks resolved */
    size_t    chunk_bytes;    /* its layers, K and V */
    uint8_t  *data;           /* g.n_blocks * chunk_bytes */
    int32_t  *free_stack;     /* ids of free chunks */
    int64_t   n_free;
    int64_t   n_held;         /* chunks with hold > 0 */
    /* groups past 0 only: */
    int32_t  *chunk;          /* [pool n_blocks] each block's chunk, or -1 */
    int32_t  *owner;          /* [g.n_blocks] each chunk's block, or -1 when free */
    int32_t  *hold;           /* [pool n_blocks] sequences holding the block's chunk */
    int32_t  *prev, *next;    /* [g.n_blocks] the eviction lists, by chunk */
    int8_t   *list;           /* [g.n_blocks] the list a chunk is on, or NO_LIST */
    uint8_t  *kept;           /* [pool n_blocks] 1: its chunk goes on LIST_KEPT (kvc_kv_seq_keep) */
    int32_t   head[N_LISTS], tail[N_LISTS];
} kv_slab;

typedef struct kv_layer {
    int32_t group, n_kv_head, head_dim;
    int32_t kv_of;            /* the layer whose K/V it reads: itself, or the one it shares */
    size_t  row_bytes;        /* one head, one position */
    size_t  off;              /* of its K in its group's chunk; V follows n_kv_head * row_bytes * B later */
    int64_t state_floats;     /* recurrent: its state's floats (no K/V), else 0 */
    int64_t state_off;        /* recurrent: its state's offset in kvc_kv_seq.state */
} kv_layer;

struct kvc_kv_pool {
    kvc_kv_pool_params p;     /* resolved; groups and layers point to g_params and l_params */
    kvc_kv_group   g_params[KVC_KV_MAX_GROUPS];
    kvc_kv_layer  *l_params;
    kv_layer      *layer;     /* [n_layer] */
    kv_slab        slab[KVC_KV_MAX_GROUPS];
    size_t    block_bytes;    /* every group's chunk */
    int64_t   state_floats;   /* every recurrent layer's state */
    int32_t  *refcount;       /* n_blocks */
    void    **tag;            /* n_blocks: the watcher's tag of each block, or NULL */
    kvc_kv_watch_fn watch;    /* called on a tagged block's 1 <-> 2 transitions */
    void     *watch_user;
};

/* ------------------------------------------------------------ layout */

/* Resolve p into q (groups into gs, layers into ls, chunk sizes into bytes):
 * KVC_OK or KVC_ERR_INVALID_ARG with what is wrong. */
static int resolve(const kvc_kv_pool_params *p, kvc_kv_pool_params *q, kvc_kv_group *gs, kv_layer *ls,
                   size_t *bytes, kvc_err *err)
{
    *q = *p;
    if (q->block_tokens == 0)
        q->block_tokens = KVC_BLOCK_TOKENS;
    if (q->n_groups == 0) {
        q->n_groups = 1;
        q->groups = NULL;
        q->layers = NULL;
    }
    if (q->n_layer <= 0 || q->n_kv_head <= 0 || q->head_dim <= 0 || q->block_tokens <= 0 ||
        q->n_blocks <= 0 || q->n_blocks > INT32_MAX)
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "KV pool: bad shape (layers %d, kv heads %d, head dim %d, block %d, blocks %lld)",
                        q->n_layer, q->n_kv_head, q->head_dim, q->block_tokens, (long long)q->n_blocks);
    if (q->type != KVC_TYPE_F16 && q->type != KVC_TYPE_F32 && q->type != KVC_TYPE_Q8_0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: type %u not supported (f16, f32, q8_0)", q->type);
    if (q->n_groups < 1 || q->n_groups > KVC_KV_MAX_GROUPS || (q->n_groups > 1 && (!q->groups || !q->layers)))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: %d memory groups (1 to %d, with their layers)",
                        q->n_groups, KVC_KV_MAX_GROUPS);
    for (int32_t g = 0; g < q->n_groups; g++) {
        gs[g] = q->groups ? q->groups[g] : (kvc_kv_group){ KVC_KV_FULL, 0, 0 };
        if (g == 0 && gs[g].kind != KVC_KV_FULL)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: memory group 0 must be full");
        if (g > 0 && (gs[g].kind != KVC_KV_WINDOW || gs[g].window < 1))
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: memory group %d: kind %d, window %d", g,
                            (int)gs[g].kind, gs[g].window);
        if (g == 0 || gs[g].n_blocks <= 0 || gs[g].n_blocks > q->n_blocks)
            gs[g].n_blocks = q->n_blocks;
        if (gs[g].kind == KVC_KV_FULL)
            gs[g].window = 0;
        bytes[g] = 0;
    }
    int64_t state_floats = 0;
    for (int32_t l = 0; l < q->n_layer; l++) {
        const kvc_kv_layer in = q->layers ? q->layers[l] : (kvc_kv_layer){ 0, 0, 0, 0, 0 };
        kv_layer *L = &ls[l];
        L->group = in.group;
        L->state_floats = in.state_floats > 0 ? in.state_floats : 0;
        L->state_off = state_floats;
        state_floats += L->state_floats;
        L->n_kv_head = in.n_kv_head > 0 ? in.n_kv_head : in.n_kv_head < 0 ? 0 : q->n_kv_head;
        L->head_dim = in.head_dim > 0 ? in.head_dim : q->head_dim;
        if (L->group < 0 || L->group >= q->n_groups)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: layer %d in memory group %d of %d", l, L->group,
                            q->n_groups);
        L->row_bytes = kvc_row_size(q->type, L->head_dim);
        if (L->row_bytes == 0)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: layer %d: head dim %d is not a multiple of the %s block",
                            l, L->head_dim, kvc_type_info(q->type)->name);
        L->kv_of = l - in.shares;
        if (in.shares != 0) {   /* KV-shared: the source's place in the chunk, no bytes */
            const kv_layer *S = in.shares > 0 && in.shares <= l ? &ls[L->kv_of] : NULL;
            if (!S || S->kv_of != L->kv_of || S->group != L->group || S->n_kv_head != L->n_kv_head ||
                S->head_dim != L->head_dim || S->state_floats || L->state_floats)
                return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: layer %d shares the K/V of layer "
                                "%d: not an earlier layer of its group and shape that keeps its own",
                                l, L->kv_of);
            L->off = S->off;
            continue;
        }
        L->off = bytes[L->group];
        if (L->state_floats == 0)
            bytes[L->group] += L->row_bytes * (size_t)q->block_tokens * (size_t)L->n_kv_head * 2;
    }
    for (int32_t g = 0; g < q->n_groups; g++)
        if (bytes[g] == 0)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: memory group %d has no layer", g);
    return KVC_OK;
}

int kvc_kv_groups_of_layers(int32_t n_layer, const int32_t *window, const int32_t *n_kv_head,
                            const int32_t *head_dim, kvc_kv_group *groups, kvc_kv_layer *layers,
                            kvc_err *err)
{
    int32_t n = 1, n_full = 0;
    groups[0] = (kvc_kv_group){ KVC_KV_FULL, 0, 0 };
    for (int32_t l = 0; l < n_layer; l++) {
        const int32_t w = window ? window[l] : 0;
        int32_t g = 0;
        if (w > 0) {
            for (g = 1; g < n && groups[g].window != w; g++)
                ;
            if (g == n) {
                if (n == KVC_KV_MAX_GROUPS)
                    return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: more than %d distinct windows",
                                    KVC_KV_MAX_GROUPS - 1);
                groups[n++] = (kvc_kv_group){ KVC_KV_WINDOW, w, 0 };
            }
        }
        n_full += g == 0;
        layers[l] = (kvc_kv_layer){ g, n_kv_head ? n_kv_head[l] : 0, head_dim ? head_dim[l] : 0, 0, 0 };
    }
    if (n_full == 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: no full-attention layer for memory group 0");
    return n;
}

size_t kvc_kv_group_bytes_for(const kvc_kv_pool_params *p, int32_t g)
{
    kvc_kv_pool_params q;
    kvc_kv_group gs[KVC_KV_MAX_GROUPS];
    size_t bytes[KVC_KV_MAX_GROUPS], sum = 0;
    if (p->n_layer <= 0 || p->n_layer > (1 << 16))
        return 0;
    kv_layer *ls = malloc((size_t)p->n_layer * sizeof(*ls));
    kvc_kv_pool_params one = *p;
    one.n_blocks = one.n_blocks > 0 ? one.n_blocks : 1;
    if (ls && resolve(&one, &q, gs, ls, bytes, NULL) == KVC_OK)
        for (int32_t i = 0; i < q.n_groups; i++)
            sum += g < 0 || g == i ? bytes[i] : 0;
    free(ls);
    return sum;
}

size_t kvc_kv_block_bytes_for(const kvc_kv_pool_params *p)
{
    return kvc_kv_group_bytes_for(p, -1);
}

/* ------------------------------------------------------------ the pool */

int kvc_kv_pool_new(const kvc_kv_pool_params *p, kvc_kv_pool **out, kvc_err *err)
{
    *out = NULL;
    kvc_kv_pool *pool = calloc(1, sizeof(*pool));
    if (!pool || p->n_layer <= 0 || p->n_layer > (1 << 16) ||
        !(pool->layer = malloc((size_t)p->n_layer * sizeof(kv_layer))) ||
        !(pool->l_params = malloc((size_t)p->n_layer * sizeof(kvc_kv_layer)))) {
        kvc_kv_pool_free(pool);
        return p->n_layer <= 0 || p->n_layer > (1 << 16)
            ? kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: %d layers", p->n_layer)
            : kvc_fail(err, KVC_ERR_NOMEM, "KV pool: out of memory");
    }
    size_t bytes[KVC_KV_MAX_GROUPS];
    int rc = resolve(p, &pool->p, pool->g_params, pool->layer, bytes, err);
    if (rc) {
        kvc_kv_pool_free(pool);
        return rc;
    }
    kvc_kv_pool_params *q = &pool->p;
    for (int32_t l = 0; l < q->n_layer; l++) {
        const kv_layer *L = &pool->layer[l];
        pool->l_params[l] = (kvc_kv_layer){ L->group, L->n_kv_head ? L->n_kv_head : -1, L->head_dim,
                                            L->state_floats, l - L->kv_of };
        pool->state_floats += L->state_floats;
    }
    q->groups = pool->g_params;
    q->layers = pool->l_params;
    const size_t nb = (size_t)q->n_blocks;
    pool->refcount = calloc(nb, sizeof(int32_t));
    pool->tag = calloc(nb, sizeof(void *));
    bool ok = pool->refcount && pool->tag;
    size_t total = 0;
    for (int32_t g = 0; g < q->n_groups && ok; g++) {
        kv_slab *s = &pool->slab[g];
        const size_t nc = (size_t)pool->g_params[g].n_blocks;
        s->g = pool->g_params[g];
        s->chunk_bytes = bytes[g];
        s->data = kvc_alloc_aligned(s->chunk_bytes * nc);
        s->free_stack = malloc(nc * sizeof(int32_t));
        total += s->chunk_bytes * nc;
        ok = s->data && s->free_stack;
        if (ok && g > 0) {
            s->chunk = malloc(nb * sizeof(int32_t));
            s->hold = calloc(nb, sizeof(int32_t));
            s->owner = malloc(nc * sizeof(int32_t));
            s->prev = malloc(nc * sizeof(int32_t));
            s->next = malloc(nc * sizeof(int32_t));
            s->list = malloc(nc);
            s->kept = calloc(nb, 1);
            ok = s->chunk && s->hold && s->owner && s->prev && s->next && s->list && s->kept;
            if (ok) {
                for (size_t i = 0; i < nb; i++)
                    s->chunk[i] = -1;
                for (size_t i = 0; i < nc; i++)
                    s->owner[i] = -1;
                memset(s->list, NO_LIST, nc);
                for (int L = 0; L < N_LISTS; L++)
                    s->head[L] = s->tail[L] = -1;
            }
        }
        if (ok) {   /* lowest ids on top of the stack, so allocation order is predictable */
            for (size_t i = 0; i < nc; i++)
                s->free_stack[i] = (int32_t)(nc - 1 - i);
            s->n_free = (int64_t)nc;
        }
        pool->block_bytes += s->chunk_bytes;
    }
    if (!ok) {
        kvc_kv_pool_free(pool);
        return kvc_fail(err, KVC_ERR_NOMEM, "KV pool: cannot allocate %zu MiB", total >> 20);
    }
    *out = pool;
    return KVC_OK;
}

void kvc_kv_pool_free(kvc_kv_pool *pool)
{
    if (!pool)
        return;
    for (int32_t g = 0; g < KVC_KV_MAX_GROUPS; g++) {
        kv_slab *s = &pool->slab[g];
        kvc_free_aligned(s->data);
        free(s->free_stack);
        free(s->chunk);
        free(s->owner);
        free(s->hold);
        free(s->prev);
        free(s->next);
        free(s->list);
        free(s->kept);
    }
    free(pool->refcount);
    free(pool->tag);
    free(pool->layer);
    free(pool->l_params);
    free(pool);
}

const kvc_kv_pool_params *kvc_kv_pool_params_of(const kvc_kv_pool *pool) { return &pool->p; }
int32_t kvc_kv_block_tokens(const kvc_kv_pool *pool) { return pool->p.block_tokens; }
int64_t kvc_kv_n_blocks(const kvc_kv_pool *pool) { return pool->p.n_blocks; }
int64_t kvc_kv_n_free(const kvc_kv_pool *pool) { return pool->slab[0].n_free; }
size_t  kvc_kv_block_bytes(const kvc_kv_pool *pool) { return pool->block_bytes; }
size_t  kvc_kv_row_bytes(const kvc_kv_pool *pool) { return pool->layer[0].row_bytes; }
size_t  kvc_kv_layer_row_bytes(const kvc_kv_pool *pool, int32_t layer) { return pool->layer[layer].row_bytes; }
int32_t kvc_kv_layer_n_kv_head(const kvc_kv_pool *pool, int32_t layer) { return pool->layer[layer].n_kv_head; }
int32_t kvc_kv_layer_head_dim(const kvc_kv_pool *pool, int32_t layer) { return pool->layer[layer].head_dim; }
int32_t kvc_kv_layer_kv_of(const kvc_kv_pool *pool, int32_t layer) { return pool->layer[layer].kv_of; }
int32_t kvc_kv_n_groups(const kvc_kv_pool *pool) { return pool->p.n_groups; }
const kvc_kv_group *kvc_kv_group_of(const kvc_kv_pool *pool, int32_t g) { return &pool->g_params[g]; }
int32_t kvc_kv_layer_group(const kvc_kv_pool *pool, int32_t layer) { return pool->layer[layer].group; }
int32_t kvc_kv_layer_window(const kvc_kv_pool *pool, int32_t layer) { return pool->g_params[pool->layer[layer].group].window; }
size_t  kvc_kv_group_chunk_bytes(const kvc_kv_pool *pool, int32_t g) { return pool->slab[g].chunk_bytes; }
int64_t kvc_kv_group_n_free(const kvc_kv_pool *pool, int32_t g) { return pool->slab[g].n_free; }

int64_t kvc_kv_group_n_held(const kvc_kv_pool *pool, int32_t g)
{
    return g == 0 ? pool->p.n_blocks - pool->slab[0].n_free : pool->slab[g].n_held;
}

/* The block's chunk of group g, or -1. */
static int32_t chunk_of(const kvc_kv_pool *pool, int32_t block, int32_t g)
{
    return g == 0 ? block : pool->slab[g].chunk[block];
}

bool kvc_kv_block_has(const kvc_kv_pool *pool, int32_t block, int32_t g)
{
    return chunk_of(pool, block, g) >= 0;
}

bool kvc_kv_block_whole(const kvc_kv_pool *pool, int32_t block)
{
    for (int32_t g = 1; g < pool->p.n_groups; g++)
        if (pool->slab[g].chunk[block] < 0)
            return false;
    return true;
}

/* ------------------------------------------------------------ window chunks */

static void list_remove(kv_slab *s, int32_t c)
{
    const int L = s->list[c];
    if (L == NO_LIST)
        return;
    if (s->prev[c] >= 0)
        s->next[s->prev[c]] = s->next[c];
    else
        s->head[L] = s->next[c];
    if (s->next[c] >= 0)
        s->prev[s->next[c]] = s->prev[c];
    else
        s->tail[L] = s->prev[c];
    s->list[c] = NO_LIST;
}

/* Chunk c (held by no sequence) at the most recent end of its list. */
static void list_push(kvc_kv_pool *pool, kv_slab *s, int32_t c)
{
    const int32_t b = s->owner[c];
    const int L = !pool->tag[b] ? LIST_DEAD : s->kept[b] ? LIST_KEPT : LIST_LIVE;
    s->prev[c] = s->tail[L];
    s->next[c] = -1;
    if (s->tail[L] >= 0)
        s->next[s->tail[L]] = c;
    else
        s->head[L] = c;
    s->tail[L] = c;
    s->list[c] = (int8_t)L;
}

/* Free the chunk of block in slab s (g > 0), if it has one. */
static void chunk_free(kv_slab *s, int32_t block)
{
    const int32_t c = s->chunk[block];
    if (c < 0)
        return;
    list_remove(s, c);
    s->owner[c] = -1;
    s->chunk[block] = -1;
    s->free_stack[s->n_free++] = c;
}

/* A chunk of slab s for block: a free one, else the first evictable (the
 * lists in order). -1 when every chunk is held. */
static int32_t chunk_alloc(kvc_kv_pool *pool, kv_slab *s, int32_t block)
{
    if (s->n_free == 0) {
        int32_t c = -1;
        for (int L = 0; L < N_LISTS && c < 0; L++)
            c = s->head[L];
        if (c < 0)
            return -1;
        const int32_t victim = s->owner[c];
        if (pool->tag[victim])   /* its data still there, to be written down */
            pool->watch(pool->watch_user, pool->tag[victim], -(int32_t)(s - pool->slab));
        chunk_free(s, victim);
        if (pool->tag[victim])
            pool->watch(pool->watch_user, pool->tag[victim], 0);
    }
    const int32_t c = s->free_stack[--s->n_free];
    s->owner[c] = block;
    s->chunk[block] = c;
    s->hold[block] = 0;
    list_push(pool, s, c);
    return c;
}

/* One more (delta 1) or one fewer (-1) sequence holds block's chunk of group g > 0. */
static void hold(kvc_kv_pool *pool, int32_t g, int32_t block, int delta)
{
    kv_slab *s = &pool->slab[g];
    const int32_t c = s->chunk[block];
    KVC_ASSERT(c >= 0 && s->hold[block] + delta >= 0);
    s->hold[block] += delta;
    if (delta > 0 && s->hold[block] == 1) {
        list_remove(s, c);
        s->n_held++;
    } else if (delta < 0 && s->hold[block] == 0) {
        list_push(pool, s, c);
        s->n_held--;
    }
}

/* ------------------------------------------------------------ blocks */

/* A free block with its full group's chunk, and every window group's too
 * when `window`; -1 as kvc_kv_block_alloc. */
static int32_t block_alloc(kvc_kv_pool *pool, bool window)
{
    kv_slab *s0 = &pool->slab[0];
    if (s0->n_free == 0)
        return -1;
    const int32_t b = s0->free_stack[s0->n_free - 1];
    KVC_ASSERT(pool->refcount[b] == 0);   /* the free stack holds each free block once */
    for (int32_t g = 1; window && g < pool->p.n_groups; g++)
        if (chunk_alloc(pool, &pool->slab[g], b) < 0) {
            while (--g >= 1)
                chunk_free(&pool->slab[g], b);
            return -1;
        }
    s0->n_free--;
    pool->refcount[b] = 1;
    return b;
}

int32_t kvc_kv_block_alloc(kvc_kv_pool *pool)
{
    return block_alloc(pool, true);
}

void kvc_kv_block_ref(kvc_kv_pool *pool, int32_t block)
{
    KVC_ASSERT(pool->refcount[block] > 0);   /* a free block is taken by alloc, not ref */
    if (++pool->refcount[block] == 2 && pool->tag[block])
        pool->watch(pool->watch_user, pool->tag[block], 2);
}

void kvc_kv_block_unref(kvc_kv_pool *pool, int32_t block)
{
    KVC_ASSERT(pool->refcount[block] > 0);
    int32_t rc = --pool->refcount[block];
    if (rc == 0) {
        KVC_ASSERT(!pool->tag[block]);         /* the watcher untags before its last unref */
        for (int32_t g = 1; g < pool->p.n_groups; g++) {
            KVC_ASSERT(pool->slab[g].chunk[block] < 0 || pool->slab[g].hold[block] == 0);
            chunk_free(&pool->slab[g], block);
            pool->slab[g].kept[block] = 0;
        }
        pool->slab[0].free_stack[pool->slab[0].n_free++] = block;
    } else if (rc == 1 && pool->tag[block]) {
        pool->watch(pool->watch_user, pool->tag[block], 1);
    }
}

void kvc_kv_block_copy(kvc_kv_pool *pool, int32_t dst, int32_t src)
{
    for (int32_t g = 0; g < pool->p.n_groups; g++) {
        const kv_slab *s = &pool->slab[g];
        const int32_t cs = chunk_of(pool, src, g), cd = chunk_of(pool, dst, g);
        if (cs >= 0 && cd >= 0)
            memcpy(s->data + (size_t)cd * s->chunk_bytes, s->data + (size_t)cs * s->chunk_bytes, s->chunk_bytes);
    }
}

void kvc_kv_set_watch(kvc_kv_pool *pool, kvc_kv_watch_fn fn, void *user)
{
    pool->watch = fn;
    pool->watch_user = user;
}

void kvc_kv_block_tag(kvc_kv_pool *pool, int32_t block, void *tag)
{
    KVC_ASSERT(!tag || pool->watch);
    pool->tag[block] = tag;
    for (int32_t g = 1; g < pool->p.n_groups; g++) {   /* onto the list of its kind */
        kv_slab *s = &pool->slab[g];
        const int32_t c = s->chunk[block];
        if (c >= 0 && s->list[c] != NO_LIST) {
            list_remove(s, c);
            list_push(pool, s, c);
        }
    }
}

void *kvc_kv_block_tag_of(const kvc_kv_pool *pool, int32_t block)
{
    return pool->tag[block];
}

int32_t kvc_kv_block_refcount(const kvc_kv_pool *pool, int32_t block)
{
    return pool->refcount[block];
}

static uint8_t *head_ptr(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head, int kv)
{
    const kv_layer *L = &pool->layer[layer];
    const kv_slab *s = &pool->slab[L->group];
    const int32_t c = chunk_of(pool, block, L->group);
    if (c < 0 || L->kv_of != layer)
        return NULL;
    const size_t head_bytes = L->row_bytes * (size_t)pool->p.block_tokens;
    return s->data + (size_t)c * s->chunk_bytes + L->off +
           ((size_t)kv * (size_t)L->n_kv_head + (size_t)head) * head_bytes;
}

void *kvc_kv_block_data(kvc_kv_pool *pool, int32_t block)
{
    return pool->slab[0].data + (size_t)block * pool->slab[0].chunk_bytes;
}

void *kvc_kv_chunk_data(kvc_kv_pool *pool, int32_t block, int32_t g)
{
    const int32_t c = chunk_of(pool, block, g);
    return c < 0 ? NULL : pool->slab[g].data + (size_t)c * pool->slab[g].chunk_bytes;
}

void kvc_kv_chunk_clear_rows(const kvc_kv_pool *pool, int32_t g, void *chunk, int32_t from)
{
    const size_t B = (size_t)pool->p.block_tokens;
    KVC_ASSERT(from >= 0 && (size_t)from <= B);
    const bool transposed = pool->p.type != KVC_TYPE_Q8_0;   /* K [head_dim][B], else B rows */
    for (int32_t l = 0; l < pool->p.n_layer; l++) {
        const kv_layer *L = &pool->layer[l];
        if (L->group != g || L->kv_of != l || L->n_kv_head == 0 || L->state_floats)
            continue;
        const size_t head_bytes = L->row_bytes * B;
        for (int32_t h = 0; h < 2 * L->n_kv_head; h++) {   /* K heads, then V heads */
            uint8_t *p = (uint8_t *)chunk + L->off + (size_t)h * head_bytes;
            if (h < L->n_kv_head && transposed) {
                const size_t es = L->row_bytes / (size_t)L->head_dim;
                for (int32_t d = 0; d < L->head_dim; d++)
                    memset(p + ((size_t)d * B + (size_t)from) * es, 0, (B - (size_t)from) * es);
            } else {
                memset(p + (size_t)from * L->row_bytes, 0, (B - (size_t)from) * L->row_bytes);
            }
        }
    }
}

void kvc_kv_block_drop_chunk(kvc_kv_pool *pool, int32_t block, int32_t g)
{
    kv_slab *s = &pool->slab[g];
    KVC_ASSERT(g > 0 && (s->chunk[block] < 0 || s->hold[block] == 0));
    const bool had = s->chunk[block] >= 0;
    chunk_free(s, block);
    if (had && pool->tag[block])
        pool->watch(pool->watch_user, pool->tag[block], 0);
}

void *kvc_kv_block_add_chunk(kvc_kv_pool *pool, int32_t block, int32_t g, bool *fresh)
{
    kv_slab *s = &pool->slab[g];
    KVC_ASSERT(g > 0 && pool->refcount[block] > 0);
    int32_t c = s->chunk[block];
    *fresh = c < 0;
    if (c >= 0 && s->list[c] != NO_LIST) {
        list_remove(s, c);
        list_push(pool, s, c);
    } else if (c < 0) {
        c = chunk_alloc(pool, s, block);
    }
    return c < 0 ? NULL : s->data + (size_t)c * s->chunk_bytes;
}

void *kvc_kv_k(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head)
{
    return head_ptr(pool, block, layer, head, 0);
}

void *kvc_kv_v(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head)
{
    return head_ptr(pool, block, layer, head, 1);
}

/* The first block a window of w needs for a sequence going on from length n
 * (positions [n - w, n)); 0 for a full group (w = 0). */
static int64_t window_from(int64_t n, int32_t w, int64_t B)
{
    return w > 0 && n - w > 0 ? (n - w) / B : 0;
}

int64_t kvc_kv_servable(const kvc_kv_pool *pool, const int32_t *blocks, int64_t len)
{
    const int64_t B = pool->p.block_tokens;
    int64_t L = pool->state_floats > 0 ? 0 : len;   /* no state kept for any length but 0 */
    while (L > 0) {
        /* the highest block the candidate's windows miss, or -1 */
        int64_t miss = -1;
        for (int32_t g = 1; g < pool->p.n_groups; g++) {
            const int32_t w = pool->g_params[g].window;
            for (int64_t i = (L + B - 1) / B - 1; i >= window_from(L, w, B) && i > miss; i--)
                if (pool->slab[g].chunk[blocks[i]] < 0) {
                    miss = i;
                    break;
                }
        }
        if (miss < 0)
            return L;
        /* a shorter candidate serves only if its window starts past miss,
         * or ends at or below it: the next block boundary below */
        L = L % B ? L / B * B : L - B;
        if (L > miss * B)
            L = miss * B;
    }
    return 0;
}

/* ------------------------------------------------------------ recurrent layers */

int64_t kvc_kv_state_floats(const kvc_kv_pool *pool) { return pool->state_floats; }
int64_t kvc_kv_layer_state_floats(const kvc_kv_pool *pool, int32_t layer) { return pool->layer[layer].state_floats; }

float *kvc_kv_seq_state(kvc_kv_pool *pool, kvc_kv_seq *seq, int32_t layer)
{
    const kv_layer *L = &pool->layer[layer];
    if (L->state_floats == 0)
        return NULL;
    if (!seq->state)
        seq->state = calloc((size_t)pool->state_floats, sizeof(float));
    return seq->state ? seq->state + L->state_off : NULL;
}

float *kvc_kv_seq_states(kvc_kv_pool *pool, kvc_kv_seq *seq)
{
    if (pool->state_floats == 0)
        return NULL;
    if (!seq->state)
        seq->state = calloc((size_t)pool->state_floats, sizeof(float));
    return seq->state;
}

/* ------------------------------------------------------------ sequences */

void kvc_kv_seq_init(kvc_kv_seq *seq)
{
    memset(seq, 0, sizeof(*seq));
}

static int seq_grow_table(kvc_kv_seq *seq, int32_t need, kvc_err *err)
{
    if (need <= seq->cap)
        return KVC_OK;
    int32_t cap = seq->cap ? seq->cap : 8;
    while (cap < need)
        cap *= 2;
    int32_t *b = realloc(seq->blocks, (size_t)cap * sizeof(int32_t));
    if (!b)
        return kvc_fail(err, KVC_ERR_NOMEM, "KV sequence: out of memory");
    seq->blocks = b;
    seq->cap = cap;
    return KVC_OK;
}

/* Group g's hold moves to blocks [from, to) of the sequence. */
static void seq_hold_from(kvc_kv_pool *pool, kvc_kv_seq *seq, int32_t g, int64_t from)
{
    from = KVC_MIN(from, (int64_t)seq->to[g]);
    for (int64_t i = from; i < seq->from[g]; i++)
        hold(pool, g, seq->blocks[i], 1);
    for (int64_t i = seq->from[g]; i < from; i++)
        hold(pool, g, seq->blocks[i], -1);
    seq->from[g] = (int32_t)from;
}

/* Drop the sequence's last block, and its hold. */
static void seq_pop(kvc_kv_pool *pool, kvc_kv_seq *seq)
{
    const int32_t i = --seq->n_blocks, b = seq->blocks[i];
    for (int32_t g = 1; g < pool->p.n_groups; g++) {
        if (i < seq->to[g]) {
            if (i >= seq->from[g])
                hold(pool, g, b, -1);
            seq->to[g] = i;
        }
        seq->from[g] = KVC_MIN(seq->from[g], seq->to[g]);
    }
    kvc_kv_block_unref(pool, b);
}

/* Append block b (a reference already taken), not written yet: its window
 * chunks come with kvc_kv_seq_window. */
static void seq_push(kvc_kv_seq *seq, int32_t b)
{
    seq->blocks[seq->n_blocks++] = b;
}

void kvc_kv_seq_slide(kvc_kv_pool *pool, kvc_kv_seq *seq)
{
    for (int32_t g = 1; g < pool->p.n_groups; g++) {
        const int64_t from = window_from(seq->n_tokens, pool->g_params[g].window, pool->p.block_tokens);
        if (from > seq->from[g])
            seq_hold_from(pool, seq, g, from);
    }
}

int kvc_kv_seq_window(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n, kvc_err *err)
{
    const int64_t B = pool->p.block_tokens;
    const int32_t end = (int32_t)KVC_MIN((n + B - 1) / B, (int64_t)seq->n_blocks);
    for (int32_t g = 1; g < pool->p.n_groups; g++) {
        kv_slab *s = &pool->slab[g];
        const int64_t from = window_from(seq->n_tokens, pool->g_params[g].window, B);
        if (from < seq->from[g])             /* rested: its window held again */
            for (int64_t i = from; i < seq->to[g]; i++)
                if (s->chunk[seq->blocks[i]] < 0)
                    return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV sequence: block %lld's memory group %d "
                                    "chunk was evicted (truncate first)", (long long)i, g);
        seq_hold_from(pool, seq, g, from);
        for (; seq->to[g] < end; seq->to[g]++) {
            const int32_t b = seq->blocks[seq->to[g]];
            if (s->chunk[b] < 0 && chunk_alloc(pool, s, b) < 0)
                return kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full: all %lld chunks of memory group %d "
                                "(window %d) are held by running sequences", (long long)s->g.n_blocks, g,
                                s->g.window);
            hold(pool, g, b, 1);
        }
    }
    return KVC_OK;
}

int64_t kvc_kv_window_need(const kvc_kv_pool *pool, int32_t g, int32_t n_batch)
{
    const int64_t B = pool->p.block_tokens;
    return g == 0 ? 0 : ((int64_t)pool->g_params[g].window + n_batch + B - 1) / B + 2;
}

int kvc_kv_seq_hold_back(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t pos, kvc_err *err)
{
    const int64_t i0 = KVC_MAX(pos, 0) / pool->p.block_tokens;
    for (int32_t g = 1; g < pool->p.n_groups; g++)
        for (int64_t i = i0; i < seq->to[g]; i++)
            if (pool->slab[g].chunk[seq->blocks[i]] < 0)
                return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV sequence: block %lld's memory group %d "
                                "chunk was evicted", (long long)i, g);
    for (int32_t g = 1; g < pool->p.n_groups; g++)
        if (i0 < seq->from[g])
            seq_hold_from(pool, seq, g, i0);
    return KVC_OK;
}

void kvc_kv_seq_rest(kvc_kv_pool *pool, kvc_kv_seq *seq)
{
    for (int32_t g = 1; g < pool->p.n_groups; g++)
        seq_hold_from(pool, seq, g, seq->to[g]);
}

void kvc_kv_seq_keep(kvc_kv_pool *pool, const kvc_kv_seq *seq, int64_t q)
{
    const int64_t B = pool->p.block_tokens;
    if (q <= 0)
        return;
    const int64_t end = KVC_MIN((q + B - 1) / B, (int64_t)seq->n_blocks);
    for (int32_t g = 1; g < pool->p.n_groups; g++) {
        kv_slab *s = &pool->slab[g];
        for (int64_t i = window_from(q / B * B, pool->g_params[g].window, B); i < end; i++) {
            const int32_t b = seq->blocks[i], c = s->chunk[b];
            if (s->kept[b])
                continue;
            s->kept[b] = 1;
            if (c >= 0 && s->list[c] != NO_LIST) {   /* released: onto the kept list */
                list_remove(s, c);
                list_push(pool, s, c);
            }
        }
    }
}

int64_t kvc_kv_seq_reserve_need(const kvc_kv_pool *pool, const kvc_kv_seq *seq, int64_t n)
{
    const int64_t B = pool->p.block_tokens;
    if (n <= seq->n_tokens)
        return 0;
    int64_t need = (n + B - 1) / B;
    int32_t first_written = (int32_t)(seq->n_tokens / B);
    int64_t cow = first_written < seq->n_blocks &&
                  pool->refcount[seq->blocks[first_written]] > 1;
    return (need > seq->n_blocks ? need - seq->n_blocks : 0) + cow;
}

int kvc_kv_seq_reserve(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n, kvc_err *err)
{
    const int64_t B = pool->p.block_tokens;
    if (n <= seq->n_tokens)
        return KVC_OK;
    kvc_kv_seq_slide(pool, seq);
    int64_t need64 = (n + B - 1) / B;
    if (need64 > INT32_MAX)
        return kvc_fail(err, KVC_ERR_KV_FULL, "KV sequence: %lld positions", (long long)n);
    int32_t need = (int32_t)need64;
    int32_t first_written = (int32_t)(seq->n_tokens / B);  /* the first block written to */
    int32_t cow = (first_written < seq->n_blocks &&
                   pool->refcount[seq->blocks[first_written]] > 1) ? 1 : 0;
    int64_t want = (int64_t)(need > seq->n_blocks ? need - seq->n_blocks : 0) + cow;
    if (want > pool->slab[0].n_free)
        return kvc_fail(err, KVC_ERR_KV_FULL,
                        "KV cache full: %lld more blocks of %lld tokens needed, %lld free",
                        (long long)want, (long long)B, (long long)pool->slab[0].n_free);
    int rc = seq_grow_table(seq, need, err);
    if (rc)
        return rc;
    const int32_t had = seq->n_blocks;
    if (cow && kvc_kv_seq_make_private(pool, seq, first_written, first_written + 1, err))
        return KVC_ERR_KV_FULL;
    while (seq->n_blocks < need) {
        int32_t b = block_alloc(pool, false);
        if (b < 0)
            goto window_full;
        seq_push(seq, b);
    }
    return KVC_OK;
window_full:
    while (seq->n_blocks > had)
        seq_pop(pool, seq);
    return kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full: every window chunk is held by a running sequence");
}

int64_t kvc_kv_seq_truncate(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n)
{
    const int64_t B = pool->p.block_tokens;
    n = KVC_MAX(0, KVC_MIN(n, seq->n_tokens));
    /* its window may have been evicted while it rested; a recurrent state
     * cannot be cut back (servable says what can be kept) */
    if (pool->p.n_groups > 1 || (pool->state_floats > 0 && n < seq->n_tokens))
        n = kvc_kv_servable(pool, seq->blocks, n);
    if (n == 0 && seq->state) {   /* the states of no position: all zero, made again on use */
        free(seq->state);
        seq->state = NULL;
    }
    int32_t keep = (int32_t)((n + B - 1) / B);
    while (seq->n_blocks > keep)
        seq_pop(pool, seq);
    seq->n_tokens = n;
    for (int32_t g = 1; g < pool->p.n_groups; g++)
        seq_hold_from(pool, seq, g, window_from(n, pool->g_params[g].window, B));
    return n;
}

int kvc_kv_seq_make_private(kvc_kv_pool *pool, kvc_kv_seq *seq, int32_t i0, int32_t i1, kvc_err *err)
{
    for (int32_t i = KVC_MAX(i0, 0); i < KVC_MIN(i1, seq->n_blocks); i++) {
        const int32_t old = seq->blocks[i];
        if (pool->refcount[old] == 1)
            continue;
        const int32_t fresh = kvc_kv_block_alloc(pool);
        if (fresh < 0)
            return kvc_fail(err, KVC_ERR_KV_FULL, "KV cache full: no block for a copy-on-write (%lld free)",
                            (long long)pool->slab[0].n_free);
        kvc_kv_block_copy(pool, fresh, old);
        for (int32_t g = 1; g < pool->p.n_groups; g++)
            if (i >= seq->from[g] && i < seq->to[g]) {
                hold(pool, g, fresh, 1);
                hold(pool, g, old, -1);
            } else {   /* not held: the copy needs no window chunk */
                chunk_free(&pool->slab[g], fresh);
            }
        kvc_kv_block_unref(pool, old);
        seq->blocks[i] = fresh;
    }
    return KVC_OK;
}

void kvc_kv_seq_release(kvc_kv_pool *pool, kvc_kv_seq *seq)
{
    kvc_kv_seq_truncate(pool, seq, 0);
    free(seq->blocks);
    free(seq->state);
    kvc_kv_seq_init(seq);
}

int kvc_kv_seq_assign(kvc_kv_pool *pool, kvc_kv_seq *seq, const int32_t *blocks, int64_t n,
                      kvc_err *err)
{
    const int64_t B = pool->p.block_tokens;
    if (pool->p.n_groups != 1)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV sequence: assigning blocks needs one memory group");
    const int32_t nb = (int32_t)((n + B - 1) / B);
    int32_t *old = NULL, n_old = seq->n_blocks;
    if (n_old > 0 && !(old = malloc((size_t)n_old * sizeof(*old))))
        return kvc_fail(err, KVC_ERR_NOMEM, "KV sequence: out of memory");
    int rc = seq_grow_table(seq, nb, err);
    if (rc) {
        free(old);
        return rc;
    }
    if (n_old > 0)
        memcpy(old, seq->blocks, (size_t)n_old * sizeof(*old));
    for (int32_t i = 0; i < nb; i++) {   /* the new references first: a block in both stays */
        kvc_kv_block_ref(pool, blocks[i]);
        seq->blocks[i] = blocks[i];
    }
    for (int32_t i = 0; i < n_old; i++)
        kvc_kv_block_unref(pool, old[i]);
    free(old);
    seq->n_blocks = nb;
    seq->n_tokens = n;
    return KVC_OK;
}

int kvc_kv_seq_append_blocks(kvc_kv_pool *pool, kvc_kv_seq *seq,
                             const int32_t *blocks, int32_t n, kvc_err *err)
{
    const int64_t B = pool->p.block_tokens;
    if (seq->n_tokens % B != 0 || seq->n_blocks * B != seq->n_tokens)
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "KV sequence: appending blocks after %lld tokens (not a block boundary)",
                        (long long)seq->n_tokens);
    if (pool->state_floats > 0 && n > 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV sequence: cached blocks carry no recurrent state");
    const int64_t len = seq->n_tokens + (int64_t)n * B;
    for (int32_t g = 1; g < pool->p.n_groups; g++)   /* its own blocks too: it may have rested */
        for (int64_t i = window_from(len, pool->g_params[g].window, B); i < seq->n_blocks + n; i++)
            if (pool->slab[g].chunk[i < seq->n_blocks ? seq->blocks[i] : blocks[i - seq->n_blocks]] < 0)
                return kvc_fail(err, KVC_ERR_INVALID_ARG,
                                "KV sequence: block %lld's memory group %d chunk was evicted", (long long)i, g);
    int rc = seq_grow_table(seq, seq->n_blocks + n, err);
    if (rc)
        return rc;
    int64_t from[KVC_KV_MAX_GROUPS];   /* what the window of len needs: held, the rest not */
    const int32_t n0 = seq->n_blocks;
    for (int32_t g = 1; g < pool->p.n_groups; g++) {
        from[g] = window_from(len, pool->g_params[g].window, B);
        seq_hold_from(pool, seq, g, KVC_MIN(from[g], (int64_t)n0));
    }
    for (int32_t i = 0; i < n; i++) {
        kvc_kv_block_ref(pool, blocks[i]);
        const int32_t at = seq->n_blocks;
        seq->blocks[seq->n_blocks++] = blocks[i];
        for (int32_t g = 1; g < pool->p.n_groups; g++)
            if (at >= from[g])
                hold(pool, g, blocks[i], 1);
    }
    for (int32_t g = 1; g < pool->p.n_groups; g++) {
        seq->to[g] = seq->n_blocks;
        seq->from[g] = (int32_t)KVC_MAX((int64_t)seq->from[g], from[g]);
    }
    seq->n_tokens = len;
    return KVC_OK;
}

int kvc_kv_seq_fork(kvc_kv_pool *pool, const kvc_kv_seq *src, kvc_kv_seq *dst,
                    int64_t n, kvc_err *err)
{
    const int64_t B = pool->p.block_tokens;
    n = KVC_MAX(0, KVC_MIN(n, src->n_tokens));
    if (pool->state_floats > 0 && n == src->n_tokens && n > 0) {   /* the whole source, its states */
        if (!dst->state && !(dst->state = malloc((size_t)pool->state_floats * sizeof(float))))
            return kvc_fail(err, KVC_ERR_NOMEM, "KV sequence: out of memory for recurrent states");
        if (src->state)
            memcpy(dst->state, src->state, (size_t)pool->state_floats * sizeof(float));
        else
            memset(dst->state, 0, (size_t)pool->state_floats * sizeof(float));
    } else {
        n = kvc_kv_servable(pool, src->blocks, n);
    }
    int32_t nb = (int32_t)((n + B - 1) / B);
    int rc = seq_grow_table(dst, nb, err);
    if (rc)
        return rc;
    for (int32_t g = 0; g < KVC_KV_MAX_GROUPS; g++)
        dst->from[g] = dst->to[g] = 0;
    for (int32_t i = 0; i < nb; i++) {
        kvc_kv_block_ref(pool, src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = nb;
    dst->n_tokens = n;
    for (int32_t g = 1; g < pool->p.n_groups; g++) {   /* hold what the window needs */
        const int64_t from = window_from(n, pool->g_params[g].window, B);
        for (int64_t i = from; i < nb; i++)
            hold(pool, g, dst->blocks[i], 1);
        dst->from[g] = (int32_t)KVC_MIN(from, (int64_t)nb);
        dst->to[g] = nb;
    }
    return KVC_OK;
}
