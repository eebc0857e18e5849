/* server_webui.h - the chat page (DESIGN.md §6: GET / serves a chat page
 * embedded in the binary): its files, compiled in at build time from
 * src/server/webui/ and Debian's JavaScript packages by
 * cmake/embed_webui.cmake (webui_assets.c in the build tree), so that
 * `kvchat serve` needs no file at run time. Served by server.c's GET route,
 * open without an API key (the page holds no secret; it asks for the key
 * and sends it with its API calls), off with kvc_server_params.no_webui. */
#ifndef KVC_SERVER_WEBUI_H
#define KVC_SERVER_WEBUI_H

#include <stddef.h>

typedef struct srv_webui_file {
    const char *path;     /* the URL path: "/", "/webui/app.js", ... */
    const char *type;     /* its Content-Type */
    const char *etag;     /* "\"<16 hex digits of its SHA-1>\"", quotes included */
    const char *data;     /* [size] bytes (static) */
    size_t      size;
} srv_webui_file;

extern const srv_webui_file srv_webui_files[];   /* [srv_webui_n_files] */
extern const size_t srv_webui_n_files;

/* The file served at URL path `url` ("/index.html" is "/"); NULL when none. */
const srv_webui_file *srv_webui_find(const char *url);

#endif
