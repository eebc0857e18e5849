/* sampler.h - pick the next token from a row of logits.
 *
 * kvc_sampler, kvc_sampler_params and the functions new / free / sample /
 * accept / reset / default_params are declared in include/kvchat.h. This
 * header states their full contract and adds what the library's own parts
 * use (seed constants, parameter checking, the seed in use).
 *
 * The chain is llama.cpp's default order:
 *     penalties -> top-k -> top-p -> min-p -> temperature -> draw
 * top-p and min-p see the logits before temperature (as in llama.cpp), so
 * temperature changes how the surviving tokens are weighted, not which survive.
 *
 * kvc_sampler_params, field by field (defaults from kvc_sampler_default_params):
 *   temperature        0.8   <= 0: greedy, the argmax of the penalized logits
 *                            with the lowest id among equals; with no penalty
 *                            in effect exactly the argmax of the logits given.
 *                            Greedy draws no random number.
 *   top_k              40    keep the k best; <= 0 or >= n_vocab: off. Ties at
 *                            the boundary keep the lower id.
 *   top_p              0.95  keep the shortest best-first prefix whose
 *                            probability (temperature 1, over the top-k set)
 *                            reaches top_p; >= 1: off; <= 0: the best token only.
 *   min_p              0.05  keep tokens with p >= min_p * p_max (logit >=
 *                            max + log(min_p)); <= 0: off; >= 1: the best only.
 *   repeat_penalty     1.0   a token in the window has its logit l turned into
 *                            l / penalty if l > 0, else l * penalty; 1: off; > 0.
 *   repeat_last_n      64    the window: the last n accepted tokens; 0: no
 *                            penalties; -1: every token accepted since reset.
 *   presence_penalty   0     subtracted once from each token in the window.
 *   frequency_penalty  0     subtracted once per occurrence in the window.
 *   seed               KVC_SEED_DEFAULT; KVC_SEED_RANDOM draws one from the OS.
 *
 * Determinism: for the same params, seed, accepted tokens and logits, the
 * same token comes out, on any machine: the PRNG is our own xoshiro256**
 * seeded through splitmix64, candidates are ordered totally (logit, then id),
 * and sums are in double in a fixed order.
 *
 * Memory: kvc_sampler_new allocates all scratch up front, sized by the
 * params: 16 bytes per top-k candidate (640 bytes for the defaults), or per
 * vocabulary entry when top-k is off; 16 more per entry when a penalty is set
 * (2.4 MB at 152k). sample and accept allocate nothing. A sampler is used by
 * one thread at a time.
 *
 * Cost per token at n_vocab 152k: the argmax or top-k scan (one comparison
 * per entry, O(n log k) worst) dominates the default chain; with top-k off,
 * top-p pops a heap only until its mass is reached (O(n + len log n)).
 *
 * kvc_sampler_new    copies params; NULL when kvc_sampler_params_check fails,
 *                    n_vocab < 1, or memory runs out.
 * kvc_sampler_sample reads logits[0, n_vocab) (finite or -INFINITY; all
 *                    -INFINITY gives token 0) and never writes them. It does
 *                    not accept the token: call kvc_sampler_accept with what
 *                    is actually appended. Returns -1 if s or logits is NULL.
 * kvc_sampler_accept records a token for the penalties (prompt tokens may be
 *                    accepted too; llama.cpp does not by default). Ids outside
 *                    [0, n_vocab) are ignored; a no-op when no penalty is set.
 * kvc_sampler_reset  forgets the history and restarts the random sequence
 *                    from the seed: a reset sampler repeats a new one.
 * kvc_sampler_free   accepts NULL. */
#ifndef KVC_SAMPLER_H
#define KVC_SAMPLER_H

#include "common.h"

/* kvc_sampler_params.seed: draw a seed from the OS in kvc_sampler_new. */
#define KVC_SEED_RANDOM UINT64_MAX
/* The default seed: fixed, so that runs repeat unless asked otherwise. */
#define KVC_SEED_DEFAULT 0xC0FFEEu

/* KVC_OK if p is usable, else KVC_ERR_INVALID_ARG with err (may be NULL)
 * naming the field and value ("repeat_penalty = 0: must be > 0"). Rejected:
 * NaN anywhere, infinite temperature or penalties, repeat_penalty <= 0,
 * repeat_last_n < -1. Out-of-range top_p / min_p / top_k mean "off" or "best
 * only" as above, not errors; a server enforcing OpenAI's ranges checks them
 * itself. */
int kvc_sampler_params_check(const kvc_sampler_params *p, kvc_err *err);

/* The seed in use (the drawn one for KVC_SEED_RANDOM), to report or replay;
 * 0 for NULL. */
uint64_t kvc_sampler_seed(const kvc_sampler *s);

/* ---------------------------------------------------------------- bias and masks
 *
 * With either set, sample works on a copy of the logits (one n_vocab buffer,
 * allocated by the first set call) in this order:
 *     logit_bias -> penalties -> mask -> the chain above
 * (llama.cpp applies logit_bias first too). With neither set, sample is
 * exactly what it was: the same arithmetic, bit for bit. */

typedef struct kvc_logit_bias {
    int32_t token;
    float   bias;               /* added to the logit; -INFINITY bans the token */
} kvc_logit_bias;

/* Replace the biases with bias[0, n) (copied; an id listed twice gets the
 * sum); n = 0 clears them. KVC_ERR_INVALID_ARG naming the entry for an id
 * outside [0, n_vocab) or a NaN or +inf bias (nothing changed then);
 * KVC_ERR_NOMEM. OpenAI's range [-100, 100] is the server's to check. */
int kvc_sampler_set_logit_bias(kvc_sampler *s, const kvc_logit_bias *bias, int32_t n, kvc_err *err);

/* Allow only the tokens whose bit is set in mask (kvc_mask_words(n_vocab)
 * words, bit (id & 31) of word id >> 5, as kvc_gmatch_mask writes it): the
 * others get -INFINITY before the chain runs, greedy or sampled. Borrowed:
 * read by each sample until replaced or cleared with NULL, so a caller may
 * refill the same buffer every step. When every allowed token has logit
 * -INFINITY (a bias banned them all) sample returns the lowest allowed id;
 * when the mask allows nothing it returns -1. KVC_ERR_NOMEM. */
int kvc_sampler_set_mask(kvc_sampler *s, const uint32_t *mask);

/* ---------------------------------------------------------------- logprobs */

typedef struct kvc_logprob {
    int32_t token;
    float   logprob;
} kvc_logprob;

/* Log-softmax over logits[0, n_vocab): returns log p(token) (-INFINITY for a
 * -INFINITY logit, NAN for a token out of range) and writes the top_n most
 * likely tokens, best first, ties to the lower id, into top (top_n >= 0
 * entries; fewer are written when n_vocab < top_n; returns their count in
 * *n_top when n_top is not NULL). In double, max subtracted, summed in index
 * order: the same logits give the same numbers everywhere.
 *
 * Which logits: kvchat reports the model's own distribution, the raw logits
 * before bias, penalties, mask and temperature. llama-server does the same
 * by default (n_probs; post_sampling_probs=true switches to the sampler's
 * candidates), and so does vLLM (logprobs_mode "raw_logprobs", the default).
 * So logprobs agree with `kvchat eval` for the same tokens. */
float kvc_logprobs(const float *logits, int32_t n_vocab, int32_t token, kvc_logprob *top,
                   int32_t top_n, int32_t *n_top);

#endif
