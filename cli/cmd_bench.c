/* cmd_bench.c - kvchat bench: prompt processing and generation speed, printed
 * in llama-bench's table form (rows pp512 and tg128, or "pp192 @ d4096" with a
 * depth) so the two can be read side by side. Like llama-bench: random-free
 * synthetic tokens, N cached tokens (-d, 0 by default) before every repetition,
 * the mean and standard deviation over -r runs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static const char help[] =
    "usage: kvchat bench [-m MODEL.gguf] [-p N] [-n N] [-d N] [-r N] [-t N] [options]\n"
    "       kvchat bench chat [...]       a growing conversation, cached and cold (--help)\n"
    "       kvchat bench sessions [...]   many conversations at once, batched and not (--help)\n";

static const cli_option bench_opts[] = {
    { "n-prompt", 'p', "N", 'p', 0, "prompt tokens processed in one go (default 512; 0 = skip)" },
    { "n-gen", 'n', "N", 'n', 0, "tokens generated one at a time (default 128; 0 = skip)" },
    { "n-depth", 'd', "N", 'd', 0,
      "cached tokens before each test (default 0), filled once and\n"
      "cut back to N between runs, not timed" },
    { "repetitions", 'r', "N", 'r', 0, "runs of each test (default 3)" },
    { 0 }
};

static const cli_option *const groups[] = {
    cli_help_opts, cli_model_opts, bench_opts, cli_context_opts, NULL
};

/* n synthetic tokens, the first being number `first` of the series; NULL when
 * out of memory. The caller frees. */
static int32_t *synthetic_tokens(const kvc_model_info *info, int32_t first, int32_t n)
{
    int32_t *toks = malloc((size_t)KVC_MAX(n, 1) * sizeof(int32_t));
    for (int32_t i = 0; toks && i < n; i++)
        toks[i] = (int32_t)((1000003u * (uint32_t)(first + i + 1)) % (uint32_t)info->n_vocab);
    return toks;
}

/* Sequence 0 holding exactly the first `depth` synthetic tokens. A run's test
 * tokens continue the same series, so a longer sequence is cut back; a
 * shorter one is filled up (not timed). A cut may keep less than asked (a
 * recurrent model's state cannot go back to a position it kept no snapshot
 * of: kvc_context_seq_truncate): the rest is filled up again. */
static int set_depth(kvc_context *ctx, const kvc_model_info *info, int32_t depth, char *err,
                     size_t err_size)
{
    int rc = kvc_context_seq_len(ctx, 0) > depth ? kvc_context_seq_truncate(ctx, 0, depth) : KVC_OK;
    const int32_t len = kvc_context_seq_len(ctx, 0);
    if (!rc && len < depth) {
        int32_t *toks = synthetic_tokens(info, len, depth - len);
        if (!toks) {
            snprintf(err, err_size, "out of memory for %d depth tokens", depth);
            return KVC_ERR_NOMEM;
        }
        rc = kvc_context_decode(ctx, 0, toks, depth - len, false, err, err_size);
        free(toks);
    }
    if (!rc && kvc_context_seq_len(ctx, 0) != depth) {   /* never time a run at another depth */
        snprintf(err, err_size, "depth %d asked, the sequence holds %d", depth, kvc_context_seq_len(ctx, 0));
        return KVC_ERR_INVALID_ARG;
    }
    return rc;
}

/* One run: tokens/s of processing n tokens as a prompt (gen = false) or
 * generating n one by one (gen = true), after `depth` cached tokens. */
static double run_once(kvc_context *ctx, const kvc_model_info *info, int32_t depth, int32_t n,
                       bool gen, bool *ok)
{
    char err[512];
    int rc = set_depth(ctx, info, depth, err, sizeof(err));
    int32_t *toks = rc ? NULL : synthetic_tokens(info, depth, n);
    if (!rc && !toks) {
        snprintf(err, sizeof(err), "out of memory for %d tokens", n);
        rc = KVC_ERR_NOMEM;
    }
    if (rc) {
        fprintf(stderr, "kvchat bench: %s\n", err);
        *ok = false;
        return 0;
    }
    double t0 = cli_now_s();
    if (!gen)
        rc = kvc_context_decode(ctx, 0, toks, n, false, err, sizeof(err));
    else
        for (int32_t i = 0; i < n && rc == KVC_OK; i++)
            rc = kvc_context_decode(ctx, 0, &toks[i], 1, false, err, sizeof(err));
    double dt = cli_now_s() - t0;
    free(toks);
    if (rc != KVC_OK) {
        fprintf(stderr, "kvchat bench: %s\n", err);
        *ok = false;
        return 0;
    }
    return n / dt;
}

static bool bench_row(kvc_context *ctx, const kvc_model_info *info, const char *size_s,
                      const char *params_s, int32_t depth, int32_t n, bool gen, int reps)
{
    bool ok = true;
    run_once(ctx, info, depth, gen ? KVC_MIN(n, 16) : KVC_MIN(n, 32), gen, &ok);   /* warm-up */
    double sum = 0, sum2 = 0;
    for (int r = 0; ok && r < reps; r++) {
        double tps = run_once(ctx, info, depth, n, gen, &ok);
        sum += tps;
        sum2 += tps * tps;
    }
    if (!ok)
        return false;
    double mean = sum / reps, sd = reps > 1 ? sqrt(fmax(0, (sum2 - sum * sum / reps) / (reps - 1))) : 0;
    char test[48];
    if (depth > 0)
        snprintf(test, sizeof(test), "%s%d @ d%d", gen ? "tg" : "pp", n, depth);
    else
        snprintf(test, sizeof(test), "%s%d", gen ? "tg" : "pp", n);
    printf("| %-24.24s | %10s | %8s | %-7s | %7d | %13s | %12.2f ± %.2f |\n", info->name, size_s,
           params_s, "CPU", kvc_context_n_threads(ctx), test, mean, sd);
    fflush(stdout);
    return true;
}

int cmd_bench(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "chat"))
        return cmd_bench_chat(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "sessions"))
        return cmd_bench_sessions(argc - 1, argv + 1);
    cli_common c;
    cli_common_init(&c);
    int64_t n_prompt = 512, n_gen = 128, n_depth = 0, reps = 3;
    cli_parser p;
    cli_parser_init(&p, "bench", argc, argv, groups);
    const char *v;
    int id, r;
    while ((id = cli_next_opt(&p, &v, help)) >= 0) {
        if ((r = cli_common_apply(&c, id, v)) < 0)
            return 2;
        if (r > 0)
            continue;
        int64_t *dst = id == 'p' ? &n_prompt : id == 'n' ? &n_gen : id == 'd' ? &n_depth : &reps;
        if (!cli_int(cli_opt_name(&p), v, id == 'r' ? 1 : 0, 1 << 20, dst))
            return 2;
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    if (cli_no_operands(&p))
        return 2;
    if (c.n_ctx == 0)
        c.n_ctx = (int32_t)(n_depth + KVC_MAX(n_prompt, n_gen) + 16);
    if (c.n_batch == 0)   /* the prompt in one batch; the depth's fill in batches of up to 512 (untimed) */
        c.n_batch = (int32_t)KVC_MAX(KVC_MAX(n_prompt, KVC_MIN(n_depth, 512)), 1);
    kvc_model *m = cli_load_model(&c);
    kvc_context *ctx = m ? cli_new_context(&c, m, 1) : NULL;
    if (!ctx) {
        kvc_model_free(m);
        return 1;
    }
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    char size_s[32], params_s[32];
    snprintf(size_s, sizeof(size_s), "%.2f MiB", info.weight_bytes / 1048576.0);
    snprintf(params_s, sizeof(params_s), "%.2f M", info.n_params / 1e6);
    printf("| %-24s | %10s | %8s | %-7s | %7s | %13s | %20s |\n", "model", "size", "params",
           "backend", "threads", "test", "t/s");
    printf("| ------------------------ | ---------: | -------: | ------- | ------: | ------------: | -------------------: |\n");
    bool ok = true;
    if (n_prompt > 0)
        ok = bench_row(ctx, &info, size_s, params_s, (int32_t)n_depth, (int32_t)n_prompt, false,
                       (int)reps);
    if (ok && n_gen > 0)
        ok = bench_row(ctx, &info, size_s, params_s, (int32_t)n_depth, (int32_t)n_gen, true,
                       (int)reps);
    kvc_context_free(ctx);
    kvc_model_free(m);
    return ok ? 0 : 1;
}
