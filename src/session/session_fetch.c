/* session_fetch.c - the prepare step's reads from the tiers below RAM
 * (session.h, DESIGN.md §5): a prompt's match in the prefix tree continued
 * with the window chunks of its blocks in RAM and the full blocks the disk
 * tier holds, and the conversation's last,
 * partial block read back where it went down with its session's K/V. Each
 * probes the store first (reading nothing), makes room in the pool for what
 * it would read, and only then reads. */
#include "session.h"

/* Free blocks beyond those promised to running turns, after asking `room`
 * for k when fewer are free (m's nodes pinned meanwhile: room evicts). */
static int64_t free_for(kvc_context *c, kvc_pc_match *m, int64_t k, kvc_room_fn room,
                        void *user)
{
    if (kvc_kv_n_free(c->pool) - c->promised < k && room) {
        kvc_pc_pin(m->last);
        kvc_pc_pin(m->partial);
        room(c, c->promised + k, user);
        kvc_pc_unpin(m->last);
        kvc_pc_unpin(m->partial);
    }
    return kvc_kv_n_free(c->pool) - c->promised;
}

int64_t kvc_session_fetch_disk(kvc_session *s, const int32_t *tokens, int64_t n, kvc_pc_match *m,
                               int64_t own, kvc_room_fn room, void *user)
{
    kvc_context *c = s->ctx;
    const int64_t B = kvc_kv_block_tokens(c->pool);
    /* blocks in RAM past the match whose window chunks went down a tier */
    if (kvc_kv_n_groups(c->pool) > 1 && kvc_tiers_fetch_windows(c->tiers, s->ns, tokens, n, m) > 0)
        kvc_pc_lookup(c->pc, s->ns, tokens, n, m);
    int64_t k = kvc_tiers_probe(c->tiers, s->ns, tokens, n, m);
    if (k == 0 || (m->n_full + k) * B <= own)
        return 0;
    int64_t avail = free_for(c, m, k, room, user);
    int64_t got = avail > 0 ? kvc_tiers_fetch(c->tiers, s->ns, tokens, n, m, KVC_MIN(k, avail)) : 0;
    if (got > 0 && kvc_kv_n_groups(c->pool) > 1)   /* a window record may have been missing: */
        kvc_pc_lookup(c->pc, s->ns, tokens, n, m);  /* the match as far as every group serves */
    return got;
}

int32_t kvc_session_fetch_tail(kvc_session *s, const int32_t *tokens, int64_t n, kvc_pc_match *m,
                               int64_t own, kvc_room_fn room, void *user, int32_t *block)
{
    kvc_context *c = s->ctx;
    const int64_t B = kvc_kv_block_tokens(c->pool), base = (int64_t)m->n_full * B;
    const int64_t min_len = KVC_MAX(m->partial_len, own - base);
    *block = -1;
    if (min_len >= B - 1 || base + min_len >= n)
        return 0;
    int32_t k = kvc_tiers_probe_tail(c->tiers, s->ns, tokens, n, m, (int32_t)KVC_MAX(min_len, 0));
    if (k == 0 || free_for(c, m, 1, room, user) < 1 ||
        !kvc_tiers_fetch_tail(c->tiers, s->ns, tokens, m, k, block))
        return 0;
    m->partial = NULL;                       /* the tail is the longer */
    m->partial_len = 0;
    return k;
}
