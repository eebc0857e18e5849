/* fuzz_grammar.c - libFuzzer target for the schema compiler, the grammar
 * parser and the matcher.
 *
 * Input: fuzz_grammar_input.h's (a mode byte, a schema or grammar text, the
 * bytes that drive a walk over the demo vocabulary, generated once).
 *
 * Properties checked (abort on violation):
 *   - whatever compiles, every rule can finish: from the start and after each
 *     step, kvc_gmatch_min_remaining is finite and 0 exactly when complete;
 *   - the mask agrees with the matcher: a token it allows is accepted, one it
 *     refuses is refused, and a refused token leaves the state unchanged;
 *   - some token is allowed until an end-of-generation token was taken;
 *   - rollback returns to the same state (same mask). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_grammar_input.h"
#include "grammar.h"
#include "model_gen.h"
#include "tokenizer.h"

static kvc_tokenizer *tok;
static kvc_gvocab *vocab;
static int32_t n_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (kvc_gen_tokenizer("demo", &tok, NULL) != KVC_OK || kvc_gvocab_new(tok, &vocab, NULL) != KVC_OK)
        abort();
    n_vocab = kvc_tokenizer_n_vocab(tok);
    return 0;
}

static void check_remaining(const kvc_gmatch *m)
{
    int32_t r = kvc_gmatch_min_remaining(m);
    if (r < 0 || r >= (1 << 28) || (r == 0) != (kvc_gmatch_is_complete(m) || kvc_gmatch_is_done(m)))
        abort();
}

/* The n-th allowed (want = true) or refused token, n taken modulo the count. */
static int32_t nth(const uint32_t *mask, bool want, uint32_t n)
{
    int32_t count = 0;
    for (int32_t id = 0; id < n_vocab; id++)
        count += kvc_mask_test(mask, id) == want;
    if (count == 0)
        return -1;
    n %= (uint32_t)count;
    for (int32_t id = 0; id < n_vocab; id++)
        if (kvc_mask_test(mask, id) == want && n-- == 0)
            return id;
    return -1;
}

static void walk(const kvc_grammar *g, const uint8_t *p, size_t n)
{
    kvc_gmatch *m = kvc_gmatch_new(g, vocab);
    if (!m)
        return;
    size_t words = kvc_mask_words(n_vocab);
    uint32_t *mask = malloc(words * sizeof(*mask)), *again = malloc(words * sizeof(*again));
    check_remaining(m);
    for (size_t i = 0; i + 1 < n && !kvc_gmatch_is_done(m); i += 2) {
        int32_t allowed = kvc_gmatch_mask(m, mask);
        if (allowed == KVC_ERR_UNSUPPORTED)          /* too ambiguous: refused, not a bug */
            break;
        if (allowed <= 0)
            abort();
        int32_t bad = nth(mask, false, p[i]);
        int32_t steps = kvc_gmatch_n_steps(m);
        if (bad >= 0 && (kvc_gmatch_accept_token(m, bad) == KVC_OK || kvc_gmatch_n_steps(m) != steps))
            abort();
        int32_t good = nth(mask, true, (uint32_t)p[i + 1] * 131u + (uint32_t)i);
        int rc = kvc_gmatch_accept_token(m, good);
        if (rc == KVC_ERR_UNSUPPORTED)
            break;
        if (rc != KVC_OK)
            abort();
        check_remaining(m);
        if ((p[i] & 7) == 0 && !kvc_gmatch_is_done(m)) {    /* undo and redo: the same mask */
            kvc_gmatch_rollback(m, 1);
            if (kvc_gmatch_mask(m, again) != allowed || memcmp(mask, again, words * sizeof(*mask)) != 0)
                abort();
            if (kvc_gmatch_accept_token(m, good) != KVC_OK)
                abort();
        }
    }
    free(mask);
    free(again);
    kvc_gmatch_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    grammar_input in = grammar_input_split(data, size);
    kvc_grammar *g = NULL;
    kvc_err err = { 0 };
    int rc = grammar_input_compile(&in, &g, &err);
    if (rc == KVC_OK) {
        walk(g, in.drive, in.n_drive);
        kvc_grammar_free(g);
    } else if (err.msg[0] == 0 || g != NULL) {
        abort();                                    /* a failure must say why */
    }
    return 0;
}
