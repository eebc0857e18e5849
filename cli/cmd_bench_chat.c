/* cmd_bench_chat.c - kvchat bench chat: a conversation growing turn by turn,
 * with the cache and cold (every turn recomputed), TTFT and computed tokens
 * per turn. The user messages are synthetic text of about --turn-tokens
 * tokens; replies are --reply-tokens long (greedy). With --reps N the cached
 * conversation runs N - 1 more times, each on a fresh context, and the last
 * line gives the medians: on a shared machine one run's turn 1 and turn N
 * are single samples seconds apart. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char help[] =
    "usage: kvchat bench chat [-m MODEL.gguf] [--turns N] [--turn-tokens N] [--reply-tokens N] [-t N]\n\n"
    "  --turns N          turns (default 20)\n"
    "  --turn-tokens N    tokens the conversation grows by per turn (default 130)\n"
    "  --reply-tokens N   tokens per reply (default 16)\n"
    "  --reps N           runs of the cached conversation, each on a fresh context (default 3;\n"
    "                     the cold one runs once); the last line gives the median TTFTs\n";

static const char *const words[] = {
    "the", "river", "carried", "small", "boats", "past", "old", "stone", "houses", "while",
    "children", "watched", "from", "bridges", "and", "merchants", "counted", "their", "coins",
    "under", "bright", "summer", "skies", "near", "quiet", "gardens", "full", "of", "roses",
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Run the cached conversation msgs[0 .. 2 turns] again on a fresh context:
 * ttft[t] for each turn t. Each reply must be the first run's (msgs holds it). */
static int rerun(const cli_common *c, kvc_model *m, const kvc_chat_message *msgs, int64_t turns,
                 const kvc_chat_params *p, double *ttft)
{
    char err[512];
    kvc_context *ctx = cli_new_context(c, m, 1);
    kvc_session *s = ctx ? kvc_session_new(ctx, 0, NULL, err, sizeof(err)) : NULL;
    int rc = s ? 0 : 1;
    if (ctx && !s)
        fprintf(stderr, "kvchat bench chat: %s\n", err);
    for (int64_t t = 0; t < turns && !rc; t++) {
        kvc_chat_stats st = { 0 };
        char *reply = NULL;
        if (kvc_session_chat(s, msgs, (size_t)(2 * t + 2), p, NULL, NULL, &reply, &st, err,
                             sizeof(err))) {
            fprintf(stderr, "kvchat bench chat: turn %lld: %s\n", (long long)t + 1, err);
            rc = 1;
        } else if (strcmp(reply, msgs[2 * t + 2].content) != 0) {
            fprintf(stderr, "kvchat bench chat: turn %lld: a rerun replied otherwise\n",
                    (long long)t + 1);
            rc = 1;
        }
        ttft[t] = st.ttft_ms;
        free(reply);
    }
    kvc_session_free(s);
    kvc_context_free(ctx);
    return rc;
}

/* A user message of about n tokens (measured with the model's tokenizer). */
static char *user_message(kvc_model *m, int turn, int n)
{
    size_t cap = 64 + (size_t)n * 16, len = 0;
    char *s = malloc(cap);
    len += (size_t)snprintf(s, cap, "Turn %d: ", turn);
    uint32_t x = 2166136261u ^ (uint32_t)turn;
    int32_t ids[4096];
    while (kvc_model_tokenize(m, s, len, false, false, ids, 4096) < n && len + 20 < cap) {
        x = x * 1664525u + 1013904223u;
        len += (size_t)snprintf(s + len, cap - len, "%s ", words[(x >> 8) % (sizeof(words) / sizeof(words[0]))]);
    }
    s[len - 1] = '.';
    return s;
}

int cmd_bench_chat(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    int64_t turns = 20, turn_tokens = 130, reply_tokens = 16, reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\nOptions:\n%s", help, cli_common_help);
            return 0;
        }
        int r = cli_parse_common(&c, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        int64_t *dst = !strcmp(a, "--turns") ? &turns : !strcmp(a, "--turn-tokens") ? &turn_tokens
                     : !strcmp(a, "--reply-tokens") ? &reply_tokens
                     : !strcmp(a, "--reps") ? &reps : NULL;
        if (!dst)
            return cli_bad_option("bench chat", a);
        if (i + 1 >= argc || !cli_int(a, argv[i + 1], 1, 100000, dst))
            return 2;
        i++;
    }
    if (c.n_ctx == 0)
        c.n_ctx = (int32_t)(turns * (turn_tokens + reply_tokens + 16) + 256);
    kvc_model *m = cli_load_model(&c);
    kvc_context *ctx = m ? cli_new_context(&c, m, 2) : NULL;
    char err[512];
    kvc_session *warm = ctx ? kvc_session_new(ctx, 0, NULL, err, sizeof(err)) : NULL;
    kvc_session *cold = ctx ? kvc_session_new(ctx, 1, NULL, err, sizeof(err)) : NULL;
    if (!warm || !cold) {
        if (ctx)
            fprintf(stderr, "kvchat bench chat: %s\n", err);
        kvc_session_free(warm);
        kvc_session_free(cold);
        kvc_context_free(ctx);
        kvc_model_free(m);
        return 1;
    }
    kvc_chat_message *msgs = calloc((size_t)turns * 2 + 1, sizeof(*msgs));
    char **owned = calloc((size_t)turns * 2 + 1, sizeof(char *));
    size_t n = 0;
    msgs[n++] = (kvc_chat_message){ "system", "You are a helpful assistant." };
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = (int32_t)reply_tokens;
    p.sampling.temperature = 0;
    kvc_chat_params pc = p;
    pc.no_cache = true;
    printf("| turn | prompt tokens | cached | computed | TTFT cached (ms) | computed cold | TTFT cold (ms) | cold / cached |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double last_c = 0;
    /* [rep][turn], then two arrays of [rep] for the medians */
    double *ttft = calloc((size_t)(reps * turns + 2 * reps), sizeof(double));
    int rc = 0;
    if (!ttft) {
        fprintf(stderr, "kvchat bench chat: out of memory\n");
        rc = 1;
    }
    for (int t = 0; t < turns && !rc; t++) {
        owned[n] = user_message(m, t + 1, (int)turn_tokens);
        msgs[n] = (kvc_chat_message){ "user", owned[n] };
        n++;
        kvc_chat_stats sw, sc;
        char *rw = NULL, *rcold = NULL;
        if (kvc_session_chat(warm, msgs, n, &p, NULL, NULL, &rw, &sw, err, sizeof(err)) ||
            kvc_session_chat(cold, msgs, n, &pc, NULL, NULL, &rcold, &sc, err, sizeof(err))) {
            fprintf(stderr, "kvchat bench chat: turn %d: %s\n", t + 1, err);
            rc = 1;
            break;
        }
        if (strcmp(rw, rcold) != 0) {
            fprintf(stderr, "kvchat bench chat: turn %d: cached and cold replies differ\n", t + 1);
            rc = 1;
        }
        ttft[t] = sw.ttft_ms;
        last_c = sc.ttft_ms;
        printf("| %d | %d | %d | %d | %.1f | %d | %.1f | %.1fx |\n", t + 1, sw.prompt_tokens,
               sw.cached_tokens, sw.computed_tokens, sw.ttft_ms, sc.computed_tokens, sc.ttft_ms,
               sc.ttft_ms / (sw.ttft_ms > 0 ? sw.ttft_ms : 1e-9));
        fflush(stdout);
        owned[n] = rw;
        msgs[n] = (kvc_chat_message){ "assistant", rw };
        n++;
        free(rcold);
    }
    if (!rc) {
        const double first = ttft[0], last = ttft[turns - 1];
        printf("\nturn %lld TTFT: %.1f ms cached = %.2fx turn 1 (%.1f ms); cold %.1f ms = %.1fx slower than cached\n",
               (long long)turns, last, last / (first > 0 ? first : 1e-9), first, last_c,
               last_c / (last > 0 ? last : 1e-9));
    }
    for (int64_t r = 1; r < reps && !rc; r++)
        rc = rerun(&c, m, msgs, turns, &p, ttft + r * turns);
    if (!rc && reps > 1) {
        double *first = ttft + reps * turns, *lastv = first + reps;   /* [reps] each */
        printf("runs (turn %lld / turn 1):", (long long)turns);
        for (int64_t r = 0; r < reps; r++) {
            first[r] = ttft[r * turns];
            lastv[r] = ttft[r * turns + turns - 1];
            printf(" %.2fx", lastv[r] / (first[r] > 0 ? first[r] : 1e-9));
        }
        double m1 = median(first, (int)reps), mn = median(lastv, (int)reps);
        printf("\nturn %lld TTFT, median of %lld runs: %.1f ms cached = %.2fx turn 1's (%.1f ms)\n",
               (long long)turns, (long long)reps, mn, mn / (m1 > 0 ? m1 : 1e-9), m1);
    }
    free(ttft);
    for (size_t i = 0; i < n; i++)
        free(owned[i]);
    free(owned);
    free(msgs);
    kvc_session_free(warm);
    kvc_session_free(cold);
    kvc_context_free(ctx);
    kvc_model_free(m);
    return rc;
}
