/* cli.h - shared pieces of the kvchat commands: option parsing, model loading
 * with progress, the demo model. Each command lives in its own cmd_*.c. */
#ifndef KVC_CLI_H
#define KVC_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <getopt.h>
#include <stdio.h>

#include "kvchat.h"

#define KVC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVC_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ------------------------------------------------------------ options */

/* One option of a command: getopt_long's row, with what --help says of it.
 * A command's options are a NULL-terminated list of groups (arrays ended by
 * a row of zeros); its parser and its --help read the same rows. */
typedef struct cli_option {
    const char *name;           /* long name, without the dashes */
    int         short_name;     /* its letter, or 0 */
    const char *arg;            /* the value's name in --help; NULL = a flag, no value */
    int         id;             /* what cli_next returns: the letter, or a CLI_OPT_* */
    int         flags;          /* CLI_REPEAT, CLI_HIDDEN */
    const char *help;           /* --help text; '\n' goes on at the help column */
} cli_option;

#define CLI_REPEAT 1            /* may be given more than once (else refused the 2nd time) */
#define CLI_HIDDEN 2            /* an alias --help does not list */

/* Ids of long-only options, shared by every command; a command numbers its
 * own from CLI_OPT_CMD. */
enum {
    CLI_OPT_KV_TYPE = 256, CLI_OPT_SNAP_INTERVAL, CLI_OPT_TEMP, CLI_OPT_TOP_K, CLI_OPT_TOP_P, CLI_OPT_MIN_P,
    CLI_OPT_REPEAT_PENALTY, CLI_OPT_REPEAT_LAST_N, CLI_OPT_PRESENCE, CLI_OPT_FREQUENCY,
    CLI_OPT_CACHE_DIR, CLI_OPT_CACHE_DISK, CLI_OPT_CACHE_REDIS, CLI_OPT_CACHE_REDIS_PW,
    CLI_OPT_CACHE_REDIS_TIMEOUT, CLI_OPT_TEMPLATE, CLI_OPT_TEMPLATE_FILE,
    CLI_OPT_TEMPLATE_KWARGS,
    CLI_OPT_CMD = 512
};

extern const cli_option cli_help_opts[];      /* -h --help */
extern const cli_option cli_model_opts[];     /* -m */
extern const cli_option cli_context_opts[];   /* -t -c -b --kv-type */
extern const cli_option cli_sampling_opts[];  /* --temp ... --seed */
extern const cli_option cli_cache_opts[];     /* --cache-dir ... --cache-redis-timeout */
extern const cli_option cli_template_opts[];  /* --chat-template, -file, -kwargs */

#define CLI_MAX_OPTS 96

typedef struct cli_seen {
    int         id;
    const char *value;
} cli_seen;

/* getopt_long over a command's groups: --opt=value, --opt value, -xVALUE,
 * -x VALUE, bundled flags, operands anywhere (GNU order). */
typedef struct cli_parser {
    const char        *cmd;                      /* "serve", "bench chat": for messages */
    int                argc;
    char             **argv;                     /* argv[0] is the command's name */
    const cli_option *const *groups;
    struct option      longs[CLI_MAX_OPTS + 1];
    const cli_option  *row[CLI_MAX_OPTS];        /* longs[i]'s row */
    char               shorts[3 * CLI_MAX_OPTS + 2];
    int                n;
    cli_seen           seen[CLI_MAX_OPTS];       /* single-valued options given so far */
    int                n_seen;
    const cli_option  *current;                  /* the option cli_next last returned */
} cli_parser;

void cli_parser_init(cli_parser *p, const char *cmd, int argc, char **argv,
                     const cli_option *const *groups);
#define CLI_END (-1)
#define CLI_ERR (-2)
/* The next option's id, its value in *value (NULL for a flag). CLI_END when
 * the options are over (operands: cli_operands); CLI_ERR after printing what
 * was wrong: an unknown option, a missing value, a value to a flag, or a
 * single-valued option given a second time. */
int cli_next(cli_parser *p, const char **value);
#define CLI_HELP (-3)
/* cli_next with --help answered: `help`, then the option lines, printed to
 * stdout, and CLI_HELP returned. A command's loop reads
 *     while ((id = cli_next_opt(&p, &v, help)) >= 0) { ...its options... }
 *     if (id != CLI_END)
 *         return cli_stop_code(id);
 */
int cli_next_opt(cli_parser *p, const char **value, const char *help);
/* The exit code when cli_next_opt stopped early: 0 after --help, 2 after an
 * error (already printed). */
static inline int cli_stop_code(int id)
{
    return id == CLI_HELP ? 0 : 2;
}
/* "--name" of the option cli_next last returned (a static buffer). */
const char *cli_opt_name(const cli_parser *p);
/* The operands (non-options), once cli_next returned CLI_END. */
char **cli_operands(const cli_parser *p, int *n);
/* 0 when there are none; else prints the first as unexpected and returns 2. */
int cli_no_operands(const cli_parser *p);
/* The option lines of --help, from the rows (hidden ones left out). */
void cli_print_options(FILE *out, const cli_option *const *groups);

/* Options most commands share. */
typedef struct cli_common {
    const char *model;          /* -m; NULL = the generated demo model */
    int32_t     n_threads;      /* -t; 0 = all cores */
    int32_t     n_ctx;          /* -c; 0 = the model's */
    int32_t     n_batch;        /* -b; 0 = 512 */
    int32_t     kv_type;        /* --kv-type f16|f32|q8_0 */
    int32_t     snap_interval;  /* --snapshot-interval; 0 = the model's, -1 = none */
    bool        json;           /* --json, of the commands that take it */
    bool        quiet;          /* serve --quiet: no summary, no loading progress */
    kvc_sampler_params sampling;
} cli_common;

void cli_common_init(cli_common *c);

/* Apply option `id` with value v of the model, context or sampling group:
 * 1 when it was one of them, 0 when not, -1 (after printing an error naming
 * the option) when its value is bad. The other *_apply return the same. */
int cli_common_apply(cli_common *c, int id, const char *v);
int cli_sampling_apply(kvc_sampler_params *s, int id, const char *v);

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
int  cli_cache_apply(cli_cache *c, int id, const char *v);

/* The chat template options of chat and serve. */
typedef struct cli_template {
    const char *tmpl;           /* --chat-template NAME, or --chat-template-file's text */
    const char *kwargs;         /* --chat-template-kwargs JSON (checked: an object) */
    char       *owned;          /* the file's text, malloc'd: the caller frees it */
} cli_template;

int cli_template_apply(cli_template *t, int id, const char *v);

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

/* What `kvchat serve` runs, for its start summary (cli/summary.c). */
typedef struct kvc_server_params kvc_server_params;
typedef struct cli_serve_info {
    const kvc_model         *model;
    const char              *model_path;
    const char              *served_name;   /* --alias, else the model's name */
    kvc_engine              *engine;
    const kvc_engine_params *params;        /* as the engine was made with them */
    const kvc_server_params *server;
    int                      n_api_keys;    /* --api-key(-file) keys, or 1 for $KVCHAT_API_KEY */
} cli_serve_info;

/* Print the start summary, one fact a line: model, architecture, weight
 * types, parameters, context, KV budget (tokens and MiB), threads, ISA,
 * template, the disk tier (directory, size, budget), Redis, API keys. */
void cli_serve_summary(FILE *out, const cli_serve_info *s);

/* ------------------------------------------------------------ benchmarks */

/* Seconds on the monotonic clock. */
double cli_now_s(void);

/* The plain words the benchmarks build their texts of (cli_n_words). */
extern const char *const cli_words[];
extern const size_t cli_n_words;

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
