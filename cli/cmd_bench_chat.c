/* cmd_bench_chat.c - kvchat bench chat: a conversation growing turn by turn,
 * with the cache and cold (every turn recomputed), TTFT and computed tokens
 * per turn. The user messages are synthetic text of about --turn-tokens
 * tokens; replies are --reply-tokens long (greedy). With --reps N the cached
 * conversation runs N - 1 more times, each on a fresh context, and the last
 * line gives the medians: on a shared machine one run's turn 1 and turn N
 * are single samples seconds apart. With --pairs N (default 10) turn 1 and
 * turn N are then timed side by side N times, so that both see the same
 * load: turn 1 as a new conversation on a fresh context, turn N as the last
 * user message edited (another message of the same length) in the
 * conversation that holds the rest. The median of the N ratios is the
 * figure least moved by other load on the machine. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char help[] =
    "usage: kvchat bench chat [-m MODEL.gguf] [--turns N] [--turn-tokens N] [--reply-tokens N] [-t N]\n";

enum { OPT_TURNS = CLI_OPT_CMD, OPT_TURN_TOKENS, OPT_REPLY_TOKENS, OPT_REPS, OPT_PAIRS };

static const cli_option bench_chat_opts[] = {
    { "turns", 0, "N", OPT_TURNS, 0, "turns (default 20)" },
    { "turn-tokens", 0, "N", OPT_TURN_TOKENS, 0,
      "tokens the conversation grows by per turn (default 130)" },
    { "reply-tokens", 0, "N", OPT_REPLY_TOKENS, 0, "tokens per reply (default 16)" },
    { "reps", 0, "N", OPT_REPS, 0,
      "runs of the cached conversation, each on a fresh context\n"
      "(default 3; the cold one runs once); a line gives the median TTFTs" },
    { "pairs", 0, "N", OPT_PAIRS, 0,
      "then turn 1 and an edited turn N side by side, N times\n"
      "(default 10; 0 = skip); the last line gives the median ratio" },
    { 0 }
};

static const cli_option *const groups[] = {
    cli_help_opts, cli_model_opts, bench_chat_opts, cli_context_opts, NULL
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

static int n_tokens(kvc_model *m, const char *s)
{
    int32_t ids[4096];
    return kvc_model_tokenize(m, s, strlen(s), false, false, ids, 4096);
}

/* A user message of about n tokens (measured with the model's tokenizer):
 * "<label> <turn>: " and words drawn from seed, ending in a period. With
 * exact, the last word is chosen so that the message has n tokens where a
 * word does, else more. */
static char *user_message(kvc_model *m, const char *label, int turn, uint32_t seed, int n, bool exact)
{
    size_t cap = 64 + (size_t)n * 16, len = 0, last = 0;
    char *s = malloc(cap);
    len += (size_t)snprintf(s, cap, "%s %d: ", label, turn);
    uint32_t x = 2166136261u ^ seed;
    int32_t ids[4096];
    while (kvc_model_tokenize(m, s, len, false, false, ids, 4096) < n && len + 20 < cap) {
        x = x * 1664525u + 1013904223u;
        last = len;
        len += (size_t)snprintf(s + len, cap - len, "%s ", cli_words[(x >> 8) % cli_n_words]);
    }
    s[len - 1] = '.';
    if (exact && last && n_tokens(m, s) != n) {
        /* the last word again from the list: one that gives n tokens, else the first that gives more */
        int pick = -1;
        for (size_t w = 0; w < cli_n_words; w++) {
            snprintf(s + last, cap - last, "%s.", cli_words[w]);
            const int k = n_tokens(m, s);
            if (k == n) {
                pick = (int)w;
                break;
            }
            if (k > n && pick < 0)
                pick = (int)w;
        }
        if (pick >= 0)
            snprintf(s + last, cap - last, "%s.", cli_words[pick]);
    }
    return s;
}

/* TTFT of one request on session s, which must reply; *computed its computed tokens. */
static int ttft_of(kvc_session *s, const kvc_chat_message *msgs, size_t n, const kvc_chat_params *p,
                   double *ttft, int32_t *computed)
{
    char err[512], *reply = NULL;
    kvc_chat_stats st = { 0 };
    if (kvc_session_chat(s, msgs, n, p, NULL, NULL, &reply, &st, err, sizeof(err))) {
        fprintf(stderr, "kvchat bench chat: %s\n", err);
        return 1;
    }
    free(reply);
    *ttft = st.ttft_ms;
    *computed = st.computed_tokens;
    return 0;
}

/* Turn 1 and turn `turns` side by side, `pairs` times (see the top): ratio[i]
 * = turn N / turn 1 of pair i. warm holds the conversation msgs. */
static int paired(const cli_common *c, kvc_model *m, kvc_session *warm, kvc_chat_message *msgs,
                  int64_t turns, const kvc_chat_params *p, int64_t pairs, double *ratio, double *t1, double *tn)
{
    char err[512];
    int rc = 0;
    int32_t c1[2] = { INT32_MAX, 0 }, cn[2] = { INT32_MAX, 0 };   /* computed tokens, least and most */
    const size_t last = (size_t)(2 * turns - 1);   /* turn N's user message */
    const kvc_chat_message keep = msgs[last];
    const int n1 = n_tokens(m, msgs[1].content), nn = n_tokens(m, keep.content);   /* their lengths */
    for (int64_t i = 0; i < pairs && !rc; i++) {
        /* messages as long as the turns' own that no other begins with, so
         * that turn N computes what the conversation's turn N did and turn 1
         * all of its prompt (both printed below) */
        const char *label = cli_words[(size_t)i % cli_n_words];
        char *first = user_message(m, label, 1, 1000u * (uint32_t)(i + 1) + 1, n1, true);
        char *edit = user_message(m, label, (int)turns, 1000u * (uint32_t)(i + 1) + (uint32_t)turns, nn, true);
        kvc_context *ctx = cli_new_context(c, m, 1);
        kvc_session *s = ctx ? kvc_session_new(ctx, 0, NULL, err, sizeof(err)) : NULL;
        if (!s) {
            if (ctx)
                fprintf(stderr, "kvchat bench chat: %s\n", err);
            rc = 1;
        } else {
            const kvc_chat_message one[2] = { msgs[0], { "user", first } };
            int32_t k1 = 0, kn = 0;
            rc = ttft_of(s, one, 2, p, &t1[i], &k1);
            msgs[last] = (kvc_chat_message){ "user", edit };
            rc = rc ? rc : ttft_of(warm, msgs, last + 1, p, &tn[i], &kn);
            msgs[last] = keep;
            ratio[i] = tn[i] / (t1[i] > 0 ? t1[i] : 1e-9);
            c1[0] = KVC_MIN(c1[0], k1);
            c1[1] = KVC_MAX(c1[1], k1);
            cn[0] = KVC_MIN(cn[0], kn);
            cn[1] = KVC_MAX(cn[1], kn);
        }
        kvc_session_free(s);
        kvc_context_free(ctx);
        free(first);
        free(edit);
    }
    if (!rc) {
        char a[32], b[32];   /* "n", or "least-most" where the pairs differ */
        snprintf(a, sizeof(a), c1[0] == c1[1] ? "%d" : "%d-%d", c1[0], c1[1]);
        snprintf(b, sizeof(b), cn[0] == cn[1] ? "%d" : "%d-%d", cn[0], cn[1]);
        printf("side by side, %lld pairs: turn 1 computes %s tokens on a fresh context, turn %lld %s after the "
               "rest of the conversation\n", (long long)pairs, a, (long long)turns, b);
    }
    return rc;
}

int cmd_bench_chat(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    int64_t turns = 20, turn_tokens = 130, reply_tokens = 16, reps = 3, pairs = 10;
    cli_parser ps;
    cli_parser_init(&ps, "bench chat", argc, argv, groups);
    const char *v;
    int id, r;
    while ((id = cli_next_opt(&ps, &v, help)) >= 0) {
        if ((r = cli_common_apply(&c, id, v)) < 0)
            return 2;
        if (r > 0)
            continue;
        int64_t *dst = id == OPT_TURNS ? &turns : id == OPT_TURN_TOKENS ? &turn_tokens
                     : id == OPT_REPLY_TOKENS ? &reply_tokens : id == OPT_REPS ? &reps : &pairs;
        if (!cli_int(cli_opt_name(&ps), v, dst == &pairs ? 0 : 1, 100000, dst))
            return 2;
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    if (cli_no_operands(&ps))
        return 2;
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
    double *ttft = calloc((size_t)(reps * turns + 2 * reps + 3 * pairs), sizeof(double));
    int rc = 0;
    if (!ttft) {
        fprintf(stderr, "kvchat bench chat: out of memory\n");
        rc = 1;
    }
    for (int t = 0; t < turns && !rc; t++) {
        owned[n] = user_message(m, "Turn", t + 1, (uint32_t)t + 1, (int)turn_tokens, false);
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
    if (!rc && pairs > 0) {
        double *ratio = ttft + reps * turns + 2 * reps, *t1 = ratio + pairs, *tn = t1 + pairs;   /* [pairs] each */
        printf("\n");
        rc = paired(&c, m, warm, msgs, turns, &p, pairs, ratio, t1, tn);
        if (!rc) {
            printf("pairs (turn %lld / turn 1):", (long long)turns);
            for (int64_t i = 0; i < pairs; i++)
                printf(" %.2fx", ratio[i]);
            const double mr = median(ratio, (int)pairs), m1 = median(t1, (int)pairs), mn = median(tn, (int)pairs);
            printf("\nturn %lld TTFT side by side, median of %lld pairs: %.2fx turn 1's (median TTFTs: turn %lld "
                   "%.1f ms, turn 1 %.1f ms)\n", (long long)turns, (long long)pairs, mr, (long long)turns, mn, m1);
        }
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
