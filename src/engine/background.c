/* background.c - canonicalizing finished replies (DESIGN.md §3).
 *
 * A generated reply often re-tokenizes differently (BPE does not round-trip),
 * and a template may rewrite a past reply, so the tokens the next request
 * brings (tokenize(render(messages)), prompt.h) part from the cached ones
 * inside the reply. When a chat reply finishes, the engine thread hands the
 * conversation and the reply to the background thread, which renders and
 * tokenizes it as the next request will carry it (kvc_prompt_next_turn) and
 * queues those tokens; the engine thread computes what of them the session
 * lacks when no request waits or runs (engine_sched.c). A request that comes
 * meanwhile stops that turn, keeps what it computed, and computes the rest
 * itself: nothing is computed twice, and nothing waits for it. */
#include "engine.h"
#include "reasoning.h"

#include <stdlib.h>
#include <string.h>

void kvc_bg_job_free(bg_job *j)
{
    if (!j)
        return;
    kvc_messages_free(j->messages, j->n_messages);
    free(j->tools_json);
    free(j->kwargs_json);
    kvc_tokbuf_free(&j->toks);
    free(j);
}

/* The reply as the next request carries it, appended to r's messages: an
 * assistant message with its tool calls (text: the reply without them) and,
 * when the client gets the reasoning apart (chat.split_reasoning), the
 * <think> block as reasoning_content and what follows it as content, as
 * the server split it: the template then keeps or drops the reasoning as it
 * does for the client's next request. false when out of memory. */
static bool append_reply(kvc_request *r, const char *text, const char *tool_calls)
{
    kvc_chat_message *m = realloc(r->messages, (r->n_messages + 1) * sizeof(*m));
    if (!m)
        return false;
    r->messages = m;
    m += r->n_messages++;
    *m = (kvc_chat_message){ .role = strdup("assistant") };
    size_t len = strlen(text);
    kvc_think_span sp = { .state = KVC_THINK_NONE };
    if (r->chat.split_reasoning)
        sp = kvc_think_find(text, len, r->chat.reasoning_mode, true);
    bool split = sp.state == KVC_THINK_OPEN || sp.state == KVC_THINK_CLOSED;
    /* the content as the client got it (harmony: without markup) */
    m->content = r->chat.split_reasoning ? strndup(text + sp.c_begin, sp.c_end - sp.c_begin)
                                         : strdup(text);
    if (split)
        m->reasoning_content = strndup(text + sp.r_begin, sp.r_end - sp.r_begin);
    if (tool_calls)
        m->tool_calls_json = strdup(tool_calls);
    return m->role && m->content && (!split || m->reasoning_content) &&
           (!tool_calls || m->tool_calls_json);
}

void kvc_engine_background_queue(kvc_engine *e, kvc_request *r, const char *reply,
                                 const kvc_chat_stats *st, const kvc_event *done)
{
    if (r->kind != KVC_TURN_CHAT || r->chat.no_cache || r->dropped || !r->slot ||
        !r->messages || strcmp(st->finish_reason, "cancelled") == 0)
        return;
    bool calls = done && done->tool_calls;
    const char *text = calls ? (done->content ? done->content : "") : reply;
    if (!append_reply(r, text, calls ? done->tool_calls : NULL))
        return;
    bg_job *j = calloc(1, sizeof(*j));
    if (!j)
        return;
    j->messages = r->messages;
    j->n_messages = r->n_messages;
    r->messages = NULL;
    r->n_messages = 0;
    j->chat.tools_json = j->tools_json = r->tools_json;   /* the template renders them too */
    j->chat.template_kwargs_json = j->kwargs_json = r->kwargs_json;
    j->chat.special_in_content = r->chat.special_in_content;
    r->tools_json = r->kwargs_json = NULL;
    r->chat.tools_json = r->chat.template_kwargs_json = NULL;
    j->slot = (int32_t)(r->slot - e->slots);
    j->serial = r->slot->s->serial;
    pthread_mutex_lock(&e->mu);
    if (e->prep_tail)
        e->prep_tail->next = j;
    else
        e->prep_head = j;
    e->prep_tail = j;
    e->m.bg_pending++;
    pthread_cond_signal(&e->bg_cv);
    pthread_mutex_unlock(&e->mu);
}

bg_job *kvc_engine_background_take(kvc_engine *e)
{
    pthread_mutex_lock(&e->mu);
    bg_job *j = e->bg_head;
    if (j) {
        e->bg_head = j->next;
        if (!e->bg_head)
            e->bg_tail = NULL;
        j->next = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    return j;
}

void *kvc_engine_background_main(void *arg)
{
    kvc_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->prep_head && !e->stop)
            pthread_cond_wait(&e->bg_cv, &e->mu);
        if (e->stop)
            break;
        bg_job *j = e->prep_head;
        e->prep_head = j->next;
        if (!e->prep_head)
            e->prep_tail = NULL;
        j->next = NULL;
        pthread_mutex_unlock(&e->mu);

        kvc_err err = { 0 };
        int rc = kvc_prompt_next_turn(e->model, e->tmpl, j->messages, j->n_messages, &j->chat,
                                      NULL, &j->toks, &err);
        kvc_messages_free(j->messages, j->n_messages);
        j->messages = NULL;
        j->n_messages = 0;

        pthread_mutex_lock(&e->mu);
        if (rc || j->toks.n == 0) {
            e->m.bg_pending--;
            pthread_mutex_unlock(&e->mu);
            kvc_bg_job_free(j);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        if (e->bg_tail)
            e->bg_tail->next = j;
        else
            e->bg_head = j;
        e->bg_tail = j;
        pthread_cond_signal(&e->cv);
    }
    /* stopping: what was not canonicalized is dropped */
    bg_job *left = e->prep_head;
    e->prep_head = e->prep_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    while (left) {
        bg_job *nx = left->next;
        kvc_bg_job_free(left);
        left = nx;
    }
    return NULL;
}
