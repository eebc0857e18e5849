/* fuzz_grammar_cost.c - libFuzzer target for the cost of constrained
 * decoding (issue 30): no schema or grammar may make the matcher's work
 * unbounded, on the engine thread or at admission.
 *
 * Input: fuzz_grammar_input.h's (a mode byte, a schema or grammar text, the
 * bytes that drive a walk over the demo vocabulary, generated once).
 *
 * What is run, as the server and engine run it, with a small budget (BUDGET
 * units per call, so that a run stays fast):
 *   1. admission: kvc_grammar_check_cost (start + ADMIT steps);
 *   2. when admitted: a generation, each step a mask (plain, or towards the
 *      end), the token the drive bytes pick, min_remaining, sometimes a
 *      rollback and redo.
 *
 * Findings (abort):
 *   - any one call takes more than LIMIT_MS of this thread's CPU time: the
 *     budget failed to bound it (work the accounting does not see); the
 *     grammar's compilation more than 5 * LIMIT_MS;
 *   - admission takes more than (ADMIT + 2) * LIMIT_MS;
 *   - a call fails other than cleanly: only KVC_ERR_UNSUPPORTED (a limit,
 *     with kvc_gmatch_error saying which) and nothing changed, or
 *     KVC_ERR_NOMEM, may come back from a grammar admission accepted;
 *   - the first mask after admission accepted fails (admission measured it).
 *
 * Run: ninja -C build-fuzz fuzz_grammar_cost &&
 *      build-fuzz/fuzz_grammar_cost -max_total_time=60 fuzz/corpus/fuzz_grammar_cost */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fuzz_grammar_input.h"
#include "grammar.h"
#include "model_gen.h"
#include "tokenizer.h"

enum {
    BUDGET = 200000,              /* units per call: ~5 ms natively */
    ADMIT = 8,                    /* admission's steps, as the server's */
    LIMIT_MS = 400,               /* a call over this is a finding (sanitizers, load) */
    MAX_STEPS = 48,
};

static kvc_tokenizer *tok;
static kvc_gvocab *vocab;
static int32_t n_vocab;
static uint32_t *mask, *again;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (kvc_gen_tokenizer("demo", &tok, NULL) != KVC_OK || kvc_gvocab_new(tok, &vocab, NULL) != KVC_OK)
        abort();
    n_vocab = kvc_tokenizer_n_vocab(tok);
    mask = malloc(kvc_mask_words(n_vocab) * sizeof(*mask));
    again = malloc(kvc_mask_words(n_vocab) * sizeof(*again));
    if (!mask || !again)
        abort();
    return 0;
}

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void over(const char *what, double ms, double limit)
{
    if (ms > limit) {
        fprintf(stderr, "finding: %s took %.1f ms of CPU (limit %.0f ms, budget %d units)\n", what,
                ms, limit, BUDGET);
        abort();
    }
}

/* A failed call: a limit (said so) or out of memory, and no step taken. */
static void clean_failure(const kvc_gmatch *m, int rc, int32_t steps, const char *what)
{
    if (rc == KVC_ERR_NOMEM)
        return;
    if (rc != KVC_ERR_UNSUPPORTED || !kvc_gmatch_error(m)[0] || kvc_gmatch_n_steps(m) != steps) {
        fprintf(stderr, "finding: %s failed with %d (%s), steps %d -> %d\n", what, rc,
                kvc_gmatch_error(m), steps, kvc_gmatch_n_steps(m));
        abort();
    }
}

/* The n-th allowed token, n taken modulo the count; -1 when none. */
static int32_t nth(const uint32_t *mk, uint32_t n)
{
    int32_t count = 0;
    for (int32_t id = 0; id < n_vocab; id++)
        count += kvc_mask_test(mk, id);
    if (count == 0)
        return -1;
    n %= (uint32_t)count;
    for (int32_t id = 0; id < n_vocab; id++)
        if (kvc_mask_test(mk, id) && n-- == 0)
            return id;
    return -1;
}

static void generate(const kvc_grammar *g, const uint8_t *p, size_t n)
{
    kvc_err err = { 0 };
    double t = cpu_ms();
    kvc_gmatch *m = kvc_gmatch_new_budget(g, vocab, BUDGET, &err);
    over("kvc_gmatch_new", cpu_ms() - t, LIMIT_MS);
    if (!m) {
        fprintf(stderr, "finding: admitted, but the start fails: %s\n", err.msg);
        abort();
    }
    for (size_t i = 0; i + 1 < n && i / 2 < MAX_STEPS && !kvc_gmatch_is_done(m); i += 2) {
        int32_t steps = kvc_gmatch_n_steps(m);
        bool toward_end = (p[i] & 3) == 3;
        t = cpu_ms();
        int32_t allowed = toward_end ? kvc_gmatch_mask_closer(m, mask) : kvc_gmatch_mask(m, mask);
        over(toward_end ? "kvc_gmatch_mask_closer" : "kvc_gmatch_mask", cpu_ms() - t, LIMIT_MS);
        if (allowed < 0) {
            if (i == 0 && !toward_end) {
                fprintf(stderr, "finding: admitted, but the first mask fails: %s\n",
                        kvc_gmatch_error(m));
                abort();
            }
            clean_failure(m, allowed, steps, "mask");
            break;                           /* the engine ends the request here */
        }
        if (allowed == 0 && toward_end)
            continue;
        int32_t id = nth(mask, (uint32_t)p[i + 1] * 131u + (uint32_t)i);
        if (id < 0)
            break;
        t = cpu_ms();
        int rc = kvc_gmatch_accept_token(m, id);
        over("kvc_gmatch_accept_token", cpu_ms() - t, LIMIT_MS);
        if (rc != KVC_OK) {
            clean_failure(m, rc, steps, "accept");
            break;
        }
        t = cpu_ms();
        kvc_gmatch_min_remaining(m);
        over("kvc_gmatch_min_remaining", cpu_ms() - t, LIMIT_MS);
        if ((p[i] & 7) == 0 && !kvc_gmatch_is_done(m)) {   /* undo and redo: the same mask */
            kvc_gmatch_rollback(m, 1);
            t = cpu_ms();
            int32_t a = toward_end ? kvc_gmatch_mask_closer(m, again) : kvc_gmatch_mask(m, again);
            over("mask after rollback", cpu_ms() - t, LIMIT_MS);
            if (a != allowed || memcmp(mask, again, kvc_mask_words(n_vocab) * sizeof(*mask)) != 0)
                abort();
            if (kvc_gmatch_accept_token(m, id) != KVC_OK)
                abort();
        }
    }
    kvc_gmatch_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    grammar_input in = grammar_input_split(data, size);
    kvc_grammar *g = NULL;
    kvc_err err = { 0 };
    double t = cpu_ms();
    int rc = grammar_input_compile(&in, &g, &err);
    /* the compilers are linear in their input (and in {m,n}'s counts, up to
     * 10000): a looser limit, but one still */
    over(in.schema ? "kvc_grammar_from_schema" : "kvc_grammar_parse", cpu_ms() - t, 5 * LIMIT_MS);
    if (rc != KVC_OK)
        return 0;
    t = cpu_ms();
    rc = kvc_grammar_check_cost(g, vocab, ADMIT, BUDGET, &err);
    over("admission", cpu_ms() - t, (ADMIT + 2) * LIMIT_MS);
    if (rc == KVC_OK)
        generate(g, in.drive, in.n_drive);
    else if (rc != KVC_ERR_UNSUPPORTED && rc != KVC_ERR_NOMEM)
        abort();
    else if (rc == KVC_ERR_UNSUPPORTED && !err.msg[0])
        abort();                             /* a refusal must say why */
    kvc_grammar_free(g);
    return 0;
}
