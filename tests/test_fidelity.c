/* test_fidelity.c - the engine against the exact references in ../shared/ref.
 *
 * For every model and prompt: the prompt tokenizes to exactly prompt_tokens;
 * fed `tokens` (teacher forcing), the logits at every reported step are within
 * the file's tolerance of the exact float64 logits (over the 20 reported ids),
 * with the same argmax wherever the exact margin exceeds twice the tolerance.
 * Asserts, per model, that our largest distance from exact is below
 * llama.cpp's (both with their default settings), except on the one model
 * listed in kv_rounding_bound below, where both engines' F16 KV cache is
 * what separates them from exact; there it asserts the claim with an F32 KV
 * cache instead. Prints the table. Also: greedy generation from stories260K
 * reproduces llama.cpp's story. Skips (77) when ../shared is absent. */
#include <cjson/cJSON.h>
#include <dirent.h>

#include "kvchat.h"
#include "test.h"

typedef struct model_result {
    char   name[96];
    double ours;         /* our largest |logit - exact|, default settings (F16 KV cache) */
    double ours_f32kv;   /* the same with an F32 KV cache */
    double llama_cpp;    /* llama_cpp_deviation from the file */
    double tolerance;
    int    steps;
    bool   unsupported;  /* an architecture kvchat refuses (yet), with a clear error */
} model_result;

static int32_t *json_ints(const cJSON *arr, int *n)
{
    *n = cJSON_GetArraySize(arr);
    int32_t *v = malloc((size_t)(*n > 0 ? *n : 1) * sizeof(int32_t));
    for (int i = 0; i < *n; i++)
        v[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    return v;
}

static int32_t argmax(const float *l, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Check one run (prompt) of a reference; returns the largest deviation seen. */
static double check_run(kvc_model *m, kvc_context *ctx, const cJSON *run, double tol,
                        const char *model, int *steps)
{
    const char *prompt = cJSON_GetObjectItem(run, "prompt")->valuestring;
    int n_pt, n_tok;
    int32_t *pt = json_ints(cJSON_GetObjectItem(run, "prompt_tokens"), &n_pt);
    int32_t *toks = json_ints(cJSON_GetObjectItem(run, "tokens"), &n_tok);

    int32_t got[4096];
    int64_t n = kvc_model_tokenize(m, prompt, strlen(prompt), true, false, got, 4096);
    bool same = n == n_pt;
    for (int i = 0; same && i < n_pt; i++)
        same = got[i] == pt[i];
    CHECKF(same, "%s: prompt '%.30s' tokenizes differently (%lld tokens, expected %d)", model,
           prompt, (long long)n, n_pt);

    kvc_model_info info;
    kvc_model_get_info(m, &info);
    char err[512];
    kvc_context_seq_truncate(ctx, 0, 0);
    int rc = kvc_context_decode(ctx, 0, toks, n_tok, true, err, sizeof(err));
    CHECKF(rc == KVC_OK, "%s: decode: %s", model, err);
    double worst = 0;
    const cJSON *step;
    cJSON_ArrayForEach(step, cJSON_GetObjectItem(run, "steps")) {
        if (rc != KVC_OK)
            break;
        int pos = cJSON_GetObjectItem(step, "pos")->valueint;
        double margin = cJSON_GetObjectItem(step, "margin")->valuedouble;
        const cJSON *top = cJSON_GetObjectItem(step, "top");
        const float *l = kvc_context_logits(ctx, pos);
        double dev = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, top) {
            int id = cJSON_GetArrayItem(e, 0)->valueint;
            double exact = cJSON_GetArrayItem(e, 1)->valuedouble;
            double d = fabs((double)l[id] - exact);
            if (d > dev)
                dev = d;
        }
        CHECKF(dev <= tol, "%s '%.20s' pos %d: deviation %.6f > tolerance %.6f", model, prompt, pos,
               dev, tol);
        if (margin > 2 * tol) {
            int want = cJSON_GetArrayItem(cJSON_GetArrayItem(top, 0), 0)->valueint;
            CHECKF(argmax(l, info.n_vocab) == want, "%s pos %d: argmax %d, exact %d (margin %.3f)",
                   model, pos, argmax(l, info.n_vocab), want, margin);
        }
        if (dev > worst)
            worst = dev;
        (*steps)++;
    }
    free(pt);
    free(toks);
    return worst;
}

/* Greedy continuation of the first run's prompt equals llama.cpp's text. */
static void check_greedy(kvc_model *m, kvc_context *ctx, const cJSON *run, const char *model)
{
    const char *want = cJSON_GetObjectItem(run, "llama_cpp_greedy_text")->valuestring;
    int n_pt;
    int32_t *pt = json_ints(cJSON_GetObjectItem(run, "prompt_tokens"), &n_pt);
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    kvc_sampler_params sp = kvc_sampler_default_params();
    sp.temperature = 0;
    kvc_sampler *s = kvc_sampler_new(&sp, info.n_vocab);
    kvc_detokenizer *d = kvc_detokenizer_new(m, false);
    char err[512], text[8192] = "", piece[600];
    size_t len = 0;
    kvc_context_seq_truncate(ctx, 0, 0);
    int rc = kvc_context_decode(ctx, 0, pt, n_pt, false, err, sizeof(err));
    for (int i = 0; rc == KVC_OK && i < 32; i++) {
        int32_t t = kvc_sampler_sample(s, kvc_context_logits(ctx, -1));
        if (kvc_model_token_is_eog(m, t))
            break;
        int k = kvc_detokenizer_feed(d, t, piece, sizeof(piece));
        if (k > 0 && len + (size_t)k < sizeof(text)) {
            memcpy(text + len, piece, (size_t)k);
            len += (size_t)k;
            text[len] = 0;
        }
        rc = kvc_context_decode(ctx, 0, &t, 1, false, err, sizeof(err));
    }
    CHECKF(strcmp(text, want) == 0, "%s greedy:\n  got  '%s'\n  want '%s'", model, text, want);
    kvc_detokenizer_free(d);
    kvc_sampler_free(s);
    free(pt);
}

/* Models where llama.cpp's default deviation comes from its F16 KV cache
 * alone (F32 weights, tiny head dim 8: nothing else is rounded), so kvchat's
 * default F16 cache cannot be expected to beat it; kvchat must with F32 KV. */
static const char *const kv_rounding_bound[] = { "stories260K.gguf" };

static bool is_kv_rounding_bound(const char *model)
{
    for (size_t i = 0; i < sizeof(kv_rounding_bound) / sizeof(kv_rounding_bound[0]); i++)
        if (!strcmp(model, kv_rounding_bound[i]))
            return true;
    return false;
}

/* Largest deviation over every run of ref with the given KV cache type;
 * *steps counts the steps checked. */
static double check_runs(kvc_model *m, const cJSON *ref, int kv_type, model_result *res, bool greedy,
                         int *steps)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    cp.kv_type = kv_type;
    kvc_context *ctx = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &ctx, err, sizeof(err)) == KVC_OK, "%s: context: %s", res->name, err);
    double worst = 0;
    if (ctx) {
        const cJSON *run;
        cJSON_ArrayForEach(run, cJSON_GetObjectItem(ref, "runs")) {
            double d = check_run(m, ctx, run, res->tolerance, res->name, steps);
            if (d > worst)
                worst = d;
        }
        if (greedy)
            check_greedy(m, ctx, cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "runs"), 0), res->name);
    }
    kvc_context_free(ctx);
    return worst;
}

static void check_model(const char *shared, const char *file, model_result *res)
{
    char path[4096];
    snprintf(path, sizeof(path), "%.3000s/ref/%.200s", shared, file);
    char *json = test_read_file(path, NULL);
    cJSON *ref = json ? cJSON_Parse(json) : NULL;
    CHECKF(ref != NULL, "cannot parse %s", path);
    free(json);
    if (!ref)
        return;
    const char *model = cJSON_GetObjectItem(ref, "model")->valuestring;
    snprintf(res->name, sizeof(res->name), "%s", model);
    res->tolerance = cJSON_GetObjectItem(ref, "tolerance")->valuedouble;
    res->llama_cpp = cJSON_GetObjectItem(ref, "llama_cpp_deviation")->valuedouble;
    snprintf(path, sizeof(path), "%.3000s/models/%.200s%s", shared, model,
             strstr(model, ".gguf") ? "" : ".gguf");
    kvc_model *m = NULL;
    char err[512];
    int rc = kvc_model_load(path, NULL, &m, err, sizeof(err));
    /* A model of an architecture kvchat does not run yet must be refused with an
     * error that names the architecture, never loaded into wrong logits. */
    if (rc == KVC_ERR_UNSUPPORTED && strstr(err, "architecture") && strstr(err, "not supported")) {
        printf("%s: skipped: %s\n", model, err);
        res->unsupported = true;
        cJSON_Delete(ref);
        return;
    }
    CHECKF(rc == KVC_OK, "load %s: %s", path, err);
    if (m) {
        int f32_steps = 0;
        res->ours = check_runs(m, ref, kvc_context_default_params().kv_type, res,
                               strstr(model, "stories260K") != NULL, &res->steps);
        res->ours_f32kv = check_runs(m, ref, KVC_KV_F32, res, false, &f32_steps);
        if (is_kv_rounding_bound(model))
            CHECKF(res->ours_f32kv < res->llama_cpp, "%s: F32 KV: max |dlogit| %.6f, llama.cpp %.6f",
                   model, res->ours_f32kv, res->llama_cpp);
        else
            CHECKF(res->ours < res->llama_cpp, "%s: max |dlogit| %.6f, not below llama.cpp's %.6f",
                   model, res->ours, res->llama_cpp);
    }
    kvc_model_free(m);
    cJSON_Delete(ref);
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(void)
{
    const char *shared = test_shared_dir();
    if (!shared) {
        printf("test_fidelity: ../shared absent, skipped\n");
        return TEST_SKIP;
    }
    char dir[4096];
    snprintf(dir, sizeof(dir), "%.3000s/ref", shared);
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, by_name);
    if (n < 0) {
        printf("test_fidelity: no %s, skipped\n", dir);
        return TEST_SKIP;
    }
    model_result res[64];
    int nr = 0;
    for (int i = 0; i < n; i++) {
        const char *f = ents[i]->d_name;
        size_t l = strlen(f);
        if (l > 5 && !strcmp(f + l - 5, ".json") && nr < 64) {
            memset(&res[nr], 0, sizeof(res[nr]));
            check_model(shared, f, &res[nr++]);
        }
        free(ents[i]);
    }
    free(ents);
    printf("\n| model | steps | kvchat max |dlogit| | kvchat, F32 KV | llama.cpp max |dlogit| | tolerance "
           "| closer |\n|---|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < nr; i++)
        printf("| %s | %d | %.6f | %.6f | %.6f | %.6f | %s |\n", res[i].name, res[i].steps, res[i].ours,
               res[i].ours_f32kv, res[i].llama_cpp, res[i].tolerance,
               res[i].unsupported                     ? "architecture not supported yet"
               : res[i].ours < res[i].llama_cpp       ? "yes"
               : res[i].ours_f32kv < res[i].llama_cpp ? "with F32 KV (both engines' F16 KV dominates)"
                                                      : "no");
    return test_done("test_fidelity");
}
