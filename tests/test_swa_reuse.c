/* test_swa_reuse.c - issue 31's five-turn scenario over HTTP on the
 * sliding-window models: every turn reuses every prompt token before its
 * divergence point, and every warm reply equals a fresh process's.
 *
 * Prompts are token ids (/v1/completions), so divergence points are exact:
 * T1 400 tokens; T2 = T1 + T1's reply + 300 tokens; T3 = T2 + T2's reply + 20;
 * T4 = T1's 400 + other tokens (diverges right after T1's prompt); T5 = T1's
 * first 380 + other tokens. The conversation outgrows every window (tiny-gemma3
 * 12, tiny-gpt-oss 8, tiny-gemma4 8 with its global layers' own head size and
 * KV heads, and with its last 3 layers KV-shared; tiny-gemma4-dw, FFNs of
 * per-layer widths as Gemma 4 E2B's; the generated ones of make-model, and
 * ../shared's when
 * present). Checked: usage.prompt_tokens_details.cached_tokens is at least the
 * longest prefix the turn shares with an earlier prompt (the replies' tokens
 * are not counted: what more the server reuses is a bonus), the reply equals
 * that of a server process started for that one request (no disk tier).
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include "test.h"

#include "http_client.h"
#include "reuse_http.h"
#include "model.h"

#define N_T1   400
#define N_LONG 300

static const char *bin;

static void run(const char *path, const char *name, int n_vocab)
{
    const char *const args[] = { "-m", path, "-t", "1", NULL };
    reuse_five_turns(&(reuse_case){ .bin = bin, .path = path, .warm_args = args, .name = name,
                                    .n_vocab = n_vocab, .n_t1 = N_T1, .n_long = N_LONG });
}

/* Deep divergence (kv.h's kept windows): with a window slab too small for
 * the whole conversation (--parallel 1: 2 x 2 running windows of chunks,
 * about 2000 positions of these models), N_DEEP turns of N_LONG tokens and a
 * reply each, then requests that diverge right after an early turn's prompt
 * (the first, the third, the fifth): each reuses that whole prompt (its
 * windows were kept while the later turns slid theirs out), and replies as a
 * fresh process does. Before the windows of prompt ends and message starts
 * were kept, the early ones were evicted first and these requests reused
 * nothing. */
#define N_DEEP 10
enum { CAP = 8192 };

/* A conversation of n_turns turns on the server at port: turn[k] (len[k]
 * tokens) is turn k - 1's, its reply, and n_long tokens of stream salt + k
 * (the first: N_T1); the last turn is sent too. */
static void converse(int port, int32_t (*turn)[CAP], int *len, int n_turns, int n_long,
                     uint32_t salt, int n_vocab)
{
    for (int k = 0; k < n_turns; k++) {
        int n = 0, n_r = 0;
        if (k > 0) {
            memcpy(turn[k], turn[k - 1], (size_t)len[k - 1] * sizeof(int32_t));
            n = len[k - 1];
            reply r = complete(port, turn[k - 1], len[k - 1]);
            int32_t *rt = r.text ? tokenize(port, r.text, &n_r) : NULL;
            if (rt && n + n_r + n_long + 100 < CAP)
                memcpy(turn[k] + n, rt, (size_t)n_r * sizeof(int32_t)), n += n_r;
            free(rt);
            free(r.text);
        }
        len[k] = fill(turn[k], n, k == 0 ? N_T1 : n_long, salt + (uint32_t)k, n_vocab);
    }
    reply last = complete(port, turn[n_turns - 1], len[n_turns - 1]);
    free(last.text);
}

/* The reply of a server process started for this one request (no disk tier). */
static reply fresh_reply(const char *path, const int32_t *toks, int n)
{
    const char *const args[] = { "-m", path, "-t", "1", "-c", "8192", "--cache-disk", "0", NULL };
    reply f = { 0 };
    http_server fresh;
    if (http_server_start(&fresh, bin, args, 30)) {
        f = complete(fresh.port, toks, n);
        http_server_stop(&fresh);
    }
    return f;
}

static void run_deep(const char *path, const char *name, int n_vocab)
{
    const char *const args[] = { "-m", path, "-t", "1", "--parallel", "1", "-c", "8192",
                                 "--cache-disk", "0", NULL };
    http_server warm;
    CHECKF(http_server_start(&warm, bin, args, 30), "%s: warm server", name);
    if (!warm.pid)
        return;
    static int32_t turn[N_DEEP][CAP], probe[CAP];
    int len[N_DEEP] = { 0 };
    converse(warm.port, turn, len, N_DEEP, N_LONG, 100, n_vocab);
    for (int k = 0; k < 5; k += 2) {
        memcpy(probe, turn[k], (size_t)len[k] * sizeof(int32_t));
        const int n = fill(probe, len[k], 60, 200 + (uint32_t)k, n_vocab);
        reply w = complete(warm.port, probe, n), f = fresh_reply(path, probe, n);
        printf("  %s deep: diverging after turn %d's prompt (%d of %d tokens, conversation %d): "
               "%d cached\n", name, k + 1, len[k], n, len[N_DEEP - 1], w.cached_tokens);
        CHECKF(w.cached_tokens >= len[k] && w.cached_tokens < n,
               "%s deep: turn %d's prompt of %d tokens, %d cached", name, k + 1, len[k],
               w.cached_tokens);
        CHECKF(w.text && f.text && strcmp(w.text, f.text) == 0,
               "%s deep turn %d: warm \"%s\" != fresh process \"%s\"", name, k + 1,
               w.text ? w.text : "(null)", f.text ? f.text : "(null)");
        free(w.text);
        free(f.text);
    }
    http_server_stop(&warm);
}

/* Deep divergence after RAM pressure (DESIGN.md §5's disk tier):
 * conversation A of N_DISK turns of N_LONG_DISK tokens, then conversation B
 * as long (about 5,300 tokens each), on a pool of about 7,000 tokens
 * (--kv-budget 4: one of them, not both) whose window slabs hold two running
 * windows of batches of 64 (about 450 positions, less than a message): A's
 * blocks and nearly all of its window chunks
 * leave RAM, the blocks when the tree evicts them, the window chunks as the
 * windows slide on. Then requests that diverge inside A's messages (not at
 * a message start or prompt end: no window was kept there), deep in it: each
 * reuses every full block before its divergence point, window chunks
 * included, from RAM or the disk tier, and replies as a fresh process does.
 * Before evicted window chunks went to the disk tier (and were read back
 * for a block still in RAM), these stopped at the last window still in RAM. */
#define N_DISK 8
#define N_LONG_DISK 700

/* /metrics after those probes: the window chunks that went to the disk tier
 * and came back are counted, with their bytes (each chunk at most every
 * window size's chunk of a block, kvchat_kv_window_chunk_bytes), and none
 * was missed. */
static void window_metrics(int port, const char *name)
{
    http_resp r = http_request(port, "GET", "/metrics", NULL, 10);
    const char *t = r.body ? r.body : "";
    const double cb = http_prom(t, "kvchat_kv_window_chunk_bytes"),
                 wr = http_prom(t, "kvchat_tier_window_chunks_written_total"),
                 wb = http_prom(t, "kvchat_tier_window_written_bytes_total"),
                 fe = http_prom(t, "kvchat_tier_window_chunks_fetched_total"),
                 rb = http_prom(t, "kvchat_tier_window_read_bytes_total"),
                 mi = http_prom(t, "kvchat_tier_window_chunks_missed_total");
    printf("  %s window chunks below RAM: %.0f written (%.0f bytes), %.0f fetched (%.0f bytes), "
           "%.0f missed; a block's window chunks %.0f bytes\n", name, wr, wb, fe, rb, mi, cb);
    CHECKF(cb > 0 && wr > 0 && wb >= wr && wb <= wr * cb && fe > 0 && rb >= fe && rb <= fe * cb && fe <= wr,
           "%s: window chunk metrics", name);
    CHECKF(mi == 0, "%s: %.0f window chunks missed", name, mi);
    http_resp_free(&r);
}

static void run_deep_disk(const char *path, const char *name, int n_vocab)
{
    char dir[] = "/tmp/kvc_swa_disk_XXXXXX";
    if (!mkdtemp(dir))
        return;
    const char *const args[] = { "-m", path, "-t", "1", "--parallel", "1", "-b", "64", "-c", "8192",
                                 "--kv-budget", "4", "--cache-disk", "64", "--cache-dir", dir, NULL };
    http_server warm;
    CHECKF(http_server_start(&warm, bin, args, 30), "%s: warm server", name);
    static int32_t a[N_DISK][CAP], b[N_DISK][CAP], probe[CAP];
    int len_a[N_DISK] = { 0 }, len_b[N_DISK] = { 0 };
    if (warm.pid) {
        converse(warm.port, a, len_a, N_DISK, N_LONG_DISK, 300, n_vocab);
        converse(warm.port, b, len_b, N_DISK, N_LONG_DISK, 400, n_vocab);
    }
    for (int k = 1; warm.pid && k < N_DISK - 1; k += 2) {
        const int d = len_a[k] - N_LONG_DISK + 357;   /* inside turn k's message */
        memcpy(probe, a[k], (size_t)d * sizeof(int32_t));
        const int n = fill(probe, d, 60, 500 + (uint32_t)k, n_vocab);
        reply w = complete(warm.port, probe, n), f = fresh_reply(path, probe, n);
        printf("  %s deep, after RAM pressure: diverging inside turn %d's message (%d of %d "
               "tokens, conversations %d and %d): %d cached\n", name, k + 1, d, n, len_a[N_DISK - 1],
               len_b[N_DISK - 1], w.cached_tokens);
        CHECKF(w.cached_tokens >= d - d % KVC_BLOCK_TOKENS && w.cached_tokens <= d,
               "%s deep after RAM pressure: diverging at %d, %d cached", name, d, w.cached_tokens);
        CHECKF(w.text && f.text && strcmp(w.text, f.text) == 0,
               "%s deep after RAM pressure, turn %d: warm \"%s\" != fresh process \"%s\"", name,
               k + 1, w.text ? w.text : "(null)", f.text ? f.text : "(null)");
        free(w.text);
        free(f.text);
    }
    window_metrics(warm.port, name);
    http_server_stop(&warm);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_swa_reuse: skipped ($KVC_BIN not set)\n");
        return TEST_SKIP;
    }
    char dir[] = "/tmp/kvc_swa_reuse_XXXXXX", path[4200];
    if (!mkdtemp(dir))
        return 1;
    struct { const char *preset, *file; int32_t n_kv_shared; } models[] = {
        { "tiny-gemma3", NULL, 0 }, { "tiny-gpt-oss", NULL, 0 }, { "tiny-gemma4", NULL, 0 },
        { "tiny-gemma4", NULL, 3 },   /* the last 3 layers KV-shared: no memory of their own */
        { "tiny-gemma4-dw", NULL, 3 },   /* FFN widths per layer, double-wide KV-shared layers */
        { NULL, "tiny-gemma3-f32.gguf", 0 }, { NULL, "tiny-gpt-oss-f32.gguf", 0 },
        { NULL, "tiny-gemma4-f32.gguf", 0 },
    };
    const char *shared = test_shared_dir();
    for (size_t k = 0; k < KVC_ARRAY_LEN(models); k++) {
        char err[512];
        char name[128];
        snprintf(name, sizeof(name), "%s%s", models[k].preset ? models[k].preset : models[k].file,
                 models[k].n_kv_shared ? " (KV-shared layers)" : "");
        if (models[k].preset) {
            kvc_gen_params g;
            CHECK_EQ_INT(kvc_gen_preset(models[k].preset, &g), KVC_OK);
            g.n_threads = 2;
            g.n_kv_shared = models[k].n_kv_shared;
            snprintf(path, sizeof(path), "%s/%s-%d.gguf", dir, models[k].preset, models[k].n_kv_shared);
            CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
        } else {
            snprintf(path, sizeof(path), "%s/models/%s", shared ? shared : "", models[k].file);
            if (!shared || access(path, R_OK) != 0) {
                printf("  %s: skipped (absent)\n", name);
                continue;
            }
        }
        kvc_model *m = NULL;
        CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
        if (!m)
            continue;
        kvc_model_info info;
        kvc_model_get_info(m, &info);
        kvc_model_free(m);
        run(path, name, info.n_vocab);
        run_deep(path, name, info.n_vocab);
        if (!models[k].file)
            run_deep_disk(path, name, info.n_vocab);
        if (models[k].preset)
            unlink(path);
    }
    rmdir(dir);
    return test_done("test_swa_reuse");
}
