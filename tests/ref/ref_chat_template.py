"""Chat templates rendered by the real jinja2, for test_chat_template.

Debian's python3-jinja2 (3.1) renders every case here; the C++ test renders
the same template with the same variables through loom::serve::jinja and
must produce the same string, or an error containing the recorded substring.

Two groups of cases:
  * published: Hugging Face chat templates (tokenizer_config.json's
    `chat_template`) for Llama-2/3/3.1, ChatML and Qwen2/2.5, Mistral
    v0.1/v0.2/v0.3, Zephyr, Gemma, Phi-3 and DeepSeek-R1-distill, each on several
    conversations, with add_generation_prompt true and false, in the
    environment transformers uses: ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True) with loopcontrols and a
    raise_exception global. A template that raises (roles that do not
    alternate, a system message Gemma refuses) is an expected error whose
    substring is the template's own message.
  * features: small templates, one or a few features each, in that
    environment or in plain jinja2.Environment() (trim_blocks and
    lstrip_blocks off) or with keep_trailing_newline. An error case names a
    substring that both jinja2's message and loom's must contain.

Both environments get transformers' tojson filter (json.dumps with
ensure_ascii=False, keys in their order, no HTML escapes) in place of
jinja2's own. Dicts given to a template here have their keys in sorted
order (tests/ref/ref_jinja_cases.py gives them in other orders).

Output (in argv[1]): chat_template_cases.json
  {"jinja2": version, "cases": [{"group", "name", "template",
    "options": {"trim_blocks", "lstrip_blocks", "keep_trailing_newline"},
    "variables", and "expected" (the output) or "error" (a substring)}]}
"""
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What transformers' raise_exception global raises."""


def raise_exception(message):
    raise RaisedByTemplate(message)


class AssistantTracker(Extension):
    """transformers' {% generation %} block, which renders its body (and
    records where, for assistant masks)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def transformers_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' replacement for jinja2's tojson filter."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# --- Published chat templates (data: as Hugging Face ships them) -----------

# meta-llama/Llama-2-7b-chat-hf
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

# meta-llama/Meta-Llama-3-8B-Instruct
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# meta-llama/Llama-3.1-8B-Instruct (tools optional)
LLAMA31 = (r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON"""
r""" for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] |"""
r""" trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
""")

# teknium/OpenHermes-2.5-Mistral-7B (ChatML)
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen/Qwen2-7B-Instruct (ChatML with a default system message)
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen/Qwen2.5-7B-Instruct (tools optional)
QWEN25 = (r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are"""
r""" provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments"""
r""" within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>,"""
r""" \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or"""
r""" (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""")

# mistralai/Mistral-7B-Instruct-v0.1, as first published
MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

# mistralai/Mistral-7B-Instruct-v0.2 (v0.1's without the space after eos_token)
MISTRAL_V02 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

# mistralai/Mistral-7B-Instruct-v0.1, the later revision with an optional
# system message (written out from memory: indentation may differ from HF's)
MISTRAL_V01_SYSTEM = (r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate"""
r""" user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an"""
r""" initial optional system message!') }}
    {%- endif %}
{%- endfor %}
""")

# mistralai/Mistral-7B-Instruct-v0.3 (tools optional)
MISTRAL_V03 = (r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is"""
r""" defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must"""
r""" alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an"""
r""" initial optional system message!") }}
    {%- endif %}
{%- endfor %}
""")

# HuggingFaceH4/zephyr-7b-beta (its newlines are trim_blocks' business)
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)

# google/gemma-7b-it
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# microsoft/Phi-3-mini-4k-instruct
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# microsoft/Phi-3-mini-4k-instruct, its first revision
PHI3_V1 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
    "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') %}"
    "{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}"
)

# deepseek-ai/DeepSeek-R1-Distill-Llama-8B (drops earlier <think> blocks)
DEEPSEEK_R1 = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}"
    "{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<\uff5cUser\uff5c>' + message['content']}}"
    "{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}"
    "{{'<\uff5ctool\u2581outputs\u2581end\uff5c>' + message['content'] + '<\uff5cend\u2581of\u2581sentence\uff5c>'}}"
    "{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<\uff5cAssistant\uff5c>' + content + '<\uff5cend\u2581of\u2581sentence\uff5c>'}}{%- endif %}{%- endif %}"
    "{%- endfor -%}{% if add_generation_prompt and not ns.is_tool %}{{'<\uff5cAssistant\uff5c><think>\\n'}}{% endif %}"
)

PUBLISHED = {
    "llama2": LLAMA2, "llama3": LLAMA3, "llama3.1": LLAMA31, "chatml": CHATML, "qwen2": QWEN2, "qwen2.5": QWEN25,
    "mistral-v0.1": MISTRAL_V01, "mistral-v0.1-system": MISTRAL_V01_SYSTEM, "mistral-v0.2": MISTRAL_V02,
    "mistral-v0.3": MISTRAL_V03,
    "zephyr": ZEPHYR, "gemma": GEMMA, "phi3": PHI3, "phi3-v1": PHI3_V1, "deepseek-r1": DEEPSEEK_R1,
}


def msg(role, content):
    return {"content": content, "role": role}


SYSTEM = msg("system", "You are a helpful assistant.")
CONVERSATIONS = {
    "one user turn": [msg("user", "Hello")],
    "multi-turn": [msg("user", "Hello"), msg("assistant", "Hi there"), msg("user", "Who are you?")],
    "system first": [SYSTEM, msg("user", "Hello"), msg("assistant", "Hi there"), msg("user", "Who are you?")],
    "long": [SYSTEM] + [msg("user" if i % 2 == 0 else "assistant", f"turn {i}") for i in range(7)],
    "empty content": [msg("user", ""), msg("assistant", ""), msg("user", "")],
    "unicode": [msg("user", "Grüße, 世界! 😀 — ¿qué tal? naïve café"), msg("assistant", "Ответ: да ✓"),
                msg("user", "日本語でお願いします")],
    "quotes and newlines": [msg("user", 'He said "hi" and it\'s fine\n\n  indented\ttab\\ back'),
                            msg("assistant", "  padded answer with <tags> & {{ braces }} {% tags %}  \n"),
                            msg("user", "line one\r\nline two\n")],
    "ends with assistant": [msg("user", "Hi"), msg("assistant", "Hello! How can I help?")],
    "roles do not alternate": [msg("user", "one"), msg("user", "two")],
    "system only": [SYSTEM],
    "assistant first": [msg("assistant", "I speak first"), msg("user", "ok")],
    "reasoning": [msg("user", "2+2?"), msg("assistant", "<think>\nadd\n</think>\n\n4"), msg("user", "3+3?")],
}

TOOL = {"function": {"description": "Get the weather", "name": "get_weather",
                     "parameters": {"properties": {"city": {"description": "City <name> & 'quote'", "type": "string"}},
                                    "required": ["city"], "type": "object"}},
        "type": "function"}
TOOL_CALL_CONVERSATION = [
    msg("user", "Weather in Paris?"),
    {"content": "", "role": "assistant",
     "tool_calls": [{"function": {"arguments": {"city": "Paris", "unit": "C"}, "name": "get_weather"},
                     "id": "abc123XYZ", "type": "function"}]},
    {"content": "22 degrees", "role": "tool", "tool_call_id": "abc123XYZ"},
]

# --- Feature cases -----------------------------------------------------------

CHAT = "chat"      # ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) + loopcontrols
PLAIN = "plain"    # jinja2.Environment() defaults
KEEP_NL = "keep"   # the chat environment with keep_trailing_newline=True

MESSAGES = CONVERSATIONS["system first"]
V = {"messages": MESSAGES, "xs": [3, 1, 2], "d": {"a": 1, "b": "two", "c": [1, 2]}, "s": "Hello World",
     "n": None, "t": True, "f": 2.5, "i": 7, "empty": "", "nested": {"k": {"m": [10, 20, 30]}}}

# (name, template, variables, environment, expected error substring or None)
FEATURES = [
    ("text only", "plain text, no tags", {}, CHAT, None),
    ("select, map and unique give generators", "{% if [1]|select('odd') %}a{% endif %}{% if []|select('odd') %}b"
     "{% endif %}{{ [1,2,3]|select('odd')|list|length }}{{ [1,2]|map('string')|join(',') }}{% if [1,1]|unique %}c"
     "{% endif %}{{ [1,2]|select('odd')|first }}", {}, CHAT, None),
    ("a generator has no length", "{{ messages|selectattr('role', 'equalto', 'user')|length }}", V, CHAT,
     "object of type 'generator' has no len()"),
    ("a generator has no count", "{{ [1,2]|unique|count }}", {}, CHAT, "object of type 'generator' has no len()"),
    ("a generator has no last", "{{ [1,2]|map('string')|last }}", {}, CHAT, "'generator' object is not reversible"),
    ("print variables", "{{ s }}|{{ i }}|{{ f }}|{{ t }}|{{ n }}|{{ xs }}|{{ d }}", V, CHAT, None),
    ("undefined prints nothing", "[{{ missing }}][{{ d.missing }}][{{ xs[10] }}][{{ n.attr }}]", V, CHAT, None),
    ("numbers print as Python", "{{ 1 }} {{ -0.0 }} {{ 1.0 }} {{ 0.5 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 123456789.125 }} "
     "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 10 / 2 }} {{ 2 ** 62 }} {{ 1e308 * 10 }}", {}, CHAT, None),
    ("reprs of containers", "{{ [1, 'a', none, true, 2.0, [], {}] }} {{ {'k': \"it's\", 'q': 'say \"x\"'} }} "
     "{{ ['tab\\t', 'nl\\n', 'back\\\\slash', 'both \\' \"'] }}", {}, CHAT, None),
    ("string literals and escapes", "{{ 'single' }} {{ \"double\" }} {{ 'a\\nb\\tc\\\\d\\'e\\\"f' }} "
     "{{ '\\x41\\u00e9\\U0001F600\\101' }} {{ 'unknown \\q escape' }} {{ 'adjacent' \" strings\" }}", {}, CHAT, None),
    ("arithmetic", "{{ 7 + 2 }} {{ 7 - 9 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} "
     "{{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + 2.0 }} "
     "{{ true + true }} {{ -i }} {{ +f }} {{ (1 + 2) * 3 }} {{ 2 * 3 ** 2 }}", V, CHAT, None),
    ("string and list operators", "{{ 'ab' + 'cd' }} {{ [1] + [2, 3] }} {{ 'ab' * 3 }} {{ 2 * [0] }} "
     "{{ 'x' * 0 }}|{{ 'n=' ~ 1 ~ none ~ true ~ [1] ~ 2.5 }} {{ 'a' ~ missing ~ 'b' }}", {}, CHAT, None),
    ("comparisons", "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} "
     "{{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} {{ [1] < [1, 0] }} {{ 2 >= 2.0 }} {{ 'b' <= 'a' }} "
     "{{ {'a': [1]} == {'a': [true]} }} {{ none == none }} {{ missing == missing }} {{ missing == none }}",
     {}, CHAT, None),
    ("in and not in", "{{ 'ell' in s }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' not in d }} {{ 4 not in xs }} "
     "{{ 'x' in missing }} {{ not 1 in xs }}", V, CHAT, None),
    ("and or not return operands", "[{{ t and 'yes' }}][{{ 0 or 'fallback' }}][{{ '' or [] }}][{{ none and 1 }}]"
     "[{{ not n }}][{{ missing or 'd' }}][{{ missing and 1 }}]", V, CHAT, None),
    ("conditional expression", "{{ 'yes' if t else 'no' }} {{ 'yes' if n else 'no' }} [{{ 'only' if n }}] "
     "{{ 1 if false else 2 if false else 3 }}", V, CHAT, None),
    ("subscripts and attributes", "{{ d.a }} {{ d['b'] }} {{ xs[0] }} {{ xs[-1] }} {{ nested.k.m[1] }} "
     "{{ nested['k']['m'][-1] }} {{ s[0] }} {{ s[-1] }} {{ xs.1 }} {{ messages[0].role }}", V, CHAT, None),
    ("slices", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ xs[5:] }} "
     "{{ s[:5] }} {{ s[::-1] }} {{ s[6:100] }} {{ 'héllo'[1:3] }} {{ [1, 2, 3, 4, 5][-1:0:-2] }}", V, CHAT, None),
    ("list and dict literals", "{{ [] }} {{ [1, [2, [3]]] }} {{ {'a': {'c': [true]}, 'b': 1} }} "
     "{{ {'k': 'v'}['k'] }} {{ [1, 2,] }} {{ (1, 2)[0] }}", {}, CHAT, None),
    ("if elif else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %};"
     "{% endfor %}{% if missing %}no{% elif n %}no{% else %}else{% endif %}", V, CHAT, None),
    ("for loop variables", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
     "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}]"
     "{{ loop.cycle('odd', 'even') }};{% endfor %}", {}, CHAT, None),
    ("for else", "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in missing %}x{% else %}undefined{% endfor %}",
     {}, CHAT, None),
    ("for with a filter", "{% for x in range(10) if x is odd %}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"
     " {% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }} {% endfor %}", V, CHAT, None),
    ("for over a string and a dict", "{% for c in 'abc' %}{{ c }}-{% endfor %} {% for k in d %}{{ k }}{% endfor %}",
     V, CHAT, None),
    ("for k, v over items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} "
     "{% for k, v in d | items %}{{ k }};{% endfor %} {% for a, b in [[1, 2], 'xy'] %}{{ a }}{{ b }}{% endfor %}",
     V, CHAT, None),
    ("nested loops", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}"
     "{{ loop.index }}|{% endfor %}", {}, CHAT, None),
    ("break and continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}"
     "{% break %}{% endif %}{{ i }}{% endfor %}", {}, CHAT, None),
    ("set scoping", "{% set a = 1 %}{% for x in [1, 2] %}{{ a }}{% set a = a + 10 %}{{ a }};{% endfor %}{{ a }}"
     "{% if true %}{% set b = 'if leaks' %}{% endif %} {{ b }} {% for x in [1] %}{% set c = 1 %}{% endfor %}[{{ c }}]",
     {}, CHAT, None),
    ("set does not carry across iterations", "{% for i in [1, 2] %}{% if i == 1 %}{% set y = 'a' %}{% endif %}"
     "[{{ y }}]{% endfor %}", {}, CHAT, None),
    ("namespace", "{% set ns = namespace(total=0, seen=false) %}{% for x in [1, 2, 3] %}"
     "{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.seen = true %}{% endif %}{% endfor %}"
     "{{ ns.total }} {{ ns.seen }} {% set ns.new = 'n' %}{{ ns.new }} [{{ ns.absent }}] {{ ns }}", {}, CHAT, None),
    ("set block", "{% set greeting %}Hi {{ s }}!{% endset %}[{{ greeting }}] {{ greeting | length }}", V, CHAT, None),
    ("comments", "a{# a comment #}b{# {{ not evaluated }} #}c", {}, CHAT, None),
    ("tests", "{{ d is defined }} {{ missing is defined }} {{ missing is undefined }} {{ n is none }} "
     "{{ s is string }} {{ i is number }} {{ f is number }} {{ t is number }} {{ d is mapping }} {{ xs is mapping }} "
     "{{ xs is iterable }} {{ i is iterable }} {{ s is sequence }} {{ t is boolean }} {{ 1 is boolean }} "
     "{{ t is true }} {{ 1 is true }} {{ false is false }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} "
     "{{ 10 is divisibleby(3) }} {{ d is not none }} {{ n is not none }} {{ i is integer }} {{ f is float }} "
     "{{ 'a' is eq 'a' }} {{ 2 is gt 1 }} {{ 2 is in xs }} {{ missing is iterable }}", V, CHAT, None),
    ("test argument without parentheses", "{{ 'x' if 6 is divisibleby 3 else 'y' }} "
     "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}", V, CHAT, None),
    ("filters on strings", "[{{ '  pad  ' | trim }}][{{ 'xxhixx' | trim('x') }}][{{ s | upper }}][{{ s | lower }}]"
     "[{{ 'hello world-wide (x)' | title }}][{{ 'hELLO wORLD' | capitalize }}][{{ s | length }}][{{ s | count }}]"
     "[{{ 'naïve' | length }}][{{ s | replace('l', 'L') }}][{{ s | replace('l', 'L', 2) }}][{{ s | reverse }}]"
     "[{{ 'abc' | replace('', '-') }}][{{ 42 | string }}][{{ none | string }}]", V, CHAT, None),
    ("default filter", "[{{ missing | default('d') }}][{{ missing | d('short') }}][{{ n | default('not used') }}]"
     "[{{ '' | default('empty', true) }}][{{ 0 | d('zero', boolean=true) }}][{{ s | default('x') }}]"
     "[{{ missing | default }}]", V, CHAT, None),
    ("list filters", "{{ xs | first }} {{ xs | last }} {{ xs | length }} {{ xs | join }} {{ xs | join(', ') }} "
     "{{ xs | sort }} {{ xs | sort(reverse=true) }} {{ xs | reverse | list }} {{ 'abc' | list }} {{ d | list }} "
     "{{ ['b', 'A', 'a', 'C'] | sort }} {{ ['b', 'A', 'a', 'C'] | sort(case_sensitive=true) }} [{{ [] | first }}]",
     V, CHAT, None),
    ("int and float filters", "{{ '12' | int + 1 }} {{ '1_000' | int }} {{ ' 7 ' | int }} {{ '3.9' | int }} "
     "{{ 'x' | int }} {{ 'x' | int(5) }} {{ 3.99 | int }} {{ true | int }} {{ '2.5' | float }} {{ 3 | float }} "
     "{{ 'x' | float }} {{ '1e3' | float }}", {}, CHAT, None),
    ("tojson", "{{ d | tojson }} {{ \"<a href='x'>&amp;</a>\" | tojson }} {{ 'ünï😀' | tojson }} {{ n | tojson }} "
     "{{ [1.0, 2.5, true, none] | tojson }} {{ {'z': 1, 'a': {'y': [], 'b': {}}} | tojson }}", V, CHAT, None),
    ("tojson gives a plain str; safe and escape give Markup", "{{ '<\"' + d | tojson }} {{ (d | tojson) + '<&>' }} "
     "{{ 'x' | tojson ~ '<' }} {{ ('<a>' | tojson)[1:] + '<' }} {{ (s | tojson | trim) + \"'\" }} "
     "{{ ('a' | safe) + '<' }} {{ '<b>' | e }} {{ ('<' | e) + '<' }} {{ ('x' | tojson).replace('x', '<') }}",
     V, CHAT, None),
    ("tojson indented", "{{ {'b': [1, {'c': 'x'}], 'a': {}, 'e': []} | tojson(indent=4) }}\n"
     "{{ [1, [2]] | tojson(indent=2) }} {{ 'x' | tojson(indent=2) }}", {}, CHAT, None),
    ("items and dict methods", "{{ d | items | list | length }} {% for k, v in d | items %}{{ k }}{% endfor %} "
     "{{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} "
     "{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}", V, CHAT, None),
    ("selectattr rejectattr map", "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') "
     "| join('|') }} {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }} "
     "{{ messages | selectattr('role') | list | length }} {{ messages | selectattr('name', 'undefined') | list "
     "| length }} {{ ['a', 'b'] | map('upper') | join }} {{ [1, 2, 3, 4] | select('even') | list }} "
     "{{ [1, 2, 3, 4] | reject('even') | list }}", V, CHAT, None),
    ("string methods", "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}]"
     "[{{ '\\n\\nx\\n'.strip('\\n') }}][{{ 'xxay'.lstrip('x') }}][{{ s.startswith('Hell') }}]"
     "[{{ s.endswith(('x', 'ld')) }}][{{ s.upper() }}][{{ s.lower() }}][{{ 'they\\'re here'.title() }}]"
     "[{{ 'a-b'.replace('-', '+') }}][{{ ', '.join(['a', 'b']) }}][{{ 'hELLO'.capitalize() }}]", V, CHAT, None),
    ("split", "{{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ '  a  b \\n c '.split() }} "
     "{{ 'x'.split(',') }} {{ 'r</think>a'.split('</think>')[-1] }}", {}, CHAT, None),
    ("range", "{{ range(4) | list }} {{ range(1, 8, 3) | list }} {{ range(3, -1, -1) | list }} "
     "{{ range(0, 3, -1) | list }} {% for i in range(3) %}{{ i }}{% endfor %} {{ range(5) | length }}", {}, CHAT, None),
    ("whitespace control", "a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %}\n  {#- c -#}  \ne", {}, CHAT, None),
    ("trim_blocks and lstrip_blocks", "<ul>\n  {% for x in [1, 2] %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n"
     "  {# note #}\nend\n", {}, CHAT, None),
    ("trim_blocks off", "<ul>\n  {% for x in [1, 2] %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n"
     "  {# note #}\nend\n", {}, PLAIN, None),
    ("plus keeps whitespace", "a\n  {%+ if true %}b{% endif %}\n  {% if true +%}\nc{% endif %}", {}, CHAT, None),
    ("plus keeps whitespace, trim off", "a\n  {%+ if true %}b{% endif %}\n  {% if true +%}\nc{% endif %}",
     {}, PLAIN, None),
    ("keep_trailing_newline", "line {{ 1 }}\n", {}, KEEP_NL, None),
    ("trailing newline dropped once", "line\n\n", {}, CHAT, None),
    ("windows newlines", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}, CHAT, None),
    ("output newlines stay", "{{ 'a' }}\n{{ 'b' }}\n{{ 'c' }}", {}, CHAT, None),
    ("braces inside expressions", "{{ {'a': {'b': 1}} }} {{ '}}' }} {{ '{%' }} {{ [[1]] }}", {}, CHAT, None),
    ("plain environment", "{% for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}\n", V, PLAIN, None),
    ("whitespace control, trim off", "a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %}\n  {#- c -#}  \ne\n"
     "  {% if true %}\n  f\n  {% endif %}\n", {}, PLAIN, None),
    ("keep_trailing_newline, trim on", "{% if true %}\nx\n{% endif %}\n\n", {}, KEEP_NL, None),
    ("macros", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
     "{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} [{{ greet() }}] {{ greet | string }}",
     {}, CHAT, None),
    ("recursive macro sees the top level", "{% set sep = ', ' %}{% macro walk(x) %}{% if x is mapping %}"
     "{% for k, v in x.items() %}{{ k }}({{ walk(v) }}){{ sep if not loop.last }}{% endfor %}"
     "{% else %}{{ x }}{% endif %}{% endmacro %}{{ walk(nested) }} {{ walk(d) }}", V, CHAT, None),
    ("macro scope: the caller's loop variables are not the macro's", "{% macro m() %}[{{ x }}]{% endmacro %}"
     "{% for x in [1, 2] %}{{ m() }}{% endfor %}{% set x = 'top' %}{{ m() }}", {}, CHAT, None),
    ("macro varargs and kwargs", "{% macro m(a) %}{{ a }} {{ varargs | list }} {{ kwargs }}{% endmacro %}"
     "{{ m(1, 2, 3, k='v') }}", {}, CHAT, None),
    ("macro with too many arguments", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}, CHAT,
     "takes not more than 1 argument"),
    ("call blocks", "{% macro box(title) %}<{{ title }}:{{ caller() }}>{% endmacro %}"
     "{% macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}"
     "{% set outer = 'o' %}{% call box('t') %}body {{ outer }}{% endcall %} "
     "{% call(item, n) each(['a', 'b']) %}{{ n }}={{ item }}{{ outer }};{% endcall %}", {}, CHAT, None),
    ("macros kept in a namespace or a dict", "{% macro m(x) %}<{{ x }}>{% endmacro %}{% set ns = namespace(f=m) %}"
     "{{ ns.f(1) }} {% set d = {'g': m} %}{{ d.g(2) }} {{ d['g'](3) }} {{ d.items() | list | length }}", {}, CHAT, None),
    ("filter blocks", "{% filter upper %}shout {{ s }}{% endfilter %} {% filter indent(2, true) | trim %}\n"
     "a\nb\n{% endfilter %}|", V, CHAT, None),
    ("generation blocks", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
     "{{ m.content }}{% endgeneration %}{% else %}{{ m.role }}{% endif %};{% endfor %}", V, CHAT, None),
    ("set unpacks", "{% set a, b = [1, 'two'] %}{{ b }}{{ a }} {% set k, v = 'xy' %}{{ v }}{{ k }}", {}, CHAT, None),
    ("set tuples", "{% set t = 1, 'b' %}{{ t | list }} {% set (x, y) = [3, 4] %}{{ y }}{{ x }} "
     "{% set p, q = 5, 6 %}{{ q }}{{ p }}", {}, CHAT, None),
    ("star arguments", "{% macro m(a, b, c='-') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(*[1, 2]) }} "
     "{{ m(*'xyz') }} {{ m(1, **{'c': 3, 'b': 2}) }} {{ '{}-{}'.format(*[7, 8]) if false else 'x' }} "
     "{{ [1, 2] | join(*['+']) }}", {}, CHAT, None),
    ("macros in lists", "{% macro a(x) %}a{{ x }}{% endmacro %}{% macro b(x) %}b{{ x }}{% endmacro %}"
     "{% set fs = [a] + [b] %}{% set args = [[1], [2]] %}{% for i in range(fs | length) %}{{ fs[i](*args[i]) }}"
     "{% endfor %} {{ fs | length }} {{ (fs | first)('!') }} {{ fs[1] is callable }}", {}, CHAT, None),
    ("a macro in tojson", "{% macro a() %}{% endmacro %}{{ [a] | tojson }}", {}, CHAT, "is not JSON serializable"),
    ("set unpacks the wrong count", "{% set a, b = [1, 2, 3] %}", {}, CHAT, "too many values to unpack"),
    ("indent", "[{{ 'a\nb\n\nc' | indent }}] [{{ 'a\nb' | indent(2, first=true) }}] "
     "[{{ 'a\n\nb\n' | indent('> ', blank=true) }}] [{{ '' | indent }}] [{{ 'x\r\ny' | indent(1) }}]",
     {}, CHAT, None),
    ("unique and dictsort", "{{ ['a', 'B', 'A', 'b', 'c'] | unique | list }} "
     "{{ ['a', 'B', 'A'] | unique(case_sensitive=true) | list }} {{ messages | unique(attribute='role') "
     "| map(attribute='role') | list }} {{ {'b': 1, 'A': 3, 'c': 2} | dictsort | map('list') | list }} "
     "{{ {'b': 1, 'A': 3, 'c': 2} | dictsort(by='value', reverse=true) | map('join', '=') | join(' ') }} "
     "{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}", V, CHAT, None),
    ("tojson arguments", "{{ d | tojson(indent=2) }} {{ d | tojson(separators=(',', ':')) }} "
     "{{ 'ünï😀\u0007\x7f' | tojson }} {{ 'ünï😀' | tojson(ensure_ascii=true) }} "
     "{{ {'b': 1, 'a': [1, {}]} | tojson(sort_keys=true, indent='\t') }} {{ [] | tojson(indent=4) }}",
     V, CHAT, None),
    ("Llama-2 roles must alternate", LLAMA2, {"messages": CONVERSATIONS["roles do not alternate"],
                                              "bos_token": "<s>", "eos_token": "</s>"}, CHAT,
     "Conversation roles must alternate user/assistant/user/assistant/..."),
    ("a dict's methods come before its keys on d.name, not on d['name']",
     "{% set d = {'items': {'type': 'string'}, 'get': 1} %}{{ d.items is mapping }} {{ d.items is callable }} "
     "{{ d.items.type is defined }} {{ d['items'].type }} {{ d.get('get') }} {{ d['get'] }} "
     "{{ {}['keys'] is defined }} {{ d.update is defined }} {{ 'x'.upper is defined }} {{ 'x'.nope is defined }} "
     "{{ d.items() | list | length }} "
     "{{ d.keys is callable and d.keys() | list | length }} {{ [d] | map(attribute='items') | first is mapping }}",
     {}, CHAT, None),
    ("a JSON schema whose items is a property (command-r's json_to_python_type)",
     "{% macro py(s) %}{% if s.type == 'array' %}List[{{ py(s.items) }}]{% elif s.type is string %}{{ s.type }}"
     "{% else %}?{% endif %}{% endmacro %}{{ py(schema) }} {{ py(schema['items']) }}",
     {"schema": {"type": "array", "items": {"type": "string"}}}, CHAT, None),
    ("macros see the variables of the scopes they are defined in",
     "{% for i in xs %}{% macro m() %}{{ i }}{{ j }}{% endmacro %}{% set j = i * 2 %}{{ m() }};{% endfor %} "
     "{% macro outer(x) %}{% macro inner() %}{{ x }}{{ y }}{% endmacro %}{% set y = x + 1 %}{{ inner() }}"
     "{% endmacro %}{{ outer(7) }} {% set z = 1 %}{% macro top() %}{{ z }}{% endmacro %}{% set z = 2 %}{{ top() }} "
     "{% for message in messages %}{% macro render() %}{{ message.role }}{% endmacro %}{{ render() }} {% endfor %}"
     "{% macro f(n) %}{% if n > 0 %}{% macro g() %}{{ n }}{% endmacro %}{{ g() }}{{ f(n - 1) }}{% endif %}"
     "{% endmacro %}{{ f(3) }}", V, CHAT, None),
    ("int reads integer strings exactly", "{{ '9007199254740993' | int }} {{ ' -1_000 ' | int }} {{ '+7' | int }} "
     "{{ '007' | int }} {{ '42.9' | int }} {{ '-42.9' | int }} {{ '1e3' | int }} {{ 'nan' | int }} {{ '1__0' | int }} "
     "{{ 'x' | int(5) }} {{ '-9223372036854775808' | int }} {{ '9223372036854775807' | int }} {{ 9.2e18 | int }}",
     {}, CHAT, None),
    ("int of infinity", "{{ 'inf' | int }}", {}, CHAT, "cannot convert float infinity to integer"),
    ("select, reject and map of a false value give nothing",
     "{% for c in n | selectattr('type', 'equalto', 'image') %}x{% endfor %}[{{ n | map(attribute='text') | join }}]"
     "{{ '' | select | list }} {{ [] | reject('odd') | list }} {{ n | map('no_such_filter') | list }} "
     "{{ 0 | rejectattr('x') | list }} {{ n | select('no_such_test') | list }}", V, CHAT, None),
    ("str.format", "{{ '{} and {}'.format(1, 'a') }} {{ '{0}{1}{0}'.format('a', 'b') }} "
     "{{ '{x}-{y}'.format(x=1, y=[1, 'a']) }} {{ '{{}}{}'.format(2.0) }} {{ '{} {}'.format(none, true) }} "
     "{{ ('<{}>' | safe).format('<') }} {{ ('{}' | safe).format('<' | safe) }}", {}, CHAT, None),
    ("str.format with a missing argument", "{{ '{}{}'.format(1) }}", {}, CHAT, "out of range"),
    ("str.format mixing field numbering", "{{ '{}{0}'.format(1) }}", {}, CHAT,
     "cannot switch from manual field specification to automatic field numbering"),
    ("indent of an undefined value", "{{ d.zz | indent(4) }}", V, CHAT, "'dict object' has no attribute 'zz'"),
    ("indent of none", "{{ n | indent }}", V, CHAT, "unsupported operand type(s) for +=: 'NoneType' and 'str'"),
    ("str.replace takes no keyword arguments", "{{ s.replace('l', 'L', count=1) }}", V, CHAT,
     "takes no keyword arguments"),
    ("raise_exception", "before {{ raise_exception('custom failure: ' ~ i) }} after", V, CHAT, "custom failure: 7"),
    ("undefined attribute of undefined", "{{ missing.attr }}", {}, CHAT, "'missing' is undefined"),
    ("attribute of a missing key", "{{ d.zz.yy }}", V, CHAT, "has no attribute 'zz'"),
    ("undefined in arithmetic", "{{ missing + 1 }}", {}, CHAT, "'missing' is undefined"),
    ("undefined method", "{{ missing.strip() }}", {}, CHAT, "'missing' is undefined"),
    ("division by zero", "{{ 1 / 0 }}", {}, CHAT, "division by zero"),
    ("unordered comparison", "{{ 1 < 'a' }}", {}, CHAT, "not supported between instances of 'int' and 'str'"),
    ("length of none", "{{ n | length }}", V, CHAT, "object of type 'NoneType' has no len()"),
    ("tojson of undefined", "{{ missing | tojson }}", {}, CHAT, "is not JSON serializable"),
    ("set on a non-namespace", "{% set d.a = 2 %}", V, CHAT, "non-namespace object"),
    ("unpacking too many", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}, CHAT, "too many values to unpack"),
    ("empty separator", "{{ 'abc'.split('') }}", {}, CHAT, "empty separator"),
    ("range too big", "{{ range(100001) | length }}", {}, CHAT, "Range too big"),
    ("in none", "{{ 1 in n }}", V, CHAT, "argument of type 'NoneType' is not iterable"),
    ("unknown filter", "{{ s | frobnicate }}", V, CHAT, "filter"),
    ("unknown test", "{{ s is frobnicated }}", V, CHAT, "test"),
    ("unknown tag", "{% frobnicate %}", {}, CHAT, "frobnicate"),
    ("unclosed block", "{% if true %}open", {}, CHAT, "endif"),
    ("stray endfor", "{% endfor %}", {}, CHAT, "endfor"),
]


def environment(kind):
    if kind == PLAIN:
        env = jinja2.Environment()
    else:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=kind == KEEP_NL,
                                            extensions=["jinja2.ext.loopcontrols", AssistantTracker])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = transformers_tojson
    return env


def options(kind):
    chat = kind != PLAIN
    return {"trim_blocks": chat, "lstrip_blocks": chat, "keep_trailing_newline": kind == KEEP_NL}


def render(kind, template, variables):
    """(output, None) or (None, the exception)."""
    try:
        return environment(kind).from_string(template).render(**variables), None
    except Exception as e:  # jinja2 raises TemplateError and Python's own errors alike
        return None, e


def case(group, name, template, kind, variables, error=None):
    out, exc = render(kind, template, variables)
    c = {"group": group, "name": name, "template": template, "options": options(kind), "variables": variables}
    if exc is None:
        if error is not None:
            sys.exit(f"{name}: jinja2 rendered {out!r}, expected an error containing {error!r}")
        c["expected"] = out
        return c
    if error is None and isinstance(exc, RaisedByTemplate):
        error = str(exc)
    if error is None or error not in str(exc):
        sys.exit(f"{name}: jinja2 raised {type(exc).__name__}: {exc} (expected {error!r})")
    c["error"] = error
    return c


def published_cases():
    cases = []
    for tname, template in PUBLISHED.items():
        bos = "<|begin_of_text|>" if tname.startswith("llama3") else "<s>"
        eos = "<|eot_id|>" if tname.startswith("llama3") else "</s>"
        for cname, messages in CONVERSATIONS.items():
            for gen in (True, False):
                variables = {"add_generation_prompt": gen, "bos_token": bos, "eos_token": eos, "messages": messages}
                cases.append(case("published", f"{tname}: {cname}, add_generation_prompt={gen}", template, CHAT,
                                  variables))
    # The multi-line templates in plain jinja2.Environment(): no trim_blocks, no lstrip_blocks.
    for tname in ("zephyr", "llama3.1", "qwen2.5", "mistral-v0.1-system", "mistral-v0.3"):
        for cname in ("multi-turn", "system first"):
            variables = {"add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
                         "messages": CONVERSATIONS[cname]}
            cases.append(case("published", f"{tname}: {cname}, plain jinja2.Environment()", PUBLISHED[tname], PLAIN,
                              variables))
    extra = [("llama3.1", LLAMA31, {"tools": [TOOL]}), ("llama3.1", LLAMA31, {"tools": [TOOL],
                                                                            "tools_in_user_message": False}),
             ("llama3.1", LLAMA31, {"builtin_tools": ["brave_search", "code_interpreter"],
                                    "date_string": "1 Jan 2025"}),
             ("qwen2.5", QWEN25, {"tools": [TOOL]}), ("mistral-v0.3", MISTRAL_V03, {"tools": [TOOL]})]
    for tname, template, more in extra:
        for cname, messages in (("tools", CONVERSATIONS["system first"]), ("tool calls", TOOL_CALL_CONVERSATION)):
            variables = {"add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>", "messages": messages,
                         **more}
            cases.append(case("published", f"{tname}: {cname} with {sorted(more)}", template, CHAT, variables))
    return cases


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    cases = published_cases()
    cases += [case("features", name, template, kind, variables, error)
              for name, template, variables, kind, error in FEATURES]
    with open(os.path.join(sys.argv[1], "chat_template_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "cases": cases}, f, ensure_ascii=False, indent=1)
    errors = sum("error" in c for c in cases)
    print(f"chat_template_cases.json: {len(cases)} cases ({errors} expected errors), jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
