/* main.c - the kvchat command line: one command per cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kvc_version.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    { "chat",       cmd_chat,       "a conversation that computes only its new tokens" },
    { "serve",      cmd_serve,      "OpenAI-compatible HTTP server" },
    { "generate",   cmd_generate,   "continue a prompt" },
    { "eval",       cmd_eval,       "logits of given tokens, as JSON" },
    { "tokenize",   cmd_tokenize,   "show how text tokenizes" },
    { "bench",      cmd_bench,      "prompt-processing and generation speed" },
    { "make-model", cmd_make_model, "write a random-weight GGUF model" },
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvchat COMMAND [options]   (kvchat COMMAND --help for its options)\n"
                 "       kvchat --version\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nWithout -m, commands use a generated demo model (random weights).\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        printf("kvchat %s%s%s%s\n", KVC_VERSION, *KVC_GIT_DESCRIBE ? " (git " : "",
               KVC_GIT_DESCRIBE, *KVC_GIT_DESCRIBE ? ")" : "");
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvchat: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
