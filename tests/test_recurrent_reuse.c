/* test_recurrent_reuse.c - issue 32's five-turn scenario over HTTP on the
 * hybrid recurrent models (lfm2, lfm2moe, qwen35, qwen35moe, qwen3next, granitehybrid,
 * nemotron_h, nemotron_h_moe): every
 * turn reuses every prompt token before its divergence point, but T5, which
 * diverges 20 tokens before T1's prompt ends, at least 380 - S (S = 64, the
 * snapshot interval given); every warm reply equals a fresh process's.
 *
 * Prompts are token ids (/v1/completions), so divergence points are exact:
 * T1 400 tokens; T2 = T1 + T1's reply + 300 tokens; T3 = T2 + T2's reply + 20;
 * T4 = T1's 400 + other tokens (diverges right after T1's prompt); T5 = T1's
 * first 380 + other tokens. And a chat whose earlier message is edited
 * recomputes only from that message's start (within the few tokens of its
 * markup). And a conversation survives SIGKILL: its blocks and snapshots
 * are read back from the disk tier. Models: make-model's presets when it has them,
 * ../shared's tiny ones when present; a model this build cannot load yet (its
 * layers not written) is skipped, said so.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include "test.h"

#include "http_client.h"
#include "reuse_http.h"
#include "model.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#define N_T1   400
#define S_INT  64
#define N_LONG 300

static const char *bin;

/* The tokens the server gives the chat request `body` (rendered by
 * /apply-template, tokenized with its markup parsed); n_out of them. */
static int32_t *chat_tokens(int port, const char *body, int *n_out)
{
    http_resp r = http_request(port, "POST", "/apply-template", body, 30);
    cJSON *root = r.status == 200 && r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *p = cJSON_GetObjectItem(root, "prompt");
    int32_t *out = tokenize_ex(port, cJSON_IsString(p) ? p->valuestring : "", true, n_out);
    cJSON_Delete(root);
    http_resp_free(&r);
    return out;
}

/* A chat request: system, u1, a reply, a question; greedy, 8 tokens. */
static char *chat_body(const char *u1)
{
    cJSON *b = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(b, "messages");
    const char *role[] = { "system", "user", "assistant", "user" };
    const char *text[] = { "You are a terse assistant who answers in one line.", u1,
                           "It is a long story about a cat and a river.", "And then what happened?" };
    for (int i = 0; i < 4; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", role[i]);
        cJSON_AddStringToObject(m, "content", text[i]);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_AddNumberToObject(b, "max_tokens", 8);
    cJSON_AddNumberToObject(b, "temperature", 0);
    char *s = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    return s;
}

/* Post a chat body: its reply text and cached tokens. */
static reply chat(int port, const char *body)
{
    return post_reply(port, "/v1/chat/completions", body);
}

/* An earlier message edited: the edit's request recomputes only from that
 * message's start (a snapshot there; none every S tokens, to see it). */
static void edit_check(const char *path, const char *name)
{
    const char *const args[] = { "-m", path, "-t", "1", "--snapshot-interval", "0",
                                 "--cache-disk", "0", NULL };
    const char *const fresh_args[] = { "-m", path, "-t", "1", "--cache-disk", "0", NULL };
    http_server warm;
    CHECKF(http_server_start(&warm, bin, args, 30), "%s: warm server", name);
    if (!warm.pid)
        return;
    char u1[1200], u1b[1300];
    int k = 0;
    for (int i = 0; i < 40; i++)
        k += snprintf(u1 + k, sizeof(u1) - (size_t)k, "word%d and ", i * 7 % 13);
    snprintf(u1b, sizeof(u1b), "Edited: %s", u1);   /* changed from its first character */
    char *b1 = chat_body(u1), *b2 = chat_body(u1b);
    reply r1 = chat(warm.port, b1), r2 = chat(warm.port, b2);
    int n1 = 0, n2 = 0;
    int32_t *t1 = chat_tokens(warm.port, b1, &n1), *t2 = chat_tokens(warm.port, b2, &n2);
    int d = common_prefix(t1, n1, t2, n2);
    http_server fresh;
    reply f = { 0 };
    if (http_server_start(&fresh, bin, fresh_args, 30)) {
        f = chat(fresh.port, b2);
        http_server_stop(&fresh);
    }
    printf("  %s edit: %d prompt tokens, the edit at token %d, %d cached (first %d)\n", name,
           r2.prompt_tokens, d, r2.cached_tokens, r1.cached_tokens);
    CHECKF(n2 == r2.prompt_tokens && d > 8, "%s edit: %d tokens, server %d, divergence %d", name,
           n2, r2.prompt_tokens, d);
    CHECKF(r2.cached_tokens >= d - 8 && r2.cached_tokens <= d,
           "%s edit: %d cached, the edited message starts at about %d", name, r2.cached_tokens, d);
    CHECKF(r2.text && f.text && strcmp(r2.text, f.text) == 0, "%s edit: warm \"%s\" != fresh \"%s\"",
           name, r2.text ? r2.text : "(null)", f.text ? f.text : "(null)");
    free(r1.text);
    free(r2.text);
    free(f.text);
    free(t1);
    free(t2);
    free(b1);
    free(b2);
    http_server_stop(&warm);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A conversation survives SIGKILL: T1 (n1 tokens) on a server with a disk
 * tier, the server killed, a new one on the same directory answers T1 + 60
 * tokens from T1's blocks and end-of-prompt snapshot read back, with a
 * fresh process's reply. Prints its time against a fresh process's. A T1
 * that ends inside a block needs the snapshot's own partial block: the tree
 * read back from disk has no partial match there. */
static void restart_check(const char *path, const char *name, int n_vocab, int n1)
{
    char dir[] = "/tmp/kvc_recurrent_restart_XXXXXX";
    if (!mkdtemp(dir))
        return;
    const char *const args[] = { "-m", path, "-t", "1", "--snapshot-interval", "64",
                                 "--cache-dir", dir, "--cache-disk", "256", NULL };
    const char *const fresh_args[] = { "-m", path, "-t", "1", "--cache-disk", "0", NULL };
    static int32_t t[N_T1 + 60];
    fill(t, 0, n1, 1, n_vocab);
    fill(t, n1, 60, 30, n_vocab);
    http_server a, b, fresh;
    CHECKF(http_server_start(&a, bin, args, 30), "%s: server", name);
    if (!a.pid)
        return;
    reply r1 = complete(a.port, t, n1);
    sleep(1);                                 /* the blocks' writes are queued: let them land */
    kill(a.pid, SIGKILL);
    waitpid(a.pid, NULL, 0);
    CHECKF(http_server_start(&b, bin, args, 30), "%s: server after the kill", name);
    double t0 = now_ms();
    reply r2 = b.pid ? complete(b.port, t, n1 + 60) : (reply){ 0 };
    double warm_ms = now_ms() - t0;
    http_server_stop(&b);
    reply f = { 0 };
    double fresh_ms = 0;
    if (http_server_start(&fresh, bin, fresh_args, 30)) {
        t0 = now_ms();
        f = complete(fresh.port, t, n1 + 60);
        fresh_ms = now_ms() - t0;
        http_server_stop(&fresh);
    }
    printf("  %s restart after a %d-token T1: %d cached after SIGKILL, %.1f ms vs %.1f ms fresh\n",
           name, n1, r2.cached_tokens, warm_ms, fresh_ms);
    CHECKF(r2.cached_tokens >= n1, "%s restart: %d cached after SIGKILL, want %d", name,
           r2.cached_tokens, n1);
    CHECKF(r2.text && f.text && strcmp(r2.text, f.text) == 0, "%s restart: \"%s\" != fresh \"%s\"",
           name, r2.text ? r2.text : "(null)", f.text ? f.text : "(null)");
    free(r1.text);
    free(r2.text);
    free(f.text);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void run(const char *path, const char *name, int n_vocab)
{
    const char *const args[] = { "-m", path, "-t", "1", "--snapshot-interval", "64",
                                 "--cache-disk", "0", NULL };
    /* T5's divergence falls between snapshots: the one before it serves */
    reuse_five_turns(&(reuse_case){ .bin = bin, .path = path, .warm_args = args, .name = name,
                                    .n_vocab = n_vocab, .n_t1 = N_T1, .n_long = N_LONG,
                                    .t5_slack = S_INT, .may_hit_all = true });
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_recurrent_reuse: skipped ($KVC_BIN not set)\n");
        return TEST_SKIP;
    }
    char dir[] = "/tmp/kvc_recurrent_reuse_XXXXXX", path[4200];
    if (!mkdtemp(dir))
        return 1;
    struct { const char *preset, *file; } models[] = {
        { "tiny-lfm2", NULL }, { "tiny-qwen35", NULL }, { "tiny-granitehybrid", NULL },
        { "tiny-qwen3next", NULL },
        { "tiny-nemotron_h_moe", NULL }, { "tiny-lfm2moe", NULL }, { "tiny-nemotron_h", NULL },
        { NULL, "tiny-lfm2-f32.gguf" }, { NULL, "tiny-qwen35-f32.gguf" },
        { NULL, "tiny-qwen35moe-f32.gguf" }, { NULL, "tiny-granitehybrid-f32.gguf" },
    };
    const char *shared = test_shared_dir();
    int ran = 0;
    for (size_t k = 0; k < KVC_ARRAY_LEN(models); k++) {
        char err[512];
        const char *name = models[k].preset ? models[k].preset : models[k].file;
        if (models[k].preset) {
            kvc_gen_params g;
            if (kvc_gen_preset(models[k].preset, &g) != KVC_OK) {
                printf("  %s: skipped (no such preset yet)\n", name);
                continue;
            }
            g.n_threads = 2;
            snprintf(path, sizeof(path), "%s/%s.gguf", dir, models[k].preset);
            CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
        } else {
            snprintf(path, sizeof(path), "%s/models/%s", shared ? shared : "", models[k].file);
            if (!shared || access(path, R_OK) != 0) {
                printf("  %s: skipped (absent)\n", name);
                continue;
            }
        }
        kvc_model *m = NULL;
        if (kvc_model_load(path, NULL, &m, err, sizeof(err)) != KVC_OK) {
            printf("  %s: skipped (%s)\n", name, err);
        } else {
            kvc_model_info info;
            kvc_model_get_info(m, &info);
            kvc_model_free(m);
            run(path, name, info.n_vocab);
            edit_check(path, name);
            restart_check(path, name, info.n_vocab, N_T1);       /* ends on a block boundary */
            restart_check(path, name, info.n_vocab, N_T1 - 4);   /* and 4 tokens into a block */
            ran++;
        }
        if (models[k].preset)
            unlink(path);
    }
    rmdir(dir);
    if (!ran) {
        printf("test_recurrent_reuse: skipped (no hybrid model this build can load)\n");
        return TEST_SKIP;
    }
    return test_done("test_recurrent_reuse");
}
