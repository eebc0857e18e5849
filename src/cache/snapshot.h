/* snapshot.h - snapshots of recurrent states, entries of the prefix tree
 * (DESIGN.md §2, "Memory groups": the recurrent group).
 *
 * A recurrent layer's state summarises a sequence's whole prefix and cannot
 * be cut back (kv.h, "recurrent layers"). A SNAPSHOT keeps every recurrent
 * layer's state after position P - 1 of a token path tokens[0, P), and
 * optionally the logits row computed there (what predicts token P), so that
 * any sequence whose tokens start with that path can continue from P:
 *   - the full-attention K/V of positions [0, P / B * B) are the prefix
 *     tree's blocks: the snapshot hangs off the tree NODE of block P / B - 1
 *     (the root when P < B), whose path the tree verified token by token;
 *   - the K/V of the partial block [P / B * B, P), when P is not a block
 *     boundary, are copied into a block of the snapshot's own, with its
 *     r = P % B tokens, compared token by token on every lookup: a hash alone
 *     is never trusted;
 *   - the states (and logits) fill blocks of the pool taken for it.
 * So a snapshot costs pool blocks like the K/V it serves (kvc_snaps_cost):
 * it is counted in the pool's budget and evicted least recently used
 * together with the tree's blocks (kvc_snaps_oldest against the tree's LRU
 * leaf, on one clock: kvc_pc_tick). A node leaving the tree takes its
 * snapshots with it (they could serve nothing without its K/V).
 *
 * Its identity for the tiers below RAM is its chain hash: the tokens of its
 * partial block hashed with the chain hash of its node (the namespace's seed
 * at the root), distinct from any block's.
 *
 * The pool must have one memory group (recurrent models have: context.c).
 * Not thread-safe: the thread that owns the pool and the tree owns it. */
#ifndef KVC_SNAPSHOT_H
#define KVC_SNAPSHOT_H

#include "prefix_cache.h"

typedef struct kvc_snaps kvc_snaps;
typedef struct kvc_snap kvc_snap;

/* A store over `pool` and its tree `pc` (both borrowed, outliving it; it
 * becomes the tree's drop hook), for logits rows of n_vocab floats.
 * KVC_ERR_INVALID_ARG when the pool has no recurrent layer or more than one
 * memory group; KVC_ERR_NOMEM. */
int  kvc_snaps_new(kvc_kv_pool *pool, kvc_prefix_cache *pc, int32_t n_vocab, kvc_snaps **out,
                   kvc_err *err);
/* Free every snapshot (their blocks back to the pool) and the store. NULL ok. */
void kvc_snaps_free(kvc_snaps *S);

/* Pool blocks a snapshot at position pos takes (states, logits when asked,
 * and the partial block's copy when pos is not a block boundary). */
int64_t kvc_snaps_cost(const kvc_snaps *S, int64_t pos, bool logits);

/* Snapshot `seq` at its length P = seq->n_tokens: its states now, `logits`
 * (n_vocab floats, the row predicting token P; NULL: none kept). The
 * sequence holds tokens[0, P) of namespace ns, whose full blocks are the
 * path of `node`, the tree node of block P / B - 1 (the root when P < B;
 * ready). Takes kvc_snaps_cost free blocks: the caller makes room first.
 * Returns 1 (taken), 0 (there already: used again, and given the logits it
 * lacked), KVC_ERR_KV_FULL (too few free blocks: nothing taken),
 * KVC_ERR_INVALID_ARG (node is not block P / B - 1), KVC_ERR_NOMEM. */
int  kvc_snaps_take(kvc_snaps *S, uint64_t ns, kvc_pc_node *node, const int32_t *tokens,
                    kvc_kv_seq *seq, const float *logits, kvc_err *err);

/* The snapshot of the longest prefix tokens[0, P) with P <= limit that a
 * sequence can continue from: on the path of `last` (the deepest node a
 * lookup of tokens matched, kvc_pc_lookup's m.last; its path is tokens'),
 * at a node of it or the root, its partial tokens equal to tokens'. A
 * snapshot at P == logits_at must carry logits (a prompt wholly cached
 * samples from them; -1: no such need). NULL when none; the one found is
 * marked used (LRU). */
kvc_snap *kvc_snaps_find(kvc_snaps *S, uint64_t ns, kvc_pc_node *last, const int32_t *tokens,
                         int64_t limit, int64_t logits_at);

int64_t       kvc_snap_pos(const kvc_snap *sn);          /* P */
bool          kvc_snap_has_logits(const kvc_snap *sn);
kvc_pc_node  *kvc_snap_node(const kvc_snap *sn);         /* block P / B - 1's node, or the root */
uint64_t      kvc_snap_hash(const kvc_snaps *S, const kvc_snap *sn);   /* its chain hash */

/* Keep a snapshot (and its node, kvc_pc_pin) from eviction, e.g. between
 * finding it and restoring it while room is made; one unpin per pin. */
void kvc_snaps_pin(kvc_snaps *S, kvc_snap *sn);
void kvc_snaps_unpin(kvc_snaps *S, kvc_snap *sn);

/* Make `seq` the snapshot's path: the tree's blocks and the partial copy
 * (kvc_kv_seq_assign: the blocks it held released), its states the
 * snapshot's, n_tokens P; `logits` (may be NULL) gets the snapshot's row
 * when it has one. KVC_ERR_NOMEM (seq unchanged). */
int  kvc_snaps_restore(kvc_snaps *S, const kvc_snap *sn, kvc_kv_seq *seq, float *logits,
                       kvc_err *err);

/* Eviction, least recently used first, pinned ones never. */
int64_t  kvc_snaps_evictable(const kvc_snaps *S);   /* blocks evicting every unpinned one frees */
uint64_t kvc_snaps_oldest(const kvc_snaps *S);      /* the LRU one's last use; UINT64_MAX: none */
int64_t  kvc_snaps_evict_one(kvc_snaps *S);         /* blocks freed; 0: none to evict */

/* The tiers below RAM (tiers.h; NULL: none): every snapshot taken is
 * written through as one record (kvc_snap_hash its key, its node's chain
 * hash its parent, its partial tokens and a tag its tokens; checksummed and
 * all-or-nothing as the store writes any record), so a conversation
 * survives a restart. The write is queued (kvc_tiers_queue_record): the
 * caller's thread only copies the record out of the pool; stats.written
 * counts those handed over. */
struct kvc_tiers;
void kvc_snaps_set_tiers(kvc_snaps *S, struct kvc_tiers *tiers);

/* As kvc_snaps_find, from the tiers: the snapshot of the longest prefix
 * tokens[0, P), above < P <= limit, on the path of `last` that the tiers
 * hold and RAM does not, read into pool blocks (kvc_snaps_cost of it must
 * be free: the caller makes room) and entered. NULL when none (or no
 * room, or a record failed its checksum: recomputed). */
kvc_snap *kvc_snaps_fetch(kvc_snaps *S, uint64_t ns, kvc_pc_node *last, const int32_t *tokens,
                          int64_t limit, int64_t logits_at, int64_t above);

/* Figures. */
typedef struct kvc_snaps_stats {
    int64_t  count;          /* snapshots held */
    int64_t  blocks;         /* pool blocks they take */
    int64_t  bytes;          /* of which states and logits (payload) */
    uint64_t taken, restored, evicted, dropped;   /* since the start; dropped: with their node */
    uint64_t written, fetched;                    /* to and from the tiers */
} kvc_snaps_stats;
void kvc_snaps_get_stats(const kvc_snaps *S, kvc_snaps_stats *st);

/* Check the store's invariants (hash chains, LRU list, counts, each
 * snapshot's node in the tree and blocks referenced). KVC_OK or
 * KVC_ERR_FORMAT with what is wrong. For tests. */
int  kvc_snaps_check(const kvc_snaps *S, kvc_err *err);

#endif
