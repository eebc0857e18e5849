/* cli.h - shared pieces of the kvchat commands: option parsing, model loading
 * with progress, the demo model. Each command lives in its own cmd_*.c. */
#ifndef KVC_CLI_H
#define KVC_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvchat.h"

#define KVC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVC_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Options most commands share. */
typedef struct cli_common {
    const char *model;          /* -m; NULL = the generated demo model */
    int32_t     n_threads;      /* -t; 0 = all cores */
    int32_t     n_ctx;          /* -c; 0 = the model's */
    int32_t     n_batch;        /* -b; 0 = 512 */
    int32_t     kv_type;        /* --kv-type f16|f32|q8_0 */
    bool        json;           /* --json */
    kvc_sampler_params sampling;
} cli_common;

void cli_common_init(cli_common *c);

/* If argv[*i] is one of the shared options, consume it (and its value),
 * advance *i and return 1; return 0 when it is not; -1 (after printing an
 * error naming the option) when its value is missing or bad. */
int cli_parse_common(cli_common *c, int argc, char **argv, int *i);
/* The sampling flags: --temp --top-k --top-p --min-p --repeat-penalty
 * --repeat-last-n --presence-penalty --frequency-penalty --seed. Same return. */
int cli_parse_sampling(kvc_sampler_params *s, int argc, char **argv, int *i);
extern const char cli_common_help[];
extern const char cli_sampling_help[];

/* Parse an integer / float option value; print an error and return false when bad. */
bool cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_float(const char *opt, const char *s, float *out);

/* The tiers of chat and serve: --cache-dir DIR, --cache-disk MIB, --cache-redis URL,
 * --cache-redis-password PW, --cache-redis-timeout MS. */
typedef struct cli_cache {
    const char *dir;            /* NULL = the library's default directory */
    int64_t     disk_mib;       /* 0 = off; default KVC_DISK_DEFAULT_MIB */
    const char *redis;          /* --cache-redis URL; NULL = no shared tier */
    const char *redis_password; /* --cache-redis-password; NULL = the URL's */
    int64_t     redis_timeout_ms;  /* --cache-redis-timeout; 0 = the library's (200) */
} cli_cache;

/* Print a warning of the Redis tier on stderr (kvc_engine_params.cache_warn). */
void cli_cache_warn(void *user, const char *msg);

void cli_cache_init(cli_cache *c);
/* Same return as cli_parse_common. */
int  cli_parse_cache(cli_cache *c, int argc, char **argv, int *i);
extern const char cli_cache_help[];

/* The model's file: -m, or the demo model's path. */
const char *cli_model_path(const cli_common *c);

/* Load c->model (or make and load the demo model) with a progress bar on
 * stderr for large files. Prints the error and returns NULL on failure. */
kvc_model *cli_load_model(const cli_common *c);
kvc_context *cli_new_context(const cli_common *c, kvc_model *m, int32_t n_seq);
/* Tell the user (stderr) when the context length was capped below what the
 * model file says (asked <= 0: the file's was wanted). */
void cli_note_n_ctx(const kvc_model *m, int32_t asked, int32_t used);

/* Path of the demo model, generated on first use (in $KVCHAT_CACHE, else
 * $XDG_CACHE_HOME/kvchat, else ~/.cache/kvchat). NULL on failure (printed). */
const char *cli_demo_model_path(void);

/* Print a message for an unknown option of `cmd`. Returns 2. */
int cli_bad_option(const char *cmd, const char *opt);

/* The chat template options shared by chat and serve: --chat-template NAME,
 * --chat-template-file F (Jinja source), --chat-template-kwargs JSON. Returns
 * 1 when argv[*i] was one (consumed with its value), 0 when not, -1 on an
 * error (printed). *tmpl gets the name or the file's text (malloc'd into
 * *owned, which the caller frees). */
int cli_parse_template(int argc, char **argv, int *i, const char **tmpl, const char **kwargs,
                       char **owned);
extern const char cli_template_help[];

int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_chat(int argc, char **argv);
int cmd_bench_sessions(int argc, char **argv);
int cmd_make_model(int argc, char **argv);

#endif
