/* test_jinja.c - the Jinja engine against Python's jinja2 as the reference.
 *
 * Every case is rendered by our engine and by tests/jinja_ref.py (Debian's
 * python3-jinja2 under /usr/bin/python3, in transformers' environment) and
 * must agree byte for byte, or both must fail. Two sets of cases:
 *   - feature templates written here, one or more per construct;
 *   - the corpus: real chat templates read from $KVC_TEMPLATE_DIR, else
 *     ../shared/templates, each rendered for a set of conversations (user;
 *     system + user; multi-turn; a long multi-line reply; tools offered; an
 *     assistant tool call and its result; enable_thinking true and false
 *     where the template reads it). Absent directory: those cases are skipped.
 * Skips (77) when /usr/bin/python3 has no jinja2.
 * Usage: test_jinja [substring]   only corpus templates whose name has it, and
 * print the first difference of each failing case. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jinja.h"
#include "test.h"

#define NOW 1763900000   /* 2025-11-23: strftime_now's clock in both engines */

typedef struct tcase {
    char *name;
    char *tmpl;
    char *data;      /* JSON object text */
    char *trusted;
} tcase;

static tcase *cases;
static size_t n_cases, cap_cases;

static void add_case(const char *name, const char *tmpl, const char *data, const char *trusted)
{
    if (n_cases == cap_cases) {
        cap_cases = cap_cases ? cap_cases * 2 : 256;
        cases = realloc(cases, cap_cases * sizeof(*cases));
    }
    cases[n_cases++] = (tcase){ strdup(name), strdup(tmpl), strdup(data ? data : "{}"),
                                strdup(trusted ? trusted : "{}") };
}

/* ---------------------------------------------------------------- feature templates */

static const char *const features[][2] = {
    /* whitespace control, trim_blocks, lstrip_blocks */
    { "ws1", "a\n  {% if true %}\n    b\n  {% endif %}\nc\n" },
    { "ws2", "a  {%- if true -%}  b  {%- endif -%}  c" },
    { "ws3", "{{ 'x' }}  {% if true %}y{% endif %}\n  {%+ if true %}z{% endif %}" },
    { "ws4", "{# comment #}\n  {# c2 #}\nline\n{{- ' t' }}\n{{ 'u' -}}\n\n v" },
    { "ws5", "a\r\nb\rc{% if true %}\r\nd{% endif %}\n" },
    { "ws6", "  {% set x = 1 %}\n{{ x }}\n\t{%- if x %}y{% endif +%}\nz" },
    /* literals and printing */
    { "lit1", "{{ 1 }} {{ 1.5 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}" },
    { "lit2", "{{ none }} {{ true }} {{ False }} {{ [1, 'a', none, true] }} {{ {'a': 1, 'b': [2]} }} {{ (1,) }} {{ (1, 2) }}" },
    { "lit3", "{{ 'it''s' }} {{ \"a\\tb\\n\" }} {{ 'caf\\u00e9' }} {{ 'x' 'y' }} {{ \"quote's\" | string }} {{ ['it\\'s', \"q\\\"\"] }}" },
    { "lit4", "{{ 1e20 }} {{ 1e-7 }} {{ 123456789.125 }} {{ 3.0 }} {{ 1_000 }} {{ 2.5e-3 }}" },
    /* operators */
    { "op1", "{{ 'a' ~ 1 ~ none ~ undefined_x }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 3 > 2 > 1 }} {{ 1 < 2 < 2 }} {{ 'b' in 'abc' }} {{ 2 not in [1, 2] }}" },
    { "op2", "{{ not true }} {{ 1 and 'x' }} {{ 0 or 'y' }} {{ none or [] }} {{ 'yes' if 1 > 2 else 'no' }} [{{ 'v' if false }}]" },
    { "op3", "{{ 'a' == 'a' }} {{ 1 == 1.0 }} {{ [1,2] == [1,2] }} {{ {'a':1} == {'a':1} }} {{ 'a' < 'b' }} {{ -3 | abs }} {{ -(2 + 1) }}" },
    /* Python's printf-style % on strings, and |format */
    { "pct1", "{{ '%s-%d' % ('a', 3) }}|{{ '%.2f' % 3.14159 }}|{{ '%5.1f|%-6.2e|%g' % (2.25, 12345.678, 1e20) }}|{{ '%05d %+d % d %x %X %o %#x %#o %#X' % (42, 5, 5, 255, 255, 8, 0, 8, 31) }}|{{ '%x %d' % (-31, -7) }}|{{ '%.3d|%05.3d|%-5d|' % (5, 5, 5) }}" },
    { "pct2", "{{ '%s' % msgs[1].content }}|{{ '%r' % 'it' }}|{{ '%s %s' % (none, true) }}|{{ '%s' % [1, 'a'] }}|{{ '%s' % (msgs[0],) }}|{{ '%(a)s=%(b)05.1f' % {'a': 'k', 'b': 2.5} }}|{{ '%s' % {'a': 1} }}|{{ 'abc' % {'a': 1} }}|{{ '%%|%5s|%-5s|%.1s|%c%c' % ('ab', 'cd', 'xyz', 65, 'é') }}|{{ '%*d|%-*d|%.*f' % (4, 7, 3, 8, 2, 1.005) }}" },
    { "pct3", "{{ '%d %i %u' % (3.7, true, -2.9) }}|{{ '%f %F %e' % (1, 2, 0.0001) }}|{{ '%05f|%f|%-6f|' % (1e400, -0.0, 1e400 * 0) }}|{{ '%5s|%.2s' % ('h\u00e9llo', 'h\u00e9llo') }}|{{ '%ld %hd' % (1, 2) }}|{{ ('x=%s' % 1) ~ '!' }}|{{ '%s and %s' | format('a', 2) }}|{{ '%(n)s' | format(n='kw') }}|{{ '%s' | format([1, 2]) }}|{% set p = '%s: %s' %}{{ p % ('k', msgs | length) }}" },
    { "pct4", "{{ 10 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }}" },
    { "epct1", "{{ '%d' % 'a' }}" },
    { "epct2", "{{ '%s %s' % ('a',) }}" },
    { "epct3", "{{ '%s' % ('a', 'b') }}" },
    { "epct4", "{{ 'abc' % 5 }}" },
    { "epct5", "{{ '%z' % 1 }}" },
    { "epct6", "{{ 'x%' % 1 }}" },
    { "epct7", "{{ '%x' % 1.5 }}" },
    { "epct8", "{{ '%(a)s' % 5 }}" },
    { "epct9", "{{ '%c' % 'ab' }}" },
    { "pct5", "[{{ '%s' % undefined_v }}][{{ '%s%s' % (undefined_v, 1) }}]" },
    { "epct10", "{{ '%d' % undefined_v }}" },
    { "epct12", "{{ undefined_v % 2 }}" },
    { "epct11", "{{ '%s' | format('a', k=1) }}" },
    /* tests */
    { "test1", "{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is sequence }} {{ 1 is number }} {{ true is boolean }} {{ 2 is even }} {{ 3 is odd }} {{ 6 is divisibleby 3 }}" },
    { "test2", "{{ x is not none }} {{ 1 is integer }} {{ 1.0 is float }} {{ 'a' is eq 'a' }} {{ 'a' is equalto 'b' }} {{ 3 is gt 2 }} {{ 'x' is in ['x'] }} {{ true is sameas true }} {{ 'AB' is upper }} {{ ns is mapping }} {{ y is iterable }} {{ y is sequence }}" },
    /* filters */
    { "f1", "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ [1, 2, 3] | join(', ') }}|{{ 'abc' | length }}|{{ 'Hé' | upper }}|{{ 'HI' | lower }}|{{ 'aXa' | replace('a', 'b') }}" },
    { "f2", "{{ undefined_v | default('d') }}|{{ none | default('d') }}|{{ '' | default('e', true) }}|{{ [3, 1, 2] | first }}|{{ [3, 1, 2] | last }}|{{ [3, 1, 2] | sort }}|{{ [3, 1, 2] | reverse | list }}|{{ 'abc' | reverse }}" },
    { "f3", "{{ {'b': 1, 'a': 2} | dictsort }}|{{ {'b': 1, 'a': 2} | items | list }}|{{ 'abc' | list }}|{{ 42 | string }}|{{ '42' | int + 1 }}|{{ 'x' | int }}|{{ '2.5' | float }}|{{ 2.567 | round(2) }}|{{ 2.5 | round }}" },
    { "f4", "{{ 'hello world' | capitalize }}|{{ 'hello-world foo' | title }}|{{ [1, 1, 2, 1] | unique | list }}|{{ 'a b  c' | wordcount }}|{{ [1, 2, 3] | sum }}|{{ [1,2,3,4,5] | batch(2) | list }}|{{ [4, 2, 9] | min }} {{ [4, 2, 9] | max }}" },
    { "f5", "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }}|{{ msgs | rejectattr('role', 'equalto', 'user') | list | length }}|{{ msgs | map(attribute='role') | unique | list }}|{{ [0, 1, '', 'a'] | select | list }}|{{ [1, 2, 3] | reject('odd') | list }}|{{ ['a', 'b'] | map('upper') | list }}" },
    { "f6", "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(4, first=true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}|{{ msgs | selectattr('name') | list | length }}|{{ msgs | sort(attribute='role') | map(attribute='role') | join }}" },
    { "f7", "{{ msgs | tojson }}\n{{ msgs | tojson(indent=2) }}\n{{ {'b': [], 'a': {}, 'c': 'é\"\\\\\\n\\u0001'} | tojson(sort_keys=true) }}\n{{ [1.5, none, true, 'x'] | tojson(separators=(',', ':')) }}\n{{ {'k': 1} | tojson(indent=4) }}" },
    { "f8", "{% filter upper %}abc {{ 'def' }}{% endfilter %}|{% filter trim | upper %}  x  {% endfilter %}" },
    /* string methods */
    { "s1", "{{ '  a  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}|{{ '  a b  '.rsplit(none, 1) }}" },
    { "s2", "{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'hello world'.title() }}|{{ 'abcb'.find('b') }} {{ 'abcb'.rfind('b') }} {{ 'abc'.find('z') }}|{{ 'abab'.count('ab') }}|{{ '-'.join(['a', 'b']) }}" },
    { "s3", "{{ '{} and {}'.format('x', 1) }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='n') }}|{{ 'a1'.isdigit() }} {{ '12'.isdigit() }}|{{ 'abc'[1] }} {{ 'abc'[-1] }} {{ 'héllo'[1:3] }} {{ 'abcdef'[::2] }} {{ 'abc'[::-1] }}|{{ [1,2,3,4][1:] }} {{ [1,2,3][:-1] }} {{ [1,2,3][10] is defined }}" },
    /* dict methods and attribute lookup */
    { "d1", "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}|{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z') }} {{ {'a': 1}.get('z', 'dflt') }}|{{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }}|{{ msgs[0].role }} {{ msgs[0]['content'] }} {{ msgs.0.role }} {{ msgs[0].nothing is defined }} {{ none.x is defined }}" },
    /* loops */
    { "l1", "{% for m in msgs %}{{ loop.index }}/{{ loop.length }}:{{ loop.index0 }},{{ loop.revindex }},{{ loop.revindex0 }},{{ loop.first }},{{ loop.last }},{{ loop.previtem is defined }},{{ loop.cycle('x', 'y') }};{% endfor %}" },
    { "l2", "{% for m in msgs if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}|{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}" },
    { "l3", "{% for i in range(2) %}{% for j in range(2) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}{{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}" },
    /* scoping, set, namespace */
    { "sc1", "{% set x = 1 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}|{% set ns = namespace(t=0, s='') %}{% for i in range(4) %}{% set ns.t = ns.t + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.t }} {{ ns.s }}" },
    { "sc2", "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}x{{ a }}y{% endset %}{{ blk }}|{% set blk2 | upper %}lo{% endset %}{{ blk2 }}|{% if true %}{% set inner = 5 %}{% endif %}{{ inner }}|{% set d = dict(a=1, b='x') %}{{ d }}" },
    { "sc3", "{% for i in range(3) %}{% if i > 0 %}{{ last }}{% endif %}{% set last = i %}{% endfor %}|{{ last is defined }}" },
    /* macros */
    { "m1", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }} {{ greet() }}|{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}" },
    { "m2", "{% set g = 'global' %}{% macro show() %}{{ g }}{% endmacro %}{% for g2 in [1] %}{{ show() }}{% endfor %}|{% macro strip_it(s) -%}\n  {{ s | trim }}\n{%- endmacro %}[{{ strip_it('  x  ') }}]" },
    /* generation, strftime_now, raise_exception (not fired) */
    { "g1", "{% generation %}gen {{ 1 }}{% endgeneration %}|{{ strftime_now('%Y-%m-%d %d %b %Y') }}|{% if false %}{{ raise_exception('no') }}{% endif %}ok" },
    /* errors both engines must raise */
    { "e1", "{{ raise_exception('Conversation roles must alternate') }}" },
    { "e2", "{{ undefined_thing.attr }}" },
    { "e3", "{{ 1 + 'a' }}" },
    { "e4", "{% for x in 1 %}{% endfor %}" },
    { "e5", "{% if x %}unterminated" },
    { "e6", "{{ [1].append(2) }}" },
    { "e7", "{{ 1 / 0 }}" },
    { "e8", "{{ 'a' | no_such_filter }}" },
    { "e9", "{% set ns = namespace() %}{% set nd = {} %}{% set nd.x = 1 %}" },
    { "e10", "{{ 'a' < 1 }}" },
};

static const char *feature_data =
    "{\"msgs\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hé\\n\", \"name\": \"u1\"},"
    " {\"role\": \"assistant\", \"content\": \"a \\\"q\\\"\"}, {\"role\": \"user\", \"content\": \"two\"}],"
    " \"x\": 1, \"ns\": {\"k\": [1, 2.5, null, true]}}";

/* ---------------------------------------------------------------- corpus conversations */

static const char *const convs[][2] = {
    { "user", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}" },
    { "system+user", "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
                     " {\"role\": \"user\", \"content\": \"What is 2+2?\"}]}" },
    { "multi-turn", "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                    " {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello! How can I help?\"},"
                    " {\"role\": \"user\", \"content\": \"Tell me a joke.\"}, {\"role\": \"assistant\", \"content\": \"Why did the chicken cross the road?\"},"
                    " {\"role\": \"user\", \"content\": \"Why?\"}]}" },
    { "long-reply", "{\"messages\": [{\"role\": \"user\", \"content\": \"Write code.\\nIn C.\"},"
                    " {\"role\": \"assistant\", \"content\": \"Here it is:\\n\\n```c\\nint main(void) {\\n    return 0;\\n}\\n```\\n\\nIt returns 0 — done. «ok» 日本語\\n\"},"
                    " {\"role\": \"user\", \"content\": \"  Thanks!  \"}]}" },
    { "tools", "{\"messages\": [{\"role\": \"system\", \"content\": \"You can call tools.\"}, {\"role\": \"user\", \"content\": \"Weather in Paris?\"}],"
               " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\","
               " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name\"},"
               " \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\"]}}}]}" },
    { "tool-call", "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
                   " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\","
                   " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}}]},"
                   " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"name\": \"get_weather\", \"content\": \"{\\\"temp\\\": 21}\"},"
                   " {\"role\": \"assistant\", \"content\": \"It is 21 C.\"}, {\"role\": \"user\", \"content\": \"Thanks\"}],"
               " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\","
               " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\"}},"
               " \"required\": [\"city\"]}}}]}" },
    /* as OpenAI clients send it: arguments as a JSON string, a 9-character id (Mistral's rule) */
    { "tool-call-str", "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
                   " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abc123XYZ\", \"type\": \"function\","
                   " \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
                   " {\"role\": \"tool\", \"tool_call_id\": \"abc123XYZ\", \"name\": \"get_weather\", \"content\": \"21 C\"}],"
               " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\","
               " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]}" },
    { "reasoning", "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"},"
                   " {\"role\": \"assistant\", \"content\": \"4\", \"reasoning_content\": \"Simple sum.\"},"
                   " {\"role\": \"user\", \"content\": \"3+3?\"}]}" },
};

static void add_corpus(const char *dir, const char *only)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char **names = NULL;
    size_t nn = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 6 && !strcmp(e->d_name + l - 6, ".jinja") && (!only || strstr(e->d_name, only))) {
            names = realloc(names, (nn + 1) * sizeof(char *));
            names[nn++] = strdup(e->d_name);
        }
    }
    closedir(d);
    for (size_t i = 0; i < nn; i++)   /* a stable order */
        for (size_t j = i + 1; j < nn; j++)
            if (strcmp(names[i], names[j]) > 0) { char *t = names[i]; names[i] = names[j]; names[j] = t; }
    for (size_t i = 0; i < nn; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        char *src = test_read_file(path, NULL);
        if (!src) continue;
        bool thinking = strstr(src, "enable_thinking") != NULL;
        for (size_t k = 0; k < KVC_ARRAY_LEN(convs); k++) {
            for (int gen = 0; gen < 2; gen++) {
                if (!gen && k != 2) continue;   /* add_generation_prompt=false once */
                char name[512], trusted[256];
                snprintf(name, sizeof(name), "%s/%s%s", names[i], convs[k][0], gen ? "" : "/nogen");
                snprintf(trusted, sizeof(trusted), "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", "
                         "\"add_generation_prompt\": %s}", gen ? "true" : "false");
                add_case(name, src, convs[k][1], trusted);
                if (thinking && gen && (k == 2 || k == 6)) {
                    for (int t = 0; t < 2; t++) {
                        char *data = strdup(convs[k][1]);
                        size_t l = strlen(data);
                        data[l - 1] = 0;   /* drop the closing brace, add the kwarg */
                        char buf[8192];
                        snprintf(buf, sizeof(buf), "%s, \"enable_thinking\": %s}", data, t ? "true" : "false");
                        snprintf(name, sizeof(name), "%s/%s/thinking=%d", names[i], convs[k][0], t);
                        add_case(name, src, buf, trusted);
                        free(data);
                    }
                }
            }
        }
        free(src);
        free(names[i]);
    }
    free(names);
}

/* ---------------------------------------------------------------- running */

static cJSON *run_reference(const char *harness)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n_cases; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "template", cases[i].tmpl);
        cJSON_AddItemToObject(o, "data", cJSON_Parse(cases[i].data));
        cJSON_AddItemToObject(o, "trusted", cJSON_Parse(cases[i].trusted));
        cJSON_AddNumberToObject(o, "now", NOW);
        cJSON_AddItemToArray(arr, o);
    }
    char *json = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    char in[] = "/tmp/test_jinja_inXXXXXX", out[] = "/tmp/test_jinja_outXXXXXX";
    int fi = mkstemp(in), fo = mkstemp(out);
    if (fi < 0 || fo < 0) return NULL;
    if (write(fi, json, strlen(json)) != (ssize_t)strlen(json)) return NULL;
    close(fi);
    close(fo);
    free(json);
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 '%s' < '%s' > '%s'", harness, in, out);
    int rc = system(cmd);
    char *res = rc == 0 ? test_read_file(out, NULL) : NULL;
    unlink(in);
    unlink(out);
    if (!res) return NULL;
    cJSON *r = cJSON_Parse(res);
    free(res);
    return r;
}

static void first_diff(const char *a, size_t na, const char *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    ours: «%.*s»\n    ref:  «%.*s»\n", i,
            (int)KVC_MIN(na - from, 160), a + from, (int)KVC_MIN(nb - from, 160), b + from);
}

/* Rendering cost per request (printed, not asserted): a template of the
 * corpus, a 20-turn conversation (40 messages of about 300 bytes), through
 * compile-once, render-many as the server does. */
static void bench_render(const char *dir, const char *file)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    char *src = test_read_file(path, NULL);
    if (!src)
        return;
    size_t cap = 64 * 1024, n = 0;
    char *data = malloc(cap);
    n += (size_t)snprintf(data + n, cap - n, "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"}");
    for (int t = 0; t < 20; t++)
        n += (size_t)snprintf(data + n, cap - n,
                              ", {\"role\": \"user\", \"content\": \"Question %d: tell me about the history of the number %d, "
                              "its properties, and where it shows up in nature or culture.\\nPlease be brief.\"}"
                              ", {\"role\": \"assistant\", \"content\": \"The number %d is interesting because it is %s. "
                              "It appears in many places: in mathematics, in calendars and in games. Historically it was "
                              "used by several cultures.\\n\\nIn short: a fine number.\"}", t, t * 7, t * 7, t % 2 ? "odd" : "even");
    snprintf(data + n, cap - n, ", {\"role\": \"user\", \"content\": \"Thanks!\"}]}");
    const char *trusted = "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true}";
    jinja_template *t = NULL;
    kvc_err err = { 0 };
    int64_t t0 = kvc_time_us();
    int rc = jinja_compile(src, strlen(src), &t, &err);
    int64_t t1 = kvc_time_us();
    const int reps = 200;
    size_t out_len = 0;
    for (int i = 0; rc == KVC_OK && i < reps; i++) {
        jinja_output o;
        rc = jinja_render(t, data, trusted, NULL, &o, &err);
        out_len = o.len;
        jinja_output_free(&o);
    }
    int64_t t2 = kvc_time_us();
    if (rc == KVC_OK)
        printf("test_jinja: bench %s: compile %.1f us; 20-turn render %.1f us per request (%zu bytes out)\n",
               file, (double)(t1 - t0), (double)(t2 - t1) / reps, out_len);
    jinja_template_free(t);
    free(data);
    free(src);
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    if (system("/usr/bin/python3 -c 'import jinja2' 2>/dev/null") != 0) {
        printf("test_jinja: SKIP: /usr/bin/python3 has no jinja2 (apt-get install python3-jinja2; "
               "scripts/install-deps.sh does)\n");
        return TEST_SKIP;
    }
    setenv("TZ", "UTC", 1);
    char harness[4096];
    snprintf(harness, sizeof(harness), "%s", __FILE__);
    char *slash = strrchr(harness, '/');
    snprintf(slash ? slash + 1 : harness, sizeof(harness) - (slash ? (size_t)(slash + 1 - harness) : 0),
             "jinja_ref.py");

    if (!only)
        for (size_t i = 0; i < KVC_ARRAY_LEN(features); i++)
            add_case(features[i][0], features[i][1], feature_data, "{}");
    size_t n_features = n_cases;
    const char *dir = getenv("KVC_TEMPLATE_DIR");
    struct stat st;
    if (!dir || stat(dir, &st) != 0)
        dir = stat("../shared/templates", &st) == 0 ? "../shared/templates" : NULL;
    if (dir)
        add_corpus(dir, only);
    else
        printf("test_jinja: corpus skipped: set KVC_TEMPLATE_DIR or provide ../shared/templates\n");

    cJSON *ref = run_reference(harness);
    CHECKF(ref && cJSON_GetArraySize(ref) == (int)n_cases, "the reference harness %s failed", harness);
    if (!ref)
        return test_done("test_jinja");

    size_t pass = 0, both_fail = 0, corpus_pass = 0;
    for (size_t i = 0; i < n_cases; i++) {
        cJSON *r = cJSON_GetArrayItem(ref, (int)i);
        bool ref_ok = cJSON_IsTrue(cJSON_GetObjectItem(r, "ok"));
        const char *ref_text = ref_ok ? cJSON_GetObjectItem(r, "text")->valuestring
                                      : cJSON_GetObjectItem(r, "error")->valuestring;
        jinja_template *t = NULL;
        jinja_output o = { 0 };
        kvc_err err = { 0 };
        jinja_limits lim = { .now = NOW };
        int rc = jinja_compile(cases[i].tmpl, strlen(cases[i].tmpl), &t, &err);
        if (rc == KVC_OK)
            rc = jinja_render(t, cases[i].data, cases[i].trusted, &lim, &o, &err);
        bool same = rc == KVC_OK ? ref_ok && o.len == strlen(ref_text) && !memcmp(o.text, ref_text, o.len)
                                 : !ref_ok;
        if (same) {
            pass++;
            both_fail += !ref_ok;
            if (!ref_ok && (only || getenv("KVC_JINJA_VERBOSE")))
                printf("both refuse %s: ours: %s | ref: %s\n", cases[i].name, err.msg, ref_text);
            corpus_pass += i >= n_features;
        } else {
            fprintf(stderr, "MISMATCH %s\n", cases[i].name);
            if (rc != KVC_OK)
                fprintf(stderr, "    ours failed: %s\n    ref: «%.300s»\n", err.msg, ref_text);
            else if (!ref_ok)
                fprintf(stderr, "    ref failed: %s\n    ours: «%.300s»\n", ref_text, o.text);
            else
                first_diff(o.text, o.len, ref_text, strlen(ref_text));
        }
        test_checks++;
        if (!same) test_failures++;
        jinja_output_free(&o);
        jinja_template_free(t);
    }
    if (dir && !only) {
        bench_render(dir, "Qwen-Qwen3-0.6B.jinja");
        bench_render(dir, "meta-llama-Llama-3.1-8B-Instruct.jinja");
        bench_render(dir, "openai-gpt-oss-120b.jinja");
    }
    printf("test_jinja: %zu/%zu cases identical to Python jinja2 (%zu where both refuse); "
           "features %zu, corpus %zu/%zu\n", pass, n_cases, both_fail, n_features,
           corpus_pass, n_cases - n_features);
    cJSON_Delete(ref);
    for (size_t i = 0; i < n_cases; i++) {
        free(cases[i].name); free(cases[i].tmpl); free(cases[i].data); free(cases[i].trusted);
    }
    free(cases);
    return test_done("test_jinja");
}
