/* tiers.c - RAM and the store below it: fetch on lookup, write on eviction
 * and through after a turn, a writer thread fed by a queue of block copies.
 *
 * Memory groups (kv.h): a block is one record per chunk it has, (node, group)
 * under the same chain hash: group 0's under the hash itself, a window
 * group's under kvc_tiers_group_hash(hash, g). A block whose window chunk was evicted
 * is still stored for its full layers; read back, a window record that is
 * missing or corrupt leaves the block without that chunk (kvc_kv_servable
 * then decides how much of the path serves), each record all-or-nothing and
 * checksummed by the store. A window chunk the pool evicts (its window slab
 * short) goes down first, as an evicted block does, and a block still in
 * RAM without it gets it back for a hit that needs it
 * (kvc_tiers_fetch_windows). */
#include "tiers.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* A block on its way down: a copy, so the writer never reads the pool. */
typedef struct slot {
    struct slot *next;        /* in the queue, or in the spare list */
    uint64_t hash, parent, ns;
    int32_t  n_tokens;        /* B; fewer for a sequence's tail (kvc_tiers_write_tail) */
    int32_t *tokens;          /* [B] */
    uint8_t *kv;              /* [max_bytes]; NULL in a record's slot */
    uint8_t *rec;             /* a record's own data (kvc_tiers_queue_record), or NULL */
    size_t   kv_bytes;        /* its group's chunk bytes, or the record's */
    int32_t  group;           /* the memory group of its chunk (0 for a record) */
} slot;

/* What a slot writes: its K/V copy or its record. */
static const uint8_t *slot_data(const slot *s) { return s->rec ? s->rec : s->kv; }

/* Most bytes of records queued at once; past that a record is written at
 * once, in the caller's thread. */
#define MAX_RECORD_BYTES ((size_t)1 << 30)

struct kvc_tiers {
    kvc_prefix_cache *pc;     /* borrowed */
    kvc_kv_pool      *pool;   /* borrowed */
    kvc_block_store  *store;  /* borrowed; used under store_mu */
    int32_t           B;
    size_t            block_bytes;    /* group 0's chunk: the record under the chain hash */
    int32_t           n_groups;
    size_t            chunk_bytes[KVC_KV_MAX_GROUPS];
    size_t            max_bytes;      /* the largest chunk: a slot's room */
    pthread_mutex_t   store_mu;
    pthread_mutex_t   q_mu;   /* the queue, `stop` and the stats */
    pthread_cond_t    q_cv;   /* work or stop, for the writer */
    pthread_cond_t    done_cv;/* a slot written, for flush */
    slot             *head, *tail;   /* the queue; the writer works on head */
    int32_t           count;
    slot             *spare;  /* free slots: `cap` allocated up front, kept */
    int32_t           cap;
    int32_t           n_slots, max_slots; /* slots that exist; beyond cap they are made
                                             on demand (a long turn written through) and
                                             freed when written, up to max_slots */
    size_t            rec_bytes;      /* of the records queued (each in a slot of its own) */
    bool              stop;
    bool              started;
    pthread_t         writer;
    kvc_tiers_stats   st;
};

/* ------------------------------------------------------------ the writer */

static void slot_free(slot *s)
{
    if (s) {
        free(s->tokens);
        kvc_free_aligned(s->kv);
        free(s->rec);
        free(s);
    }
}

static slot *slot_new(const kvc_tiers *t)
{
    slot *s = calloc(1, sizeof(*s));
    if (s) {
        s->tokens = malloc((size_t)t->B * sizeof(int32_t));
        s->kv = kvc_alloc_aligned(t->max_bytes);
        if (!s->tokens || !s->kv) {
            slot_free(s);
            s = NULL;
        }
    }
    return s;
}

/* Count a put of group g's record (bytes) that returned rc. Under q_mu. */
static void count_put_locked(kvc_tiers *t, int32_t g, size_t bytes, int rc)
{
    t->st.blocks_written += rc == KVC_OK;
    t->st.write_failures += rc != KVC_OK;
    if (g > 0 && rc == KVC_OK) {
        t->st.window_chunks_written++;
        t->st.window_bytes_written += bytes;
    }
}

/* Count a read of n window records (bytes each) into RAM: ok, or missing
 * or corrupt. */
static void count_window_read(kvc_tiers *t, uint64_t n, size_t bytes, bool ok)
{
    pthread_mutex_lock(&t->q_mu);
    if (ok) {
        t->st.window_chunks_fetched += n;
        t->st.window_bytes_read += n * bytes;
    } else {
        t->st.window_chunks_missed += n;
    }
    pthread_mutex_unlock(&t->q_mu);
}

static void *writer_main(void *arg)
{
    kvc_tiers *t = arg;
    pthread_mutex_lock(&t->q_mu);
    for (;;) {
        while (t->count == 0 && !t->stop)
            pthread_cond_wait(&t->q_cv, &t->q_mu);
        if (t->count == 0)
            break;                                   /* stop, and nothing left */
        slot *s = t->head;
        pthread_mutex_unlock(&t->q_mu);
        kvc_block_desc d = { s->hash, s->parent, s->n_tokens, s->tokens, s->ns };
        pthread_mutex_lock(&t->store_mu);
        int rc = kvc_bs_put(t->store, &d, slot_data(s), s->kv_bytes, NULL);
        pthread_mutex_unlock(&t->store_mu);
        pthread_mutex_lock(&t->q_mu);
        count_put_locked(t, s->group, s->kv_bytes, rc);
        t->head = s->next;
        if (!t->head)
            t->tail = NULL;
        t->count--;
        if (s->rec) {                                /* a record's: made for it */
            t->rec_bytes -= s->kv_bytes;
            slot_free(s);
        } else if (t->n_slots > t->cap) {            /* made on demand: let it go */
            t->n_slots--;
            slot_free(s);
        } else {
            s->next = t->spare;
            t->spare = s;
        }
        pthread_cond_broadcast(&t->done_cv);
    }
    pthread_mutex_unlock(&t->q_mu);
    return NULL;
}

/* Whether the queue holds `hash`; if so and kv is not NULL, copy its data
 * (kv_bytes) when its parent, tokens and size are d's. Under q_mu. */
static bool queued_locked(kvc_tiers *t, const kvc_block_desc *d, void *kv, size_t kv_bytes)
{
    for (const slot *s = t->head; s; s = s->next) {
        if (s->hash != d->hash)
            continue;
        if (!kv)
            return true;
        if (s->parent != d->parent || s->n_tokens != d->n_tokens || s->kv_bytes != kv_bytes ||
            memcmp(s->tokens, d->tokens, (size_t)d->n_tokens * sizeof(int32_t)) != 0)
            return false;
        memcpy(kv, slot_data(s), s->kv_bytes);
        return true;
    }
    return false;
}

static bool queued(kvc_tiers *t, const kvc_block_desc *d, void *kv, size_t kv_bytes)
{
    pthread_mutex_lock(&t->q_mu);
    bool q = queued_locked(t, d, kv, kv_bytes);
    pthread_mutex_unlock(&t->q_mu);
    return q;
}

static bool stored(kvc_tiers *t, uint64_t hash)
{
    pthread_mutex_lock(&t->store_mu);
    bool c = kvc_bs_contains(t->store, hash);
    pthread_mutex_unlock(&t->store_mu);
    return c;
}

static void desc_of(kvc_tiers *t, const kvc_pc_node *n, kvc_block_desc *d)
{
    *d = (kvc_block_desc){ n->hash, kvc_pc_parent_hash(t->pc, n), t->B, n->tokens, n->ns };
}

#define GROUP_SALT 0x67726f75705f6b76ull             /* "group_kv" */

uint64_t kvc_tiers_group_hash(uint64_t h, int32_t g)
{
    return g == 0 ? h : XXH3_64bits_withSeed(&g, sizeof(g), h ^ GROUP_SALT);
}

/* d as the record of group g. */
static kvc_block_desc group_desc(const kvc_block_desc *d, int32_t g)
{
    kvc_block_desc dg = *d;
    dg.hash = kvc_tiers_group_hash(d->hash, g);
    return dg;
}

/* Give slot s (its data set: kv or rec, kv_bytes) d's key and tokens, put
 * it at the queue's end and wake the writer. Under q_mu. */
static void queue_push_locked(kvc_tiers *t, slot *s, const kvc_block_desc *d)
{
    s->next = NULL;
    s->hash = d->hash;
    s->parent = d->parent;
    s->ns = d->ns;
    s->n_tokens = d->n_tokens;
    memcpy(s->tokens, d->tokens, (size_t)d->n_tokens * sizeof(int32_t));
    if (t->tail)
        t->tail->next = s;
    else
        t->head = s;
    t->tail = s;
    t->count++;
    t->st.blocks_queued++;
    pthread_cond_signal(&t->q_cv);
}

/* Copy record d (K/V: kv_bytes at kv) into a free slot. false when none is
 * left. */
static bool enqueue_one(kvc_tiers *t, const kvc_block_desc *d, int32_t g, const void *kv, size_t kv_bytes)
{
    pthread_mutex_lock(&t->q_mu);
    if (queued_locked(t, d, NULL, 0)) {
        pthread_mutex_unlock(&t->q_mu);
        return true;
    }
    slot *s = t->spare;
    if (s) {
        t->spare = s->next;
    } else if (t->n_slots < t->max_slots && (s = slot_new(t))) {
        t->n_slots++;
    }
    bool ok = s != NULL;
    if (ok) {
        memcpy(s->kv, kv, kv_bytes);
        s->kv_bytes = kv_bytes;
        s->group = g;
        queue_push_locked(t, s, d);
    }
    pthread_mutex_unlock(&t->q_mu);
    return ok;
}

/* Copy block d (its K/V in pool block `block`: every chunk it has) into
 * free slots. false when one is left out. */
static bool enqueue_desc(kvc_tiers *t, const kvc_block_desc *d, int32_t block)
{
    bool ok = true;
    for (int32_t g = 0; g < t->n_groups; g++) {
        const void *kv = kvc_kv_chunk_data(t->pool, block, g);
        const kvc_block_desc dg = group_desc(d, g);
        if (kv)
            ok = enqueue_one(t, &dg, g, kv, t->chunk_bytes[g]) && ok;
    }
    return ok;
}

static bool enqueue(kvc_tiers *t, const kvc_pc_node *n)
{
    kvc_block_desc d;
    desc_of(t, n, &d);
    return enqueue_desc(t, &d, n->block);
}

/* Write record d (kv_bytes at kv) at once (the queue is full and it would
 * be lost otherwise). */
static void put_one_now(kvc_tiers *t, const kvc_block_desc *d, int32_t g, const void *kv, size_t kv_bytes)
{
    pthread_mutex_lock(&t->store_mu);
    int rc = kvc_bs_put(t->store, d, kv, kv_bytes, NULL);
    pthread_mutex_unlock(&t->store_mu);
    pthread_mutex_lock(&t->q_mu);
    count_put_locked(t, g, kv_bytes, rc);
    pthread_mutex_unlock(&t->q_mu);
}

/* Send node n's record of group g down, unless the queue or the store has
 * it: queued (a copy), or at once when the queue is full (the chunk is
 * about to go). Whether it was sent. */
static bool send_down(kvc_tiers *t, const kvc_pc_node *n, int32_t g)
{
    const void *kv = kvc_kv_chunk_data(t->pool, n->block, g);
    kvc_block_desc d;
    desc_of(t, n, &d);
    const kvc_block_desc dg = group_desc(&d, g);
    if (!kv || queued(t, &dg, NULL, 0) || stored(t, dg.hash))
        return false;
    if (!enqueue_one(t, &dg, g, kv, t->chunk_bytes[g]))
        put_one_now(t, &dg, g, kv, t->chunk_bytes[g]);
    return true;
}

/* The tree evicts n: send each record of it down that the store lacks (a
 * window group's may have gone down already, when its chunk was evicted). */
static void on_evict(void *user, const kvc_pc_node *n)
{
    kvc_tiers *t = user;
    bool sent = false;
    for (int32_t g = 0; g < t->n_groups; g++)
        sent = send_down(t, n, g) || sent;
    pthread_mutex_lock(&t->q_mu);
    t->st.evictions_written += sent;
    pthread_mutex_unlock(&t->q_mu);
}

/* The pool evicts n's chunk of window group g (kv.h): its record goes down
 * as the tree's evicted blocks do, so that a hit there later reads it back
 * (kvc_tiers_fetch_windows) instead of computing the window again. */
static void on_chunk_evict(void *user, const kvc_pc_node *n, int32_t g)
{
    kvc_tiers *t = user;
    const bool sent = send_down(t, n, g);
    pthread_mutex_lock(&t->q_mu);
    t->st.chunks_written += sent;
    pthread_mutex_unlock(&t->q_mu);
}

/* -------------------------------------------------------------- lifetime */

int kvc_tiers_new(kvc_prefix_cache *pc, kvc_kv_pool *pool, kvc_block_store *store,
                  int32_t queue_blocks, kvc_tiers **out, kvc_err *err)
{
    *out = NULL;
    kvc_tiers *t = calloc(1, sizeof(*t));
    if (!t)
        return kvc_fail(err, KVC_ERR_NOMEM, "tiers: out of memory");
    t->pc = pc;
    t->pool = pool;
    t->store = store;
    t->B = kvc_kv_block_tokens(pool);
    t->n_groups = kvc_kv_n_groups(pool);
    for (int32_t g = 0; g < t->n_groups; g++) {
        t->chunk_bytes[g] = kvc_kv_group_chunk_bytes(pool, g);
        t->max_bytes = KVC_MAX(t->max_bytes, t->chunk_bytes[g]);
    }
    t->block_bytes = t->chunk_bytes[0];
    t->cap = queue_blocks > 0 ? queue_blocks : 32;
    /* on demand up to 1 GiB of copies: a turn of a few thousand tokens is
     * written through without waiting or dropping */
    t->max_slots = (int32_t)KVC_MAX((size_t)t->cap, KVC_MIN((size_t)1 << 30,
                                    (size_t)t->cap * t->max_bytes * 64) / t->max_bytes);
    pthread_mutex_init(&t->store_mu, NULL);
    pthread_mutex_init(&t->q_mu, NULL);
    pthread_cond_init(&t->q_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    bool ok = true;
    for (int32_t i = 0; ok && i < t->cap; i++) {
        slot *sl = slot_new(t);
        ok = sl != NULL;
        if (ok) {
            sl->next = t->spare;
            t->spare = sl;
            t->n_slots++;
        }
    }
    t->started = ok && pthread_create(&t->writer, NULL, writer_main, t) == 0;
    if (!t->started) {
        kvc_tiers_free(t);
        return kvc_fail(err, KVC_ERR_NOMEM, "tiers: cannot allocate a write queue of %d blocks "
                        "of %zu bytes, or start its thread", queue_blocks, t->block_bytes);
    }
    kvc_pc_set_evict_hook(pc, on_evict, t);
    kvc_pc_set_chunk_evict_hook(pc, t->n_groups > 1 ? on_chunk_evict : NULL, t);
    *out = t;
    return KVC_OK;
}

void kvc_tiers_free(kvc_tiers *t)
{
    if (!t)
        return;
    if (t->started) {
        kvc_pc_set_evict_hook(t->pc, NULL, NULL);
        kvc_pc_set_chunk_evict_hook(t->pc, NULL, NULL);
        pthread_mutex_lock(&t->q_mu);
        t->stop = true;
        pthread_cond_signal(&t->q_cv);
        pthread_mutex_unlock(&t->q_mu);
        pthread_join(t->writer, NULL);               /* it writes what is queued first */
    }
    for (slot *sl = t->spare, *nx; sl; sl = nx) {   /* the writer emptied the queue */
        nx = sl->next;
        slot_free(sl);
    }
    pthread_mutex_destroy(&t->store_mu);
    pthread_mutex_destroy(&t->q_mu);
    pthread_cond_destroy(&t->q_cv);
    pthread_cond_destroy(&t->done_cv);
    free(t);
}

void kvc_tiers_flush(kvc_tiers *t)
{
    pthread_mutex_lock(&t->q_mu);
    while (t->count > 0)
        pthread_cond_wait(&t->done_cv, &t->q_mu);
    pthread_mutex_unlock(&t->q_mu);
    kvc_bs_flush(t->store);          /* the store's own background work (Redis writes) */
}

void kvc_tiers_stats_get(kvc_tiers *t, kvc_tiers_stats *st)
{
    pthread_mutex_lock(&t->q_mu);
    *st = t->st;
    st->writes_pending = (int32_t)t->count;
    pthread_mutex_unlock(&t->q_mu);
}

void kvc_tiers_store_stats(kvc_tiers *t, kvc_bs_stats *st)
{
    pthread_mutex_lock(&t->store_mu);
    kvc_bs_stats_get(t->store, st);
    pthread_mutex_unlock(&t->store_mu);
}

/* ---------------------------------------------------------- fetch, write */

static uint64_t start_hash(kvc_tiers *t, uint64_t ns, const kvc_pc_match *m)
{
    return m->last == kvc_pc_root(t->pc) ? kvc_pc_ns_seed(t->pc, ns) : m->last->hash;
}

/* The store's part of a probe: the run of blocks i = from.. of tokens
 * (chain hash h before it) that it can give, readied in one go (a remote
 * store fetches them in one round trip: kvc_bs_prefetch). */
static int64_t probe_store(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                           int64_t from, uint64_t h)
{
    int64_t len = n / t->B - from;
    kvc_block_desc *run = len > 0 ? malloc((size_t)len * sizeof(*run)) : NULL;
    if (!run)
        return 0;
    for (int64_t i = 0; i < len; i++) {
        const int32_t *bt = tokens + (from + i) * t->B;
        run[i] = (kvc_block_desc){ kvc_pc_chain_hash(t->pc, h, bt), h, t->B, bt, ns };
        h = run[i].hash;
    }
    pthread_mutex_lock(&t->store_mu);
    int64_t got = kvc_bs_prefetch(t->store, run, len);
    pthread_mutex_unlock(&t->store_mu);
    free(run);
    return got;
}

int64_t kvc_tiers_probe(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                        const kvc_pc_match *m)
{
    if (m->pending)
        return 0;
    uint64_t h = start_hash(t, ns, m);
    int64_t got = 0, i = m->n_full;
    for (; (i + 1) * t->B <= n; i++, got++) {
        kvc_block_desc d = { kvc_pc_chain_hash(t->pc, h, tokens + i * t->B), h, t->B,
                             tokens + i * t->B, ns };
        if (!queued(t, &d, NULL, 0) && !stored(t, d.hash))
            break;
        h = d.hash;
    }
    /* what neither the queue nor the store's index holds may still be
     * fetched ahead (the shared tier: one round trip for the run) */
    return got + probe_store(t, ns, tokens, n, i, h);
}

/* Read record d into kv (kv_bytes): from the queue, else from the store. */
static bool read_one(kvc_tiers *t, const kvc_block_desc *d, void *kv, size_t kv_bytes)
{
    if (queued(t, d, kv, kv_bytes))
        return true;
    pthread_mutex_lock(&t->store_mu);
    int rc = kvc_bs_get(t->store, d, kv, kv_bytes, NULL);
    pthread_mutex_unlock(&t->store_mu);
    return rc == KVC_OK;
}

/* Read block d into pool block b (new: every chunk there): group 0's record
 * or nothing (false); each window group's, or b lets that chunk go. */
static bool read_into(kvc_tiers *t, const kvc_block_desc *d, int32_t b)
{
    if (!read_one(t, d, kvc_kv_block_data(t->pool, b), t->block_bytes))
        return false;
    for (int32_t g = 1; g < t->n_groups; g++) {
        const kvc_block_desc dg = group_desc(d, g);
        void *kv = kvc_kv_chunk_data(t->pool, b, g);
        if (!kv)
            continue;
        const bool ok = read_one(t, &dg, kv, t->chunk_bytes[g]);
        count_window_read(t, 1, t->chunk_bytes[g], ok);
        if (!ok)
            kvc_kv_block_drop_chunk(t->pool, b, g);
    }
    return true;
}

int64_t kvc_tiers_fetch(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                        kvc_pc_match *m, int64_t max)
{
    if (m->pending)
        return 0;
    uint64_t h = start_hash(t, ns, m);
    int64_t got = 0;
    for (int64_t i = m->n_full; got < max && (i + 1) * t->B <= n; i++) {
        const int32_t *bt = tokens + i * t->B;
        kvc_block_desc d = { kvc_pc_chain_hash(t->pc, h, bt), h, t->B, bt, ns };
        int32_t b = kvc_kv_block_alloc(t->pool);
        if (b < 0)
            break;
        bool ok = read_into(t, &d, b);
        kvc_pc_node *node = NULL;
        if (ok && kvc_pc_insert(t->pc, ns, m->last, bt, b, false, &node, NULL) < 0)
            ok = false;
        kvc_kv_block_unref(t->pool, b);              /* the tree's reference remains */
        if (!ok) {
            pthread_mutex_lock(&t->q_mu);
            t->st.fetch_failures++;
            pthread_mutex_unlock(&t->q_mu);
            break;
        }
        m->last = node;
        m->n_full++;
        got++;
        h = d.hash;
    }
    if (got > 0) {
        m->partial = NULL;
        m->partial_len = 0;
        pthread_mutex_lock(&t->q_mu);
        t->st.blocks_fetched += (uint64_t)got;
        pthread_mutex_unlock(&t->q_mu);
    }
    return got;
}

/* ---------------------------------------------------------- window chunks */

/* Whether the queue or the store holds node x's record of group g. */
static bool has_record(kvc_tiers *t, const kvc_pc_node *x, int32_t g)
{
    kvc_block_desc d;
    desc_of(t, x, &d);
    const kvc_block_desc dg = group_desc(&d, g);
    return queued(t, &dg, NULL, 0) || stored(t, dg.hash);
}

/* The window chunks a hit after path[0, end) needs (kv.h's
 * kvc_kv_servable) that neither RAM, the queue nor the store holds: 0 when
 * the tiers can complete it; counting stops at the first unless `all`. */
static int64_t window_missing(kvc_tiers *t, kvc_pc_node *const *path, int64_t end, bool all)
{
    int64_t missing = 0;
    for (int32_t g = 1; g < t->n_groups; g++) {
        const int64_t w = kvc_kv_group_of(t->pool, g)->window, L = end * t->B;
        for (int64_t i = L > w ? (L - w) / t->B : 0; i < end; i++)
            if (!kvc_kv_block_has(t->pool, path[i]->block, g) && !has_record(t, path[i], g)) {
                missing++;
                if (!all)
                    return missing;
            }
    }
    return missing;
}

/* Give the blocks of that window their missing chunks, read from the tiers
 * (a record that does not read leaves its chunk out); the number read. */
static int64_t read_window(kvc_tiers *t, kvc_pc_node *const *path, int64_t end)
{
    int64_t got = 0;
    for (int32_t g = 1; g < t->n_groups; g++) {
        const int64_t w = kvc_kv_group_of(t->pool, g)->window, L = end * t->B;
        for (int64_t i = L > w ? (L - w) / t->B : 0; i < end; i++) {
            bool fresh = false;
            void *kv = kvc_kv_block_add_chunk(t->pool, path[i]->block, g, &fresh);
            if (!kv)
                return got;                          /* every chunk held: no room */
            if (!fresh)
                continue;
            kvc_block_desc d;
            desc_of(t, path[i], &d);
            const kvc_block_desc dg = group_desc(&d, g);
            const bool ok = read_one(t, &dg, kv, t->chunk_bytes[g]);
            count_window_read(t, 1, t->chunk_bytes[g], ok);
            got += ok;
            if (!ok)
                kvc_kv_block_drop_chunk(t->pool, path[i]->block, g);
        }
    }
    return got;
}

int64_t kvc_tiers_fetch_windows(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                                const kvc_pc_match *m)
{
    const int64_t cap = n / t->B;
    if (t->n_groups == 1 || m->pending || cap <= m->n_full)
        return 0;
    kvc_pc_node **path = malloc((size_t)cap * sizeof(*path));
    if (!path)
        return 0;
    const kvc_pc_node *root = kvc_pc_root(t->pc);
    for (kvc_pc_node *x = m->last; x != root; x = x->parent)
        path[x->depth] = x;
    int64_t end = m->n_full;
    for (kvc_pc_node *x = m->last; end < cap; end++) {   /* the tree's path past the match */
        x = kvc_pc_find(t->pc, ns, x, tokens + end * t->B);
        if (!x || x->pending)
            break;
        path[end] = x;
    }
    int64_t got = 0;
    const int64_t deepest = end;
    for (; end > m->n_full && !got; end--) {  /* the deepest hit the tiers complete */
        const int64_t missing = window_missing(t, path, end, end == deepest);
        if (end == deepest && missing > 0)    /* the request's deepest hit lacks them */
            count_window_read(t, (uint64_t)missing, 0, false);
        if (missing == 0)
            got = read_window(t, path, end);
    }
    free(path);
    pthread_mutex_lock(&t->q_mu);
    t->st.chunks_fetched += (uint64_t)got;
    pthread_mutex_unlock(&t->q_mu);
    return got;
}

/* A store with a tier that loses blocks behind its back (a shared Redis
 * flushed or restarted) is told of the whole chain above node (depth blocks),
 * root first, up to its first pending block: it puts back in the background
 * what that tier lost, so write-through does not depend on what the local
 * disk holds. */
static void refresh_path(kvc_tiers *t, const kvc_pc_node *node, int64_t depth)
{
    const kvc_pc_node *root = kvc_pc_root(t->pc);
    kvc_block_desc *run = malloc((size_t)KVC_MAX(depth, 1) * sizeof(*run));
    if (!run)
        return;
    int64_t i = depth, len = depth;
    for (const kvc_pc_node *n = node; n && n != root; n = n->parent) {
        desc_of(t, n, &run[--i]);
        if (n->pending)
            len = i;                                 /* the topmost pending block so far */
    }
    pthread_mutex_lock(&t->store_mu);
    kvc_bs_refresh(t->store, run, len, t->block_bytes);
    pthread_mutex_unlock(&t->store_mu);
    free(run);
}

int64_t kvc_tiers_write_path(kvc_tiers *t, const kvc_pc_node *node)
{
    const kvc_pc_node *root = kvc_pc_root(t->pc);
    int64_t depth = 0;
    for (const kvc_pc_node *n = node; n && n != root; n = n->parent)
        depth++;
    const kvc_pc_node **path = malloc((size_t)(depth + 1) * sizeof(*path));
    if (!path)
        return 0;
    int64_t k = 0;
    for (const kvc_pc_node *n = node; n && n != root; n = n->parent) {
        if (n->pending)
            continue;
        kvc_block_desc d;
        desc_of(t, n, &d);
        if (queued(t, &d, NULL, 0) || stored(t, d.hash))
            break;
        path[k++] = n;
    }
    if (t->store->ops->refresh)
        refresh_path(t, node, depth);
    int64_t sent = 0;
    while (k > 0 && enqueue(t, path[k - 1])) {      /* from the top down */
        k--;
        sent++;
    }
    if (k > 0) {
        pthread_mutex_lock(&t->q_mu);
        t->st.writes_dropped += (uint64_t)k;
        pthread_mutex_unlock(&t->q_mu);
    }
    free(path);
    return sent;
}

/* ------------------------------------------------------------------ tails */

/* A tail's key: its tokens' hash seeded with the parent's, apart from every
 * full block's (a salted seed, and fewer than B tokens). */
#define TAIL_SALT 0x7461696c5f6b7663ull              /* "tail_kvc" */

static uint64_t tail_hash(uint64_t parent, const int32_t *tokens, int32_t k)
{
    return XXH3_64bits_withSeed(tokens, (size_t)k * sizeof(int32_t), parent ^ TAIL_SALT);
}

/* Send tail d (its d->n_tokens < B positions written in pool block
 * `block`) down, every chunk: a copy whose positions past the tail are
 * zeroed (kvc_kv_chunk_clear_rows), so that the record holds no undefined
 * bytes (valgrind: the disk's writev and Redis's write read them) and none of
 * an earlier owner of the block, and the same tail is the same bytes on
 * every write. Queued, or written at once when the queue is full. */
static void send_tail(kvc_tiers *t, const kvc_block_desc *d, int32_t block)
{
    uint8_t *buf = malloc(t->max_bytes);
    for (int32_t g = 0; g < t->n_groups; g++) {
        const void *kv = kvc_kv_chunk_data(t->pool, block, g);
        if (!kv)
            continue;
        if (!buf) {
            pthread_mutex_lock(&t->q_mu);
            t->st.write_failures++;
            pthread_mutex_unlock(&t->q_mu);
            continue;
        }
        memcpy(buf, kv, t->chunk_bytes[g]);
        kvc_kv_chunk_clear_rows(t->pool, g, buf, d->n_tokens);
        const kvc_block_desc dg = group_desc(d, g);
        if (!enqueue_one(t, &dg, g, buf, t->chunk_bytes[g]))
            put_one_now(t, &dg, g, buf, t->chunk_bytes[g]);
    }
    free(buf);
}

void kvc_tiers_write_tail(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                          int32_t block)
{
    const int32_t k = (int32_t)(n % t->B);
    if (k == 0)
        return;
    uint64_t h = kvc_pc_ns_seed(t->pc, ns);
    for (int64_t i = 0; (i + 1) * t->B <= n; i++)
        h = kvc_pc_chain_hash(t->pc, h, tokens + i * t->B);
    const int32_t *tt = tokens + n - k;
    kvc_block_desc d = { tail_hash(h, tt, k), h, k, tt, ns };
    if (queued(t, &d, NULL, 0) || stored(t, d.hash))
        return;
    pthread_mutex_lock(&t->q_mu);
    t->st.tails_written++;
    pthread_mutex_unlock(&t->q_mu);
    send_tail(t, &d, block);
}

/* The tail of k tokens after the match m: its key and where it is. */
static kvc_block_desc tail_desc(kvc_tiers *t, uint64_t ns, const int32_t *tokens,
                                const kvc_pc_match *m, int32_t k)
{
    const uint64_t h = start_hash(t, ns, m);
    const int32_t *tt = tokens + (int64_t)m->n_full * t->B;
    return (kvc_block_desc){ tail_hash(h, tt, k), h, k, tt, ns };
}

int32_t kvc_tiers_probe_tail(kvc_tiers *t, uint64_t ns, const int32_t *tokens, int64_t n,
                             const kvc_pc_match *m, int32_t min_len)
{
    if (m->pending)
        return 0;
    for (int32_t k = (int32_t)KVC_MIN(t->B - 1, n - (int64_t)m->n_full * t->B); k > min_len; k--) {
        kvc_block_desc d = tail_desc(t, ns, tokens, m, k);
        if (queued(t, &d, NULL, 0) || stored(t, d.hash))
            return k;
    }
    return 0;
}

bool kvc_tiers_fetch_tail(kvc_tiers *t, uint64_t ns, const int32_t *tokens,
                          const kvc_pc_match *m, int32_t k, int32_t *block)
{
    *block = -1;
    kvc_block_desc d = tail_desc(t, ns, tokens, m, k);
    int32_t b = kvc_kv_block_alloc(t->pool);
    if (b < 0)
        return false;
    bool ok = read_into(t, &d, b);
    pthread_mutex_lock(&t->q_mu);
    t->st.tails_fetched += ok;
    t->st.fetch_failures += !ok;
    pthread_mutex_unlock(&t->q_mu);
    if (!ok) {
        kvc_kv_block_unref(t->pool, b);
        return false;
    }
    *block = b;
    return true;
}

/* ------------------------------------------------------------ records */

bool kvc_tiers_has(kvc_tiers *t, uint64_t hash)
{
    const kvc_block_desc d = { .hash = hash };
    return queued(t, &d, NULL, 0) || stored(t, hash);
}

int kvc_tiers_queue_record(kvc_tiers *t, const kvc_block_desc *d, void *data, size_t bytes)
{
    slot *s = d->n_tokens >= 1 && d->n_tokens <= t->B ? calloc(1, sizeof(*s)) : NULL;
    if (s && !(s->tokens = malloc((size_t)t->B * sizeof(int32_t)))) {
        free(s);
        s = NULL;
    }
    pthread_mutex_lock(&t->q_mu);
    bool dup = queued_locked(t, d, NULL, 0);
    bool room = s && !dup && t->rec_bytes + bytes <= MAX_RECORD_BYTES;
    if (room) {                                      /* a slot of its own, no K/V copy */
        s->rec = data;
        s->kv_bytes = bytes;
        t->rec_bytes += bytes;
        queue_push_locked(t, s, d);
    }
    pthread_mutex_unlock(&t->q_mu);
    if (room || dup) {
        if (dup) {
            slot_free(s);
            free(data);
        }
        return KVC_OK;
    }
    slot_free(s);                    /* the queue is full of records: at once */
    pthread_mutex_lock(&t->store_mu);
    int rc = kvc_bs_put(t->store, d, data, bytes, NULL);
    pthread_mutex_unlock(&t->store_mu);
    free(data);
    pthread_mutex_lock(&t->q_mu);
    count_put_locked(t, 0, bytes, rc);
    pthread_mutex_unlock(&t->q_mu);
    return rc;
}

int kvc_tiers_get_record(kvc_tiers *t, const kvc_block_desc *d, void *data, size_t bytes)
{
    if (queued(t, d, data, bytes))
        return KVC_OK;
    pthread_mutex_lock(&t->store_mu);
    int rc = kvc_bs_get(t->store, d, data, bytes, NULL);
    pthread_mutex_unlock(&t->store_mu);
    return rc;
}
