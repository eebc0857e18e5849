/* cmd_make_model.c - kvchat make-model: write a random-weight GGUF model. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model_gen.h"

static const char help[] =
    "usage: kvchat make-model -o OUT.gguf [--preset NAME] [shape and type options]\n\n"
    "Writes a model with random weights, a built-in vocabulary and a ChatML template.\n"
    "Options override the preset (default: demo), wherever they stand.\n";

enum { OPT_PRESET = CLI_OPT_CMD, OPT_ARCH, OPT_TYPE, OPT_N_EMBD, OPT_N_LAYER, OPT_N_HEAD,
       OPT_N_HEAD_KV, OPT_HEAD_DIM, OPT_N_FF, OPT_N_CTX, OPT_N_VOCAB, OPT_VOCAB, OPT_TIED,
       OPT_UNTIED, OPT_ROPE_THETA, OPT_RMS_EPS, OPT_SEED, OPT_NAME, OPT_ALL_TOKENS,
       OPT_N_EXPERT, OPT_N_EXPERT_USED, OPT_N_FF_EXP, OPT_SWA, OPT_SWA_PATTERN, OPT_ROPE_THETA_SWA,
       OPT_ROPE_SCALING, OPT_ROPE_FACTOR, OPT_ROPE_ORIG_CTX, OPT_LOGIT_SOFTCAP,
       OPT_KV_HEADS, OPT_CONV_L, OPT_SSM_D_CONV, OPT_SSM_D_INNER, OPT_SSM_D_STATE, OPT_SSM_N_HEAD,
       OPT_SSM_N_GROUP, OPT_N_FF_SHEXP, OPT_N_KV_SHARED, OPT_LAYER_PATTERN, OPT_N_DENSE_LEAD };

static const cli_option make_model_opts[] = {
    { "output", 'o', "FILE", 'o', 0, "where to write (required)" },
    { "preset", 0, "NAME", OPT_PRESET, 0,
      "demo, tiny, tiny-llama, tiny-qwen3, tiny-qwen3moe, qwen2.5-0.5b,\n"
      "qwen3-30b-a3b, tiny-gemma3, tiny-gpt-oss, gemma3-4b, gpt-oss-20b,\n"
      "tiny-gemma4, gemma4-e4b, gemma4-26b-a4b,\n"
      "tiny-qwen35, tiny-qwen35moe, qwen3.5-9b, qwen3.6-35b-a3b,\n"
      "tiny-lfm2, tiny-granitehybrid, lfm2-1.2b, granite-4.0-h-tiny,\n"
      "tiny-qwen3next, qwen3-next-80b-a3b, tiny-nemotron_h_moe, tiny-lfm2moe,\n"
      "tiny-nemotron_h, nemotron-3-nano-30b-a3b, lfm2-8b-a1b, nemotron-h-8b\n"
      "(use --n-layer to cut the large ones)" },
    { "arch", 0, "A", OPT_ARCH, 0, "llama, qwen2, qwen3, qwen3moe, gemma3, gemma4, gpt-oss, qwen35,\n"
      "qwen35moe, qwen3next, lfm2, lfm2moe, granitehybrid, nemotron_h, nemotron_h_moe" },
    { "type", 0, "T", OPT_TYPE, 0,
      "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m\n"
      "mxfp4_moe (experts MXFP4, the rest Q8_0)" },
    { "n-embd", 0, "N", OPT_N_EMBD, 0, "embedding width" },
    { "n-layer", 0, "N", OPT_N_LAYER, 0, "layers (a preset's KV-shared layers keep their share)" },
    { "n-head", 0, "N", OPT_N_HEAD, 0, "attention heads" },
    { "n-head-kv", 0, "N", OPT_N_HEAD_KV, 0, "key/value heads" },
    { "head-dim", 0, "N", OPT_HEAD_DIM, 0, "width of a head" },
    { "n-ff", 0, "N|LIST", OPT_N_FF, 0, "feed-forward width (a preset's double-wide layers: twice it);\n"
      "a comma-separated list: each layer's width, repeated over the layers" },
    { "n-expert", 0, "N", OPT_N_EXPERT, 0, "experts (mixture of experts: qwen3moe)" },
    { "n-expert-used", 0, "N", OPT_N_EXPERT_USED, 0, "experts each token uses (top-k)" },
    { "n-ff-exp", 0, "N", OPT_N_FF_EXP, 0, "one expert's feed-forward width" },
    { "sliding-window", 0, "N", OPT_SWA, 0, "the sliding layers' window (gemma3, gpt-oss)" },
    { "swa-pattern", 0, "N", OPT_SWA_PATTERN, 0, "every N-th layer is global, the others slide" },
    { "rope-theta-swa", 0, "X", OPT_ROPE_THETA_SWA, 0, "the sliding layers' RoPE base" },
    { "rope-scaling", 0, "none|linear|yarn", OPT_ROPE_SCALING, 0, "RoPE scaling" },
    { "rope-factor", 0, "X", OPT_ROPE_FACTOR, 0, "RoPE scaling factor" },
    { "rope-orig-ctx", 0, "N", OPT_ROPE_ORIG_CTX, 0, "YaRN's original context length" },
    { "logit-softcap", 0, "X", OPT_LOGIT_SOFTCAP, 0, "final logit soft-capping" },
    { "n-kv-shared", 0, "N", OPT_N_KV_SHARED, 0,
      "the last N layers attend to the K/V of the last earlier layer\n"
      "of their kind (gemma4's KV-shared layers; at most n_layer - 2)" },
    { "kv-heads", 0, "LIST", OPT_KV_HEADS, 0,
      "KV heads per layer, comma-separated, repeated over the layers;\n"
      "0 = a recurrent layer (lfm2, granitehybrid)" },
    { "conv-l", 0, "N", OPT_CONV_L, 0, "lfm2's short convolution width (l_cache)" },
    { "ssm-d-conv", 0, "N", OPT_SSM_D_CONV, 0, "Mamba-2 / Gated DeltaNet convolution width" },
    { "ssm-d-inner", 0, "N", OPT_SSM_D_INNER, 0, "Mamba-2 inner size (GDN: heads x state)" },
    { "ssm-d-state", 0, "N", OPT_SSM_D_STATE, 0, "Mamba-2 state size N (GDN: head size)" },
    { "ssm-n-head", 0, "N", OPT_SSM_N_HEAD, 0, "Mamba-2 heads (GDN: V heads)" },
    { "ssm-n-group", 0, "N", OPT_SSM_N_GROUP, 0, "Mamba-2 groups of B and C (GDN: Q/K heads)" },
    { "n-ff-shexp", 0, "N", OPT_N_FF_SHEXP, 0, "shared expert width (granitehybrid, qwen35moe,\n"
      "nemotron_h_moe)" },
    { "layer-pattern", 0, "P", OPT_LAYER_PATTERN, 0,
      "nemotron_h: a letter per layer, repeated: M Mamba-2, * attention,\n"
      "- (or E) an FFN" },
    { "n-dense-lead", 0, "N", OPT_N_DENSE_LEAD, 0, "lfm2moe: the first N layers' FFNs are dense" },
    { "n-ctx", 0, "N", OPT_N_CTX, 0, "training context length" },
    { "n-vocab", 0, "N", OPT_N_VOCAB, 0, "vocabulary size" },
    { "vocab", 0, "bpe|spm", OPT_VOCAB, 0, "tokenizer kind" },
    { "tied", 0, NULL, OPT_TIED, 0, "output weights tied to the embeddings" },
    { "untied", 0, NULL, OPT_UNTIED, 0, "a separate output matrix" },
    { "rope-theta", 0, "X", OPT_ROPE_THETA, 0, "RoPE base frequency" },
    { "rms-eps", 0, "X", OPT_RMS_EPS, 0, "RMS norm epsilon" },
    { "seed", 0, "N", OPT_SEED, 0, "seed of the random weights" },
    { "name", 0, "NAME", OPT_NAME, 0, "general.name" },
    { "all-tokens", 0, NULL, OPT_ALL_TOKENS, 0,
      "every token as likely as any other (by default bytes outside\n"
      "printable ASCII and control tokens but EOS are made unlikely)" },
    { 0 }
};

static const cli_option *const groups[] = { cli_help_opts, make_model_opts, NULL };

/* Apply option id (not --preset), named name ("n-embd"), to p: a text, a
 * flag, or a number into the field the option names (an int32 in [0, 2^24],
 * a float). false after printing a bad value (naming the option). */
static bool apply(kvc_gen_params *p, int id, const char *name, const char *v, const char **out,
                  bool *tied_set)
{
    int64_t n;
    int32_t *ip = NULL;
    float *fp = NULL;
    char opt[64];
    snprintf(opt, sizeof(opt), "--%s", name);
    switch (id) {
    case 'o': *out = v; return true;
    case OPT_ARCH: p->arch = v; return true;
    case OPT_TYPE: p->ftype = v; return true;
    case OPT_VOCAB: p->vocab = v; return true;
    case OPT_NAME: p->name = v; return true;
    case OPT_ALL_TOKENS: p->all_tokens = true; return true;
    case OPT_TIED:
    case OPT_UNTIED:
        if (*tied_set) {
            fprintf(stderr, "kvchat make-model: --tied and --untied: give one\n");
            return false;
        }
        *tied_set = true;
        p->tied = id == OPT_TIED;
        return true;
    case OPT_ROPE_SCALING: p->rope_scaling = v; return true;
    case OPT_KV_HEADS: p->kv_heads = v; return true;
    case OPT_LAYER_PATTERN: p->layer_pattern = v; return true;
    case OPT_SEED:
        if (!cli_int(opt, v, 0, INT64_MAX, &n))
            return false;
        p->seed = (uint64_t)n;
        return true;
    case OPT_N_EMBD: ip = &p->n_embd; break;
    case OPT_N_LAYER: ip = &p->n_layer; break;
    case OPT_N_HEAD: ip = &p->n_head; break;
    case OPT_N_HEAD_KV: ip = &p->n_head_kv; break;
    case OPT_HEAD_DIM: ip = &p->head_dim; break;
    case OPT_N_FF:
        if (strchr(v, ',')) {   /* widths per layer, as given: no doubling */
            p->ff_layers = v;
            p->double_wide_mlp = false;
            return true;
        }
        p->ff_layers = NULL;
        ip = &p->n_ff;
        break;
    case OPT_N_EXPERT: ip = &p->n_expert; break;
    case OPT_N_EXPERT_USED: ip = &p->n_expert_used; break;
    case OPT_N_FF_EXP: ip = &p->n_ff_exp; break;
    case OPT_SWA: ip = &p->n_swa; break;
    case OPT_SWA_PATTERN: ip = &p->swa_pattern; break;
    case OPT_ROPE_ORIG_CTX: ip = &p->rope_orig_ctx; break;
    case OPT_N_CTX: ip = &p->n_ctx; break;
    case OPT_N_VOCAB: ip = &p->n_vocab; break;
    case OPT_CONV_L: ip = &p->conv_l; break;
    case OPT_SSM_D_CONV: ip = &p->ssm_d_conv; break;
    case OPT_SSM_D_INNER: ip = &p->ssm_d_inner; break;
    case OPT_SSM_D_STATE: ip = &p->ssm_d_state; break;
    case OPT_SSM_N_HEAD: ip = &p->ssm_n_head; break;
    case OPT_SSM_N_GROUP: ip = &p->ssm_n_group; break;
    case OPT_N_FF_SHEXP: ip = &p->n_ff_shexp; break;
    case OPT_N_KV_SHARED: ip = &p->n_kv_shared; break;
    case OPT_ROPE_THETA: fp = &p->rope_theta; break;
    case OPT_RMS_EPS: fp = &p->rms_eps; break;
    case OPT_ROPE_THETA_SWA: fp = &p->rope_theta_swa; break;
    case OPT_ROPE_FACTOR: fp = &p->rope_factor; break;
    case OPT_LOGIT_SOFTCAP: fp = &p->logit_softcap; break;
    case OPT_N_DENSE_LEAD: ip = &p->n_dense_lead; break;
    default: return true;
    }
    if (fp)
        return cli_float(opt, v, fp);
    if (!cli_int(opt, v, 0, 1 << 24, &n))
        return false;
    *ip = (int32_t)n;
    return true;
}

typedef struct given_opt {
    int         id;
    const char *name, *value;
} given_opt;

int cmd_make_model(int argc, char **argv)
{
    kvc_gen_params p = kvc_gen_default_params();
    const char *out = NULL, *preset = NULL;
    given_opt given[CLI_MAX_OPTS];       /* all but --preset, applied after it */
    int n_given = 0;
    cli_parser ps;
    cli_parser_init(&ps, "make-model", argc, argv, groups);
    const char *v;
    int id;
    while ((id = cli_next_opt(&ps, &v, help)) >= 0) {
        if (id == OPT_PRESET)
            preset = v;
        else if (n_given < CLI_MAX_OPTS)
            given[n_given++] = (given_opt){ id, ps.current->name, v };
    }
    if (id != CLI_END)
        return cli_stop_code(id);
    if (cli_no_operands(&ps))
        return 2;
    if (preset && kvc_gen_preset(preset, &p) != KVC_OK) {
        fprintf(stderr, "kvchat make-model: unknown preset '%s'; presets:", preset);
        for (int k = 0; kvc_gen_preset_name(k); k++)
            fprintf(stderr, " %s", kvc_gen_preset_name(k));
        fputc('\n', stderr);
        return 2;
    }
    bool tied_set = false, shared_set = false;
    const int32_t preset_layers = p.n_layer;
    for (int i = 0; i < n_given; i++) {
        if (!apply(&p, given[i].id, given[i].name, given[i].value, &out, &tied_set))
            return 2;
        shared_set |= given[i].id == OPT_N_KV_SHARED;
    }
    if (!shared_set && p.n_layer != preset_layers) {   /* a cut keeps the KV-shared layers' share */
        const int32_t n_layer = p.n_layer;
        p.n_layer = preset_layers;
        kvc_gen_cut_layers(&p, n_layer);
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
