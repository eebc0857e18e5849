/* kv.c - the paged KV pool: one slab of blocks, a free stack, reference counts. */
#include "kv.h"
#include "quant.h"

#include <stdlib.h>
#include <string.h>

struct kvc_kv_pool {
    kvc_kv_pool_params p;
    size_t    row_bytes;      /* one head, one position */
    size_t    head_bytes;     /* one head of one layer of a block: B rows */
    size_t    block_bytes;    /* n_layer * 2 * n_kv_head * head_bytes */
    uint8_t  *data;           /* n_blocks * block_bytes */
    int32_t  *refcount;       /* n_blocks */
    int32_t  *free_stack;     /* ids of free blocks */
    int64_t   n_free;
    void    **tag;            /* n_blocks: the watcher's tag of each block, or NULL */
    kvc_kv_watch_fn watch;    /* called on a tagged block's 1 <-> 2 transitions */
    void     *watch_user;
};

int kvc_kv_pool_new(const kvc_kv_pool_params *p, kvc_kv_pool **out, kvc_err *err)
{
    *out = NULL;
    kvc_kv_pool_params q = *p;
    if (q.block_tokens == 0)
        q.block_tokens = 16;
    if (q.n_layer <= 0 || q.n_kv_head <= 0 || q.head_dim <= 0 || q.block_tokens <= 0 ||
        q.n_blocks <= 0 || q.n_blocks > INT32_MAX)
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "KV pool: bad shape (layers %d, kv heads %d, head dim %d, block %d, blocks %lld)",
                        q.n_layer, q.n_kv_head, q.head_dim, q.block_tokens, (long long)q.n_blocks);
    if (q.type != KVC_TYPE_F16 && q.type != KVC_TYPE_F32 && q.type != KVC_TYPE_Q8_0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: type %u not supported (f16, f32, q8_0)", q.type);
    size_t row = kvc_row_size(q.type, q.head_dim);
    if (row == 0)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "KV pool: head dim %d is not a multiple of the %s block",
                        q.head_dim, kvc_type_info(q.type)->name);

    kvc_kv_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return kvc_fail(err, KVC_ERR_NOMEM, "KV pool: out of memory");
    pool->p = q;
    pool->row_bytes = row;
    pool->head_bytes = row * (size_t)q.block_tokens;
    pool->block_bytes = pool->head_bytes * (size_t)q.n_kv_head * 2 * (size_t)q.n_layer;
    pool->data = kvc_alloc_aligned(pool->block_bytes * (size_t)q.n_blocks);
    pool->refcount = calloc((size_t)q.n_blocks, sizeof(int32_t));
    pool->free_stack = malloc((size_t)q.n_blocks * sizeof(int32_t));
    pool->tag = calloc((size_t)q.n_blocks, sizeof(void *));
    if (!pool->data || !pool->refcount || !pool->free_stack || !pool->tag) {
        size_t mib = pool->block_bytes * (size_t)q.n_blocks >> 20;
        kvc_kv_pool_free(pool);
        return kvc_fail(err, KVC_ERR_NOMEM, "KV pool: cannot allocate %zu MiB", mib);
    }
    /* lowest ids on top of the stack, so allocation order is predictable */
    for (int64_t i = 0; i < q.n_blocks; i++)
        pool->free_stack[i] = (int32_t)(q.n_blocks - 1 - i);
    pool->n_free = q.n_blocks;
    *out = pool;
    return KVC_OK;
}

void kvc_kv_pool_free(kvc_kv_pool *pool)
{
    if (!pool)
        return;
    kvc_free_aligned(pool->data);
    free(pool->refcount);
    free(pool->free_stack);
    free(pool->tag);
    free(pool);
}

const kvc_kv_pool_params *kvc_kv_pool_params_of(const kvc_kv_pool *pool) { return &pool->p; }
int32_t kvc_kv_block_tokens(const kvc_kv_pool *pool) { return pool->p.block_tokens; }
int64_t kvc_kv_n_blocks(const kvc_kv_pool *pool) { return pool->p.n_blocks; }
int64_t kvc_kv_n_free(const kvc_kv_pool *pool) { return pool->n_free; }
size_t  kvc_kv_block_bytes(const kvc_kv_pool *pool) { return pool->block_bytes; }
size_t  kvc_kv_row_bytes(const kvc_kv_pool *pool) { return pool->row_bytes; }

size_t kvc_kv_block_bytes_for(const kvc_kv_pool_params *p)
{
    int32_t B = p->block_tokens ? p->block_tokens : 16;
    if ((p->type != KVC_TYPE_F16 && p->type != KVC_TYPE_F32 && p->type != KVC_TYPE_Q8_0) ||
        p->n_layer <= 0 || p->n_kv_head <= 0 || p->head_dim <= 0 || B <= 0)
        return 0;
    return kvc_row_size(p->type, p->head_dim) * (size_t)B * (size_t)p->n_kv_head * 2 *
           (size_t)p->n_layer;
}

int32_t kvc_kv_block_alloc(kvc_kv_pool *pool)
{
    if (pool->n_free == 0)
        return -1;
    int32_t b = pool->free_stack[--pool->n_free];
    KVC_ASSERT(pool->refcount[b] == 0);   /* the free stack holds each free block once */
    pool->refcount[b] = 1;
    return b;
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
        pool->free_stack[pool->n_free++] = block;
    } else if (rc == 1 && pool->tag[block]) {
        pool->watch(pool->watch_user, pool->tag[block], 1);
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
    size_t idx = ((size_t)layer * 2 + (size_t)kv) * (size_t)pool->p.n_kv_head + (size_t)head;
    return pool->data + (size_t)block * pool->block_bytes + idx * pool->head_bytes;
}

void *kvc_kv_block_data(kvc_kv_pool *pool, int32_t block)
{
    return pool->data + (size_t)block * pool->block_bytes;
}

void *kvc_kv_k(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head)
{
    return head_ptr(pool, block, layer, head, 0);
}

void *kvc_kv_v(kvc_kv_pool *pool, int32_t block, int32_t layer, int32_t head)
{
    return head_ptr(pool, block, layer, head, 1);
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
    int64_t need64 = (n + B - 1) / B;
    if (need64 > INT32_MAX)
        return kvc_fail(err, KVC_ERR_KV_FULL, "KV sequence: %lld positions", (long long)n);
    int32_t need = (int32_t)need64;
    int32_t first_written = (int32_t)(seq->n_tokens / B);  /* the first block written to */
    int32_t cow = (first_written < seq->n_blocks &&
                   pool->refcount[seq->blocks[first_written]] > 1) ? 1 : 0;
    int64_t want = (int64_t)(need > seq->n_blocks ? need - seq->n_blocks : 0) + cow;
    if (want > pool->n_free)
        return kvc_fail(err, KVC_ERR_KV_FULL,
                        "KV cache full: %lld more blocks of %lld tokens needed, %lld free",
                        (long long)want, (long long)B, (long long)pool->n_free);
    int rc = seq_grow_table(seq, need, err);
    if (rc)
        return rc;
    if (cow) {
        int32_t old = seq->blocks[first_written];
        int32_t fresh = kvc_kv_block_alloc(pool);
        memcpy(pool->data + (size_t)fresh * pool->block_bytes,
               pool->data + (size_t)old * pool->block_bytes, pool->block_bytes);
        kvc_kv_block_unref(pool, old);
        seq->blocks[first_written] = fresh;
    }
    while (seq->n_blocks < need)
        seq->blocks[seq->n_blocks++] = kvc_kv_block_alloc(pool);
    return KVC_OK;
}

void kvc_kv_seq_truncate(kvc_kv_pool *pool, kvc_kv_seq *seq, int64_t n)
{
    const int64_t B = pool->p.block_tokens;
    if (n < 0)
        n = 0;
    if (n > seq->n_tokens)
        n = seq->n_tokens;
    int32_t keep = (int32_t)((n + B - 1) / B);
    while (seq->n_blocks > keep)
        kvc_kv_block_unref(pool, seq->blocks[--seq->n_blocks]);
    seq->n_tokens = n;
}

void kvc_kv_seq_release(kvc_kv_pool *pool, kvc_kv_seq *seq)
{
    kvc_kv_seq_truncate(pool, seq, 0);
    free(seq->blocks);
    kvc_kv_seq_init(seq);
}

int kvc_kv_seq_append_blocks(kvc_kv_pool *pool, kvc_kv_seq *seq,
                             const int32_t *blocks, int32_t n, kvc_err *err)
{
    const int64_t B = pool->p.block_tokens;
    if (seq->n_tokens % B != 0 || seq->n_blocks * B != seq->n_tokens)
        return kvc_fail(err, KVC_ERR_INVALID_ARG,
                        "KV sequence: appending blocks after %lld tokens (not a block boundary)",
                        (long long)seq->n_tokens);
    int rc = seq_grow_table(seq, seq->n_blocks + n, err);
    if (rc)
        return rc;
    for (int32_t i = 0; i < n; i++) {
        kvc_kv_block_ref(pool, blocks[i]);
        seq->blocks[seq->n_blocks++] = blocks[i];
    }
    seq->n_tokens += (int64_t)n * B;
    return KVC_OK;
}

int kvc_kv_seq_fork(kvc_kv_pool *pool, const kvc_kv_seq *src, kvc_kv_seq *dst,
                    int64_t n, kvc_err *err)
{
    const int64_t B = pool->p.block_tokens;
    if (n > src->n_tokens)
        n = src->n_tokens;
    int32_t nb = (int32_t)((n + B - 1) / B);
    int rc = seq_grow_table(dst, nb, err);
    if (rc)
        return rc;
    for (int32_t i = 0; i < nb; i++) {
        kvc_kv_block_ref(pool, src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = nb;
    dst->n_tokens = n;
    return KVC_OK;
}
