/* test_grammar_schema.c - JSON schema -> grammar -> token masks, end to end.
 *
 * For each of 26 schemas and the vocabularies of the random-weight models
 * (byte-level BPE and SentencePiece), random walks over the tokens the mask
 * allows run until an end-of-generation token is allowed and taken; the
 * detokenized output must parse (cJSON) and validate against the schema,
 * checked by a small validator here (patterns with PCRE2) and, when the
 * system Python has jsonschema (python3-jsonschema), by it as well. Along the
 * way the mask is checked against the matcher: sampled allowed tokens are
 * accepted, sampled refused ones are refused. Unsupported features must fail
 * with an error naming them. Needs nothing from ../shared. */
#include "test.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "gguf.h"
#include "grammar.h"
#include "model_gen.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------- schemas */

static const char *const schemas[] = {
    /* 0 flat, required */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    /* 1 nested objects */
    "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
    "\"profile\":{\"type\":\"object\",\"properties\":{\"bio\":{\"type\":\"string\",\"maxLength\":12}},\"required\":[\"bio\"]}},"
    "\"required\":[\"id\",\"profile\"]}},\"required\":[\"user\"]}",
    /* 2 array of objects with bounds */
    "{\"type\":\"array\",\"minItems\":1,\"maxItems\":3,\"items\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},"
    "\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"]}}",
    /* 3 enums */
    "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"n\":{\"enum\":[1,2,3,null,true]}},"
    "\"required\":[\"color\",\"n\"]}",
    /* 4 anyOf */
    "{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":5},{\"type\":\"integer\"},"
    "{\"type\":\"null\"}]}},\"required\":[\"v\"]}",
    /* 5 $ref into $defs */
    "{\"$defs\":{\"addr\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\","
    "\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"zip\"]}},\"type\":\"object\",\"properties\":{\"home\":"
    "{\"$ref\":\"#/$defs/addr\"},\"work\":{\"$ref\":\"#/$defs/addr\"}},\"required\":[\"home\"]}",
    /* 6 recursion through $ref (a tree) */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
    "\"maxItems\":2,\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
    /* 7 all optional */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"null\"}}}",
    /* 8 string lengths */
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":3},\"note\":"
    "{\"type\":\"string\",\"minLength\":2}},\"required\":[\"code\",\"note\"]}",
    /* 9 patterns */
    "{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2,3}-\\\\d{3}(x|y)?$\"},"
    "\"tag\":{\"type\":\"string\",\"pattern\":\"ab+\"}},\"required\":[\"sku\",\"tag\"]}",
    /* 10 formats */
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{\"type\":\"string\","
    "\"format\":\"date-time\"},\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"h\":{\"type\":\"string\",\"format\":\"time\"}},"
    "\"required\":[\"d\",\"t\",\"u\",\"h\"]}",
    /* 11 integer ranges */
    "{\"type\":\"object\",\"properties\":{\"pct\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":100},\"neg\":{\"type\":"
    "\"integer\",\"minimum\":-250,\"exclusiveMaximum\":-3},\"big\":{\"type\":\"integer\",\"exclusiveMinimum\":999}},"
    "\"required\":[\"pct\",\"neg\",\"big\"]}",
    /* 12 type lists */
    "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":[\"string\",\"null\"]},\"n\":{\"type\":[\"integer\",\"boolean\"]}},"
    "\"required\":[\"s\",\"n\"]}",
    /* 13 const */
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"event\"},\"v\":{\"const\":{\"a\":[1,2]}}},"
    "\"required\":[\"kind\",\"v\"]}",
    /* 14 tuple */
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"boolean\"}],"
    "\"items\":false,\"minItems\":2}",
    /* 15 additionalProperties as a schema */
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
    /* 16 allOf of objects through definitions */
    "{\"definitions\":{\"base\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]}},"
    "\"allOf\":[{\"$ref\":\"#/definitions/base\"},{\"type\":\"object\",\"properties\":{\"label\":{\"type\":\"string\"}},"
    "\"required\":[\"label\"]}]}",
    /* 17 oneOf with a discriminator */
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"type\":{\"const\":\"circle\"},\"r\":{\"type\":\"number\"}},"
    "\"required\":[\"type\",\"r\"],\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"type\":"
    "{\"const\":\"rect\"},\"w\":{\"type\":\"number\"},\"h\":{\"type\":\"number\"}},\"required\":[\"type\",\"w\",\"h\"],"
    "\"additionalProperties\":false}]}",
    /* 18 nullable (OpenAPI) */
    "{\"type\":\"object\",\"properties\":{\"maybe\":{\"type\":\"integer\",\"nullable\":true}},\"required\":[\"maybe\"]}",
    /* 19 json_object */
    "{\"type\":\"object\"}",
    /* 20 scalars */
    "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"score\":{\"type\":\"number\"},\"none\":"
    "{\"type\":\"null\"}},\"required\":[\"ok\",\"score\",\"none\"]}",
    /* 21 unicode names, escapes in enum values */
    "{\"type\":\"object\",\"properties\":{\"na\xc3\xafve \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\":{\"enum\":[\"a\\\"b\","
    "\"line\\nbreak\",\"emoji \xf0\x9f\x98\x80\",\"back\\\\slash\"]},\"free\":{\"type\":\"string\"}},"
    "\"required\":[\"na\xc3\xafve \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\",\"free\"]}",
    /* 22 arrays of arrays */
    "{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"array\",\"maxItems\":3,\"items\":{\"type\":\"array\","
    "\"minItems\":2,\"maxItems\":2,\"items\":{\"type\":\"number\"}}}},\"required\":[\"m\"]}",
    /* 23 any value */
    "{}",
    /* 24 a tool call as forced by tool_choice */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]},\"days\":{\"type\":\"integer\","
    "\"minimum\":1,\"maximum\":14}},\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}",
    /* 25 nested quantifiers over groups that may match nothing (issue 30) */
    "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"^(a*)*b$\"},"
    "\"q\":{\"type\":\"string\",\"pattern\":\"^(xy?)+(a?)+$\"}},\"required\":[\"p\",\"q\"]}",
    /* 26 the other formats clients write (issue 28) */
    "{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\",\"format\":\"email\"},\"i4\":{\"type\":"
    "\"string\",\"format\":\"ipv4\"},\"i6\":{\"type\":\"string\",\"format\":\"ipv6\"},\"h\":{\"type\":\"string\","
    "\"format\":\"idn-hostname\"},\"u\":{\"type\":\"string\",\"format\":\"uri\"},\"p\":{\"type\":\"string\","
    "\"format\":\"duration\"}},\"required\":[\"e\",\"i4\",\"i6\",\"h\",\"u\",\"p\"],\"additionalProperties\":false}",
    /* 27 what zod 4.x's toJSONSchema writes (npm zod, z.object of z.number().int(),
     * .int().positive(), z.email(), z.uuid(), z.iso.datetime(), z.url(), z.iso.date(),
     * z.iso.time(), z.iso.duration(), z.ipv4(), z.ipv6(), z.hostname(),
     * z.string().min(1).email()): bounds of +-(2^53-1), formats beside patterns
     * (lookaheads in some), a length beside a format */
    "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"type\":\"object\",\"properties\":{\""
    "n\":{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991},\"k\":{\"type\""
    ":\"integer\",\"exclusiveMinimum\":0,\"maximum\":9007199254740991},\"mail\":{\"type\":\"string\",\"fo"
    "rmat\":\"email\",\"pattern\":\"^(?:[A-Za-z0-9_'+\\\\-]+\\\\.)*[A-Za-z0-9_'+\\\\-]*[A-Za-z0-9_+-]@(?:"
    "[A-Za-z0-9][A-Za-z0-9\\\\-]*\\\\.)+[A-Za-z]{2,}$\"},\"id\":{\"type\":\"string\",\"format\":\"uuid\","
    "\"pattern\":\"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]"
    "{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$\"},\"at\":{\"type\""
    ":\"string\",\"format\":\"date-time\",\"pattern\":\"^(?:(?:\\\\d\\\\d[2468][048]|\\\\d\\\\d[13579][26"
    "]|\\\\d\\\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\\\d"
    "|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\\\d|30)|(?:02)-(?:0[1-9]|1\\\\d|2[0-8])))T(?:(?:[01]\\\\d|2[0-"
    "3]):[0-5]\\\\d:[0-5]\\\\d(?:\\\\.\\\\d+)?(?:Z))$\"},\"site\":{\"type\":\"string\",\"format\":\"uri\""
    "},\"d\":{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"^(?:(?:\\\\d\\\\d[2468][048]|\\\\d\\\\d"
    "[13579][26]|\\\\d\\\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\\\d{4}-(?:(?:0[13578]|1[02])-(?:0["
    "1-9]|[12]\\\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\\\d|30)|(?:02)-(?:0[1-9]|1\\\\d|2[0-8])))$\"},\""
    "t\":{\"type\":\"string\",\"pattern\":\"^(?:[01]\\\\d|2[0-3]):[0-5]\\\\d(?::[0-5]\\\\d(?:\\\\.\\\\d+)"
    "?)?$\"},\"dur\":{\"type\":\"string\",\"format\":\"duration\",\"pattern\":\"^P(?:(\\\\d+W)|(?!.*W)(?="
    "\\\\d|T\\\\d)(\\\\d+Y)?(\\\\d+M)?(\\\\d+D)?(T(?=\\\\d)(\\\\d+H)?(\\\\d+M)?(\\\\d+([.,]\\\\d+)?S)?)?)"
    "$\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\",\"pattern\":\"^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]"
    "[0-9]|[1-9][0-9]|[0-9])\\\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])$\"},\"ip6\":{\""
    "type\":\"string\",\"format\":\"ipv6\",\"pattern\":\"^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-"
    "fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1"
    ",4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4"
    "}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:((:[0-9a-fA-F]{1,4}){1,6})"
    "|:((:[0-9a-fA-F]{1,4}){1,7}|:))$\"},\"host\":{\"type\":\"string\",\"format\":\"hostname\",\"pattern\""
    ":\"^(?=.{1,253}\\\\.?$)[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\\\\.[a-zA-Z0-9](?:[-0-9a-zA-"
    "Z]{0,61}[0-9a-zA-Z])?)*\\\\.?$\"},\"m2\":{\"type\":\"string\",\"minLength\":1,\"format\":\"email\",\""
    "pattern\":\"^(?:[A-Za-z0-9_'+\\\\-]+\\\\.)*[A-Za-z0-9_'+\\\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0"
    "-9\\\\-]*\\\\.)+[A-Za-z]{2,}$\"}},\"required\":[\"n\",\"k\",\"mail\",\"id\",\"at\",\"site\",\"d\",\""
    "t\",\"dur\",\"ip\",\"ip6\",\"host\",\"m2\"],\"additionalProperties\":false}",
};

/* ---------------------------------------------------------------- validator */

static bool validate(const cJSON *v, const cJSON *s, const cJSON *root);

static const cJSON *resolve(const cJSON *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "$defs"), ref + 8);
    if (strncmp(ref, "#/definitions/", 14) == 0)
        return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "definitions"), ref + 14);
    return NULL;
}

static bool regex_match(const char *re, const char *s)
{
    int errc;
    PCRE2_SIZE erro;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errc, &erro, NULL);
    if (!code)
        return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int rc = pcre2_match(code, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    return rc >= 0;
}

static size_t utf8_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((uint8_t)*s & 0xC0) != 0x80;
    return n;
}

static bool valid_format(const char *f, const char *s)
{
    const char *date = "(\\d{4})-(\\d{2})-(\\d{2})";
    const char *time = "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
    char re[256];
    static const struct { const char *name, *re; } res[] = {
        { "email", "^[A-Za-z0-9_+-]+(\\.[A-Za-z0-9_+-]+)*@([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?\\.)+[A-Za-z]{2,}$" },
        { "ipv4", "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$" },
        /* RFC 3986 section 3 (scheme and authority required), port <= 9999 */
        { "uri", "^[A-Za-z][A-Za-z0-9+.-]*://([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})+(:[0-9]{1,4})?"
                 "(/([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*(\\?([A-Za-z0-9._~!$&'()*+,;=:@/?-]|"
                 "%[0-9A-Fa-f]{2})*)?(#([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?$" },
        { "idn-hostname", "^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$" },
        { "hostname"    , "^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$" },
        { "duration", "^P(?!$)(\\d+Y)?(\\d+M)?(\\d+D)?(T(?=\\d)(\\d+H)?(\\d+M)?(\\d+S)?)?$|^P\\d+W$" },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(res); i++)
        if (strcmp(f, res[i].name) == 0)
            return regex_match(res[i].re, s);
    if (strcmp(f, "ipv6") == 0) {        /* inet_pton is the reference */
        unsigned char a[16];
        return inet_pton(AF_INET6, s, a) == 1 && strlen(s) <= 39;
    }
    if (strcmp(f, "uuid") == 0)
        return regex_match("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", s);
    if (strcmp(f, "time") == 0) {
        snprintf(re, sizeof(re), "^%s$", time);
        return regex_match(re, s);
    }
    snprintf(re, sizeof(re), strcmp(f, "date") == 0 ? "^%s$" : "^%sT%s$", date, time);
    if (!regex_match(re, s))
        return false;
    int y, m, d;
    if (sscanf(s, "%d-%d-%d", &y, &m, &d) != 3)
        return false;
    static const int mdays[] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m >= 1 && m <= 12 && d >= 1 && d <= (m == 2 && !leap ? 28 : mdays[m - 1]);
}

static bool has_type(const cJSON *v, const char *t)
{
    if (strcmp(t, "object") == 0) return cJSON_IsObject(v);
    if (strcmp(t, "array") == 0) return cJSON_IsArray(v);
    if (strcmp(t, "string") == 0) return cJSON_IsString(v);
    if (strcmp(t, "number") == 0) return cJSON_IsNumber(v);
    if (strcmp(t, "integer") == 0) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (strcmp(t, "boolean") == 0) return cJSON_IsBool(v);
    if (strcmp(t, "null") == 0) return cJSON_IsNull(v);
    return false;
}

static bool validate_object(const cJSON *v, const cJSON *s, const cJSON *root)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    for (const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "required") ? cJSON_GetObjectItemCaseSensitive(s, "required")->child : NULL; r; r = r->next)
        if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring))
            return false;
    for (const cJSON *kv = v->child; kv; kv = kv->next) {
        const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, kv->string) : NULL;
        if (ps) {
            if (!validate(kv, ps, root))
                return false;
        } else if (cJSON_IsFalse(add)) {
            return false;
        } else if (cJSON_IsObject(add) && !validate(kv, add, root)) {
            return false;
        }
    }
    return true;
}

static bool validate_array(const cJSON *v, const cJSON *s, const cJSON *root)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
    int n = cJSON_GetArraySize(v), np = prefix ? cJSON_GetArraySize(prefix) : 0;
    if ((mn && n < mn->valueint) || (mx && n > mx->valueint))
        return false;
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        const cJSON *es = i < np ? cJSON_GetArrayItem(prefix, i) : items;
        if (cJSON_IsFalse(es) || (es && !validate(e, es, root)))
            return false;
    }
    return true;
}

static bool validate_string(const cJSON *v, const cJSON *s)
{
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    size_t n = utf8_len(v->valuestring);
    if ((mn && n < (size_t)mn->valueint) || (mx && n > (size_t)mx->valueint))
        return false;
    if (pat && !regex_match(pat->valuestring, v->valuestring))
        return false;
    return !fmt || valid_format(fmt->valuestring, v->valuestring);
}

static bool validate_number(const cJSON *v, const cJSON *s)
{
    const cJSON *b;
    double x = v->valuedouble;
    if ((b = cJSON_GetObjectItemCaseSensitive(s, "minimum")) && x < b->valuedouble) return false;
    if ((b = cJSON_GetObjectItemCaseSensitive(s, "maximum")) && x > b->valuedouble) return false;
    if ((b = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum")) && x <= b->valuedouble) return false;
    if ((b = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) && x >= b->valuedouble) return false;
    return true;
}

static bool validate(const cJSON *v, const cJSON *s, const cJSON *root)
{
    if (!s)
        return false;
    if (cJSON_IsTrue(s))
        return true;
    const cJSON *k;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable")) && cJSON_IsNull(v))
        return true;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "$ref")))
        return validate(v, resolve(root, k->valuestring), root);
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "const")) && !cJSON_Compare(v, k, true))
        return false;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        bool any = false;
        for (const cJSON *e = k->child; e && !any; e = e->next)
            any = cJSON_Compare(v, e, true);
        if (!any)
            return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) || (k = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        int hits = 0;
        for (const cJSON *e = k->child; e; e = e->next)
            hits += validate(v, e, root);
        if (hits == 0 || (strcmp(k->string, "oneOf") == 0 && hits != 1))
            return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "allOf")))
        for (const cJSON *e = k->child; e; e = e->next)
            if (!validate(v, e, root))
                return false;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        bool any = false;
        if (cJSON_IsString(k))
            any = has_type(v, k->valuestring);
        for (const cJSON *t = cJSON_IsArray(k) ? k->child : NULL; t && !any; t = t->next)
            any = has_type(v, t->valuestring);
        if (!any)
            return false;
    }
    if (cJSON_IsObject(v))
        return validate_object(v, s, root);
    if (cJSON_IsArray(v))
        return validate_array(v, s, root);
    if (cJSON_IsString(v))
        return validate_string(v, s);
    if (cJSON_IsNumber(v))
        return validate_number(v, s);
    return true;
}

/* ---------------------------------------------------------------- vocabularies */

static kvc_tokenizer *demo_tokenizer(const char *preset)
{
    kvc_tokenizer *t = NULL;
    kvc_err err = { 0 };
    CHECKF(kvc_gen_tokenizer(preset, &t, &err) == KVC_OK, "%s: %s", preset, err.msg);
    return t;
}

/* ---------------------------------------------------------------- random walks */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* Pick the next token: often a random one among all allowed while steps <
 * wander; otherwise the allowed token after which the grammar can be
 * completed soonest (EOG when allowed), ties broken at random, so every walk
 * ends. */
static int32_t pick(kvc_gmatch *m, const kvc_tokenizer *t, const uint32_t *mask, int32_t n_allowed,
                    int steps, int wander)
{
    int32_t n = kvc_tokenizer_n_vocab(t);
    if (steps < wander && rnd(4) != 0) {
        int32_t k = (int32_t)rnd((uint32_t)n_allowed);
        for (int32_t id = 0; id < n; id++)
            if (kvc_mask_test(mask, id) && k-- == 0)
                return id;
    }
    int32_t best = -1, best_len = INT32_MAX, ties = 0;
    for (int32_t id = 0; id < n; id++) {
        if (!kvc_mask_test(mask, id))
            continue;
        if (kvc_tokenizer_is_eog(t, id))
            return id;
        if (kvc_gmatch_accept_token(m, id) != KVC_OK)
            continue;
        int32_t len = kvc_gmatch_min_remaining(m);
        kvc_gmatch_rollback(m, 1);
        if (len < best_len)
            best = id, best_len = len, ties = 1;
        else if (len == best_len && rnd((uint32_t)++ties) == 0)
            best = id;
    }
    return best;
}

/* The mask agrees with the matcher on a sample of tokens. */
static void check_mask_sample(kvc_gmatch *m, const uint32_t *mask, int32_t n_vocab)
{
    for (int i = 0; i < 24; i++) {
        int32_t id = (int32_t)rnd((uint32_t)n_vocab);
        int rc = kvc_gmatch_accept_token(m, id);
        CHECKF((rc == KVC_OK) == kvc_mask_test(mask, id), "token %d: mask %d, accept %d", id,
               kvc_mask_test(mask, id), rc);
        if (rc == KVC_OK)
            kvc_gmatch_rollback(m, 1);
    }
}

static FILE *py_out;          /* outputs for the Python cross-check, or NULL */

/* One walk; returns the output text (malloc'd) or NULL. */
static char *walk(const kvc_grammar *g, const kvc_gvocab *v, const kvc_tokenizer *t, int wander,
                  size_t schema)
{
    int32_t n = kvc_tokenizer_n_vocab(t);
    uint32_t *mask = malloc(kvc_mask_words(n) * sizeof(*mask));
    int32_t *ids = malloc(4096 * sizeof(*ids));
    kvc_gmatch *m = kvc_gmatch_new(g, v);
    char *text = NULL;
    int n_ids = 0;
    for (int step = 0; step < 4000; step++) {
        int32_t allowed = kvc_gmatch_mask(m, mask);
        CHECKF(allowed > 0, "no token allowed after %d steps", step);
        if (allowed <= 0)
            break;
        if (step % 7 == 0)
            check_mask_sample(m, mask, n);
        int32_t id = pick(m, t, mask, allowed, step, wander);
        CHECK_EQ_INT(kvc_gmatch_accept_token(m, id), KVC_OK);
        if (kvc_gmatch_is_done(m)) {
            CHECK(kvc_tokenizer_is_eog(t, id));
            text = kvc_detokenize(t, ids, n_ids, false);
            break;
        }
        if (n_ids < 4096)
            ids[n_ids++] = id;
    }
    if (!text) {
        char *partial = kvc_detokenize(t, ids, KVC_MIN(n_ids, 300), false);
        CHECKF(false, "schema %zu: the walk did not end (%d tokens): %s", schema, n_ids, partial);
        free(partial);
    }
    kvc_gmatch_free(m);
    free(mask);
    free(ids);
    return text;
}

static void test_schema_walks(const char *preset, int walks)
{
    kvc_tokenizer *t = demo_tokenizer(preset);
    if (!t)
        return;
    kvc_gvocab *v = NULL;
    kvc_err err = { 0 };
    CHECKF(kvc_gvocab_new(t, &v, &err) == KVC_OK, "%s", err.msg);
    int ok = 0, total = 0;
    for (size_t i = 0; i < KVC_ARRAY_LEN(schemas) && v; i++) {
        kvc_grammar *g = NULL;
        int rc = kvc_grammar_from_schema(schemas[i], strlen(schemas[i]), &g, &err);
        CHECKF(rc == KVC_OK, "schema %zu: %s", i, err.msg);
        if (rc != KVC_OK)
            continue;
        cJSON *schema = cJSON_Parse(schemas[i]);
        for (int w = 0; w < walks; w++) {
            char *text = walk(g, v, t, w * 12, i);
            if (!text)
                continue;
            total++;
            cJSON *out = cJSON_Parse(text);
            CHECKF(out != NULL, "%s schema %zu: not JSON: %s", preset, i, text);
            bool valid = out && validate(out, schema, schema);
            CHECKF(valid, "%s schema %zu: invalid: %s", preset, i, text);
            ok += valid;
            if (py_out && out) {
                char *line = cJSON_PrintUnformatted(out);
                fprintf(py_out, "%zu\t%s\n", i, line);
                free(line);
            }
            if (getenv("KVC_TEST_VERBOSE"))
                printf("%s schema %zu: %s\n", preset, i, text);
            cJSON_Delete(out);
            free(text);
        }
        cJSON_Delete(schema);
        kvc_grammar_free(g);
    }
    printf("%s: %d of %d walks valid over %zu schemas\n", preset, ok, total, KVC_ARRAY_LEN(schemas));
    kvc_gvocab_free(v);
    kvc_tokenizer_free(t);
}

/* Every output again through Python's jsonschema (Draft 2020-12), when the
 * system Python has it. */
static void python_check(const char *outputs)
{
    if (system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") != 0) {
        printf("python3-jsonschema absent: cross-check skipped\n");
        return;
    }
    char schemas_path[] = "/tmp/kvc_schemas_XXXXXX";
    int fd = mkstemp(schemas_path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f)
        return;
    for (size_t i = 0; i < KVC_ARRAY_LEN(schemas); i++)
        fprintf(f, "%s\n", schemas[i]);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c '\n"
             "import json, sys, jsonschema\n"
             "S = [json.loads(l) for l in open(sys.argv[1])]\n"
             "bad = 0; n = 0\n"
             "for line in open(sys.argv[2]):\n"
             "    i, doc = line.rstrip(\"\\n\").split(\"\\t\", 1)\n"
             "    if int(i) == 18: continue  # nullable is OpenAPI, not JSON schema\n"
             "    n += 1\n"
             "    v = jsonschema.Draft202012Validator(S[int(i)], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)\n"
             "    errs = list(v.iter_errors(json.loads(doc)))\n"
             "    if errs: bad += 1; print(\"schema\", i, doc, errs[0].message)\n"
             "print(\"python jsonschema:\", n - bad, \"of\", n, \"valid\")\n"
             "sys.exit(1 if bad or n == 0 else 0)' %s %s",
             schemas_path, outputs);
    CHECKF(system(cmd) == 0, "python jsonschema found invalid outputs");
    unlink(schemas_path);
}

/* ---------------------------------------------------------------- refusals */

static void test_unsupported(void)
{
    static const struct { const char *schema, *msg; } bad[] = {
        { "{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems' at #" },
        { "{\"properties\":{\"a\":{\"not\":{\"type\":\"string\"}}}}", "'not' at #/properties/a" },
        { "{\"type\":\"number\",\"multipleOf\":3}", "'multipleOf'" },
        { "{\"type\":\"string\",\"format\":\"ipv5\"}", "format 'ipv5'" },
        { "{\"type\":\"string\",\"format\":\"email\",\"maxLength\":50}", "format 'email' with minLength/maxLength" },
        { "{\"type\":\"string\",\"format\":\"date\",\"minLength\":11}", "format 'date' with" },
        { "{\"type\":\"integer\",\"minimum\":9007199254740991}", "'minimum' beyond 10^15" },
        { "{\"type\":\"integer\",\"exclusiveMaximum\":-9007199254740991}", "'exclusiveMaximum' beyond 10^15" },
        { "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences" },
        { "{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "(?...)" },
        { "{\"type\":\"number\",\"minimum\":1.5}", "minimum/maximum on type 'number'" },
        { "{\"$ref\":\"http://example.com/s.json\"}", "only local references" },
        { "{\"$ref\":\"#/$defs/missing\"}", "does not resolve" },
        { "{\"if\":{},\"then\":{}}", "'if'" },
        { "{\"type\":\"object\",\"patternProperties\":{\"^a\":{}}}", "'patternProperties'" },
        { "{\"type\":\"foo\"}", "unknown type 'foo'" },
        { "{\"type\":\"array\",\"maxItems\":1000000}", "'maxItems' above 10000" },
        { "{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", "maxLength < minLength" },
        { "{\"properties\":{\"x\":false},\"required\":[\"x\"]}", "schema 'false'" },
        { "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer" },
        { "{\"allOf\":[{\"type\":\"string\"},{\"type\":\"object\"}]}", "allOf" },
        { "not json", "not valid JSON" },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        kvc_grammar *g = NULL;
        kvc_err err = { 0 };
        int rc = kvc_grammar_from_schema(bad[i].schema, strlen(bad[i].schema), &g, &err);
        CHECKF(rc != KVC_OK && g == NULL, "accepted: %s", bad[i].schema);
        CHECKF(strstr(err.msg, bad[i].msg) != NULL, "%s: message \"%s\" lacks \"%s\"", bad[i].schema,
               err.msg, bad[i].msg);
        kvc_grammar_free(g);
    }
}

/* Known strings against schema grammars: what must match and what must not. */
static void test_known_strings(void)
{
    static const struct { int schema; const char *text; bool ok; } cases[] = {
        { 0, "{\"name\": \"Bo\", \"age\": 7}", true },
        { 0, "{\n  \"name\": \"Bo\",\n  \"age\": -0\n}", true },
        { 0, "{\"name\": \"Bo\",\n                      \"age\": 1}", false },  /* 22 spaces */
        { 0, "{\"age\": 7, \"name\": \"Bo\"}", false },          /* schema order */
        { 0, "{\"name\": \"Bo\"}", false },
        { 3, "{\"color\":\"red\",\"n\":null}", true },
        { 3, "{\"color\":\"pink\",\"n\":1}", false },
        { 7, "{}", true },
        { 7, "{\"b\":\"x\",\"c\":null}", true },
        { 7, "{,\"b\":\"x\"}", false },
        { 9, "{\"sku\":\"AB-123x\",\"tag\":\"zzabbbq\"}", true },
        { 9, "{\"sku\":\"A-123\",\"tag\":\"ab\"}", false },
        { 11, "{\"pct\":100,\"neg\":-4,\"big\":1000}", true },
        { 11, "{\"pct\":101,\"neg\":-4,\"big\":1000}", false },
        { 11, "{\"pct\":0,\"neg\":-3,\"big\":1000}", false },
        { 11, "{\"pct\":0,\"neg\":-250,\"big\":999}", false },
        { 11, "{\"pct\":007,\"neg\":-250,\"big\":1001}", false },
        { 14, "[\"a\",1]", true },
        { 14, "[\"a\"]", false },
        { 14, "[\"a\",1,true,2]", false },
        { 21, "{\"na\xc3\xafve \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\":\"a\\\"b\",\"free\":\"\\u00e9\\n\"}", true },
        { 21, "{\"na\xc3\xafve \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\":\"a\\\"b\",\"free\":\"\\ud800\"}", false },
        { 10, "{\"d\":\"2024-02-29\",\"t\":\"2024-01-01T10:00:00Z\",\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"h\":\"23:59:59+01:00\"}", false },
        { 26, "{\"e\":\"a.b+c@mail.example.org\",\"i4\":\"255.0.10.9\",\"i6\":\"fe80::1:2\",\"h\":\"api.example.com\","
              "\"u\":\"https://example.com:8080/a/b?q=1&r=%20#top\",\"p\":\"P1Y2M3DT4H5M6S\"}", true },
        { 26, "{\"e\":\"a@b.co\",\"i4\":\"1.2.3.4\",\"i6\":\"::\",\"h\":\"localhost\",\"u\":\"a://1.2.3.4\",\"p\":\"P2W\"}", true },
        { 26, "{\"e\":\".a@b.co\",\"i4\":\"1.2.3.4\",\"i6\":\"::\",\"h\":\"x\",\"u\":\"a://b\",\"p\":\"P2W\"}", false },
        { 26, "{\"e\":\"a@b.co\",\"i4\":\"1.2.3.04\",\"i6\":\"::\",\"h\":\"x\",\"u\":\"a://b\",\"p\":\"P2W\"}", false },
        { 26, "{\"e\":\"a@b.co\",\"i4\":\"1.2.3.4\",\"i6\":\"1:2:3:4:5:6:7::8\",\"h\":\"x\",\"u\":\"a://b\",\"p\":\"P2W\"}", false },
        { 26, "{\"e\":\"a@b.co\",\"i4\":\"1.2.3.4\",\"i6\":\"1:2:3:4:5:6:7::\",\"h\":\"x\",\"u\":\"a://b\",\"p\":\"PT\"}", false },
        { 26, "{\"e\":\"a@b.co\",\"i4\":\"1.2.3.4\",\"i6\":\"1:2:3:4:5:6:7::\",\"h\":\"x\",\"u\":\"a://b\",\"p\":\"PT1S\"}", true },
        { 27, "{\"n\":-999999999999999,\"k\":1,\"mail\":\"a@b.cd\",\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-01-01T10:00:00Z\","
              "\"site\":\"http://x.io\",\"d\":\"2024-02-29\",\"t\":\"10:00\",\"dur\":\"P1DT2H\",\"ip\":\"10.0.0.1\",\"ip6\":\"::1\",\"host\":\"a.b\",\"m2\":\"x@y.zz\"}", true },
        { 27, "{\"n\":1,\"k\":0,\"mail\":\"a@b.cd\",\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-01-01T10:00:00Z\","
              "\"site\":\"http://x.io\",\"d\":\"2024-02-29\",\"t\":\"10:00\",\"dur\":\"P1DT2H\",\"ip\":\"10.0.0.1\",\"ip6\":\"::1\",\"host\":\"a.b\",\"m2\":\"x@y.zz\"}", false },
        { 27, "{\"n\":1,\"k\":1,\"mail\":\"a@b.cd\",\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-01-01T10:00:00+01:00\","
              "\"site\":\"http://x.io\",\"d\":\"2024-02-29\",\"t\":\"10:00\",\"dur\":\"P1DT2H\",\"ip\":\"10.0.0.1\",\"ip6\":\"::1\",\"host\":\"a.b\",\"m2\":\"x@y.zz\"}", false },
        { 27, "{\"n\":1,\"k\":1,\"mail\":\"a@b.cd\",\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"2024-01-01T10:00Z\","
              "\"site\":\"http://x.io\",\"d\":\"2024-02-29\",\"t\":\"10:00\",\"dur\":\"P1DT2H\",\"ip\":\"10.0.0.1\",\"ip6\":\"::1\",\"host\":\"a.b\",\"m2\":\"x@y.zz\"}", false },
        { 10, "{\"d\":\"2024-02-28\",\"t\":\"2024-01-01T10:00:00.5Z\",\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"h\":\"23:59:59+01:00\"}", true },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        kvc_grammar *g = NULL;
        kvc_err err = { 0 };
        const char *s = schemas[cases[i].schema];
        if (kvc_grammar_from_schema(s, strlen(s), &g, &err) != KVC_OK) {
            CHECKF(false, "schema %d: %s", cases[i].schema, err.msg);
            continue;
        }
        kvc_gmatch *m = kvc_gmatch_new(g, NULL);
        bool ok = kvc_gmatch_accept_bytes(m, cases[i].text, strlen(cases[i].text)) == KVC_OK &&
                  kvc_gmatch_is_complete(m);
        CHECKF(ok == cases[i].ok, "schema %d, %s: %s", cases[i].schema, cases[i].text,
               ok ? "matched" : "refused");
        kvc_gmatch_free(m);
        kvc_grammar_free(g);
    }
}

/* Integer ranges stay small: one branch per digit, not two (which once made
 * a 2.4 MB grammar of exclusiveMinimum 999). */
static void test_range_size(void)
{
    static const char *const ranges[] = {
        "{\"type\":\"integer\",\"exclusiveMinimum\":999}",
        "{\"type\":\"integer\",\"minimum\":-999999999999999,\"maximum\":999999999999999}",
        "{\"type\":\"integer\",\"minimum\":123456789012345,\"maximum\":987654321098765}",
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(ranges); i++) {
        char *text = NULL;
        kvc_err err = { 0 };
        CHECKF(kvc_schema_to_gbnf(ranges[i], strlen(ranges[i]), NULL, &text, &err) == KVC_OK, "%s", err.msg);
        CHECKF(text && strlen(text) < 8000, "%s: %zu bytes", ranges[i], text ? strlen(text) : 0);
        free(text);
    }
}

int main(void)
{
    test_range_size();
    test_unsupported();
    test_known_strings();
    char outputs[] = "/tmp/kvc_outputs_XXXXXX";
    int fd = mkstemp(outputs);
    py_out = fd >= 0 ? fdopen(fd, "w") : NULL;
    test_schema_walks("demo", 6);          /* byte-level BPE */
    test_schema_walks("tiny-llama", 3);    /* SentencePiece with byte fallback */
    if (py_out) {
        fclose(py_out);
        py_out = NULL;
        python_check(outputs);
        unlink(outputs);
    }
    return test_done("test_grammar_schema");
}
