/* model_gen_preset.c - the generator's parameters: defaults and the named
 * presets (include/kvchat.h lists them). The generator is model_gen.c. */
#include "model_gen.h"
#include "arch.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ params */

kvc_gen_params kvc_gen_default_params(void)
{
    return (kvc_gen_params){
        .arch = "qwen2", .ftype = "f16",
        .n_embd = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .head_dim = 0,
        .n_ff = 384, .n_ctx = 4096, .n_vocab = 0,
        .vocab = "bpe", .bpe_pre = NULL, .tied = true, .vocab_only = false,
        .rope_theta = 10000.0f, .rms_eps = 1e-6f, .seed = 42, .name = NULL, .n_threads = 0,
        .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64,
        .full_attn_interval = 4,
    };
}

static const char *const preset_names[] = { "demo", "tiny", "tiny-llama", "tiny-qwen3", "tiny-qwen3moe",
                                            "qwen2.5-0.5b", "qwen3-30b-a3b", "tiny-gemma3",
                                            "tiny-gpt-oss", "gemma3-4b", "gpt-oss-20b",
                                            "tiny-qwen35", "tiny-qwen35moe", "qwen3.5-9b",
                                            "qwen3.6-35b-a3b", "tiny-lfm2", "tiny-granitehybrid",
                                            "lfm2-1.2b", "granite-4.0-h-tiny", "tiny-gemma4",
                                            "gemma4-e4b", "gemma4-26b-a4b", "tiny-gemma4-dw",
                                            "gemma4-e2b", "tiny-qwen3next",
                                            "qwen3-next-80b-a3b", "tiny-nemotron_h_moe",
                                            "tiny-lfm2moe", "tiny-nemotron_h", "nemotron-3-nano-30b-a3b",
                                            "lfm2-8b-a1b", "nemotron-h-8b" };

const char *kvc_gen_preset_name(int i)
{
    return i >= 0 && i < (int)KVC_ARRAY_LEN(preset_names) ? preset_names[i] : NULL;
}

int kvc_gen_preset(const char *name, kvc_gen_params *out)
{
    kvc_gen_params p = kvc_gen_default_params();
    if (!name || !out)
        return KVC_ERR_NOT_FOUND;
    if (strcmp(name, "demo") == 0) {
        /* the defaults */
    } else if (strcmp(name, "tiny") == 0) {
        p.ftype = "f32";
        p.n_embd = 64, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 2, p.n_ff = 128, p.n_ctx = 2048;
    } else if (strcmp(name, "tiny-llama") == 0) {
        p.arch = "llama", p.ftype = "f32", p.vocab = "spm", p.tied = false;
        p.n_embd = 64, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 2, p.n_ff = 192, p.n_ctx = 2048;
    } else if (strcmp(name, "tiny-qwen3") == 0) {
        p.arch = "qwen3", p.ftype = "f32", p.vocab = "spm";
        p.n_embd = 64, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 1, p.head_dim = 32;
        p.n_ff = 128, p.n_ctx = 2048;
    } else if (strcmp(name, "tiny-qwen3moe") == 0) {
        p.arch = "qwen3moe", p.ftype = "f32", p.vocab = "spm", p.tied = false;
        p.n_embd = 64, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 1, p.head_dim = 32;
        p.n_ff = 128, p.n_ctx = 2048, p.rope_theta = 1e6f;
        p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 64;
    } else if (strcmp(name, "qwen3-30b-a3b") == 0) {
        p.arch = "qwen3moe", p.ftype = "q4_k_m", p.tied = false;
        p.n_embd = 2048, p.n_layer = 48, p.n_head = 32, p.n_head_kv = 4, p.head_dim = 128;
        p.n_ff = 6144, p.n_vocab = 151936, p.n_ctx = 40960, p.rope_theta = 1e6f;
        p.n_expert = 128, p.n_expert_used = 8, p.n_ff_exp = 768;
    } else if (strcmp(name, "tiny-gemma3") == 0) {
        p.arch = "gemma3", p.ftype = "f32", p.vocab = "spm";
        p.n_embd = 64, p.n_layer = 6, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 32;
        p.n_ff = 128, p.n_ctx = 2048, p.rope_theta = 1e6f, p.rope_theta_swa = 1e4f;
        p.n_swa = 12, p.swa_pattern = 3;
    } else if (strcmp(name, "tiny-gpt-oss") == 0) {
        p.arch = "gpt-oss", p.ftype = "f32", p.tied = false, p.rms_eps = 1e-5f;
        p.n_embd = 64, p.n_layer = 4, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 32;
        p.n_ff = 64, p.n_ctx = 2048, p.rope_theta = 150000.0f, p.n_swa = 8;
        p.rope_scaling = "yarn", p.rope_factor = 4.0f, p.rope_orig_ctx = 512;
        p.n_expert = 8, p.n_expert_used = 4, p.n_ff_exp = 64;
    } else if (strcmp(name, "gemma3-4b") == 0) {
        p.arch = "gemma3", p.ftype = "q4_k_m";
        p.n_embd = 2560, p.n_layer = 34, p.n_head = 8, p.n_head_kv = 4, p.head_dim = 256;
        p.n_ff = 10240, p.n_vocab = 262144, p.n_ctx = 131072, p.rope_theta = 1e6f;
        p.rope_theta_swa = 1e4f, p.rope_scaling = "linear", p.rope_factor = 8.0f;
        p.n_swa = 1024, p.swa_pattern = 6;
    } else if (strcmp(name, "gpt-oss-20b") == 0) {
        p.arch = "gpt-oss", p.ftype = "mxfp4_moe", p.tied = false, p.rms_eps = 1e-5f;
        p.n_embd = 2880, p.n_layer = 24, p.n_head = 64, p.n_head_kv = 8, p.head_dim = 64;
        p.n_ff = 2880, p.n_vocab = 201088, p.n_ctx = 131072, p.rope_theta = 150000.0f;
        p.n_swa = 128, p.rope_scaling = "yarn", p.rope_factor = 32.0f, p.rope_orig_ctx = 4096;
        p.n_expert = 32, p.n_expert_used = 4, p.n_ff_exp = 2880;
    } else if (strcmp(name, "tiny-gemma4") == 0) {
        p.arch = "gemma4", p.ftype = "f32", p.vocab = "spm";
        p.n_embd = 64, p.n_layer = 9, p.n_head = 4, p.n_head_kv = 1, p.head_dim = 32;
        p.n_head_kv_swa = 2, p.head_dim_swa = 16, p.n_swa = 8, p.swa_pattern = 3;
        p.n_ff = 128, p.n_ctx = 2048, p.rope_theta = 1e6f, p.rope_theta_swa = 1e4f, p.logit_softcap = 30.0f;
        p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 32;
    } else if (strcmp(name, "tiny-gemma4-dw") == 0) {
        /* Gemma 4 E2B's FFNs in small: per-layer widths (96 and 64 in turn), doubled on the
         * KV-shared layers 6-8 (double-wide MLPs), per-layer embeddings, no experts */
        p.arch = "gemma4", p.ftype = "f32", p.vocab = "spm";
        p.n_embd = 64, p.n_layer = 9, p.n_head = 4, p.n_head_kv = 1, p.head_dim = 32;
        p.n_head_kv_swa = 2, p.head_dim_swa = 16, p.n_swa = 8, p.swa_pattern = 3;
        p.n_ff = 96, p.ff_layers = "96,64", p.double_wide_mlp = true, p.n_kv_shared = 3;
        p.n_embd_per_layer = 16, p.n_expert = 0;
        p.n_ctx = 2048, p.rope_theta = 1e6f, p.rope_theta_swa = 1e4f, p.logit_softcap = 30.0f;
    } else if (strcmp(name, "gemma4-e2b") == 0) {
        /* E2B: layers 15-34 read layers 13 and 14's K/V, and their MLPs are double-wide (12288) */
        p.arch = "gemma4", p.ftype = "q4_k_m";
        p.n_embd = 1536, p.n_layer = 35, p.n_head = 8, p.n_head_kv = 1, p.head_dim = 512;
        p.n_head_kv_swa = 1, p.head_dim_swa = 256, p.n_swa = 512, p.swa_pattern = 5;
        p.n_ff = 6144, p.double_wide_mlp = true, p.n_vocab = 262144, p.n_ctx = 131072;
        p.rope_theta = 1e6f, p.rope_theta_swa = 1e4f, p.logit_softcap = 30.0f;
        p.n_expert = 0, p.n_embd_per_layer = 256, p.n_kv_shared = 20;
    } else if (strcmp(name, "gemma4-e4b") == 0 || strcmp(name, "gemma4-26b-a4b") == 0) {
        const bool moe = strcmp(name, "gemma4-26b-a4b") == 0;
        p.arch = "gemma4", p.ftype = "q4_k_m";
        p.n_embd = moe ? 2816 : 2560, p.n_layer = moe ? 30 : 42, p.n_head = moe ? 16 : 8;
        p.n_head_kv = 2, p.head_dim = 512, p.n_head_kv_swa = moe ? 8 : 2, p.head_dim_swa = 256;
        p.n_swa = moe ? 1024 : 512, p.swa_pattern = 6;
        p.n_ff = moe ? 2112 : 10240, p.n_vocab = 262144, p.n_ctx = moe ? 262144 : 131072;
        p.rope_theta = 1e6f, p.rope_theta_swa = 1e4f, p.logit_softcap = 30.0f;
        p.n_expert = moe ? 128 : 0, p.n_expert_used = moe ? 8 : 0, p.n_ff_exp = 704;
        p.n_embd_per_layer = moe ? 0 : 256;
        p.n_kv_shared = moe ? 0 : 18;   /* E4B: layers 24-41 read layers 22 and 23's K/V */
    } else if (strcmp(name, "tiny-qwen35") == 0 || strcmp(name, "tiny-qwen35moe") == 0) {
        const bool moe = strcmp(name, "tiny-qwen35moe") == 0;
        p.arch = moe ? "qwen35moe" : "qwen35", p.ftype = "f32", p.vocab = moe ? "spm" : "bpe";
        p.tied = !moe;
        p.n_embd = 64, p.n_layer = 4, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 32, p.n_rot = 8;
        p.n_ff = 128, p.n_ctx = 2048, p.rope_theta = 1e7f;
        p.ssm_d_conv = 4, p.ssm_d_state = 16, p.ssm_n_group = 2, p.ssm_n_head = moe ? 6 : 4;
        p.full_attn_interval = 4;
        p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 32, p.n_ff_shexp = moe ? 48 : 0;
    } else if (strcmp(name, "qwen3.5-9b") == 0 || strcmp(name, "qwen3.6-35b-a3b") == 0) {
        const bool moe = strcmp(name, "qwen3.6-35b-a3b") == 0;
        p.arch = moe ? "qwen35moe" : "qwen35", p.ftype = "q4_k_m", p.tied = false;
        p.n_embd = moe ? 2048 : 4096, p.n_layer = moe ? 40 : 32;
        p.n_head = 16, p.n_head_kv = moe ? 2 : 4, p.head_dim = 256, p.n_rot = 64;
        p.n_ff = moe ? 512 : 12288, p.n_vocab = 248320, p.n_ctx = 262144, p.rope_theta = 1e7f;
        p.ssm_d_conv = 4, p.ssm_d_state = 128, p.ssm_n_group = 16, p.ssm_n_head = 32;
        p.full_attn_interval = 4;
        p.n_expert = 256, p.n_expert_used = 8, p.n_ff_exp = 512, p.n_ff_shexp = moe ? 512 : 0;
    } else if (strcmp(name, "tiny-qwen3next") == 0) {
        /* 3 V heads per K head, so that grouped and tiled V heads differ */
        p.arch = "qwen3next", p.ftype = "f32", p.tied = false;
        p.n_embd = 64, p.n_layer = 4, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 32, p.n_rot = 8;
        p.n_ff = 128, p.n_ctx = 2048, p.rope_theta = 1e7f;
        p.ssm_d_conv = 4, p.ssm_d_state = 16, p.ssm_n_group = 2, p.ssm_n_head = 6;
        p.full_attn_interval = 4;
        p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 32, p.n_ff_shexp = 48;
    } else if (strcmp(name, "qwen3-next-80b-a3b") == 0) {
        /* Qwen3-Next-80B-A3B / Qwen3-Coder-Next: 48 layers (36 GDN, 12 gated attention) */
        p.arch = "qwen3next", p.ftype = "q4_k_m", p.tied = false;
        p.n_embd = 2048, p.n_layer = 48, p.n_head = 16, p.n_head_kv = 2, p.head_dim = 256, p.n_rot = 64;
        p.n_ff = 5120, p.n_vocab = 151936, p.n_ctx = 262144, p.rope_theta = 1e7f;
        p.ssm_d_conv = 4, p.ssm_d_state = 128, p.ssm_n_group = 16, p.ssm_n_head = 32;
        p.full_attn_interval = 4;
        p.n_expert = 512, p.n_expert_used = 10, p.n_ff_exp = 512, p.n_ff_shexp = 512;
    } else if (strcmp(name, "tiny-lfm2") == 0) {
        p.arch = "lfm2", p.ftype = "f32", p.vocab = "spm", p.rms_eps = 1e-5f;
        p.n_embd = 64, p.n_layer = 8, p.n_head = 4, p.n_head_kv = 4, p.head_dim = 16;
        p.n_ff = 128, p.n_ctx = 2048, p.rope_theta = 1e6f, p.kv_heads = "0,0,2,0,1,0,0,4", p.conv_l = 3;
    } else if (strcmp(name, "tiny-granitehybrid") == 0) {
        p.arch = "granitehybrid", p.ftype = "f32", p.vocab = "spm", p.tied = false, p.rms_eps = 1e-5f;
        p.n_embd = 64, p.n_layer = 9, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 16;
        p.n_ff = 32, p.n_ctx = 2048, p.kv_heads = "0,0,2,0,0,2,0,0,1";
        p.n_expert = 8, p.n_expert_used = 2, p.n_ff_shexp = 48;
        p.ssm_d_conv = 4, p.ssm_d_inner = 128, p.ssm_d_state = 16, p.ssm_n_head = 8, p.ssm_n_group = 2;
        p.embedding_scale = 12.0f, p.residual_scale = 0.5f, p.attention_scale = 0.125f, p.logit_scale = 4.0f;
    } else if (strcmp(name, "lfm2-1.2b") == 0) {
        p.arch = "lfm2", p.ftype = "q4_k_m", p.rms_eps = 1e-5f;
        p.n_embd = 2048, p.n_layer = 16, p.n_head = 32, p.n_head_kv = 8, p.head_dim = 64;
        p.n_ff = 8192, p.n_vocab = 65536, p.n_ctx = 128000, p.rope_theta = 1e6f, p.conv_l = 3;
        p.kv_heads = "0,0,8,0,0,8,0,0,8,0,8,0,8,0,8,0";
    } else if (strcmp(name, "granite-4.0-h-tiny") == 0) {
        p.arch = "granitehybrid", p.ftype = "q4_k_m", p.tied = false, p.rms_eps = 1e-5f;
        p.n_embd = 1536, p.n_layer = 40, p.n_head = 12, p.n_head_kv = 4, p.head_dim = 128;
        p.n_ff = 512, p.n_vocab = 100352, p.n_ctx = 131072, p.kv_heads = "0,0,0,0,0,4,0,0,0,0";
        p.n_expert = 64, p.n_expert_used = 6, p.n_ff_shexp = 1024;
        p.ssm_d_conv = 4, p.ssm_d_inner = 3072, p.ssm_d_state = 128, p.ssm_n_head = 48, p.ssm_n_group = 1;
        p.embedding_scale = 12.0f, p.residual_scale = 0.22f, p.attention_scale = 0.0078125f;
        p.logit_scale = 6.0f;
    } else if (strcmp(name, "tiny-nemotron_h_moe") == 0 || strcmp(name, "tiny-nemotron_h") == 0) {
        const bool moe = strcmp(name, "tiny-nemotron_h_moe") == 0;
        p.arch = moe ? "nemotron_h_moe" : "nemotron_h", p.ftype = "f32", p.vocab = "spm";
        p.tied = false, p.rms_eps = 1e-5f;
        p.n_embd = 64, p.n_layer = moe ? 10 : 7, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 16;
        p.n_ff = moe ? 32 : 96, p.n_ctx = 2048, p.layer_pattern = moe ? "MEM*E" : "M-M-M*-";
        p.n_expert = moe ? 8 : 0, p.n_expert_used = 2, p.n_ff_exp = 32, p.n_ff_shexp = moe ? 48 : 0;
        p.expert_weights_scale = moe ? 2.5f : 0.0f, p.expert_weights_norm = moe;
        p.ssm_d_conv = 4, p.ssm_d_inner = 128, p.ssm_d_state = 16, p.ssm_n_head = 8, p.ssm_n_group = 2;
    } else if (strcmp(name, "nemotron-3-nano-30b-a3b") == 0) {
        p.arch = "nemotron_h_moe", p.ftype = "q4_k_m", p.tied = false, p.rms_eps = 1e-5f;
        p.n_embd = 2688, p.n_layer = 52, p.n_head = 32, p.n_head_kv = 2, p.head_dim = 128;
        p.n_ff = 1856, p.n_vocab = 131072, p.n_ctx = 262144;
        p.layer_pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";
        p.n_expert = 128, p.n_expert_used = 6, p.n_ff_exp = 1856, p.n_ff_shexp = 3712;
        p.expert_weights_scale = 2.5f, p.expert_weights_norm = true;
        p.ssm_d_conv = 4, p.ssm_d_inner = 4096, p.ssm_d_state = 128, p.ssm_n_head = 64, p.ssm_n_group = 8;
    } else if (strcmp(name, "nemotron-h-8b") == 0) {
        p.arch = "nemotron_h", p.ftype = "q4_k_m", p.tied = false, p.rms_eps = 1e-5f;
        p.n_embd = 4096, p.n_layer = 52, p.n_head = 32, p.n_head_kv = 8, p.head_dim = 128;
        p.n_ff = 21504, p.n_vocab = 131072, p.n_ctx = 8192, p.n_expert = 0;
        p.layer_pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
        p.ssm_d_conv = 4, p.ssm_d_inner = 8192, p.ssm_d_state = 128, p.ssm_n_head = 128, p.ssm_n_group = 8;
    } else if (strcmp(name, "tiny-lfm2moe") == 0) {
        p.arch = "lfm2moe", p.ftype = "f32", p.vocab = "spm", p.rms_eps = 1e-5f;
        p.n_embd = 64, p.n_layer = 8, p.n_head = 4, p.n_head_kv = 4, p.head_dim = 16;
        p.n_ff = 128, p.n_ctx = 2048, p.rope_theta = 1e6f, p.kv_heads = "0,0,2,0,1,0,0,4", p.conv_l = 3;
        p.n_expert = 8, p.n_expert_used = 2, p.n_ff_exp = 32, p.n_dense_lead = 2;
    } else if (strcmp(name, "lfm2-8b-a1b") == 0) {
        p.arch = "lfm2moe", p.ftype = "q4_k_m", p.rms_eps = 1e-5f;
        p.n_embd = 2048, p.n_layer = 24, p.n_head = 32, p.n_head_kv = 8, p.head_dim = 64;
        p.n_ff = 7168, p.n_vocab = 65536, p.n_ctx = 128000, p.rope_theta = 1e6f, p.conv_l = 3;
        p.kv_heads = "0,0,8,0,0,0,8,0,0,0,8,0,0,0,8,0,0,0,8,0,0,8,0,0";
        p.n_expert = 32, p.n_expert_used = 4, p.n_ff_exp = 1792, p.n_dense_lead = 2;
    } else if (strcmp(name, "qwen2.5-0.5b") == 0) {
        p.n_embd = 896, p.n_layer = 24, p.n_head = 14, p.n_head_kv = 2, p.head_dim = 64;
        p.n_ff = 4864, p.n_vocab = 151936, p.n_ctx = 32768, p.rope_theta = 1e6f;
    } else {
        return KVC_ERR_NOT_FOUND;
    }
    *out = p;
    return KVC_OK;
}

void kvc_gen_cut_layers(kvc_gen_params *p, int32_t n_layer)
{
    const kvc_arch *a = kvc_arch_find(p->arch);
    const int32_t period = p->swa_pattern > 0 ? p->swa_pattern : a && a->swa_period > 0 ? a->swa_period : 1;
    if (p->n_kv_shared > 0 && p->n_layer > 0 && n_layer > 0) {
        const double keep = (double)n_layer * (p->n_layer - p->n_kv_shared) / p->n_layer;
        const int32_t first = KVC_MAX((int32_t)lround(keep / period) * period, period);
        p->n_kv_shared = first < n_layer ? n_layer - first : 0;
    }
    p->n_layer = n_layer;
}
