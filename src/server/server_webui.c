/* server_webui.c - serving the chat page's embedded files (server_webui.h):
 * each with its content type, an ETag (a revalidation that matches is a 304
 * without a body), and headers that keep the page to itself: a
 * Content-Security-Policy that runs only the page's own scripts (no inline
 * script, no eval, nothing from another origin) and lets it connect only to
 * this server, no MIME sniffing, no framing, no referrer. */
#include <stdbool.h>
#include <string.h>

#include "server_webui.h"

const srv_webui_file *srv_webui_find(const char *url)
{
    if (!strcmp(url, "/index.html"))
        url = "/";
    for (size_t i = 0; i < srv_webui_n_files; i++)
        if (!strcmp(url, srv_webui_files[i].path))
            return &srv_webui_files[i];
    return NULL;
}

#if __has_include(<microhttpd.h>)

#include "server_http.h"

/* style-src-attr: KaTeX sizes its math with style attributes; <style>
 * elements and stylesheets still come only from the page's own files. */
static const char csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; style-src-attr 'unsafe-inline'; "
    "font-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

/* Whether an If-None-Match value names etag (or is "*"). A weak validator
 * (W/"...") names it too: the comparison for GET is the weak one. */
static bool etag_matches(const char *inm, const char *etag)
{
    size_t n = strlen(etag);
    for (const char *p = inm; *p;) {
        p += strspn(p, " \t,");
        if (!strncmp(p, "W/", 2))
            p += 2;
        if (*p == '*' || (!strncmp(p, etag, n) && strchr(" \t,", p[n])))
            return true;
        p += strcspn(p, ",");
    }
    return false;
}

enum MHD_Result srv_webui_respond(struct MHD_Connection *mc, const srv_webui_file *f)
{
    const char *inm = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                  MHD_HTTP_HEADER_IF_NONE_MATCH);
    bool fresh = inm && etag_matches(inm, f->etag);
    struct MHD_Response *r = MHD_create_response_from_buffer(fresh ? 0 : f->size,
                                                             (void *)f->data,
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    if (!fresh)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, f->type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, f->etag);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");   /* revalidate */
    MHD_add_response_header(r, "Content-Security-Policy", csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    enum MHD_Result ret = MHD_queue_response(mc, fresh ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

#endif
