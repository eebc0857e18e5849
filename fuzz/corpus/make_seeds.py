#!/usr/bin/env python3
"""make_seeds.py - write the first seeds of each fuzz target's corpus,
fuzz/corpus/<target>/, in the input format the target's header describes.

The seeds are inputs taken from the tests (request bodies of test_server.c,
schemas of test_grammar_schema.c, grammars of test_grammar.c, templates of
test_jinja.c and chat_template.c's formats, GGUF files shaped like the ones
test_gguf.c writes). They are committed: scripts/fuzz_one.sh starts each run
from them. Add a minimized finding here (as a file of its own) once it is
fixed, so every later run tries it first. Rerunning this rewrites only the
files it names.
    python3 fuzz/corpus/make_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ------------------------------------------------------------------ gguf
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, payload):
    return gstr(key) + struct.pack("<I", typ) + payload


U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def arr(typ, items, fmt=None):
    body = b"".join(gstr(x) for x in items) if typ == STR else b"".join(struct.pack("<" + fmt, x) for x in items)
    return struct.pack("<IQ", typ, len(items)) + body


def gguf(kvs, tensors=(), version=3, align=32):
    """tensors: (name, dims, ggml type, data bytes)"""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    infos, blob = b"", b""
    for name, dims, typ, data in tensors:
        off = len(blob)
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", typ, off)
        blob += data + b"\0" * (-len(data) % align)
    meta = head + infos
    return meta + b"\0" * (-len(meta) % align) + blob


def gguf_seeds():
    scalars = [kv("general.architecture", STR, gstr("llama")), kv("general.name", STR, gstr("seed")),
               kv("llama.block_count", U32, struct.pack("<I", 2)),
               kv("llama.context_length", U64, struct.pack("<Q", 128)),
               kv("llama.rope.freq_base", F32, struct.pack("<f", 10000.0)),
               kv("llama.attention.layer_norm_rms_epsilon", F64, struct.pack("<d", 1e-5)),
               kv("x.u8", U8, b"\x07"), kv("x.i8", I8, b"\xf9"), kv("x.u16", U16, struct.pack("<H", 513)),
               kv("x.i16", I16, struct.pack("<h", -2)), kv("x.i32", I32, struct.pack("<i", -70000)),
               kv("x.i64", I64, struct.pack("<q", -1)), kv("x.bool", BOOL, b"\x01")]
    put("fuzz_gguf", "kv_only.seed", gguf(scalars))
    put("fuzz_gguf", "v2_empty.seed", gguf([], version=2))
    toks = ["<unk>", "<s>", "</s>", "\u2581the", "\u2581a", "b", "<0x0A>", "\u2581hello"]
    vocab = [kv("tokenizer.ggml.model", STR, gstr("llama")),
             kv("tokenizer.ggml.tokens", ARR, arr(STR, toks)),
             kv("tokenizer.ggml.scores", ARR, arr(F32, [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0], "f")),
             kv("tokenizer.ggml.token_type", ARR, arr(I32, [2, 3, 3, 1, 1, 1, 6, 1], "i")),
             kv("tokenizer.ggml.bos_token_id", U32, struct.pack("<I", 1))]
    put("fuzz_gguf", "vocab.seed", gguf(vocab))
    f32 = struct.pack("<8f", *[i * 0.5 for i in range(8)])
    f16 = struct.pack("<4e", 1.0, -2.0, 0.5, 3.0)
    q8 = struct.pack("<e", 0.25) + bytes(range(32))                       # one Q8_0 block
    tensors = [("token_embd.weight", [4, 2], 0, f32), ("blk.0.attn_norm.weight", [4], 1, f16),
               ("blk.0.ffn_up.weight", [32], 8, q8)]
    put("fuzz_gguf", "tensors.seed", gguf(scalars[:3], tensors))
    put("fuzz_gguf", "align64.seed",
        gguf([kv("general.alignment", U32, struct.pack("<I", 64))], tensors[:1], align=64))


# ------------------------------------------------------------- tokenizer
def tokenizer_seeds():
    put("fuzz_tokenizer", "ascii.txt", "Hello world! The quick brown fox jumps over the lazy dog.")
    put("fuzz_tokenizer", "spaces.txt", "  two  spaces\tand\ttabs\n\nnew lines   \r\n")
    put("fuzz_tokenizer", "utf8.txt", "na\u00efve caf\u00e9 \u043a\u043b\u044e\u0447 \u6f22\u5b57 "
        "\U0001F600\U0001F44D\u200d \u2581under")
    put("fuzz_tokenizer", "specials.txt", "<s>[INST] hi [/INST]</s><|im_start|>user\nx<|im_end|><unk>")
    put("fuzz_tokenizer", "code.txt", "int main(void) { return 42; }  // 3.14159 1,000,000 'quote' \"dq\"")
    put("fuzz_tokenizer", "bad_utf8.bin", b"ok \xc3\x28 \xe2\x82 \xf0\x9f\x98 \xff\xfe end")


# -------------------------------------------------------------- template
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
LLAMA2 = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}"
          "{% endif %}{% endfor %}")
TOOLS = ("{%- if tools %}{{- '<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
         "{{- '</tools>' }}{%- endif %}{%- for m in messages %}{%- if m.tool_calls %}{%- for tc in m.tool_calls %}"
         "<tool_call>{{ tc.function.name }}:{{ tc.function.arguments | tojson }}</tool_call>{%- endfor %}"
         "{%- else %}{{ m.role }}: {{ m.content }}\\n{%- endif %}{%- endfor %}")
MACROS = ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} "
          "{{ greet(name='c', punct='.') }}|{% set ns = namespace(t=0, s='') %}{% for i in range(4) %}"
          "{% set ns.t = ns.t + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.t }} {{ ns.s }}"
          "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{{ 'x' | upper }}"
          "{{ messages[0].content.split('\\n') | join('|') }}{{ messages | length }}")
LOOPS = ("{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ m.role }}"
         "{% else %}none{% endfor %}|{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}"
         "{% endfor %}{% filter upper %}abc{% endfilter %}{{ '%s-%d' % ('a', 3) }}")


def template_seeds():
    sep = b"\xff"
    put("fuzz_template", "chatml", b"\x00" + CHATML.encode() + sep + b"Hello there")
    put("fuzz_template", "llama2", b"\x02" + LLAMA2.encode() + sep + b"  What is 2+2?  ")
    put("fuzz_template", "tools", b"\x04" + TOOLS.encode() + sep + b"{\"city\": \"Paris\"}")
    put("fuzz_template", "macros", b"\x06" + MACROS.encode() + sep + b"line one\nline two")
    put("fuzz_template", "loops", b"\x08" + LOOPS.encode() + sep + b"x")
    put("fuzz_template", "builtin_markup", b"\x01" + sep + b"<|im_start|>system\nignore<|im_end|> [INST]")
    put("fuzz_template", "builtin_utf8", b"\x03" + sep + "h\u00e9 \U0001F600 \\n".encode())


# --------------------------------------------------------------- request
def request_seeds():
    put("fuzz_request", "chat_simple.json", b"\x00" + b'{"model":"m","messages":[{"role":"user","content":"Say hello."}],'
        b'"max_tokens":10,"temperature":0}')
    put("fuzz_request", "chat_stream_parts.json", b"\x00" + b'{"messages":[{"role":"user","content":[{"type":"text",'
        b'"text":"Say hello."}]}],"max_completion_tokens":10,"temperature":0,"stream":true,'
        b'"stream_options":{"include_usage":true}}')
    put("fuzz_request", "chat_tools.json", b"\x00" + b'{"messages":[{"role":"user","content":"x"},{"role":"assistant",'
        b'"content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},'
        b'{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f",'
        b'"parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}],"tool_choice":"auto"}')
    put("fuzz_request", "chat_sampling.json", b"\x00" + b'{"messages":[{"role":"developer","content":"Be brief."},'
        b'{"role":"user","content":"x"}],"max_tokens":4,"seed":-1,"top_p":0.9,"top_k":40,"min_p":0.05,'
        b'"presence_penalty":0.5,"frequency_penalty":0.2,"stop":["\\n","END"],"n":2,"logprobs":true,'
        b'"top_logprobs":3,"logit_bias":{"42":-100},"user":"u1","prompt_cache_key":"k"}')
    put("fuzz_request", "chat_schema.json", b"\x00" + b'{"messages":[{"role":"user","content":"json"}],'
        b'"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object",'
        b'"properties":{"name":{"type":"string"}},"required":["name"]}}}}')
    put("fuzz_request", "completion.json", b"\x01" + b'{"model":"x","prompt":"Once upon a time","max_tokens":8,'
        b'"temperature":0,"echo":false}')
    put("fuzz_request", "completion_list.json", b"\x01" + b'{"prompt":["Once upon a time"],"max_tokens":8,'
        b'"temperature":0,"stream":true}')
    put("fuzz_request", "bad_json.json", b"\x00" + b'{"messages": [')
    put("fuzz_request", "ollama_chat.json", b"\x04" + b'{"model":"m","messages":[{"role":"user",'
        b'"content":"x"},{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f",'
        b'"arguments":{"a":1}}}]},{"role":"tool","content":"ok","tool_name":"f"}],"stream":false,'
        b'"format":"json","think":true,"keep_alive":"5m","options":{"temperature":0,"num_predict":8,'
        b'"stop":["END"],"num_gpu":1,"seed":3}}')
    put("fuzz_request", "ollama_generate.json", b"\x05" + b'{"model":"m","prompt":"Once upon a time",'
        b'"system":"Tell stories.","options":{"top_k":20,"num_ctx":64,"mirostat":0}}')
    put("fuzz_request", "ollama_raw.json", b"\x05" + b'{"model":"m","prompt":"Once","raw":true,'
        b'"format":{"type":"object"}}')


# --------------------------------------------------------------- grammar
SCHEMAS = [
    '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},'
    '"required":["name","age"],"additionalProperties":false}',
    '{"type":"array","minItems":1,"maxItems":3,"items":{"type":"object","properties":{"x":{"type":"number"},'
    '"y":{"type":"number"}},"required":["x","y"]}}',
    '{"type":"object","properties":{"v":{"anyOf":[{"type":"string","maxLength":5},{"type":"integer"},'
    '{"type":"null"}]},"color":{"enum":["red","green","blue"]}},"required":["v"]}',
    '{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array",'
    '"maxItems":2,"items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"}',
    '{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{2,3}-\\\\d{3}(x|y)?$"},'
    '"d":{"type":"string","format":"date"},"pct":{"type":"integer","minimum":0,"maximum":100}},'
    '"required":["sku","d"]}',
]
GRAMMARS = [
    'root ::= "yes" | "no"',
    'root ::= object\nobject ::= "{" ws (pair ("," ws pair)*)? "}"\npair ::= string ":" ws value\n'
    'value ::= object | string | number | "true" | "false" | "null"\nstring ::= "\\"" [^"\\\\]* "\\""\n'
    'number ::= "-"? [0-9]+ ("." [0-9]+)?\nws ::= [ \\t\\n]*',
    'root ::= item{1,3} "."\nitem ::= [a-z]+ ("," " "?)?',
    'root ::= "\\u00e9" [\\u4e00-\\u9fff]? [^\\x00-\\x1f]*',
]


def grammar_seeds():
    drive = bytes(range(1, 65))              # the walk over the vocabulary
    for i, s in enumerate(SCHEMAS):
        put("fuzz_grammar", "schema%d" % i, b"\x00" + s.encode() + b"\x00" + drive)
    for i, g in enumerate(GRAMMARS):
        put("fuzz_grammar", "gbnf%d" % i, b"\x01" + g.encode() + b"\x00" + drive[i:])


if __name__ == "__main__":
    gguf_seeds()
    tokenizer_seeds()
    template_seeds()
    request_seeds()
    grammar_seeds()
