/* test_webui.c - the chat page at GET / (server_webui.h), over HTTP:
 *   - GET / (and /index.html) is the page: 200, text/html; charset=utf-8, a
 *     Content-Security-Policy that runs only the page's own scripts (no
 *     'unsafe-inline' or 'unsafe-eval' for scripts, nothing from elsewhere),
 *     nosniff, no framing, an ETag; a matching If-None-Match is a 304 with no
 *     body; HEAD has the headers and no body; POST is a 405;
 *   - every embedded file is served whole with its type, and every file the
 *     page and katex.min.css name (scripts, styles, fonts) is there: a library
 *     left out of the build would show as a 404 here;
 *   - the page is open without the API key (it holds no secret; the API
 *     still needs the key);
 *   - kvc_server_params.no_webui, and `kvchat serve --no-webui` ($KVC_BIN),
 *     answer 404 for the page and its files. */
#include <sys/stat.h>
#include <unistd.h>

#include "http_client.h"
#include "model_gen.h"
#include "server.h"
#include "server_webui.h"
#include "socket_client.h"
#include "test.h"

static kvc_server *start(kvc_engine *e, const char *key, bool no_webui)
{
    kvc_server_params sp = kvc_server_default_params();
    sp.port = 0;
    sp.api_key = key;
    sp.no_webui = no_webui;
    kvc_server *s = NULL;
    char err[512];
    CHECKF(kvc_server_start(e, &sp, &s, err, sizeof(err)) == KVC_OK, "server start: %s", err);
    return s;
}

/* Whether r has header name and its value contains want. */
static bool has_header(const resp *r, const char *name, const char *want)
{
    char v[1024];
    return header(r, name, v, sizeof(v)) && strstr(v, want);
}

/* The value of directive `name` of a Content-Security-Policy, into out. */
static const char *csp_directive(const char *csp, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = csp; p && *p; p = strchr(p, ';') ? strchr(p, ';') + 1 : NULL) {
        p += strspn(p, " ");
        if (!strncmp(p, name, n) && p[n] == ' ') {
            snprintf(out, cap, "%.*s", (int)strcspn(p + n + 1, ";"), p + n + 1);
            return out;
        }
    }
    return NULL;
}

static void test_page(int port)
{
    resp r = http_to(port, "GET", "/", NULL, NULL, 0);
    char v[1024], csp[1024], d[256];
    CHECK_EQ_INT(r.status, 200);
    CHECKF(header(&r, "Content-Type", v, sizeof(v)) && !strcmp(v, "text/html; charset=utf-8"),
           "Content-Type %s", v);
    CHECK(r.body && strstr(r.body, "<!doctype html>") && strstr(r.body, "/webui/app.js"));
    CHECK(header(&r, "Content-Security-Policy", csp, sizeof(csp)));
    CHECKF(csp_directive(csp, "default-src", d, sizeof(d)) && !strcmp(d, "'none'"), "%s", csp);
    CHECKF(csp_directive(csp, "script-src", d, sizeof(d)) && !strcmp(d, "'self'"),
           "scripts must be the page's own only: %s", csp);
    CHECKF(csp_directive(csp, "connect-src", d, sizeof(d)) && !strcmp(d, "'self'"), "%s", csp);
    CHECKF(csp_directive(csp, "frame-ancestors", d, sizeof(d)) && !strcmp(d, "'none'"), "%s", csp);
    CHECK(!strstr(csp, "unsafe-eval") && !strstr(csp, "http:") && !strstr(csp, "https:"));
    CHECK(has_header(&r, "X-Content-Type-Options", "nosniff"));
    CHECK(has_header(&r, "X-Frame-Options", "DENY"));
    CHECK(has_header(&r, "Referrer-Policy", "no-referrer"));
    CHECK(has_header(&r, "Cache-Control", "no-cache"));
    /* no inline script or style in the page: the policy would block them */
    CHECK(r.body && !strstr(r.body, "<script>") && !strstr(r.body, "<style") &&
          !strstr(r.body, " style=") && !strstr(r.body, " onclick="));
    char etag[64] = "";
    CHECK(header(&r, "ETag", etag, sizeof(etag)) && etag[0] == '"');
    const srv_webui_file *f = srv_webui_find("/");
    CHECK(f && r.body_len == f->size && !memcmp(r.body, f->data, f->size));

    /* the page names these files: each must be served */
    size_t named = 0;
    for (const char *p = r.body; p && (p = strstr(p, "\"/webui/")); p++) {
        char path[256];
        snprintf(path, sizeof(path), "%.*s", (int)strcspn(p + 1, "\""), p + 1);
        CHECKF(srv_webui_find(path), "the page names %s, which is not embedded", path);
        named++;
    }
    CHECKF(named >= 8, "the page names %zu files", named);
    resp_free(&r);

    r = http_to(port, "GET", "/index.html", NULL, NULL, 0);
    CHECK(r.status == 200 && f && r.body_len == f->size);
    resp_free(&r);

    char inm[128];
    snprintf(inm, sizeof(inm), "If-None-Match: W/\"x\", %s\r\n", etag);
    r = http_to(port, "GET", "/", inm, NULL, 0);
    CHECKF(r.status == 304 && r.body_len == 0, "revalidation: %d, %zu bytes", r.status,
           r.body_len);
    resp_free(&r);
    r = http_to(port, "GET", "/", "If-None-Match: \"0000000000000000\"\r\n", NULL, 0);
    CHECK(r.status == 200 && f && r.body_len == f->size);
    resp_free(&r);

    r = http_to(port, "HEAD", "/", NULL, NULL, 0);
    CHECKF(r.status == 200 && r.body_len == 0 && has_header(&r, "Content-Type", "text/html"),
           "HEAD: %d, %zu bytes", r.status, r.body_len);
    resp_free(&r);
    expect_error("POST /", http_to(port, "POST", "/", NULL, "{}", 2), 405, "method_not_allowed",
                 NULL, NULL);
    expect_error("no such file", http_to(port, "GET", "/webui/nope.js", NULL, NULL, 0), 404,
                 "not_found", NULL, NULL);
}

/* Every embedded file whole, with its type; katex's fonts present. */
static void test_files(int port)
{
    bool marked = false, purify = false, katex_css = false;
    for (size_t i = 0; i < srv_webui_n_files; i++) {
        const srv_webui_file *f = &srv_webui_files[i];
        resp r = http_to(port, "GET", f->path, NULL, NULL, 0);
        char v[256];
        CHECKF(r.status == 200 && r.body_len == f->size && !memcmp(r.body, f->data, f->size),
               "%s: %d, %zu of %zu bytes", f->path, r.status, r.body_len, f->size);
        CHECKF(header(&r, "Content-Type", v, sizeof(v)) && !strcmp(v, f->type), "%s: %s",
               f->path, v);
        CHECK(has_header(&r, "X-Content-Type-Options", "nosniff"));
        marked |= strstr(f->path, "marked") != NULL;
        purify |= strstr(f->path, "purify") != NULL;
        if (strstr(f->path, "katex.min.css")) {
            katex_css = true;
            size_t fonts = 0;
            for (const char *p = r.body; (p = strstr(p, "url(fonts/")); p++) {
                char path[256];
                int n = (int)strcspn(p + 10, ")");
                if (n > 6 && !strncmp(p + 10 + n - 6, ".woff2", 6)) {
                    snprintf(path, sizeof(path), "/webui/vendor/fonts/%.*s", n, p + 10);
                    CHECKF(srv_webui_find(path), "katex.min.css names %s: not embedded", path);
                    fonts++;
                }
            }
            CHECKF(fonts >= 10, "katex.min.css names %zu woff2 fonts", fonts);
        }
        resp_free(&r);
    }
    /* the installs of scripts/install-deps.sh: Markdown and its sanitizer */
    CHECKF(marked && purify && katex_css, "a library of the page is not embedded (marked %d, "
           "purify %d, katex %d): run scripts/install-deps.sh and cmake again", marked, purify,
           katex_css);
}

/* With an API key, the page and its files are open; the API is not. */
static void test_key(kvc_engine *e)
{
    kvc_server *s = start(e, "sekrit", false);
    int port = s ? kvc_server_port(s) : 0;
    if (!s)
        return;
    resp r = http_to(port, "GET", "/", NULL, NULL, 0);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    r = http_to(port, "GET", "/webui/app.js", NULL, NULL, 0);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    expect_error("models without key", http_to(port, "GET", "/v1/models", NULL, NULL, 0), 401,
                 "invalid_api_key", NULL, NULL);
    kvc_server_stop(s);
}

static void test_no_webui(kvc_engine *e)
{
    kvc_server *s = start(e, NULL, true);
    int port = s ? kvc_server_port(s) : 0;
    if (!s)
        return;
    expect_error("no_webui /", http_to(port, "GET", "/", NULL, NULL, 0), 404, "not_found", NULL,
                 NULL);
    expect_error("no_webui app.js", http_to(port, "GET", "/webui/app.js", NULL, NULL, 0), 404,
                 "not_found", NULL, NULL);
    resp r = http_to(port, "GET", "/health", NULL, NULL, 0);
    CHECK_EQ_INT(r.status, 200);   /* the rest serves as before */
    resp_free(&r);
    kvc_server_stop(s);
}

/* `kvchat serve` serves the page; with --no-webui it does not. */
static void test_cli(const char *model_path)
{
    const char *bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_webui: KVC_BIN not set: `kvchat serve --no-webui` not tried\n");
        return;
    }
    for (int off = 0; off <= 1; off++) {
        const char *args[] = { "-m", model_path, "--cache-disk", "0", "-t", "1",
                               off ? "--no-webui" : NULL, NULL };
        http_server hs;
        CHECK(http_server_start(&hs, bin, args, 60));
        if (hs.port <= 0)
            continue;
        http_resp r = http_request(hs.port, "GET", "/", NULL, 30);
        CHECKF(r.status == (off ? 404 : 200), "serve%s: GET / %d", off ? " --no-webui" : "",
               r.status);
        CHECK(off ? r.body && strstr(r.body, "not_found") : r.body && strstr(r.body, "<!doctype html>"));
        http_resp_free(&r);
        http_server_stop(&hs);
    }
}

int main(void)
{
    char dir[] = "/tmp/kvc_test_webui_XXXXXX", path[512], err[512];
    kvc_gen_params g;
    kvc_err ge = { 0 };
    kvc_model *m = NULL;
    kvc_engine *e = NULL;
    if (!mkdtemp(dir))
        return test_done("test_webui");
    snprintf(path, sizeof(path), "%s/tiny.gguf", dir);
    kvc_gen_preset("tiny", &g);
    CHECKF(kvc_gen_model(&g, path, &ge) == KVC_OK, "gen: %s", ge.msg);
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load: %s", err);
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_parallel = 2;
    ep.n_threads = 1;
    if (m)
        CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    kvc_server *s = e ? start(e, NULL, false) : NULL;
    if (s) {
        int port = kvc_server_port(s);
        test_page(port);
        test_files(port);
        kvc_server_stop(s);
        test_key(e);
        test_no_webui(e);
    }
    kvc_engine_free(e);
    kvc_model_free(m);
    test_cli(path);
    unlink(path);
    rmdir(dir);
    return test_done("test_webui");
}
