/* fuzz_template.c - libFuzzer target for the Jinja engine: templates and
 * message values.
 *
 * Input: the first byte picks a mode, the rest is split at the first 0xFF
 * byte into a template and a message text.
 *   - mode even: the template part is compiled and rendered with a fixed
 *     conversation whose content is the message text (tools, a tool call);
 *   - mode odd: one of a few real-shaped templates (built in here) renders
 *     the message text as content, as a name and inside a tool call.
 * Small limits (output, memory, iterations, call depth) make hostile
 * templates end quickly. Properties checked (abort on violation): a failure
 * leaves an error message and no output; a success gives sorted, disjoint
 * ranges inside the text; with a built-in template the message text appears
 * in the output inside a marked range (content never counts as template). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

static const char *const templates[] = {
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]"
    "{% elif m.tool_calls %}{{ m.tool_calls | tojson }}{% else %}{{ m.content }}{{ eos_token }}{% endif %}"
    "{% endfor %}",
    "{%- set ns = namespace(t='') -%}{%- for m in messages -%}{%- set ns.t = ns.t ~ m.content -%}"
    "{%- endfor -%}<x>{{ ns.t }}</x>{{ messages[0].content.split('\\n') | join('|') }}",
};

/* a JSON string literal of s[0, n) */
static char *json_str(const char *s, size_t n)
{
    char *o = malloc(6 * n + 3), *w = o;
    *w++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { *w++ = '\\'; *w++ = (char)c; }
        else if (c < 0x20) w += sprintf(w, "\\u%04x", c);
        else *w++ = (char)c;
    }
    *w++ = '"';
    *w = 0;
    return o;
}

static void check_output(const jinja_output *o, int rc, const kvc_err *err)
{
    if (rc != KVC_OK) {
        if (o->text || o->marked || !err->msg[0])
            abort();
        return;
    }
    if (!o->text)
        abort();
    for (size_t i = 0; i < o->n_marked; i++) {
        if (!o->marked[i].len || o->marked[i].off + o->marked[i].len > o->len)
            abort();
        if (i && o->marked[i].off <= o->marked[i - 1].off + o->marked[i - 1].len)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size < 1 || size > 1 << 16)
        return 0;
    int mode = data[0];
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    const char *sep = memchr(p, 0xFF, n);
    size_t tn = sep ? (size_t)(sep - p) : n;
    const char *msg = sep ? sep + 1 : "";
    size_t mn = sep ? n - tn - 1 : 0;

    char *content = json_str(msg, mn);
    size_t dl = strlen(content) * 3 + 512;
    char *vars = malloc(dl);
    snprintf(vars, dl,
             "{\"messages\": [{\"role\": \"user\", \"content\": %s, \"name\": %s},"
             " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\","
             " \"function\": {\"name\": \"f\", \"arguments\": {\"q\": %s, \"n\": 1.5}}}]},"
             " {\"role\": \"tool\", \"content\": \"r\"}], \"tools\": [{\"type\": \"function\","
             " \"function\": {\"name\": \"f\"}}], \"enable_thinking\": true}",
             content, content, content);
    const char *trusted = "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true}";
    jinja_limits lim = { .max_output = 1 << 20, .max_memory = 64 << 20, .max_iterations = 100000,
                         .max_call_depth = 16, .now = 1700000000 };

    const char *src = mode % 2 ? templates[(mode / 2) % 3] : p;
    size_t src_len = mode % 2 ? strlen(src) : tn;
    jinja_template *t = NULL;
    kvc_err err = { 0 };
    int rc = jinja_compile(src, src_len, &t, &err);
    if (rc != KVC_OK) {
        if (t || !err.msg[0])
            abort();
    } else {
        jinja_output o = { 0 };
        rc = jinja_render(t, vars, trusted, &lim, &o, &err);
        check_output(&o, rc, &err);
        if (mode % 2 && rc == KVC_OK && (mode / 2) % 3 == 0 && mn) {
            /* ChatML: the message text follows "<|im_start|>user\n", all of it marked */
            const size_t off = strlen("<|im_start|>user\n");
            bool marked = false;
            for (size_t i = 0; i < o.n_marked; i++)
                marked |= o.marked[i].off <= off && off + mn <= o.marked[i].off + o.marked[i].len;
            if (o.len < off + mn || memcmp(o.text + off, msg, mn) || !marked)
                abort();
        }
        jinja_output_free(&o);
        jinja_template_free(t);
    }
    free(vars);
    free(content);
    return 0;
}
