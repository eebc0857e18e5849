/* cmd_make_model.c - kvchat make-model: write a random-weight GGUF model. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char help[] =
    "usage: kvchat make-model -o OUT.gguf [--preset NAME] [shape and type options]\n\n"
    "Writes a model with random weights, a built-in vocabulary and a ChatML template.\n"
    "Options override the preset (default: demo).\n\n"
    "  -o, --output FILE     where to write (required)\n"
    "      --preset NAME     demo, tiny, tiny-llama, tiny-qwen3, tiny-qwen3moe, qwen2.5-0.5b,\n"
    "                        qwen3-30b-a3b, tiny-gemma3, tiny-gpt-oss, gemma3-4b, gpt-oss-20b\n"
    "                        (use --n-layer to cut the large ones)\n"
    "      --arch A          llama, qwen2, qwen3, qwen3moe, gemma3, gpt-oss\n"
    "      --type T          f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m\n"
    "                        mxfp4_moe (experts MXFP4, the rest Q8_0)\n"
    "                        mxfp4_moe (experts MXFP4, the rest Q8_0)\n"
    "      --n-embd N  --n-layer N  --n-head N  --n-head-kv N  --head-dim N  --n-ff N\n"
    "      --n-ctx N   --n-vocab N  --vocab bpe|spm  --tied | --untied\n"
    "      --rope-theta X  --rms-eps X  --seed N  --name NAME\n"
    "      --n-expert N  --n-expert-used N  --n-ff-exp N   (mixture of experts: qwen3moe, gpt-oss)\n"
    "      --sliding-window N  --swa-pattern N  --rope-theta-swa X   (gemma3, gpt-oss: the\n"
    "                        window, every N-th layer global, the sliding layers' RoPE base)\n"
    "      --rope-scaling none|linear|yarn  --rope-factor X  --rope-orig-ctx N\n"
    "      --logit-softcap X   final logit soft-capping\n"
    "      --all-tokens      every token as likely as any other (by default bytes outside\n"
    "                        printable ASCII and control tokens but EOS are made unlikely)\n";

int cmd_make_model(int argc, char **argv)
{
    kvc_gen_params p = kvc_gen_default_params();
    const char *out = NULL;
    /* the preset first, so the other options override it wherever they stand */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--preset") && kvc_gen_preset(argv[i + 1], &p) != KVC_OK) {
            fprintf(stderr, "kvchat make-model: unknown preset '%s'; presets:", argv[i + 1]);
            for (int k = 0; kvc_gen_preset_name(k); k++)
                fprintf(stderr, " %s", kvc_gen_preset_name(k));
            fputc('\n', stderr);
            return 2;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        int32_t *ip = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s", help);
            return 0;
        }
        if (!strcmp(a, "--tied") || !strcmp(a, "--untied")) {
            p.tied = !strcmp(a, "--tied");
            continue;
        }
        if (!strcmp(a, "--all-tokens")) {
            p.all_tokens = true;
            continue;
        }
        if (!v) {
            if (!strcmp(a, "-o") || !strncmp(a, "--", 2))
                fprintf(stderr, "kvchat make-model: %s needs a value\n", a);
            else
                return cli_bad_option("make-model", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--preset")) continue;
        else if (!strcmp(a, "--arch")) p.arch = v;
        else if (!strcmp(a, "--type")) p.ftype = v;
        else if (!strcmp(a, "--vocab")) p.vocab = v;
        else if (!strcmp(a, "--name")) p.name = v;
        else if (!strcmp(a, "--n-embd")) ip = &p.n_embd;
        else if (!strcmp(a, "--n-layer")) ip = &p.n_layer;
        else if (!strcmp(a, "--n-head")) ip = &p.n_head;
        else if (!strcmp(a, "--n-head-kv")) ip = &p.n_head_kv;
        else if (!strcmp(a, "--head-dim")) ip = &p.head_dim;
        else if (!strcmp(a, "--n-ff")) ip = &p.n_ff;
        else if (!strcmp(a, "--n-ctx")) ip = &p.n_ctx;
        else if (!strcmp(a, "--n-vocab")) ip = &p.n_vocab;
        else if (!strcmp(a, "--n-expert")) ip = &p.n_expert;
        else if (!strcmp(a, "--n-expert-used")) ip = &p.n_expert_used;
        else if (!strcmp(a, "--n-ff-exp")) ip = &p.n_ff_exp;
        else if (!strcmp(a, "--sliding-window")) ip = &p.n_swa;
        else if (!strcmp(a, "--swa-pattern")) ip = &p.swa_pattern;
        else if (!strcmp(a, "--rope-orig-ctx")) ip = &p.rope_orig_ctx;
        else if (!strcmp(a, "--rope-scaling")) p.rope_scaling = v;
        else if (!strcmp(a, "--rope-theta")) {
            if (!cli_float(a, v, &p.rope_theta))
                return 2;
        } else if (!strcmp(a, "--rope-theta-swa")) {
            if (!cli_float(a, v, &p.rope_theta_swa))
                return 2;
        } else if (!strcmp(a, "--rope-factor")) {
            if (!cli_float(a, v, &p.rope_factor))
                return 2;
        } else if (!strcmp(a, "--logit-softcap")) {
            if (!cli_float(a, v, &p.logit_softcap))
                return 2;
        } else if (!strcmp(a, "--rms-eps")) {
            if (!cli_float(a, v, &p.rms_eps))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!cli_int(a, v, 0, INT64_MAX, &n))
                return 2;
            p.seed = (uint64_t)n;
        } else
            return cli_bad_option("make-model", a);
        if (ip) {
            if (!cli_int(a, v, 0, 1 << 24, &n))
                return 2;
            *ip = (int32_t)n;
        }
    }
    if (!out) {
        fprintf(stderr, "kvchat make-model: -o OUT.gguf is required\n");
        return 2;
    }
    char err[512];
    if (kvc_gen_write(&p, out, err, sizeof(err)) != KVC_OK) {
        fprintf(stderr, "kvchat make-model: %s\n", err);
        return 1;
    }
    fprintf(stderr, "kvchat make-model: wrote %s (%s, %s, %d layers, n_embd %d)\n", out, p.arch,
            p.ftype, p.n_layer, p.n_embd);
    return 0;
}
