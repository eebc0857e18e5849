/* bench_grammar.c - the cost of a token mask per generated token, on real
 * vocabularies. Not a test.
 *
 * For each vocabulary and schema, random walks over the allowed tokens (as
 * test_grammar_schema does: random tokens for a while, then towards the end)
 * call kvc_gmatch_mask once per token; printed: the vocabulary's size and
 * trie, the mean / median / max mask time per token, and the trie nodes tried
 * per mask. Times are CPU time of this thread, so other load on the machine
 * skews them less. The "string" schema is the worst case: inside a free string
 * almost every token is allowed, so the walk visits most of the trie.
 *
 * Build: `cmake -DKVC_BENCH=ON` makes build/bench_grammar; by hand, from the repo root:
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc -Isrc/grammar -Isrc/tokenizer -Isrc/gguf \
 *       -Isrc/model bench/bench_grammar.c build/libkvchat.a -lcjson -lpcre2-8 -lxxhash \
 *       -lmicrohttpd -lhiredis -lm -lpthread -o bench_grammar
 * Run: ./bench_grammar [-s SCHEMA] [-w WALKS] [-t TOKENS] [-p PREFIX] VOCAB.gguf|PRESET ...
 * (a preset is generated, vocabulary only; -s runs one schema by name, -w
 * and -t set the walks and the tokens per walk, 5 and 400 by default; -p feeds text before each walk, e.g. '{"a":"' to start
 * inside anyof50's first string, where all 50 objects are still candidates) */
#include "gguf.h"
#include "grammar.h"
#include "model_gen.h"
#include "tokenizer.h"
#include "../tests/schema_cases.h"   /* anyof_schema, as the grammar tests have it */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static struct { const char *name, *schema; } schemas[] = {
    { "object", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]}}},\"required\":[\"name\",\"age\",\"tags\"]}" },
    { "json_object", "{\"type\":\"object\"}" },
    { "string", "{\"type\":\"string\"}" },
    /* issue 30's reproducers: an ambiguous anyOf (filled in by main) and a
     * repeated group whose items may be empty */
    { "anyof50", NULL },
    { "anyof150", NULL },
    { "pattern", "{\"type\":\"string\",\"pattern\":\"^([a-z]+,?\\\\s?){1,50}$\"}" },
};

static const char *only;          /* -s: one schema by name */
static int n_walks = 5, n_steps = 400;   /* -w, -t */
static const char *prefix = "";   /* -p: text each walk starts after */

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static kvc_tokenizer *load(const char *what)
{
    kvc_err err = { 0 };
    gguf_file *f = NULL;
    kvc_tokenizer *t = NULL;
    kvc_gen_params p;
    if (kvc_gen_preset(what, &p) == KVC_OK)
        kvc_gen_tokenizer(what, &t, &err);
    else if (gguf_open(what, &f, &err) == KVC_OK)
        kvc_tokenizer_load(f, &t, &err);
    if (!t)
        fprintf(stderr, "%s: %s\n", what, err.msg);
    gguf_close(f);
    return t;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The next token of a walk: random among the allowed while step < wander,
 * else the one-byte token after which the grammar can end soonest (EOG
 * first). */
static int32_t pick(kvc_gmatch *m, const kvc_tokenizer *t, const uint32_t *mask, int32_t allowed, int step)
{
    int32_t n = kvc_tokenizer_n_vocab(t), best = -1, best_len = INT32_MAX;
    if (step < 60) {
        int32_t k = (int32_t)rnd((uint32_t)allowed);
        for (int32_t id = 0; id < n; id++)
            if (kvc_mask_test(mask, id) && k-- == 0)
                return id;
    }
    char piece[8];
    for (int32_t id = 0; id < n; id++) {
        if (!kvc_mask_test(mask, id))
            continue;
        if (kvc_tokenizer_is_eog(t, id))
            return id;
        if (kvc_token_to_piece(t, id, false, piece, sizeof(piece)) != 1 || kvc_gmatch_accept_token(m, id) != KVC_OK)
            continue;
        int32_t len = kvc_gmatch_min_remaining(m);
        kvc_gmatch_rollback(m, 1);
        if (len < best_len)
            best = id, best_len = len;
    }
    return best;
}

static void bench(const char *what)
{
    kvc_tokenizer *t = load(what);
    if (!t)
        return;
    kvc_gvocab *v = NULL;
    kvc_err err = { 0 };
    int64_t t0 = cpu_us();
    if (kvc_gvocab_new(t, &v, &err) != KVC_OK) {
        fprintf(stderr, "%s: %s\n", what, err.msg);
        kvc_tokenizer_free(t);
        return;
    }
    int32_t n = kvc_tokenizer_n_vocab(t);
    printf("%s: n_vocab %d, trie %d nodes, built in %.1f ms\n", what, n, kvc_gvocab_n_nodes(v),
           (cpu_us() - t0) / 1000.0);
    uint32_t *mask = malloc(kvc_mask_words(n) * sizeof(*mask));
    int64_t *times = malloc(100000 * sizeof(*times));
    for (size_t s = 0; s < sizeof(schemas) / sizeof(schemas[0]); s++) {
        if (only && strcmp(only, schemas[s].name) != 0)
            continue;
        kvc_grammar *g = NULL;
        if (kvc_grammar_from_schema(schemas[s].schema, strlen(schemas[s].schema), &g, &err) != KVC_OK) {
            fprintf(stderr, "%s\n", err.msg);
            continue;
        }
        int n_times = 0;
        int64_t visited = 0;
        for (int w = 0; w < n_walks; w++) {
            kvc_gmatch *m = kvc_gmatch_new(g, v);
            if (kvc_gmatch_accept_bytes(m, prefix, strlen(prefix)) != KVC_OK) {
                fprintf(stderr, "%s: the grammar refuses the prefix\n", schemas[s].name);
                kvc_gmatch_free(m);
                break;
            }
            for (int step = 0; step < n_steps && !kvc_gmatch_is_done(m) && n_times < 100000; step++) {
                int64_t a = cpu_us();
                int32_t allowed = kvc_gmatch_mask(m, mask);
                times[n_times++] = cpu_us() - a;
                if (allowed <= 0 || kvc_gmatch_accept_token(m, pick(m, t, mask, allowed, step)) != KVC_OK)
                    break;
            }
            visited += kvc_gmatch_get_stats(m).nodes_visited;
            kvc_gmatch_free(m);
        }
        if (!n_times)
            continue;
        int64_t sum = 0;
        for (int i = 0; i < n_times; i++)
            sum += times[i];
        qsort(times, (size_t)n_times, sizeof(*times), cmp_i64);
        printf("  %-12s %5d masks  mean %8.1f us  median %8.1f us  max %8.1f us  %8.0f nodes/mask\n",
               schemas[s].name, n_times, (double)sum / n_times, (double)times[n_times / 2],
               (double)times[n_times - 1], (double)visited / n_times);
        kvc_grammar_free(g);
    }
    free(times);
    free(mask);
    kvc_gvocab_free(v);
    kvc_tokenizer_free(t);
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2) {
        if (strcmp(argv[i], "-s") == 0)
            only = argv[i + 1];
        else if (strcmp(argv[i], "-w") == 0)
            n_walks = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-p") == 0)
            prefix = argv[i + 1];
        else if (strcmp(argv[i], "-t") == 0)
            n_steps = atoi(argv[i + 1]);
    }
    if (i >= argc) {
        fprintf(stderr, "usage: bench_grammar [-s SCHEMA] [-w WALKS] [-t TOKENS] [-p PREFIX] VOCAB.gguf|PRESET ...\n");
        return 2;
    }
    char *anyof = anyof_schema(50), *anyof150 = anyof_schema(150);
    for (size_t k = 0; k < sizeof(schemas) / sizeof(schemas[0]); k++)
        if (!schemas[k].schema)
            schemas[k].schema = strcmp(schemas[k].name, "anyof50") == 0 ? anyof : anyof150;
    for (; i < argc; i++)
        bench(argv[i]);
    free(anyof);
    free(anyof150);
    return 0;
}
