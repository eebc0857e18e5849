/* session.h - what the engine needs of a session beyond the public API. */
#ifndef KVC_SESSION_H
#define KVC_SESSION_H

#include "common.h"

/* Run one turn on prompt text already rendered (chat = true: the chat
 * template's stop strings and reply separator apply; false: a raw completion).
 * t_start: when the request arrived (kvc_time_us), for TTFT. Contract as
 * kvc_session_chat, with the error in *err. */
int kvc_session_run(kvc_session *s, const char *prompt, bool chat, const kvc_chat_params *params,
                    kvc_chat_stream_fn stream, void *user, char **reply, kvc_chat_stats *stats,
                    int64_t t_start, kvc_err *err);

/* The exact text the session's cached tokens stand for (NULL when unknown),
 * and its length. */
const char *kvc_session_text(const kvc_session *s, size_t *len);

/* Render msgs with the session's chat template into a malloc'd string. */
int kvc_session_render(const kvc_session *s, const kvc_chat_message *msgs, size_t n,
                       char **out, kvc_err *err);

#endif
