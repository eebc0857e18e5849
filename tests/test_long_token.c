/* test_long_token.c - `kvchat generate` and the engine with a vocabulary
 * holding a 4 KB token.
 *
 * A token's piece has no upper bound. generate used to detokenize into a fixed
 * 600-byte buffer and, when the detokenizer answered "too small" (the size it
 * needed, nothing written), copied that many bytes from it anyway: a stack
 * over-read and a heap overflow of the text buffer, and garbage as output.
 *
 * The model: a generated tiny SentencePiece model; the token greedy decoding
 * produces first is found by running generate on it, then the file is copied
 * with that token's text replaced by a 4 KB string (grown by a multiple of the
 * alignment, so the tensor data keeps its offsets). generate on the copy must
 * exit cleanly and print that string. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gguf.h"
#include "model_gen.h"
#include "test.h"

static const char *bin;
static char dir[] = "/tmp/kvc_test_long_token_XXXXXX";
static const char prompt[] = "Once upon a time";

/* Run `generate --json` on path; its JSON output parsed (NULL on failure). */
static cJSON *generate(const char *path, int *exit_code)
{
    char cmd[2048], out[600];
    snprintf(out, sizeof(out), "%s/out.json", dir);
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -p '%s' -n 3 --ignore-eos --json > %s", bin,
             path, prompt, out);
    int st = system(cmd);
    *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
    char *text = test_read_file(out, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static bool write_file(const char *path, const void *a, size_t na, const void *b, size_t nb,
                       const void *c, size_t nc)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return false;
    bool ok = fwrite(a, 1, na, fp) == na && fwrite(b, 1, nb, fp) == nb &&
              fwrite(c, 1, nc, fp) == nc;
    return fclose(fp) == 0 && ok;
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_long_token: KVC_BIN not set, skipped\n");
        return TEST_SKIP;
    }
    if (!mkdtemp(dir))
        return 1;
    kvc_gen_params g;
    kvc_gen_preset("tiny", &g);
    g.vocab = "spm";
    void *buf = NULL;
    size_t size = 0;
    kvc_err e = { 0 };
    CHECKF(kvc_gen_model_memory(&g, &buf, &size, &e) == KVC_OK, "gen: %s", e.msg);
    char orig[512], big[512];
    snprintf(orig, sizeof(orig), "%s/orig.gguf", dir);
    snprintf(big, sizeof(big), "%s/long.gguf", dir);
    CHECK(buf && write_file(orig, buf, size, "", 0, "", 0));

    /* The first generated token and where its text is in the file. */
    int rc;
    cJSON *j0 = generate(orig, &rc);
    CHECKF(rc == 0 && j0, "generate on the original model: exit %d", rc);
    const cJSON *t0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j0, "tokens"), 0);
    int id = cJSON_IsNumber(t0) ? t0->valueint : -1;
    gguf_file *f = NULL;
    const gguf_kv *toks = NULL, *types = NULL;
    if (id >= 0 && gguf_open_memory(buf, size, &f, &e) == KVC_OK) {
        gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &e);
        gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &e);
    }
    CHECKF(toks && types && (uint64_t)id < toks->v.arr.n, "token %d not in the vocabulary", id);
    if (toks && types && (uint64_t)id < toks->v.arr.n) {
        CHECKF(gguf_arr_i64(types, (uint64_t)id) == 1, "token %d is not a normal token", id);
        const gguf_str *s = &toks->v.arr.strs[id];
        size_t off = (size_t)(s->s - (const char *)buf), old_len = s->len;
        size_t align = gguf_alignment(f), new_len = old_len;
        while (new_len < 4096)
            new_len += align;
        /* "<ééé...Z>": two-byte characters, so a reply streamed in parts must
         * cut it between characters */
        char *piece = malloc(new_len + 1);
        memset(piece, 'Z', new_len);
        piece[0] = '<';
        for (size_t i = 1; i + 2 < new_len; i += 2)
            memcpy(piece + i, "\xC3\xA9", 2);
        piece[new_len - 1] = '>';
        piece[new_len] = 0;
        uint64_t n64 = new_len;   /* the length before the string, little-endian */
        memcpy((char *)buf + off - 8, &n64, 8);
        CHECK(write_file(big, buf, off, piece, new_len, (char *)buf + off + old_len,
                         size - off - old_len));
        gguf_close(f);
        f = NULL;

        cJSON *j1 = generate(big, &rc);
        CHECKF(rc == 0 && j1, "generate with a %zu-byte token: exit %d (%s)", new_len, rc,
               rc >= 1000 ? "killed by a signal" : "failed");
        const cJSON *t1 = cJSON_GetArrayItem(cJSON_GetObjectItem(j1, "tokens"), 0);
        char *p0 = cJSON_PrintUnformatted(cJSON_GetObjectItem(j0, "prompt_tokens"));
        char *p1 = cJSON_PrintUnformatted(cJSON_GetObjectItem(j1, "prompt_tokens"));
        CHECKF(p0 && p1 && !strcmp(p0, p1), "the prompt tokenizes differently: %s vs %s", p0, p1);
        CHECKF(cJSON_IsNumber(t1) && t1->valueint == id, "first token %d, expected %d",
               cJSON_IsNumber(t1) ? t1->valueint : -1, id);
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(j1, "text"));
        CHECKF(text && strstr(text, piece), "the %zu-byte piece is not in the text (%zu bytes)",
               new_len, text ? strlen(text) : 0);
        /* the engine's reply (a raw completion of the same prompt) holds it too */
        kvc_model *m = NULL;
        char err[512];
        CHECKF(kvc_model_load(big, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
        kvc_engine_params ep = kvc_engine_default_params();
        ep.n_ctx = 256;
        ep.n_parallel = 1;
        ep.max_sessions = 1;
        kvc_engine *e = NULL;
        if (m)
            CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "%s", err);
        kvc_request_params rp = { .prompt = prompt, .chat = kvc_chat_default_params() };
        rp.chat.max_tokens = 3;
        rp.chat.sampling.temperature = 0;
        kvc_request *r = e ? kvc_engine_submit(e, &rp, NULL, err, sizeof(err)) : NULL;
        kvc_event ev = { 0 };
        char *joined = calloc(1, 3 * new_len + 4096);
        size_t jl = 0;
        while (r && kvc_request_next(r, &ev, -1) && ev.type == KVC_EVENT_TEXT) {
            if (joined && jl + ev.len < 3 * new_len + 4096) {
                memcpy(joined + jl, ev.text, ev.len);
                jl += ev.len;
            }
            kvc_event_clear(&ev);
        }
        CHECKF(ev.type == KVC_EVENT_DONE && ev.text && strstr(ev.text, piece),
               "the engine's reply lacks the %zu-byte piece (%zu bytes)", new_len,
               ev.text ? strlen(ev.text) : 0);
        CHECKF(joined && ev.text && strcmp(joined, ev.text) == 0,
               "the streamed pieces (%zu bytes) differ from the reply", jl);
        free(joined);
        kvc_event_clear(&ev);
        kvc_request_free(r);
        kvc_engine_free(e);
        kvc_model_free(m);
        free(p0);
        free(p1);
        free(piece);
        cJSON_Delete(j1);
    }
    gguf_close(f);
    cJSON_Delete(j0);
    free(buf);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    system(cmd);
    return test_done("test_long_token");
}
