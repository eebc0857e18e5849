/* test_exact.c - a warm session answers exactly as a fresh context does
 * (DESIGN.md §3, the fidelity rule), at the C API.
 *
 * For each model (random-weight BPE and SPM models made here, one a mixture
 * of experts; the two real TinyStories models and tiny-qwen3moe-q4_k_m of
 * ../shared when present), greedy and seeded sampling at
 * temperature 1: three conversations of six turns run interleaved on one warm
 * context (its sessions share the prefix tree). Every reply must equal the
 * reply of a fresh context given the same messages and parameters, and be
 * valid UTF-8. Turns 2+ must compute at most SLACK tokens beyond the new
 * message and its template markup: the previous reply and its end of turn were
 * computed by the canonicalization that kvc_session_chat runs after a reply. */
#include "test.h"

#include "chat_template.h"
#include "model.h"
#include "session.h"
#include "tokenizer.h"
#include "sampler.h"
#include "unicode.h"

#include <unistd.h>

#define N_CONV  3
#define N_TURNS 6
#define SLACK   8
#define MAX_MSG (2 * N_TURNS + 1)

static const char *const USER[] = {
    "Hello! Tell me a story about a small dog.",
    "Why is the sky blue?\nAnswer in two lines.",
    "Café, naïve, 日本語, emoji 🙂 — and a tab\there.",
    "What did you say before? Repeat it.",
    "Write a list:\n- one\n- two\n- three",
    "  leading and trailing spaces  ",
    "Once upon a time there was a girl named Lily.",
    "Numbers: 3.14159, 2718, -42, 1e10.",
    "OK.",
    "The quick brown fox jumps over the lazy dog.",
    "Say something in French: « bonjour »",
    "def f(x):\n    return x * 2\n",
};

typedef struct conv {
    kvc_chat_message m[MAX_MSG];
    char            *owned[MAX_MSG];
    size_t           n;
} conv;

static void conv_push(conv *c, const char *role, char *content)
{
    c->owned[c->n] = content;
    c->m[c->n++] = (kvc_chat_message){ role, content };
}

static void conv_free(conv *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->owned[i]);
    c->n = 0;
}

/* Tokens of msgs rendered (gen: with the generation prompt), as a cold run. */
static kvc_tokbuf tokens_of(const kvc_model *m, const kvc_chat_template *tmpl,
                            const kvc_chat_message *msgs, size_t n, bool gen)
{
    kvc_tokbuf b = { 0 };
    kvc_rendered r = { 0 };
    kvc_err e = { 0 };
    CHECK(kvc_chat_template_apply(tmpl, msgs, n, NULL, NULL, gen, &r, &e) == KVC_OK);
    if (r.text)
        CHECK(kvc_prompt_tokenize(m, r.text, r.len, &b, &e) == KVC_OK);
    kvc_rendered_free(&r);
    return b;
}

/* The new message and its markup: the prompt's tokens past the longest
 * common prefix with the previous conversation closed by its reply. */
static int64_t new_tokens(const kvc_model *m, const kvc_chat_template *tmpl, const conv *c)
{
    kvc_tokbuf now = tokens_of(m, tmpl, c->m, c->n, true);
    kvc_tokbuf before = tokens_of(m, tmpl, c->m, c->n - 1, false);
    int64_t r = now.n - kvc_tokens_common(now.v, now.n, before.v, before.n);
    kvc_tokbuf_free(&now);
    kvc_tokbuf_free(&before);
    return r;
}

/* A template of our own in the style of QwQ and Qwen3's thinking mode: the
 * generation prompt opens a reasoning block, and past assistant turns are
 * written without it (whatever came before a "</think>" is dropped). So the
 * cached reply follows "<think>\n" and the next request's does not: only the
 * background canonicalization keeps the next turn from recomputing it. */
static const char THINK_TEMPLATE[] =
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}{%- endif %}";

/* The template of the sessions: NULL = the model's, else Jinja source. */
static const char *tmpl_src;

/* The reply of a fresh context to c (the reference: shares nothing). */
static char *cold_reply(kvc_model *m, const conv *c, const kvc_chat_params *p)
{
    kvc_context *ctx = NULL;
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 2048;
    cp.n_threads = 2;
    char err[512];
    char *reply = NULL;
    CHECKF(kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_session *s = ctx ? kvc_session_new(ctx, 0, tmpl_src, err, sizeof(err)) : NULL;
    if (s)
        CHECKF(kvc_session_chat(s, c->m, c->n, p, NULL, NULL, &reply, NULL, err, sizeof(err)) ==
               KVC_OK, "cold: %s", err);
    kvc_session_free(s);
    kvc_context_free(ctx);
    return reply;
}

typedef struct totals {
    int replies, equal, slack_ok, turns2;
    int64_t computed, ideal;
} totals;

static void run_model(kvc_model *m, const char *name, bool sampled, totals *tot)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 2048;
    cp.n_seq = N_CONV;
    cp.n_threads = 2;
    kvc_context *ctx = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK, "%s: %s", name, err);
    if (!ctx)
        return;
    kvc_session *s[N_CONV];
    conv c[N_CONV];
    memset(c, 0, sizeof(c));
    for (int i = 0; i < N_CONV; i++) {
        s[i] = kvc_session_new(ctx, i, tmpl_src, err, sizeof(err));
        if (i == 1)
            conv_push(&c[i], "system", strdup("You are a helpful assistant. Be brief."));
    }
    const kvc_chat_template *tmpl = s[0]->tmpl;
    for (int t = 0; t < N_TURNS; t++)
        for (int i = 0; i < N_CONV; i++) {
            conv_push(&c[i], "user", strdup(USER[(size_t)(i * 5 + t) % KVC_ARRAY_LEN(USER)]));
            kvc_chat_params p = kvc_chat_default_params();
            p.max_tokens = 12 + 4 * ((i + t) % 4);
            if (sampled) {
                p.sampling.temperature = 1.0f;
                p.sampling.seed = 1000u * (uint64_t)i + (uint64_t)t + 7;
            }
            char *warm = NULL;
            kvc_chat_stats st;
            int rc = kvc_session_chat(s[i], c[i].m, c[i].n, &p, NULL, NULL, &warm, &st, err,
                                      sizeof(err));
            CHECKF(rc == KVC_OK, "%s: warm: %s", name, err);
            char *cold = cold_reply(m, &c[i], &p);
            tot->replies++;
            bool eq = warm && cold && strcmp(warm, cold) == 0;
            tot->equal += eq;
            CHECKF(eq, "%s %s conv %d turn %d: warm \"%s\" != cold \"%s\"", name,
                   sampled ? "seeded" : "greedy", i, t, warm ? warm : "(null)",
                   cold ? cold : "(null)");
            CHECKF(warm && kvc_utf8_valid(warm, strlen(warm)), "%s: reply not valid UTF-8", name);
            if (t > 0) {
                int64_t ideal = new_tokens(m, tmpl, &c[i]);
                tot->turns2++;
                tot->computed += st.computed_tokens;
                tot->ideal += ideal;
                bool ok = st.computed_tokens <= ideal + SLACK;
                tot->slack_ok += ok;
                CHECKF(ok, "%s conv %d turn %d: computed %d tokens, the new message and its markup "
                       "are %lld", name, i, t, st.computed_tokens, (long long)ideal);
            }
            conv_push(&c[i], "assistant", warm ? warm : strdup(""));
            free(cold);
        }
    for (int i = 0; i < N_CONV; i++) {
        kvc_session_free(s[i]);
        conv_free(&c[i]);
    }
    kvc_context_free(ctx);
}

/* ------------------------------------------------ cut characters, stops */

typedef struct pieces {
    char   buf[8192];
    size_t len;
    bool   valid;           /* every piece valid UTF-8 */
} pieces;

static bool collect(const char *text, size_t len, const kvc_token_logprob *lp, int32_t n_lp,
                    void *user)
{
    pieces *p = user;
    p->valid = p->valid && kvc_utf8_valid(text, len);
    if (p->len + len < sizeof(p->buf)) {
        memcpy(p->buf + p->len, text, len);
        p->len += len;
    }
    p->buf[p->len] = 0;
    return true;
}

static bool evict(kvc_context *c, int64_t n_free, void *user)
{
    return kvc_context_make_room(c, n_free);
}

/* One turn on s through the turn's steps (no canonicalization afterwards, so
 * the session's tokens are the prompt and the reply's tokens). */
static char *turn_alone(kvc_session *s, const conv *c, const kvc_chat_params *p, pieces *pc,
                        kvc_chat_stats *st)
{
    kvc_tokbuf toks = { 0 };
    kvc_err e = { 0 };
    int32_t dropped;
    kvc_turn *t = NULL;
    char *reply = NULL;
    *pc = (pieces){ .valid = true };
    CHECK(kvc_prompt_chat(s->ctx->model, s->tmpl, c->m, c->n, p, s->ctx->p.n_ctx, &toks, &dropped, NULL,
                          &e) == KVC_OK);
    CHECK(kvc_turn_new(s, toks.v, toks.n, KVC_TURN_CHAT, p, collect, pc, kvc_time_us(), &t, &e) ==
          KVC_OK);
    CHECK(t && kvc_turn_prepare(t, evict, NULL, &e) == KVC_OK);
    while (t && kvc_turn_phase(t) != KVC_TURN_DONE)
        if (kvc_turns_step(s->ctx, &t, 1, 0, &e) <= 0)
            break;
    CHECKF(kvc_turn_end(t, &reply, st, &e) == KVC_OK, "%s", e.msg);
    kvc_tokbuf_free(&toks);
    return reply;
}

/* Whether the reply's raw bytes, after its first k tokens, end inside a
 * character (an incomplete UTF-8 sequence). */
static bool cut_inside(const kvc_model *m, const int32_t *reply, int k)
{
    char text[4096];
    size_t len = 0;
    for (int i = 0; i < k; i++) {
        int n = kvc_token_to_piece(m->tok, reply[i], false, text + len,
                                   (int)(sizeof(text) - len));
        if (n < 0 || len + (size_t)n >= sizeof(text))
            return false;
        len += (size_t)n;
    }
    return kvc_utf8_incomplete_tail(text, len) > 0;
}

/* A reply cut by max_tokens inside a multi-byte character: the text ends in
 * U+FFFD, every piece and the reply are valid UTF-8, the pieces join to the
 * reply, a fresh context says the same, and the cached tokens are the ones
 * generated. And a reply that samples a control token that does not end
 * generation (<|im_start|>) stops there without keeping it. */
static void test_cut_and_stop(kvc_model *m, const char *name, int *cuts, int *ctls)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 1024;
    cp.n_threads = 2;
    kvc_context *ctx = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK, "%s", err);
    kvc_session *s = ctx ? kvc_session_new(ctx, 0, NULL, err, sizeof(err)) : NULL;
    if (!s) {
        kvc_context_free(ctx);
        return;
    }
    conv c = { 0 };
    conv_push(&c, "user", strdup("Write anything at all, in any script."));
    int found_cut = 0, found_ctl = 0;
    for (uint64_t seed = 1; seed <= 600 && (!found_cut || !found_ctl); seed++) {
        kvc_chat_params p = kvc_chat_default_params();
        p.max_tokens = 40;
        p.sampling.temperature = 3.0f;
        p.sampling.seed = seed;
        pieces pc;
        kvc_chat_stats st;
        kvc_session_reset(s);
        char *r = turn_alone(s, &c, &p, &pc, &st);
        int64_t n_prompt = st.prompt_tokens;
        int n_out = st.output_tokens;
        CHECK_EQ_INT(s->toks.n, n_prompt + n_out);   /* no stop token kept */
        int k = 0;
        while (k < n_out && !cut_inside(m, s->toks.v + n_prompt, k + 1))
            k++;
        if (!found_cut && k < n_out) {               /* cut there by max_tokens */
            int32_t *gen = malloc((size_t)(k + 1) * sizeof(int32_t));
            memcpy(gen, s->toks.v + n_prompt, (size_t)(k + 1) * sizeof(int32_t));
            p.max_tokens = k + 1;
            kvc_session_reset(s);
            char *cut = turn_alone(s, &c, &p, &pc, &st);
            size_t len = cut ? strlen(cut) : 0;
            CHECKF(cut && len >= 3 && memcmp(cut + len - 3, KVC_UTF8_REPLACEMENT, 3) == 0,
                   "%s: a reply cut inside a character does not end in U+FFFD", name);
            CHECK(cut && kvc_utf8_valid(cut, len) && pc.valid && strcmp(pc.buf, cut) == 0);
            CHECK(s->toks.n == n_prompt + k + 1 &&
                  memcmp(s->toks.v + n_prompt, gen, (size_t)(k + 1) * sizeof(int32_t)) == 0);
            char *cold = cold_reply(m, &c, &p);
            CHECK(cut && cold && strcmp(cut, cold) == 0);
            free(cold);
            free(cut);
            free(gen);
            found_cut++;
        }
        if (!found_ctl && strcmp(st.finish_reason, "stop") == 0 && n_out < 40) {
            /* which token stopped it: replay cold with the same sampler */
            kvc_context *cc = NULL;
            kvc_context_new(m, &cp, &cc, err, sizeof(err));
            kvc_tokbuf toks = { 0 };
            int32_t dropped;
            kvc_err e = { 0 };
            p.max_tokens = 40;
            kvc_prompt_chat(m, s->tmpl, c.m, c.n, &p, cp.n_ctx, &toks, &dropped, NULL, &e);
            kvc_sampler *smp = kvc_sampler_new(&p.sampling, m->hp.n_vocab);
            for (int64_t i = 0; i < toks.n; i++)
                kvc_sampler_accept(smp, toks.v[i]);
            int32_t id = -1;
            int rc = kvc_context_decode(cc, 0, toks.v, (int32_t)toks.n, false, err, sizeof(err));
            for (int i = 0; rc == KVC_OK && i <= n_out; i++) {
                id = kvc_sampler_sample(smp, kvc_context_logits(cc, -1));
                kvc_sampler_accept(smp, id);
                if (i < n_out)
                    rc = kvc_context_decode(cc, 0, &id, 1, false, err, sizeof(err));
            }
            if (id >= 0 && !kvc_tokenizer_is_eog(m->tok, id) &&
                kvc_tokenizer_token_type(m->tok, id) == KVC_TOKEN_CONTROL) {
                found_ctl++;
                printf("  %s: seed %llu sampled control token %d (%s) after %d tokens: the reply "
                       "stopped there, %lld tokens kept\n", name, (unsigned long long)seed, id,
                       kvc_tokenizer_token_text(m->tok, id), n_out, (long long)s->toks.n);
                char *cold = cold_reply(m, &c, &p);
                CHECK(r && cold && strcmp(r, cold) == 0);
                free(cold);
            }
            kvc_sampler_free(smp);
            kvc_tokbuf_free(&toks);
            kvc_context_free(cc);
        }
        free(r);
    }
    printf("  %s: %d replies cut inside a character, %d stopped by a non-final control token\n",
           name, found_cut, found_ctl);
    *cuts += found_cut;
    *ctls += found_ctl;
    conv_free(&c);
    kvc_session_free(s);
    kvc_context_free(ctx);
}

static kvc_model *load(const char *path)
{
    kvc_model *m = NULL;
    char err[512];
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    return m;
}

static kvc_model *make(const char *preset, const char *path, bool all_tokens)
{
    kvc_gen_params g;
    char err[512];
    CHECK(kvc_gen_preset(preset, &g) == KVC_OK);
    g.all_tokens = all_tokens;
    g.n_threads = 2;
    CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
    return load(path);
}

int main(void)
{
    char dir[] = "/tmp/kvc_exact_XXXXXX", path[4200];
    if (!mkdtemp(dir))
        return 1;
    struct { const char *name, *preset, *file; } models[] = {
        { "random qwen2 (BPE)", "tiny", NULL },
        { "random llama (SPM)", "tiny-llama", NULL },
        { "random qwen3 (SPM)", "tiny-qwen3", NULL },
        { "random qwen3moe (SPM, 8 experts, top-2)", "tiny-qwen3moe", NULL },
        { "tiny-qwen3moe-q4_k_m", NULL, "tiny-qwen3moe-q4_k_m.gguf" },
        { "TinyStories-656K", NULL, "TinyStories-656K-Q8_0.gguf" },
        { "stories260K", NULL, "stories260K.gguf" },
        { "tiny-gemma3-f32 (window 12)", NULL, "tiny-gemma3-f32.gguf" },
        { "tiny-gpt-oss-f32 (window 8, sinks)", NULL, "tiny-gpt-oss-f32.gguf" },
        { "tiny-gemma4-f32 (window 8, head sizes 16 and 32, experts)", NULL, "tiny-gemma4-f32.gguf" },
    };
    const char *shared = test_shared_dir();
    totals tot = { 0 };
    for (size_t k = 0; k < KVC_ARRAY_LEN(models); k++) {
        kvc_model *m = NULL;
        if (models[k].preset) {
            snprintf(path, sizeof(path), "%s/%s.gguf", dir, models[k].preset);
            m = make(models[k].preset, path, false);
            unlink(path);
        } else if (shared) {
            snprintf(path, sizeof(path), "%s/models/%s", shared, models[k].file);
            if (access(path, R_OK) != 0) {
                printf("  %s: skipped (no %s)\n", models[k].name, path);
                continue;
            }
            m = load(path);
        } else {
            printf("  %s: skipped (no ../shared)\n", models[k].name);
            continue;
        }
        if (!m)
            continue;
        totals before = tot;
        run_model(m, models[k].name, false, &tot);
        run_model(m, models[k].name, true, &tot);
        printf("  %s: %d/%d replies equal a fresh context's; turns 2+: computed %lld tokens, "
               "new messages and markup %lld\n", models[k].name, tot.equal - before.equal,
               tot.replies - before.replies, (long long)(tot.computed - before.computed),
               (long long)(tot.ideal - before.ideal));
        kvc_model_free(m);
    }
    /* a template that rewrites past assistant turns */
    snprintf(path, sizeof(path), "%s/think.gguf", dir);
    kvc_model *tm = make("tiny", path, false);
    unlink(path);
    if (tm) {
        totals before = tot;
        tmpl_src = THINK_TEMPLATE;
        run_model(tm, "tiny, reasoning dropped from history", false, &tot);
        run_model(tm, "tiny, reasoning dropped from history", true, &tot);
        tmpl_src = NULL;
        printf("  reasoning dropped from history: %d/%d replies equal a fresh context's; turns 2+: "
               "computed %lld tokens, new messages and markup %lld\n", tot.equal - before.equal,
               tot.replies - before.replies, (long long)(tot.computed - before.computed),
               (long long)(tot.ideal - before.ideal));
    }
    kvc_model_free(tm);

    /* models whose byte and control tokens are as likely as any other */
    int cuts = 0, ctls = 0;
    const char *loud_presets[] = { "tiny", "tiny-llama" };
    for (size_t k = 0; k < KVC_ARRAY_LEN(loud_presets); k++) {
        char name[64];
        snprintf(name, sizeof(name), "%s, all tokens", loud_presets[k]);
        snprintf(path, sizeof(path), "%s/all-tokens.gguf", dir);
        kvc_model *loud = make(loud_presets[k], path, true);
        unlink(path);
        if (loud) {
            test_cut_and_stop(loud, name, &cuts, &ctls);
            run_model(loud, name, true, &tot);
        }
        kvc_model_free(loud);
    }
    CHECKF(cuts > 0, "no reply cut inside a character found");
    CHECKF(ctls > 0, "no reply stopped by a control token that does not end generation found");
    rmdir(dir);
    printf("  all: %d/%d equal; %d/%d later turns within %d tokens of the ideal\n", tot.equal,
           tot.replies, tot.slack_ok, tot.turns2, SLACK);
    return test_done("test_exact");
}
