/* test_tenants.c - cache namespaces close the prefix cache's side channel.
 *
 * The attack: one client sends "my PIN is 8352"; another guesses the digits
 * one at a time, each guess with a fresh prompt_cache_key, and reads
 * cached_tokens (or the reply time): a guess that extends the cached prefix
 * is a hit. With a cache namespace per API key (the default with several
 * keys) or per cache_salt, a guess from another namespace finds nothing:
 * cached_tokens is 0 for every guess, and no guess stands out. Within one
 * namespace sharing still works. Over HTTP against a `kvchat serve` process
 * with two API keys (and a third server sharing the cache across keys, where
 * the leak is still there: the test can fail).
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include "test.h"

#include "common.h"
#include "http_client.h"

#include <cjson/cJSON.h>

static const char *bin;

typedef struct answer {
    int    status;
    int    prompt, cached;
    double ms;
} answer;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One chat request: system + user text, a session key, a bearer key and a
 * cache_salt (either may be NULL). */
static answer ask(int port, const char *key, const char *salt, const char *session,
                  const char *text)
{
    cJSON *b = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(b, "messages");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", text);
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddNumberToObject(b, "max_tokens", 1);
    cJSON_AddNumberToObject(b, "temperature", 0);
    cJSON_AddStringToObject(b, "prompt_cache_key", session);
    if (salt)
        cJSON_AddStringToObject(b, "cache_salt", salt);
    char *body = cJSON_PrintUnformatted(b), auth[256] = "";
    if (key)
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", key);
    double t0 = now_ms();
    http_resp r = http_request_ex(port, "POST", "/v1/chat/completions", auth, body, 30);
    answer a = { .status = r.status, .ms = now_ms() - t0 };
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    a.prompt = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens"));
    a.cached = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(
        cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"));
    cJSON_Delete(j);
    http_resp_free(&r);
    free(body);
    cJSON_Delete(b);
    return a;
}

static const char SECRET[] =
    "Please remember this for me, it is private and nobody else may learn it. The account "
    "belongs to Alice Example, born in a small town by the sea, and my PIN is 8352";

/* The attacker's best guess at the first PIN digit: the one guess with more
 * cached tokens than all others (-1 when none stands out). First requests
 * with a letter in place of the digit cache the attacker's own prefix, so
 * that his guesses differ only by what others left in his namespace. The
 * warm-up's last, part-filled block reaches other sessions (as a tail in the
 * tiers) some time after its reply, not at once: the warm-up repeats, with
 * fresh sessions, until one finds its whole prompt but the last token cached
 * (up to 10 s). Under ASan in CI the tail arrived between two guesses, and
 * the later guesses stood out with the attacker's own prefix. */
static int guess_digit(int port, const char *key, const char *salt, int *cached, double *ms)
{
    char text[sizeof(SECRET) + 8], session[32];
    size_t prefix = strlen(SECRET) - 4;      /* up to "my PIN is " */
    snprintf(text, sizeof(text), "%.*sX", (int)prefix, SECRET);
    for (int i = 0; i < 100; i++) {
        snprintf(session, sizeof(session), "warm-%d-%d", port, i);
        answer w = ask(port, key, salt, session, text);
        if (w.status != 200 || w.cached >= w.prompt - 1)
            break;
        usleep(100 * 1000);
    }
    int best = -1, best_cached = -1, ties = 0;
    for (int d = 0; d < 10; d++) {
        snprintf(text, sizeof(text), "%.*s%d", (int)prefix, SECRET, d);
        snprintf(session, sizeof(session), "guess-%d-%d", port, d);
        answer a = ask(port, key, salt, session, text);
        CHECK_EQ_INT(a.status, 200);
        ms[d] = a.ms;
        cached[d] = a.cached;
        if (a.cached > best_cached) {
            best_cached = a.cached;
            best = d;
            ties = 0;
        } else if (a.cached == best_cached)
            ties++;
    }
    return ties ? -1 : best;
}

static void print_guesses(const char *what, int d, const int *cached, const double *ms)
{
    printf("  %s: best guess %d; cached tokens per digit:", what, d);
    for (int i = 0; i < 10; i++)
        printf(" %d", cached[i]);
    printf("; ms:");
    for (int i = 0; i < 10; i++)
        printf(" %.1f", ms[i]);
    printf("\n");
}

/* A server; its model made in dir. */
static bool start(http_server *s, const char *model, const char *const *extra)
{
    const char *args[16] = { "-m", model, "-t", "1", "--cache-disk", "0" };
    int n = 6;
    for (int i = 0; extra && extra[i] && n < 15; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return http_server_start(s, bin, args, 30);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_tenants: skipped ($KVC_BIN not set)\n");
        return TEST_SKIP;
    }
    char dir[] = "/tmp/kvc_tenants_XXXXXX", model[4200], err[512];
    if (!mkdtemp(dir))
        return 1;
    snprintf(model, sizeof(model), "%s/m.gguf", dir);
    kvc_gen_params g;
    kvc_gen_preset("tiny", &g);
    CHECKF(kvc_gen_write(&g, model, err, sizeof(err)) == KVC_OK, "%s", err);

    /* two API keys, each its own namespace */
    const char *const keys[] = { "--api-key", "key-alice", "--api-key", "key-bob", NULL };
    http_server s;
    CHECK(start(&s, model, keys));
    if (s.pid) {
        answer a = ask(s.port, "key-alice", NULL, "alice", SECRET);
        CHECK_EQ_INT(a.status, 200);
        answer again = ask(s.port, "key-alice", NULL, "alice-2", SECRET);
        CHECKF(again.cached > 0, "within one key's namespace sharing works: cached %d",
               again.cached);
        /* the same session key under another API key is another session */
        answer other = ask(s.port, "key-bob", NULL, "alice", SECRET);
        CHECKF(other.cached == 0, "bob's session 'alice' saw %d of alice's tokens", other.cached);
        /* cache_salt: same key, another salt shares nothing; the same salt shares */
        answer salted = ask(s.port, "key-alice", "salt-1", "alice-3", SECRET);
        CHECKF(salted.cached == 0, "another cache_salt found %d cached tokens", salted.cached);
        answer salted2 = ask(s.port, "key-alice", "salt-1", "alice-4", SECRET);
        CHECKF(salted2.cached > 0, "the same cache_salt shares: cached %d", salted2.cached);
        /* the attack from another key, and from another salt of alice's key */
        double ms[10];
        int cached[10];
        int d = guess_digit(s.port, "key-bob", "bob-guesses", cached, ms);
        print_guesses("another API key", d, cached, ms);
        CHECKF(d == -1, "bob's guesses stand out at digit %d", d);
        d = guess_digit(s.port, "key-alice", "other-salt", cached, ms);
        print_guesses("the same key, another cache_salt", d, cached, ms);
        CHECKF(d == -1, "another salt's guesses stand out at digit %d", d);
        http_server_stop(&s);
    }

    /* the leak where the cache is shared on purpose: the same attack reads
     * the digit (so the check above can fail) */
    const char *const shared[] = { "--api-key", "key-alice", "--api-key", "key-bob",
                                   "--share-cache-across-keys", NULL };
    CHECK(start(&s, model, shared));
    if (s.pid) {
        ask(s.port, "key-alice", NULL, "alice", SECRET);
        double ms[10];
        int cached[10];
        int d = guess_digit(s.port, "key-bob", NULL, cached, ms);
        print_guesses("--share-cache-across-keys (the PIN starts with 8)", d, cached, ms);
        CHECKF(d == 8, "with a shared cache the guess should find the digit: %d", d);
        http_server_stop(&s);
    }
    unlink(model);
    rmdir(dir);
    return test_done("test_tenants");
}
