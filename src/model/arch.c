/* arch.c - the architecture table (arch.h): keys, tensors and layer kinds of
 * every architecture kvchat runs, and the names of those it refuses yet. */
#include "arch.h"
#include "forward.h"
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------- keys */

#define KEY(sfx, type, req, fld, def) { sfx, type, req, offsetof(kvc_hparams, fld), def }

/* Every architecture's attention and shape. */
static const kvc_arch_key keys_common[] = {
    KEY("context_length",                   KVC_KEY_U32, false, n_ctx_train, 0),
    KEY("embedding_length",                 KVC_KEY_U32, true,  n_embd, 0),
    KEY("block_count",                      KVC_KEY_U32, true,  n_layer, 0),
    KEY("attention.head_count",             KVC_KEY_U32, true,  n_head, 0),
    KEY("attention.head_count_kv",          KVC_KEY_U32_LAYERS, false, n_head_kv, 0),
    KEY("attention.key_length",             KVC_KEY_U32, false, head_dim, 0),
    KEY("attention.value_length",           KVC_KEY_U32, false, value_dim, 0),
    KEY("attention.layer_norm_rms_epsilon", KVC_KEY_F32, false, rms_eps, 1e-5f),
    KEY("rope.freq_base",                   KVC_KEY_F32, false, rope_theta, 10000.0f),
    KEY("rope.dimension_count",             KVC_KEY_U32, false, n_rot, 0),
    KEY("rope.scaling.type",                KVC_KEY_ROPE_SCALING, false, rope_scaling, KVC_ROPE_NONE),
    KEY("rope.scaling.factor",              KVC_KEY_F32, false, rope_factor, 0),
    KEY("rope.scaling.original_context_length", KVC_KEY_U32, false, rope_orig_ctx, 0),
    { 0 }
};

/* Interleaved sliding-window attention (Gemma 3, gpt-oss). NAN: absent leaves
 * the row's default. */
static const kvc_arch_key keys_swa[] = {
    KEY("attention.sliding_window",         KVC_KEY_U32, false, n_swa, 0),
    KEY("attention.sliding_window_pattern", KVC_KEY_SWA_PATTERN, false, swa_period, NAN),
    KEY("rope.freq_base_swa",               KVC_KEY_F32, false, rope_theta_swa, 0),
    KEY("final_logit_softcapping",          KVC_KEY_F32, false, logit_softcap, 0),
    { 0 }
};

/* Gemma 4: a sliding-window pattern per layer, the sliding layers' own head
 * size and rotated dims, per-layer embeddings and KV-shared layers (E2B's
 * double-wide MLPs: a feed_forward_length per layer, keys_dense). Experts
 * are optional (E2B/E4B have none; 26B-A4B puts them beside the dense FFN). */
static const kvc_arch_key keys_gemma4[] = {
    KEY("attention.sliding_window",         KVC_KEY_U32, true,  n_swa, 0),
    KEY("attention.sliding_window_pattern", KVC_KEY_SWA_PATTERN, true, swa_period, 0),
    KEY("attention.key_length_swa",         KVC_KEY_U32, true,  head_dim_swa, 0),
    KEY("attention.value_length_swa",       KVC_KEY_U32, true,  value_dim_swa, 0),
    KEY("rope.dimension_count_swa",         KVC_KEY_U32, false, n_rot_swa, 0),
    KEY("rope.freq_base_swa",               KVC_KEY_F32, false, rope_theta_swa, 0),
    KEY("final_logit_softcapping",          KVC_KEY_F32, false, logit_softcap, 0),
    KEY("embedding_length_per_layer_input", KVC_KEY_U32, true,  n_embd_per_layer, 0),
    KEY("attention.shared_kv_layers",       KVC_KEY_U32, false, n_kv_shared, 0),
    KEY("expert_count",                     KVC_KEY_U32, false, n_expert, 0),
    KEY("expert_used_count",                KVC_KEY_U32, false, n_expert_used, 0),
    KEY("expert_feed_forward_length",       KVC_KEY_U32, false, n_ff_exp, 0),
    { 0 }
};

static const kvc_arch_key keys_dense[] = {
    KEY("feed_forward_length",              KVC_KEY_U32_LAYERS, true,  n_ff, 0),
    { 0 }
};

/* NAN: absent leaves the row's default (kvc_arch.gating, .moe_norm_w). */
static const kvc_arch_key keys_moe[] = {
    KEY("feed_forward_length",              KVC_KEY_U32_LAYERS, false, n_ff, 0),
    KEY("expert_count",                     KVC_KEY_U32, true,  n_expert, 0),
    KEY("expert_used_count",                KVC_KEY_U32, true,  n_expert_used, 0),
    KEY("expert_feed_forward_length",       KVC_KEY_U32, false, n_ff_exp, 0),
    KEY("expert_shared_feed_forward_length", KVC_KEY_U32, false, n_ff_shexp, 0),
    KEY("expert_gating_func",               KVC_KEY_U32, false, moe_gating, NAN),
    KEY("expert_weights_norm",              KVC_KEY_BOOL, false, moe_norm_w, NAN),
    KEY("expert_weights_scale",             KVC_KEY_F32, false, moe_w_scale, 0),
    { 0 }
};

/* Gated DeltaNet hybrids (qwen35, qwen35moe, qwen3next), beside keys_ssm (the same
 * ssm.* fields, model.h gives both meanings); attention.recurrent_layers, an
 * array, is read by the row's layer setup (forward_gdn.c). */
static const kvc_arch_key keys_gdn[] = {
    KEY("full_attention_interval",          KVC_KEY_U32, false, full_attn_interval, 4),
    KEY("nextn_predict_layers",             KVC_KEY_U32, false, n_layer_nextn, 0),
    { 0 }
};

/* lfm2's gated short convolution. */
static const kvc_arch_key keys_shortconv[] = {
    KEY("shortconv.l_cache",                KVC_KEY_U32, true,  shortconv_l, 0),
    { 0 }
};

/* Mamba-2 and Gated DeltaNet layers. */
static const kvc_arch_key keys_ssm[] = {
    KEY("ssm.conv_kernel",                  KVC_KEY_U32, true,  ssm_d_conv, 0),
    KEY("ssm.inner_size",                   KVC_KEY_U32, true,  ssm_d_inner, 0),
    KEY("ssm.state_size",                   KVC_KEY_U32, true,  ssm_d_state, 0),
    KEY("ssm.time_step_rank",               KVC_KEY_U32, true,  ssm_n_head, 0),
    KEY("ssm.group_count",                  KVC_KEY_U32, true,  ssm_n_group, 0),
    { 0 }
};

/* Granite's scalars, and its FFN: dense, or experts of feed_forward_length
 * (kvc_arch.ffn_by_experts, .ff_exp_is_ff) with an optional shared expert. */
static const kvc_arch_key keys_granite[] = {
    KEY("embedding_scale",                  KVC_KEY_F32, false, emb_scale, 0),
    KEY("residual_scale",                   KVC_KEY_F32, false, residual_scale, 0),
    KEY("attention.scale",                  KVC_KEY_F32, false, attn_scale, 0),
    KEY("logit_scale",                      KVC_KEY_F32, false, logit_scale, 0),
    KEY("rope.scaling.finetuned",           KVC_KEY_BOOL, false, rope_finetuned, 1),
    KEY("feed_forward_length",              KVC_KEY_U32_LAYERS, true,  n_ff, 0),
    KEY("expert_count",                     KVC_KEY_U32, false, n_expert, 0),
    KEY("expert_used_count",                KVC_KEY_U32, false, n_expert_used, 0),
    KEY("expert_shared_feed_forward_length", KVC_KEY_U32, false, n_ff_shexp, 0),
    { 0 }
};

/* lfm2moe: the first layers dense, then experts under a sigmoid router with
 * a selection bias; the selected weights always renormalised, never scaled
 * (llama.cpp reads neither key for it). */
static const kvc_arch_key keys_lfm2moe[] = {
    KEY("feed_forward_length",              KVC_KEY_U32_LAYERS, false, n_ff, 0),
    KEY("expert_count",                     KVC_KEY_U32, true,  n_expert, 0),
    KEY("expert_used_count",                KVC_KEY_U32, true,  n_expert_used, 0),
    KEY("expert_feed_forward_length",       KVC_KEY_U32, true,  n_ff_exp, 0),
    KEY("expert_gating_func",               KVC_KEY_U32, true,  moe_gating, 0),
    KEY("leading_dense_block_count",        KVC_KEY_U32, false, n_layer_dense_lead, 0),
    { 0 }
};

/* Nemotron-H: an FFN width per layer (0: a mixer layer, kvc_arch.one_kind_per_layer);
 * with experts (nemotron_h_moe) every FFN layer is MoE. NAN: absent leaves the
 * row's default. */
static const kvc_arch_key keys_nemotron[] = {
    KEY("feed_forward_length",              KVC_KEY_U32_LAYERS, true, n_ff, 0),
    KEY("expert_count",                     KVC_KEY_U32, false, n_expert, 0),
    KEY("expert_used_count",                KVC_KEY_U32, false, n_expert_used, 0),
    KEY("expert_feed_forward_length",       KVC_KEY_U32, false, n_ff_exp, 0),
    KEY("expert_shared_feed_forward_length", KVC_KEY_U32, false, n_ff_shexp, 0),
    KEY("expert_weights_norm",              KVC_KEY_BOOL, false, moe_norm_w, NAN),
    KEY("expert_weights_scale",             KVC_KEY_F32, false, moe_w_scale, 0),
    KEY("moe_latent_size",                  KVC_KEY_U32, false, moe_latent, 0),
    KEY("nextn_predict_layers",             KVC_KEY_U32, false, n_layer_nextn, 0),
    { 0 }
};

#undef KEY

/* ---------------------------------------------------------------- tensors */

#define T(nm, a, b, c, when, fl, isf, fld) \
    { nm, { a, b, c }, when, fl, isf, offsetof(kvc_layer, fld) }
#define VEC(nm, a, when, fl, fld)     T(nm, a, KVC_D1, KVC_D1, when, fl, 1, fld)
#define MAT(nm, a, b, when, fl, fld)  T(nm, a, b, KVC_D1, when, fl, 0, fld)
#define EXPS(nm, a, b, fl, fld)       T(nm, a, b, KVC_D_EXP, KVC_ON_MOE, fl, 0, fld)
#define OPT KVC_T_OPTIONAL
#define ALT KVC_T_FUSED_ALT

/* The mixer's input norm is on every layer; its projections on attention layers. */
static const kvc_arch_tensor t_attn[] = {
    VEC("attn_norm.weight",   KVC_D_EMBD,            KVC_ON_ALL, 0, attn_norm),
    MAT("attn_q.weight",      KVC_D_EMBD, KVC_D_Q,   KVC_ON_ATTN, 0, wq),
    MAT("attn_k.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, 0, wk),
    MAT("attn_v.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, 0, wv),
    MAT("attn_output.weight", KVC_D_Q,    KVC_D_EMBD, KVC_ON_ATTN, 0, wo),
    { 0 }
};

static const kvc_arch_tensor t_qkv_bias[] = {
    VEC("attn_q.bias", KVC_D_Q,  KVC_ON_ATTN, 0, bq),
    VEC("attn_k.bias", KVC_D_KV, KVC_ON_ATTN, 0, bk),
    VEC("attn_v.bias", KVC_D_KV, KVC_ON_ATTN, 0, bv),
    { 0 }
};

/* Granite: every attention bias may be there. */
static const kvc_arch_tensor t_attn_bias_opt[] = {
    VEC("attn_q.bias",      KVC_D_Q,    KVC_ON_ATTN, OPT, bq),
    VEC("attn_k.bias",      KVC_D_KV,   KVC_ON_ATTN, OPT, bk),
    VEC("attn_v.bias",      KVC_D_KV,   KVC_ON_ATTN, OPT, bv),
    VEC("attn_output.bias", KVC_D_EMBD, KVC_ON_ATTN, OPT, bo),
    { 0 }
};

static const kvc_arch_tensor t_qk_norm[] = {
    VEC("attn_q_norm.weight", KVC_D_HEAD, KVC_ON_ATTN, 0, q_norm),
    VEC("attn_k_norm.weight", KVC_D_HEAD, KVC_ON_ATTN, 0, k_norm),
    { 0 }
};

/* lfm2's short convolution: in_proj to b, c, x; out_proj. */
static const kvc_arch_tensor t_shortconv[] = {
    T("shortconv.conv.weight", KVC_D_CONV_L, KVC_D_EMBD, KVC_D1, KVC_ON_RECR, 0, 1, conv),
    MAT("shortconv.in_proj.weight",  KVC_D_EMBD, KVC_D_EMBD3, KVC_ON_RECR, 0, conv_in),
    MAT("shortconv.out_proj.weight", KVC_D_EMBD, KVC_D_EMBD,  KVC_ON_RECR, 0, conv_out),
    { 0 }
};

/* Mamba-2 (ARCHITECTURES.md §3.6); ssm_a and ssm_d have no suffix. */
static const kvc_arch_tensor t_mamba2[] = {
    MAT("ssm_in.weight", KVC_D_EMBD, KVC_D_SSM_IN, KVC_ON_RECR, 0, ssm_in),
    T("ssm_conv1d.weight", KVC_D_SSM_CONV_K, KVC_D_SSM_CONV_DIM, KVC_D1, KVC_ON_RECR, 0, 1, ssm_conv),
    VEC("ssm_conv1d.bias", KVC_D_SSM_CONV_DIM,  KVC_ON_RECR, OPT, ssm_conv_b),
    VEC("ssm_dt.bias",     KVC_D_SSM_HEADS, KVC_ON_RECR, 0, ssm_dt_b),
    T("ssm_a", KVC_D1, KVC_D_SSM_HEADS, KVC_D1, KVC_ON_RECR, 0, 1, ssm_a),
    T("ssm_d", KVC_D1, KVC_D_SSM_HEADS, KVC_D1, KVC_ON_RECR, 0, 1, ssm_d),
    T("ssm_norm.weight", KVC_D_SSM_GROUP_W, KVC_D_SSM_GROUPS, KVC_D1, KVC_ON_RECR, 0, 1, ssm_norm),
    MAT("ssm_out.weight", KVC_D_SSM_INNER, KVC_D_EMBD, KVC_ON_RECR, 0, ssm_out),
    { 0 }
};

/* Nemotron-H: one norm per layer (attn_norm), the input of its one sublayer;
 * FFNs are ReLU², not gated (up, down), the experts' too, with a shared
 * expert; the router is a sigmoid with a selection bias. */
static const kvc_arch_tensor t_nemotron[] = {
    VEC("attn_norm.weight", KVC_D_EMBD, KVC_ON_MIXER, 0, attn_norm),
    VEC("attn_norm.weight", KVC_D_EMBD, KVC_ON_FFN,   0, ffn_norm),
    MAT("ffn_up.weight",    KVC_D_EMBD, KVC_D_FF,   KVC_ON_DENSE, 0, w_up),
    MAT("ffn_down.weight",  KVC_D_FF,   KVC_D_EMBD, KVC_ON_DENSE, 0, w_down),
    MAT("ffn_gate_inp.weight", KVC_D_EMBD, KVC_D_EXP, KVC_ON_MOE, 0, router),
    VEC("exp_probs_b.bias",    KVC_D_EXP,             KVC_ON_MOE, 0, sel_bias),
    EXPS("ffn_up_exps.weight",   KVC_D_EMBD, KVC_D_FF_EXP, 0, up_exps),
    EXPS("ffn_down_exps.weight", KVC_D_FF_EXP, KVC_D_EMBD, 0, down_exps),
    MAT("ffn_up_shexp.weight",   KVC_D_EMBD, KVC_D_FF_SHEXP, KVC_ON_MOE, 0, shexp_up),
    MAT("ffn_down_shexp.weight", KVC_D_FF_SHEXP, KVC_D_EMBD, KVC_ON_MOE, 0, shexp_down),
    { 0 }
};

/* Nemotron-H's attention: projections and optional biases, no norm of their own. */
static const kvc_arch_tensor t_attn_proj[] = {
    MAT("attn_q.weight",      KVC_D_EMBD, KVC_D_Q,   KVC_ON_ATTN, 0, wq),
    MAT("attn_k.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, 0, wk),
    MAT("attn_v.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, 0, wv),
    MAT("attn_output.weight", KVC_D_Q,    KVC_D_EMBD, KVC_ON_ATTN, 0, wo),
    { 0 }
};

/* The FFN's input norm, on every layer (gpt-oss names it post_attention_norm). */
static const kvc_arch_tensor t_ffn_norm[] = {
    VEC("ffn_norm.weight", KVC_D_EMBD, KVC_ON_ALL, 0, ffn_norm),
    { 0 }
};

static const kvc_arch_tensor t_ffn_norm_oai[] = {
    VEC("post_attention_norm.weight", KVC_D_EMBD, KVC_ON_ALL, 0, ffn_norm),
    { 0 }
};

/* Gemma's sandwich norms: each sublayer's output normalised before its residual add. */
static const kvc_arch_tensor t_post_norms[] = {
    VEC("post_attention_norm.weight", KVC_D_EMBD, KVC_ON_ALL, 0, post_attn_norm),
    VEC("post_ffw_norm.weight",       KVC_D_EMBD, KVC_ON_ALL, 0, post_ffn_norm),
    { 0 }
};

/* gpt-oss: the attention output's bias and the per-head sinks. */
static const kvc_arch_tensor t_attn_oai[] = {
    VEC("attn_output.bias",  KVC_D_EMBD,  KVC_ON_ALL, 0, bo),
    VEC("attn_sinks.weight", KVC_D_HEADS, KVC_ON_ALL, 0, sinks),
    { 0 }
};

/* Gemma 4: V may be K (no attn_v), a scalar on the layer's output, the dense
 * FFN on every layer, and beside it on MoE layers experts with their own
 * norms, the router's input scale and optional per-expert output scales. */
static const kvc_arch_tensor t_attn_g4[] = {
    VEC("attn_norm.weight",   KVC_D_EMBD,            KVC_ON_ALL, 0, attn_norm),
    MAT("attn_q.weight",      KVC_D_EMBD, KVC_D_Q,   KVC_ON_ATTN, 0, wq),
    VEC("attn_q_norm.weight", KVC_D_HEAD,            KVC_ON_ATTN, 0, q_norm),
    /* K and its norm: absent on KV-shared layers (model.c checks the others') */
    MAT("attn_k.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, OPT, wk),
    VEC("attn_k_norm.weight", KVC_D_HEAD,            KVC_ON_ATTN, OPT, k_norm),
    MAT("attn_v.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, OPT, wv),
    MAT("attn_output.weight", KVC_D_Q,    KVC_D_EMBD, KVC_ON_ATTN, 0, wo),
    VEC("layer_output_scale.weight", KVC_D1,         KVC_ON_ALL, OPT, out_scale),
    /* per-layer embeddings (required with embedding_length_per_layer_input > 0) */
    MAT("inp_gate.weight",  KVC_D_EMBD, KVC_D_PLE, KVC_ON_ALL, OPT, ple_gate),
    MAT("proj.weight",      KVC_D_PLE, KVC_D_EMBD, KVC_ON_ALL, OPT, ple_out),
    VEC("post_norm.weight", KVC_D_EMBD,            KVC_ON_ALL, OPT, ple_post_norm),
    { 0 }
};

static const kvc_arch_tensor t_ffn_dense_all[] = {
    MAT("ffn_gate.weight", KVC_D_EMBD, KVC_D_FF, KVC_ON_ALL, 0, w_gate),
    MAT("ffn_up.weight",   KVC_D_EMBD, KVC_D_FF, KVC_ON_ALL, 0, w_up),
    MAT("ffn_down.weight", KVC_D_FF, KVC_D_EMBD, KVC_ON_ALL, 0, w_down),
    { 0 }
};

static const kvc_arch_tensor t_ffn_moe_g4[] = {
    MAT("ffn_gate_inp.weight", KVC_D_EMBD, KVC_D_EXP, KVC_ON_MOE, 0, router),
    VEC("ffn_gate_inp.scale",  KVC_D_EMBD,            KVC_ON_MOE, 0, router_in_scale),
    VEC("pre_ffw_norm_2.weight",  KVC_D_EMBD,         KVC_ON_MOE, 0, pre_ffn_norm2),
    VEC("post_ffw_norm_1.weight", KVC_D_EMBD,         KVC_ON_MOE, 0, post_ffn_norm1),
    VEC("post_ffw_norm_2.weight", KVC_D_EMBD,         KVC_ON_MOE, 0, post_ffn_norm2),
    EXPS("ffn_gate_exps.weight",    KVC_D_EMBD, KVC_D_FF_EXP,  ALT, gate_exps),
    EXPS("ffn_up_exps.weight",      KVC_D_EMBD, KVC_D_FF_EXP,  ALT, up_exps),
    EXPS("ffn_gate_up_exps.weight", KVC_D_EMBD, KVC_D_FF_EXP2, OPT, gate_up_exps),
    EXPS("ffn_down_exps.weight",    KVC_D_FF_EXP, KVC_D_EMBD,  0, down_exps),
    VEC("ffn_down_exps.scale", KVC_D_EXP,             KVC_ON_MOE, OPT, down_exps_s),
    { 0 }
};

static const kvc_arch_tensor t_ffn_dense[] = {
    MAT("ffn_gate.weight", KVC_D_EMBD, KVC_D_FF, KVC_ON_DENSE, 0, w_gate),
    MAT("ffn_up.weight",   KVC_D_EMBD, KVC_D_FF, KVC_ON_DENSE, 0, w_up),
    MAT("ffn_down.weight", KVC_D_FF, KVC_D_EMBD, KVC_ON_DENSE, 0, w_down),
    { 0 }
};

/* Every variant's tensors; what a file lacks of the optional ones it does
 * not use (biases, selection bias, shared expert, the fused gate_up). */
static const kvc_arch_tensor t_ffn_moe[] = {
    MAT("ffn_gate_inp.weight", KVC_D_EMBD, KVC_D_EXP,   KVC_ON_MOE, 0, router),
    VEC("ffn_gate_inp.bias",   KVC_D_EXP,               KVC_ON_MOE, OPT, router_b),
    VEC("exp_probs_b.bias",    KVC_D_EXP,               KVC_ON_MOE, OPT, sel_bias),
    EXPS("ffn_gate_exps.weight",    KVC_D_EMBD, KVC_D_FF_EXP,  ALT, gate_exps),
    EXPS("ffn_up_exps.weight",      KVC_D_EMBD, KVC_D_FF_EXP,  ALT, up_exps),
    EXPS("ffn_gate_up_exps.weight", KVC_D_EMBD, KVC_D_FF_EXP2, OPT, gate_up_exps),
    EXPS("ffn_down_exps.weight",    KVC_D_FF_EXP, KVC_D_EMBD,  0, down_exps),
    T("ffn_gate_exps.bias", KVC_D_FF_EXP, KVC_D_EXP, KVC_D1, KVC_ON_MOE, OPT, 1, gate_exps_b),
    T("ffn_up_exps.bias",   KVC_D_FF_EXP, KVC_D_EXP, KVC_D1, KVC_ON_MOE, OPT, 1, up_exps_b),
    T("ffn_down_exps.bias", KVC_D_EMBD,   KVC_D_EXP, KVC_D1, KVC_ON_MOE, OPT, 1, down_exps_b),
    MAT("ffn_gate_inp_shexp.weight", KVC_D_EMBD, KVC_D1,      KVC_ON_MOE, OPT, shexp_gate_inp),
    MAT("ffn_gate_shexp.weight", KVC_D_EMBD, KVC_D_FF_SHEXP,  KVC_ON_MOE, OPT, shexp_gate),
    MAT("ffn_up_shexp.weight",   KVC_D_EMBD, KVC_D_FF_SHEXP,  KVC_ON_MOE, OPT, shexp_up),
    MAT("ffn_down_shexp.weight", KVC_D_FF_SHEXP, KVC_D_EMBD,  KVC_ON_MOE, OPT, shexp_down),
    { 0 }
};

/* The FFN's input norm under gpt-oss's and Qwen3.5's name. */
#define t_ffn_norm_post t_ffn_norm_oai

/* Qwen3.5's gated attention layers: wq gives a query and a gate per head. */
static const kvc_arch_tensor t_attn_gated[] = {
    VEC("attn_norm.weight",   KVC_D_EMBD,            KVC_ON_ALL, 0, attn_norm),
    MAT("attn_q.weight",      KVC_D_EMBD, KVC_D_Q2,  KVC_ON_ATTN, 0, wq),
    MAT("attn_k.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, 0, wk),
    MAT("attn_v.weight",      KVC_D_EMBD, KVC_D_KV,  KVC_ON_ATTN, 0, wv),
    MAT("attn_output.weight", KVC_D_Q,    KVC_D_EMBD, KVC_ON_ATTN, 0, wo),
    VEC("attn_q_norm.weight", KVC_D_HEAD,            KVC_ON_ATTN, 0, q_norm),
    VEC("attn_k_norm.weight", KVC_D_HEAD,            KVC_ON_ATTN, 0, k_norm),
    { 0 }
};

/* Gated DeltaNet layers (ssm_a has no .weight suffix). */
static const kvc_arch_tensor t_gdn[] = {
    MAT("attn_qkv.weight",   KVC_D_EMBD, KVC_D_SSM_CONV_DIM, KVC_ON_RECR, 0, ssm_qkv),
    MAT("attn_gate.weight",  KVC_D_EMBD, KVC_D_SSM_INNER,    KVC_ON_RECR, 0, ssm_z),
    MAT("ssm_beta.weight",   KVC_D_EMBD, KVC_D_SSM_HEADS,    KVC_ON_RECR, 0, ssm_beta),
    MAT("ssm_alpha.weight",  KVC_D_EMBD, KVC_D_SSM_HEADS,    KVC_ON_RECR, 0, ssm_alpha),
    MAT("ssm_out.weight",    KVC_D_SSM_INNER, KVC_D_EMBD,    KVC_ON_RECR, 0, ssm_out),
    T("ssm_conv1d.weight", KVC_D_SSM_CONV_K, KVC_D_SSM_CONV_DIM, KVC_D1, KVC_ON_RECR, 0, 1, ssm_conv),
    VEC("ssm_dt.bias",       KVC_D_SSM_HEADS,                KVC_ON_RECR, 0, ssm_dt_b),
    VEC("ssm_a",             KVC_D_SSM_HEADS,                KVC_ON_RECR, 0, ssm_a),
    VEC("ssm_norm.weight",   KVC_D_SSM_STATE,                KVC_ON_RECR, 0, ssm_norm),
    { 0 }
};

/* qwen3next's Gated DeltaNet layers: q, k, v and z in one projection, grouped
 * per K head (ssm_in: for each K head its q, k, then its n_v / n_k V heads'
 * v and z rows), or split as qwen35's (attn_qkv, attn_gate: newer files; one
 * of the two forms is required, bind_layer); beta and alpha in one, grouped
 * the same way (ssm_ba: per K head its V heads' beta rows, then alpha rows). */
static const kvc_arch_tensor t_gdn_next[] = {
    MAT("ssm_in.weight",     KVC_D_EMBD, KVC_D_SSM_QKVZ,     KVC_ON_RECR, OPT, ssm_in),
    MAT("attn_qkv.weight",   KVC_D_EMBD, KVC_D_SSM_CONV_DIM, KVC_ON_RECR, OPT, ssm_qkv),
    MAT("attn_gate.weight",  KVC_D_EMBD, KVC_D_SSM_INNER,    KVC_ON_RECR, OPT, ssm_z),
    MAT("ssm_ba.weight",     KVC_D_EMBD, KVC_D_SSM_HEADS2,   KVC_ON_RECR, 0, ssm_ba),
    MAT("ssm_out.weight",    KVC_D_SSM_INNER, KVC_D_EMBD,    KVC_ON_RECR, 0, ssm_out),
    T("ssm_conv1d.weight", KVC_D_SSM_CONV_K, KVC_D_SSM_CONV_DIM, KVC_D1, KVC_ON_RECR, 0, 1, ssm_conv),
    VEC("ssm_dt.bias",       KVC_D_SSM_HEADS,                KVC_ON_RECR, 0, ssm_dt_b),
    VEC("ssm_a",             KVC_D_SSM_HEADS,                KVC_ON_RECR, 0, ssm_a),
    VEC("ssm_norm.weight",   KVC_D_SSM_STATE,                KVC_ON_RECR, 0, ssm_norm),
    { 0 }
};

#undef VEC
#undef MAT
#undef EXPS
#undef T

const kvc_arch_tensor kvc_arch_globals[] = {
    { "token_embd.weight",  { KVC_D_EMBD, KVC_D_VOCAB, KVC_D1 }, KVC_ON_ALL, 0,   0,
      offsetof(kvc_model, tok_embd) },
    { "output_norm.weight", { KVC_D_EMBD, KVC_D1, KVC_D1 },      KVC_ON_ALL, 0,   1,
      offsetof(kvc_model, output_norm) },
    { "output.weight",      { KVC_D_EMBD, KVC_D_VOCAB, KVC_D1 }, KVC_ON_ALL, OPT, 0,
      offsetof(kvc_model, output) },
    /* Gemma 4's per-layer embeddings (required with embedding_length_per_layer_input > 0) */
    { "per_layer_token_embd.weight", { KVC_D_PLE_ALL, KVC_D_VOCAB, KVC_D1 }, KVC_ON_ALL, OPT, 0,
      offsetof(kvc_model, ple_embd) },
    { "per_layer_model_proj.weight", { KVC_D_EMBD, KVC_D_PLE_ALL, KVC_D1 }, KVC_ON_ALL, OPT, 0,
      offsetof(kvc_model, ple_proj) },
    { "per_layer_proj_norm.weight",  { KVC_D_PLE, KVC_D1, KVC_D1 }, KVC_ON_ALL, OPT, 1,
      offsetof(kvc_model, ple_proj_norm) },
    { 0 }
};

#undef OPT
#undef ALT

/* ------------------------------------------------------------------- rows */

#define KEYS(...)    (const kvc_arch_key *const[]){ __VA_ARGS__, NULL }
#define TENSORS(...) (const kvc_arch_tensor *const[]){ __VA_ARGS__, NULL }

static const kvc_arch rows[] = {
    { .name = "llama", .ffn = KVC_FFN_DENSE,
      .keys = KEYS(keys_common, keys_dense),
      .tensors = TENSORS(t_attn, t_ffn_norm, t_ffn_dense) },
    { .name = "qwen2", .rope_neox = true, .ffn = KVC_FFN_DENSE,
      .keys = KEYS(keys_common, keys_dense),
      .tensors = TENSORS(t_attn, t_qkv_bias, t_ffn_norm, t_ffn_dense) },
    { .name = "qwen3", .rope_neox = true, .ffn = KVC_FFN_DENSE,
      .keys = KEYS(keys_common, keys_dense),
      .tensors = TENSORS(t_attn, t_qk_norm, t_ffn_norm, t_ffn_dense) },
    { .name = "qwen3moe", .rope_neox = true, .ffn = KVC_FFN_MOE,
      .gating = KVC_GATING_SOFTMAX, .moe_norm_w = true,
      .keys = KEYS(keys_common, keys_moe),
      .tensors = TENSORS(t_attn, t_qk_norm, t_ffn_norm, t_ffn_moe) },
    /* Gemma 3: 5 sliding layers to 1 global, GeGLU, sandwich norms, embeddings
     * x sqrt(n_embd); norms are stored as (1 + w) by the converter */
    { .name = "gemma3", .rope_neox = true, .ffn = KVC_FFN_DENSE, .act = KVC_ACT_GELU,
      .swa_period = 6, .emb_scale_sqrt = true, .attn_scale_embd_layers = 62,
      .keys = KEYS(keys_common, keys_dense, keys_swa),
      .tensors = TENSORS(t_attn, t_qk_norm, t_post_norms, t_ffn_norm, t_ffn_dense) },
    /* gpt-oss: sliding and full layers alternate (layer 0 slides), sinks,
     * biases, top-k of the raw router logits then a softmax over the k */
    { .name = "gpt-oss", .rope_neox = true, .ffn = KVC_FFN_MOE,
      .gating = KVC_GATING_SOFTMAX_WEIGHT, .moe_norm_w = false, .act = KVC_ACT_SWIGLU_OAI,
      .swa_period = 2, .swa_rope_as_global = true,
      .keys = KEYS(keys_common, keys_moe, keys_swa),
      .tensors = TENSORS(t_attn, t_qkv_bias, t_attn_oai, t_ffn_norm_oai, t_ffn_moe) },
    /* Gemma 4: a sliding pattern per layer, the global layers with their own
     * head size, KV heads, rotated dims and proportional RoPE (rope_freqs),
     * K = V where attn_v is absent, V-norm, scores unscaled, a scalar on each
     * layer's output; MoE layers (those with a router) add experts beside the
     * dense GeGLU FFN */
    { .name = "gemma4", .rope_neox = true, .ffn = KVC_FFN_MOE_DENSE, .ffn_by_experts = true,
      .act = KVC_ACT_GELU, .gating = KVC_GATING_SOFTMAX, .moe_norm_w = true,
      .swa_period = 6, .emb_scale_sqrt = true, .attn_scale = 1.0f, .v_norm = true, .rope_freqs_global = true,
      .keys = KEYS(keys_common, keys_dense, keys_gemma4),
      .tensors = TENSORS(t_attn_g4, t_post_norms, t_ffn_norm, t_ffn_dense_all, t_ffn_moe_g4) },

    /* Qwen3.5 / 3.6: Gated DeltaNet layers with a gated attention layer every
     * full_attention_interval; partial NeoX RoPE (IMRoPE is NeoX for text) */
    { .name = "qwen35", .rope_neox = true, .ffn = KVC_FFN_DENSE, .layers = kvc_gdn_layers,
      .keys = KEYS(keys_common, keys_dense, keys_ssm, keys_gdn),
      .tensors = TENSORS(t_attn_gated, t_gdn, t_ffn_norm_post, t_ffn_dense) },
    { .name = "qwen35moe", .rope_neox = true, .ffn = KVC_FFN_MOE, .layers = kvc_gdn_layers,
      .gating = KVC_GATING_SOFTMAX, .moe_norm_w = true,
      .keys = KEYS(keys_common, keys_moe, keys_ssm, keys_gdn),
      .tensors = TENSORS(t_attn_gated, t_gdn, t_ffn_norm_post, t_ffn_moe) },
    /* Qwen3-Next: Qwen3.5's predecessor; V heads grouped by K head, fused GDN
     * projections (t_gdn_next), plain partial NeoX RoPE, experts with a gated
     * shared expert */
    { .name = "qwen3next", .rope_neox = true, .ffn = KVC_FFN_MOE, .layers = kvc_gdn_layers,
      .gating = KVC_GATING_SOFTMAX, .moe_norm_w = true, .gdn_v_grouped = true,
      .keys = KEYS(keys_common, keys_moe, keys_ssm, keys_gdn),
      .tensors = TENSORS(t_attn_gated, t_gdn_next, t_ffn_norm_post, t_ffn_moe) },
    /* LFM2: gated short convolutions and attention layers (head_count_kv 0 per
     * layer: a convolution), QK-norm, the final norm named token_embd_norm;
     * with a sliding window every attention layer slides */
    { .name = "lfm2", .rope_neox = true, .ffn = KVC_FFN_DENSE, .recurrent = KVC_ATTN_SHORTCONV,
      .swa_rope_as_global = true, .output_norm = "token_embd_norm.weight",
      .keys = KEYS(keys_common, keys_dense, keys_swa, keys_shortconv),
      .tensors = TENSORS(t_attn, t_qk_norm, t_shortconv, t_ffn_norm, t_ffn_dense) },
    /* Granite 4.0-H: Mamba-2 and attention layers (head_count_kv 0 per layer:
     * Mamba-2), NoPE unless rope.scaling.finetuned, Granite's scalars, dense
     * or MoE FFN with a shared expert */
    { .name = "granitehybrid", .ffn = KVC_FFN_MOE, .ffn_by_experts = true, .ff_exp_is_ff = true,
      .gating = KVC_GATING_SOFTMAX, .moe_norm_w = true, .recurrent = KVC_ATTN_MAMBA2,
      .rope_finetuned_switch = true,
      .keys = KEYS(keys_common, keys_granite, keys_ssm),
      .tensors = TENSORS(t_attn, t_attn_bias_opt, t_mamba2, t_ffn_norm, t_ffn_dense, t_ffn_moe) },

    /* LFM2-8B-A1B: lfm2 with experts after leading_dense_block_count dense layers */
    { .name = "lfm2moe", .rope_neox = true, .ffn = KVC_FFN_MOE, .recurrent = KVC_ATTN_SHORTCONV,
      .gating = KVC_GATING_SIGMOID, .moe_norm_w = true,
      .swa_rope_as_global = true, .output_norm = "token_embd_norm.weight",
      .keys = KEYS(keys_common, keys_lfm2moe, keys_swa, keys_shortconv),
      .tensors = TENSORS(t_attn, t_qk_norm, t_shortconv, t_ffn_norm, t_ffn_dense, t_ffn_moe) },
    /* Nemotron-H (dense) and Nemotron 3 (MoE): each layer one of Mamba-2,
     * attention (NoPE) or a ReLU² FFN (experts when expert_count > 0) */
#define NEMOTRON_H(nm)                                                                            \
    { .name = nm, .ffn = KVC_FFN_MOE, .ffn_by_experts = true, .one_kind_per_layer = true,         \
      .act = KVC_ACT_RELU2, .gating = KVC_GATING_SIGMOID, .moe_norm_w = false,                    \
      .recurrent = KVC_ATTN_MAMBA2, .nope = true,                                                 \
      .keys = KEYS(keys_common, keys_nemotron, keys_ssm),                                         \
      .tensors = TENSORS(t_nemotron, t_attn_proj, t_attn_bias_opt, t_mamba2) }
    NEMOTRON_H("nemotron_h"),
    NEMOTRON_H("nemotron_h_moe"),
#undef NEMOTRON_H

    /* known, not run yet (ARCHITECTURES.md) */
#define LATER(nm, why) { .name = nm, .unsupported = why }
    LATER("gemma3n",        "per-layer embeddings and AltUp are not supported yet"),
    LATER("deepseek2",      "multi-head latent attention is not supported yet"),
    LATER("glm4moe",        "partial RoPE is not supported yet"),
    LATER("mistral3",       "YaRN RoPE scaling is not supported yet"),
#undef LATER
};

#undef KEYS
#undef TENSORS

const kvc_arch *kvc_arch_find(const char *name)
{
    for (size_t i = 0; name && i < KVC_ARRAY_LEN(rows); i++)
        if (strcmp(rows[i].name, name) == 0)
            return &rows[i];
    return NULL;
}

const kvc_arch *kvc_arch_at(int i)
{
    int k = 0;
    for (size_t j = 0; j < KVC_ARRAY_LEN(rows); j++)
        if (!rows[j].unsupported && k++ == i)
            return &rows[j];
    return NULL;
}

void kvc_arch_names(char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; kvc_arch_at(i) && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", kvc_arch_at(i)->name);
}
