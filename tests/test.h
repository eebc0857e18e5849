/* test.h - a minimal test harness: CHECK macros, a skip code, shared/ lookup.
 *
 * A test binary returns 0 when every check passed, 1 otherwise, and 77 (CTest's
 * SKIP_RETURN_CODE) when what it needs is absent (../shared in a fresh clone). */
#ifndef KVC_TEST_H
#define KVC_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvchat.h"

static int test_failures = 0;
static int test_checks = 0;

#define CHECK(cond) do { test_checks++; if (!(cond)) { test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECKF(cond, ...) do { test_checks++; if (!(cond)) { test_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_EQ_INT(a, b) do { long long _a = (long long)(a), _b = (long long)(b); \
    CHECKF(_a == _b, "%s = %lld, %s = %lld", #a, _a, #b, _b); } while (0)
#define CHECK_NEAR(a, b, tol) do { double _a = (a), _b = (b); \
    CHECKF(fabs(_a - _b) <= (tol), "%s = %.9g, %s = %.9g, tol %g", #a, _a, #b, _b, (double)(tol)); } while (0)

/* Print a summary and return the process exit code. */
static inline int test_done(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

#define TEST_SKIP 77

/* The shared/ directory (models, references, vocabularies), or NULL when it is
 * absent: KVC_SHARED_DIR if set and present, else ../shared. */
static inline const char *test_shared_dir(void)
{
    static char path[4096];
    struct stat st;
    const char *env = getenv("KVC_SHARED_DIR");
    if (env && stat(env, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(path, sizeof(path), "%s", env);
        return path;
    }
    if (stat("../shared", &st) == 0 && S_ISDIR(st.st_mode))
        return "../shared";
    return NULL;
}

/* Read a whole file into a malloc'd NUL-terminated buffer; NULL on failure. */
static inline char *test_read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

/* A context of one thread for tests: n_ctx, n_batch, n_seq sequences and a
 * pool of `blocks` blocks; NULL (a failed check) on error. */
static inline kvc_context *test_new_context(kvc_model *m, int32_t n_ctx, int32_t n_batch,
                                            int32_t n_seq, int64_t blocks)
{
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_threads = 1;
    cp.n_seq = n_seq;
    cp.kv_blocks = blocks;
    kvc_context *c = NULL;
    char err[512];
    CHECKF(kvc_context_new(m, &cp, &c, err, sizeof(err)) == KVC_OK, "%s", err);
    return c;
}

/* The logits [n][n_vocab] of toks[0..n) fed to sequence 0 of a fresh context
 * of params cp in chunks of `chunk` (cp.n_batch is set to it); malloc'd, NULL
 * (a failed check) on error. */
static inline float *test_chunked_logits(kvc_model *m, kvc_context_params cp,
                                         const int32_t *toks, int n, int chunk)
{
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    cp.n_batch = chunk;
    kvc_context *ctx = NULL;
    char err[512];
    if (kvc_context_new(m, &cp, &ctx, err, sizeof(err)) != KVC_OK) {
        CHECKF(0, "context: %s", err);
        return NULL;
    }
    float *out = malloc((size_t)n * info.n_vocab * sizeof(float));
    for (int done = 0; out && done < n;) {
        const int k = n - done < chunk ? n - done : chunk;
        if (kvc_context_decode(ctx, 0, toks + done, k, true, err, sizeof(err)) != KVC_OK) {
            CHECKF(0, "decode: %s", err);
            free(out);
            out = NULL;
            break;
        }
        for (int i = 0; i < k; i++)
            memcpy(out + (size_t)(done + i) * info.n_vocab, kvc_context_logits(ctx, i),
                   (size_t)info.n_vocab * sizeof(float));
        done += k;
    }
    kvc_context_free(ctx);
    return out;
}

/* Generate the model preset `preset` ("tiny", ...) as dir/<preset>.gguf
 * (its path left in path[size]) and load it; NULL (a failed check) on error. */
static inline kvc_model *test_gen_model(const char *dir, const char *preset, char *path,
                                        size_t size)
{
    char err[512];
    kvc_gen_params p;
    kvc_model *m = NULL;
    snprintf(path, size, "%s/%s.gguf", dir, preset);
    CHECK(kvc_gen_preset(preset, &p) == KVC_OK);
    CHECKF(kvc_gen_write(&p, path, err, sizeof(err)) == KVC_OK, "%s", err);
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
    return m;
}

/* Wait until engine e has no background work left (the canonical tokens of
 * the last reply computed); false after 10 s. */
static inline bool test_wait_background(kvc_engine *e)
{
    for (int i = 0; i < 5000; i++) {
        kvc_engine_metrics m;
        kvc_engine_get_metrics(e, &m);
        if (m.bg_pending == 0)
            return true;
        usleep(2000);
    }
    return false;
}

#endif
