/* hello.c - a program of a kvchat user, built by test_install.sh against the
 * installed kvchat.pc only (no source tree): write the "tiny" random model,
 * load it, and chat two turns through a session, the second reusing the
 * first's cache. Prints "ok" and the figures; exits non-zero on any error. */
#include <kvchat.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: hello MODEL_PATH_TO_WRITE\n");
        return 2;
    }
    char err[512];
    kvc_gen_params g;
    if (kvc_gen_preset("tiny", &g) != KVC_OK || kvc_gen_write(&g, argv[1], err, sizeof(err))) {
        fprintf(stderr, "hello: writing the model: %s\n", err);
        return 1;
    }
    kvc_model *m = NULL;
    kvc_model_params mp = kvc_model_default_params();
    if (kvc_model_load(argv[1], &mp, &m, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "hello: %s\n", err);
        return 1;
    }
    kvc_context_params cp = kvc_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 1;
    kvc_context *ctx = NULL;
    kvc_session *s = NULL;
    if (kvc_context_new(m, &cp, &ctx, err, sizeof(err)) != KVC_OK ||
        !(s = kvc_session_new(ctx, 0, NULL, err, sizeof(err)))) {
        fprintf(stderr, "hello: %s\n", err);
        return 1;
    }
    kvc_chat_message msgs[3] = { { .role = "user", .content = "Hello!" },
                                 { .role = "assistant", .content = NULL },
                                 { .role = "user", .content = "More?" } };
    kvc_chat_params p = kvc_chat_default_params();
    p.max_tokens = 4;
    p.sampling.temperature = 0;
    kvc_chat_stats st[2];
    char *reply[2] = { NULL, NULL };
    for (int t = 0; t < 2; t++) {
        int rc = kvc_session_chat(s, msgs, t ? 3 : 1, &p, NULL, NULL, &reply[t], &st[t], err,
                                  sizeof(err));
        if (rc != KVC_OK) {
            fprintf(stderr, "hello: turn %d: %s (%s)\n", t + 1, err, kvc_strerror(rc));
            return 1;
        }
        msgs[1].content = reply[0];
    }
    printf("ok: turn 1 computed %d of %d tokens, turn 2 %d of %d (%d cached)\n",
           st[0].computed_tokens, st[0].prompt_tokens, st[1].computed_tokens,
           st[1].prompt_tokens, st[1].cached_tokens);
    int rc = st[1].cached_tokens > 0 ? 0 : 1;
    free(reply[0]);
    free(reply[1]);
    kvc_session_free(s);
    kvc_context_free(ctx);
    kvc_model_free(m);
    return rc;
}
