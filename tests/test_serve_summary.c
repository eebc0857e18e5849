/* test_serve_summary.c - what `kvchat serve` says at start (issue 29): one
 * summary, each line true to what runs (the model, its weight types, the
 * context, the KV budget in tokens and MiB, threads, the disk tier's
 * directory and budget, Redis without its password, API keys), nothing of it
 * with --quiet, and loading progress for a large model when stderr is a log. */
#include <stdarg.h>
#include <unistd.h>

#include "test.h"

static const char *bin;
static char tmpdir[256];

/* Start `kvchat serve --port 0 ARGS` with stderr to a file, wait (at most
 * 60 s) for its 'listening on' line, stop it; its stderr (malloc'd). */
static char *serve_log(const char *fmt, ...)
{
    char args[2048], cmd[4096], log[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    /* a new file each call: the shell's grep may run before the server's
     * stderr is opened, and must not find the last server's line */
    static int calls;
    snprintf(log, sizeof(log), "%s/serve%d.log", tmpdir, calls++);
    snprintf(cmd, sizeof(cmd),
             "'%s' serve --port 0 -t 1 %s 2>%s & p=$!; i=0; "
             "while [ $i -lt 600 ] && ! grep -qs 'listening on' %s && kill -0 $p 2>/dev/null; do "
             "sleep 0.1; i=$((i+1)); done; kill $p 2>/dev/null; wait $p",
             bin, args, log, log);
    if (system(cmd) == -1)
        return strdup("");
    char *out = test_read_file(log, NULL);
    return out ? out : strdup("");
}

/* The line of out that starts with "  key" (NUL-terminated copy in buf). */
static const char *line_of(const char *out, const char *key, char *buf, size_t size)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\n  %s ", key);
    const char *at = strstr(out, pat);
    if (!at) {
        buf[0] = 0;
        return buf;
    }
    at += 1;
    snprintf(buf, size, "%.*s", (int)strcspn(at, "\n"), at);
    return buf;
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_serve_summary: KVC_BIN not set, skipped\n");
        return TEST_SKIP;
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvc_test_summary_XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    char cmd[2048], model[512], line[512];
    snprintf(model, sizeof(model), "%s/tiny.gguf", tmpdir);
    snprintf(cmd, sizeof(cmd), "'%s' make-model --preset tiny --type q8_0 -o %s 2>/dev/null", bin, model);
    CHECK(system(cmd) == 0);

    /* the summary, every line */
    char *out = serve_log("-m %s -c 512 --kv-budget 2 --cache-dir %s/kv --cache-disk 64 "
                          "--api-key k1 --api-key k2 --alias tiny-test", model, tmpdir);
    CHECKF(strstr(out, "kvchat 0."), "no version:\n%s", out);
    CHECKF(strstr(line_of(out, "model", line, sizeof(line)), "tiny-test: ") &&
           strstr(line, "tiny.gguf"), "model line: '%s'\n%s", line, out);
    CHECKF(strstr(line_of(out, "arch", line, sizeof(line)), "qwen2, 2 layers, n_embd 64"),
           "arch line: '%s'", line);
    /* q8_0 matrices, f32 norms: both named, q8_0 first (the larger share) */
    line_of(out, "weights", line, sizeof(line));
    CHECKF(strstr(line, "parameters") && strstr(line, "q8_0 ") && strstr(line, "f32 ") &&
           strstr(line, "q8_0 ") < strstr(line, "f32 "), "weights line: '%s'", line);
    CHECKF(strstr(line_of(out, "context", line, sizeof(line)), "512 tokens per conversation"),
           "context line: '%s'", line);
    /* 2 MiB of f16 KV: tokens * (2 layers * K and V * 2 KV heads * 16 dims * 2 bytes) */
    long long kv_tokens = -1;
    double kv_mib = -1;
    line_of(out, "KV cache", line, sizeof(line));
    CHECKF(sscanf(line, "  KV cache   %lld tokens, %lf MiB of f16", &kv_tokens, &kv_mib) == 2,
           "KV line: '%s'", line);
    CHECKF(kv_mib > 1.9 && kv_mib <= 2.0 && kv_tokens * 2 * 2 * 2 * 16 * 2 == 2 << 20,
           "KV cache: %lld tokens in %.2f MiB", kv_tokens, kv_mib);
    CHECKF(strstr(line_of(out, "compute", line, sizeof(line)), "1 thread, "), "compute line: '%s'", line);
    CHECKF(strstr(line_of(out, "template", line, sizeof(line)), "chatml"), "template line: '%s'", line);
    line_of(out, "disk tier", line, sizeof(line));
    CHECKF(strstr(line, tmpdir) && strstr(line, "/kv: ") && strstr(line, "64.0 MiB budget"),
           "disk line: '%s'", line);
    CHECKF(strstr(line_of(out, "Redis", line, sizeof(line)), "none"), "Redis line: '%s'", line);
    CHECKF(strstr(line_of(out, "API keys", line, sizeof(line)), "required: 2 keys"),
           "API keys line: '%s'", line);
    CHECKF(strstr(out, "listening on http://127.0.0.1:"), "%s", out);
    free(out);

    /* no disk tier, no key; a Redis URL shown without its password */
    out = serve_log("-m %s -c 256 --cache-disk 0 --cache-redis redis://u:s3cr3t@127.0.0.1:1/0 "
                    "--cache-redis-timeout 50", model);
    CHECKF(strstr(line_of(out, "disk tier", line, sizeof(line)), "off"), "disk line: '%s'", line);
    CHECKF(strstr(line_of(out, "Redis", line, sizeof(line)), "redis://u:***@127.0.0.1:1/0"),
           "Redis line: '%s'", line);
    CHECKF(!strstr(out, "s3cr3t"), "the Redis password is printed:\n%s", out);
    CHECKF(strstr(line_of(out, "API keys", line, sizeof(line)), "none"), "API keys line: '%s'", line);
    free(out);

    /* --quiet: no summary, still where it listens */
    out = serve_log("-m %s -c 256 --cache-disk 0 --quiet", model);
    CHECKF(!strstr(out, "  KV cache") && !strstr(out, "  model") && strstr(out, "listening on http://"),
           "--quiet:\n%s", out);
    free(out);

    /* a large model (> 64 MiB) loads with progress in a log: lines up to 100% */
    char big[512];
    snprintf(big, sizeof(big), "%s/big.gguf", tmpdir);
    snprintf(cmd, sizeof(cmd), "'%s' make-model --preset tiny --type f32 --n-embd 1024 --n-ff 2816 "
             "--n-head 8 --n-head-kv 2 --n-layer 3 -o %s 2>/dev/null", bin, big);
    CHECK(system(cmd) == 0);
    out = serve_log("-m %s -c 256 --cache-disk 0", big);
    CHECKF(strstr(out, "loading model: 50%") && strstr(out, "loading model: 100%") &&
           strstr(out, "listening on"), "no progress:\n%s", out);
    free(out);
    out = serve_log("-m %s -c 256 --cache-disk 0 -q", big);
    CHECKF(!strstr(out, "loading model") && strstr(out, "listening on"), "--quiet shows progress:\n%s", out);
    free(out);

    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_done("test_serve_summary");
}
