/* cmd_tokenize.c - kvchat tokenize: show how text tokenizes. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"
#include "tokenizer.h"

static const char help[] =
    "usage: kvchat tokenize [-m MODEL.gguf] [--ids] [--no-bos] [--no-parse-special] TEXT\n\n"
    "Prints one token a line (id and text), or with --ids the list [id, id, ...].\n"
    "BOS is added when the vocabulary asks for it, unless --no-bos. Only the model's\n"
    "vocabulary is read: a vocab-only GGUF will do.\n";

enum { OPT_IDS = CLI_OPT_CMD, OPT_NO_BOS, OPT_NO_PARSE_SPECIAL };

static const cli_option tokenize_opts[] = {
    { "prompt", 'p', "TEXT", 'p', 0, "the text (or give it as the operand TEXT)" },
    { "ids", 0, NULL, OPT_IDS, 0, "print the ids only, as a JSON list" },
    { "no-bos", 0, NULL, OPT_NO_BOS, 0, "add no BOS token" },
    { "no-parse-special", 0, NULL, OPT_NO_PARSE_SPECIAL, 0,
      "control-token text in TEXT stays plain text" },
    { 0 }
};

static const cli_option *const groups[] = { cli_help_opts, cli_model_opts, tokenize_opts, NULL };

int cmd_tokenize(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    bool ids_only = false, bos = true, special = true;
    const char *text = NULL;
    cli_parser p;
    cli_parser_init(&p, "tokenize", argc, argv, groups);
    const char *v;
    int id;
    while ((id = cli_next_opt(&p, &v, help)) >= 0) {
        if (cli_common_apply(&c, id, v) > 0)
            continue;
        if (id == OPT_IDS)
            ids_only = true;
        else if (id == OPT_NO_BOS)
            bos = false;
        else if (id == OPT_NO_PARSE_SPECIAL)
            special = false;
        else if (id == 'p')
            text = v;
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    int n_operands;
    char **operands = cli_operands(&p, &n_operands);
    if (n_operands > 1 || (n_operands == 1 && text)) {
        fprintf(stderr, "kvchat tokenize: one text only (quote it), got '%s' too\n",
                operands[n_operands - 1]);
        return 2;
    }
    if (n_operands == 1)
        text = operands[0];
    if (!text) {
        fprintf(stderr, "kvchat tokenize: no text given\n");
        return 2;
    }
    /* only the vocabulary is needed: a vocab-only GGUF, or one of an
     * architecture kvchat does not run, tokenizes too */
    const char *path = c.model ? c.model : cli_demo_model_path();
    gguf_file *f = NULL;
    kvc_tokenizer *tok = NULL;
    kvc_err err = { 0 };
    if (!path || gguf_open(path, &f, &err) || kvc_tokenizer_load(f, &tok, &err)) {
        if (path)
            fprintf(stderr, "kvchat: %s: %s\n", path, err.msg);
        gguf_close(f);
        return 1;
    }
    size_t len = strlen(text);
    int64_t n = kvc_tokenize(tok, text, len, bos, special, NULL, 0);
    int32_t *ids = n >= 0 ? malloc((size_t)(n ? n : 1) * sizeof(int32_t)) : NULL;
    if (!ids) {
        fprintf(stderr, "kvchat tokenize: failed\n");
        kvc_tokenizer_free(tok);
        gguf_close(f);
        return 1;
    }
    kvc_tokenize(tok, text, len, bos, special, ids, n);
    if (ids_only) {
        printf("[");
        for (int64_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
    } else {
        char piece[1024];
        for (int64_t i = 0; i < n; i++) {
            int k = kvc_token_to_piece(tok, ids[i], true, piece, sizeof(piece) - 1);
            if (k < 0 || k >= (int)sizeof(piece))
                k = 0;
            piece[k] = 0;
            printf("%6d -> '%s'\n", ids[i], piece);
        }
    }
    free(ids);
    kvc_tokenizer_free(tok);
    gguf_close(f);
    return 0;
}
