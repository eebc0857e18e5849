/* test_node.c - runs the Node.js tests of tests/node (the official `openai`,
 * `@anthropic-ai/sdk` and `ollama` clients against `kvchat serve`) under CTest.
 *
 * Skips (77) when what they need is absent: tests/node/node_modules (run
 * scripts/install-node-deps.sh), the `node` program, $KVC_BIN, or its
 * `serve` command. Otherwise
 * runs `node --test tests/node/<every *.test.mjs>` with KVC_BIN in its
 * environment and passes when node exits 0. Bounded: after TIME_LIMIT_S the
 * node process group is killed and the test fails. */
#include <dirent.h>
#include <stdbool.h>
#include <libgen.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

#define TIME_LIMIT_S 300
#define MAX_FILES    32

static bool have_node(void)
{
    return system("node --version >/dev/null 2>&1") == 0;
}

/* Whether `bin serve --help` works (a binary built before serve was added skips). */
static bool have_serve(const char *bin)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "'%s' serve --help >/dev/null 2>&1", bin);
    return !strchr(bin, '\'') && system(cmd) == 0;
}

/* Collect the *.test.mjs files of dir into argv (after argv[0..2]); returns argc. */
static int collect(const char *dir, char **argv, char paths[][4096])
{
    int argc = 2;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && argc < MAX_FILES + 2) {
        size_t n = strlen(e->d_name);
        if (n > 9 && !strcmp(e->d_name + n - 9, ".test.mjs")) {
            snprintf(paths[argc - 2], 4096, "%.3800s/%.255s", dir, e->d_name);
            argv[argc] = paths[argc - 2];
            argc++;
        }
    }
    if (d)
        closedir(d);
    argv[argc] = NULL;
    return argc;
}

/* Run argv in its own process group; its exit status, or -1 after the limit. */
static int run_bounded(char **argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        execvp(argv[0], argv);
        _exit(127);
    }
    for (int waited = 0; waited < TIME_LIMIT_S * 10; waited++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(100000);
    }
    fprintf(stderr, "test_node: node ran past %d s; killing it\n", TIME_LIMIT_S);
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

int main(void)
{
    char src[4096], dir[4096], mods[4096 + 32];
    snprintf(src, sizeof(src), "%s", __FILE__);   /* the absolute path CMake compiled */
    snprintf(dir, sizeof(dir), "%s/node", dirname(src));
    snprintf(mods, sizeof(mods), "%s/node_modules/openai", dir);
    struct stat st;
    const char *bin = getenv("KVC_BIN");
    if (stat(mods, &st) != 0) {
        printf("test_node: skipped: %s is absent (run scripts/install-node-deps.sh)\n", mods);
        return TEST_SKIP;
    }
    if (!have_node() || !bin || stat(bin, &st) != 0 || !have_serve(bin)) {
        printf("test_node: skipped: %s\n", !bin ? "KVC_BIN is not set"
               : "no node, no KVC_BIN, or KVC_BIN has no serve command");
        return TEST_SKIP;
    }
    static char paths[MAX_FILES][4096];
    char *argv[MAX_FILES + 3] = { "node", "--test" };
    int argc = collect(dir, argv, paths);
    CHECKF(argc > 2, "no *.test.mjs in %s", dir);
    if (argc > 2) {
        int rc = run_bounded(argv);
        CHECKF(rc == 0, "node --test exited with %d", rc);
    }
    return test_done("test_node");
}
