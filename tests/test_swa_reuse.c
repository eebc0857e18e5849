/* test_swa_reuse.c - issue 31's five-turn scenario over HTTP on the
 * sliding-window models: every turn reuses every prompt token before its
 * divergence point, and every warm reply equals a fresh process's.
 *
 * Prompts are token ids (/v1/completions), so divergence points are exact:
 * T1 400 tokens; T2 = T1 + T1's reply + 300 tokens; T3 = T2 + T2's reply + 20;
 * T4 = T1's 400 + other tokens (diverges right after T1's prompt); T5 = T1's
 * first 380 + other tokens. The conversation outgrows every window (tiny-gemma3
 * 12, tiny-gpt-oss 8, tiny-gemma4 8 with its global layers' own head size and
 * KV heads; the generated ones of make-model, and ../shared's when
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
    struct { const char *preset, *file; } models[] = {
        { "tiny-gemma3", NULL }, { "tiny-gpt-oss", NULL }, { "tiny-gemma4", NULL },
        { NULL, "tiny-gemma3-f32.gguf" }, { NULL, "tiny-gpt-oss-f32.gguf" }, { NULL, "tiny-gemma4-f32.gguf" },
    };
    const char *shared = test_shared_dir();
    for (size_t k = 0; k < KVC_ARRAY_LEN(models); k++) {
        char err[512];
        const char *name = models[k].preset ? models[k].preset : models[k].file;
        if (models[k].preset) {
            kvc_gen_params g;
            CHECK_EQ_INT(kvc_gen_preset(models[k].preset, &g), KVC_OK);
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
        CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
        if (!m)
            continue;
        kvc_model_info info;
        kvc_model_get_info(m, &info);
        kvc_model_free(m);
        run(path, name, info.n_vocab);
        if (models[k].preset)
            unlink(path);
    }
    rmdir(dir);
    return test_done("test_swa_reuse");
}
