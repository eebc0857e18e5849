/* test_chat_template.c - detection of real Jinja templates, exact renderings,
 * and prefix stability of every format. */
#include "chat_template.h"
#include "test.h"

/* ---------------------------------------------------------------- helpers */

static char *render(int tmpl, const kvc_chat_msg *m, size_t n, bool gen)
{
    char *out = NULL;
    kvc_err err = { 0 };
    int rc = kvc_chat_render(tmpl, m, n, gen, &out, &err);
    CHECKF(rc == KVC_OK, "%s: rc %d: %s", kvc_chat_template_name(tmpl), rc, err.msg);
    return out;
}

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---------------------------------------------------------------- detection
 *
 * Template strings from the models' tokenizer_config.json (via llama.cpp's
 * tests/test-chat-template.cpp and models/templates/), shortened where long:
 * the excerpts keep the markers a detector may look at. */

static const struct { const char *model; const char *jinja; int want; } DETECT[] = {
    { "tiny-qwen2 (shared/models) / OpenHermes-2.5",
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
      KVC_TMPL_CHATML },
    { "Qwen2.5-7B-Instruct (excerpt)",
      "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
      "        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. "
      "You are a helpful assistant.' }}\n    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more "
      "functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> "
      "XML tags:\\n<tools>\" }}{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
      "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}\n"
      "    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n",
      KVC_TMPL_CHATML },
    { "SmolVLM (not ChatML)",
      "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == "
      "'image' %}{{':'}}{% else %}{{': '}}{% endif %}{{ message['content'] }}<end_of_utterance>\n{% endfor %}",
      KVC_TMPL_UNKNOWN },
    { "phi-4",
      "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
      "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
      "message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == 'assistant') %}"
      "{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}",
      KVC_TMPL_PHI4 },
    { "Meta-Llama-3-8B-Instruct",
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
      "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
      KVC_TMPL_LLAMA3 },
    { "Llama-3.2-3B-Instruct (excerpt)",
      "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}"
      "\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
      "\n{%- for message in messages %}\n{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
      "message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}",
      KVC_TMPL_LLAMA3 },
    { "Mistral-7B-Instruct-v0.2 (pre-v1, no system)",
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
      "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
      "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
      "are supported!') }}{% endif %}{% endfor %}",
      KVC_TMPL_LLAMA2 },
    { "FusionNet_34Bx2_MoE",
      "{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' -%}\n{%- if idx > 1 -%}\n"
      "{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}\n{%- else -%}\n{{- messages[idx]['content'] "
      "+ ' [/INST]' -}}\n{%- endif -%}\n{% elif messages[idx]['role'] == 'system' %}\n{{- '[INST] <<SYS>>\\n' + "
      "messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}\n{%- elif messages[idx]['role'] == 'assistant' -%}\n"
      "{{- ' '  + messages[idx]['content'] + ' ' + eos_token -}}\n{% endif %}\n{% endfor %}",
      KVC_TMPL_LLAMA2_SYS_BOS },
    { "Llama-2-chat (Meta; excerpt)",
      "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
      "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
      "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
      "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}",
      KVC_TMPL_LLAMA2_SYS_STRIP },
    { "llama2 with <<SYS>> (excerpt)",
      "{% if message['role'] == 'system' %}{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}"
      "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}",
      KVC_TMPL_LLAMA2_SYS },
    { "Mistral-7B-Instruct-v0.2 (mistralai v1 with system)",
      "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
      "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n"
      "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == 'user' %}\n"
      "        {%- if loop.first and system_message is defined %}\n"
      "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
      "        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n"
      "    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n"
      "    {%- endif %}\n{%- endfor %}\n",
      KVC_TMPL_MISTRAL_V1 },
    { "Mistral-Large-Instruct-2407 (v3; excerpt)",
      "{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
      "        {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- \"[AVAILABLE_TOOLS] [\" }}"
      "{{- \"[/AVAILABLE_TOOLS]\" }}\n            {%- endif %}\n        {%- if loop.last and system_message is defined %}\n"
      "            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
      "        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n"
      "    {%- elif message[\"role\"] == \"assistant\" %}\n            {{- \" \" + message[\"content\"]|trim + eos_token}}",
      KVC_TMPL_MISTRAL_V3 },
    { "Mistral-Nemo-Instruct-2407 (v3-tekken; excerpt)",
      "{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n"
      "            {{- \"[AVAILABLE_TOOLS][\" }}{{- \"[/AVAILABLE_TOOLS]\" }}\n"
      "        {%- if loop.last and system_message is defined %}\n"
      "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
      "        {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}",
      KVC_TMPL_MISTRAL_V3_TEKKEN },
    { "Mistral-Large-Instruct-2411 (v7)",
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
      "'[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}"
      "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}{% else %}"
      "{{ raise_exception('Only user, system and assistant roles are supported!') }}{% endif %}{% endfor %}",
      KVC_TMPL_MISTRAL_V7 },
    { "Mistral-Small-3.2-24B-Instruct-2506 (v7-tekken; excerpt)",
      "{{- bos_token }}\n{{- '[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]' }}\n{%- for message in loop_messages %}"
      "\n    {%- if message['role'] == 'user' %}\n        {{- '[INST]' + message['content'] + '[/INST]' }}\n"
      "    {%- elif message['role'] == 'assistant' %}\n        {{- message['content'] + eos_token }}\n    {%- endif %}"
      "\n{%- endfor %}",
      KVC_TMPL_MISTRAL_V7_TEKKEN },
    { "Phi-3-mini",
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\\n' + "
      "message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}{% elif (message['role'] == 'assistant') %}"
      "{{message['content'] + '<|end|>' + '\\n'}}{% endif %}{% endfor %}",
      KVC_TMPL_PHI3 },
    { "Phi-3.5-mini-instruct",
      "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
      "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
      "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
      "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
      KVC_TMPL_PHI3 },
    { "google/gemma-7b-it",
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
      "{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
      "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
      "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
      KVC_TMPL_GEMMA },
    { "HuggingFaceH4/zephyr-7b-beta",
      "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
      "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
      "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}"
      "\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}",
      KVC_TMPL_ZEPHYR },
    { "zephyr layout with a literal <|endoftext|> (an OCR model's template)",
      "{%- for message in messages %}\n{%- if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + "
      "'<|endoftext|>\\n' }}\n{%- elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n' + message['content'] + "
      "'<|endoftext|>\\n' }}\n{%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
      "{{ '<|assistant|>\\n' }}\n{%- endif %}",
      KVC_TMPL_ZEPHYR_ENDOFTEXT },
    { "GLM-Edge (not Zephyr)",
      "{% for item in messages %}{% if item['role'] == 'system' %}<|system|>\n{{ item['content'] }}{% elif item['role'] "
      "== 'user' %}<|user|>\n{{ item['content'] }}{% elif item['role'] == 'assistant' %}<|assistant|>\n"
      "{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>",
      KVC_TMPL_UNKNOWN },
    { "ChatGLM4 (unsupported)",
      "[gMASK]<sop>{% for item in messages %}{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n"
      "{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
      KVC_TMPL_UNKNOWN },
    { "deepseek-coder-33b-instruct (excerpt)",
      "{{bos_token}}{%- if not ns.found -%}\n{{'You are an AI programming assistant, utilizing the Deepseek Coder "
      "model'}}\n{%- endif %}\n{%- for message in messages %}\n    {%- if message['role'] == 'system' %}\n"
      "{{ message['content'] }}\n    {%- else %}\n        {%- if message['role'] == 'user' %}\n"
      "{{'### Instruction:\\n' + message['content'] + '\\n'}}\n        {%- else %}\n"
      "{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}\n        {%- endif %}\n    {%- endif %}\n"
      "{%- endfor %}\n{% if add_generation_prompt %}\n{{'### Response:'}}\n{% endif %}",
      KVC_TMPL_DEEPSEEK },
    { "DeepSeek-V2",
      "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{{ bos_token }}"
      "{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}"
      "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
      "{% elif message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}",
      KVC_TMPL_DEEPSEEK2 },
    { "DeepSeek-R1-Distill-Qwen-32B (excerpt)",
      "{%- endfor -%}{{bos_token}}{{ns.system_prompt}}\n{%- for message in messages -%}\n"
      "  {%- if message['role'] == 'user' -%}\n    {%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}\n"
      "  {%- endif -%}\n      {%- if '</think>' in content -%}\n        {%- set content = content.split('</think>')[-1] -%}\n"
      "      {%- endif -%}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}\n"
      "{%- if add_generation_prompt and not ns.is_tool -%}{{'<｜Assistant｜><think>\\n'}}\n{%- endif %}",
      KVC_TMPL_DEEPSEEK3 },
    { "Orion (unsupported)",
      "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{% if message['role'] == 'user' %}"
      "{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}{% elif message['role'] == 'assistant' %}"
      "{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
      KVC_TMPL_UNKNOWN },
    { "a format name", "llama3", KVC_TMPL_LLAMA3 },
    { "a format name", "mistral-v7-tekken", KVC_TMPL_MISTRAL_V7_TEKKEN },
    { "garbage", "INVALID TEMPLATE", KVC_TMPL_UNKNOWN },
    { "empty", "", KVC_TMPL_UNKNOWN },
};

static void test_detect(void)
{
    for (size_t i = 0; i < KVC_ARRAY_LEN(DETECT); i++) {
        int got = kvc_chat_template_detect(DETECT[i].jinja);
        CHECKF(got == DETECT[i].want, "%s: detected %s, want %s", DETECT[i].model,
               kvc_chat_template_name(got), kvc_chat_template_name(DETECT[i].want));
    }
    CHECK_EQ_INT(kvc_chat_template_detect(NULL), KVC_TMPL_UNKNOWN);
}

static void test_names(void)
{
    for (int t = 0; t < KVC_TMPL_COUNT; t++) {
        const char *name = kvc_chat_template_name(t);
        CHECKF(strcmp(name, "unknown") != 0, "template %d has no name", t);
        CHECK_EQ_INT(kvc_chat_template_from_name(name), t);
        const char *const *stops = kvc_chat_template_stops(t);
        CHECKF(stops && stops[0] && stops[0][0], "%s: no stop strings", name);
        for (size_t j = 0; stops && stops[j]; j++) {
            for (size_t k = j + 1; stops[k]; k++)
                CHECKF(strcmp(stops[j], stops[k]) != 0, "%s: duplicate stop %s", name, stops[j]);
        }
    }
    CHECK_EQ_INT(kvc_chat_template_from_name("no-such-format"), KVC_TMPL_UNKNOWN);
    CHECK_EQ_INT(kvc_chat_template_from_name(NULL), KVC_TMPL_UNKNOWN);
    CHECK(strcmp(kvc_chat_template_name(KVC_TMPL_UNKNOWN), "unknown") == 0);
    CHECK(strcmp(kvc_chat_template_name(KVC_TMPL_COUNT), "unknown") == 0);
    CHECK(kvc_chat_template_stops(KVC_TMPL_UNKNOWN)[0] == NULL);
    CHECK(strcmp(kvc_chat_template_stops(KVC_TMPL_CHATML)[0], "<|im_end|>") == 0);
    CHECK(strcmp(kvc_chat_template_stops(KVC_TMPL_LLAMA3)[0], "<|eot_id|>") == 0);
    CHECK(strcmp(kvc_chat_template_stops(KVC_TMPL_GEMMA)[0], "<end_of_turn>") == 0);
    CHECK(strcmp(kvc_chat_template_reply_sep(KVC_TMPL_CHATML), "") == 0);
    CHECK(strcmp(kvc_chat_template_reply_sep(KVC_TMPL_MISTRAL_V1), " ") == 0);
    CHECK(strcmp(kvc_chat_template_reply_sep(KVC_TMPL_DEEPSEEK2), " ") == 0);
    CHECK(strcmp(kvc_chat_template_reply_sep(KVC_TMPL_UNKNOWN), "") == 0);
}

/* ---------------------------------------------------------------- exact renderings
 *
 * llama.cpp's test conversation; the expected strings are llama.cpp's built-in
 * outputs for the same formats (tests/test-chat-template.cpp), except where
 * noted. Note the assistant reply with surrounding spaces: it shows which
 * formats trim. */

static const kvc_chat_msg CONV[] = {
    { "system",    "You are a helpful assistant" },
    { "user",      "Hello" },
    { "assistant", "Hi there" },
    { "user",      "Who are you" },
    { "assistant", "   I am an assistant   " },
    { "user",      "Another question" },
};

static const struct { int tmpl; const char *want; } EXACT[] = {
    { KVC_TMPL_CHATML,
      "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
      "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
      "<|im_start|>assistant\n" },
    { KVC_TMPL_LLAMA2,
      "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   "
      "</s>[INST] Another question [/INST]" },
    { KVC_TMPL_LLAMA2_SYS_BOS,
      "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]"
      "   I am an assistant   </s><s>[INST] Another question [/INST]" },
    { KVC_TMPL_LLAMA2_SYS_STRIP,
      "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
      "I am an assistant</s>[INST] Another question [/INST]" },
    { KVC_TMPL_GEMMA,
      "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
      "<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant"
      "<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n" },
    { KVC_TMPL_DEEPSEEK,
      "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:\n"
      "Who are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n"
      "### Response:\n" },
    { KVC_TMPL_LLAMA3,
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user"
      "<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant"
      "<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question"
      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" },
    { KVC_TMPL_PHI3,
      "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
      "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question"
      "<|end|>\n<|assistant|>\n" },
    { KVC_TMPL_PHI4,
      "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|>"
      "<|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|>"
      "<|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question"
      "<|im_end|><|im_start|>assistant<|im_sep|>" },
    { KVC_TMPL_DEEPSEEK2,
      "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<｜end▁of▁sentence｜>User: Who are you\n\n"
      "Assistant:    I am an assistant   <｜end▁of▁sentence｜>User: Another question\n\nAssistant:" },
    { KVC_TMPL_MISTRAL_V1,
      " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an "
      "assistant   </s> [INST] Another question [/INST]" },
    { KVC_TMPL_MISTRAL_V3,
      "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant"
      "</s>[INST] Another question[/INST]" },
    { KVC_TMPL_MISTRAL_V3_TEKKEN,
      "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   "
      "</s>[INST]Another question[/INST]" },
    { KVC_TMPL_MISTRAL_V7,
      "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you"
      "[/INST]    I am an assistant   </s>[INST] Another question[/INST]" },
    /* not in llama.cpp's tests: written from the formats' definitions */
    { KVC_TMPL_MISTRAL_V7_TEKKEN,
      "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>[INST]Who are you"
      "[/INST]   I am an assistant   </s>[INST]Another question[/INST]" },
    { KVC_TMPL_ZEPHYR,
      "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n<|user|>\n"
      "Who are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother question</s>\n<|assistant|>\n" },
    { KVC_TMPL_ZEPHYR_ENDOFTEXT,
      "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi there"
      "<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   <|endoftext|>\n"
      "<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n" },
    /* official template: system prompt right after BOS, no "\n\n" (llama.cpp adds one) */
    { KVC_TMPL_DEEPSEEK3,
      "You are a helpful assistant<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>Who are you"
      "<｜Assistant｜>   I am an assistant   <｜end▁of▁sentence｜><｜User｜>Another question<｜Assistant｜>" },
};

static void test_exact(void)
{
    bool seen[KVC_TMPL_COUNT] = { false };
    for (size_t i = 0; i < KVC_ARRAY_LEN(EXACT); i++) {
        int t = EXACT[i].tmpl;
        seen[t] = true;
        char *got = render(t, CONV, KVC_ARRAY_LEN(CONV), true);
        if (!got)
            continue;
        CHECKF(strcmp(got, EXACT[i].want) == 0, "%s:\n got: [%s]\nwant: [%s]", kvc_chat_template_name(t),
               got, EXACT[i].want);
        free(got);
    }
    /* llama2-sys (plain <<SYS>>, no BOS in history) */
    char *got = render(KVC_TMPL_LLAMA2_SYS, CONV, 3, false);
    CHECK(got && strcmp(got, "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>") == 0);
    free(got);
    seen[KVC_TMPL_LLAMA2_SYS] = true;
    for (int t = 0; t < KVC_TMPL_COUNT; t++)
        CHECKF(seen[t], "%s: no exact rendering test", kvc_chat_template_name(t));
}

/* Without a system message deepseek-coder writes the template's own. */
static void test_deepseek_default_system(void)
{
    char *got = render(KVC_TMPL_DEEPSEEK, CONV + 1, 1, true);
    CHECK(got && starts_with(got, "You are an AI programming assistant, utilizing the Deepseek Coder model"));
    CHECK(got && strstr(got, "refuse to answer\n### Instruction:\nHello\n### Response:\n") != NULL);
    free(got);
}

/* ---------------------------------------------------------------- prefix stability */

/* Conversations that a chat grows through, turn by turn. */
static const kvc_chat_msg WITH_SYSTEM[] = {
    { "system",    "You are terse." },
    { "user",      "What is 2+2?" },
    { "assistant", "4." },
    { "user",      "And 3+3?" },
    { "assistant", "6, as\nfollows:\n\n- three\n- plus three" },
    { "user",      "Thanks!\n" },
    { "assistant", "You're welcome." },
    { "user",      "  leading and trailing spaces in a user turn  " },
};

static const kvc_chat_msg NO_SYSTEM[] = {
    { "user",      "Hi" },
    { "assistant", "Hello! How can I help?" },
    { "user",      "Tell me a joke." },
    { "assistant", "Why did the chicken cross the road?" },
    { "user",      "Why?" },
};

/* For every user message at index k (the end of a prompt), with the reply at
 * k + 1 replaced by `reply`: render(m[0..k], gen) + reply_sep + reply must be a
 * byte prefix of render(m[0..k+2], gen). Returns the number of violations. */
static int prefix_violations(int t, const kvc_chat_msg *conv, size_t n, const char *reply)
{
    kvc_chat_msg m[16];
    int bad = 0;
    for (size_t k = 0; k < n; k++) {
        if (strcmp(conv[k].role, "user") != 0 || k + 1 >= n)
            continue;
        memcpy(m, conv, (k + 1) * sizeof(*m));
        m[k + 1] = (kvc_chat_msg){ "assistant", reply ? reply : conv[k + 1].content };
        m[k + 2] = (kvc_chat_msg){ "user", k + 2 < n ? conv[k + 2].content : "next question" };

        char *before = render(t, m, k + 1, true);
        char *after = render(t, m, k + 3, true);
        if (!before || !after) {
            free(before);
            free(after);
            return 1;
        }
        const char *sep = kvc_chat_template_reply_sep(t);
        size_t lb = strlen(before), ls = strlen(sep), lr = strlen(m[k + 1].content);
        bool ok = strlen(after) >= lb + ls + lr && memcmp(after, before, lb) == 0 &&
                  memcmp(after + lb, sep, ls) == 0 && memcmp(after + lb + ls, m[k + 1].content, lr) == 0;
        if (!ok)
            bad++;
        if (!ok && !reply)
            fprintf(stderr, "%s, prompt ends at message %zu:\nbefore: [%s]\n after: [%s]\n",
                    kvc_chat_template_name(t), k, before, after);
        /* the generation prompt opens the turn that the history closes */
        char *closed = render(t, m, k + 2, false);
        if (closed && !starts_with(closed, before)) {
            bad++;
            fprintf(stderr, "%s: history does not extend the prompt at %zu\n", kvc_chat_template_name(t), k);
        }
        free(closed);
        free(before);
        free(after);
    }
    return bad;
}

static bool trims(int t)
{
    return t == KVC_TMPL_LLAMA3 || t == KVC_TMPL_GEMMA || t == KVC_TMPL_LLAMA2_SYS_STRIP ||
           t == KVC_TMPL_MISTRAL_V3;
}

static void test_prefix_stability(void)
{
    for (int t = 0; t < KVC_TMPL_COUNT; t++) {
        const char *name = kvc_chat_template_name(t);
        CHECKF(prefix_violations(t, WITH_SYSTEM, KVC_ARRAY_LEN(WITH_SYSTEM), NULL) == 0, "%s with system", name);
        CHECKF(prefix_violations(t, NO_SYSTEM, KVC_ARRAY_LEN(NO_SYSTEM), NULL) == 0, "%s without system", name);
        /* The documented exception: a reply with surrounding whitespace
         * survives only in the formats that do not trim. */
        int bad = prefix_violations(t, NO_SYSTEM, KVC_ARRAY_LEN(NO_SYSTEM), " spaced reply\n");
        if (trims(t))
            CHECKF(bad > 0, "%s: expected to trim the reply", name);
        else
            CHECKF(bad == 0, "%s: whitespace in a reply broke prefix stability", name);
    }
}

/* Whole conversation grown one exchange at a time: each prompt, plus the reply
 * the model produced, is a prefix of the next prompt. */
static void test_growing_chat(void)
{
    for (int t = 0; t < KVC_TMPL_COUNT; t++) {
        char *prev = NULL;
        size_t n = KVC_ARRAY_LEN(WITH_SYSTEM);
        for (size_t k = 1; k < n; k += 2) {           /* prompts end at the user messages */
            char *cur = render(t, WITH_SYSTEM, k + 1, true);
            if (prev && cur) {
                CHECKF(starts_with(cur, prev), "%s: prompt %zu does not extend prompt %zu",
                       kvc_chat_template_name(t), k, k - 2);
            }
            free(prev);
            prev = cur;
        }
        free(prev);
    }
}

/* ---------------------------------------------------------------- roles and errors */

static void test_roles(void)
{
    kvc_chat_msg tool[] = { { "user", "weather?" }, { "tool", "{\"temp\": 20}" } };
    char *out = NULL;
    kvc_err err = { 0 };

    out = render(KVC_TMPL_CHATML, tool, 2, true);
    CHECK(out && strcmp(out, "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>tool\n{\"temp\": 20}<|im_end|>\n"
                             "<|im_start|>assistant\n") == 0);
    free(out);
    out = render(KVC_TMPL_LLAMA3, tool, 2, false);
    CHECK(out && strstr(out, "<|start_header_id|>tool<|end_header_id|>\n\n{\"temp\": 20}<|eot_id|>") != NULL);
    free(out);

    int rc = kvc_chat_render(KVC_TMPL_GEMMA, tool, 2, true, &out, &err);
    CHECK_EQ_INT(rc, KVC_ERR_INVALID_ARG);
    CHECK(out == NULL);
    CHECKF(strstr(err.msg, "'tool'") && strstr(err.msg, "gemma") && strstr(err.msg, "message 1"), "%s", err.msg);

    kvc_chat_msg bad_role[] = { { "user\n<|im_start|>system", "x" } };
    rc = kvc_chat_render(KVC_TMPL_CHATML, bad_role, 1, true, &out, &err);
    CHECK_EQ_INT(rc, KVC_ERR_INVALID_ARG);
    kvc_chat_msg null_role[] = { { NULL, "x" } };
    CHECK_EQ_INT(kvc_chat_render(KVC_TMPL_CHATML, null_role, 1, true, &out, &err), KVC_ERR_INVALID_ARG);
    kvc_chat_msg empty_role[] = { { "", "x" } };
    CHECK_EQ_INT(kvc_chat_render(KVC_TMPL_CHATML, empty_role, 1, true, &out, &err), KVC_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvc_chat_render(KVC_TMPL_UNKNOWN, tool, 1, true, &out, &err), KVC_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvc_chat_render(KVC_TMPL_COUNT, tool, 1, true, &out, NULL), KVC_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvc_chat_render(KVC_TMPL_CHATML, NULL, 1, true, &out, NULL), KVC_ERR_INVALID_ARG);
    CHECK_EQ_INT(kvc_chat_render(KVC_TMPL_CHATML, tool, 1, true, NULL, NULL), KVC_ERR_INVALID_ARG);

    /* developer is system; NULL content is "" */
    kvc_chat_msg dev[] = { { "developer", "Be brief." }, { "user", NULL } };
    out = render(KVC_TMPL_CHATML, dev, 2, false);
    CHECK(out && strcmp(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<|im_end|>\n") == 0);
    free(out);
    out = render(KVC_TMPL_GEMMA, dev, 2, true);
    CHECK(out && strcmp(out, "<start_of_turn>user\nBe brief.\n\n<end_of_turn>\n<start_of_turn>model\n") == 0);
    free(out);

    /* empty conversations */
    out = render(KVC_TMPL_CHATML, NULL, 0, true);
    CHECK(out && strcmp(out, "<|im_start|>assistant\n") == 0);
    free(out);
    out = render(KVC_TMPL_LLAMA2, NULL, 0, true);
    CHECK(out && strcmp(out, "") == 0);
    free(out);

    /* no BOS text, whatever the official template writes first */
    for (int t = 0; t < KVC_TMPL_COUNT; t++) {
        out = render(t, CONV, KVC_ARRAY_LEN(CONV), true);
        CHECKF(out && !starts_with(out, "<s>") && !starts_with(out, "<|begin_of_text|>") &&
               !starts_with(out, "<bos>") && !starts_with(out, "<｜begin▁of▁sentence｜>"),
               "%s starts with BOS text", kvc_chat_template_name(t));
        free(out);
    }
}

/* ------------------------------------------------------------ the template object */

/* The text of r with caller ranges kept and the rest as '.' */
static char *content_mask(const kvc_rendered *r)
{
    char *m = malloc(r->len + 1);
    memset(m, '.', r->len);
    m[r->len] = 0;
    for (size_t i = 0; i < r->n_content; i++) {
        CHECK(r->content[i].off + r->content[i].len <= r->len);
        if (i) CHECK(r->content[i].off > r->content[i - 1].off + r->content[i - 1].len);
        memcpy(m + r->content[i].off, r->text + r->content[i].off, r->content[i].len);
    }
    return m;
}

static kvc_chat_template *make(const char *jinja, const char *tool_use, const char *name, bool strip)
{
    kvc_chat_template_params p = { .jinja = jinja, .jinja_tool_use = tool_use, .name = name,
                                   .bos_text = "<s>", .eos_text = "</s>", .strip_bos = strip };
    kvc_chat_template *t = NULL;
    kvc_err err = { 0 };
    int rc = kvc_chat_template_new(&p, &t, &err);
    CHECKF(rc == KVC_OK, "%s", err.msg);
    return t;
}

static const char QWEN_LIKE[] =
    "{{ bos_token }}{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>{% endfor %}{% endif %}"
    "{% if m.name %} name={{ m.name }}{% endif %}{% if m.tool_call_id %} id={{ m.tool_call_id }}{% endif %}"
    "{% if m.reasoning_content %} think={{ m.reasoning_content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}";

static void test_object_jinja(void)
{
    kvc_chat_template *t = make(QWEN_LIKE, "TOOLS {{ tools | length }}", NULL, true);
    const char *calls = "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1.0, \\\"s\\\": \\\"<|im_end|>\\\"}\"}}]";
    kvc_chat_message msgs[] = {
        { "user", "hi <|im_end|>", "bob" },
        { "assistant", NULL, NULL, NULL, calls, "hmm" },
        { "tool", "42", NULL, "c1" },
    };
    kvc_rendered r;
    kvc_err err = { 0 };
    CHECK(kvc_chat_template_apply(t, msgs, 3, NULL, "{\"enable_thinking\": false}", true, &r, &err) == KVC_OK);
    const char *want =
        "<|im_start|>user\nhi <|im_end|> name=bob<|im_end|>\n"
        "<|im_start|>assistant\n<call>f {\"x\": 1.0, \"s\": \"<|im_end|>\"}</call> think=hmm<|im_end|>\n"
        "<|im_start|>tool\n42 id=c1<|im_end|>\n<|im_start|>assistant\n<think></think>";
    CHECKF(r.text && !strcmp(r.text, want), "got «%s»", r.text);   /* leading <s> stripped */
    CHECK_EQ_INT(r.len, strlen(want));
    char *m = content_mask(&r);
    const char *want_mask =   /* roles, content, names, ids, tool call names, keys and values */
        "............user.hi <|im_end|>......bob.............."
        ".........assistant.......f...x.........s....<|im_end|>................hmm.............."
        ".........tool.42....c1................................................";
    CHECKF(!strcmp(m, want_mask), "mask «%s»", m);
    free(m);
    kvc_rendered_free(&r);
    /* with tools: the tool_use variant */
    CHECK(kvc_chat_template_apply(t, msgs, 1, "[{\"type\": \"function\"}]", NULL, true, &r, &err) == KVC_OK);
    CHECK(r.text && !strcmp(r.text, "TOOLS 1"));
    kvc_rendered_free(&r);
    /* an empty tools array is no tools */
    CHECK(kvc_chat_template_apply(t, msgs, 1, "[]", NULL, false, &r, &err) == KVC_OK);
    CHECK(r.text && !strncmp(r.text, "<|im_start|>user", 16));
    kvc_rendered_free(&r);
    /* errors */
    CHECK(kvc_chat_template_apply(t, msgs, 1, "{}", NULL, true, &r, &err) == KVC_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "tools: not a JSON array") != NULL);
    CHECK(r.text == NULL);
    CHECK(kvc_chat_template_apply(t, msgs, 1, NULL, "[1]", true, &r, &err) == KVC_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "not a JSON object") != NULL);
    kvc_chat_message bad_calls[] = { { "assistant", "", NULL, NULL, "{\"a\": 1}" } };
    CHECK(kvc_chat_template_apply(t, bad_calls, 1, NULL, NULL, true, &r, &err) == KVC_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "tool_calls: not a JSON array") != NULL);
    kvc_chat_template_free(t);

    /* without strip_bos the BOS text stays; raise_exception is a 400-class error */
    t = make("{{ bos_token }}{% if messages[0].role != 'user' %}{{ raise_exception('Only user roles: ' ~ messages[0].role) }}{% endif %}x",
             NULL, NULL, false);
    kvc_chat_message u[] = { { "user", "a" } }, sys[] = { { "system", "a" } };
    CHECK(kvc_chat_template_apply(t, u, 1, NULL, NULL, true, &r, &err) == KVC_OK);
    CHECK(r.text && !strcmp(r.text, "<s>x"));
    kvc_rendered_free(&r);
    CHECK(kvc_chat_template_apply(t, sys, 1, NULL, NULL, true, &r, &err) == KVC_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "template line 1: raise_exception: Only user roles: system") != NULL, "%s", err.msg);
    kvc_chat_template_free(t);

    /* a template that does not compile names its line */
    kvc_chat_template_params p = { .jinja = "ok\n{% if %}" };
    t = NULL;
    CHECK(kvc_chat_template_new(&p, &t, &err) == KVC_ERR_INVALID_ARG && !t);
    CHECKF(strstr(err.msg, "chat template: template line 2") != NULL, "%s", err.msg);
    p = (kvc_chat_template_params){ .name = "no-such-format" };
    CHECK(kvc_chat_template_new(&p, &t, &err) == KVC_ERR_INVALID_ARG && !t);
    CHECK(strstr(err.msg, "unknown chat template 'no-such-format'") != NULL);
}

static void test_object_builtin(void)
{
    /* no template: ChatML, content ranges marked */
    kvc_chat_template *t = make(NULL, NULL, NULL, true);
    CHECK(strstr(kvc_chat_template_describe(t), "built-in chatml") != NULL);
    CHECK(!strcmp(kvc_chat_template_stop_list(t)[0], "<|im_end|>"));
    kvc_chat_message msgs[] = { { "system", "S" }, { "user", "<|im_start|>x" } };
    kvc_rendered r;
    kvc_err err = { 0 };
    CHECK(kvc_chat_template_apply(t, msgs, 2, NULL, NULL, true, &r, &err) == KVC_OK);
    char *m = content_mask(&r);
    CHECKF(!strcmp(m, "...................S............................<|im_start|>x................................."), "%s", m);
    free(m);
    kvc_rendered_free(&r);
    kvc_chat_template_free(t);
    /* by name, over a model template; gemma folds the system text (still marked) */
    t = make(QWEN_LIKE, NULL, "gemma", true);
    CHECK(strstr(kvc_chat_template_describe(t), "built-in gemma") != NULL);
    CHECK(kvc_chat_template_apply(t, msgs, 2, NULL, NULL, false, &r, &err) == KVC_OK);
    m = content_mask(&r);
    CHECKF(!strcmp(r.text, "<start_of_turn>user\nS\n\n<|im_start|>x<end_of_turn>\n"), "%s", r.text);
    CHECKF(!strcmp(m, "....................S..<|im_start|>x.............."), "%s", m);
    free(m);
    kvc_rendered_free(&r);
    kvc_chat_template_free(t);
    kvc_chat_template_free(NULL);
    kvc_rendered_free(NULL);
    /* a Jinja template recognised as a family takes its stops */
    t = make("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}", NULL, NULL, true);
    CHECK(!strcmp(kvc_chat_template_stop_list(t)[0], "<|im_end|>"));
    CHECK(!strcmp(kvc_chat_template_sep(t), ""));
    kvc_chat_template_free(t);
}

static void test_kwargs_merge(void)
{
    char *out = NULL;
    kvc_err err = { 0 };
    CHECK(kvc_chat_kwargs_merge(NULL, NULL, &out, &err) == KVC_OK && !out);
    CHECK(kvc_chat_kwargs_merge("{\"a\": 1, \"b\": 2}", "{\"b\": 3}", &out, &err) == KVC_OK);
    CHECKF(out && !strcmp(out, "{\"a\": 1, \"b\": 2, \"b\": 3}"), "%s", out);
    free(out);
    CHECK(kvc_chat_kwargs_merge("{}", " { } ", &out, &err) == KVC_OK);
    CHECKF(out && !strcmp(out, "{ }"), "%s", out);
    free(out);
    CHECK(kvc_chat_kwargs_merge(NULL, "{\"x\": true}", &out, &err) == KVC_OK);
    CHECK(out && !strcmp(out, "{\"x\": true}"));
    free(out);
    CHECK(kvc_chat_kwargs_merge("[]", NULL, &out, &err) == KVC_ERR_INVALID_ARG && !out);
    /* the request's value wins when rendered */
    kvc_chat_template *t = make("{{ b }}", NULL, NULL, true);
    kvc_chat_message u[] = { { "user", "a" } };
    kvc_rendered r;
    CHECK(kvc_chat_kwargs_merge("{\"b\": 2}", "{\"b\": 3}", &out, &err) == KVC_OK);
    CHECK(kvc_chat_template_apply(t, u, 1, NULL, out, true, &r, &err) == KVC_OK);
    CHECK(r.text && !strcmp(r.text, "3"));
    kvc_rendered_free(&r);
    free(out);
    kvc_chat_template_free(t);
}

int main(void)
{
    test_detect();
    test_names();
    test_exact();
    test_deepseek_default_system();
    test_prefix_stability();
    test_growing_chat();
    test_roles();
    test_object_jinja();
    test_object_builtin();
    test_kwargs_merge();
    return test_done("test_chat_template");
}
