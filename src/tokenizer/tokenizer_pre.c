/* tokenizer_pre.c - byte-level BPE pre-tokenizers: the regexes each
 * tokenizer.ggml.pre name stands for, and the splitter that applies them.
 *
 * A pre-tokenizer is a list of regexes applied in turn, as llama.cpp applies
 * them: the first splits the text into pieces (every match is a piece, and so
 * is every stretch between matches), each next regex splits every piece again.
 * Matching runs inside one piece: its end is the end of the subject, so a
 * lookahead there sees nothing. The regex strings and the name table are
 * llama.cpp's (src/llama-vocab.cpp), which come from the models'
 * tokenizer.json, with (?i:...) spelled out as character classes.
 *
 * PCRE2 runs them with PCRE2_UTF | PCRE2_UCP, so \p{L}, \p{N}, \s are Unicode
 * classes, and with PCRE2_DOLLAR_ENDONLY, so $ is the end as in llama.cpp's
 * std::regex (ECMAScript). Patterns are compiled, and JIT-compiled when the
 * platform allows, once at load; each split call makes its own match data, so
 * one tokenizer serves any number of threads. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

#define PRE_MAX_REGEX 8

struct tok_pretok {
    int         n;                      /* regexes in use */
    pcre2_code *re[PRE_MAX_REGEX];
    uint32_t    max_pairs;              /* ovector pairs the largest needs */
};

/* ------------------------------------------------------------ regex sets */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2  RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_STARCODER "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CJK "[一-龥ࠀ-一가-퟿]+"
#define RE_ASCII_PUNCT "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]"

static const char *const set_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL };
static const char *const set_gpt2[] = { RE_GPT2, NULL };
static const char *const set_llama3[] = { RE_LLAMA3, NULL };
static const char *const set_qwen2[] = { RE_QWEN2, NULL };
static const char *const set_qwen35[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_jais2[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
    "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)"
    "|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    NULL };
static const char *const set_deepseek_llm[] = {
    "[\r\n]",
    /* "\s?[A-Za-zµÀ-ÖØ-ö...]+": letters of scripts with case, written as escapes
       because an editor could normalise them (U+2126 OHM SIGN is not U+03A9) */
    "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA\xC6\xBC-"
    "\xC6\xBF\xC7\x84-\xCA\x93\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3\xCD\xB6\xCD\xB7\xCD\xBB-"
    "\xCD\xBD\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A\xCE\x8C\xCE\x8E-\xCE\xA1\xCE\xA3-"
    "\xCF\xB5\xCF\xB7-\xD2\x81\xD2\x8A-\xD4\xAF\xD4\xB1-\xD5\x96\xE1\x82\xA0-"
    "\xE1\x83\x85\xE1\x8E\xA0-\xE1\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-"
    "\xE1\xB2\xBA\xE1\xB2\xBD-\xE1\xB2\xBF\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-"
    "\xE1\xB5\xB7\xE1\xB5\xB9-\xE1\xB6\x9A\xE1\xB8\x80-\xE1\xBC\x95\xE1\xBC\x98-"
    "\xE1\xBC\x9D\xE1\xBC\xA0-\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D\xE1\xBD\x90-"
    "\xE1\xBD\x97\xE1\xBD\x99\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-\xE1\xBD\xBD\xE1\xBE\x80"
    "-\xE1\xBE\xB4\xE1\xBE\xB6-\xE1\xBE\xBC\xE1\xBE\xBE\xE1\xBF\x82-\xE1\xBF\x84\xE1\xBF\x86"
    "-\xE1\xBF\x8C\xE1\xBF\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1\xBF\xA0-"
    "\xE1\xBF\xAC\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-\xE1\xBF\xBC\xE2\x84\x82\xE2\x84\x87"
    "\xE2\x84\x8A-\xE2\x84\x93\xE2\x84\x95\xE2\x84\x99-\xE2\x84\x9D\xE2\x84\xA4\xE2\x84\xA6"
    "\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84\xAD\xE2\x84\xAF-\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC"
    "-\xE2\x84\xBF\xE2\x85\x85-\xE2\x85\x89\xE2\x85\x8E\xE2\x86\x83\xE2\x86\x84\xE2\xB0\x80"
    "-\xE2\xB1\xBB\xE2\xB1\xBE-\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE\xE2\xB3\xB2\xE2\xB3\xB3"
    "\xEA\x99\x80-\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B\xEA\x9C\xA2-\xEA\x9D\xAF\xEA\x9D\xB1"
    "-\xEA\x9E\x87\xEA\x9E\x8B-\xEA\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-"
    "\xEF\xAC\x86\xEF\xAC\x93-\xEF\xAC\x97\xEF\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-"
    "\xEF\xBD\x9A\xF0\x90\x90\x80-\xF0\x90\x91\x8F\xF0\x90\x92\xB0-\xF0\x90\x93\x93\xF0\x90\x93\x98"
    "-\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2\xF0\x90\xB3\x80-\xF0\x90\xB3\xB2\xF0\x91\xA2\xA0"
    "-\xF0\x91\xA3\x9F\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    RE_CJK,
    "\\p{N}+",
    NULL };
static const char *const set_deepseek3[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    RE_ASCII_PUNCT "[A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_youtu[] = {
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RE_CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACTIONS "?"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_deepseek_coder[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}", NULL };
static const char *const set_falcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL };
static const char *const set_starcoder[] = { "\\p{N}", RE_STARCODER, NULL };
static const char *const set_poro[] = { " ?[^(\\s|.,!?…。，、।۔،)]+", NULL };
static const char *const set_viking[] = { " ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}", NULL };
static const char *const set_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_chameleon[] = {
    "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
    "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_STARCODER, NULL };
static const char *const set_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACTIONS "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_granite_emb_multi[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+" RE_CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*" RE_CONTRACTIONS "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_bailingmoe[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_seed_coder[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_laguna[] = { "[^\\n]+|[\\n]+", RE_QWEN2, NULL };
static const char *const set_exaone_moe[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const set_minicpm5[] = {
    "\\p{N}{1,3}",
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };

/* ------------------------------------------------------------ name table */

enum { PRE_IGNORE_MERGES = 1, PRE_ADD_BOS = 2, PRE_UNSUPPORTED = 4 };

typedef struct pre_entry {
    const char         *names;      /* '|'-separated tokenizer.ggml.pre values */
    const char *const  *set;        /* NULL for names we know but do not run */
    int                 flags;
} pre_entry;

static const pre_entry pre_table[] = {
    { "default", set_default, 0 },
    { "gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert"
      "|jina-v1-en|jina-v2-code|roberta-bpe|mpt|olmo|jais|trillion|granite-docling|exaone4",
      set_gpt2, 0 },
    { "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano",
      set_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS },
    { "dbrx|smaug-bpe|glm4|chatglm-bpe", set_llama3, 0 },
    { "jais-2", set_jais2, 0 },
    { "qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2",
      set_qwen2, 0 },
    { "qwen35", set_qwen35, 0 },
    { "deepseek-llm", set_deepseek_llm, 0 },
    { "deepseek-coder", set_deepseek_coder, 0 },
    { "deepseek-v3|hunyuan-dense|joyai-llm", set_deepseek3, 0 },
    { "youtu", set_youtu, PRE_IGNORE_MERGES },
    { "falcon", set_falcon, 0 },
    { "starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", set_starcoder, 0 },
    { "poro-chat|bloom|gpt3-finnish", set_poro, 0 },
    { "viking", set_viking, 0 },
    { "tekken", set_tekken, PRE_IGNORE_MERGES | PRE_ADD_BOS },
    { "chameleon", set_chameleon, PRE_ADD_BOS },
    { "gpt-4o|llama4|kanana2|talkie|minimax-m2", set_gpt4o, 0 },
    { "granite-embed-multi-97m", set_granite_emb_multi, PRE_IGNORE_MERGES },
    { "bailingmoe|bailingmoe2|llada-moe", set_bailingmoe, 0 },
    { "seed-coder", set_seed_coder, 0 },
    { "laguna", set_laguna, 0 },
    { "exaone-moe", set_exaone_moe, 0 },
    { "minicpm5", set_minicpm5, PRE_IGNORE_MERGES },
    /* llama.cpp runs these with hand-written splitters or without byte encoding */
    { "kimi-k2|afmoe|tiny_aya|cohere2moe|superbpe|gemma4|granite-embed-multi-311m"
      "|sarvam-moe|whitespace", NULL, PRE_UNSUPPORTED },
};

/* True when `name` is one of the '|'-separated names in `list`. */
static bool name_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0)
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

void kvc_pretok_free(tok_pretok *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        pcre2_code_free(p->re[i]);
    free(p);
}

static int compile_set(const char *const *set, tok_pretok *p, kvc_err *err)
{
    for (; *set; set++) {
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)*set, PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY,
                                       &ec, &eo, NULL);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof(msg));
            return kvc_fail(err, KVC_ERR_FORMAT, "pre-tokenizer regex at %zu: %s",
                            (size_t)eo, (const char *)msg);
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* the interpreter runs if this fails */
        uint32_t caps = 0;
        pcre2_pattern_info(re, PCRE2_INFO_CAPTURECOUNT, &caps);
        if (caps + 1 > p->max_pairs)
            p->max_pairs = caps + 1;
        p->re[p->n++] = re;
    }
    return KVC_OK;
}

int kvc_pretok_new(const char *name, tok_pretok **out, bool *ignore_merges,
                   bool *add_bos_default, kvc_err *err)
{
    *out = NULL;
    if (!name || !*name)
        name = "default";
    const pre_entry *e = NULL;
    for (size_t i = 0; i < KVC_ARRAY_LEN(pre_table) && !e; i++)
        if (name_in_list(pre_table[i].names, name))
            e = &pre_table[i];
    if (!e || !e->set)
        return kvc_fail(err, KVC_ERR_UNSUPPORTED,
                        "tokenizer.ggml.pre '%s': pre-tokenizer not supported", name);
    tok_pretok *p = calloc(1, sizeof(*p));
    if (!p)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    int rc = compile_set(e->set, p, err);
    if (rc != KVC_OK) {
        kvc_pretok_free(p);
        return rc;
    }
    *ignore_merges = (e->flags & PRE_IGNORE_MERGES) != 0;
    *add_bos_default = (e->flags & PRE_ADD_BOS) != 0;
    *out = p;
    return KVC_OK;
}

/* ------------------------------------------------------------ splitting */

/* A growable list of piece end offsets; piece i is [end[i-1], end[i]). */
typedef struct ends {
    size_t *a;
    size_t  n, cap;
} ends;

static int ends_push(ends *e, size_t v)
{
    if (!kvc_grow((void **)&e->a, &e->cap, e->n, sizeof(*e->a)))
        return KVC_ERR_NOMEM;
    e->a[e->n++] = v;
    return KVC_OK;
}

/* Split subj[s, e) by one regex, appending piece ends to out. A regex that
 * cannot finish (PCRE2 resource limits) leaves the rest of the piece whole. */
static int split_piece(pcre2_code *re, pcre2_match_data *md, const char *subj,
                       size_t s, size_t e, ends *out)
{
    PCRE2_SPTR p = (PCRE2_SPTR)(subj + s);
    size_t len = e - s, off = 0, gap = 0;
    while (off < len) {
        int rc = pcre2_match(re, p, len, off, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, p, len, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc < 0)                  /* no match, or a resource limit */
            break;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t m0 = ov[0], m1 = ov[1];
        if (m1 <= m0) {              /* empty match: step over one character */
            if (m0 >= len)
                break;
            off = m0 + (size_t)kvc_utf8_unit(subj + s + m0, len - m0);
            continue;
        }
        if (m0 > gap && ends_push(out, s + m0) != KVC_OK)
            return KVC_ERR_NOMEM;
        if (ends_push(out, s + m1) != KVC_OK)
            return KVC_ERR_NOMEM;
        gap = off = m1;
    }
    if (gap < len && ends_push(out, e) != KVC_OK)
        return KVC_ERR_NOMEM;
    return KVC_OK;
}

/* Valid UTF-8 copy of text for the regex engine: each invalid byte becomes
 * U+FFFD. map[j] is the text offset of the character starting at subj[j]
 * (and map[*slen] = len). */
static int sanitize(const char *text, size_t len, char **subj, size_t **map, size_t *slen)
{
    char *s = malloc(len * 3 + 1);
    size_t *m = malloc((len * 3 + 1) * sizeof(*m));
    if (!s || !m) {
        free(s);
        free(m);
        return KVC_ERR_NOMEM;
    }
    size_t j = 0;
    for (size_t i = 0; i < len;) {
        int n = kvc_utf8_decode(text + i, len - i, NULL);
        m[j] = i;
        if (n > 0) {
            memcpy(s + j, text + i, (size_t)n);
            j += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(s + j, KVC_UTF8_REPLACEMENT, 3);
            j += 3;
            i += 1;
        }
    }
    m[j] = len;
    *subj = s;
    *map = m;
    *slen = j;
    return KVC_OK;
}

/* Run every regex of p over subj[0, slen), leaving the final pieces in *cur. */
static int split_all(const tok_pretok *p, const char *subj, size_t slen, ends *cur)
{
    ends next = {0};
    int rc = ends_push(cur, slen);
    pcre2_match_data *md = pcre2_match_data_create(p->max_pairs ? p->max_pairs : 1, NULL);
    if (!md)
        rc = KVC_ERR_NOMEM;
    for (int r = 0; r < p->n && rc == KVC_OK; r++) {
        next.n = 0;
        size_t start = 0;
        for (size_t i = 0; i < cur->n && rc == KVC_OK; i++) {
            rc = split_piece(p->re[r], md, subj, start, cur->a[i], &next);
            start = cur->a[i];
        }
        ends tmp = *cur;
        *cur = next;
        next = tmp;
    }
    pcre2_match_data_free(md);
    free(next.a);
    return rc;
}

int kvc_pretok_split(const tok_pretok *p, const char *text, size_t len,
                     tok_word_fn word, void *ctx)
{
    if (len == 0)
        return KVC_OK;
    char *subj = NULL;
    size_t *map = NULL, slen = len;
    if (!kvc_utf8_valid(text, len) && sanitize(text, len, &subj, &map, &slen) != KVC_OK)
        return KVC_ERR_NOMEM;
    ends cur = {0};
    int rc = split_all(p, subj ? subj : text, slen, &cur);
    size_t start = 0;
    for (size_t i = 0; i < cur.n && rc == KVC_OK; i++) {
        size_t end = cur.a[i];
        rc = word(ctx, map ? map[start] : start, map ? map[end] : end);
        start = end;
    }
    free(cur.a);
    free(subj);
    free(map);
    return rc;
}
