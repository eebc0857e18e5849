/* fuzz_grammar_input.h - the input both grammar fuzz targets read
 * (fuzz_grammar.c, fuzz_grammar_cost.c): a first byte choosing the mode
 * (even: the text is a JSON schema; odd: grammar text), then the text up to
 * a NUL, then bytes that drive a walk over the demo vocabulary. */
#ifndef KVC_FUZZ_GRAMMAR_INPUT_H
#define KVC_FUZZ_GRAMMAR_INPUT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "grammar.h"

typedef struct grammar_input {
    bool           schema;     /* the text is a JSON schema, else grammar text */
    const char    *text;       /* not NUL-terminated: len bytes */
    size_t         len;
    const uint8_t *drive;      /* the bytes after the text's NUL (n_drive) */
    size_t         n_drive;
} grammar_input;

/* data[0, size), size >= 1, cut into its parts (borrowed from data). */
static grammar_input grammar_input_split(const uint8_t *data, size_t size)
{
    const uint8_t *text = data + 1;
    const uint8_t *nul = memchr(text, 0, size - 1);
    const uint8_t *drive = nul ? nul + 1 : data + size;
    return (grammar_input){ (data[0] & 1) == 0, (const char *)text,
                            nul ? (size_t)(nul - text) : size - 1, drive,
                            (size_t)(data + size - drive) };
}

/* Compile the input's text as its mode says (kvc_grammar_from_schema or
 * kvc_grammar_parse): their status, *g and *err. */
static int grammar_input_compile(const grammar_input *in, kvc_grammar **g, kvc_err *err)
{
    return in->schema ? kvc_grammar_from_schema(in->text, in->len, g, err)
                      : kvc_grammar_parse(in->text, in->len, g, err);
}

#endif
