/* tool_calls.c - tool-call formats: the table of formats and what goes
 * through it (detection, parsing, hold-back, forcing grammars; tool_calls.h),
 * and the rows of the JSON formats: Hermes, Llama 3, Mistral, harmony.
 * Qwen3-Coder's XML row is in tool_calls_xml.c. */
#include "tool_calls_internal.h"
#include "grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- detection */

int kvc_tool_format_detect(const kvc_chat_template *t)
{
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"probe_fn\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}]";
    kvc_chat_message m[3] = {
        { .role = "user", .content = "q" },
        { .role = "assistant", .content = "",
          .tool_calls_json = "[{\"id\":\"call_probe0000\",\"type\":\"function\",\"function\":"
                             "{\"name\":\"probe_fn\",\"arguments\":\"{\\\"a\\\":1}\"}}]" },
        { .role = "tool", .content = "1", .tool_call_id = "call_probe0000", .name = "probe_fn" },
    };
    kvc_rendered r = { 0 };
    kvc_err err = { 0 };
    int f = KVC_TOOLS_HERMES;
    if (kvc_chat_template_apply(t, m, 3, tools, NULL, true, &r, &err) == KVC_OK && r.text) {
        const char *call = strstr(r.text, "probe_fn\"");
        const char *last = NULL;
        for (const char *p = r.text; (p = strstr(p, "probe_fn")); p++)
            last = p;                          /* the call comes after the tool list */
        if (strstr(r.text, "to=functions.probe_fn"))
            f = KVC_TOOLS_HARMONY;
        else if (strstr(r.text, "<function=probe_fn>"))
            f = KVC_TOOLS_QWEN_XML;
        else if (strstr(r.text, "[TOOL_CALLS]"))
            f = KVC_TOOLS_MISTRAL;
        else if (strstr(r.text, "<tool_call>"))
            f = KVC_TOOLS_HERMES;
        else if (call && last && strstr(last, "\"parameters\""))
            f = KVC_TOOLS_LLAMA3;
    }
    kvc_rendered_free(&r);
    return f;
}


/* ---------------------------------------------------------------- parsing */

void kvc_tool_call_add(cJSON *calls, const char *id, const char *name, const char *args)
{
    cJSON *c = cJSON_CreateObject(), *f;
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddItemToArray(calls, c);
}

bool tc_add_call(cJSON *arr, const cJSON *o, const char *args_key, uint64_t seed)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, args_key);
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(o, args_key[0] == 'a' ? "parameters" : "arguments");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name))
        return false;
    char id[48];
    uint64_t h = seed * 0x9E3779B97F4A7C15ull + (uint64_t)cJSON_GetArraySize(arr) + 1;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    snprintf(id, sizeof(id), "call_%016llx%08x", (unsigned long long)h,
             (unsigned)(seed ^ (seed >> 32)));
    char *a = args ? cJSON_PrintUnformatted(args) : strdup("{}");
    if (args && cJSON_IsString(args)) {      /* arguments already given as text */
        free(a);
        a = strdup(args->valuestring);
    }
    kvc_tool_call_add(arr, id, name->valuestring, a ? a : "{}");
    free(a);
    return true;
}

/* A JSON value at text[0, len) (after spaces): parsed, *used the bytes it took. */
static cJSON *json_at(const char *text, size_t len, size_t *used)
{
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", text[i]))
        i++;
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(text + i, len - i, &end, false);
    *used = v && end ? (size_t)(end - text) : 0;
    return v;
}

void tc_trim(const char **s, size_t *n)
{
    while (*n && strchr(" \t\r\n", **s))
        (*s)++, (*n)--;
    while (*n && strchr(" \t\r\n", (*s)[*n - 1]))
        (*n)--;
}

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n, bool *oom)
{
    kvc_text_append(buf, len, cap, oom, s, n);
}

/* Hermes: <tool_call>JSON</tool_call> blocks, content around them. */
static void parse_hermes(const char *r, size_t len, const cJSON *tools, cJSON *arr,
                         uint64_t seed, char **content, size_t *clen, size_t *ccap, bool *oom)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    size_t at = 0;
    while (at < len) {
        const char *o = memmem(r + at, len - at, open, sizeof(open) - 1);
        size_t upto = o ? (size_t)(o - r) : len;
        append(content, clen, ccap, r + at, upto - at, oom);
        if (!o)
            break;
        size_t body = upto + sizeof(open) - 1, used = 0;
        cJSON *v = json_at(r + body, len - body, &used);
        bool ok = v && tc_add_call(arr, v, "arguments", seed);
        cJSON_Delete(v);
        const char *c = memmem(r + body, len - body, close, sizeof(close) - 1);
        if (!ok) {                          /* not a call: keep it as text */
            size_t to = c ? (size_t)(c - r) + sizeof(close) - 1 : len;
            append(content, clen, ccap, r + upto, to - upto, oom);
            at = to;
            continue;
        }
        at = c ? (size_t)(c - r) + sizeof(close) - 1 : body + used;
    }
}

/* A list of calls: JSON objects separated by ";" / "," / spaces, or one
 * array of them. Returns whether the whole text was calls. */
static bool parse_list(const char *r, size_t len, const char *args_key, cJSON *arr, uint64_t seed)
{
    size_t at = 0;
    while (at < len) {
        while (at < len && strchr(" \t\r\n;,", r[at]))
            at++;
        if (at == len)
            break;
        size_t used = 0;
        cJSON *v = json_at(r + at, len - at, &used);
        bool ok = v != NULL;
        if (cJSON_IsArray(v)) {
            const cJSON *x;
            cJSON_ArrayForEach(x, v) ok = ok && tc_add_call(arr, x, args_key, seed);
        } else {
            ok = ok && tc_add_call(arr, v, args_key, seed);
        }
        cJSON_Delete(v);
        if (!ok)
            return false;
        at += used;
    }
    return cJSON_GetArraySize(arr) > 0;
}

/* Mistral's newer form: [TOOL_CALLS]name[ARGS]{...} repeated. */
static bool parse_mistral_args(const char *r, size_t len, cJSON *arr, uint64_t seed)
{
    static const char tc[] = "[TOOL_CALLS]", ar[] = "[ARGS]";
    size_t at = 0;
    while (at < len) {
        if (len - at < sizeof(tc) - 1 || memcmp(r + at, tc, sizeof(tc) - 1))
            return false;
        at += sizeof(tc) - 1;
        const char *a = memmem(r + at, len - at, ar, sizeof(ar) - 1);
        if (!a)
            return false;
        size_t nl = (size_t)(a - (r + at)), used = 0, body = (size_t)(a - r) + sizeof(ar) - 1;
        cJSON *args = json_at(r + body, len - body, &used);
        cJSON *o = cJSON_CreateObject();
        char *name = strndup(r + at, nl);
        cJSON_AddStringToObject(o, "name", name ? name : "");
        free(name);
        if (args)
            cJSON_AddItemToObject(o, "arguments", args);
        bool ok = args && tc_add_call(arr, o, "arguments", seed);
        cJSON_Delete(o);
        if (!ok)
            return false;
        at = body + used;
        while (at < len && strchr(" \t\r\n", r[at]))
            at++;
    }
    return true;
}

/* Llama 3: the whole reply (after an optional <|python_tag|>) is calls,
 * else none; no content beside them. */
static void parse_llama3(const char *r, size_t len, const cJSON *tools, cJSON *arr,
                         uint64_t seed, char **content, size_t *clen, size_t *ccap, bool *oom)
{
    static const char tag[] = "<|python_tag|>";
    if (len >= sizeof(tag) - 1 && !memcmp(r, tag, sizeof(tag) - 1))
        r += sizeof(tag) - 1, len -= sizeof(tag) - 1;
    if (!len || r[0] != '{' || !parse_list(r, len, "parameters", arr, seed))
        while (cJSON_GetArraySize(arr) > 0)
            cJSON_DeleteItemFromArray(arr, 0);
}

/* Mistral: [TOOL_CALLS] then a list of calls, or the name[ARGS]{...}
 * form; the text before it is content. All calls or none. */
static void parse_mistral(const char *r, size_t len, const cJSON *tools, cJSON *arr,
                          uint64_t seed, char **content, size_t *clen, size_t *ccap, bool *oom)
{
    const char *m = memmem(r, len, "[TOOL_CALLS]", 12);
    size_t pre = m ? (size_t)(m - r) : len;
    bool ok = m && (len - pre > 12 && (m[12] == '[' || m[12] == '{' || m[12] == ' ')
                        ? parse_list(m + 12, len - pre - 12, "arguments", arr, seed)
                        : parse_mistral_args(m, len - pre, arr, seed));
    if (ok)
        append(content, clen, ccap, r, pre, oom);
    else
        while (cJSON_GetArraySize(arr) > 0)
            cJSON_DeleteItemFromArray(arr, 0);
}

/* Where the last tag in r[from, upto) begins; upto when none. */
static size_t last_before(const char *r, size_t upto, const char *tag, size_t from)
{
    size_t n = strlen(tag), found = upto;
    for (size_t i = from; i + n <= upto; i++)
        if (!memcmp(r + i, tag, n))
            found = i;
    return found;
}

/* Harmony: every message addressed "to=functions.NAME", its arguments the
 * text after its <|message|> up to <|call|> (or the next message); the
 * text before the first call's message is content. */
static void parse_harmony(const char *r, size_t len, const cJSON *tools, cJSON *arr,
                          uint64_t seed, char **content, size_t *clen, size_t *ccap, bool *oom)
{
    static const char to[] = "to=functions.", msg[] = "<|message|>";
    size_t at = 0, first = len;
    const char *t;
    while (at < len && (t = memmem(r + at, len - at, to, sizeof(to) - 1))) {
        size_t name = (size_t)(t - r) + sizeof(to) - 1, ne = name;
        while (ne < len && !strchr(" \t\r\n<", r[ne]))
            ne++;
        const char *m = memmem(r + ne, len - ne, msg, sizeof(msg) - 1);
        if (!m || ne == name)
            break;
        size_t a = (size_t)(m - r) + sizeof(msg) - 1, ae = len;
        static const char *const ends[] = { "<|call|>", "<|end|>", "<|start|>" };
        for (size_t k = 0; k < 3; k++) {
            const char *e = memmem(r + a, len - a, ends[k], strlen(ends[k]));
            if (e && (size_t)(e - r) < ae)
                ae = (size_t)(e - r);
        }
        size_t used = 0;
        cJSON *args = json_at(r + a, ae - a, &used);
        if (args) {
            cJSON *o = cJSON_CreateObject();
            char *nm = strndup(r + name, ne - name);
            *oom = *oom || !nm;
            cJSON_AddStringToObject(o, "name", nm ? nm : "");
            free(nm);
            cJSON_AddItemToObject(o, "arguments", args);
            if (tc_add_call(arr, o, "arguments", seed) && first == len) {
                /* the call's message begins at its <|start|>, else its <|channel|> */
                size_t to_at = (size_t)(t - r), end = last_before(r, to_at, "<|end|>", 0);
                end = end == to_at ? 0 : end;
                size_t st = last_before(r, to_at, "<|start|>", end), ch = last_before(r, to_at,
                                                                                 "<|channel|>", end);
                first = st < to_at ? st : ch < to_at ? ch : to_at;
            }
            cJSON_Delete(o);
        }
        at = ae;
    }
    append(content, clen, ccap, r, first, oom);
}

/* ---------------------------------------------------------------- streaming */

size_t tc_mark_holdback(const char *text, size_t len, const char *mark)
{
    size_t ml = strlen(mark);
    if (memmem(text, len, mark, ml))
        return len;
    for (size_t k = KVC_MIN(ml - 1, len); k > 0; k--)
        if (!memcmp(text + len - k, mark, k))
            return k;
    return 0;
}

static size_t holdback_hermes(const char *text, size_t len)
{
    return tc_mark_holdback(text, len, "<tool_call>");
}

/* a reply that starts as JSON may be a call */
static size_t holdback_llama3(const char *text, size_t len)
{
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", text[i]))
        i++;
    return i == len || text[i] == '{' ? len : tc_mark_holdback(text, len, "<|python_tag|>");
}

static size_t holdback_mistral(const char *text, size_t len)
{
    return tc_mark_holdback(text, len, "[TOOL_CALLS]");
}

static size_t holdback_harmony(const char *text, size_t len)
{
    return tc_mark_holdback(text, len, "to=functions.");
}

/* ---------------------------------------------------------------- forcing */

/* Rebase the local $refs of schema node n ("#", "#/$defs/x", ...), written
 * against the parameters' own root, onto `base` ("#/properties/arguments"),
 * where call_rules embeds the parameters. Values (const, enum, default,
 * examples) are data, not schemas: left as they are. False when out of memory. */
static bool rebase_refs(cJSON *n, const char *base)
{
    for (cJSON *k = n ? n->child : NULL; k; k = k->next) {
        if (k->string && (!strcmp(k->string, "const") || !strcmp(k->string, "enum") ||
                          !strcmp(k->string, "default") || !strcmp(k->string, "examples")))
            continue;
        if (k->string && !strcmp(k->string, "$ref") && cJSON_IsString(k) &&
            k->valuestring[0] == '#') {
            size_t len = strlen(base) + strlen(k->valuestring);
            char *ref = malloc(len);
            if (!ref)
                return false;
            snprintf(ref, len, "%s%s", base, k->valuestring + 1);
            bool ok = cJSON_SetValuestring(k, ref) != NULL;
            free(ref);
            if (!ok)
                return false;
        } else if ((cJSON_IsObject(k) || cJSON_IsArray(k)) && !rebase_refs(k, base)) {
            return false;
        }
    }
    return true;
}

/* Rules "call-i" for function i: {"name": its name, key: its parameters}. */
static int call_rules(const cJSON *fn, int i, const char *key, char **out, kvc_err *err)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *sch = cJSON_CreateObject();
    cJSON_AddStringToObject(sch, "type", "object");
    cJSON *props = cJSON_AddObjectToObject(sch, "properties");
    cJSON *nm = cJSON_AddObjectToObject(props, "name");
    cJSON_AddStringToObject(nm, "const", name->valuestring);
    cJSON *pv = params && cJSON_IsObject(params) ? cJSON_Duplicate(params, true)
                                                  : cJSON_Parse("{\"type\":\"object\"}");
    cJSON_AddItemToObject(props, key, pv);
    char base[48];
    snprintf(base, sizeof(base), "#/properties/%s", key);
    if (!rebase_refs(pv, base)) {
        cJSON_Delete(sch);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    }
    cJSON *req = cJSON_AddArrayToObject(sch, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(key));
    cJSON_AddFalseToObject(sch, "additionalProperties");
    char *text = cJSON_PrintUnformatted(sch);
    cJSON_Delete(sch);
    if (!text)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    char root[32], prefix[32];
    snprintf(root, sizeof(root), "call-%d", i);
    snprintf(prefix, sizeof(prefix), "f%d-", i);
    kvc_schema_opts o = { .root = root, .prefix = prefix };
    int rc = kvc_schema_to_gbnf(text, strlen(text), &o, out, err);
    free(text);
    if (rc) {
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        return kvc_fail(err, rc, "tools: function '%.80s': %.400s", name->valuestring, msg);
    }
    return KVC_OK;
}

/* Harmony's rules for function fn (the i-th): "args-i", its parameters as
 * JSON, and in *alt the call's message with them:
 *   "<|channel|>commentary to=functions.f <|constrain|>json<|message|>" args-i
 * The markup is spelled as text: a gpt-oss vocabulary has it as whole
 * tokens in the grammar's trie (kvc_tokenizer_is_markup). */
static int harmony_rules(const cJSON *fn, int i, char **out, char *alt, size_t cap, kvc_err *err)
{
    const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (!*name || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
                      != strlen(name))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "tools: function name '%.80s' cannot be "
                        "addressed in harmony (letters, digits, _ - . only)", name);
    char *text = params && cJSON_IsObject(params) ? cJSON_PrintUnformatted(params)
                                                  : strdup("{\"type\":\"object\"}");
    char root[32], prefix[32];
    snprintf(root, sizeof(root), "args-%d", i);
    snprintf(prefix, sizeof(prefix), "f%d-", i);
    kvc_schema_opts o = { .root = root, .prefix = prefix };
    int rc = text ? kvc_schema_to_gbnf(text, strlen(text), &o, out, err)
                  : kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    free(text);
    if (rc) {
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        return kvc_fail(err, rc, "tools: function '%.80s': %.400s", name, msg);
    }
    snprintf(alt, cap, "\"<|channel|>commentary to=functions.%.120s <|constrain|>json<|message|>\" %s",
             name, root);
    return KVC_OK;
}
static int rules_hermes(const cJSON *fn, int i, char **out, char *alt, size_t cap, kvc_err *err)
{
    snprintf(alt, cap, "call-%d", i);
    return call_rules(fn, i, "arguments", out, err);
}

static int rules_llama3(const cJSON *fn, int i, char **out, char *alt, size_t cap, kvc_err *err)
{
    snprintf(alt, cap, "call-%d", i);
    return call_rules(fn, i, "parameters", out, err);
}

/* ---------------------------------------------------------------- the table */

static const tc_format tc_hermes = {
    .name = "hermes",
    .parse = parse_hermes,
    .holdback = holdback_hermes,
    .rules = rules_hermes,
    .root_one = "root ::= tc\n"
                "tc ::= \"<tool_call>\\n\" calls \"\\n</tool_call>\"\n",
    .root_parallel = "root ::= tc ( \"\\n\" tc ){0,7}\n"
                     "tc ::= \"<tool_call>\\n\" calls \"\\n</tool_call>\"\n",
};

static const tc_format tc_llama3 = {
    .name = "llama3-json",
    .parse = parse_llama3,
    .holdback = holdback_llama3,
    .rules = rules_llama3,
    .root_one = "root ::= calls\n",
    .root_parallel = "root ::= calls ( \"; \" calls ){0,7}\n",
};

static const tc_format tc_mistral = {
    .name = "mistral",
    .parse = parse_mistral,
    .holdback = holdback_mistral,
    .rules = rules_hermes,
    .root_one = "root ::= \"[TOOL_CALLS][\" calls \"]\"\n",
    .root_parallel = "root ::= \"[TOOL_CALLS][\" calls ( \", \" calls ){0,7} \"]\"\n",
};

static const tc_format tc_harmony = {    /* one call: <|call|> ends the reply */
    .name = "harmony",
    .parse = parse_harmony,
    .holdback = holdback_harmony,
    .rules = harmony_rules,
    .root_one = "root ::= calls\n",
    .root_parallel = "root ::= calls\n",
};

/* Indexed by enum kvc_tool_format. */
static const tc_format *const formats[] = {
    [KVC_TOOLS_HERMES] = &tc_hermes,   [KVC_TOOLS_LLAMA3] = &tc_llama3,
    [KVC_TOOLS_MISTRAL] = &tc_mistral, [KVC_TOOLS_HARMONY] = &tc_harmony,
    [KVC_TOOLS_QWEN_XML] = &tc_qwen_xml,
};
#define N_FORMATS ((int)(sizeof(formats) / sizeof(*formats)))

/* The row of format f; Hermes' for a number that is no format. */
static const tc_format *row(int f)
{
    return f >= 0 && f < N_FORMATS ? formats[f] : &tc_hermes;
}

const char *kvc_tool_format_name(int f)
{
    return row(f)->name;
}

int kvc_tool_format_from_name(const char *name)
{
    for (int i = 0; i < N_FORMATS; i++)
        if (!strcmp(name, formats[i]->name))
            return i;
    return -1;
}

/* ---------------------------------------------------------------- through the table */

int kvc_tool_calls_parse(int format, const char *reply, size_t len, const char *tools_json,
                         uint64_t id_seed, int max_calls, char **calls_json, char **content)
{
    *calls_json = *content = NULL;
    const tc_format *f = row(format);
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return KVC_ERR_NOMEM;
    char *text = NULL;
    size_t tl = 0, tc = 0;
    bool oom = false;
    const char *r = reply;
    size_t n = len;
    tc_trim(&r, &n);
    cJSON *tools = f->typed && tools_json ? cJSON_Parse(tools_json) : NULL;
    f->parse(r, n, tools, arr, id_seed, &text, &tl, &tc, &oom);
    cJSON_Delete(tools);
    int rc = KVC_OK;
    while (max_calls > 0 && cJSON_GetArraySize(arr) > max_calls)
        cJSON_DeleteItemFromArray(arr, cJSON_GetArraySize(arr) - 1);
    if (cJSON_GetArraySize(arr) > 0 && !oom) {
        *calls_json = cJSON_PrintUnformatted(arr);
        const char *c = text ? text : "";
        size_t cl = tl;
        tc_trim(&c, &cl);
        *content = strndup(c, cl);
        if (!*calls_json || !*content) {
            free(*calls_json);
            free(*content);
            *calls_json = *content = NULL;
            rc = KVC_ERR_NOMEM;
        }
    } else if (oom) {
        rc = KVC_ERR_NOMEM;
    }
    free(text);
    cJSON_Delete(arr);
    return rc;
}

size_t kvc_tool_calls_holdback(int format, const char *text, size_t len)
{
    return row(format)->holdback(text, len);
}

/* That a call to function `name` (expression call over rules, with the
 * format's shared rules) can be written at all: a schema may allow no
 * finite JSON (a required property whose schema is its own object), and
 * the grammar would then fail to parse later with a message about a rule
 * the client never wrote. KVC_ERR_INVALID_ARG naming the function. */
static int check_call(const tc_format *f, const char *name, const char *call, const char *rules,
                      kvc_err *err)
{
    char *g = NULL;
    size_t l = 0, c = 0;
    bool oom = false;
    kvc_text_append(&g, &l, &c, &oom, "root ::= ", 9);
    kvc_text_append(&g, &l, &c, &oom, call, strlen(call));
    kvc_text_append(&g, &l, &c, &oom, "\n", 1);
    kvc_text_append(&g, &l, &c, &oom, rules, strlen(rules));
    if (f->shared_rules)
        f->shared_rules(&g, &l, &c, &oom);
    kvc_err ge = { 0 };
    kvc_grammar *gr = NULL;
    int rc = oom ? KVC_ERR_NOMEM : kvc_grammar_parse(g, l, &gr, &ge);
    kvc_grammar_free(gr);
    free(g);
    if (rc == KVC_ERR_NOMEM)
        return kvc_fail(err, rc, "out of memory");
    return rc ? kvc_fail(err, KVC_ERR_INVALID_ARG, "tools: function '%.80s': no call can "
                         "follow its parameters' schema (%.300s)", name, ge.msg)
              : KVC_OK;
}

int kvc_tool_calls_grammar(int format, const char *tools_json, const char *only, bool parallel,
                           char **out, kvc_err *err)
{
    *out = NULL;
    const tc_format *f = row(format);
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (!cJSON_IsArray(tools)) {
        cJSON_Delete(tools);
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "tools must be a non-empty array");
    }
    char *g = NULL, *alts = NULL;
    size_t gl = 0, gc = 0, al = 0, ac = 0;
    bool oom = false;
    int rc = KVC_OK, n = 0, i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        i++;
        if (!cJSON_IsString(name) || (only && strcmp(only, name->valuestring)))
            continue;
        char *rules = NULL, call[224];
        if ((rc = f->rules(fn, i, &rules, call, sizeof(call), err)) ||
            (rc = check_call(f, name->valuestring, call, rules, err))) {
            free(rules);
            break;
        }
        kvc_text_append(&g, &gl, &gc, &oom, rules, strlen(rules));
        kvc_text_append(&g, &gl, &gc, &oom, "\n", 1);
        if (n)
            kvc_text_append(&alts, &al, &ac, &oom, " | ", 3);
        kvc_text_append(&alts, &al, &ac, &oom, call, strlen(call));
        free(rules);
        n++;
    }
    cJSON_Delete(tools);
    if (!rc && !n)
        rc = only ? kvc_fail(err, KVC_ERR_INVALID_ARG, "tool_choice names function '%.80s', "
                             "which is not in tools", only)
                  : kvc_fail(err, KVC_ERR_INVALID_ARG, "tools has no function");
    if (!rc) {
        const char *head = parallel ? f->root_parallel : f->root_one;
        char *all = NULL;
        size_t ll = 0, lc = 0;
        kvc_text_append(&all, &ll, &lc, &oom, head, strlen(head));
        kvc_text_append(&all, &ll, &lc, &oom, "calls ::= ", 10);
        kvc_text_append(&all, &ll, &lc, &oom, alts, al);
        kvc_text_append(&all, &ll, &lc, &oom, "\n", 1);
        kvc_text_append(&all, &ll, &lc, &oom, g, gl);
        if (f->shared_rules)
            f->shared_rules(&all, &ll, &lc, &oom);
        if (oom)
            free(all), rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
        else
            *out = all;
    }
    free(g);
    free(alts);
    return rc;
}
