/* test_session.c - multi-turn chat that computes only the new tokens (DESIGN.md §3).
 *
 *  - Equivalence: 10-turn conversations, greedy, give byte-identical replies with
 *    the cache and with no_cache, also after an edit, a regeneration and a changed
 *    system prompt; on llama (SPM) and qwen2 (BPE) models.
 *  - Work proportional to the new tokens: computed = prompt - cached on every
 *    turn, and the cache covers the whole previous turn (prompt, reply, end of
 *    turn) when the client replays the reply, including replies whose text
 *    re-tokenizes differently from the tokens generated.
 *  - Context overflow: a clear error with the sizes, nothing changed; or, opted
 *    in, a context shift that drops the oldest turns, keeps the system prompt
 *    and moves the kept turns' K/V (re-rotated) instead of recomputing them. */
#include <unistd.h>

#include "kvchat.h"
#include "test.h"

static char tmpdir[256];

static kvc_model *make_model_layers(const char *preset, const char *ftype, int32_t n_layer)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s-%s-%d.gguf", tmpdir, preset, ftype, n_layer);
    kvc_gen_params p;
    CHECK(kvc_gen_preset(preset, &p) == KVC_OK);
    p.ftype = ftype;
    if (n_layer > 0)
        p.n_layer = n_layer;
    char err[512];
    CHECKF(kvc_gen_write(&p, path, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_model *m = NULL;
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    return m;
}

static kvc_model *make_model(const char *preset, const char *ftype)
{
    return make_model_layers(preset, ftype, 0);
}

static kvc_session *new_session(kvc_model *m, int32_t n_ctx, kvc_context **ctx)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 2;
    cp.n_batch = 64;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, ctx, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_session *s = kvc_session_new(*ctx, 0, NULL, err, sizeof(err));
    CHECKF(s != NULL, "%s", err);
    return s;
}

typedef struct convo {
    kvc_chat_message msgs[64];
    char            *owned[64];
    int              n;
} convo;

static void push(convo *c, const char *role, const char *content)
{
    c->owned[c->n] = strdup(content);
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = c->owned[c->n];
    c->n++;
}

static void truncate_to(convo *c, int n)
{
    while (c->n > n)
        free(c->owned[--c->n]);
}

static const char *user_turns[] = {
    "Hello there! How are you today?", "Tell me a story about a cat who learns to fly.",
    "Why is the sky blue?", "Give me three reasons to learn C.", "What is 17 times 23?",
    "Translate 'good morning' into French.", "Write a haiku about autumn.",
    "Summarize our conversation so far.", "What should I cook tonight?", "Thanks, goodbye!",
};

/* One turn on both sessions; the replies must match byte for byte. Returns the
 * cached session's stats. */
static kvc_chat_stats both(kvc_session *cached, kvc_session *cold, convo *c, const char *label,
                           int turn, float temp)
{
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = 12;
    p.sampling.temperature = temp;
    p.sampling.seed = 1234 + (uint64_t)turn;
    kvc_chat_params pc = p;
    pc.no_cache = true;
    kvc_chat_stats a = { 0 }, b = { 0 };
    char *ra = NULL, *rb = NULL, err[512];
    int rc1 = kvc_session_chat(cached, c->msgs, (size_t)c->n, &p, NULL, NULL, &ra, &a, err, sizeof(err));
    CHECKF(rc1 == KVC_OK, "%s turn %d: %s", label, turn, err);
    int rc2 = kvc_session_chat(cold, c->msgs, (size_t)c->n, &pc, NULL, NULL, &rb, &b, err, sizeof(err));
    CHECKF(rc2 == KVC_OK, "%s turn %d (no cache): %s", label, turn, err);
    if (rc1 || rc2)
        return a;
    CHECKF(strcmp(ra, rb) == 0, "%s turn %d: replies differ\n  cache:    '%s'\n  no cache: '%s'",
           label, turn, ra, rb);
    CHECK_EQ_INT(a.prompt_tokens, b.prompt_tokens);
    CHECK_EQ_INT(a.computed_tokens, a.prompt_tokens - a.cached_tokens);
    CHECK_EQ_INT(b.cached_tokens, 0);
    CHECK_EQ_INT(b.computed_tokens, b.prompt_tokens);
    push(c, "assistant", ra);
    free(ra);
    free(rb);
    return a;
}

static void test_equivalence(kvc_model *m, const char *label, float temp)
{
    kvc_context *c1, *c2;
    kvc_session *cached = new_session(m, 2048, &c1), *cold = new_session(m, 2048, &c2);
    convo c = { .n = 0 };
    push(&c, "system", "You are a helpful assistant.");
    kvc_chat_stats prev = { 0 };
    for (int t = 0; t < 10; t++) {
        push(&c, "user", user_turns[t]);
        kvc_chat_stats st = both(cached, cold, &c, label, t, temp);
        if (t > 0) {
            /* the whole previous turn is cached: its prompt, its reply and the
             * end-of-turn token when it stopped on one */
            int covered = prev.prompt_tokens + prev.output_tokens;
            CHECKF(st.cached_tokens >= covered, "%s turn %d: cached %d < previous prompt %d + reply %d",
                   label, t, st.cached_tokens, prev.prompt_tokens, prev.output_tokens);
            CHECKF(st.computed_tokens < st.prompt_tokens / 2 + 40,
                   "%s turn %d: computed %d of %d", label, t, st.computed_tokens, st.prompt_tokens);
        }
        prev = st;
    }
    /* a regeneration: drop the last reply and ask again */
    truncate_to(&c, c.n - 1);
    kvc_chat_stats st = both(cached, cold, &c, label, 10, temp);
    CHECKF(st.computed_tokens <= 1, "%s regen: computed %d", label, st.computed_tokens);
    /* an edit of an earlier message: everything after it is dropped */
    truncate_to(&c, 3);
    free(c.owned[2]);
    c.owned[2] = strdup("Actually, tell me about dogs.");
    c.msgs[2].content = c.owned[2];
    both(cached, cold, &c, label, 11, temp);
    push(&c, "user", "And wolves?");
    both(cached, cold, &c, label, 12, temp);
    /* a changed system prompt: the prefix diverges at the start */
    free(c.owned[0]);
    c.owned[0] = strdup("You are a pirate.");
    c.msgs[0].content = c.owned[0];
    push(&c, "user", "Ahoy?");
    st = both(cached, cold, &c, label, 13, temp);
    CHECKF(st.cached_tokens < 20, "%s system change: cached %d", label, st.cached_tokens);
    truncate_to(&c, 0);
    kvc_session_free(cached);
    kvc_session_free(cold);
    kvc_context_free(c1);
    kvc_context_free(c2);
}

/* Sampled replies are often made of tokens a tokenizer would not produce for
 * that text (" b"+"ec"+"a" where it would say " beca"); the text prefix still
 * finds the whole reply cached. Checks that such a case actually occurred. */
static void test_retokenization(kvc_model *m)
{
    kvc_context *ctx;
    kvc_session *s = new_session(m, 2048, &ctx);
    convo c = { .n = 0 };
    int differing = 0;
    kvc_chat_stats prev = { 0 };
    for (int t = 0; t < 8; t++) {
        push(&c, "user", user_turns[t]);
        kvc_chat_params p = kvc_chat_default_params();
        p.max_tokens = 16;
        p.sampling.temperature = 1.5f;
        p.sampling.top_k = 0;
        p.sampling.top_p = 1.0f;
        p.sampling.min_p = 0.0f;
        p.sampling.seed = 99 + (uint64_t)t;
        kvc_chat_stats st;
        char *reply = NULL, err[512];
        CHECKF(kvc_session_chat(s, c.msgs, (size_t)c.n, &p, NULL, NULL, &reply, &st, err,
                                sizeof(err)) == KVC_OK, "%s", err);
        if (!reply)
            break;
        int32_t ids[256];
        int64_t n = kvc_model_tokenize(m, reply, strlen(reply), false, false, ids, 256);
        differing += n != st.output_tokens;
        if (t > 0)
            CHECKF(st.cached_tokens >= prev.prompt_tokens + prev.output_tokens,
                   "turn %d: cached %d < %d + %d", t, st.cached_tokens, prev.prompt_tokens,
                   prev.output_tokens);
        push(&c, "assistant", reply);
        free(reply);
        prev = st;
    }
    CHECKF(differing > 0, "no reply re-tokenized differently: the case was not exercised");
    printf("  replies that re-tokenize differently: %d of 8, all fully cached\n", differing);
    truncate_to(&c, 0);
    kvc_session_free(s);
    kvc_context_free(ctx);
}

static void test_overflow_error(kvc_model *m)
{
    kvc_context *ctx;
    kvc_session *s = new_session(m, 128, &ctx);
    convo c = { .n = 0 };
    push(&c, "user", user_turns[1]);
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = 8;
    p.sampling.temperature = 0;
    kvc_chat_stats st;
    char *reply = NULL, err[512];
    CHECK(kvc_session_chat(s, c.msgs, 1, &p, NULL, NULL, &reply, &st, err, sizeof(err)) == KVC_OK);
    push(&c, "assistant", reply ? reply : "");
    free(reply);
    push(&c, "user", user_turns[2]);
    p.max_tokens = 120;
    int rc = kvc_session_chat(s, c.msgs, (size_t)c.n, &p, NULL, NULL, &reply, &st, err, sizeof(err));
    CHECK_EQ_INT(rc, KVC_ERR_CONTEXT_LENGTH);
    CHECKF(strstr(err, "128") && strstr(err, "120"), "message without the sizes: %s", err);
    CHECK(reply == NULL);
    /* nothing was truncated or lost: a request that fits still reuses the cache */
    p.max_tokens = 4;
    CHECK(kvc_session_chat(s, c.msgs, (size_t)c.n, &p, NULL, NULL, &reply, &st, err, sizeof(err)) == KVC_OK);
    CHECKF(st.cached_tokens > 10, "cached %d after a refused request", st.cached_tokens);
    free(reply);
    truncate_to(&c, 0);
    kvc_session_free(s);
    kvc_context_free(ctx);
}

/* Chat with overflow KVC_OVERFLOW_SHIFT on a small context: every turn fits by
 * dropping the oldest whole turns (the system prompt stays), the kept turns'
 * K/V are moved and re-rotated rather than recomputed, and the replies follow
 * a cold run of the same kept conversation.
 * `exact`: a one-layer model, whose K/V depend only on the token and its
 * position, so the moved K/V are a cold run's up to the rounding of the
 * rotated keys: the greedy replies must be the cold run's. With more layers
 * the kept turns' K/V also carry what they attended to in the dropped turns
 * (inherent in a context shift), and replies may drift: only reported. */
static void test_overflow_shift(kvc_model *m, const char *label, bool exact)
{
    kvc_context *c1, *c2;
    kvc_session *s = new_session(m, 256, &c1), *cold = new_session(m, 256, &c2);
    convo c = { .n = 0 };
    push(&c, "system", "You are a helpful assistant who answers briefly.");
    int shifted = 0, moved_turns = 0, same_first = 0, same_reply = 0;
    kvc_chat_stats prev = { 0 };
    for (int t = 0; t < 20; t++) {
        push(&c, "user", user_turns[t % 10]);
        kvc_chat_params p = kvc_chat_default_params();
        p.max_tokens = 24;
        p.sampling.temperature = 0;
        p.overflow = KVC_OVERFLOW_SHIFT;
        kvc_chat_stats st;
        char *reply = NULL, err[512];
        int rc = kvc_session_chat(s, c.msgs, (size_t)c.n, &p, NULL, NULL, &reply, &st, err,
                                  sizeof(err));
        CHECKF(rc == KVC_OK, "%s turn %d: %s", label, t, err);
        if (rc)
            break;
        CHECKF(st.prompt_tokens + p.max_tokens <= 256, "%s turn %d: prompt %d", label, t,
               st.prompt_tokens);
        /* the cold reference: the system prompt and the fewest last turns that
         * fit, found with the error mode, computed with no cache */
        kvc_chat_params pc = p;
        pc.overflow = KVC_OVERFLOW_ERROR;
        pc.no_cache = true;
        kvc_chat_message kept[64];
        char *ref = NULL;
        kvc_chat_stats sc = { 0 };
        int from = 1, rc2 = KVC_ERR_CONTEXT_LENGTH;
        for (; from < c.n && rc2 == KVC_ERR_CONTEXT_LENGTH; from += 2) {
            kept[0] = c.msgs[0];
            for (int i = from; i < c.n; i++)
                kept[1 + i - from] = c.msgs[i];
            rc2 = kvc_session_chat(cold, kept, (size_t)(1 + c.n - from), &pc, NULL, NULL, &ref, &sc,
                                   err, sizeof(err));
        }
        CHECKF(rc2 == KVC_OK, "%s turn %d cold: %s", label, t, err);
        CHECK_EQ_INT(st.prompt_tokens, sc.prompt_tokens);   /* the same kept conversation */
        CHECKF((st.dropped_tokens > 0) == (from > 3), "%s turn %d: dropped %d, kept from %d",
               label, t, st.dropped_tokens, from - 2);
        if (st.dropped_tokens > 0) {
            shifted++;
            CHECKF(st.cached_tokens > 12, "%s turn %d: system prompt not cached (%d)", label, t,
                   st.cached_tokens);
            /* the new user message and the template around it, and what the
             * cache cannot hold (the previous reply's end), no more */
            int new_turn = st.prompt_tokens - (prev.prompt_tokens + prev.output_tokens - st.dropped_tokens);
            /* moved, not recomputed: only the new turn computed. A reply whose
             * text tokenizes differently from the tokens generated ends the run
             * of tokens moved (the rest of the kept turns is then computed): it
             * may happen, rarely */
            bool moved = st.computed_tokens <= (new_turn > 0 ? new_turn : 0) + 24;
            moved_turns += moved;
            if (!moved)
                printf("  %s turn %d: computed %d of %d (new turn ~%d)\n", label, t,
                       st.computed_tokens, st.prompt_tokens, new_turn);
        }
        if (rc2 == KVC_OK && reply && ref) {
            int32_t a[64], b[64];
            int64_t na = kvc_model_tokenize(m, reply, strlen(reply), false, false, a, 64);
            int64_t nb = kvc_model_tokenize(m, ref, strlen(ref), false, false, b, 64);
            same_first += (na == 0 && nb == 0) || (na > 0 && nb > 0 && a[0] == b[0]);
            same_reply += strcmp(reply, ref) == 0;
        }
        if (t == 19 && rc2 == KVC_OK && ref) {
            /* the shifted blocks never entered the prefix tree: a new
             * conversation on this context with the same kept turns, cached,
             * finds only cold blocks (the system prompt's) and replies
             * exactly as the cold run */
            kvc_session_reset(s);
            char *again = NULL;
            kvc_chat_params pa = pc;
            pa.no_cache = false;
            kvc_chat_stats sa = { 0 };
            CHECK(kvc_session_chat(s, kept, (size_t)(1 + c.n - (from - 2)), &pa, NULL, NULL, &again,
                                   &sa, err, sizeof(err)) == KVC_OK);
            CHECKF(sa.cached_tokens <= 48, "%s: %d tokens of shifted turns found in the tree",
                   label, sa.cached_tokens);
            CHECKF(again && strcmp(again, ref) == 0, "%s: after a reset '%s', cold '%s'", label,
                   again ? again : "", ref);
            free(again);
        }
        free(ref);
        push(&c, "assistant", reply ? reply : "");
        free(reply);
        prev = st;
    }
    printf("  %s: %d shifted turns (%d moved, computing only the new turn), first token as cold "
           "%d/20, whole reply %d/20\n",
           label, shifted, moved_turns, same_first, same_reply);
    CHECKF(shifted >= 5, "%s: only %d turns overflowed", label, shifted);
    CHECKF(moved_turns >= shifted - 2, "%s: %d of %d shifted turns reused the moved KV", label,
           moved_turns, shifted);
    if (exact) {
        CHECKF(same_first == 20, "%s: first reply token as a cold run in %d of 20 turns", label,
               same_first);
        CHECKF(same_reply >= 19, "%s: reply as a cold run in %d of 20 turns", label, same_reply);
    }
    /* a turn that cannot fit even alone still fails, with the sizes */
    truncate_to(&c, 1);
    char big[4096];
    size_t bl = 0;
    while (bl + 40 < sizeof(big))
        bl += (size_t)snprintf(big + bl, sizeof(big) - bl, "%s ", user_turns[bl % 10]);
    push(&c, "user", big);
    kvc_chat_params p = kvc_chat_default_params();
    p.overflow = KVC_OVERFLOW_SHIFT;
    p.max_tokens = 8;
    char *reply = NULL, err[512];
    kvc_chat_stats st;
    CHECK_EQ_INT(kvc_session_chat(s, c.msgs, (size_t)c.n, &p, NULL, NULL, &reply, &st, err,
                                  sizeof(err)), KVC_ERR_CONTEXT_LENGTH);
    CHECKF(strstr(err, "256") != NULL, "message without the sizes: %s", err);
    CHECK(reply == NULL);
    truncate_to(&c, 0);
    kvc_session_free(s);
    kvc_session_free(cold);
    kvc_context_free(c1);
    kvc_context_free(c2);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_session_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    kvc_model *qwen = make_model("demo", "q8_0");
    kvc_model *llama = make_model("tiny-llama", "f16");
    kvc_model *qwen1 = make_model_layers("demo", "f32", 1);
    kvc_model *llama1 = make_model_layers("tiny-llama", "f32", 1);
    if (qwen1 && llama1) {
        test_overflow_shift(qwen1, "qwen2/bpe 1 layer (neox rope)", true);
        test_overflow_shift(llama1, "llama/spm 1 layer", true);
    }
    kvc_model_free(qwen1);
    kvc_model_free(llama1);
    /* sliding layers: each rotated with its own RoPE (gemma3's sliding base
     * 1e4 beside the global 1e6, gpt-oss's YaRN, gemma4's head sizes and
     * proportional RoPE); one layer slides alone (exact), the whole presets
     * mix sliding and global layers */
    const char *const swa[] = { "tiny-gemma3", "tiny-gpt-oss", "tiny-gemma4" };
    for (size_t i = 0; i < sizeof(swa) / sizeof(swa[0]); i++) {
        char label[64];
        kvc_model *one = make_model_layers(swa[i], "f32", 1), *all = make_model(swa[i], "f32");
        snprintf(label, sizeof(label), "%s 1 sliding layer", swa[i]);
        if (one)
            test_overflow_shift(one, label, true);
        snprintf(label, sizeof(label), "%s sliding and global", swa[i]);
        if (all)
            test_overflow_shift(all, label, false);
        kvc_model_free(one);
        kvc_model_free(all);
    }
    if (qwen && llama) {
        test_equivalence(qwen, "qwen2/bpe greedy", 0.0f);
        test_equivalence(llama, "llama/spm greedy", 0.0f);
        test_equivalence(qwen, "qwen2/bpe sampled", 0.9f);
        test_retokenization(qwen);
        test_overflow_error(qwen);
        test_overflow_shift(qwen, "qwen2/bpe q8_0", false);
        test_overflow_shift(llama, "llama/spm f16", false);
    }
    kvc_model_free(qwen);
    kvc_model_free(llama);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_session");
}
