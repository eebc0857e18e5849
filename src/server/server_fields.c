/* server_fields.c - the field policy (issue 28): what a request field does.
 *
 *   used     the field is honoured;
 *   ignored  a hint or bookkeeping (metadata, store, return_progress, ...):
 *            accepted and not used, logged once per name and named in the
 *            answer's X-Kvchat-Ignored-Fields header;
 *   refused  it would change the answer and kvchat cannot do what it asks:
 *            a 400 naming it, unless its value is the one that changes
 *            nothing (ignore_eos false, typical_p 1, mirostat 0, ...).
 * A field no table names is ignored like a hint (as vLLM, Ollama and
 * llama-server treat fields they do not know). With --strict-fields
 * (srv_limits.strict_fields) every field not used is a 400 but the three
 * OpenAI bookkeeping fields, as before the policy.
 *
 * Each dialect has its own table (its request's fields); the extensions of
 * llama.cpp, vLLM and Ollama that clients send to any OpenAI-shaped server
 * are one table shared by all. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "server.h"

#define USED(n)          { n, SRV_FIELD_USED, NULL }
#define IGNORED(n)       { n, SRV_FIELD_IGNORED, NULL }
#define REFUSED(n, noop) { n, SRV_FIELD_REFUSED, noop }
#define END              { NULL, 0, NULL }

/* The fields of llama.cpp's, vLLM's and Ollama's requests, and the hints
 * every OpenAI API carries, on every route. */
static const srv_field extensions[] = {
    /* honoured: llama.cpp's and vLLM's */
    USED("repetition_penalty"), USED("n_predict"), USED("cache_prompt"), USED("grammar"),
    USED("json_schema"), USED("guided_json"), USED("reasoning_format"), USED("enable_thinking"),
    USED("reasoning_effort"), USED("chat_template_kwargs"), USED("cache_salt"),
    USED("top_k"), USED("min_p"), USED("repeat_penalty"), USED("repeat_last_n"),
    USED("seed"), USED("prompt_cache_key"),
    /* hints and bookkeeping */
    USED("user"), IGNORED("store"), IGNORED("metadata"), IGNORED("service_tier"),
    IGNORED("safety_identifier"), IGNORED("prediction"), IGNORED("verbosity"),
    IGNORED("return_progress"), IGNORED("timings_per_token"), IGNORED("return_tokens"),
    IGNORED("post_sampling_probs"), IGNORED("n_probs"), IGNORED("id_slot"),
    IGNORED("slot_id"), IGNORED("n_keep"), IGNORED("t_max_predict_ms"),
    IGNORED("response_fields"), IGNORED("thinking_forced_open"), IGNORED("parse_tool_calls"),
    IGNORED("verbose"), IGNORED("samplers"), IGNORED("min_keep"),
    IGNORED("spaces_between_special_tokens"), IGNORED("mirostat_tau"),
    IGNORED("mirostat_eta"), IGNORED("dynatemp_exponent"), IGNORED("xtc_threshold"),
    IGNORED("dry_base"), IGNORED("dry_allowed_length"), IGNORED("dry_penalty_last_n"),
    IGNORED("dry_sequence_breakers"), IGNORED("guided_decoding_backend"),
    IGNORED("keep_alive"), IGNORED("add_special"), IGNORED("truncate_prompt_tokens"),
    IGNORED("priority"), IGNORED("request_id"),
    /* would change the answer: refused unless at the value that does nothing */
    REFUSED("ignore_eos", "false"), REFUSED("min_tokens", "0"),
    REFUSED("stop_token_ids", "[]"), REFUSED("include_stop_str_in_output", "false"),
    REFUSED("skip_special_tokens", "true"), REFUSED("typical_p", "1"),
    REFUSED("tfs_z", "1"), REFUSED("mirostat", "0"), REFUSED("dynatemp_range", "0"),
    REFUSED("xtc_probability", "0"), REFUSED("dry_multiplier", "0"),
    REFUSED("top_n_sigma", "-1"), REFUSED("n_indent", "0"), REFUSED("lora", "[]"),
    REFUSED("continue_final_message", "false"), REFUSED("add_generation_prompt", "true"),
    REFUSED("guided_regex", NULL), REFUSED("guided_choice", NULL),
    REFUSED("guided_grammar", NULL), REFUSED("structured_outputs", NULL),
    REFUSED("chat_template", NULL), REFUSED("modalities", "[\"text\"]"),
    REFUSED("audio", NULL), REFUSED("web_search_options", NULL),
    REFUSED("functions", NULL), REFUSED("function_call", NULL), REFUSED("options", NULL),
    REFUSED("format", NULL), REFUSED("images", NULL),
    END,
};

const srv_field srv_fields_chat[] = {
    USED("messages"), USED("model"), USED("max_tokens"), USED("max_completion_tokens"),
    USED("n"), USED("temperature"), USED("top_p"), USED("presence_penalty"),
    USED("frequency_penalty"), USED("stop"), USED("stream"), USED("stream_options"),
    USED("tools"), USED("tool_choice"), USED("parallel_tool_calls"), USED("response_format"),
    USED("logit_bias"), USED("logprobs"), USED("top_logprobs"),
    END,
};

const srv_field srv_fields_completions[] = {
    USED("prompt"), USED("model"), USED("max_tokens"), USED("n"), USED("temperature"),
    USED("top_p"), USED("presence_penalty"), USED("frequency_penalty"), USED("stop"),
    USED("stream"), USED("stream_options"), USED("logit_bias"), USED("logprobs"),
    REFUSED("echo", "false"), REFUSED("best_of", "1"), REFUSED("suffix", "\"\""),
    END,
};

const srv_field srv_fields_responses[] = {
    USED("model"), USED("input"), USED("instructions"), USED("max_output_tokens"),
    USED("temperature"), USED("top_p"), USED("stream"), USED("tools"), USED("tool_choice"),
    USED("parallel_tool_calls"), USED("text"), USED("reasoning"), USED("stop"),
    USED("presence_penalty"), USED("frequency_penalty"), USED("logit_bias"),
    IGNORED("include"), IGNORED("truncation"), IGNORED("max_tool_calls"),
    IGNORED("top_logprobs"), IGNORED("stream_options"),
    USED("previous_response_id"), USED("conversation"), USED("background"), /* refused
                                         there, with what to do instead */
    REFUSED("prompt", NULL),
    END,
};

const srv_field srv_fields_messages[] = {
    USED("model"), USED("messages"), USED("system"), USED("max_tokens"), USED("temperature"),
    USED("top_p"), USED("stream"), USED("stop_sequences"), USED("tools"), USED("tool_choice"),
    USED("thinking"), USED("metadata"), USED("presence_penalty"), USED("frequency_penalty"),
    IGNORED("anthropic_version"), IGNORED("container"), IGNORED("context_management"),
    IGNORED("cache_control"), REFUSED("mcp_servers", "[]"),
    END,
};

/* The policy row of name: the dialect's, else the extensions'; NULL = none. */
static const srv_field *find(const srv_field *table, const char *name)
{
    for (const srv_field *f = table; f && f->name; f++)
        if (!strcmp(f->name, name))
            return f;
    for (const srv_field *f = extensions; f->name; f++)
        if (!strcmp(f->name, name))
            return f;
    return NULL;
}

int srv_field_use(const srv_field *table, const char *name)
{
    const srv_field *f = find(table, name);
    return f ? f->use : -1;
}

/* Whether v is the value of a refused field that changes nothing. */
static bool is_noop(const srv_field *f, const cJSON *v)
{
    if (!f->noop)
        return false;
    cJSON *n = cJSON_Parse(f->noop);
    bool same = n && cJSON_Compare(v, n, true);
    cJSON_Delete(n);
    return same;
}

/* (server.h) Names that do not fit are left out of the header; the log has
 * them. */
void srv_note_ignored(srv_request *r, const char *name)
{
    size_t n = strlen(r->ignored), k = strlen(name);
    if (n + k + 3 < sizeof(r->ignored))
        snprintf(r->ignored + n, sizeof(r->ignored) - n, "%s%s", n ? ", " : "", name);
}

int srv_fields_check(srv_request *r, const void *root_json, const srv_field *table,
                     const srv_limits *lim, srv_error *e)
{
    const cJSON *v;
    cJSON_ArrayForEach(v, (const cJSON *)root_json) {
        const srv_field *f = find(table, v->string);
        bool bookkeeping = f && (!strcmp(f->name, "store") || !strcmp(f->name, "metadata") ||
                                 !strcmp(f->name, "service_tier"));
        if (f && f->use == SRV_FIELD_USED)
            continue;
        if (cJSON_IsNull(v))                     /* null: the same as absent */
            continue;
        if (f && f->use == SRV_FIELD_REFUSED && is_noop(f, v))
            continue;                            /* it asks what kvchat does anyway */
        if (f && f->use == SRV_FIELD_REFUSED) {
            if (f->noop)
                return srv_error_set(e, 400, "invalid_request_error", f->name, NULL,
                                     "%s is not supported: kvchat cannot do what it asks, which "
                                     "would change the answer (only %s is accepted)", f->name,
                                     f->noop);
            return srv_error_set(e, 400, "invalid_request_error", f->name, NULL,
                                 "%s is not supported: kvchat cannot do what it asks, which "
                                 "would change the answer", f->name);
        }
        if (lim->strict_fields && !bookkeeping)
            return srv_error_set(e, 400, "invalid_request_error", v->string, NULL,
                                 "%s field '%.60s': kvchat does not use it (--strict-fields)",
                                 f ? "ignored" : "unknown", v->string);
        if (bookkeeping)
            continue;                            /* OpenAI's own: nothing to tell */
        srv_note_ignored(r, v->string);
        if (lim->log_ignored)
            lim->log_ignored(v->string, lim->log_user);
    }
    return 0;
}
