/* engine_sched.c - the engine thread: the sessions table and the scheduler
 * (DESIGN.md §4).
 *
 * Each pass of the loop:
 *   1. takes the newly submitted requests into the waiting list;
 *   2. applies cancellations (kvc_request_cancel, a client gone);
 *   3. admits waiting requests in arrival order while fewer than n_parallel
 *      run: finds the request's session, starts its turn on the tokens made
 *      at submission, and prepares it (match the session and the prefix tree, attach, reserve
 *      every block it may need). A turn whose prompt has a block another turn
 *      is computing waits for it (and lets the requests behind it pass); one
 *      that does not fit in memory even after eviction waits too, and holds
 *      back the requests behind it (first come, first served) - unless nothing
 *      runs, when it never will fit: it fails;
 *   4. runs one step, one forward pass of up to n_batch tokens: a token of
 *      every decoding turn, then prefill chunks (kvc_turns_step);
 *   5. ends the turns that are done: DONE events, counters, sessions free;
 *      a finished chat reply goes to the background thread (background.c);
 *   6. with nothing waiting or running: a step of background work, the
 *      canonical tokens of a finished conversation its session lacks, in
 *      chunks of at most BG_CHUNK tokens (a request arriving meanwhile waits
 *      at most one such chunk). A request that arrives stops it.
 *
 * Sessions: a request with a key (prompt_cache_key, else user) uses that key's
 * session, and waits while another request of the same key runs. One without
 * a key uses the idle unkeyed session sharing the longest token prefix with
 * it, else a fresh one; either way the prefix tree finds what any session
 * computed. A cold request (no_cache) gets a fresh session, reset again when it
 * ends, so it shares nothing with the warm path. Beyond max_sessions +
 * n_parallel sessions, the least recently used idle one is dropped.
 *
 * Memory: the pool is the budget. Blocks only the prefix tree holds are
 * evicted first (least recently used leaves); when that is not enough, the
 * least recently used idle sessions let go of their blocks (which then only
 * the tree holds) and eviction goes on. */
#include "engine.h"
#include "snapshot.h"
#include "tool_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Most tokens of background work per step: the longest a request arriving
 * during it can be kept waiting. */
#define BG_CHUNK 64

/* ------------------------------------------------------------- sessions */

int kvc_engine_sessions_new(kvc_engine *e, kvc_err *err)
{
    e->n_slots = e->p.max_sessions + e->p.n_parallel;
    e->slots = calloc((size_t)e->n_slots, sizeof(session_slot));
    e->running = calloc((size_t)e->p.n_parallel, sizeof(kvc_request *));
    e->turns = calloc((size_t)e->p.n_parallel, sizeof(kvc_turn *));
    if (!e->slots || !e->running || !e->turns)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < e->n_slots; i++) {
        char msg[sizeof(err->msg)];
        e->slots[i].s = kvc_session_new(e->ctx, i, e->p.chat_template, msg, sizeof(msg));
        if (!e->slots[i].s)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "%s", msg);
    }
    return KVC_OK;
}

void kvc_engine_sessions_free(kvc_engine *e)
{
    if (e->slots)
        for (int32_t i = 0; i < e->n_slots; i++) {
            kvc_session_free(e->slots[i].s);
            free(e->slots[i].key);
        }
    free(e->slots);
    free(e->running);
    free(e->turns);
}

void kvc_engine_update_gauges(kvc_engine *e)
{
    int32_t sessions = 0;
    for (int32_t i = 0; i < e->n_slots; i++)
        sessions += kvc_session_in_use(e->slots[i].s);
    kvc_kv_pool *pool = e->ctx->pool;
    pthread_mutex_lock(&e->mu);
    e->m.sessions = sessions;
    e->m.running = e->n_running;
    e->m.blocks_total = kvc_kv_n_blocks(pool);
    e->m.blocks_free = kvc_kv_n_free(pool);
    e->m.blocks_used = e->m.blocks_total - e->m.blocks_free;
    e->m.blocks_evicted = kvc_pc_n_evicted(e->ctx->pc) + e->dropped;
    e->m.blocks_cached = kvc_pc_n_nodes(e->ctx->pc);
    e->m.block_tokens = kvc_kv_block_tokens(pool);
    e->m.block_bytes = (int64_t)e->block_bytes;
    e->m.room_refused = e->ctx->room_refused;
    e->m.window_chunks_total = e->m.window_chunks_held = e->m.window_chunk_bytes = 0;
    int64_t win_bytes = 0;
    for (int32_t g = 1; g < kvc_kv_n_groups(pool); g++) {
        const int64_t n = kvc_kv_group_of(pool, g)->n_blocks, cb = (int64_t)kvc_kv_group_chunk_bytes(pool, g);
        e->m.window_chunks_total += n;
        e->m.window_chunks_held += kvc_kv_group_n_held(pool, g);
        e->m.window_chunk_bytes += cb;
        win_bytes += (n - kvc_kv_group_n_free(pool, g)) * cb;
    }
    e->m.kv_bytes_held = e->m.blocks_used * e->m.block_bytes + win_bytes;
    if (e->ctx->snaps) {
        kvc_snaps_stats ss;
        kvc_snaps_get_stats(e->ctx->snaps, &ss);
        e->m.snapshots = ss.count;
        e->m.snapshot_blocks = ss.blocks;
        e->m.snapshot_bytes = ss.bytes;
        e->m.snapshots_taken = ss.taken;
        e->m.snapshots_restored = ss.restored;
        e->m.snapshots_evicted = ss.evicted + ss.dropped;
        e->m.snapshots_written = ss.written;
        e->m.snapshots_fetched = ss.fetched;
        e->m.live_states = 0;
        for (int32_t i = 0; i < e->n_slots; i++)
            e->m.live_states += e->ctx->seqs[i].state != NULL;
        e->m.live_state_bytes = e->m.live_states * kvc_kv_state_floats(pool) * (int64_t)sizeof(float);
    }
    pthread_mutex_unlock(&e->mu);
}

void kvc_engine_tier_gauges(kvc_engine *e, kvc_engine_metrics *m)
{
    kvc_tiers *t = e->ctx->tiers;
    if (!t)
        return;
    kvc_tiers_stats ts;
    kvc_bs_stats bs;
    kvc_tiers_stats_get(t, &ts);
    kvc_tiers_store_stats(t, &bs);
    m->disk_blocks_read = ts.blocks_fetched;
    m->disk_blocks_written = ts.blocks_written;
    m->disk_writes_dropped = ts.writes_dropped;
    m->tier_write_failures = ts.write_failures;
    m->tier_fetch_failures = ts.fetch_failures;
    m->window_chunks_written = ts.window_chunks_written;
    m->window_bytes_written = ts.window_bytes_written;
    m->window_chunks_fetched = ts.window_chunks_fetched;
    m->window_bytes_read = ts.window_bytes_read;
    m->window_chunks_missed = ts.window_chunks_missed;
    m->disk_full_events = bs.full_events;
    m->tier_writes_pending = ts.writes_pending + bs.shared_pending;   /* Redis's too */
    m->disk_bytes_read = bs.bytes_read;
    m->disk_bytes_written = bs.bytes_written;
    m->disk_blocks = bs.n_blocks;
    m->disk_bytes_used = (int64_t)bs.bytes_used;
    m->disk_bytes_budget = (int64_t)bs.budget;
    m->disk_checksum_failures = bs.checksum_failures + bs.discarded_at_load;
    m->redis_up = bs.shared_up;
    m->redis_blocks_read = bs.shared_blocks_read;
    m->redis_blocks_written = bs.shared_blocks_written;
    m->redis_bytes_read = bs.shared_bytes_read;
    m->redis_bytes_written = bs.shared_bytes_written;
    m->redis_round_trips = bs.shared_round_trips;
    m->redis_failures = bs.shared_failures;
    m->redis_checksum_failures = bs.shared_checksum_failures;
}

/* The session for a request: its key's (NULL while another request of that
 * key holds it), else the idle unkeyed one sharing the longest token prefix
 * with it, else (a request a context shift cut) the idle unkeyed one whose
 * last prompt it continues with turns dropped, else the least recently used
 * idle one, reset (NULL when none). A cold request (no_cache) always gets the
 * last kind, and no key. */
static session_slot *pick_slot(kvc_engine *e, const kvc_request *r)
{
    const bool cold = r->chat.no_cache;
    const char *key = cold ? NULL : r->session_key;
    session_slot *best = NULL, *lru = NULL, *shifted = NULL;
    int64_t best_len = 0;
    for (int32_t i = 0; i < e->n_slots; i++) {
        session_slot *sl = &e->slots[i];
        if (key && sl->key && sl->s->ns == r->ns && strcmp(sl->key, key) == 0)
            return sl->busy ? NULL : sl;
        if (sl->busy)
            continue;
        if (!lru || sl->last_used < lru->last_used)
            lru = sl;
        if (key || cold || sl->key || sl->s->ns != r->ns)
            continue;
        /* it continues a conversation only when it has all of its last prompt:
         * others sharing a prefix with it (a system prompt) find that in the tree */
        int64_t len = kvc_session_common(sl->s, r->toks.v, r->toks.n);
        if (sl->s->n_prompt > 0 && len >= sl->s->n_prompt && len > best_len) {
            best = sl;
            best_len = len;
        } else if (r->dropped > 0 && !shifted &&
                   kvc_session_continues_shifted(sl->s, r->toks.v, r->toks.n, len)) {
            shifted = sl;
        }
    }
    if (!best)
        best = shifted;
    if (best || !lru)
        return best;
    kvc_session_spill_tail(lru->s);
    kvc_session_reset(lru->s);
    lru->s->ns = r->ns;
    free(lru->key);
    lru->key = key ? strdup(key) : NULL;     /* out of memory: an unkeyed session */
    return lru;
}

/* kvc_room_fn: evict; then let idle sessions go, least recently used first. */
/* Know before acting: could n_free blocks be free at all if every idle
 * session let go and the tree evicted all it then could? Every block but
 * those the running requests' sequences hold might be (an upper bound: a pin
 * may keep a few more). When not, make_room drops nothing, so a request that
 * must wait costs the others nothing. */
static bool room_possible(kvc_engine *e, kvc_context *c, int64_t n_free)
{
    const int64_t total = kvc_kv_n_blocks(c->pool);
    if (kvc_kv_n_free(c->pool) + kvc_pc_evictable(c->pc) >= n_free)
        return true;
    uint8_t *held = calloc((size_t)total, 1);
    if (!held)
        return true;                         /* cannot tell: try */
    int64_t n_held = 0;
    for (int32_t i = 0; i < e->n_slots; i++)
        if (e->slots[i].busy)
            for (int32_t k = 0; k < c->seqs[i].n_blocks; k++)
                if (!held[c->seqs[i].blocks[k]]) {
                    held[c->seqs[i].blocks[k]] = 1;
                    n_held++;
                }
    free(held);
    return total - n_held >= n_free;
}

static bool make_room(kvc_context *c, int64_t n_free, void *user)
{
    kvc_engine *e = user;
    if (!room_possible(e, c, n_free)) {
        c->room_refused++;
        return false;
    }
    while (!kvc_context_make_room(c, n_free)) {
        session_slot *lru = NULL;
        for (int32_t i = 0; i < e->n_slots; i++) {
            session_slot *sl = &e->slots[i];
            if (!sl->busy && c->seqs[i].n_blocks > 0 && (!lru || sl->last_used < lru->last_used))
                lru = sl;
        }
        if (!lru)
            return false;
        kvc_session_spill_tail(lru->s);
        e->dropped += (uint64_t)kvc_session_drop_kv(lru->s);
    }
    return true;
}

/* Whether slot's turn runs (admitted; not waiting for a prefix, memory
 * or a state). */
static bool slot_running(const kvc_engine *e, const session_slot *slot)
{
    for (int32_t i = 0; i < e->n_running; i++)
        if (e->running[i]->slot == slot)
            return true;
    return false;
}

/* Recurrent models: a live state (kv.h) is memory beside the pool, so at
 * most n_parallel sequences hold one (the KV budget keeps room for them:
 * engine.c); a background turn runs only when no request does. Before
 * `slot`'s turn makes one, the least recently used idle sessions that hold
 * one let go of their K/V (which only the tree then holds, with their
 * snapshots: their next turn continues from one) until fewer than
 * n_parallel others hold or are about to make one (the running ones).
 * A turn waiting for a prefix keeps its session's state (nothing of its
 * session changes before it runs), and counts. Returns whether slot's turn
 * may go on: false when the others are n_parallel even so, while a turn
 * runs (it waits for one to end). */
static bool limit_live_states(kvc_engine *e, const session_slot *slot)
{
    kvc_context *c = e->ctx;
    if (!c->snaps)
        return true;
    for (;;) {
        int32_t live = 0;
        session_slot *lru = NULL;
        for (int32_t i = 0; i < e->n_slots; i++) {
            session_slot *sl = &e->slots[i];
            if (sl == slot || (!c->seqs[i].state && !(sl->busy && slot_running(e, sl))))
                continue;                    /* a running turn makes its state soon */
            live++;
            if (!sl->busy && (!lru || sl->last_used < lru->last_used))
                lru = sl;
        }
        if (live < e->p.n_parallel)
            return true;
        if (!lru)
            return e->n_running == 0;        /* nothing to wait for: go on */
        kvc_session_spill_tail(lru->s);
        e->dropped += (uint64_t)kvc_session_drop_kv(lru->s);
    }
}

/* ------------------------------------------------------------- requests */

static bool on_text(const char *text, size_t len, const kvc_token_logprob *lp, int32_t n_lp,
                    void *user)
{
    kvc_request *r = user;
    if (atomic_load(&r->cancelled))
        return false;
    kvc_chat_stats st = { 0 };
    if (!r->told_prompt && r->turn)          /* the first piece tells the prompt's figures */
        kvc_turn_prompt_stats(r->turn, &st);
    kvc_request_push_text(r, text, len, lp, n_lp, r->told_prompt ? NULL : &st);
    r->told_prompt = true;
    return true;
}

static void release_slot(kvc_engine *e, kvc_request *r)
{
    if (r->slot) {
        if (r->chat.no_cache)                /* a cold run leaves nothing behind */
            kvc_session_reset(r->slot->s);
        r->slot->busy = NULL;
        r->slot->last_used = ++e->tick;
        r->slot = NULL;
    }
}

/* A request that failed before its turn ran: an ERROR event. */
static void fail_request(kvc_engine *e, kvc_request *r, int rc, const kvc_err *err)
{
    if (r->turn)
        kvc_turn_end(r->turn, NULL, NULL, NULL);
    r->turn = NULL;
    release_slot(e, r);
    pthread_mutex_lock(&e->mu);
    e->m.requests_failed++;
    pthread_mutex_unlock(&e->mu);
    kvc_request_push(r, KVC_EVENT_ERROR, NULL, 0, rc, err->msg[0] ? err->msg : kvc_strerror(rc),
                     NULL);
    kvc_request_unref(r);
}

/* End a request's turn (any phase): DONE with the reply and stats, or ERROR. */
static void end_request(kvc_engine *e, kvc_request *r)
{
    char *reply = NULL;
    kvc_chat_stats st;
    kvc_err err = { 0 };
    kvc_event done = { 0 };
    kvc_turn_take_logprobs(r->turn, &done.logprobs, &done.n_logprobs);
    int rc = kvc_turn_end(r->turn, &reply, &st, &err);
    r->turn = NULL;
    if (!rc && reply && r->chat.parse_tool_calls &&
        kvc_tool_calls_parse(e->tool_format, reply, strlen(reply), r->chat.tools_json,
                             (uint64_t)r->t_submit ^
                             (uint64_t)(uintptr_t)r, r->chat.single_tool_call ? 1 : 0,
                             &done.tool_calls, &done.content))
        rc = kvc_fail(&err, KVC_ERR_NOMEM, "out of memory");
    if (!rc && done.tool_calls && strcmp(st.finish_reason, "stop") == 0)
        st.finish_reason = "tool_calls";
    /* forced calls: any text beside them, or a reply with none, is a call
     * cut short by max_tokens ("<to", "</tool_ca"), not content */
    const bool only_calls = !rc && reply && r->chat.forced_tool_calls;
    if (only_calls && done.content)
        done.content[0] = 0;
    if (!rc && reply)
        kvc_engine_background_queue(e, r, reply, &st, &done);
    release_slot(e, r);
    kvc_engine_update_gauges(e);             /* a client that got DONE sees them current */
    pthread_mutex_lock(&e->mu);
    if (rc) {
        e->m.requests_failed++;
    } else {
        e->m.requests++;
        e->m.prompt_tokens += (uint64_t)st.prompt_tokens;
        e->m.cached_tokens += (uint64_t)st.cached_tokens;
        e->m.disk_tokens += (uint64_t)st.cached_disk_tokens;
        e->m.computed_tokens += (uint64_t)st.computed_tokens;
        e->m.output_tokens += (uint64_t)st.output_tokens;
        e->m.grammar_masks += (uint64_t)st.grammar_masks;
        e->m.grammar_mask_us += (uint64_t)(st.grammar_mask_ms * 1e3);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc)
        kvc_request_push(r, KVC_EVENT_ERROR, NULL, 0, rc, err.msg[0] ? err.msg : kvc_strerror(rc),
                         NULL);
    else
        kvc_request_push_done(r, KVC_EVENT_DONE, reply && !only_calls ? reply : "",
                              reply && !only_calls ? strlen(reply) : 0, 0, NULL, &st, &done);
    if (rc)
        kvc_event_clear(&done);
    free(reply);
    kvc_request_unref(r);
}

/* Take request r (after prev, or the head) off the waiting list. */
static void unlink_waiting(kvc_engine *e, kvc_request *prev, kvc_request *r)
{
    if (prev)
        prev->next = r->next;
    else
        e->waiting = r->next;
    r->next = NULL;
    pthread_mutex_lock(&e->mu);
    e->queued--;
    pthread_mutex_unlock(&e->mu);
}

/* Give a waiting request its session and turn. KVC_OK, 1 when its session is
 * busy (wait), or a failure (reported in err). */
static int start_turn(kvc_engine *e, kvc_request *r, kvc_err *err)
{
    session_slot *sl = pick_slot(e, r);
    if (!sl)
        return 1;
    sl->busy = r;
    sl->last_used = ++e->tick;
    r->slot = sl;
    /* forced calls are never text: nothing streams before DONE's calls */
    int rc = kvc_turn_new(sl->s, r->toks.v, r->toks.n, r->kind, &r->chat,
                          r->chat.forced_tool_calls ? NULL : on_text, r, r->t_submit,
                          &r->turn, err);
    if (!rc)
        kvc_turn_set_dropped(r->turn, r->dropped);
    if (!rc)
        rc = kvc_turn_set_marks(r->turn, r->starts.v, r->starts.n, err);
    return rc;
}

static void admit(kvc_engine *e)
{
    kvc_request *prev = NULL, *r = e->waiting;
    e->ctx->growth_reserve = e->n_running;   /* a block each for the replies to grow */
    while (r && e->n_running < e->p.n_parallel) {
        kvc_request *next = r->next;
        kvc_err err = { 0 };
        int rc = r->turn ? KVC_OK : start_turn(e, r, &err);
        if (rc == 1) {                       /* its session is busy */
            prev = r;
            r = next;
            continue;
        }
        if (!rc && !limit_live_states(e, r->slot)) {   /* it waits for a state to be let go */
            prev = r;
            r = next;
            continue;
        }
        if (!rc)
            rc = kvc_turn_prepare(r->turn, make_room, e, &err);
        if (rc == KVC_TURN_WAIT_PREFIX) {
            prev = r;
            r = next;
            continue;
        }
        if (rc == KVC_TURN_WAIT_MEMORY && e->n_running > 0)
            break;                           /* first come, first served */
        unlink_waiting(e, prev, r);
        if (rc == KVC_TURN_WAIT_MEMORY)      /* nothing runs, and still no room */
            fail_request(e, r, KVC_ERR_KV_FULL, &err);
        else if (rc < 0)
            fail_request(e, r, rc, &err);
        else {
            e->running[e->n_running++] = r;
            pthread_mutex_lock(&e->mu);
            e->m.running = e->n_running;
            pthread_mutex_unlock(&e->mu);
        }
        r = next;
    }
}

/* Cancelled requests: waiting ones end now, running ones at this step. */
static void apply_cancels(kvc_engine *e)
{
    for (int32_t i = 0; i < e->n_running; i++)
        if (atomic_load(&e->running[i]->cancelled))
            kvc_turn_cancel(e->running[i]->turn);
    kvc_request *prev = NULL, *r = e->waiting;
    while (r) {
        kvc_request *next = r->next;
        if (!atomic_load(&r->cancelled)) {
            prev = r;
            r = next;
            continue;
        }
        unlink_waiting(e, prev, r);
        if (r->turn)
            end_request(e, r);
        else {
            kvc_chat_stats st = { 0 };
            st.finish_reason = "cancelled";
            release_slot(e, r);
            kvc_request_push(r, KVC_EVENT_DONE, "", 0, 0, NULL, &st);
            kvc_request_unref(r);
        }
        r = next;
    }
}

/* The pool ran dry mid-decode: the newest running requests were preempted
 * (their blocks given back, down a tier); they wait again, ahead of the
 * others, in admission order, to resume. */
static void grow(kvc_engine *e)
{
    for (int32_t i = 0; i < e->n_running; i++)
        e->turns[i] = e->running[i]->turn;
    int32_t kept = kvc_turns_grow(e->ctx, e->turns, e->n_running, make_room, e);
    if (kept == e->n_running)
        return;
    for (int32_t i = e->n_running - 1; i >= kept; i--) {
        kvc_request *r = e->running[i];
        r->next = e->waiting;
        e->waiting = r;
    }
    pthread_mutex_lock(&e->mu);
    e->queued += e->n_running - kept;
    e->m.preemptions += (uint64_t)(e->n_running - kept);
    e->m.running = kept;
    pthread_mutex_unlock(&e->mu);
    e->n_running = kept;
}

/* Run one step over the running turns and end those that are done. */
static void step(kvc_engine *e)
{
    if (e->n_running == 0)
        return;
    grow(e);
    for (int32_t i = 0; i < e->n_running; i++)
        e->turns[i] = e->running[i]->turn;
    kvc_err err = { 0 };
    int64_t t0 = kvc_time_us();
    int n = kvc_turns_step(e->ctx, e->turns, e->n_running, 0, &err);
    pthread_mutex_lock(&e->mu);
    e->m.busy_us += (uint64_t)(kvc_time_us() - t0);
    if (n > 0) {
        e->m.steps++;
        e->m.step_tokens += (uint64_t)n;
    }
    pthread_mutex_unlock(&e->mu);
    int32_t kept = 0, n_done = 0;
    kvc_request *done[e->n_running];
    for (int32_t i = 0; i < e->n_running; i++) {
        kvc_request *r = e->running[i];
        if (kvc_turn_phase(r->turn) == KVC_TURN_DONE)
            done[n_done++] = r;
        else
            e->running[kept++] = r;
    }
    e->n_running = kept;
    for (int32_t i = 0; i < n_done; i++)
        end_request(e, done[i]);
}

/* ------------------------------------------------------------ background */

static bool evict_only(kvc_context *c, int64_t n_free, void *user)
{
    return kvc_context_make_room(c, n_free);
}

/* A background job is over: finished, found nothing to do, or stopped by a
 * request (its turn then keeps what it computed). */
static void bg_done(kvc_engine *e, bg_job *j, kvc_turn *t)
{
    kvc_chat_stats st = { 0 };
    if (t)
        kvc_turn_end(t, NULL, &st, NULL);
    pthread_mutex_lock(&e->mu);
    e->m.bg_pending--;
    e->m.bg_jobs++;
    e->m.bg_tokens += (uint64_t)KVC_MAX(st.computed_tokens, 0);
    pthread_mutex_unlock(&e->mu);
    kvc_bg_job_free(j);
}

static void bg_stop(kvc_engine *e)
{
    if (!e->bg_job_run)
        return;
    bg_done(e, e->bg_job_run, e->bg_turn);
    e->bg_job_run = NULL;
    e->bg_turn = NULL;
}

/* Start the next background job whose session is as its reply left it (its
 * serial unchanged) and lacks some of the canonical tokens. Returns whether
 * one runs. */
static bool bg_start(kvc_engine *e)
{
    bg_job *j;
    while ((j = kvc_engine_background_take(e))) {
        kvc_session *s = e->slots[j->slot].s;
        kvc_chat_params p = kvc_chat_default_params();
        kvc_turn *t = NULL;
        kvc_err err = { 0 };
        if (!e->slots[j->slot].busy && s->serial == j->serial &&
            j->toks.n > kvc_session_common(s, j->toks.v, j->toks.n) &&
            !kvc_turn_new(s, j->toks.v, j->toks.n, KVC_TURN_BACKGROUND, &p, NULL, NULL,
                          kvc_time_us(), &t, &err)) {
            if (limit_live_states(e, &e->slots[j->slot]) &&
                kvc_turn_prepare(t, evict_only, e, &err) == KVC_OK &&
                kvc_turn_phase(t) != KVC_TURN_DONE) {
                e->bg_job_run = j;
                e->bg_turn = t;
                return true;
            }
        }
        bg_done(e, j, t);                    /* no room, or nothing to do */
    }
    return false;
}

/* One step of background work (nothing waits or runs). */
static void bg_step(kvc_engine *e)
{
    if (!e->bg_job_run && !bg_start(e))
        return;
    kvc_err err = { 0 };
    int64_t t0 = kvc_time_us();
    kvc_turns_step(e->ctx, &e->bg_turn, 1, BG_CHUNK, &err);
    uint64_t us = (uint64_t)(kvc_time_us() - t0);
    pthread_mutex_lock(&e->mu);
    e->m.bg_us += us;
    e->m.busy_us += us;
    pthread_mutex_unlock(&e->mu);
    if (kvc_turn_phase(e->bg_turn) == KVC_TURN_DONE)
        bg_stop(e);
}

/* ---------------------------------------------------------------- loop */

/* Move submitted requests to the waiting list; with `idle`, first wait for
 * one (or a short while when requests wait on nothing running). Returns
 * whether the engine is stopping. */
static bool take_submitted(kvc_engine *e, bool idle)
{
    pthread_mutex_lock(&e->mu);
    bool bg_ready = !e->waiting && e->bg_head;
    if (idle && !e->queue_head && !e->stop && !bg_ready) {
        if (!e->waiting)
            pthread_cond_wait(&e->cv, &e->mu);
        else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 5000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        }
    }
    kvc_request *q = e->queue_head;
    e->queue_head = e->queue_tail = NULL;
    bool stop = e->stop;
    pthread_mutex_unlock(&e->mu);
    if (q) {
        kvc_request **tail = &e->waiting;
        while (*tail)
            tail = &(*tail)->next;
        *tail = q;
    }
    return stop;
}

void *kvc_engine_main(void *arg)
{
    kvc_engine *e = arg;
    while (!take_submitted(e, e->n_running == 0 && !e->bg_job_run)) {
        apply_cancels(e);
        if (e->waiting)                      /* a request came: background work yields */
            bg_stop(e);
        admit(e);
        if (e->n_running)
            step(e);
        else if (!e->waiting)
            bg_step(e);
        kvc_engine_update_gauges(e);
    }
    bg_stop(e);
    /* stopping: what runs or waits ends as cancelled */
    int32_t n = e->n_running;
    e->n_running = 0;
    for (int32_t i = 0; i < n; i++) {
        kvc_turn_cancel(e->running[i]->turn);
        end_request(e, e->running[i]);
    }
    for (kvc_request *r = e->waiting; r; r = e->waiting) {
        atomic_store(&r->cancelled, true);
        apply_cancels(e);
    }
    kvc_engine_update_gauges(e);
    return NULL;
}
