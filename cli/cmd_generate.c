/* cmd_generate.c - kvchat generate: continue a prompt. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "cli.h"

static const char help[] =
    "usage: kvchat generate [-m MODEL.gguf] [-p TEXT | -f FILE] [-n N] [options]\n\n"
    "Continue TEXT with up to N tokens (default 128), stopping at an end-of-generation token.\n"
    "The prompt is tokenized with BOS as the vocabulary asks and special tokens parsed.\n";

enum { OPT_IGNORE_EOS = CLI_OPT_CMD, OPT_JSON };

static const cli_option generate_opts[] = {
    { "prompt", 'p', "TEXT", 'p', 0, "the prompt (default: \"Once upon a time\")" },
    { "file", 'f', "FILE", 'f', 0, "read the prompt from FILE" },
    { "n-predict", 'n', "N", 'n', 0, "tokens to generate (default 128)" },
    { "ignore-eos", 0, NULL, OPT_IGNORE_EOS, 0, "keep going past end-of-generation tokens" },
    { "json", 0, NULL, OPT_JSON, 0,
      "print one JSON object (text, prompt and output token ids, speed)\ninstead of the text" },
    { 0 }
};

static const cli_option *const groups[] = {
    cli_help_opts, cli_model_opts, generate_opts, cli_context_opts, cli_sampling_opts, NULL
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *read_all(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += r;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b)
                free(buf);
            buf = b;
        }
    }
    fclose(fp);
    if (buf)
        buf[n] = 0;
    return buf;
}

/* The generated text so far: [len] bytes of [cap], NUL kept room for. */
typedef struct gen_text {
    char  *buf;
    size_t len, cap;
} gen_text;

/* Append the text token `tok` completes (tok < 0: what the detokenizer still
 * holds back) to t, growing it as the piece needs: a token's piece has no
 * upper bound (a vocabulary may hold a 4 KB token). Echoed to stdout when
 * echo. false when memory ran out. */
static bool emit(kvc_detokenizer *dt, int32_t tok, gen_text *t, bool echo)
{
    for (;;) {
        size_t free_bytes = t->cap - t->len - 1;
        int room = free_bytes > INT_MAX ? INT_MAX : (int)free_bytes;
        char *at = t->buf + t->len;
        int k = tok >= 0 ? kvc_detokenizer_feed(dt, tok, at, room)
                         : kvc_detokenizer_flush(dt, at, room);
        if (k <= room) {              /* written (or a bad id: nothing) */
            if (k > 0) {
                t->len += (size_t)k;
                if (echo) {
                    fwrite(at, 1, (size_t)k, stdout);
                    fflush(stdout);
                }
            }
            return true;
        }
        size_t cap = t->cap * 2 > t->len + (size_t)k + 1 ? t->cap * 2 : t->len + (size_t)k + 1;
        char *b = realloc(t->buf, cap);   /* too small: nothing was consumed; again */
        if (!b)
            return false;
        t->buf = b;
        t->cap = cap;
    }
}

typedef struct gen_opts {
    cli_common  c;
    const char *prompt;
    const char *file;
    int64_t     n_predict;
    bool        ignore_eos;
} gen_opts;

/* Returns -1 to go on, else the exit code (0 after --help). */
static int parse(gen_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    cli_common_init(&o->c);
    o->n_predict = 128;
    cli_parser p;
    cli_parser_init(&p, "generate", argc, argv, groups);
    const char *v;
    int id, r;
    while ((id = cli_next_opt(&p, &v, help)) >= 0) {
        if ((r = cli_common_apply(&o->c, id, v)) < 0)
            return 2;
        if (r > 0)
            continue;
        if (id == 'p')
            o->prompt = v;
        else if (id == 'f')
            o->file = v;
        else if (id == 'n' && !cli_int("--n-predict", v, 0, 1 << 30, &o->n_predict))
            return 2;
        else if (id == OPT_IGNORE_EOS)
            o->ignore_eos = true;
        else if (id == OPT_JSON)
            o->c.json = true;
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    if (o->prompt && o->file) {
        fprintf(stderr, "kvchat generate: -p and -f: give one\n");
        return 2;
    }
    return cli_no_operands(&p) ? 2 : -1;
}

int cmd_generate(int argc, char **argv)
{
    gen_opts o;
    int rc = parse(&o, argc, argv);
    if (rc >= 0)
        return rc;
    char *file_text = NULL;
    if (o.file && !(file_text = read_all(o.file))) {
        fprintf(stderr, "kvchat generate: cannot read %s\n", o.file);
        return 1;
    }
    const char *prompt = file_text ? file_text : o.prompt ? o.prompt : "Once upon a time";

    kvc_model *m = cli_load_model(&o.c);
    kvc_context *ctx = m ? cli_new_context(&o.c, m, 1) : NULL;
    kvc_sampler *smp = NULL;
    kvc_detokenizer *dt = ctx ? kvc_detokenizer_new(m, false) : NULL;
    int32_t *toks = NULL, *out = NULL;
    gen_text text = { 0 };
    rc = 1;
    if (!m || !ctx)
        goto done;
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    smp = kvc_sampler_new(&o.c.sampling, info.n_vocab);
    if (!smp || !dt)
        goto done;

    size_t plen = strlen(prompt);
    int64_t n = kvc_model_tokenize(m, prompt, plen, true, true, NULL, 0);
    toks = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    out = malloc((size_t)(o.n_predict > 0 ? o.n_predict : 1) * sizeof(int32_t));
    text.cap = 4096;
    text.buf = malloc(text.cap);
    if (n < 0 || !toks || !out || !text.buf) {
        fprintf(stderr, "kvchat generate: tokenizing failed\n");
        goto done;
    }
    kvc_model_tokenize(m, prompt, plen, true, true, toks, n);
    if (n == 0) {
        fprintf(stderr, "kvchat generate: the prompt is empty and the vocabulary adds no BOS\n");
        goto done;
    }
    int32_t n_ctx = kvc_context_n_ctx(ctx);
    if (n + o.n_predict > n_ctx) {
        fprintf(stderr, "kvchat generate: prompt (%lld tokens) + %lld to generate exceed the context of %d\n",
                (long long)n, (long long)o.n_predict, n_ctx);
        goto done;
    }
    char err[512];
    for (int64_t i = 0; i < n; i++)
        kvc_sampler_accept(smp, toks[i]);
    double t0 = now_ms();
    if (kvc_context_decode(ctx, 0, toks, (int32_t)n, false, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat generate: %s\n", err);
        goto done;
    }
    double t1 = now_ms(), t_first = 0;
    if (!o.c.json) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    int64_t n_out = 0;
    bool ok = true;
    for (; ok && n_out < o.n_predict; n_out++) {
        int32_t tok = kvc_sampler_sample(smp, kvc_context_logits(ctx, -1));
        if (n_out == 0)
            t_first = now_ms();
        if (!o.ignore_eos && kvc_model_token_is_eog(m, tok))
            break;
        out[n_out] = tok;
        kvc_sampler_accept(smp, tok);
        ok = emit(dt, tok, &text, !o.c.json);
        if (ok && n_out + 1 < o.n_predict &&
            kvc_context_decode(ctx, 0, &tok, 1, false, err, sizeof(err)) != KVC_OK) {
            fprintf(stderr, "\nkvchat generate: %s\n", err);
            goto done;
        }
    }
    if (!ok || !emit(dt, -1, &text, !o.c.json)) {
        fprintf(stderr, "\nkvchat generate: out of memory\n");
        goto done;
    }
    text.buf[text.len] = 0;
    double t2 = now_ms();
    double pp_tps = n / ((t1 - t0) / 1e3);
    double tg_tps = n_out > 1 ? (n_out - 1) / ((t2 - t_first) / 1e3) : 0.0;
    if (o.c.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "text", text.buf);
        cJSON_AddItemToObject(j, "prompt_tokens", cJSON_CreateIntArray(toks, (int)n));
        cJSON_AddItemToObject(j, "tokens", cJSON_CreateIntArray(out, (int)n_out));
        cJSON_AddNumberToObject(j, "prompt_ms", t1 - t0);
        cJSON_AddNumberToObject(j, "prompt_tps", pp_tps);
        cJSON_AddNumberToObject(j, "generate_tps", tg_tps);
        char *s = cJSON_PrintUnformatted(j);
        puts(s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("\n");
        fprintf(stderr, "\nprompt: %lld tokens | %.1f tok/s | output: %lld tokens | %.1f tok/s\n",
                (long long)n, pp_tps, (long long)n_out, tg_tps);
    }
    rc = 0;
done:
    free(toks);
    free(out);
    free(text.buf);
    free(file_text);
    kvc_detokenizer_free(dt);
    kvc_sampler_free(smp);
    kvc_context_free(ctx);
    kvc_model_free(m);
    return rc;
}
