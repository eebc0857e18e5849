/* test_assert.c - KVC_ASSERT runs in every build, NDEBUG or not: a broken
 * invariant aborts with file:line and the condition on stderr.
 *
 * Each case runs in a child process (fork) with stderr to a pipe; the parent
 * checks that the child died of SIGABRT and what it printed. The cases are
 * the bugs the pool and the tree must refuse: a double kvc_kv_block_unref
 * (before KVC_ASSERT it left a reference count of -1, silently, in both CI
 * builds, which defined NDEBUG), a reference taken on a free block, a double
 * kvc_pc_unpin. A control case doing the same calls correctly exits 0.
 * Built without NDEBUG (the sanitizer builds), plain assert() must abort too;
 * a sanitizer build (KVC_WANT_ASSERTS) that defines NDEBUG fails. */
#include <assert.h>
#include <signal.h>
#include <sys/wait.h>

#include "prefix_cache.h"
#include "quant.h"
#include "test.h"

typedef void (*case_fn)(void);

static kvc_kv_pool *new_pool(void)
{
    kvc_kv_pool_params p = { 1, 1, 32, 4, KVC_TYPE_F16, 4 };
    kvc_kv_pool *pool = NULL;
    kvc_err e = { 0 };
    if (kvc_kv_pool_new(&p, &pool, &e) != KVC_OK) {
        fprintf(stderr, "pool: %s\n", e.msg);
        exit(3);
    }
    return pool;
}

static void plain_false(void)
{
    int one = 1;
    KVC_ASSERT(one == 2);
}

#ifndef NDEBUG
static void c_assert(void)
{
    int one = 1;
    assert(one == 2);
}
#endif

static void double_unref(void)
{
    kvc_kv_pool *pool = new_pool();
    int32_t b = kvc_kv_block_alloc(pool);
    kvc_kv_block_unref(pool, b);
    kvc_kv_block_unref(pool, b);             /* refcount would go to -1 */
}

static void ref_of_free_block(void)
{
    kvc_kv_pool *pool = new_pool();
    int32_t b = kvc_kv_block_alloc(pool);
    kvc_kv_block_unref(pool, b);
    kvc_kv_block_ref(pool, b);               /* a free block is taken by alloc */
}

/* A tree with one node (block b), pinned once; `extra_unpin` unpins twice. */
static void pins(bool extra_unpin)
{
    kvc_kv_pool *pool = new_pool();
    kvc_prefix_cache *pc = NULL;
    if (kvc_pc_new(pool, &pc, NULL) != KVC_OK)
        exit(3);
    int32_t toks[4] = { 1, 2, 3, 4 }, b = kvc_kv_block_alloc(pool);
    kvc_pc_node *n = NULL;
    if (kvc_pc_insert(pc, KVC_NS_DEFAULT, kvc_pc_root(pc), toks, b, false, &n, NULL) != 1)
        exit(3);
    kvc_pc_pin(n);
    kvc_pc_unpin(n);
    if (extra_unpin)
        kvc_pc_unpin(n);                     /* pins would go to -1 */
    kvc_kv_block_unref(pool, b);             /* the tree holds its own reference */
    kvc_pc_free(pc);
    kvc_kv_pool_free(pool);
}

static void double_unpin(void) { pins(true); }

/* The same calls, each balanced: no abort. */
static void control(void)
{
    kvc_kv_pool *pool = new_pool();
    int32_t b = kvc_kv_block_alloc(pool);
    kvc_kv_block_ref(pool, b);
    kvc_kv_block_unref(pool, b);
    kvc_kv_block_unref(pool, b);
    kvc_kv_pool_free(pool);
    pins(false);
}

/* Run fn in a child; its exit status, and its stderr in out[0, cap). */
static int run_child(case_fn fn, char *out, size_t cap)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        fn();
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fd[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static void expect_abort(const char *name, case_fn fn, const char *file, const char *cond)
{
    char out[4096];
    int st = run_child(fn, out, sizeof(out));
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "%s: not aborted (status %#x): %s", name,
           st, out);
    char want[256];
    snprintf(want, sizeof(want), "KVC_ASSERT(%s) failed", cond);
    CHECKF(strstr(out, file) && strstr(out, want), "%s: stderr lacks '%s' / '%s': %s", name, file,
           want, out);
}

int main(void)
{
#ifdef NDEBUG
    printf("test_assert: built with NDEBUG (plain assert() is off; KVC_ASSERT is not)\n");
#ifdef KVC_WANT_ASSERTS
    CHECKF(false, "a sanitizer build defines NDEBUG: its assert()s do not run");
#endif
#else
    printf("test_assert: built without NDEBUG (assert() and KVC_ASSERT run)\n");
    {
        char out[4096];
        int st = run_child(c_assert, out, sizeof(out));
        CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(out, "one == 2"),
               "assert(): status %#x: %s", st, out);
    }
#endif
    expect_abort("plain_false", plain_false, "test_assert.c:", "one == 2");
    expect_abort("double_unref", double_unref, "kv.c:", "pool->refcount[block] > 0");
    expect_abort("ref_of_free_block", ref_of_free_block, "kv.c:", "pool->refcount[block] > 0");
    expect_abort("double_unpin", double_unpin, "prefix_cache.c:", "node->pins > 0");
    char out[4096];
    int st = run_child(control, out, sizeof(out));
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "control: status %#x: %s", st, out);
    return test_done("test_assert");
}
