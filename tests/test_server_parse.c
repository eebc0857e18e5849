/* test_server_parse.c - the request parser and the usage it reports, without
 * a model or a socket (issue 30, items 9 and 11).
 *
 *  1. Strings: a \u0000 inside any string (value or member name) is a 400
 *     naming the field, not a silent truncation (two prompt_cache_keys that
 *     differ after a NUL shared a session); invalid UTF-8 likewise; an escaped
 *     backslash before "u0000" is ordinary text.
 *  2. `user` is an end user, not a conversation: two conversations of one
 *     user get different session keys, the turns of one conversation the same;
 *     prompt_cache_key wins; a completion with only `user` has no key.
 *  3. usage with n > 1: the prompt and its cached part once per prompt (the
 *     fewest cached tokens among its choices, with that choice's disk part),
 *     streamed or not. */
#include <cjson/cJSON.h>
#include <string.h>

#include "server.h"
#include "test.h"

static srv_limits limits(void)
{
    srv_limits lim = { 0 };
    lim.max_messages = 64;
    lim.sampling = kvc_sampler_default_params();
    return lim;
}

/* Parse body as kind; the status (0 = accepted), *r filled on success. */
static int parse(const srv_dialect *kind, const char *body, size_t len, srv_request *r, srv_error *e)
{
    srv_limits lim = limits();
    memset(e, 0, sizeof(*e));
    return srv_request_parse(kind, body, len, &lim, r, e);
}

static void expect_400(const srv_dialect *kind, const char *body, size_t len, const char *param,
                       const char *word)
{
    srv_request r;
    srv_error e;
    int st = parse(kind, body, len, &r, &e);
    CHECKF(st == 400, "%.*s: status %d", (int)len, body, st);
    CHECKF(!strcmp(e.param, param), "%.*s: param '%s', wanted '%s'", (int)len, body, e.param,
           param);
    CHECKF(strstr(e.message, word) != NULL, "%.*s: message '%s' lacks '%s'", (int)len, body,
           e.message, word);
    srv_request_free(&r);
}

static void test_strings(void)
{
    const char *b;
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prompt_cache_key\":\"a\\u0000b\"}";
    expect_400(&srv_dialect_chat, b, strlen(b), "prompt_cache_key", "NUL");
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\\u0000 there\"}]}";
    expect_400(&srv_dialect_chat, b, strlen(b), "messages[0].content", "NUL");
    b = "{\"prompt\":\"ok\",\"user\":\"\\u0000\"}";
    expect_400(&srv_dialect_completions, b, strlen(b), "user", "NUL");
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"a\\u0000\":1}]}";
    expect_400(&srv_dialect_chat, b, strlen(b), "messages[0]", "member name");
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xc3\"}]}";   /* cut short */
    expect_400(&srv_dialect_chat, b, strlen(b), "messages[0].content", "UTF-8");
    b = "{\"prompt\":[\"fine\",\"\xed\xa0\x80\"]}";                        /* a surrogate */
    expect_400(&srv_dialect_completions, b, strlen(b), "prompt[1]", "UTF-8");
    b = "{\"prompt\":\"\xc0\x80\"}";                                        /* overlong NUL */
    expect_400(&srv_dialect_completions, b, strlen(b), "prompt", "NUL");

    /* \\u0000 is a backslash and "u0000": text, accepted whole */
    srv_request r;
    srv_error e;
    b = "{\"prompt\":\"a\\\\u0000b \xe2\x82\xac\",\"prompt_cache_key\":\"k\\\\u0000\"}";
    CHECKF(parse(&srv_dialect_completions, b, strlen(b), &r, &e) == 0, "%s: %s", b, e.message);
    CHECKF(r.params.prompt && !strcmp(r.params.prompt, "a\\u0000b \xe2\x82\xac"), "prompt '%s'",
           r.params.prompt ? r.params.prompt : "(null)");
    CHECKF(r.params.session_key && !strcmp(r.params.session_key, "k\\u0000"), "key '%s'",
           r.params.session_key ? r.params.session_key : "(null)");
    srv_request_free(&r);
}

/* The session key of a body (malloc'd copy; NULL = none). */
static char *key_of(const srv_dialect *kind, const char *body)
{
    srv_request r;
    srv_error e;
    int st = parse(kind, body, strlen(body), &r, &e);
    CHECKF(st == 0, "%s: %s", body, e.message);
    char *k = st == 0 && r.params.session_key ? strdup(r.params.session_key) : NULL;
    srv_request_free(&r);
    return k;
}

static bool same(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

static void test_user_keys(void)
{
    char *a1 = key_of(&srv_dialect_chat, "{\"user\":\"u\",\"messages\":[{\"role\":\"system\",\"content\":"
                      "\"S\"},{\"role\":\"user\",\"content\":\"plan a trip\"}]}");
    char *a2 = key_of(&srv_dialect_chat, "{\"user\":\"u\",\"messages\":[{\"role\":\"system\",\"content\":"
                      "\"S\"},{\"role\":\"user\",\"content\":\"plan a trip\"},{\"role\":"
                      "\"assistant\",\"content\":\"where to?\"},{\"role\":\"user\",\"content\":"
                      "\"Rome\"}]}");
    char *b = key_of(&srv_dialect_chat, "{\"user\":\"u\",\"messages\":[{\"role\":\"system\",\"content\":"
                     "\"S\"},{\"role\":\"user\",\"content\":\"fix my code\"}]}");
    char *c = key_of(&srv_dialect_chat, "{\"user\":\"v\",\"messages\":[{\"role\":\"system\",\"content\":"
                     "\"S\"},{\"role\":\"user\",\"content\":\"plan a trip\"}]}");
    char *k = key_of(&srv_dialect_chat, "{\"user\":\"u\",\"prompt_cache_key\":\"conv-7\",\"messages\":"
                     "[{\"role\":\"user\",\"content\":\"fix my code\"}]}");
    char *p = key_of(&srv_dialect_completions, "{\"user\":\"u\",\"prompt\":\"x\"}");
    CHECKF(a1 && same(a1, a2), "one conversation's turns: '%s' vs '%s'", a1 ? a1 : "",
           a2 ? a2 : "");
    CHECKF(a1 && b && !same(a1, b), "one user's two conversations share key '%s'", a1 ? a1 : "");
    CHECKF(c && !same(a1, c), "two users share key '%s'", c ? c : "");
    CHECKF(same(k, "conv-7"), "prompt_cache_key: '%s'", k ? k : "(null)");
    CHECKF(!p, "a completion with only user is keyed '%s'", p ? p : "");
    free(a1);
    free(a2);
    free(b);
    free(c);
    free(k);
    free(p);
}

/* The usage object's field (under prompt_tokens_details for the cached ones)
 * of a JSON text or SSE event. */
static int usage_field(const char *text, const char *name)
{
    const char *u = strstr(text, "\"usage\":{");
    cJSON *j = u ? cJSON_Parse(u + 8) : NULL;
    cJSON *v = cJSON_GetObjectItem(j, name);
    if (!v)
        v = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "prompt_tokens_details"), name);
    int n = cJSON_IsNumber(v) ? v->valueint : -1;
    cJSON_Delete(j);
    return n;
}

static void check_usage(const kvc_chat_stats *st, int n, int per_prompt, int prompt, int cached,
                        int disk, int completion)
{
    srv_reply_id id = { "chatcmpl-x", 0, "m" };
    kvc_event done[8];
    memset(done, 0, sizeof(done));
    for (int i = 0; i < n; i++) {
        done[i].type = KVC_EVENT_DONE;
        done[i].stats = st[i];
        done[i].text = "";
    }
    srv_reply rp[8];
    for (int i = 0; i < n; i++)
        rp[i] = srv_reply_whole(&done[i], false);
    const srv_dialect *d = &srv_dialect_completions;
    char *whole = d->response(&id, NULL, rp, n, per_prompt, NULL, false);
    srv_buf b = { 0 };
    d->sse_end(&id, true, st, n, per_prompt, &b);
    char *sse = b.p;
    const char *texts[2] = { whole, sse };
    for (int k = 0; k < 2; k++) {
        const char *t = texts[k] ? texts[k] : "";
        CHECKF(usage_field(t, "prompt_tokens") == prompt, "%s: prompt_tokens, wanted %d", t,
               prompt);
        CHECKF(usage_field(t, "cached_tokens") == cached, "%s: cached_tokens, wanted %d", t,
               cached);
        CHECKF(usage_field(t, "cached_disk_tokens") == disk, "%s: cached_disk_tokens, wanted %d",
               t, disk);
        CHECKF(usage_field(t, "completion_tokens") == completion,
               "%s: completion_tokens, wanted %d", t, completion);
    }
    free(whole);
    free(sse);
}

static void test_usage(void)
{
    /* the audit's case: a 67-token prompt cached but for its last token, n 4:
     * every choice found 66 (the sum said 264) */
    kvc_chat_stats st[8];
    for (int i = 0; i < 4; i++)
        st[i] = (kvc_chat_stats){ .prompt_tokens = 67, .cached_tokens = 66,
                                  .cached_disk_tokens = i == 0 ? 0 : 32, .computed_tokens = 1,
                                  .output_tokens = 5 };
    st[0].cached_disk_tokens = 16;
    check_usage(st, 4, 4, 67, 66, 16, 20);
    /* a new prompt: the first choice computed it, the others found it */
    st[0].cached_tokens = 0;
    st[0].cached_disk_tokens = 0;
    check_usage(st, 4, 4, 67, 0, 0, 20);
    /* two prompts, n 2 each: the prompt whose second choice went first */
    for (int i = 0; i < 4; i++)
        st[i] = (kvc_chat_stats){ .prompt_tokens = i < 2 ? 40 : 50,
                                  .cached_tokens = i < 2 ? 32 : 48, .output_tokens = 3 };
    st[1].cached_tokens = 16;
    st[1].cached_disk_tokens = 16;
    st[2].cached_disk_tokens = 48;
    st[3].cached_disk_tokens = 0;
    st[3].cached_tokens = 48;
    check_usage(st, 4, 2, 90, 16 + 48, 16 + 48, 12);
    /* n 1: as it was */
    st[0] = (kvc_chat_stats){ .prompt_tokens = 9, .cached_tokens = 8, .cached_disk_tokens = 8,
                              .output_tokens = 2 };
    check_usage(st, 1, 1, 9, 8, 8, 2);
}

int main(void)
{
    test_strings();
    test_user_keys();
    test_usage();
    return test_done("test_server_parse");
}
