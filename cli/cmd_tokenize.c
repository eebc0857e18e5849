/* cmd_tokenize.c - kvchat tokenize: show how text tokenizes. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"
#include "tokenizer.h"

static const char help[] =
    "usage: kvchat tokenize [-m MODEL.gguf] [--ids] [--no-bos] [--no-parse-special] TEXT\n\n"
    "Prints one token a line (id and text), or with --ids the list [id, id, ...].\n"
    "BOS is added when the vocabulary asks for it, unless --no-bos.\n";

int cmd_tokenize(int argc, char **argv)
{
    cli_common c;
    cli_common_init(&c);
    bool ids_only = false, bos = true, special = true;
    const char *text = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\nOptions:\n%s", help, cli_common_help);
            return 0;
        }
        int r = cli_parse_common(&c, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--ids"))
            ids_only = true;
        else if (!strcmp(a, "--no-bos"))
            bos = false;
        else if (!strcmp(a, "--no-parse-special"))
            special = false;
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc)
            text = argv[++i];
        else if (a[0] == '-' && a[1] != 0)
            return cli_bad_option("tokenize", a);
        else
            text = a;
    }
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
