/* model_gen_params.h - what a generated model is, shared by the generator's
 * files (model_gen.c writes the tensors, model_gen_params.c checks the
 * parameters and writes the metadata keys). Not part of the library's API. */
#ifndef KVC_MODEL_GEN_PARAMS_H
#define KVC_MODEL_GEN_PARAMS_H

#include "arch.h"
#include "model_gen.h"

#define GEN_MAX_DIM      (1 << 18)
#define GEN_MAX_VOCAB    (1 << 22)
#define GEN_MAX_LAYERS   1024

/* Validate p and fill the defaults (n_head_kv, head_dim, n_vocab, the
 * recurrent shapes) into *q. KVC_ERR_INVALID_ARG naming the bad parameter,
 * KVC_ERR_NOMEM. The functions below take such a resolved q. */
int kvc_gen_resolve(const kvc_gen_params *p, kvc_gen_params *q, kvc_err *err);

/* Write the general.* and "{arch}.*" keys of the resolved model p into w.
 * Returns the writer's status. */
int kvc_gen_write_keys(gguf_writer *w, const kvc_gen_params *p);

/* The generator's row of architecture `name`: runnable architectures only
 * (NULL otherwise). */
const kvc_arch *kvc_gen_arch(const char *name);

/* Whether the model's FFNs are mixtures of experts. */
bool kvc_gen_moe(const kvc_gen_params *p);

/* Whether layer l of a gemma4 model slides (written as its
 * sliding_window_pattern entry): with a window, all but every
 * swa_pattern-th layer (0: the row's period). */
bool kvc_gen_slides(const kvc_gen_params *p, int l);

/* The head size of layer l (gemma4's sliding layers have their own). */
int32_t kvc_gen_head_dim(const kvc_gen_params *p, int l);

/* A one_kind_per_layer row's layer l (kvc_gen_params.layer_pattern): 'M'
 * Mamba-2, '*' attention, '-' an FFN (E is '-'); 0 on other rows. */
char kvc_gen_kind(const kvc_gen_params *p, int l);

/* Whether layer l has an FFN, and whether it is experts (moe, from
 * kvc_gen_moe; the leading dense layers are not). */
bool kvc_gen_has_ffn(const kvc_gen_params *p, int l);
bool kvc_gen_layer_moe(const kvc_gen_params *p, int l, bool moe);

/* The KV heads of each layer (kvc_gen_params.kv_heads) into kv[n_layer]:
 * the list repeated over the layers, or the default (even layers recurrent);
 * every layer n_head_kv for a row without recurrent layers. Returns the
 * list's length, 0 without one, -1 when it is malformed. Gated DeltaNet rows:
 * 0 but on every full_attn_interval-th layer (resolved: >= 1). */
int kvc_gen_layer_kv_heads(const kvc_gen_params *p, int32_t *kv);

/* The dense FFN width of each layer into ff[n_layer]: ff_layers' entry
 * repeated over the layers (else n_ff), twice that on the KV-shared layers
 * with double_wide_mlp, 0 on a layer without an FFN (kvc_gen_has_ffn).
 * Returns whether the widths of the FFN layers differ, -1 when ff_layers is
 * malformed or an FFN layer's width is not in 1..GEN_MAX_DIM. */
int kvc_gen_layer_ff(const kvc_gen_params *p, int32_t *ff);

#endif
