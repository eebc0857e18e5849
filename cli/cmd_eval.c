/* cmd_eval.c - kvchat eval: the logits of given tokens, as JSON.
 *
 * Feeds the tokens (teacher forcing) and prints, for every position p >= --from,
 * the --top highest logits predicting the token after p:
 *   {"logits": [{"pos": p, "top": [[id, logit], ...]}, ...]}
 * Logits are printed with 9 significant digits (float round-trip). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char help[] =
    "usage: kvchat eval [-m MODEL.gguf] --tokens ID,ID,... [--from N] [--top K]\n\n"
    "Prints JSON: {\"logits\": [{\"pos\": p, \"top\": [[id, logit], ...]}, ...]}. The logits\n"
    "do not depend on -b or -t.\n";

enum { OPT_TOKENS = CLI_OPT_CMD, OPT_FROM, OPT_TOP, OPT_JSON };

static const cli_option eval_opts[] = {
    { "tokens", 0, "LIST", OPT_TOKENS, 0, "comma-separated token ids (required)" },
    { "from", 0, "N", OPT_FROM, 0, "first position to report (default 0)" },
    { "top", 0, "K", OPT_TOP, 0, "logits per position, highest first (default 20)" },
    { "json", 0, NULL, OPT_JSON, 0, "JSON output (always: accepted for scripts that say so)" },
    { 0 }
};

static const cli_option *const groups[] = {
    cli_help_opts, cli_model_opts, eval_opts, cli_context_opts, NULL
};

static int parse_ids(const char *s, int32_t **out, int64_t *n)
{
    int64_t cap = 16, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    const char *p = s;
    while (ids && *p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "kvchat eval: bad token list near '%.20s'\n", p);
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *b = realloc(ids, (size_t)(cap *= 2) * sizeof(int32_t));
            if (!b)
                free(ids);
            ids = b;
            if (!ids)
                break;
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!ids || k == 0) {
        fprintf(stderr, "kvchat eval: no tokens\n");
        free(ids);
        return -1;
    }
    *out = ids;
    *n = k;
    return 0;
}

/* Indices of the k largest logits, largest first (ties: lower id first). */
static void top_k(const float *l, int32_t n, int32_t k, int32_t *idx)
{
    int32_t have = 0;
    for (int32_t i = 0; i < n; i++) {
        if (have == k && !(l[i] > l[idx[k - 1]]))
            continue;
        int32_t j = have < k ? have++ : k - 1;
        while (j > 0 && l[i] > l[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}

int cmd_eval(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    const char *list = NULL;
    int64_t from = 0, top = 20;
    cli_parser p;
    cli_parser_init(&p, "eval", argc, argv, groups);
    const char *v;
    int id, r;
    while ((id = cli_next_opt(&p, &v, help)) >= 0) {
        if ((r = cli_common_apply(&c, id, v)) < 0)
            return 2;
        if (r > 0)
            continue;
        if (id == OPT_TOKENS)
            list = v;
        else if (id == OPT_FROM && !cli_int("--from", v, 0, INT32_MAX, &from))
            return 2;
        else if (id == OPT_TOP && !cli_int("--top", v, 1, 1 << 20, &top))
            return 2;
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    if (cli_no_operands(&p))
        return 2;
    if (!list) {
        fprintf(stderr, "kvchat eval: --tokens is required\n");
        return 2;
    }
    int32_t *ids;
    int64_t n;
    if (parse_ids(list, &ids, &n) != 0)
        return 2;
    kvc_model *m = cli_load_model(&c);
    kvc_context *ctx = m ? cli_new_context(&c, m, 1) : NULL;
    int rc = 1;
    if (!ctx)
        goto done;
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    if (top > info.n_vocab)
        top = info.n_vocab;
    int32_t *idx = malloc((size_t)top * sizeof(int32_t));
    int32_t nb = kvc_context_n_batch(ctx);
    char err[512];
    printf("{\"logits\": [");
    bool first = true;
    for (int64_t done = 0; idx && done < n;) {
        int32_t k = (int32_t)KVC_MIN(n - done, (int64_t)nb);
        if (kvc_context_decode(ctx, 0, ids + done, k, true, err, sizeof(err)) != KVC_OK) {
            fprintf(stderr, "kvchat eval: %s\n", err);
            free(idx);
            printf("]}\n");
            goto done;
        }
        for (int32_t i = 0; i < k; i++) {
            int64_t pos = done + i;
            if (pos < from)
                continue;
            const float *l = kvc_context_logits(ctx, i);
            top_k(l, info.n_vocab, (int32_t)top, idx);
            printf("%s{\"pos\": %lld, \"top\": [", first ? "" : ", ", (long long)pos);
            for (int32_t t = 0; t < top; t++)
                printf("%s[%d, %.9g]", t ? ", " : "", idx[t], l[idx[t]]);
            printf("]}");
            first = false;
        }
        done += k;
    }
    printf("]}\n");
    free(idx);
    rc = idx ? 0 : 1;
done:
    free(ids);
    kvc_context_free(ctx);
    kvc_model_free(m);
    return rc;
}
