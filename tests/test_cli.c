/* test_cli.c - the kvchat command as a user runs it: help, bad input, and the
 * outputs other tools read (tokenize --ids, eval --json, chat --script --json).
 * Bad input must give a clear error naming what was wrong and a non-zero exit,
 * never a crash (a signal). */
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static const char *bin;
static char tmpdir[256];

/* Run a shell command; its stdout+stderr in *out (malloc'd). Returns the exit
 * status, or 1000 + signal when it was killed. */
static int run(char **out, const char *fmt, ...)
{
    char cmd[8192], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    snprintf(path, sizeof(path), "%s/out.txt", tmpdir);
    char full[9000];
    snprintf(full, sizeof(full), "(%s) > %s 2>&1", cmd, path);
    int st = system(full);
    *out = test_read_file(path, NULL);
    if (!*out)
        *out = strdup("");
    if (WIFSIGNALED(st))
        return 1000 + WTERMSIG(st);
    /* the shell reports a signal of its child as 128 + n */
    int code = WEXITSTATUS(st);
    return code > 128 ? 1000 + code - 128 : code;
}

static void expect_error(const char *what, const char *needle, const char *fmt, const char *arg)
{
    char *out;
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), fmt, bin, arg);
    int rc = run(&out, "%s", cmd);
    CHECKF(rc > 0 && rc < 1000, "%s: exit %d (want a clean failure)\n%s", what, rc, out);
    CHECKF(strstr(out, needle) != NULL, "%s: message lacks '%s':\n%s", what, needle, out);
    free(out);
}

static void write_file(const char *name, const void *data, size_t n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fwrite(data, 1, n, fp);
        fclose(fp);
    }
}

/* Every option --help lists for cmd is one it takes: given with a value
 * (--opt=x) before --help, it may be refused for its value but never as
 * unknown. */
static void check_help_true(const char *cmd, const char *help)
{
    int n = 0;
    for (const char *l = help; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *o = !strncmp(l, "      --", 8) ? l + 6 : !strncmp(l, "  -", 3) && !strncmp(l + 5, ", --", 4)
                        ? l + 7 : NULL;
        if (!o)
            continue;
        char name[64];
        size_t len = strspn(o, "-abcdefghijklmnopqrstuvwxyz0123456789");
        if (len >= sizeof(name) || !strncmp(o, "--help", 6) || !strncmp(o, "--version", 9))
            continue;
        memcpy(name, o, len);
        name[len] = 0;
        char *out;
        int rc = run(&out, "%s %s %s=1 --help </dev/null", bin, cmd, name);
        CHECKF(rc < 1000 && !strstr(out, "unknown option") && !strstr(out, "ambiguous"),
               "%s: --help lists %s, which it refuses (%d):\n%s", cmd, name, rc, out);
        free(out);
        n++;
    }
    CHECKF(n > 0, "%s --help lists no option", cmd);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_cli: KVC_BIN not set, skipped\n");
        return TEST_SKIP;
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_cli_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    setenv("KVCHAT_CACHE", tmpdir, 1);
    char *out;

    /* help for every command, true to what it takes */
    const char *cmds[] = { "generate", "eval", "tokenize", "bench", "bench chat", "bench sessions",
                           "make-model", "chat", "serve" };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        int rc = run(&out, "%s %s --help", bin, cmds[i]);
        CHECKF(rc == 0 && strstr(out, "usage: kvchat"), "%s --help: %d\n%s", cmds[i], rc, out);
        check_help_true(cmds[i], out);
        free(out);
    }
    /* options a command does not take are refused, not silently ignored */
    expect_error("serve --json", "unknown option '--json'", "%s serve --json%s", "");
    expect_error("tokenize --temp", "unknown option '--temp'", "%s tokenize --temp 1 hi%s", "");
    expect_error("bench --seed", "unknown option '--seed'", "%s bench --seed 1%s", "");
    expect_error("generate --port=", "unknown option '--port'", "%s generate --port=9000%s", "");
    expect_error("a flag given a value", "--ids takes no value", "%s tokenize --ids=1 hi%s", "");
    expect_error("missing value", "--threads needs a value", "%s generate --threads%s", "");
    expect_error("ambiguous abbreviation", "ambiguous option '--max-conn'", "%s serve --max-conn 3%s", "");
    expect_error("stray operand", "unexpected argument 'stray'", "%s generate -p hi stray%s", "");
    /* a single-valued option given twice: refused, naming both values (it used to take the last) */
    expect_error("-m twice", "-m/--model given twice ('a.gguf', then 'b.gguf')",
                 "%s serve -m a.gguf -m b.gguf%s", "");
    expect_error("--temp twice, by alias", "--temp given twice", "%s generate --temp 1 --temperature=2%s", "");
    expect_error("--port twice", "--port given twice", "%s serve --port=1 --port 2%s", "");
    expect_error("--chat-template and its file", "give one",
                 "%s chat --chat-template chatml --chat-template-file /dev/null%s", "");
    /* --version: the project's version */
    int vrc = run(&out, "%s --version", bin);
    CHECKF(vrc == 0 && !strncmp(out, "kvchat 0.", 9), "--version: %d %s", vrc, out);
    free(out);
    expect_error("unknown command", "unknown command 'frobnicate'", "%s frobnicate%s", "");

    /* a model: the tiny preset */
    char model[512];
    snprintf(model, sizeof(model), "%s/tiny.gguf", tmpdir);
    int rc = run(&out, "%s make-model --preset tiny -o %s", bin, model);
    CHECKF(rc == 0, "make-model: %s", out);
    free(out);

    /* bad input: each a clear message, a non-zero exit, no crash */
    write_file("empty.gguf", "", 0);
    write_file("magic.gguf", "GGUX\3\0\0\0", 8);
    char trunc[64];
    memcpy(trunc, "GGUF\3\0\0\0\1\0\0\0\0\0\0\0\5\0\0\0\0\0\0\0", 24);
    write_file("trunc.gguf", trunc, 24);
    char path[600];
    snprintf(path, sizeof(path), "%s/empty.gguf", tmpdir);
    expect_error("empty file", "empty.gguf", "%s generate -m %s -p hi", path);
    snprintf(path, sizeof(path), "%s/magic.gguf", tmpdir);
    expect_error("wrong magic", "magic", "%s generate -m %s -p hi", path);
    snprintf(path, sizeof(path), "%s/trunc.gguf", tmpdir);
    expect_error("truncated", "trunc.gguf", "%s tokenize -m %s hi", path);
    expect_error("missing file", "no-such.gguf", "%s generate -m %s -p hi", "/nonexistent/no-such.gguf");
    expect_error("bad thread count", "--threads", "%s generate -m x.gguf --threads %s", "zero");
    expect_error("bad option", "unknown option '--frob'", "%s generate --frob%s", "");
    expect_error("bad kv type", "--kv-type", "%s generate --kv-type %s", "q3");
    expect_error("bad make-model float", "--rope-theta needs a number",
                 "%s make-model -o /nonexistent/x.gguf --rope-theta %s", "abc");
    expect_error("bad make-model int", "--n-layer needs an integer",
                 "%s make-model -o /nonexistent/x.gguf --n-layer %s", "-3");
    expect_error("bad token list", "bad token list", "%s eval --tokens 1,x,3 -m %s", model);
    expect_error("eval token out of range", "out of range", "%s eval --json --tokens 1,999999 -m %s", model);
    char long_prompt[9000] = "";
    for (int i = 0; i < 200; i++)   /* well past -c 64, and the command fits its buffer */
        strcat(long_prompt, "word ");
    char cmd[12000];
    snprintf(cmd, sizeof(cmd), "%%s generate -c 64 -n 4 -p '%s' -m %%s", long_prompt);
    expect_error("prompt longer than the context", "exceed the context", cmd, model);

    /* --opt=value, --opt value, -xVALUE and -x VALUE are the same */
    char *a1, *a2;
    int r1 = run(&a1, "%s generate -m %s --n-predict=3 --threads=1 --prompt=Hi --json", bin, model);
    int r2 = run(&a2, "%s generate -m%s -n3 -t 1 -p Hi --json", bin, model);
    const char *e1 = strstr(a1, ",\"prompt_ms\""), *e2 = strstr(a2, ",\"prompt_ms\"");   /* before the timings */
    CHECKF(r1 == 0 && r2 == 0 && e1 && e2 && e1 - a1 == e2 - a2 && !memcmp(a1, a2, (size_t)(e1 - a1)),
           "option forms differ:\n%s\n%s", a1, a2);
    free(a1);
    free(a2);
    /* operands may stand before options (GNU order) */
    rc = run(&out, "%s tokenize 'Hello world' --ids -m %s", bin, model);
    CHECKF(rc == 0 && out[0] == '[', "tokenize TEXT --ids: %s", out);
    free(out);

    /* tokenize --ids, eval --json */
    rc = run(&out, "%s tokenize -m %s --ids 'Hello world'", bin, model);
    CHECKF(rc == 0 && out[0] == '[', "tokenize --ids: %s", out);
    free(out);
    rc = run(&out, "%s eval -m %s --tokens 1,2,3,4 --from 2 --top 3 --json", bin, model);
    CHECKF(rc == 0 && strstr(out, "{\"logits\": [{\"pos\": 2, \"top\": [[") && strstr(out, "\"pos\": 3") &&
           !strstr(out, "\"pos\": 1"), "eval: %s", out);
    free(out);

    /* eval does not depend on the batch size */
    char *a, *b;
    run(&a, "%s eval -m %s --tokens 5,6,7,8,9,10,11,12,13 --top 5 -b 9", bin, model);
    run(&b, "%s eval -m %s --tokens 5,6,7,8,9,10,11,12,13 --top 5 -b 2 -t 1", bin, model);
    CHECKF(strcmp(a, b) == 0, "eval differs with -b 2 -t 1:\n%s\n%s", a, b);
    free(a);
    free(b);

    /* chat --script: cached and cold replies equal, cache used */
    const char *conv = "{\"system\": \"Be brief.\", \"turns\": [\"Hi!\", \"Tell me about rivers.\", "
                       "{\"regen\": true}, {\"edit\": 0, \"user\": \"Hello!\"}, \"And lakes?\"]}";
    write_file("conv.json", conv, strlen(conv));
    rc = run(&a, "%s chat -m %s --script %s/conv.json --json -n 8", bin, model, tmpdir);
    CHECKF(rc == 0, "chat --script: %s", a);
    rc = run(&b, "%s chat -m %s --script %s/conv.json --json -n 8 --no-cache", bin, model, tmpdir);
    CHECKF(rc == 0, "chat --script --no-cache: %s", b);
    int lines = 0;
    for (char *p = a, *q = b; p && q && *p; lines++) {
        char *pe = strchr(p, '\n'), *qe = strchr(q, '\n');
        if (!pe || !qe)
            break;
        char *ra = strstr(p, "\"reply\":"), *rb = strstr(q, "\"reply\":");
        CHECK(ra && rb && ra < pe && rb < qe);
        if (ra && rb)
            CHECKF(pe - ra == qe - rb && memcmp(ra, rb, (size_t)(pe - ra)) == 0, "turn %d replies differ", lines);
        p = pe + 1;
        q = qe + 1;
    }
    CHECK_EQ_INT(lines, 5);
    CHECK(strstr(a, "\"cached_tokens\":0") != NULL);         /* the first turn */
    CHECKF(strstr(a, "\"computed_tokens\":1,") != NULL, "regeneration did not reuse the prompt: %s", a);
    CHECK(strstr(b, "\"cached_tokens\":1") == NULL);
    free(a);
    free(b);
    expect_error("bad script", "/dev/null", "%s chat -m %s --script /dev/null --json", model);

    /* bench prints llama-bench's rows */
    rc = run(&out, "%s bench -m %s -p 16 -n 4 -r 1", bin, model);
    CHECKF(rc == 0 && strstr(out, "pp16") && strstr(out, "tg4"), "bench: %s", out);
    free(out);
    /* at a depth, on a hybrid model whose state cannot be cut back to it: each
     * run is after exactly that depth (it used to run after 0 tokens) */
    char hybrid[600];
    snprintf(hybrid, sizeof(hybrid), "%s.qwen35.gguf", model);
    rc = run(&out, "%s make-model --preset tiny-qwen35 -o %s", bin, hybrid);
    CHECKF(rc == 0, "make-model tiny-qwen35: %s", out);
    free(out);
    rc = run(&out, "%s bench -m %s -p 8 -n 4 -d 40 -r 2", bin, hybrid);
    CHECKF(rc == 0 && strstr(out, "pp8 @ d40") && strstr(out, "tg4 @ d40"), "bench at a depth: %s", out);
    free(out);
    unlink(hybrid);
    /* bench chat: its reruns on fresh contexts reply as the first run did, and
     * the medians follow; the pairs side by side compute as many tokens as the
     * conversation's turn 1 and turn 3 did */
    rc = run(&out, "%s bench chat -m %s --turns 3 --turn-tokens 8 --reply-tokens 3 --reps 3 --pairs 2", bin,
             model);
    CHECKF(rc == 0 && strstr(out, "| 3 |") && strstr(out, "median of 3 runs") && strstr(out, "median of 2 pairs"),
           "bench chat: %s", out);
    {
        int c1 = -1, c3 = -1, p1 = -2, p3 = -2, x;
        const char *r1 = out ? strstr(out, "| 1 |") : NULL, *r3 = out ? strstr(out, "| 3 |") : NULL;
        const char *sb = out ? strstr(out, "side by side") : NULL;
        if (r1 && sscanf(r1, "| 1 | %d | %d | %d |", &x, &x, &c1) != 3)
            c1 = -1;
        if (r3 && sscanf(r3, "| 3 | %d | %d | %d |", &x, &x, &c3) != 3)
            c3 = -1;
        if (sb && sscanf(sb, "side by side, 2 pairs: turn 1 computes %d tokens on a fresh context, turn 3 %d", &p1,
                         &p3) != 2)
            p1 = p3 = -2;
        /* A prompt is tokenized whole between template control tokens, so the
         * last token of the next turn's header may merge with the message that
         * follows it: the background step, which renders the header without the
         * message, can leave that one token to the turn. */
        CHECKF(c1 > 0 && c3 > 0 && p1 == c1 && (p3 == c3 || p3 + 1 == c3),
               "bench chat pairs compute %d and %d, the turns %d and %d", p1, p3, c1, c3);
    }
    free(out);

    /* the demo model: generated when no model is given */
    rc = run(&out, "%s generate -p 'Once upon a time' -n 4", bin);
    CHECKF(rc == 0 && strstr(out, "Once upon a time") && strstr(out, "demo"), "demo: %s", out);
    free(out);

    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_cli");
}
