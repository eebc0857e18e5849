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

#endif
