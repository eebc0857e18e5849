/* snapshot.c - recurrent-state snapshots hung off the prefix tree's nodes
 * (snapshot.h): a hash table keyed by node, an LRU list, payloads in pool
 * blocks. */
#include "snapshot.h"
#include "tiers.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define SNAP_SALT 0x736e617073686f74ull   /* "snapshot": its chain hash differs from a block's */

struct kvc_snap {
    kvc_snap    *hnext;               /* bucket chain */
    kvc_snap    *lru_next, *lru_prev; /* every snapshot, least recently used first */
    kvc_pc_node *node;                /* block pos / B - 1's node, or the root */
    uint64_t     ns;
    uint64_t     last_used;           /* the tree's clock (kvc_pc_tick) */
    int64_t      pos;                 /* P */
    int32_t      r;                   /* P % B: tokens of the partial block */
    int32_t      partial;             /* the copy of the partial block (r > 0), else -1 */
    int32_t      pins;
    bool         has_logits;
    int32_t      n_data;              /* payload blocks */
    int32_t     *tokens;              /* [r]: the partial block's tokens */
    int32_t      data[];              /* [n_data] pool blocks: states, then logits */
};

struct kvc_snaps {
    kvc_kv_pool      *pool;           /* borrowed */
    kvc_prefix_cache *pc;             /* borrowed */
    int32_t           B;
    int32_t           n_vocab;
    int64_t           state_floats;   /* every recurrent layer's */
    size_t            chunk;          /* bytes of a block's payload */
    kvc_snap        **buckets;        /* n_buckets (a power of two), by node */
    size_t            n_buckets;
    kvc_snap         *lru_head, *lru_tail;
    int64_t           n_blocks;       /* every snapshot's */
    int64_t           n_pinned_blocks;
    kvc_tiers        *tiers;          /* below RAM, or NULL (kvc_snaps_set_tiers) */
    kvc_snaps_stats   st;
};

static void on_drop(void *user, const kvc_pc_node *node);

/* ------------------------------------------------------------ lifetime */

int kvc_snaps_new(kvc_kv_pool *pool, kvc_prefix_cache *pc, int32_t n_vocab, kvc_snaps **out,
                  kvc_err *err)
{
    *out = NULL;
    if (kvc_kv_state_floats(pool) <= 0 || kvc_kv_n_groups(pool) != 1 || n_vocab < 1)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "snapshots: the pool needs recurrent layers "
                        "and one memory group (it has %lld state floats, %d groups)",
                        (long long)kvc_kv_state_floats(pool), kvc_kv_n_groups(pool));
    kvc_snaps *S = calloc(1, sizeof(*S));
    if (!S)
        return kvc_fail(err, KVC_ERR_NOMEM, "snapshots: out of memory");
    S->pool = pool;
    S->pc = pc;
    S->B = kvc_kv_block_tokens(pool);
    S->n_vocab = n_vocab;
    S->state_floats = kvc_kv_state_floats(pool);
    S->chunk = kvc_kv_group_chunk_bytes(pool, 0);
    S->n_buckets = 1024;
    if (!(S->buckets = calloc(S->n_buckets, sizeof(*S->buckets)))) {
        free(S);
        return kvc_fail(err, KVC_ERR_NOMEM, "snapshots: out of memory");
    }
    kvc_pc_set_drop_hook(pc, on_drop, S);
    *out = S;
    return KVC_OK;
}

static void snap_free(kvc_snaps *S, kvc_snap *sn);

void kvc_snaps_free(kvc_snaps *S)
{
    if (!S)
        return;
    while (S->lru_head)
        snap_free(S, S->lru_head);
    kvc_pc_set_drop_hook(S->pc, NULL, NULL);
    free(S->buckets);
    free(S);
}

/* ------------------------------------------------------------ helpers */

static size_t bucket_of(const kvc_snaps *S, const kvc_pc_node *node)
{
    uintptr_t p = (uintptr_t)node;
    return (size_t)((p >> 4) * 0x9e3779b97f4a7c15ull >> 20) & (S->n_buckets - 1);
}

static int32_t data_blocks(const kvc_snaps *S, bool logits)
{
    size_t bytes = (size_t)(S->state_floats + (logits ? S->n_vocab : 0)) * sizeof(float);
    return (int32_t)((bytes + S->chunk - 1) / S->chunk);
}

int64_t kvc_snaps_cost(const kvc_snaps *S, int64_t pos, bool logits)
{
    return data_blocks(S, logits) + (pos % S->B != 0);
}

static int64_t snap_blocks(const kvc_snap *sn) { return sn->n_data + (sn->partial >= 0); }

static void lru_unlink(kvc_snaps *S, kvc_snap *sn)
{
    if (!sn->lru_prev && S->lru_head != sn)
        return;   /* not listed yet */
    if (sn->lru_prev)
        sn->lru_prev->lru_next = sn->lru_next;
    else
        S->lru_head = sn->lru_next;
    if (sn->lru_next)
        sn->lru_next->lru_prev = sn->lru_prev;
    else
        S->lru_tail = sn->lru_prev;
    sn->lru_next = sn->lru_prev = NULL;
}

/* Mark it used now: the most recent end of the list. */
static void touch(kvc_snaps *S, kvc_snap *sn)
{
    lru_unlink(S, sn);
    sn->last_used = kvc_pc_tick(S->pc);
    sn->lru_prev = S->lru_tail;
    if (S->lru_tail)
        S->lru_tail->lru_next = sn;
    else
        S->lru_head = sn;
    S->lru_tail = sn;
}

/* Copy the payload floats [off, off + n) between buf and the data blocks. */
static void payload_io(kvc_snaps *S, const kvc_snap *sn, float *buf, size_t off, size_t n,
                       bool to_blocks)
{
    const size_t per = S->chunk / sizeof(float);
    while (n > 0) {
        size_t b = off / per, in = off % per, k = KVC_MIN(n, per - in);
        float *blk = (float *)kvc_kv_block_data(S->pool, sn->data[b]) + in;
        if (to_blocks)
            memcpy(blk, buf, k * sizeof(float));
        else
            memcpy(buf, blk, k * sizeof(float));
        buf += k;
        off += k;
        n -= k;
    }
}

static void snap_free(kvc_snaps *S, kvc_snap *sn)
{
    kvc_snap **pp = &S->buckets[bucket_of(S, sn->node)];
    while (*pp != sn)
        pp = &(*pp)->hnext;
    *pp = sn->hnext;
    lru_unlink(S, sn);
    for (int32_t i = 0; i < sn->n_data; i++)
        kvc_kv_block_unref(S->pool, sn->data[i]);
    if (sn->partial >= 0)
        kvc_kv_block_unref(S->pool, sn->partial);
    S->n_blocks -= snap_blocks(sn);
    if (sn->pins)
        S->n_pinned_blocks -= snap_blocks(sn);
    S->st.count--;
    S->st.bytes -= (int64_t)(S->state_floats + (sn->has_logits ? S->n_vocab : 0)) * (int64_t)sizeof(float);
    free(sn->tokens);
    free(sn);
}

/* A tree node leaves: its snapshots go with it. */
static void on_drop(void *user, const kvc_pc_node *node)
{
    kvc_snaps *S = user;
    for (kvc_snap *sn = S->buckets[bucket_of(S, node)], *nx; sn; sn = nx) {
        nx = sn->hnext;
        if (sn->node == node) {
            KVC_ASSERT(sn->pins == 0);   /* a pinned snapshot pins its node */
            snap_free(S, sn);
            S->st.dropped++;
        }
    }
}

/* The path end of a node: positions [0, E) are its path's. */
static int64_t node_end(const kvc_snaps *S, const kvc_pc_node *node)
{
    return (int64_t)(node->depth + 1) * S->B;
}

/* The snapshot at (node, ns) whose r tokens are `tokens`, or NULL. */
static kvc_snap *find_exact(kvc_snaps *S, const kvc_pc_node *node, uint64_t ns, int32_t r,
                            const int32_t *tokens)
{
    for (kvc_snap *sn = S->buckets[bucket_of(S, node)]; sn; sn = sn->hnext)
        if (sn->node == node && sn->ns == ns && sn->r == r &&
            (r == 0 || memcmp(sn->tokens, tokens, (size_t)r * sizeof(int32_t)) == 0))
            return sn;
    return NULL;
}

/* ------------------------------------------------------------ take */

/* A new snapshot at node + r tokens (partial[0, r)) with its blocks taken
 * (contents undefined) and entered; NULL with *rc when it cannot be. */
static kvc_snap *snap_new(kvc_snaps *S, uint64_t ns, kvc_pc_node *node, int32_t r,
                          const int32_t *partial, bool logits, int *rc, kvc_err *err)
{
    const int32_t nd = data_blocks(S, logits);
    *rc = KVC_OK;
    if (kvc_kv_n_free(S->pool) < nd + (r > 0)) {
        *rc = kvc_fail(err, KVC_ERR_KV_FULL, "snapshot: %d blocks needed, %lld free",
                       nd + (r > 0), (long long)kvc_kv_n_free(S->pool));
        return NULL;
    }
    kvc_snap *sn = calloc(1, sizeof(*sn) + (size_t)nd * sizeof(int32_t));
    if (!sn || (r > 0 && !(sn->tokens = malloc((size_t)r * sizeof(int32_t))))) {
        free(sn);
        *rc = kvc_fail(err, KVC_ERR_NOMEM, "snapshot: out of memory");
        return NULL;
    }
    sn->partial = -1;
    for (int32_t i = 0; i < nd + (r > 0); i++) {
        int32_t b = kvc_kv_block_alloc(S->pool);
        if (b < 0) {   /* counted free above: cannot happen with one group */
            for (int32_t j = 0; j < sn->n_data; j++)
                kvc_kv_block_unref(S->pool, sn->data[j]);
            free(sn->tokens);
            free(sn);
            *rc = kvc_fail(err, KVC_ERR_KV_FULL, "snapshot: no free block");
            return NULL;
        }
        if (i < nd)
            sn->data[sn->n_data++] = b;
        else
            sn->partial = b;
    }
    sn->node = node;
    sn->ns = ns;
    sn->pos = node_end(S, node) + r;
    sn->r = r;
    sn->has_logits = logits;
    if (r > 0)
        memcpy(sn->tokens, partial, (size_t)r * sizeof(int32_t));
    size_t b = bucket_of(S, node);
    sn->hnext = S->buckets[b];
    S->buckets[b] = sn;
    touch(S, sn);
    S->n_blocks += snap_blocks(sn);
    S->st.count++;
    S->st.bytes += (int64_t)(S->state_floats + (logits ? S->n_vocab : 0)) * (int64_t)sizeof(float);
    return sn;
}

static void write_down(kvc_snaps *S, const kvc_snap *sn);

int kvc_snaps_take(kvc_snaps *S, uint64_t ns, kvc_pc_node *node, const int32_t *tokens,
                   kvc_kv_seq *seq, const float *logits, kvc_err *err)
{
    const int64_t P = seq->n_tokens, E = node_end(S, node);
    const int32_t r = (int32_t)(P - E);
    if (P < 1 || r < 0 || r >= S->B || (node != kvc_pc_root(S->pc) && node->ns != ns) || node->pending)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "snapshot at %lld: the node of block %lld "
                        "is not the sequence's", (long long)P, (long long)(P / S->B - 1));
    const float *states = kvc_kv_seq_states(S->pool, seq);
    if (!states)
        return kvc_fail(err, KVC_ERR_NOMEM, "snapshot: out of memory");
    kvc_snap *old = find_exact(S, node, ns, r, tokens + E);
    if (old && (old->has_logits || !logits || old->pins)) {
        touch(S, old);   /* there already (a pinned one, in use, stays as it is) */
        return 0;
    }
    int rc;
    kvc_snap *sn = snap_new(S, ns, node, r, tokens + E, logits != NULL, &rc, err);
    if (!sn)
        return rc;
    if (old)
        snap_free(S, old);   /* the new one has the logits it lacked */
    if (r > 0)
        kvc_kv_block_copy(S->pool, sn->partial, seq->blocks[P / S->B]);
    payload_io(S, sn, (float *)states, 0, (size_t)S->state_floats, true);
    if (logits)
        payload_io(S, sn, (float *)logits, (size_t)S->state_floats, (size_t)S->n_vocab, true);
    S->st.taken++;
    if (S->tiers)
        write_down(S, sn);
    return 1;
}

/* ------------------------------------------------------------ find */

kvc_snap *kvc_snaps_find(kvc_snaps *S, uint64_t ns, kvc_pc_node *last, const int32_t *tokens,
                         int64_t limit, int64_t logits_at)
{
    for (kvc_pc_node *x = last; x; x = x->parent) {
        const int64_t E = node_end(S, x);
        if (E > limit)
            continue;
        kvc_snap *best = NULL;
        for (kvc_snap *sn = S->buckets[bucket_of(S, x)]; sn; sn = sn->hnext) {
            if (sn->node != x || sn->ns != ns || sn->pos > limit || (best && sn->pos <= best->pos))
                continue;
            if (sn->pos == logits_at && !sn->has_logits)
                continue;
            if (sn->r > 0 && memcmp(sn->tokens, tokens + E, (size_t)sn->r * sizeof(int32_t)) != 0)
                continue;
            best = sn;
        }
        if (best) {
            touch(S, best);
            return best;
        }
    }
    return NULL;
}

int64_t kvc_snap_pos(const kvc_snap *sn) { return sn->pos; }
bool kvc_snap_has_logits(const kvc_snap *sn) { return sn->has_logits; }
kvc_pc_node *kvc_snap_node(const kvc_snap *sn) { return sn->node; }

/* The chain hash of a snapshot at node + partial[0, r), with logits or not
 * (two records). */
static uint64_t hash_of(const kvc_snaps *S, const kvc_pc_node *node, uint64_t ns,
                        const int32_t *partial, int32_t r, bool logits)
{
    uint64_t seed = node->parent ? node->hash : kvc_pc_ns_seed(S->pc, ns);
    return XXH3_64bits_withSeed(partial, (size_t)r * sizeof(int32_t),
                                seed ^ SNAP_SALT ^ (logits ? 0x6c6f67697473ull : 0));
}

uint64_t kvc_snap_hash(const kvc_snaps *S, const kvc_snap *sn)
{
    return hash_of(S, sn->node, sn->ns, sn->tokens, sn->r, sn->has_logits);
}

void kvc_snaps_pin(kvc_snaps *S, kvc_snap *sn)
{
    if (sn->pins++ == 0)
        S->n_pinned_blocks += snap_blocks(sn);
    kvc_pc_pin(sn->node);
}

void kvc_snaps_unpin(kvc_snaps *S, kvc_snap *sn)
{
    KVC_ASSERT(sn->pins > 0);
    if (--sn->pins == 0)
        S->n_pinned_blocks -= snap_blocks(sn);
    kvc_pc_unpin(sn->node);
}

/* ------------------------------------------------------------ restore */

int kvc_snaps_restore(kvc_snaps *S, const kvc_snap *sn, kvc_kv_seq *seq, float *logits,
                      kvc_err *err)
{
    const int32_t nf = sn->node->depth + 1, nb = nf + (sn->partial >= 0);
    int32_t *blocks = malloc((size_t)KVC_MAX(nb, 1) * sizeof(int32_t));
    if (!blocks)
        return kvc_fail(err, KVC_ERR_NOMEM, "snapshot: out of memory");
    for (const kvc_pc_node *x = sn->node; x->parent; x = x->parent)
        blocks[x->depth] = x->block;
    if (sn->partial >= 0)
        blocks[nf] = sn->partial;
    int rc = kvc_kv_seq_assign(S->pool, seq, blocks, sn->pos, err);
    free(blocks);
    float *states = rc ? NULL : kvc_kv_seq_states(S->pool, seq);
    if (!rc && !states)
        rc = kvc_fail(err, KVC_ERR_NOMEM, "snapshot: out of memory");
    if (rc)
        return rc;
    payload_io(S, sn, states, 0, (size_t)S->state_floats, false);
    if (logits && sn->has_logits)
        payload_io(S, sn, logits, (size_t)S->state_floats, (size_t)S->n_vocab, false);
    S->st.restored++;
    return KVC_OK;
}

/* ------------------------------------------------------------ eviction */

int64_t kvc_snaps_evictable(const kvc_snaps *S) { return S->n_blocks - S->n_pinned_blocks; }

static kvc_snap *lru_first_unpinned(const kvc_snaps *S)
{
    kvc_snap *sn = S->lru_head;
    while (sn && sn->pins)
        sn = sn->lru_next;
    return sn;
}

uint64_t kvc_snaps_oldest(const kvc_snaps *S)
{
    const kvc_snap *sn = lru_first_unpinned(S);
    return sn ? sn->last_used : UINT64_MAX;
}

int64_t kvc_snaps_evict_one(kvc_snaps *S)
{
    kvc_snap *sn = lru_first_unpinned(S);
    if (!sn)
        return 0;
    int64_t before = kvc_kv_n_free(S->pool);
    snap_free(S, sn);
    S->st.evicted++;
    return kvc_kv_n_free(S->pool) - before;
}

/* ------------------------------------------------------------ figures, checks */

void kvc_snaps_get_stats(const kvc_snaps *S, kvc_snaps_stats *st)
{
    *st = S->st;
    st->blocks = S->n_blocks;
}

int kvc_snaps_check(const kvc_snaps *S, kvc_err *err)
{
    int64_t n = 0, blocks = 0, pinned = 0;
    uint64_t prev = 0;
    for (const kvc_snap *sn = S->lru_head; sn; sn = sn->lru_next) {
        if (sn->lru_prev ? sn->lru_prev->lru_next != sn : S->lru_head != sn)
            return kvc_fail(err, KVC_ERR_FORMAT, "snapshots: LRU links broken at %lld", (long long)sn->pos);
        if (sn->last_used < prev)
            return kvc_fail(err, KVC_ERR_FORMAT, "snapshots: LRU list out of order at %lld", (long long)sn->pos);
        prev = sn->last_used;
        const kvc_snap *h = S->buckets[bucket_of(S, sn->node)];
        while (h && h != sn)
            h = h->hnext;
        if (!h)
            return kvc_fail(err, KVC_ERR_FORMAT, "snapshots: %lld not in its bucket", (long long)sn->pos);
        if (sn->pos != node_end(S, sn->node) + sn->r || (sn->r > 0) != (sn->partial >= 0))
            return kvc_fail(err, KVC_ERR_FORMAT, "snapshots: %lld: position, node and partial disagree",
                            (long long)sn->pos);
        for (int32_t i = 0; i < sn->n_data; i++)
            if (kvc_kv_block_refcount(S->pool, sn->data[i]) < 1)
                return kvc_fail(err, KVC_ERR_FORMAT, "snapshots: %lld: a block not referenced",
                                (long long)sn->pos);
        if (sn->node->parent && sn->node->pending)
            return kvc_fail(err, KVC_ERR_FORMAT, "snapshots: %lld on a pending node", (long long)sn->pos);
        n++;
        blocks += snap_blocks(sn);
        pinned += sn->pins ? snap_blocks(sn) : 0;
    }
    int64_t in_buckets = 0;
    for (size_t b = 0; b < S->n_buckets; b++)
        for (const kvc_snap *sn = S->buckets[b]; sn; sn = sn->hnext)
            in_buckets++;
    if (n != S->st.count || in_buckets != n || blocks != S->n_blocks || pinned != S->n_pinned_blocks)
        return kvc_fail(err, KVC_ERR_FORMAT, "snapshots: counts disagree (%lld listed, %lld hashed, "
                        "%lld kept; blocks %lld vs %lld)", (long long)n, (long long)in_buckets,
                        (long long)S->st.count, (long long)blocks, (long long)S->n_blocks);
    return KVC_OK;
}

/* ------------------------------------------------------------ tiers */

/* A snapshot's record below RAM: key its chain hash; parent its node's chain
 * hash; tokens its partial ones then a tag (1 + logits) so that a record is
 * never empty; data the states, the logits when it has them, then the
 * partial block's K/V (group 0's chunk) when r > 0. */
#define SNAP_TAG (-2)

static size_t record_bytes(const kvc_snaps *S, bool logits, int32_t r)
{
    return (size_t)(S->state_floats + (logits ? S->n_vocab : 0)) * sizeof(float) +
           (r > 0 ? S->chunk : 0);
}

static void record_desc(const kvc_snaps *S, const kvc_pc_node *node, uint64_t ns,
                        const int32_t *partial, int32_t r, bool logits, int32_t *toks,
                        kvc_block_desc *d)
{
    if (r > 0)
        memcpy(toks, partial, (size_t)r * sizeof(int32_t));
    toks[r] = SNAP_TAG - (logits ? 1 : 0);
    *d = (kvc_block_desc){ hash_of(S, node, ns, partial, r, logits),
                           node->parent ? node->hash : kvc_pc_ns_seed(S->pc, ns), r + 1, toks, ns };
}

void kvc_snaps_set_tiers(kvc_snaps *S, kvc_tiers *tiers) { S->tiers = tiers; }

/* Write a snapshot through to the tiers as soon as it is taken (its state
 * is the last that a restart could find): the engine thread copies it out
 * of the pool and queues the copy; the tiers' writer thread checksums and
 * writes it, off the engine's path. A failure only means a restart
 * recomputes. */
static void write_down(kvc_snaps *S, const kvc_snap *sn)
{
    const size_t bytes = record_bytes(S, sn->has_logits, sn->r);
    const size_t nf = (size_t)S->state_floats + (sn->has_logits ? (size_t)S->n_vocab : 0);
    int32_t toks[64 + 1];
    char *buf = sn->r <= 64 ? malloc(bytes) : NULL;
    if (!buf)
        return;
    payload_io(S, sn, (float *)buf, 0, nf, false);
    if (sn->r > 0) {   /* the partial block: its positions past r defined (zeros), as a tail's */
        memcpy(buf + nf * sizeof(float), kvc_kv_block_data(S->pool, sn->partial), S->chunk);
        kvc_kv_chunk_clear_rows(S->pool, 0, buf + nf * sizeof(float), sn->r);
    }
    kvc_block_desc d;
    record_desc(S, sn->node, sn->ns, sn->tokens, sn->r, sn->has_logits, toks, &d);
    if (kvc_tiers_queue_record(S->tiers, &d, buf, bytes) == KVC_OK)   /* buf is the tiers' */
        S->st.written++;
}

kvc_snap *kvc_snaps_fetch(kvc_snaps *S, uint64_t ns, kvc_pc_node *last, const int32_t *tokens,
                          int64_t limit, int64_t logits_at, int64_t above)
{
    if (!S->tiers || S->B > 64)
        return NULL;
    int32_t toks[64 + 1];
    for (kvc_pc_node *x = last; x; x = x->parent) {
        const int64_t E = node_end(S, x);
        if (E > limit)
            continue;
        for (int32_t r = (int32_t)KVC_MIN((int64_t)S->B - 1, limit - E); r >= 0; r--) {
            if (E + r <= above)
                return NULL;
            for (int lg = 1; lg >= 0; lg--) {
                if (E + r == logits_at && !lg)
                    continue;
                kvc_block_desc d;
                record_desc(S, x, ns, tokens + E, r, lg, toks, &d);
                if (!kvc_tiers_has(S->tiers, d.hash) || find_exact(S, x, ns, r, tokens + E))
                    continue;
                const size_t bytes = record_bytes(S, lg, r);
                char *buf = malloc(bytes);
                if (!buf || kvc_tiers_get_record(S->tiers, &d, buf, bytes) != KVC_OK) {
                    free(buf);
                    continue;                /* gone, or corrupt: recomputed */
                }
                int rc;
                kvc_err e = { 0 };
                kvc_snap *sn = snap_new(S, ns, x, r, tokens + E, lg, &rc, &e);
                if (sn) {
                    size_t nf = (size_t)S->state_floats + (lg ? (size_t)S->n_vocab : 0);
                    payload_io(S, sn, (float *)buf, 0, nf, true);
                    if (r > 0)
                        memcpy(kvc_kv_block_data(S->pool, sn->partial), buf + nf * sizeof(float), S->chunk);
                    S->st.fetched++;
                }
                free(buf);
                return sn;                   /* NULL: no room for it */
            }
        }
    }
    return NULL;
}
