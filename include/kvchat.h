/* kvchat.h - the public C API of kvchat.
 *
 * An LLM inference engine that keeps the KV cache of everything it has computed
 * and, for each request, computes only the tokens it has not seen before.
 *
 * Conventions (as in llama.h):
 *   - opaque handles: kvc_model, kvc_context, kvc_sampler, ...
 *   - functions are named kvc_<noun>_<verb>;
 *   - functions return an int status: KVC_OK (0) or a negative KVC_ERR_*;
 *     kvc_strerror() names it; functions that take `char *err, size_t err_size`
 *     also write a message saying what was wrong;
 *   - params structs are initialised with kvc_<noun>_default_params();
 *   - ranges are half-open [p0, p1);
 *   - a function that fills a caller-owned buffer returns the size it needed
 *     when the buffer was too small;
 *   - every *_free() accepts NULL.
 * The library never prints and never exits. */
#ifndef KVCHAT_H
#define KVCHAT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API of libkvchat.so: the library is compiled with -fvisibility=hidden,
 * and what this header declares, only that, is exported (the pop is at its
 * end). A function added below is part of the API by being declared here. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ---------------------------------------------------------------- status */

enum kvc_status {
    KVC_OK                  =  0,
    KVC_ERR_NOMEM           = -1,  /* an allocation failed */
    KVC_ERR_IO              = -2,  /* open/read/write/mmap failed */
    KVC_ERR_FORMAT          = -3,  /* malformed input file or data */
    KVC_ERR_UNSUPPORTED     = -4,  /* valid but not supported (type, architecture) */
    KVC_ERR_INVALID_ARG     = -5,  /* a caller passed an invalid value */
    KVC_ERR_CONTEXT_LENGTH  = -6,  /* prompt + max tokens exceed the context */
    KVC_ERR_NOT_FOUND       = -7,  /* a key, tensor or name does not exist */
    KVC_ERR_KV_FULL         = -8,  /* the KV pool has no free block */
    KVC_ERR_CANCELLED       = -9,  /* a callback asked to stop */
    KVC_ERR_BUSY            = -10, /* queue full; try again later */
};

/* A static English name for a status ("invalid argument"); never NULL. */
const char *kvc_strerror(int status);

/* ----------------------------------------------------------------- model */

typedef struct kvc_model kvc_model;

typedef struct kvc_model_params {
    /* Called with fractions in [0, 1] while the weights are paged in; NULL = none. */
    void (*progress)(float fraction, void *user);
    void  *progress_user;
} kvc_model_params;

kvc_model_params kvc_model_default_params(void);

/* Load a GGUF model (llama, qwen2, qwen3; F32, F16, BF16, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, Q4_K, Q5_K, Q6_K weights). On failure *out is NULL and err
 * (err_size bytes, may be NULL) says what was wrong:
 * "m.gguf: tensor blk.3.ffn_up.weight: type 23 (iq4_xs) not supported". */
int  kvc_model_load(const char *path, const kvc_model_params *params, kvc_model **out,
                    char *err, size_t err_size);
void kvc_model_free(kvc_model *model);

typedef struct kvc_model_info {
    const char *name;          /* general.name, else the file name; owned by the model */
    const char *arch;          /* "llama", "qwen2", "qwen3" */
    int32_t     n_vocab;
    int32_t     n_ctx_train;
    int32_t     n_embd;
    int32_t     n_layer;
    int32_t     n_head;
    int32_t     n_head_kv;
    int32_t     head_dim;
    int32_t     n_ff;
    uint64_t    n_params;
    uint64_t    weight_bytes;
} kvc_model_info;

void kvc_model_get_info(const kvc_model *model, kvc_model_info *out);

/* Tokenize len bytes of text. add_special: BOS/EOS as the vocabulary asks.
 * parse_special: control-token strings in the text become those tokens.
 * Returns the number of tokens (when more than cap, only cap were written:
 * call again with a larger buffer), or a negative status. */
int64_t kvc_model_tokenize(const kvc_model *model, const char *text, size_t len,
                           bool add_special, bool parse_special, int32_t *out, int64_t cap);

/* The text of one token (control tokens only when render_special). Returns
 * its length; when larger than cap, nothing was written. Negative: bad id. */
int kvc_model_token_to_piece(const kvc_model *model, int32_t token, bool render_special,
                             char *buf, int cap);

int32_t kvc_model_token_bos(const kvc_model *model);    /* -1 when none */
int32_t kvc_model_token_eos(const kvc_model *model);    /* -1 when none */
bool    kvc_model_token_is_eog(const kvc_model *model, int32_t token);

/* Streaming detokenizer: turns generated tokens into text, releasing only
 * whole UTF-8 characters (one split across tokens is held back). */
typedef struct kvc_detokenizer kvc_detokenizer;
kvc_detokenizer *kvc_detokenizer_new(const kvc_model *model, bool render_special); /* NULL: OOM */
void kvc_detokenizer_free(kvc_detokenizer *d);
/* Append the text token completes to out. Returns the bytes written; a
 * return above cap means out was too small: nothing was written or consumed,
 * call again with that much room (a piece has no upper bound). Negative for a
 * bad token id. */
int  kvc_detokenizer_feed(kvc_detokenizer *d, int32_t token, char *out, int cap);
/* Release what is held back (an incomplete character becomes U+FFFD). */
int  kvc_detokenizer_flush(kvc_detokenizer *d, char *out, int cap);

/* tokenizer.chat_template (Jinja source) or NULL; owned by the model. */
const char *kvc_model_chat_template(const kvc_model *model);

/* --------------------------------------------------------------- context */

/* A context owns a paged KV pool and the scratch of the forward pass. It holds
 * n_seq independent sequences (0 .. n_seq-1) that share the pool's blocks. One
 * thread at a time. */
typedef struct kvc_context kvc_context;

enum kvc_kv_type {
    KVC_KV_F16  = 0,   /* default */
    KVC_KV_F32  = 1,
    KVC_KV_Q8_0 = 2,
};

typedef struct kvc_context_params {
    int32_t n_ctx;      /* longest sequence; 0 = the model's training context */
    int32_t n_batch;    /* most tokens per forward pass; 0 = 512 */
    int32_t n_threads;  /* 0 = all cores */
    int32_t n_seq;      /* sequences; 0 = 1 */
    int32_t kv_type;    /* enum kvc_kv_type */
    int64_t kv_blocks;  /* pool size in blocks of 16 tokens; 0 = n_seq * n_ctx / 16 + 1
                           (the pool also keeps the prefix tree's blocks, evicted as needed) */
    int32_t snapshot_interval; /* models with recurrent layers: a snapshot of their states
                           every this many tokens of a long prefill (besides prompt ends
                           and message starts); 0 = chosen from the state's size, -1 = none */
    /* Models with sliding-window layers (gemma3, gpt-oss): those layers keep
     * the K/V of a running sequence's last window only, in window chunks of
     * their own (one per block of 16 positions they still see). */
    int32_t n_run;      /* sequences that run at once (the rest rest between turns, holding
                           no window chunk); 0 = n_seq */
    int64_t kv_window_blocks; /* window chunks per window size; 0 = twice what n_run running
                           sequences hold (ceil((window + n_batch) / 16) + 2 each), or
                           kv_blocks when that is more than half of them; -1 = kv_blocks
                           (every cached block keeps its window part: the most reuse, no
                           saving). Fewer than n_run sequences need is refused. */
} kvc_context_params;

kvc_context_params kvc_context_default_params(void);

int  kvc_context_new(kvc_model *model, const kvc_context_params *params, kvc_context **out,
                     char *err, size_t err_size);

/* The default budget of the disk tier: 4 GiB, about 340k tokens of a
 * Qwen2.5-0.5B-shaped model in F16 (12 KiB a token): 80 conversations of 4k. */
#define KVC_DISK_DEFAULT_MIB 4096

/* Keep the context's KV blocks also on disk (DESIGN.md §5), in `dir` (NULL =
 * the default of kvc_engine_params.cache_dir) with a budget of `mib` MiB (0 =
 * KVC_DISK_DEFAULT_MIB): blocks evicted from RAM and each finished turn are
 * written there, and a prompt's prefix found there is read instead of
 * computed, also after a restart. `model_path`: the model's file (its
 * fingerprint keeps other models' blocks apart). Call before the first
 * request. KVC_ERR_BUSY when another process uses the directory, KVC_ERR_IO. */
int  kvc_context_enable_disk(kvc_context *ctx, const char *model_path, const char *dir,
                             int64_t mib, char *err, size_t err_size);
/* The same (mib 0: no disk tier) with the shared tier in Redis behind it
 * (DESIGN.md §5): `url` redis://[[user]:password@]host[:port][/db],
 * `password` NULL = the URL's. Redis being down is no error: the tier is
 * skipped until it is back. KVC_ERR_INVALID_ARG for a bad URL. */
int  kvc_context_enable_redis(kvc_context *ctx, const char *model_path, const char *dir,
                              int64_t mib, const char *url, const char *password,
                              char *err, size_t err_size);void kvc_context_free(kvc_context *ctx);

int32_t kvc_context_n_ctx(const kvc_context *ctx);
int32_t kvc_context_n_batch(const kvc_context *ctx);
int32_t kvc_context_n_threads(const kvc_context *ctx);

/* Append n tokens to sequence `seq`, at positions [len, len + n), computing
 * them in forward passes of at most n_batch tokens. Afterwards
 * kvc_context_logits(ctx, -1) holds the logits predicting the token after the
 * last one; with all_logits (only for n <= n_batch) every token's logits are
 * kept. KVC_ERR_CONTEXT_LENGTH when len + n > n_ctx, KVC_ERR_KV_FULL when the
 * pool has no room; the sequence is then unchanged. */
int kvc_context_decode(kvc_context *ctx, int32_t seq, const int32_t *tokens, int32_t n,
                       bool all_logits, char *err, size_t err_size);

/* Logits (n_vocab floats) of token i of the last decode call with all_logits,
 * or of its last token for i = -1. Valid until the next decode. */
const float *kvc_context_logits(const kvc_context *ctx, int32_t i);

int32_t kvc_context_seq_len(const kvc_context *ctx, int32_t seq);
/* Keep positions [0, n_keep) of a sequence, drop the rest. A sliding-window
 * model may keep less (its window's memory there was evicted):
 * kvc_context_seq_len says what was kept. */
int     kvc_context_seq_truncate(kvc_context *ctx, int32_t seq, int32_t n_keep);

/* --------------------------------------------------------------- sampler */

typedef struct kvc_sampler kvc_sampler;

typedef struct kvc_sampler_params {
    float    temperature;       /* <= 0: greedy (argmax, lowest id on ties) */
    int32_t  top_k;             /* <= 0: off */
    float    top_p;             /* >= 1: off */
    float    min_p;             /* <= 0: off */
    float    repeat_penalty;    /* 1: off */
    int32_t  repeat_last_n;     /* tokens of history the penalties look at */
    float    presence_penalty;  /* 0: off */
    float    frequency_penalty; /* 0: off */
    uint64_t seed;
} kvc_sampler_params;

kvc_sampler_params kvc_sampler_default_params(void);
/* NULL on allocation failure or n_vocab < 1. */
kvc_sampler *kvc_sampler_new(const kvc_sampler_params *params, int32_t n_vocab);
void    kvc_sampler_free(kvc_sampler *s);
/* Pick a token from logits (n_vocab floats, not modified). */
int32_t kvc_sampler_sample(kvc_sampler *s, const float *logits);
/* Record a token (prompt or generated) in the history the penalties use. */
void    kvc_sampler_accept(kvc_sampler *s, int32_t token);
void    kvc_sampler_reset(kvc_sampler *s);

/* ------------------------------------------------------------------ chat */

/* A session is one conversation over one sequence of a context. Each call of
 * kvc_session_chat gets the WHOLE conversation, as OpenAI clients send it, and
 * computes only what the cache does not hold (DESIGN.md §3):
 *   1. the messages are rendered with the chat template and tokenized whole:
 *      the tokens a cold run uses, whatever the session saw before;
 *   2. the longest common token prefix of those tokens with the session's
 *      cached ones and the context's prefix tree is found;
 *   3. the sequence is truncated there (an edit, a regeneration, a branch);
 *   4. the unmatched tokens are computed (the last one again when everything
 *      matched, for its logits);
 *   5. the reply is generated (a stop token, an end of generation or any
 *      other control token, ends it and is not kept);
 *   6. the conversation is canonicalized: rendered with the reply as the next
 *      call will carry it, and what of it is not cached (the reply
 *      re-tokenized, the end of turn, the next turn's header) is computed
 *      before the call returns, so the next call computes only its new
 *      message.
 * The result does not depend on what was cached: with greedy or seeded
 * sampling the reply is bitwise the one a fresh context gives. Reply text is
 * valid UTF-8 (bytes that cannot form a character become U+FFFD). */
typedef struct kvc_session kvc_session;

/* One message of a conversation. Every field is borrowed UTF-8; the optional
 * ones are NULL when absent and are passed to the model's chat template as
 * transformers passes them. */
typedef struct kvc_chat_message {
    const char *role;              /* "system", "user", "assistant", "tool", ... */
    const char *content;           /* NULL = "" */
    const char *name;              /* the author's or the tool's name */
    const char *tool_call_id;      /* a "tool" message: the call it answers */
    const char *tool_calls_json;   /* an assistant's tool_calls: the JSON text of the array
                                      ([{"id", "type": "function", "function": {"name",
                                      "arguments"}}]) */
    const char *reasoning_content; /* an assistant's reasoning (thinking) text */
} kvc_chat_message;

enum kvc_overflow {
    KVC_OVERFLOW_ERROR = 0, /* prompt + max_tokens > context: KVC_ERR_CONTEXT_LENGTH */
    KVC_OVERFLOW_SHIFT = 1, /* keep the system prompt, drop the oldest whole turns,
                               re-rotate the kept K to their new positions */
};

typedef struct kvc_chat_params {
    int32_t            max_tokens;  /* reply length limit; 0 = up to the context */
    kvc_sampler_params sampling;
    const char *const *stop;        /* extra stop strings, n_stop of them (borrowed) */
    int32_t            n_stop;
    int32_t            overflow;    /* enum kvc_overflow */
    bool               no_cache;    /* a cold run: recompute every token of the prompt,
                                       publish nothing to the cache, no canonicalization */
    const char        *tools_json;  /* the request's tools: JSON text of the array; NULL = none
                                       (borrowed) */
    const char        *template_kwargs_json; /* a JSON object of extra chat template variables
                                       (chat_template_kwargs, e.g. enable_thinking); NULL = none */
    /* added for the agent API (issue 13) */
    const char        *grammar;     /* constrained decoding: grammar text in grammar.h's GBNF
                                       dialect (start rule "root"); every reply token is
                                       masked to what it allows; NULL = none (borrowed) */
    const struct kvc_logit_bias *logit_bias; /* added to the logits before sampling (sampler.h);
                                       n_logit_bias entries (borrowed) */
    int32_t            n_logit_bias;
    int32_t            logprobs;    /* -1 = none; else each reply token's log-probability and
                                       the `logprobs` (<= KVC_MAX_TOP_LOGPROBS) most likely */
    bool               parse_tool_calls; /* engine: parse the reply's tool calls in the
                                       template's syntax (kvc_engine_tool_format) into the
                                       DONE event */
    bool               single_tool_call; /* ... keeping only the first (parallel_tool_calls
                                       false) */
    bool               forced_tool_calls; /* ... which the grammar forces (tool_choice required
                                       or named): the reply is only calls, never text: no
                                       TEXT events, and text beside the calls (a call cut
                                       by max_tokens) is not content */
    bool               special_in_content; /* control-token text in message content becomes
                                       control tokens (false: content is tokenized as plain
                                       text, only the template's own markup gives them) */
    bool               split_reasoning; /* the reply's <think> block goes to the client
                                       apart from its content (the server's reasoning_content,
                                       thinking blocks, reasoning items), and comes back so:
                                       the reply is canonicalized (DESIGN.md §3) as an assistant
                                       message with the block as reasoning_content and the
                                       rest as content, the template keeping or dropping it */
    int32_t            reasoning_mode; /* ... written so: 0 <think> tags, 1 tags with the
                                       reply beginning inside the block (the generation
                                       prompt ended with <think>), 2 harmony channels
                                       (gpt-oss: analysis is the reasoning, final the
                                       content) */
} kvc_chat_params;

#define KVC_MAX_TOP_LOGPROBS 20

/* The log-probability of one reply token under the model's raw distribution
 * (before bias, penalties, mask and temperature: what `kvchat eval` reports). */
typedef struct kvc_token_logprob {
    int32_t token;
    float   logprob;
    int32_t n_top;                              /* the most likely tokens, best first */
    int32_t top_token[KVC_MAX_TOP_LOGPROBS];
    float   top_logprob[KVC_MAX_TOP_LOGPROBS];
} kvc_token_logprob;

kvc_chat_params kvc_chat_default_params(void);

typedef struct kvc_chat_stats {
    int32_t prompt_tokens;    /* tokens of the rendered conversation */
    int32_t cached_tokens;    /* of those, reused from the cache */
    int32_t cached_disk_tokens; /* of cached_tokens, read from the disk tier */
    int32_t computed_tokens;  /* run through the model for the prompt */
    int32_t output_tokens;    /* generated */
    int32_t dropped_tokens;   /* removed by a context shift */
    double  prompt_ms;        /* computing the prompt */
    double  ttft_ms;          /* request start to the first token */
    double  decode_ms;        /* first token to the last */
    double  total_ms;
    double  prompt_tps;       /* computed_tokens / prompt time */
    double  decode_tps;       /* output tokens after the first / decode time */
    const char *finish_reason; /* "stop" (EOG or stop string), "length", "cancelled" */
    int32_t grammar_masks;    /* constrained decoding: token masks computed ... */
    double  grammar_mask_ms;  /* ... and the time they took */
} kvc_chat_stats;

/* Called with each piece of reply text as it is generated (whole UTF-8
 * characters). Return false to stop generating ("cancelled"). */
typedef bool (*kvc_chat_stream_fn)(const char *text, size_t len, void *user);

/* A session on sequence `seq` of ctx (which it then owns; one session per
 * sequence). template_name: a chat format name ("chatml", "llama3", ...) or
 * NULL for the model's own template (ChatML when it has none or it is not
 * recognised). NULL on failure, with err set. */
kvc_session *kvc_session_new(kvc_context *ctx, int32_t seq, const char *template_name,
                             char *err, size_t err_size);
void kvc_session_free(kvc_session *s);
/* Forget the conversation and release its cache (a new conversation). */
void kvc_session_reset(kvc_session *s);
/* The chat template in use, for logs ("the model's Jinja chat template"). */
const char *kvc_session_template(const kvc_session *s);
/* The prompt text msgs render to with p's tools and template kwargs (p may be
 * NULL), exactly as it will be tokenized; *prompt is malloc'd. */
int kvc_session_prompt(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                       const kvc_chat_params *p, char **prompt, char *err, size_t err_size);

/* Generate the assistant's reply to msgs[0, n). *reply (may be NULL) gets a
 * malloc'd copy of the reply text, which is what the client should send back
 * as the assistant message. Stats are filled when non-NULL.
 * KVC_ERR_CONTEXT_LENGTH (message with the sizes) when the prompt plus
 * max_tokens does not fit and overflow is KVC_OVERFLOW_ERROR: nothing is then
 * changed or computed. With KVC_OVERFLOW_SHIFT the oldest whole turns are
 * dropped instead (a leading system message is kept) until it fits
 * (stats->dropped_tokens), and the kept turns' cached K/V are moved to their
 * new positions with K re-rotated, not recomputed: the reply is then close to,
 * not bitwise, a cold run's of the kept turns. KVC_ERR_CONTEXT_LENGTH when even
 * the system prompt and the last user message do not fit. */
int kvc_session_chat(kvc_session *s, const kvc_chat_message *msgs, size_t n,
                     const kvc_chat_params *params, kvc_chat_stream_fn stream, void *user,
                     char **reply, kvc_chat_stats *stats, char *err, size_t err_size);

/* ------------------------------------------------------------ make-model */

/* Random-weight GGUF models for tests, demos and benchmarks: every supported
 * architecture and weight type, any shape, with a built-in vocabulary and a
 * ChatML template. */
typedef struct kvc_gen_params {
    const char *arch;        /* "llama" | "qwen2" (q/k/v biases) | "qwen3" (q/k norms) |
                              * "qwen3moe" (qwen3 with a mixture-of-experts FFN) */
    const char *ftype;       /* "f32" "f16" "bf16" "q8_0" "q4_0" "q4_1" "q5_0" "q5_1"
                              * "q4_k" (= "q4_k_s") "q5_k" (= "q5_k_s") "q6_k"
                              * "q4_k_m" "q5_k_m" "mxfp4_moe" (experts MXFP4, the rest
                              * Q8_0); case-insensitive */
    int32_t     n_embd;      /* > 0 */
    int32_t     n_layer;     /* > 0 */
    int32_t     n_head;      /* > 0 */
    int32_t     n_head_kv;   /* 0 = n_head; must divide n_head */
    int32_t     head_dim;    /* 0 = n_embd / n_head; must be even (RoPE) */
    int32_t     n_ff;        /* > 0 */
    int32_t     n_ctx;       /* context_length written to the file, > 0 */
    int32_t     n_vocab;     /* 0 = the built-in vocabulary's natural size; larger
                              * pads with unused filler tokens; smaller is an error */
    const char *vocab;       /* "bpe" (byte-level, tokenizer.ggml.model "gpt2") | "spm" ("llama") */
    const char *bpe_pre;     /* tokenizer.ggml.pre for "bpe"; NULL = "qwen2" for the
                              * qwen archs, "llama-bpe" for llama. "spm" writes "default" */
    bool        tied;        /* no output.weight: token_embd is the output projection */
    bool        vocab_only;  /* write the keys only, no tensors (tokenizer tests) */
    float       rope_theta;  /* rope.freq_base, > 0 */
    float       rms_eps;     /* attention.layer_norm_rms_epsilon, > 0 */
    uint64_t    seed;        /* weights are a function of (seed, tensor name) */
    const char *name;        /* general.name; NULL = "random-{arch}-{L}L-{d}d" */
    int32_t     n_threads;   /* 0 = all online CPUs; the output does not depend on it */
    bool        all_tokens;  /* false: byte tokens outside printable ASCII and control
                              * tokens other than EOS get small output weights, so that
                              * random text reads as text; true: every token is as likely
                              * (tests of byte sequences and control tokens) */
    /* mixture of experts (qwen3moe; ignored by the dense architectures) */
    int32_t     n_expert;    /* experts per layer, > 0 */
    int32_t     n_expert_used; /* experts per token (top-k), 1..n_expert */
    int32_t     n_ff_exp;    /* one expert's FFN width, > 0 */
    /* sliding-window attention and RoPE scaling (gemma3, gpt-oss; 0 / NULL: key not written) */
    int32_t     n_swa;       /* attention.sliding_window (gemma3, gpt-oss: > 0) */
    int32_t     swa_pattern; /* attention.sliding_window_pattern: every n-th layer is global
                              * (0: the architecture's default, gemma3 6, gpt-oss 2) */
    float       rope_theta_swa; /* rope.freq_base_swa of the sliding layers */
    const char *rope_scaling;   /* rope.scaling.type: NULL or "none", "linear", "yarn" */
    float       rope_factor;    /* rope.scaling.factor, >= 1 with a scaling type */
    int32_t     rope_orig_ctx;  /* rope.scaling.original_context_length (YaRN) */
    float       logit_softcap;  /* final_logit_softcapping (gemma3) */
    /* hybrid recurrent models (qwen35, qwen35moe, lfm2, granitehybrid; ignored by the
     * others). The ssm.* fields mean Gated DeltaNet's shape for qwen35*, Mamba-2's for
     * granitehybrid; 0 takes the row's default */
    const char *kv_heads;    /* lfm2, granitehybrid: KV heads per layer, comma-separated
                              * ("0,0,2,0,1"), repeated over the layers; 0 = a recurrent layer
                              * (lfm2: short convolution, granitehybrid: Mamba-2). NULL: even
                              * layers recurrent, odd ones n_head_kv. Written as the
                              * head_count_kv array */
    int32_t     conv_l;      /* lfm2 shortconv.l_cache, the kernel width (0: 3) */
    int32_t     ssm_d_conv;  /* ssm.conv_kernel: the causal convolution's width, 1..16 (Mamba-2
                              * 0: 4) */
    int32_t     ssm_d_inner; /* Mamba-2 ssm.inner_size (0: 2 n_embd, as llama.cpp requires);
                              * GDN: written as ssm_n_head * ssm_d_state */
    int32_t     ssm_d_state; /* ssm.state_size: Mamba-2's N (0: 16); GDN: the head size d_k = d_v */
    int32_t     ssm_n_head;  /* ssm.time_step_rank: Mamba heads (0: d_inner / 32); GDN: the V
                              * heads, a multiple of ssm_n_group */
    int32_t     ssm_n_group; /* ssm.group_count: Mamba-2's groups (0: 1); GDN: the Q/K heads */
    int32_t     full_attn_interval; /* GDN: layer il is gated attention iff (il + 1) % this == 0 */
    int32_t     n_rot;       /* rope.dimension_count: rotated dims of a head (0: head_dim) */
    int32_t     n_ff_shexp;  /* the shared expert's width (qwen35moe, granitehybrid); 0: none.
                              * granitehybrid's experts are n_ff wide (n_ff_exp ignored),
                              * n_expert 0: a dense FFN */
    float       embedding_scale, residual_scale, attention_scale, logit_scale;
                             /* granitehybrid's scalars (0: key not written) */
    /* gemma4: the sliding layers' own attention shape (0: the global layers' head_dim,
     * n_head_kv, n_rot); the global layers rotate a quarter of their pairs (rope_freqs) */
    int32_t     head_dim_swa;
    int32_t     n_head_kv_swa;
    int32_t     n_rot_swa;
    int32_t     n_embd_per_layer; /* gemma4: per-layer embeddings' width (E models; 0: none) */
    int32_t     n_kv_shared; /* gemma4: the last this many layers reuse earlier layers' K/V */
    const char *layer_pattern; /* nemotron_h(_moe): each layer's one sublayer, a letter per layer
                              * repeated over the layers (as Nemotron's hybrid_override_pattern):
                              * M Mamba-2, * attention, - an FFN (E the same: experts when
                              * n_expert > 0). NULL: "M-M*" */
    int32_t     n_dense_lead; /* lfm2moe: leading_dense_block_count, the first layers' FFNs dense */
    float       expert_weights_scale; /* expert_weights_scale (0: key not written) */
    bool        expert_weights_norm;  /* expert_weights_norm written true (false: not written) */
    const char *ff_layers;   /* dense FFN width per layer, comma-separated ("64,64,128"), repeated
                              * over the layers (pruned models); NULL: n_ff everywhere. Widths
                              * that differ are written as the feed_forward_length array */
    bool        double_wide_mlp; /* gemma4: the KV-shared layers' FFNs are twice as wide (Gemma 4
                              * E2B's use_double_wide_mlp) */
} kvc_gen_params;

/* The "demo" preset: qwen2, n_embd 128, 2 layers, 4 heads (2 KV), head_dim 32,
 * n_ff 384, context 4096, f16, bpe vocabulary, tied, rope theta 10000,
 * rms eps 1e-6, seed 42. */
kvc_gen_params kvc_gen_default_params(void);

/* Named presets; *out is overwritten (all of it) on success.
 *   "demo"          kvc_gen_default_params()
 *   "tiny"          qwen2, d 64, 2 layers, 4/2 heads, ff 128, ctx 2048, f32, bpe, tied
 *   "tiny-llama"    llama, d 64, 2 layers, 4/2 heads, ff 192, ctx 2048, f32, spm, untied
 *   "tiny-qwen3"    qwen3, d 64, 2 layers, 4/1 heads, hd 32, ff 128, ctx 2048, f32, spm, tied
 *   "tiny-qwen3moe" qwen3moe, d 64, 2 layers, 4/1 heads, hd 32, 8 experts of 64, top-2,
 *                   ctx 2048, theta 1e6, f32, spm, untied
 *   "qwen2.5-0.5b"  Qwen2.5-0.5B's shapes: 24 layers, d 896, 14/2 heads, hd 64,
 *                   ff 4864, vocab 151936, ctx 32768, theta 1e6, tied, bpe, f16
 *   "qwen3-30b-a3b" Qwen3-30B-A3B's shapes: 48 layers (cut with n_layer), d 2048,
 *                   32/4 heads of 128, 128 experts of 768, top-8, vocab 151936,
 *                   ctx 40960, theta 1e6, untied, bpe, q4_k_m
 *   "tiny-gemma3"   gemma3, d 64, 6 layers, 4/2 heads, hd 32, ff 128, window 12, pattern 3,
 *                   ctx 2048, theta 1e6 (sliding 1e4), f32, spm, tied
 *   "tiny-gpt-oss"  gpt-oss, d 64, 4 layers, 4/2 heads, hd 32, 8 experts of 64, top-4,
 *                   window 8, YaRN x4 over 512, ctx 2048, theta 150000, f32, bpe, untied
 *   "gemma3-4b"     Gemma 3 4B's shapes: 34 layers (cut with n_layer), d 2560, 8/4 heads
 *                   of 256, ff 10240, window 1024, pattern 6, vocab 262144, ctx 131072,
 *                   theta 1e6 (linear x8; sliding 1e4), tied, bpe, q4_k_m
 *   "tiny-gemma4"   gemma4, d 64, 9 layers (pattern 3: layers 2, 5, 8 global), 4 heads, sliding
 *                   2 KV of 16, global 1 KV of 32 (K = V, a quarter rotated), window 8, ff 128,
 *                   beside it 8 experts of 32, top-2, theta 1e6 (sliding 1e4), soft-cap 30,
 *                   ctx 2048, f32, spm, tied (the shape of ../shared's tiny-gemma4)
 *   "gemma4-e4b"    Gemma 4 E4B's shapes: 42 layers (cut with n_layer), d 2560, 8 heads,
 *                   sliding 2 KV of 256 (window 512), global 2 KV of 512, pattern 6, ff 10240,
 *                   per-layer embeddings of 256, vocab 262144, ctx 131072, soft-cap 30, tied,
 *                   bpe, q4_k_m, the last 18 layers KV-shared (n_kv_shared, which must
 *                   leave 2 layers: make-model --n-layer keeps their share, e.g. 6 of 12)
 *   "tiny-gemma4-dw" gemma4 as tiny-gemma4 but no experts, FFN widths 96, 64 in turn (ff_layers),
 *                   the last 3 layers KV-shared with double-wide MLPs (2x), per-layer embeddings of
 *                   16: E2B's per-layer widths in small
 *   "gemma4-e2b"    Gemma 4 E2B's shapes: 35 layers (cut with n_layer), d 1536, 8 heads, sliding
 *                   1 KV of 256 (window 512), global 1 KV of 512, pattern 5, ff 6144, the last 20
 *                   layers KV-shared and double-wide (ff 12288: use_double_wide_mlp), per-layer
 *                   embeddings of 256, vocab 262144, ctx 131072, soft-cap 30, tied, bpe, q4_k_m
 *   "gemma4-26b-a4b" Gemma 4 26B-A4B's shapes: 30 layers (cut with n_layer), d 2816, 16 heads,
 *                   sliding 8 KV of 256 (window 1024), global 2 KV of 512, pattern 6, ff 2112
 *                   beside 128 experts of 704, top-8, vocab 262144, ctx 262144, soft-cap 30,
 *                   tied, bpe, q4_k_m
 *   "tiny-lfm2"     lfm2, d 64, 8 layers (conv, conv, attn 2 KV, conv, attn 1 KV, conv, conv,
 *                   attn 4 KV), 4 heads of 16, ff 128, l_cache 3, ctx 2048, theta 1e6, f32,
 *                   spm, tied (the shape of ../shared's tiny-lfm2)
 *   "tiny-granitehybrid" granitehybrid, d 64, 9 layers (Mamba-2, Mamba-2, attention) x 3
 *                   (KV 2, 2, 1), 4 heads of 16, 8 experts of 32, top-2, shared expert 48,
 *                   d_inner 128, 8 Mamba heads, 2 groups, N 16, conv 4, NoPE, embedding x12,
 *                   residual x0.5, attention scale 0.125, logits / 4, f32, spm, untied
 *   "tiny-nemotron_h_moe" nemotron_h_moe, d 64, 10 layers (Mamba-2, MoE, Mamba-2, attention,
 *                   MoE) x 2, 4/2 heads of 16 (NoPE), 8 ReLU² experts of 32, top-2, shared
 *                   expert 48, sigmoid router with selection bias, weights renormalised x2.5,
 *                   d_inner 128, 8 Mamba heads, 2 groups, N 16, conv 4, f32, spm, untied
 *   "tiny-nemotron_h" nemotron_h, d 64, 7 layers (M - M - M * -: Mamba-2, ReLU² MLP of 96,
 *                   attention), otherwise as tiny-nemotron_h_moe
 *   "tiny-lfm2moe"  lfm2moe: tiny-lfm2 with 8 experts of 32, top-2 (sigmoid router with
 *                   selection bias) after 2 dense layers
 *   "nemotron-3-nano-30b-a3b" Nemotron 3 Nano 30B-A3B's shapes: 52 layers (23 Mamba-2, 23 MoE,
 *                   6 attention; cut with n_layer), d 2688, 32/2 heads of 128, 128 experts of
 *                   1856, top-6, shared expert 3712, x2.5, d_inner 4096, 64 Mamba heads, 8
 *                   groups, N 128, conv 4, vocab 131072, ctx 262144, untied, bpe, q4_k_m
 *   "nemotron-h-8b" Nemotron-H 8B's shapes: 52 layers (24 Mamba-2, 24 MLP, 4 attention), d 4096,
 *                   32/8 heads of 128, ff 21504, d_inner 8192, 128 Mamba heads, 8 groups,
 *                   N 128, vocab 131072, ctx 8192, untied, bpe, q4_k_m
 *   "lfm2-8b-a1b"   LFM2-8B-A1B's shapes: 24 layers (attention at 2, 6, 10, 14, 18, 21), d 2048,
 *                   32/8 heads of 64, 2 dense layers of 7168, then 32 experts of 1792, top-4,
 *                   vocab 65536, ctx 128000, theta 1e6, tied, bpe, q4_k_m
 *   "lfm2-1.2b"     LFM2-1.2B's shapes: 16 layers (attention at 2, 5, 8, 10, 12, 14; cut with
 *                   n_layer), d 2048, 32/8 heads of 64, ff 8192, l_cache 3, vocab 65536,
 *                   ctx 128000, theta 1e6, tied, bpe, q4_k_m
 *   "granite-4.0-h-tiny" Granite-4.0-H-Tiny's shapes: 40 layers (attention at 5, 15, 25, 35;
 *                   cut with n_layer), d 1536, 12/4 heads of 128, 64 experts of 512, top-6,
 *                   shared expert 1024, d_inner 3072, 48 Mamba heads of 64, 1 group,
 *                   N 128, conv 4, NoPE, embedding x12, residual x0.22, attention scale
 *                   1/128, logits / 6, vocab 100352, untied, bpe, q4_k_m
 *   "gpt-oss-20b"   gpt-oss-20b's shapes: 24 layers (cut with n_layer), d 2880, 64/8 heads
 *                   of 64, 32 experts of 2880, top-4, window 128, YaRN x32 over 4096,
 *                   vocab 201088, ctx 131072, theta 150000, untied, bpe, mxfp4_moe
 *   "tiny-qwen35"   qwen35, d 64, 4 layers (3 Gated DeltaNet + 1 gated attention), 4/2 heads
 *                   of 32 (8 rotated), ff 128, GDN 2 K / 4 V heads of 16, conv 4, ctx 2048,
 *                   theta 1e7, f32, bpe, tied
 *   "tiny-qwen35moe" qwen35moe, the same with 8 experts of 32, top-2, a shared expert of 48,
 *                   6 V heads, spm, untied
 *   "qwen3.5-9b"    Qwen3.5-9B's shapes: 32 layers (cut with n_layer; 3 GDN : 1 attention),
 *                   d 4096, 16/4 heads of 256 (64 rotated), ff 12288, GDN 16 K / 32 V heads
 *                   of 128, conv 4, vocab 248320, ctx 262144, theta 1e7, untied, bpe, q4_k_m
 *   "qwen3.6-35b-a3b" Qwen3.6-35B-A3B's shapes: 40 layers (cut with n_layer), d 2048, 16/2
 *                   heads of 256 (64 rotated), 256 experts of 512, top-8, a shared expert of
 *                   512, GDN 16 K / 32 V heads of 128, vocab 248320, ctx 262144, theta 1e7,
 *                   untied, bpe, q4_k_m
 *   "tiny-qwen3next" qwen3next, d 64, 4 layers (3 GDN + 1 gated attention), 4/2 heads of 32
 *                   (8 rotated), GDN 2 K / 6 V heads of 16 in the fused ssm_in / ssm_ba
 *                   form, 8 experts of 32, top-2, a shared expert of 48, ctx 2048,
 *                   theta 1e7, f32, bpe, untied
 *   "qwen3-next-80b-a3b" Qwen3-Next-80B-A3B's (and Qwen3-Coder-Next's) shapes: 48 layers
 *                   (cut with n_layer; 3 GDN : 1 attention), d 2048, 16/2 heads of 256 (64
 *                   rotated), 512 experts of 512, top-10, a shared expert of 512, GDN 16 K /
 *                   32 V heads of 128 (fused ssm_in / ssm_ba), vocab 151936, ctx 262144,
 *                   theta 1e7, untied, bpe, q4_k_m
 * Returns KVC_OK, or KVC_ERR_NOT_FOUND for an unknown name (out untouched). */
int kvc_gen_preset(const char *name, kvc_gen_params *out);

/* The i-th preset name for listings, NULL when i is out of range. */
const char *kvc_gen_preset_name(int i);

/* kvc_gen_model with the public API's error convention: on failure a message
 * goes into err (err_size bytes, NUL-terminated; err may be NULL). For the CLI. */
int kvc_gen_write(const kvc_gen_params *p, const char *path, char *err, size_t err_size);

/* ---------------------------------------------------------------- engine */

/* The engine serves many conversations at once (DESIGN.md §4): one engine
 * thread owns the model, the KV pool and the prefix cache and runs steps;
 * other threads submit requests and read their events. Thread-safe.
 *
 * Each step is one forward pass of up to n_batch tokens: a token of every
 * conversation that is generating, then prefill chunks of those computing
 * their prompts (continuous batching; up to n_parallel conversations at
 * once). Whatever ran beside a request, its greedy output is bitwise that of
 * a cold run of its tokens.
 *
 * Sharing: every full block of 16 tokens any request computed enters a prefix
 * tree, so a request reuses the longest cached prefix whoever computed it (a
 * system prompt shared by many conversations is stored once). A request
 * whose prefix another is still computing waits for it rather than computing
 * it twice. Sessions are found by key (prompt_cache_key, else user); an
 * unkeyed request continues the unkeyed session sharing the longest token
 * prefix with it, and the tree finds the rest.
 *
 * Memory: the KV pool is the budget (kv_budget_mib), allocated up front and
 * never exceeded. A request is started only when every block it may need
 * (prompt + max_tokens) is free or can be freed: blocks no running request
 * holds are evicted least recently used first (leaves of the tree first; idle
 * sessions let go of theirs when that is not enough). Until then it waits in
 * the queue; one that cannot fit even in an empty pool fails with
 * KVC_ERR_KV_FULL. A request without max_tokens is limited to what the
 * context and the pool can hold. */
typedef struct kvc_engine kvc_engine;

typedef struct kvc_engine_params {
    int32_t     n_ctx;          /* longest conversation; 0 = the model's training context */
    int32_t     n_batch;        /* most tokens per step; 0 = 512 */
    int32_t     n_threads;      /* 0 = all cores */
    int32_t     n_parallel;     /* conversations computed at once (batched); 0 = 8 */
    int64_t     kv_budget_mib;  /* KV pool size in MiB, of kv_type blocks; 0 = n_parallel
                                   full contexts */
    int32_t     kv_type;        /* enum kvc_kv_type */
    int32_t     max_queue;      /* requests waiting beyond the running ones; 0 = 64 */
    int32_t     max_sessions;   /* sessions kept (LRU), beyond the n_parallel running; 0 = 256 */
    const char *chat_template;  /* a built-in format name, or Jinja source (any text with
                                   "{%" or "{{"); NULL = the model's own template */
    const char *chat_template_kwargs; /* JSON object: template variables every request gets
                                   (a request's chat_template_kwargs win per key); NULL = none */
    int32_t     overflow;       /* enum kvc_overflow */
    int32_t     snapshot_interval; /* kvc_context_params.snapshot_interval */
    bool        no_cache;       /* every request cold (as kvc_chat_params.no_cache) */
    bool        special_in_content; /* every request's (kvc_chat_params.special_in_content) */
    /* the disk tier (DESIGN.md §5): KV blocks kept in a directory, across
     * evictions and restarts. The CLI turns it on by default. */
    int64_t     cache_disk_mib; /* its budget in MiB; 0 = no disk tier (the default here;
                                   the CLI's is KVC_DISK_DEFAULT_MIB) */
    const char *cache_dir;      /* NULL = $KVCHAT_CACHE/kv, else $XDG_CACHE_HOME/kvchat/kv,
                                   else ~/.cache/kvchat/kv */
    const char *model_path;     /* the model's file, fingerprinted so that no other model
                                   (or KV type) ever reads its blocks; needed with the tier */
    /* the shared tier (DESIGN.md §5): the same blocks in Redis, behind the
     * disk tier (or alone), for several instances */
    const char *cache_redis;    /* redis://[[user]:password@]host[:port][/db]; NULL = none */
    const char *cache_redis_password;   /* NULL = the URL's */
    int32_t     cache_redis_timeout_ms; /* each connect and command; 0 = 200 */
    /* told when the Redis tier is lost (once an outage) and back; NULL = nobody */
    void      (*cache_warn)(void *user, const char *msg);
    void       *cache_warn_user;
    /* sliding-window layers (gemma3, gpt-oss): window chunks per window size
     * (kvc_context_params.kv_window_blocks: 0 = for n_parallel + 1 running
     * windows, twice over; -1 = as many as blocks, every cached block keeps
     * its window part: llama.cpp's --swa-full) */
    int64_t     kv_window_blocks;
} kvc_engine_params;

kvc_engine_params kvc_engine_default_params(void);

int  kvc_engine_new(kvc_model *model, const kvc_engine_params *params, kvc_engine **out,
                    char *err, size_t err_size);
/* Cancels what is queued or running, joins the engine thread. NULL ok. */
void kvc_engine_free(kvc_engine *engine);

/* A request's tokens are those a cold run would use, tokenize(render(messages)),
 * made in the submitting thread; the engine reuses the longest prefix of them
 * it holds. After a chat reply the engine canonicalizes it in idle time: it
 * computes the conversation as the next request will carry it (the reply
 * re-tokenized as the template renders it, the end of turn and the next
 * turn's header), so the next turn computes only its new message. */
typedef struct kvc_request_params {
    const kvc_chat_message *messages;  /* chat: the whole conversation ... */
    size_t      n_messages;
    const char *prompt;                /* ... or a raw completion prompt (messages NULL) */
    const int32_t *prompt_tokens;      /* ... or one given as token ids (prompt NULL) */
    int64_t     n_prompt_tokens;
    const char *session_key;           /* one conversation's (the server: prompt_cache_key,
                                          else user with the conversation's start); NULL = none */
    const char *cache_namespace;       /* the tenant: requests of different namespaces share
                                          no cached block (in RAM, on disk, in Redis) and no
                                          session; NULL or "" = the default namespace. The
                                          server makes it from the API key and cache_salt */
    kvc_chat_params chat;              /* max_tokens, sampling, stops, no_cache */
} kvc_request_params;

/* A submitted request; its events are read with kvc_request_next. */
typedef struct kvc_request kvc_request;

enum kvc_event_type {
    KVC_EVENT_TEXT  = 1,   /* a piece of reply text */
    KVC_EVENT_DONE  = 2,   /* finished: stats, the whole reply */
    KVC_EVENT_ERROR = 3,   /* failed: status and message (nothing more follows) */
};

typedef struct kvc_event {
    int            type;        /* enum kvc_event_type; 0 = timed out */
    char          *text;        /* TEXT: the piece; DONE: the whole reply (malloc'd, NUL-terminated) */
    size_t         len;
    int            status;      /* ERROR: a KVC_ERR_* */
    char           message[512];/* ERROR: what went wrong */
    kvc_chat_stats stats;       /* DONE; the first TEXT: the prompt's figures (prompt_tokens,
                                   cached_tokens, cached_disk_tokens), the rest zero */
    kvc_token_logprob *logprobs;/* with chat.logprobs >= 0 (n_logprobs; malloc'd, freed
                                   by kvc_event_clear): DONE, one per reply token; TEXT,
                                   those of the tokens the piece carries: a piece ends
                                   where a token ends, and the last one carries every
                                   token it shows a part of. The pieces' lists are a
                                   prefix of DONE's; what they lack (a stop string's
                                   tokens) is only there */
    int32_t        n_logprobs;
    char          *tool_calls;  /* DONE with chat.parse_tool_calls and calls found: the
                                   OpenAI tool_calls array as JSON text ... */
    char          *content;     /* ... and the reply's text besides them (both malloc'd) */
} kvc_event;

/* Queue a request (everything in params is copied). The prompt is rendered
 * and tokenized here, in the caller's thread. NULL with err set when it is
 * invalid (KVC_ERR_INVALID_ARG: a bad role), does not fit even after a
 * context shift (KVC_ERR_CONTEXT_LENGTH), or the queue is full
 * (KVC_ERR_BUSY); *status gets the code when non-NULL. What is found when the engine takes
 * it comes as an ERROR event: KVC_ERR_CONTEXT_LENGTH, KVC_ERR_KV_FULL (larger
 * than the whole KV budget), KVC_ERR_INVALID_ARG (a bad role, sampling). */
kvc_request *kvc_engine_submit(kvc_engine *engine, const kvc_request_params *params,
                               int *status, char *err, size_t err_size);
/* Queue n requests together, params[i] into out[i]: the engine takes them in
 * one pass (the choices of one response start together, not one after
 * another as each is rendered). KVC_OK, or the code of the first that failed
 * with err set and none queued (out all NULL). */
int kvc_engine_submit_all(kvc_engine *engine, const kvc_request_params *params, int n,
                          kvc_request **out, char *err, size_t err_size);
/* Wait up to timeout_ms (-1 = forever) for the next event. Returns true with
 * *ev filled, false on time-out. After DONE or ERROR there are no more. Free
 * ev->text with kvc_event_clear. */
bool kvc_request_next(kvc_request *r, kvc_event *ev, int timeout_ms);
void kvc_event_clear(kvc_event *ev);
/* Stop generating (a client went away); the request still ends with DONE
 * (finish "cancelled"). Its computed blocks stay cached. */
void kvc_request_cancel(kvc_request *r);
/* Release the handle (cancelling it if still running). NULL ok. */
void kvc_request_free(kvc_request *r);

typedef struct kvc_engine_metrics {
    uint64_t requests;          /* finished */
    uint64_t requests_failed;
    uint64_t prompt_tokens;
    uint64_t cached_tokens;
    uint64_t computed_tokens;
    uint64_t output_tokens;
    int64_t  blocks_total;
    int64_t  blocks_used;
    int64_t  blocks_free;
    uint64_t blocks_evicted;
    int32_t  sessions;
    int32_t  queue_depth;       /* waiting (for a slot, a prefix in the works, or memory) */
    int32_t  running;
    int32_t  block_tokens;
    /* added with the batching scheduler (issue 4) */
    int64_t  block_bytes;       /* one block: K and V of block_tokens tokens of every layer
                                   but sliding-window ones (window_chunk_bytes) */
    int64_t  blocks_cached;     /* blocks in the prefix tree (shared by every session) */
    uint64_t steps;             /* forward passes run */
    uint64_t step_tokens;       /* tokens run through them (prefill chunks + decode) */
    /* background canonicalization of finished replies (DESIGN.md §3) */
    int32_t  bg_pending;        /* replies queued or being canonicalized */
    uint64_t bg_jobs;           /* finished (computed, or found nothing to compute) */
    uint64_t bg_tokens;         /* tokens computed in the background */
    uint64_t bg_us;             /* engine time spent on them, microseconds */
    uint64_t busy_us;           /* engine time spent in forward passes, all of them */
    /* constrained decoding (issue 13) */
    uint64_t grammar_masks;     /* token masks computed */
    uint64_t grammar_mask_us;   /* time spent computing them, microseconds */
    /* tiers (issue 10); the disk figures stay 0 without a disk tier */
    uint64_t room_refused;      /* asks for room eviction could not meet: nothing evicted */
    uint64_t preemptions;       /* running requests that gave their blocks back mid-reply
                                   (the pool ran dry) and resumed later */
    uint64_t disk_tokens;       /* cached prompt tokens read from the disk tier */
    uint64_t disk_blocks_read;
    uint64_t disk_blocks_written;
    uint64_t disk_bytes_read;
    uint64_t disk_bytes_written;
    int64_t  disk_blocks;       /* held on disk now */
    int64_t  disk_bytes_used;
    int64_t  disk_bytes_budget;
    uint64_t disk_checksum_failures;   /* blocks found corrupt: discarded, recomputed */
    uint64_t disk_writes_dropped;      /* write-throughs dropped: the writer was behind */
    uint64_t tier_write_failures;      /* blocks the tiers could not write (the medium) */
    uint64_t tier_fetch_failures;      /* blocks listed below RAM that could not be read */
    uint64_t disk_full_events;         /* writes that found the disk full: the budget was
                                          lowered (disk_bytes_budget) to what fits */
    int32_t  tier_writes_pending;      /* blocks on their way down (disk, Redis), and
                                          Redis calls queued, now */
    /* the shared tier in Redis (issue 14); all 0 without one */
    int32_t  redis_up;                 /* 1: connected now */
    uint64_t redis_blocks_read;        /* blocks served from Redis (verified) */
    uint64_t redis_blocks_written;
    uint64_t redis_bytes_read, redis_bytes_written;
    uint64_t redis_round_trips;
    uint64_t redis_failures;           /* calls that failed: down, timeout, garbage */
    uint64_t redis_checksum_failures;  /* values discarded and recomputed */
    /* sliding-window layers (issue 31; all 0 for a model without them): their
     * window chunks (block_tokens positions of every layer of one window),
     * every window size together */
    int64_t  window_chunks_total;
    int64_t  window_chunks_held;       /* by running requests: their windows */
    int64_t  window_chunk_bytes;       /* of all window sizes' chunks of one block */
    int64_t  kv_bytes_held;            /* what the cached tokens take: blocks_used *
                                          block_bytes + the window chunks there */
    /* recurrent layers (issue 32; all 0 for a model without them) */
    int64_t  snapshots;                /* recurrent-state snapshots held in RAM */
    int64_t  snapshot_blocks;          /* the pool blocks they take (within blocks_used) */
    int64_t  snapshot_bytes;           /* of which states and logits (payload) */
    uint64_t snapshots_taken, snapshots_restored, snapshots_evicted;
    uint64_t snapshots_written;        /* to the disk/Redis tier */
    uint64_t snapshots_fetched;        /* read back from it */
    int64_t  live_states;              /* sequences holding recurrent states now */
    int64_t  live_state_bytes;         /* what those states take */
    /* sliding-window layers' chunks in the tiers below RAM (issue 31; 0
     * without a disk/Redis tier or window layers), each chunk a record */
    uint64_t window_chunks_written;    /* written down: the chunk or its block evicted,
                                          written through, a tail */
    uint64_t window_bytes_written;
    uint64_t window_chunks_fetched;    /* read back into RAM (with their block, or into a
                                          block in RAM whose chunk had been evicted) */
    uint64_t window_bytes_read;
    uint64_t window_chunks_missed;     /* needed and neither in RAM nor readable below it
                                          (missing, corrupt): their window is computed again */
} kvc_engine_metrics;

void kvc_engine_get_metrics(kvc_engine *engine, kvc_engine_metrics *out);
/* The context length in use: params.n_ctx, or the model's training context
 * capped by what the KV budget holds (lower than n_ctx_train when capped). */
int32_t kvc_engine_n_ctx(const kvc_engine *engine);
/* The threads each forward pass runs on: params.n_threads, or (0) the online CPUs. */
int32_t kvc_engine_n_threads(const kvc_engine *engine);

/* The chat template in use, for logs ("the model's Jinja chat template, family
 * chatml"). Owned by the engine. */
const char *kvc_engine_template(const kvc_engine *engine);

/* The syntax the chat template writes tool calls in, found by rendering one:
 * "hermes" (<tool_call>...</tool_call>), "llama3-json", "mistral", "harmony",
 * "qwen3-coder-xml" (<tool_call><function=NAME><parameter=P>...). */
const char *kvc_engine_tool_format(const kvc_engine *engine);

/* The model the engine serves (to tokenize, detokenize, name tokens). */
const kvc_model *kvc_engine_model(const kvc_engine *engine);
/* Conversations computed at once (params.n_parallel, its default applied). */
int32_t kvc_engine_n_parallel(const kvc_engine *engine);
/* The chat template given in params (Jinja source or a built-in format's
 * name), else the model's tokenizer.chat_template; NULL when neither (the
 * built-in ChatML). Borrowed: params' or the model's. */
const char *kvc_engine_chat_template(const kvc_engine *engine);

/* The prompt text a chat request renders to, exactly as it will be
 * tokenized (POST /apply-template). Safe from any thread. *prompt is
 * malloc'd. KVC_ERR_INVALID_ARG (a template that fails, e.g. its
 * raise_exception: err has its message), KVC_ERR_NOMEM. */
int kvc_engine_render(kvc_engine *engine, const kvc_request_params *params, char **prompt,
                      char *err, size_t err_size);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* KVCHAT_H */
