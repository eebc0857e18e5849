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

/* One metric of one value: its HELP and TYPE lines, then the value. The
 * functions below list theirs as tables of these rows, in output order. */
typedef struct mrow {
    const char *name;
    const char *type;                        /* "counter" or "gauge" */
    const char *help;
    double      v;
} mrow;

#define COUNTER(name, help, v) { name, "counter", help, (double)(v) }
#define GAUGE(name, help, v)   { name, "gauge", help, (double)(v) }

static void put_rows(text *t, const mrow *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", r[i].name, r[i].help, r[i].name,
            r[i].type, r[i].name, r[i].v);
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
    const mrow rows[] = {
        COUNTER("kvchat_prompt_tokens_total", "Prompt tokens of finished requests.",
                e->prompt_tokens),
        COUNTER("kvchat_cached_tokens_total", "Prompt tokens reused from the KV cache.",
                e->cached_tokens),
        COUNTER("kvchat_computed_tokens_total", "Prompt tokens run through the model.",
                e->computed_tokens),
        COUNTER("kvchat_output_tokens_total", "Generated tokens.", e->output_tokens),
        GAUGE("kvchat_cache_hit_ratio", "Cached prompt tokens / prompt tokens.",
              e->prompt_tokens ? (double)e->cached_tokens / (double)e->prompt_tokens : 0.0),
        GAUGE("kvchat_kv_blocks_total", "KV pool size in blocks.", e->blocks_total),
        GAUGE("kvchat_kv_blocks_used", "KV blocks holding tokens.", e->blocks_used),
        GAUGE("kvchat_kv_blocks_free", "KV blocks free.", e->blocks_free),
        COUNTER("kvchat_kv_blocks_evicted_total", "KV blocks evicted (LRU).",
                e->blocks_evicted),
        GAUGE("kvchat_kv_block_tokens", "Tokens per KV block.", e->block_tokens),
        GAUGE("kvchat_kv_block_bytes",
              "Bytes of a KV block (every layer but the sliding-window ones).",
              e->block_bytes),
        GAUGE("kvchat_kv_window_chunks_total",
              "Window chunks of the sliding-window layers (a block's positions, every such layer).",
              e->window_chunks_total),
        GAUGE("kvchat_kv_window_chunks_held",
              "Window chunks held by running requests (their windows).",
              e->window_chunks_held),
        GAUGE("kvchat_kv_window_chunk_bytes", "Bytes of a window chunk.",
              e->window_chunk_bytes),
        GAUGE("kvchat_kv_bytes_held",
              "Bytes the cached K/V take: blocks used and window chunks in use.",
              e->kv_bytes_held),
        GAUGE("kvchat_snapshots", "Recurrent-state snapshots held in RAM.", e->snapshots),
        GAUGE("kvchat_snapshot_bytes_held",
              "Bytes the snapshots' pool blocks take (within kvchat_kv_bytes_held).",
              (double)e->snapshot_blocks * (double)e->block_bytes),
        GAUGE("kvchat_snapshot_payload_bytes", "Bytes of the snapshots' states and logits.",
              e->snapshot_bytes),
        COUNTER("kvchat_snapshots_taken_total", "Snapshots taken.", e->snapshots_taken),
        COUNTER("kvchat_snapshots_restored_total", "Sequences continued from a snapshot.",
                e->snapshots_restored),
        COUNTER("kvchat_snapshots_evicted_total", "Snapshots evicted or dropped.",
                e->snapshots_evicted),
        COUNTER("kvchat_snapshots_written_total", "Snapshots written to the tiers.",
                e->snapshots_written),
        COUNTER("kvchat_snapshots_fetched_total", "Snapshots read back from the tiers.",
                e->snapshots_fetched),
        GAUGE("kvchat_live_states", "Sequences holding recurrent states.", e->live_states),
        GAUGE("kvchat_live_state_bytes", "Bytes the live recurrent states take.",
              e->live_state_bytes),
        GAUGE("kvchat_sessions", "Keyed sessions held.", e->sessions),
        GAUGE("kvchat_queue_depth", "Requests waiting for the engine.", e->queue_depth),
        GAUGE("kvchat_requests_running", "Requests being computed.", e->running),
        GAUGE("kvchat_background_pending",
              "Finished replies whose canonical continuation is still to be computed.",
              e->bg_pending),
        COUNTER("kvchat_background_jobs_total",
                "Finished replies canonicalized (computed, or nothing to compute).",
                e->bg_jobs),
        COUNTER("kvchat_background_tokens_total",
                "Tokens computed in the background (canonical continuations).",
                e->bg_tokens),
        COUNTER("kvchat_background_seconds_total", "Engine time spent on background work.",
                (double)e->bg_us / 1e6),
        COUNTER("kvchat_grammar_masks_total",
                "Token masks computed for constrained decoding (response_format, forced tool calls).",
                e->grammar_masks),
        COUNTER("kvchat_grammar_mask_seconds_total", "Time spent computing token masks.",
                (double)e->grammar_mask_us / 1e6),
        COUNTER("kvchat_engine_busy_seconds_total",
                "Engine time spent in forward passes (requests and background).",
                (double)e->busy_us / 1e6),
    };
    put_rows(t, rows, KVC_ARRAY_LEN(rows));
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
    const mrow rows[] = {
        COUNTER("kvchat_kv_room_refused_total",
                "Asks for KV room that eviction could not meet (nothing was evicted).",
                e->room_refused),
        COUNTER("kvchat_preemptions_total",
                "Running requests that gave their KV blocks back mid-reply and resumed later.",
                e->preemptions),
        COUNTER("kvchat_disk_blocks_read_total", "KV blocks read from the disk tier.",
                e->disk_blocks_read),
        COUNTER("kvchat_disk_blocks_written_total", "KV blocks written to disk.",
                e->disk_blocks_written),
        COUNTER("kvchat_disk_read_bytes_total", "Bytes read from the disk tier.",
                e->disk_bytes_read),
        COUNTER("kvchat_disk_written_bytes_total", "Bytes written to the disk tier.",
                e->disk_bytes_written),
        GAUGE("kvchat_disk_blocks", "KV blocks held on disk.", e->disk_blocks),
        GAUGE("kvchat_disk_used_bytes", "Disk tier size in bytes.", e->disk_bytes_used),
        GAUGE("kvchat_disk_budget_bytes", "Disk tier budget in bytes.",
              e->disk_bytes_budget),
        COUNTER("kvchat_disk_checksum_failures_total",
                "Disk blocks found corrupt: discarded and recomputed, never used.",
                e->disk_checksum_failures),
        GAUGE("kvchat_tier_writes_pending",
              "KV blocks queued to be written down (disk, Redis), not yet written.",
              e->tier_writes_pending),
        COUNTER("kvchat_disk_writes_dropped_total",
                "Write-throughs dropped because the disk writer was behind.",
                e->disk_writes_dropped),
        COUNTER("kvchat_tier_write_failures_total",
                "KV blocks the tiers below RAM could not write (the medium failed).",
                e->tier_write_failures),
        COUNTER("kvchat_tier_fetch_failures_total",
                "KV blocks listed below RAM that could not be read back (recomputed).",
                e->tier_fetch_failures),
        COUNTER("kvchat_disk_full_total",
                "Disk tier writes that found the disk full; the budget was lowered to what fits.",
                e->disk_full_events),
        COUNTER("kvchat_tier_window_chunks_written_total",
                "Window chunks (the sliding-window layers' K/V of a block) written below RAM.",
                e->window_chunks_written),
        COUNTER("kvchat_tier_window_written_bytes_total", "Bytes of window chunks written below RAM.",
                e->window_bytes_written),
        COUNTER("kvchat_tier_window_chunks_fetched_total",
                "Window chunks read back from below RAM (with their block, or into a block in RAM).",
                e->window_chunks_fetched),
        COUNTER("kvchat_tier_window_read_bytes_total", "Bytes of window chunks read back from below RAM.",
                e->window_bytes_read),
        COUNTER("kvchat_tier_window_chunks_missed_total",
                "Window chunks a hit needed that neither RAM nor the tiers below could give "
                "(missing, corrupt): their window was computed again.",
                e->window_chunks_missed),
    };
    put_rows(t, rows, KVC_ARRAY_LEN(rows));
}

/* The shared tier in Redis (issue 14). */
static void put_redis(text *t, const kvc_engine_metrics *e)
{
    const mrow rows[] = {
        GAUGE("kvchat_redis_up", "1 while the Redis tier is connected.", e->redis_up),
        COUNTER("kvchat_redis_tokens_total",
                "Cached tokens served from the Redis tier (verified blocks x block size).",
                (double)e->redis_blocks_read * e->block_tokens),
        COUNTER("kvchat_redis_blocks_read_total", "KV blocks read from Redis.",
                e->redis_blocks_read),
        COUNTER("kvchat_redis_blocks_written_total", "KV blocks written to Redis.",
                e->redis_blocks_written),
        COUNTER("kvchat_redis_read_bytes_total", "Bytes read from Redis.",
                e->redis_bytes_read),
        COUNTER("kvchat_redis_written_bytes_total", "Bytes written to Redis.",
                e->redis_bytes_written),
        COUNTER("kvchat_redis_round_trips_total", "Commands or pipelines sent to Redis.",
                e->redis_round_trips),
        COUNTER("kvchat_redis_failures_total",
                "Redis calls that failed (down, timed out, garbage): served without the tier.",
                e->redis_failures),
        COUNTER("kvchat_redis_checksum_failures_total",
                "Redis values found corrupt: deleted and recomputed, never used.",
                e->redis_checksum_failures),
    };
    put_rows(t, rows, KVC_ARRAY_LEN(rows));
}

char *srv_metrics_text(srv_metrics *m, const kvc_engine_metrics *e)
{
    text t = { 0 };
    pthread_mutex_lock(&m->mu);
    counters c = m->c;
    pthread_mutex_unlock(&m->mu);
    const mrow rows[] = {
        COUNTER("kvchat_requests_total", "Completion requests received.", c.requests),
        COUNTER("kvchat_requests_failed_total", "Completion requests answered with an error.",
                c.failed),
        GAUGE("kvchat_connections_open", "HTTP connections open.", c.conn_open),
        COUNTER("kvchat_connections_dropped_total",
                "Connections closed because their request did not arrive within the deadline.",
                c.conn_dropped),
    };
    put_rows(&t, rows, KVC_ARRAY_LEN(rows));
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
