/* server_metrics.c - the server's counters and the Prometheus text of /metrics.
 *
 * The engine counts tokens and blocks (kvc_engine_get_metrics); the server
 * counts requests as the client saw them (a 400 never reaches the engine) and
 * keeps a time-to-first-token histogram and decode speeds from DONE stats. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* Upper bounds (seconds) of the TTFT histogram buckets; +Inf is implied. */
static const double ttft_bounds[SRV_TTFT_BUCKETS] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
};

typedef struct counters {
    uint64_t requests;                       /* completion requests received */
    uint64_t failed;                         /* answered with an error */
    uint64_t ttft_count[SRV_TTFT_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
    uint64_t ttft_n;
    double   ttft_sum;                       /* seconds */
    double   decode_last;                    /* tokens/s of the last request that decoded */
    double   decode_tokens;                  /* sum of tokens after the first ... */
    double   decode_seconds;                 /* ... and of the time they took */
    int64_t  conn_open;                      /* connections open (server_guard.c) */
    uint64_t conn_dropped;                   /* dropped for missing the request deadline */
} counters;

struct srv_metrics {
    pthread_mutex_t mu;
    counters        c;                       /* under mu */
};

srv_metrics *srv_metrics_new(void)
{
    srv_metrics *m = calloc(1, sizeof(*m));
    if (m)
        pthread_mutex_init(&m->mu, NULL);
    return m;
}

void srv_metrics_free(srv_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->c.requests++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_failed(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->c.failed++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_done(srv_metrics *m, const kvc_chat_stats *st)
{
    pthread_mutex_lock(&m->mu);
    if (st->output_tokens > 0 && st->ttft_ms >= 0) {
        double s = st->ttft_ms / 1000.0;
        int b = 0;
        while (b < SRV_TTFT_BUCKETS && s > ttft_bounds[b])
            b++;
        m->c.ttft_count[b]++;
        m->c.ttft_n++;
        m->c.ttft_sum += s;
    }
    if (st->output_tokens > 1 && st->decode_ms > 0) {
        m->c.decode_last = st->decode_tps;
        m->c.decode_tokens += st->output_tokens - 1;
        m->c.decode_seconds += st->decode_ms / 1000.0;
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_connections(srv_metrics *m, int64_t open, uint64_t dropped)
{
    pthread_mutex_lock(&m->mu);
    m->c.conn_open = open;
    m->c.conn_dropped = dropped;
    pthread_mutex_unlock(&m->mu);
}

/* ------------------------------------------------------------- the text */

typedef struct text {
    char  *s;
    size_t len, cap;
    bool   oom;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = t->cap - t->len;
        int n = t->oom ? 0 : vsnprintf(t->s + t->len, room, fmt, ap);
        va_end(ap);
        if (t->oom || n < 0)
            return;
        if ((size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->oom = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

static void metric(text *t, const char *name, const char *type, const char *help, double v)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void put_histogram(text *t, const counters *m)
{
    const char *n = "kvchat_ttft_seconds";
    put(t, "# HELP %s Time from request arrival to the first generated token.\n", n);
    put(t, "# TYPE %s histogram\n", n);
    uint64_t cum = 0;
    for (int b = 0; b < SRV_TTFT_BUCKETS; b++) {
        cum += m->ttft_count[b];
        put(t, "%s_bucket{le=\"%g\"} %llu\n", n, ttft_bounds[b], (unsigned long long)cum);
    }
    cum += m->ttft_count[SRV_TTFT_BUCKETS];
    put(t, "%s_bucket{le=\"+Inf\"} %llu\n", n, (unsigned long long)cum);
    put(t, "%s_sum %.17g\n%s_count %llu\n", n, m->ttft_sum, n, (unsigned long long)m->ttft_n);
}

static void put_engine(text *t, const kvc_engine_metrics *e)
{
    metric(t, "kvchat_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           (double)e->prompt_tokens);
    metric(t, "kvchat_cached_tokens_total", "counter", "Prompt tokens reused from the KV cache.",
           (double)e->cached_tokens);
    metric(t, "kvchat_computed_tokens_total", "counter",
           "Prompt tokens run through the model.", (double)e->computed_tokens);
    metric(t, "kvchat_output_tokens_total", "counter", "Generated tokens.",
           (double)e->output_tokens);
    metric(t, "kvchat_cache_hit_ratio", "gauge", "Cached prompt tokens / prompt tokens.",
           e->prompt_tokens ? (double)e->cached_tokens / (double)e->prompt_tokens : 0.0);
    metric(t, "kvchat_kv_blocks_total", "gauge", "KV pool size in blocks.",
           (double)e->blocks_total);
    metric(t, "kvchat_kv_blocks_used", "gauge", "KV blocks holding tokens.",
           (double)e->blocks_used);
    metric(t, "kvchat_kv_blocks_free", "gauge", "KV blocks free.", (double)e->blocks_free);
    metric(t, "kvchat_kv_blocks_evicted_total", "counter", "KV blocks evicted (LRU).",
           (double)e->blocks_evicted);
    metric(t, "kvchat_kv_block_tokens", "gauge", "Tokens per KV block.",
           (double)e->block_tokens);
    metric(t, "kvchat_kv_block_bytes", "gauge",
           "Bytes of a KV block (every layer but the sliding-window ones).", (double)e->block_bytes);
    metric(t, "kvchat_kv_window_chunks_total", "gauge",
           "Window chunks of the sliding-window layers (a block's positions, every such layer).",
           (double)e->window_chunks_total);
    metric(t, "kvchat_kv_window_chunks_held", "gauge",
           "Window chunks held by running requests (their windows).", (double)e->window_chunks_held);
    metric(t, "kvchat_kv_window_chunk_bytes", "gauge", "Bytes of a window chunk.",
           (double)e->window_chunk_bytes);
    metric(t, "kvchat_kv_bytes_held", "gauge",
           "Bytes the cached K/V take: blocks used and window chunks in use.", (double)e->kv_bytes_held);
    metric(t, "kvchat_snapshots", "gauge", "Recurrent-state snapshots held in RAM.",
           (double)e->snapshots);
    metric(t, "kvchat_snapshot_bytes_held", "gauge",
           "Bytes the snapshots' pool blocks take (within kvchat_kv_bytes_held).",
           (double)e->snapshot_blocks * (double)e->block_bytes);
    metric(t, "kvchat_snapshot_payload_bytes", "gauge",
           "Bytes of the snapshots' states and logits.", (double)e->snapshot_bytes);
    metric(t, "kvchat_snapshots_taken_total", "counter", "Snapshots taken.",
           (double)e->snapshots_taken);
    metric(t, "kvchat_snapshots_restored_total", "counter",
           "Sequences continued from a snapshot.", (double)e->snapshots_restored);
    metric(t, "kvchat_snapshots_evicted_total", "counter", "Snapshots evicted or dropped.",
           (double)e->snapshots_evicted);
    metric(t, "kvchat_snapshots_written_total", "counter", "Snapshots written to the tiers.",
           (double)e->snapshots_written);
    metric(t, "kvchat_snapshots_fetched_total", "counter", "Snapshots read back from the tiers.",
           (double)e->snapshots_fetched);
    metric(t, "kvchat_live_states", "gauge", "Sequences holding recurrent states.",
           (double)e->live_states);
    metric(t, "kvchat_live_state_bytes", "gauge", "Bytes the live recurrent states take.",
           (double)e->live_state_bytes);
    metric(t, "kvchat_sessions", "gauge", "Keyed sessions held.", (double)e->sessions);
    metric(t, "kvchat_queue_depth", "gauge", "Requests waiting for the engine.",
           (double)e->queue_depth);
    metric(t, "kvchat_requests_running", "gauge", "Requests being computed.",
           (double)e->running);
    metric(t, "kvchat_background_pending", "gauge",
           "Finished replies whose canonical continuation is still to be computed.",
           (double)e->bg_pending);
    metric(t, "kvchat_background_jobs_total", "counter",
           "Finished replies canonicalized (computed, or nothing to compute).",
           (double)e->bg_jobs);
    metric(t, "kvchat_background_tokens_total", "counter",
           "Tokens computed in the background (canonical continuations).", (double)e->bg_tokens);
    metric(t, "kvchat_background_seconds_total", "counter",
           "Engine time spent on background work.", (double)e->bg_us / 1e6);
    metric(t, "kvchat_grammar_masks_total", "counter",
           "Token masks computed for constrained decoding (response_format, forced tool calls).",
           (double)e->grammar_masks);
    metric(t, "kvchat_grammar_mask_seconds_total", "counter",
           "Time spent computing token masks.", (double)e->grammar_mask_us / 1e6);
    metric(t, "kvchat_engine_busy_seconds_total", "counter",
           "Engine time spent in forward passes (requests and background).",
           (double)e->busy_us / 1e6);
}

/* The tiers (DESIGN.md §5): tokens by tier, the disk's traffic and use. */
static void put_tiers(text *t, const kvc_engine_metrics *e)
{
    const char *n = "kvchat_cached_tokens_by_tier_total";
    put(t, "# HELP %s Cached prompt tokens by the tier they came from.\n# TYPE %s counter\n",
        n, n);
    put(t, "%s{tier=\"ram\"} %llu\n%s{tier=\"disk\"} %llu\n", n,
        (unsigned long long)(e->cached_tokens - e->disk_tokens), n,
        (unsigned long long)e->disk_tokens);
    metric(t, "kvchat_kv_room_refused_total", "counter",
           "Asks for KV room that eviction could not meet (nothing was evicted).",
           (double)e->room_refused);
    metric(t, "kvchat_preemptions_total", "counter",
           "Running requests that gave their KV blocks back mid-reply and resumed later.",
           (double)e->preemptions);
    metric(t, "kvchat_disk_blocks_read_total", "counter", "KV blocks read from the disk tier.",
           (double)e->disk_blocks_read);
    metric(t, "kvchat_disk_blocks_written_total", "counter", "KV blocks written to disk.",
           (double)e->disk_blocks_written);
    metric(t, "kvchat_disk_read_bytes_total", "counter", "Bytes read from the disk tier.",
           (double)e->disk_bytes_read);
    metric(t, "kvchat_disk_written_bytes_total", "counter", "Bytes written to the disk tier.",
           (double)e->disk_bytes_written);
    metric(t, "kvchat_disk_blocks", "gauge", "KV blocks held on disk.", (double)e->disk_blocks);
    metric(t, "kvchat_disk_used_bytes", "gauge", "Disk tier size in bytes.",
           (double)e->disk_bytes_used);
    metric(t, "kvchat_disk_budget_bytes", "gauge", "Disk tier budget in bytes.",
           (double)e->disk_bytes_budget);
    metric(t, "kvchat_disk_checksum_failures_total", "counter",
           "Disk blocks found corrupt: discarded and recomputed, never used.",
           (double)e->disk_checksum_failures);
    metric(t, "kvchat_tier_writes_pending", "gauge",
           "KV blocks queued to be written down (disk, Redis), not yet written.",
           (double)e->tier_writes_pending);
    metric(t, "kvchat_disk_writes_dropped_total", "counter",
           "Write-throughs dropped because the disk writer was behind.",
           (double)e->disk_writes_dropped);
    metric(t, "kvchat_tier_write_failures_total", "counter",
           "KV blocks the tiers below RAM could not write (the medium failed).",
           (double)e->tier_write_failures);
    metric(t, "kvchat_tier_fetch_failures_total", "counter",
           "KV blocks listed below RAM that could not be read back (recomputed).",
           (double)e->tier_fetch_failures);
    metric(t, "kvchat_disk_full_total", "counter",
           "Disk tier writes that found the disk full; the budget was lowered to what fits.",
           (double)e->disk_full_events);
}

/* The shared tier in Redis (issue 14). */
static void put_redis(text *t, const kvc_engine_metrics *e)
{
    metric(t, "kvchat_redis_up", "gauge", "1 while the Redis tier is connected.",
           (double)e->redis_up);
    metric(t, "kvchat_redis_tokens_total", "counter",
           "Cached tokens served from the Redis tier (verified blocks x block size).",
           (double)e->redis_blocks_read * (double)e->block_tokens);
    metric(t, "kvchat_redis_blocks_read_total", "counter", "KV blocks read from Redis.",
           (double)e->redis_blocks_read);
    metric(t, "kvchat_redis_blocks_written_total", "counter", "KV blocks written to Redis.",
           (double)e->redis_blocks_written);
    metric(t, "kvchat_redis_read_bytes_total", "counter", "Bytes read from Redis.",
           (double)e->redis_bytes_read);
    metric(t, "kvchat_redis_written_bytes_total", "counter", "Bytes written to Redis.",
           (double)e->redis_bytes_written);
    metric(t, "kvchat_redis_round_trips_total", "counter",
           "Commands or pipelines sent to Redis.", (double)e->redis_round_trips);
    metric(t, "kvchat_redis_failures_total", "counter",
           "Redis calls that failed (down, timed out, garbage): served without the tier.",
           (double)e->redis_failures);
    metric(t, "kvchat_redis_checksum_failures_total", "counter",
           "Redis values found corrupt: deleted and recomputed, never used.",
           (double)e->redis_checksum_failures);
}

char *srv_metrics_text(srv_metrics *m, const kvc_engine_metrics *e)
{
    text t = { 0 };
    pthread_mutex_lock(&m->mu);
    counters c = m->c;
    pthread_mutex_unlock(&m->mu);
    metric(&t, "kvchat_requests_total", "counter", "Completion requests received.",
           (double)c.requests);
    metric(&t, "kvchat_requests_failed_total", "counter",
           "Completion requests answered with an error.", (double)c.failed);
    metric(&t, "kvchat_connections_open", "gauge", "HTTP connections open.",
           (double)c.conn_open);
    metric(&t, "kvchat_connections_dropped_total", "counter",
           "Connections closed because their request did not arrive within the deadline.",
           (double)c.conn_dropped);
    if (e) {
        put_engine(&t, e);
        put_tiers(&t, e);
        put_redis(&t, e);
    }
    put_histogram(&t, &c);
    put(&t, "# HELP kvchat_decode_tokens_per_second Decode speed: of the last request, "
            "and over all requests.\n# TYPE kvchat_decode_tokens_per_second gauge\n");
    put(&t, "kvchat_decode_tokens_per_second{stat=\"last\"} %.17g\n", c.decode_last);
    put(&t, "kvchat_decode_tokens_per_second{stat=\"avg\"} %.17g\n",
        c.decode_seconds > 0 ? c.decode_tokens / c.decode_seconds : 0.0);
    if (t.oom || !t.s) {
        free(t.s);
        return NULL;
    }
    return t.s;
}
