/* jinja_lex.c - Jinja2 source to tokens, with the whitespace rules of
 * trim_blocks=True and lstrip_blocks=True as transformers sets them (the
 * rules of jinja2's lexer: a tag's "-" strips all whitespace on that side,
 * "+" keeps it; lstrip removes the spaces before a block or comment tag that
 * starts a line; trim removes the newline after one). */
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"


typedef struct lexer {
    jctx *c;
    const char *s;    /* normalized source */
    size_t n, pos;
    int line;
    tok *toks;
    size_t nt, cap;
} lexer;

static tok *push(lexer *L, int type, int line)
{
    jgrow(L->c, (void **)&L->toks, &L->cap, L->nt, sizeof(tok), 256);
    tok *t = &L->toks[L->nt++];
    memset(t, 0, sizeof(*t));
    t->type = (uint8_t)type;
    t->line = line;
    return t;
}

static int count_nl(const char *p, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

static bool is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }
static bool is_name0(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static void put_u8(char *o, size_t *k, unsigned u) { *k += ju8_put(o + *k, u); }

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A string literal with Python's unicode-escape decoding. */
static void lex_string(lexer *L, int line)
{
    char q = L->s[L->pos];
    size_t start = ++L->pos;
    while (L->pos < L->n && L->s[L->pos] != q) {
        if (L->s[L->pos] == '\\' && L->pos + 1 < L->n)
            L->pos++;
        L->pos++;
    }
    if (L->pos >= L->n)
        jfail(L->c, line, "unexpected end of string literal");
    const char *p = L->s + start;
    size_t n = L->pos - start;
    L->pos++;
    char *o = jalloc(L->c, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 >= n) { o[k++] = p[i]; continue; }
        char e = p[++i];
        int digits = 0;
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                unsigned u = 0;
                int m = 0;
                while (m < 3 && i < n && p[i] >= '0' && p[i] <= '7') { u = u * 8 + (unsigned)(p[i] - '0'); i++; m++; }
                i--;
                put_u8(o, &k, u);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (digits) {
            unsigned u = 0;
            for (int d = 0; d < digits; d++) {
                if (i + 1 >= n || hexval(p[i + 1]) < 0)
                    jfail(L->c, line, "truncated \\%c escape in a string literal", e);
                u = u * 16 + (unsigned)hexval(p[++i]);
            }
            if (u > 0x10FFFF)
                jfail(L->c, line, "illegal Unicode character in a string literal");
            put_u8(o, &k, u);
        }
    }
    o[k] = 0;
    tok *t = push(L, T_STRING, line);
    t->p = o;
    t->n = k;
}

static const char *const ops2[] = { "//", "**", "==", "!=", ">=", "<=" };

/* Tokens inside {{ }} or {% %} up to the end delimiter. Returns the
 * position just past the delimiter (and its whitespace control). */
static void lex_tag(lexer *L, bool block, bool *line_starting)
{
    int depth = 0;
    const char *end = block ? "%}" : "}}";
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->n)
            jfail(L->c, L->line, "unexpected end of template, expected '%s'", end);
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0) {
            int strip = 0;
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && !memcmp(p + 1, end, 2))
                strip = p[0] == '-' ? 1 : 2;
            if (strip || (left >= 2 && !memcmp(p, end, 2))) {
                push(L, block ? T_BLOCK_END : T_VAR_END, L->line);
                L->pos += strip ? 3 : 2;
                *line_starting = false;
                if (strip == 1) {
                    while (L->pos < L->n && is_ws(L->s[L->pos])) {
                        if (L->s[L->pos] == '\n') L->line++;
                        *line_starting = L->s[L->pos] == '\n';
                        L->pos++;
                    }
                } else if (!strip && block && L->pos < L->n && L->s[L->pos] == '\n') {
                    L->pos++;         /* trim_blocks */
                    L->line++;
                    *line_starting = true;
                }
                return;
            }
        }
        int line = L->line;
        if (is_name0(*p)) {
            size_t k = 1;
            while (k < left && (is_name0(p[k]) || is_digit(p[k])))
                k++;
            tok *t = push(L, T_NAME, line);
            t->p = p;
            t->n = k;
            L->pos += k;
        } else if (is_digit(*p)) {
            size_t k = 0;
            bool fl = false;
            while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
            if (k + 1 < left && p[k] == '.' && is_digit(p[k + 1]) &&
                !(L->pos > 0 && L->s[L->pos - 1] == '.')) {
                fl = true;
                k++;
                while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
            }
            if (k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1;
                if (e < left && (p[e] == '+' || p[e] == '-')) e++;
                if (e < left && is_digit(p[e])) {
                    fl = true;
                    k = e;
                    while (k < left && is_digit(p[k])) k++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t i = 0; i < k && m + 1 < sizeof(buf); i++)
                if (p[i] != '_') buf[m++] = p[i];
            buf[m] = 0;
            tok *t = push(L, fl ? T_FLOAT : T_INT, line);
            if (fl) t->f = strtod(buf, NULL);
            else t->i = strtoll(buf, NULL, 10);
            L->pos += k;
        } else if (*p == '\'' || *p == '"') {
            lex_string(L, line);
            L->line += count_nl(p, (size_t)(L->s + L->pos - p));
        } else {
            size_t k = 1;
            for (size_t i = 0; i < KVC_ARRAY_LEN(ops2); i++)
                if (left >= 2 && !memcmp(p, ops2[i], 2)) k = 2;
            if (k == 1 && !strchr("+-/*%~[](){}><=.:|,;", *p))
                jfail(L->c, line, "unexpected character '%c'", *p);
            if (*p == '(' || *p == '[' || *p == '{') depth++;
            if (*p == ')' || *p == ']' || *p == '}') {
                if (depth == 0)
                    jfail(L->c, line, "unexpected '%c'", *p);
                depth--;
            }
            tok *t = push(L, T_OP, line);
            t->p = p;
            t->n = k;
            L->pos += k;
        }
    }
}

static void emit_data(lexer *L, const char *p, size_t n, int line)
{
    if (!n)
        return;
    tok *t = push(L, T_DATA, line);
    t->p = p;
    t->n = n;
}

static void lex(lexer *L)
{
    bool line_starting = true;
    while (L->pos < L->n) {
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        size_t q = 0;
        while (q + 1 < left && !(p[q] == '{' && (p[q + 1] == '{' || p[q + 1] == '%' || p[q + 1] == '#')))
            q++;
        if (q + 1 >= left) {                  /* no more tags */
            emit_data(L, p, left, L->line);
            L->pos = L->n;
            break;
        }
        char kind = p[q + 1];
        char sign = q + 2 < left && (p[q + 2] == '-' || p[q + 2] == '+') ? p[q + 2] : 0;
        size_t tn = q;
        if (sign == '-') {
            while (tn > 0 && is_ws(p[tn - 1]))
                tn--;
        } else if (sign != '+' && kind != '{') {   /* lstrip_blocks */
            size_t l = tn;
            while (l > 0 && p[l - 1] != '\n')
                l--;
            bool only_ws = l < tn;
            for (size_t i = l; i < tn; i++)
                if (!is_ws(p[i])) only_ws = false;
            if ((l > 0 || line_starting) && only_ws)
                tn = l;
        }
        emit_data(L, p, tn, L->line);
        L->line += count_nl(p, q);
        L->pos += q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = L->s + L->pos;
            const char *f = NULL;
            for (const char *x = e; x + 1 < L->s + L->n; x++)
                if (x[0] == '#' && x[1] == '}') { f = x; break; }
            if (!f)
                jfail(L->c, L->line, "missing end of comment tag");
            L->line += count_nl(e, (size_t)(f - e));
            L->pos = (size_t)(f - L->s) + 2;
            line_starting = false;
            if (f > e && f[-1] == '-') {
                while (L->pos < L->n && is_ws(L->s[L->pos])) {
                    if (L->s[L->pos] == '\n') L->line++;
                    line_starting = L->s[L->pos] == '\n';
                    L->pos++;
                }
            } else if (!(f > e && f[-1] == '+') && L->pos < L->n && L->s[L->pos] == '\n') {
                L->pos++;
                L->line++;
                line_starting = true;
            }
            continue;
        }
        push(L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, L->line);
        lex_tag(L, kind == '%', &line_starting);
    }
    push(L, T_EOF, L->line);
}


tok *jinja_lex(jctx *c, const char *src, size_t len, size_t *n_out)
{
    /* newlines normalized to \n; one trailing newline dropped (keep_trailing_newline=False) */
    char *s = jalloc(c, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    lexer L = { .c = c, .s = s, .n = n, .line = 1 };
    lex(&L);
    *n_out = L.nt;
    return L.toks;
}
