/* cmd_chat.c - kvchat chat: a conversation that computes only its new tokens.
 *
 * Interactive (line editing, /clear, /stats, /regen, /system TEXT, /quit), or
 * scripted for tests and benchmarks:
 *   kvchat chat -m M.gguf --script CONV.json --json [--no-cache]
 * CONV.json: {"system": "...", "turns": [TURN, ...]} where a TURN is
 *   "text"                          a user message
 *   {"user": "text"}                the same
 *   {"edit": K, "user": "text"}     replace user message K (0-based), drop what followed it
 *   {"regen": true}                 drop the last reply and generate it again
 *   {"system": "text", ...}         change the system prompt first (with or without "user")
 *   {"reply": "text", "user": ...}  the client sends back this reply text instead of the
 *                                   generated one (a client that edits or re-renders replies)
 * One JSON line is printed per turn. */
#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char help[] =
    "usage: kvchat chat [-m MODEL.gguf] [--system TEXT] [options]\n"
    "       kvchat chat [-m MODEL.gguf] --script CONV.json [--json] [--no-cache]\n\n"
    "Interactive commands: /clear /stats /regen /system TEXT /quit\n";

enum { OPT_SYSTEM = CLI_OPT_CMD, OPT_SCRIPT, OPT_JSON, OPT_NO_CACHE, OPT_SPECIAL,
       OPT_SHOW_PROMPT, OPT_OVERFLOW };

static const cli_option chat_options[] = {
    { "system", 0, "TEXT", OPT_SYSTEM, 0, "system prompt" },
    { "script", 0, "FILE", OPT_SCRIPT, 0,
      "run a scripted conversation (see the top of cli/cmd_chat.c)" },
    { "json", 0, NULL, OPT_JSON, 0, "with --script: one JSON line per turn" },
    { "no-cache", 0, NULL, OPT_NO_CACHE, 0, "recompute the whole prompt every turn (a cold run)" },
    { "allow-special-in-content", 0, NULL, OPT_SPECIAL, 0,
      "control-token text typed in a message becomes control\n"
      "tokens (default: plain text; only the template makes them)" },
    { "n-predict", 'n', "N", 'n', 0, "reply length limit (default 256)" },
    { "show-prompt", 0, NULL, OPT_SHOW_PROMPT, 0, "print each rendered prompt (stderr) before its reply" },
    { "context-overflow", 0, "M", OPT_OVERFLOW, 0,
      "prompt + reply over the context: error (default) or shift\n(drop the oldest turns)" },
    { 0 }
};

static const cli_option *const groups[] = {
    cli_help_opts, cli_model_opts, chat_options, cli_template_opts, cli_context_opts,
    cli_cache_opts, cli_sampling_opts, NULL
};

/* ------------------------------------------------------ the conversation */

typedef struct convo {
    kvc_chat_message *msgs;
    size_t            n, cap;
} convo;

static void convo_push(convo *c, const char *role, const char *content)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->msgs = realloc(c->msgs, c->cap * sizeof(*c->msgs));
        if (!c->msgs) {
            fprintf(stderr, "kvchat chat: out of memory\n");
            exit(1);
        }
    }
    c->msgs[c->n] = (kvc_chat_message){ strdup(role), strdup(content ? content : "") };
    c->n++;
}

static void convo_truncate(convo *c, size_t n)
{
    while (c->n > n) {
        c->n--;
        free((char *)c->msgs[c->n].role);
        free((char *)c->msgs[c->n].content);
    }
}

static void convo_set_system(convo *c, const char *text)
{
    if (c->n && !strcmp(c->msgs[0].role, "system")) {
        free((char *)c->msgs[0].content);
        c->msgs[0].content = strdup(text);
        return;
    }
    convo_push(c, "system", text);   /* then move it to the front */
    kvc_chat_message sys = c->msgs[c->n - 1];
    memmove(c->msgs + 1, c->msgs, (c->n - 1) * sizeof(*c->msgs));
    c->msgs[0] = sys;
}

/* Index of the k-th user message, or -1. */
static ssize_t nth_user(const convo *c, long k)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->msgs[i].role, "user") && k-- == 0)
            return (ssize_t)i;
    return -1;
}

/* ------------------------------------------------------------- one turn */

typedef struct chat_opts {
    cli_common  c;
    const char *system;
    const char *script;
    cli_template tmpl;         /* --chat-template*, its file's text owned */
    bool        show_prompt;
    bool        no_cache;
    bool        special_in_content;
    int64_t     n_predict;
    int32_t     overflow;
} chat_opts;

static bool print_piece(const char *text, size_t len, void *user)
{
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

static void print_stats(const kvc_chat_stats *st)
{
    fprintf(stderr, "prompt: %d tokens | cached: %d (disk %d) | new: %d | %.0f tok/s | "
            "TTFT: %.0f ms\n", st->prompt_tokens, st->cached_tokens, st->cached_disk_tokens,
            st->computed_tokens, st->prompt_tps, st->ttft_ms);
    fprintf(stderr, "output: %d tokens | %.1f tok/s | total: %.1f s\n", st->output_tokens,
            st->decode_tps, st->total_ms / 1e3);
}

/* Generate the assistant's reply to the conversation and append it. */
static int turn(kvc_session *s, convo *c, const chat_opts *o, bool stream, kvc_chat_stats *st,
                char **reply_out)
{
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = (int32_t)o->n_predict;
    p.sampling = o->c.sampling;
    p.no_cache = o->no_cache;
    p.special_in_content = o->special_in_content;
    p.overflow = o->overflow;
    p.template_kwargs_json = o->tmpl.kwargs;
    char *reply = NULL, err[512];
    if (o->show_prompt) {
        char *prompt = NULL;
        if (kvc_session_prompt(s, c->msgs, c->n, &p, &prompt, err, sizeof(err)) == KVC_OK)
            fprintf(stderr, "--- prompt ---\n%s\n--- end of prompt ---\n", prompt);
        free(prompt);
    }
    int rc = kvc_session_chat(s, c->msgs, c->n, &p, stream ? print_piece : NULL, NULL, &reply, st,
                              err, sizeof(err));
    if (rc) {
        fprintf(stderr, "%skvchat chat: %s\n", stream ? "\n" : "", err);
        return rc;
    }
    convo_push(c, "assistant", reply);
    if (reply_out)
        *reply_out = reply;
    else
        free(reply);
    return KVC_OK;
}

/* ------------------------------------------------------------- scripted */

static int run_script(kvc_session *s, const chat_opts *o)
{
    size_t len = 0;
    FILE *fp = fopen(o->script, "rb");
    char *buf = NULL;
    if (fp) {
        fseek(fp, 0, SEEK_END);
        len = (size_t)ftell(fp);
        fseek(fp, 0, SEEK_SET);
        buf = malloc(len + 1);
        if (buf && fread(buf, 1, len, fp) != len) {
            free(buf);
            buf = NULL;
        }
        fclose(fp);
    }
    cJSON *root = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    free(buf);
    const cJSON *turns = root ? cJSON_GetObjectItem(root, "turns") : NULL;
    if (!root || !cJSON_IsArray(turns)) {
        fprintf(stderr, "kvchat chat: %s: %s\n", o->script,
                root ? "needs a \"turns\" array" : "cannot read it as JSON");
        cJSON_Delete(root);
        return 1;
    }
    convo c = { 0 };
    const cJSON *sys = cJSON_GetObjectItem(root, "system");
    if (cJSON_IsString(sys))
        convo_push(&c, "system", sys->valuestring);
    else if (o->system)
        convo_push(&c, "system", o->system);
    int k = 0, rc = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, turns) {
        const char *user = cJSON_IsString(t) ? t->valuestring : NULL;
        if (cJSON_IsObject(t)) {
            const cJSON *u = cJSON_GetObjectItem(t, "user"), *e = cJSON_GetObjectItem(t, "edit");
            const cJSON *sy = cJSON_GetObjectItem(t, "system"), *rg = cJSON_GetObjectItem(t, "regen");
            const cJSON *rp = cJSON_GetObjectItem(t, "reply");
            if (cJSON_IsString(sy))
                convo_set_system(&c, sy->valuestring);
            if (cJSON_IsString(rp) && c.n && !strcmp(c.msgs[c.n - 1].role, "assistant")) {
                free((char *)c.msgs[c.n - 1].content);
                c.msgs[c.n - 1].content = strdup(rp->valuestring);
            }
            user = cJSON_IsString(u) ? u->valuestring : NULL;
            if (cJSON_IsNumber(e)) {
                ssize_t at = nth_user(&c, (long)e->valuedouble);
                if (at < 0) {
                    fprintf(stderr, "kvchat chat: turn %d edits user message %d, which does not exist\n",
                            k, (int)e->valuedouble);
                    rc = 1;
                    break;
                }
                convo_truncate(&c, (size_t)at);
            } else if (cJSON_IsTrue(rg)) {
                if (c.n && !strcmp(c.msgs[c.n - 1].role, "assistant"))
                    convo_truncate(&c, c.n - 1);
            }
        } else if (!user) {
            fprintf(stderr, "kvchat chat: turn %d is neither a string nor an object\n", k);
            rc = 1;
            break;
        }
        if (user)
            convo_push(&c, "user", user);
        kvc_chat_stats st;
        char *reply = NULL;
        if (turn(s, &c, o, false, &st, &reply) != KVC_OK) {
            rc = 1;
            break;
        }
        if (o->c.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "turn", k);
            cJSON_AddNumberToObject(j, "prompt_tokens", st.prompt_tokens);
            cJSON_AddNumberToObject(j, "cached_tokens", st.cached_tokens);
            cJSON_AddNumberToObject(j, "cached_disk_tokens", st.cached_disk_tokens);
            cJSON_AddNumberToObject(j, "computed_tokens", st.computed_tokens);
            cJSON_AddNumberToObject(j, "ttft_ms", st.ttft_ms);
            cJSON_AddNumberToObject(j, "prompt_ms", st.prompt_ms);
            cJSON_AddNumberToObject(j, "output_tokens", st.output_tokens);
            cJSON_AddNumberToObject(j, "decode_tps", st.decode_tps);
            cJSON_AddStringToObject(j, "finish_reason", st.finish_reason ? st.finish_reason : "");
            cJSON_AddStringToObject(j, "reply", reply);
            char *line = cJSON_PrintUnformatted(j);
            puts(line);
            fflush(stdout);
            free(line);
            cJSON_Delete(j);
        } else {
            printf("> %s\n%s\n", user ? user : "(regenerate)", reply);
            print_stats(&st);
        }
        free(reply);
        k++;
    }
    convo_truncate(&c, 0);
    free(c.msgs);
    cJSON_Delete(root);
    return rc;
}

/* ---------------------------------------------------------- interactive */

static int run_interactive(kvc_session *s, const chat_opts *o)
{
    convo c = { 0 };
    if (o->system)
        convo_push(&c, "system", o->system);
    kvc_chat_stats last = { 0 };
    bool tty = isatty(0);
    if (tty)
        fprintf(stderr, "kvchat chat (template %s). /clear /stats /regen /system TEXT /quit\n",
                kvc_session_template(s));
    char *line;
    while ((line = tty ? readline("> ") : NULL) || (!tty && (line = malloc(65536)) &&
                                                      fgets(line, 65536, stdin))) {
        line[strcspn(line, "\n")] = 0;
        if (tty && *line)
            add_history(line);
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/clear")) {
            convo_truncate(&c, c.n && !strcmp(c.msgs[0].role, "system") ? 1 : 0);
            kvc_session_reset(s);
            fprintf(stderr, "(conversation cleared)\n");
        } else if (!strcmp(line, "/stats")) {
            print_stats(&last);
        } else if (!strncmp(line, "/system", 7)) {
            const char *text = line[7] == ' ' ? line + 8 : "";
            convo_set_system(&c, text);
            fprintf(stderr, "(system prompt set)\n");
        } else if (!strcmp(line, "/regen")) {
            if (c.n && !strcmp(c.msgs[c.n - 1].role, "assistant")) {
                convo_truncate(&c, c.n - 1);
                if (turn(s, &c, o, true, &last, NULL) == KVC_OK) {
                    printf("\n");
                    print_stats(&last);
                }
            } else
                fprintf(stderr, "(nothing to regenerate)\n");
        } else if (line[0] == '/') {
            fprintf(stderr, "unknown command %s (/clear /stats /regen /system TEXT /quit)\n", line);
        } else if (*line) {
            convo_push(&c, "user", line);
            if (turn(s, &c, o, true, &last, NULL) == KVC_OK) {
                printf("\n");
                print_stats(&last);
            } else
                convo_truncate(&c, c.n - 1);
        }
        free(line);
    }
    convo_truncate(&c, 0);
    free(c.msgs);
    return 0;
}

int cmd_chat(int argc, char **argv)
{
    chat_opts o;
    memset(&o, 0, sizeof(o));
    cli_common_init(&o.c);
    cli_cache cache;
    cli_cache_init(&cache);
    o.n_predict = 256;
    cli_parser p;
    cli_parser_init(&p, "chat", argc, argv, groups);
    const char *v;
    int id, r;
    while ((id = cli_next_opt(&p, &v, help)) >= 0) {
        if ((r = cli_template_apply(&o.tmpl, id, v)) == 0 &&
            (r = cli_common_apply(&o.c, id, v)) == 0)
            r = cli_cache_apply(&cache, id, v);
        if (r < 0)
            goto bad;
        if (r > 0)
            continue;
        if (id == OPT_NO_CACHE)
            o.no_cache = true;
        else if (id == OPT_SPECIAL)
            o.special_in_content = true;
        else if (id == OPT_SYSTEM)
            o.system = v;
        else if (id == OPT_SCRIPT)
            o.script = v;
        else if (id == OPT_JSON)
            o.c.json = true;
        else if (id == OPT_SHOW_PROMPT)
            o.show_prompt = true;
        else if (id == 'n' && !cli_int("--n-predict", v, 1, 1 << 24, &o.n_predict))
            goto bad;
        else if (id == OPT_OVERFLOW) {
            if (!strcmp(v, "shift"))
                o.overflow = KVC_OVERFLOW_SHIFT;
            else if (!strcmp(v, "error"))
                o.overflow = KVC_OVERFLOW_ERROR;
            else {
                fprintf(stderr, "kvchat chat: --context-overflow must be error or shift, got '%s'\n", v);
                goto bad;
            }
        }
    }
    if (id == CLI_HELP) {
        free(o.tmpl.owned);
        return 0;
    }
    if (id == CLI_ERR)
        goto bad;
    if (cli_no_operands(&p))
        goto bad;
    kvc_model *m = cli_load_model(&o.c);
    kvc_context *ctx = m ? cli_new_context(&o.c, m, 1) : NULL;
    char err[512];
    if (ctx && (cache.disk_mib > 0 || cache.redis) && !o.no_cache &&
        (cache.redis ? kvc_context_enable_redis(ctx, cli_model_path(&o.c), cache.dir,
                                                cache.disk_mib, cache.redis,
                                                cache.redis_password, err, sizeof(err))
                     : kvc_context_enable_disk(ctx, cli_model_path(&o.c), cache.dir,
                                               cache.disk_mib, err, sizeof(err))) != KVC_OK)
        fprintf(stderr, "kvchat chat: the cache tiers are off: %s\n", err);
    kvc_session *s = ctx ? kvc_session_new(ctx, 0, o.tmpl.tmpl, err, sizeof(err)) : NULL;
    int rc = 1;
    if (ctx && !s)
        fprintf(stderr, "kvchat chat: %s\n", err);
    if (s && !o.script)
        fprintf(stderr, "kvchat chat: chat template: %s\n", kvc_session_template(s));
    if (s)
        rc = o.script ? run_script(s, &o) : run_interactive(s, &o);
    kvc_session_free(s);
    kvc_context_free(ctx);
    kvc_model_free(m);
    free(o.tmpl.owned);
    return rc;
bad:
    free(o.tmpl.owned);
    return 2;
}
