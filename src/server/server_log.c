/* server_log.c - the server's log lines (server.h): one line per finished
 * request, as nginx, llama-server and vLLM users read them - when, who,
 * what, the status, how long - and for a generation what kvchat is about:
 * prompt tokens, how many came from the cache (and of those from disk), how
 * many were computed, tokens generated, time to first token, decode speed,
 * the session (its key hashed: a key may be a user's name). In text (one
 * line of key=value figures) or JSON (one object a line, for log shippers).
 *
 * The lines are made here; the server hands them to its log callback (the
 * CLI writes them to stderr). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common.h"
#include "server.h"

srv_reqlog *srv_reqlog_new(const char *method, const char *path, const char *client)
{
    srv_reqlog *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    clock_gettime(CLOCK_MONOTONIC, &l->start);
    clock_gettime(CLOCK_REALTIME, &l->wall);
    snprintf(l->method, sizeof(l->method), "%s", method ? method : "?");
    snprintf(l->path, sizeof(l->path), "%s", path ? path : "?");
    snprintf(l->client, sizeof(l->client), "%s", client && *client ? client : "-");
    return l;
}

void srv_reqlog_session(srv_reqlog *l, const char *key)
{
    if (!l)
        return;
    l->session[0] = 0;
    if (key && *key)
        snprintf(l->session, sizeof(l->session), "%016llx",
                 (unsigned long long)XXH3_64bits(key, strlen(key)));
}

void srv_reqlog_error(srv_reqlog *l, const srv_error *e)
{
    if (!l || !e->http_status)
        return;
    l->status = e->http_status;
    snprintf(l->error, sizeof(l->error), "%s", e->message);
}

bool srv_reqlog_wanted(const srv_reqlog *l, int policy)
{
    if (policy == KVC_SERVER_LOG_NONE)
        return false;
    if (policy == KVC_SERVER_LOG_ERRORS)
        return l->status >= 500 || (l->has_stats && l->error[0]);
    bool polled = !strcmp(l->path, "/health") || !strcmp(l->path, "/metrics");
    return !(polled && l->status < 400);   /* probes would drown the rest */
}

/* "2026-01-02T03:04:05.678Z" of t. */
static void iso_time(const struct timespec *t, char *buf, size_t size)
{
    struct tm tm;
    time_t s = t->tv_sec;
    gmtime_r(&s, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, size - n, ".%03ldZ", t->tv_nsec / 1000000);
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* x rounded to `digits` decimals (JSON numbers a person reads). */
static double rounded(double x, int digits)
{
    double f = 1;
    while (digits-- > 0)
        f *= 10;
    return (double)(int64_t)(x * f + (x < 0 ? -0.5 : 0.5)) / f;
}

static char *json_line(const srv_reqlog *l, const char *time, double ms)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "time", time);
    cJSON_AddStringToObject(o, "level", l->status >= 500 || (l->has_stats && l->error[0])
                                        ? "error" : l->status >= 400 ? "warning" : "info");
    cJSON_AddStringToObject(o, "client", l->client);
    cJSON_AddStringToObject(o, "method", l->method);
    cJSON_AddStringToObject(o, "path", l->path);
    cJSON_AddNumberToObject(o, "status", l->status);
    cJSON_AddNumberToObject(o, "duration_ms", rounded(ms, 3));
    if (l->api[0])
        cJSON_AddStringToObject(o, "api", l->api);
    if (l->has_stats) {
        const kvc_chat_stats *st = &l->stats;
        cJSON_AddNumberToObject(o, "prompt_tokens", st->prompt_tokens);
        cJSON_AddNumberToObject(o, "cached_tokens", st->cached_tokens);
        cJSON_AddNumberToObject(o, "cached_disk_tokens", st->cached_disk_tokens);
        cJSON_AddNumberToObject(o, "computed_tokens", st->computed_tokens);
        cJSON_AddNumberToObject(o, "output_tokens", st->output_tokens);
        cJSON_AddNumberToObject(o, "ttft_ms", rounded(st->ttft_ms, 3));
        cJSON_AddNumberToObject(o, "tokens_per_second", rounded(st->decode_tps, 2));
        if (st->finish_reason)
            cJSON_AddStringToObject(o, "finish_reason", st->finish_reason);
    }
    if (l->session[0])
        cJSON_AddStringToObject(o, "session", l->session);
    if (l->error[0])
        cJSON_AddStringToObject(o, "error", l->error);
    return srv_json_print(o);
}

#define LINE_MAX_BYTES 2048   /* a text line: the fixed parts and an error (escaped) */

char *srv_reqlog_line(const srv_reqlog *l, int format)
{
    char time[40];
    iso_time(&l->wall, time, sizeof(time));
    double ms = ms_since(&l->start);
    if (format == KVC_SERVER_LOG_JSON)
        return json_line(l, time, ms);
    char *s = malloc(LINE_MAX_BYTES);
    if (!s)
        return NULL;
    size_t n = (size_t)snprintf(s, LINE_MAX_BYTES, "%s %s %s %s %d %.1fms", time, l->client,
                                l->method, l->path, l->status, ms);
    const kvc_chat_stats *st = &l->stats;
    if (l->has_stats && n < LINE_MAX_BYTES)
        n += (size_t)snprintf(s + n, LINE_MAX_BYTES - n,
                              " prompt=%d cached=%d disk=%d computed=%d gen=%d ttft=%.1fms "
                              "%.1ftok/s finish=%s", st->prompt_tokens, st->cached_tokens,
                              st->cached_disk_tokens, st->computed_tokens, st->output_tokens,
                              st->ttft_ms, st->decode_tps,
                              st->finish_reason ? st->finish_reason : "-");
    if (l->session[0] && n < LINE_MAX_BYTES)
        n += (size_t)snprintf(s + n, LINE_MAX_BYTES - n, " session=%s", l->session);
    if (l->api[0] && n < LINE_MAX_BYTES)
        n += (size_t)snprintf(s + n, LINE_MAX_BYTES - n, " api=%s", l->api);
    if (l->error[0] && n < LINE_MAX_BYTES) {
        cJSON *msg = cJSON_CreateString(l->error);    /* quoted and escaped: one line */
        char *q = msg ? cJSON_PrintUnformatted(msg) : NULL;
        snprintf(s + n, LINE_MAX_BYTES - n, " error=%s", q ? q : "\"?\"");
        free(q);
        cJSON_Delete(msg);
    }
    return s;
}

char *srv_log_notice(const char *level, const char *message, int format)
{
    struct timespec now;
    char time[40];
    clock_gettime(CLOCK_REALTIME, &now);
    iso_time(&now, time, sizeof(time));
    if (format == KVC_SERVER_LOG_JSON) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "time", time);
        cJSON_AddStringToObject(o, "level", level);
        cJSON_AddStringToObject(o, "message", message);
        return srv_json_print(o);
    }
    size_t n = strlen(message) + 64;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "kvchat: %s", message);
    return s;
}
