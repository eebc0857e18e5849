/* options.c - the command line's options: one table per group of options
 * (model, context, sampling, cache tiers, chat template), parsed with
 * getopt_long and printed by --help from the same rows, so that a command's
 * --help lists exactly what it takes. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ------------------------------------------------------------ the groups */

const cli_option cli_help_opts[] = {
    { "help", 'h', NULL, 'h', 0, "show this help and exit" },
    { 0 }
};

const cli_option cli_model_opts[] = {
    { "model", 'm', "FILE", 'm', 0, "GGUF model (default: the generated demo model)" },
    { 0 }
};

const cli_option cli_context_opts[] = {
    { "threads", 't', "N", 't', 0, "threads (default: all cores)" },
    { "ctx-size", 'c', "N", 'c', 0, "context length (default: the model's)" },
    { "batch-size", 'b', "N", 'b', 0, "tokens per forward pass (default 512)" },
    { "kv-type", 0, "T", CLI_OPT_KV_TYPE, 0, "KV cache type: f16 (default), f32, q8_0" },
    { "snapshot-interval", 0, "N", CLI_OPT_SNAP_INTERVAL, 0,
      "models with recurrent layers: snapshot their state every N\n"
      "tokens of a long prompt (default: from the state's size;\n"
      "0 = only at prompt ends and message starts)" },
    { 0 }
};

const cli_option cli_sampling_opts[] = {
    { "temp", 0, "X", CLI_OPT_TEMP, 0,
      "temperature; 0 = greedy (default 0; serve: 1, OpenAI's)" },
    { "temperature", 0, "X", CLI_OPT_TEMP, CLI_HIDDEN, NULL },
    { "top-k", 0, "N", CLI_OPT_TOP_K, 0, "keep the N most likely tokens (default 40; 0 = off)" },
    { "top-p", 0, "X", CLI_OPT_TOP_P, 0, "nucleus sampling (default 0.95; 1 = off)" },
    { "min-p", 0, "X", CLI_OPT_MIN_P, 0,
      "drop tokens below X times the top probability (default 0.05)" },
    { "repeat-penalty", 0, "X", CLI_OPT_REPEAT_PENALTY, 0,
      "penalise repeated tokens (default 1 = off)" },
    { "repeat-last-n", 0, "N", CLI_OPT_REPEAT_LAST_N, 0, "history the penalties look at (default 64)" },
    { "presence-penalty", 0, "X", CLI_OPT_PRESENCE, 0, "OpenAI's presence penalty (default 0)" },
    { "frequency-penalty", 0, "X", CLI_OPT_FREQUENCY, 0, "OpenAI's frequency penalty (default 0)" },
    { "seed", 's', "N", 's', 0, "random seed" },
    { 0 }
};

const cli_option cli_cache_opts[] = {
    { "cache-dir", 0, "DIR", CLI_OPT_CACHE_DIR, 0,
      "the disk tier's directory (default: $KVCHAT_CACHE/kv, else\n"
      "$XDG_CACHE_HOME/kvchat/kv, else ~/.cache/kvchat/kv)" },
    { "cache-disk", 0, "MIB", CLI_OPT_CACHE_DISK, 0,
      "the disk tier's size in MiB (default 4096; 0 = off): the KV\n"
      "cache survives evictions and restarts" },
    { "cache-redis", 0, "URL", CLI_OPT_CACHE_REDIS, 0,
      "a shared tier in Redis behind the disk tier, so that instances\n"
      "share their KV blocks: redis://[[user]:password@]host[:port][/db]" },
    { "cache-redis-password", 0, "PW", CLI_OPT_CACHE_REDIS_PW, 0,
      "Redis password (default: the URL's; env REDISCLI_AUTH)" },
    { "cache-redis-timeout", 0, "MS", CLI_OPT_CACHE_REDIS_TIMEOUT, 0,
      "bound on each Redis connect and command (default 200)" },
    { 0 }
};

const cli_option cli_template_opts[] = {
    { "chat-template", 0, "NAME", CLI_OPT_TEMPLATE, 0,
      "a built-in format instead of the model's own template: chatml,\n"
      "llama3, llama2, mistral-v7, phi3, gemma, zephyr, deepseek, ..." },
    { "chat-template-file", 0, "F", CLI_OPT_TEMPLATE_FILE, 0,
      "a Jinja chat template to use instead of the model's" },
    { "chat-template-kwargs", 0, "JSON", CLI_OPT_TEMPLATE_KWARGS, 0,
      "a JSON object of template variables, e.g.\n'{\"enable_thinking\": false}'" },
    { 0 }
};

/* ----------------------------------------------------------- the parser */

void cli_parser_init(cli_parser *p, const char *cmd, int argc, char **argv,
                     const cli_option *const *groups)
{
    memset(p, 0, sizeof(*p));
    p->cmd = cmd;
    p->argc = argc;
    p->argv = argv;
    p->groups = groups;
    size_t ns = 0;
    p->shorts[ns++] = ':';                 /* ':' for a missing value, '?' for the rest */
    for (const cli_option *const *g = groups; *g; g++)
        for (const cli_option *o = *g; o->name; o++) {
            if (p->n == CLI_MAX_OPTS)      /* a programming error: the tables grew */
                abort();
            p->row[p->n] = o;
            p->longs[p->n++] = (struct option){ o->name, o->arg ? required_argument : no_argument,
                                                NULL, o->id };
            if (o->short_name && !memchr(p->shorts, o->short_name, ns)) {
                p->shorts[ns++] = (char)o->short_name;
                if (o->arg)
                    p->shorts[ns++] = ':';
            }
        }
    p->shorts[ns] = 0;
    optind = 0;                            /* glibc: start over, whatever was parsed before */
    opterr = 0;
}

/* The row of id (its first, the one --help shows). */
static const cli_option *row_of(const cli_parser *p, int id)
{
    for (int i = 0; i < p->n; i++)
        if (p->row[i]->id == id && !(p->row[i]->flags & CLI_HIDDEN))
            return p->row[i];
    for (int i = 0; i < p->n; i++)
        if (p->row[i]->id == id)
            return p->row[i];
    return NULL;
}

/* "--model" or "-m/--model" for messages. */
static void option_name(const cli_option *o, char *buf, size_t size)
{
    if (o->short_name)
        snprintf(buf, size, "-%c/--%s", o->short_name, o->name);
    else
        snprintf(buf, size, "--%s", o->name);
}

/* Is the argument getopt stopped at a long option of the tables, written out whole? */
static const cli_option *long_named(const cli_parser *p, const char *arg)
{
    if (strncmp(arg, "--", 2))
        return NULL;
    size_t len = strcspn(arg + 2, "=");
    for (int i = 0; i < p->n; i++)
        if (strlen(p->row[i]->name) == len && !strncmp(p->row[i]->name, arg + 2, len))
            return p->row[i];
    return NULL;
}

int cli_next(cli_parser *p, const char **value)
{
    *value = NULL;
    int idx = -1;
    int id = getopt_long(p->argc, p->argv, p->shorts, p->longs, &idx);
    if (id == -1)
        return CLI_END;
    const char *arg = p->argv[optind - 1 < p->argc ? optind - 1 : p->argc - 1];
    if (id == '?' || id == ':') {
        const cli_option *o = optopt && optopt < 256 && strncmp(arg, "--", 2) ? NULL
                              : long_named(p, arg);
        char shortopt[3] = { '-', (char)optopt, 0 };
        if (id == ':')
            fprintf(stderr, "kvchat %s: %s needs a value\n", p->cmd,
                    optopt && optopt < 256 && strncmp(arg, "--", 2) ? shortopt : arg);
        else if (o && strchr(arg, '='))
            fprintf(stderr, "kvchat %s: --%s takes no value, got '%s'\n", p->cmd, o->name, arg);
        else if (optopt && optopt < 256 && strncmp(arg, "--", 2))
            fprintf(stderr, "kvchat %s: unknown option '%s' (see kvchat %s --help)\n", p->cmd,
                    shortopt, p->cmd);
        else {
            size_t len = strcspn(arg, "=");
            int prefixed = 0;                /* long names the text abbreviates */
            for (int i = 0; i < p->n && len > 2; i++)
                prefixed += !strncmp(p->row[i]->name, arg + 2, len - 2);
            fprintf(stderr, "kvchat %s: %s option '%.*s' (see kvchat %s --help)\n", p->cmd,
                    prefixed > 1 ? "ambiguous" : "unknown", (int)len, arg, p->cmd);
        }
        return CLI_ERR;
    }
    const cli_option *o = idx >= 0 ? p->row[idx] : row_of(p, id);
    p->current = o;
    *value = optarg;
    if (o && !(o->flags & CLI_REPEAT)) {
        for (int i = 0; i < p->n_seen; i++)
            if (p->seen[i].id == id) {
                char name[96];
                option_name(row_of(p, id), name, sizeof(name));
                if (optarg)
                    fprintf(stderr, "kvchat %s: %s given twice ('%s', then '%s'); give it once\n",
                            p->cmd, name, p->seen[i].value ? p->seen[i].value : "", optarg);
                else
                    fprintf(stderr, "kvchat %s: %s given twice; give it once\n", p->cmd, name);
                return CLI_ERR;
            }
        if (p->n_seen < CLI_MAX_OPTS)
            p->seen[p->n_seen++] = (cli_seen){ id, optarg };
    }
    return id;
}

int cli_next_opt(cli_parser *p, const char **value, const char *help)
{
    int id = cli_next(p, value);
    if (id != 'h')
        return id;
    printf("%s\nOptions:\n", help);
    cli_print_options(stdout, p->groups);
    return CLI_HELP;
}

const char *cli_opt_name(const cli_parser *p)
{
    static char name[96];
    snprintf(name, sizeof(name), "--%s", p->current ? p->current->name : "?");
    return name;
}

char **cli_operands(const cli_parser *p, int *n)
{
    *n = p->argc - optind;
    return p->argv + optind;
}

int cli_no_operands(const cli_parser *p)
{
    if (optind < p->argc) {
        fprintf(stderr, "kvchat %s: unexpected argument '%s' (see kvchat %s --help)\n", p->cmd,
                p->argv[optind], p->cmd);
        return 2;
    }
    return 0;
}

#define HELP_COLUMN 26

void cli_print_options(FILE *out, const cli_option *const *groups)
{
    for (const cli_option *const *g = groups; *g; g++)
        for (const cli_option *o = *g; o->name; o++) {
            if (o->flags & CLI_HIDDEN)
                continue;
            char left[128];
            int n = o->short_name ? snprintf(left, sizeof(left), "  -%c, --%s", o->short_name, o->name)
                                  : snprintf(left, sizeof(left), "      --%s", o->name);
            if (o->arg)
                n += snprintf(left + n, sizeof(left) - (size_t)n, " %s", o->arg);
            fputs(left, out);
            const char *h = o->help ? o->help : "";
            if (n + 2 > HELP_COLUMN) {
                fputc('\n', out);
                n = 0;
            }
            for (;;) {
                size_t len = strcspn(h, "\n");
                fprintf(out, "%*s%.*s\n", HELP_COLUMN - n, "", (int)len, h);
                if (!h[len])
                    break;
                h += len + 1;
                n = 0;
            }
        }
}

/* ------------------------------------------------------- values */

bool cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "kvchat: %s needs an integer in [%lld, %lld], got '%s'\n", opt,
                (long long)lo, (long long)hi, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = s ? strtof(s, &end) : 0;
    if (!s || errno || end == s || *end || v != v) {
        fprintf(stderr, "kvchat: %s needs a number, got '%s'\n", opt, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

/* ------------------------------------------------- applying the groups */

int cli_common_apply(cli_common *c, int id, const char *v)
{
    int64_t n;
    switch (id) {
    case 'm':
        c->model = v;
        return 1;
    case 't':
        if (!cli_int("--threads", v, 1, 1024, &n))
            return -1;
        c->n_threads = (int32_t)n;
        return 1;
    case 'c':
        if (!cli_int("--ctx-size", v, 0, INT32_MAX, &n))
            return -1;
        c->n_ctx = (int32_t)n;
        return 1;
    case 'b':
        if (!cli_int("--batch-size", v, 1, 1 << 16, &n))
            return -1;
        c->n_batch = (int32_t)n;
        return 1;
    case CLI_OPT_SNAP_INTERVAL:
        if (!cli_int("--snapshot-interval", v, 0, 1 << 20, &n))
            return -1;
        c->snap_interval = n ? (int32_t)n : -1;
        return 1;
    case CLI_OPT_KV_TYPE:
        if (!strcmp(v, "f16"))
            c->kv_type = KVC_KV_F16;
        else if (!strcmp(v, "f32"))
            c->kv_type = KVC_KV_F32;
        else if (!strcmp(v, "q8_0"))
            c->kv_type = KVC_KV_Q8_0;
        else {
            fprintf(stderr, "kvchat: --kv-type must be f16, f32 or q8_0, got '%s'\n", v);
            return -1;
        }
        return 1;
    default:
        return cli_sampling_apply(&c->sampling, id, v);
    }
}

int cli_sampling_apply(kvc_sampler_params *s, int id, const char *v)
{
    int64_t n;
    float *f = id == CLI_OPT_TEMP ? &s->temperature
             : id == CLI_OPT_TOP_P ? &s->top_p
             : id == CLI_OPT_MIN_P ? &s->min_p
             : id == CLI_OPT_REPEAT_PENALTY ? &s->repeat_penalty
             : id == CLI_OPT_PRESENCE ? &s->presence_penalty
             : id == CLI_OPT_FREQUENCY ? &s->frequency_penalty : NULL;
    const char *name = id == CLI_OPT_TEMP ? "--temp" : id == CLI_OPT_TOP_P ? "--top-p"
                     : id == CLI_OPT_MIN_P ? "--min-p" : id == CLI_OPT_REPEAT_PENALTY ? "--repeat-penalty"
                     : id == CLI_OPT_PRESENCE ? "--presence-penalty" : "--frequency-penalty";
    if (f)
        return cli_float(name, v, f) ? 1 : -1;
    switch (id) {
    case CLI_OPT_TOP_K:
        if (!cli_int("--top-k", v, 0, INT32_MAX, &n))
            return -1;
        s->top_k = (int32_t)n;
        return 1;
    case CLI_OPT_REPEAT_LAST_N:
        if (!cli_int("--repeat-last-n", v, 0, INT32_MAX, &n))
            return -1;
        s->repeat_last_n = (int32_t)n;
        return 1;
    case 's':
        if (!cli_int("--seed", v, 0, INT64_MAX, &n))
            return -1;
        s->seed = (uint64_t)n;
        return 1;
    default:
        return 0;
    }
}

int cli_cache_apply(cli_cache *c, int id, const char *v)
{
    int64_t n;
    switch (id) {
    case CLI_OPT_CACHE_DIR:
        c->dir = v;
        return 1;
    case CLI_OPT_CACHE_DISK:
        if (!cli_int("--cache-disk", v, 0, INT64_MAX / (1 << 20), &n))
            return -1;
        c->disk_mib = n;
        return 1;
    case CLI_OPT_CACHE_REDIS:
        c->redis = v;
        return 1;
    case CLI_OPT_CACHE_REDIS_PW:
        c->redis_password = v;
        return 1;
    case CLI_OPT_CACHE_REDIS_TIMEOUT:
        if (!cli_int("--cache-redis-timeout", v, 1, 600000, &n))
            return -1;
        c->redis_timeout_ms = n;
        return 1;
    default:
        return 0;
    }
}

/* The text of file `path` (malloc'd) when it is a Jinja template; NULL after printing. */
static char *read_template(const char *path)
{
    FILE *fp = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (fp && fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, fp) == (size_t)n) {
        buf[n] = 0;
    } else {
        free(buf);
        buf = NULL;
    }
    if (fp)
        fclose(fp);
    if (!buf || (!strstr(buf, "{%") && !strstr(buf, "{{"))) {
        fprintf(stderr, "kvchat: --chat-template-file %s: %s\n", path,
                buf ? "not a Jinja template (no {% or {{)" : "cannot read it");
        free(buf);
        return NULL;
    }
    return buf;
}

int cli_template_apply(cli_template *t, int id, const char *v)
{
    switch (id) {
    case CLI_OPT_TEMPLATE:
    case CLI_OPT_TEMPLATE_FILE:
        if (t->tmpl) {
            fprintf(stderr, "kvchat: --chat-template and --chat-template-file: give one\n");
            return -1;
        }
        if (id == CLI_OPT_TEMPLATE) {
            t->tmpl = v;
        } else {
            if (!(t->owned = read_template(v)))
                return -1;
            t->tmpl = t->owned;
        }
        return 1;
    case CLI_OPT_TEMPLATE_KWARGS: {
        cJSON *o = cJSON_Parse(v);
        bool ok = cJSON_IsObject(o);
        cJSON_Delete(o);
        if (!ok) {
            fprintf(stderr, "kvchat: --chat-template-kwargs must be a JSON object, got '%s'\n", v);
            return -1;
        }
        t->kwargs = v;
        return 1;
    }
    default:
        return 0;
    }
}
