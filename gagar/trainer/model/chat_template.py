"""The policy's chat template: ChatML with Hermes-style tool calls.

vLLM's OpenAI server renders it (``--enable-auto-tool-choice --tool-call-parser hermes`` parses the
``<tool_call>`` blocks back into OpenAI tool calls). Consecutive tool results are separate user
turns wrapped in ``<tool_response>``. transformers and vLLM render with ``trim_blocks``, so
newlines that must survive a block tag are written as ``{{ "\\n" }}``.
"""

CHAT_TEMPLATE = r"""{#- ChatML with Hermes-style tool calls (what vLLM's `hermes` tool parser reads). -#}
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}
<|im_start|>system
{% if sys %}{{ sys }}

{% endif %}# Tools

You may call one or more functions. Function signatures are inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each call, return a JSON object with the function name and arguments inside <tool_call></tool_call>:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif sys -%}
<|im_start|>system
{{ sys }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- elif message.role == 'assistant' -%}
<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif -%}
{%- for call in message.tool_calls or [] -%}
{%- set f = call.function if call.function is defined else call -%}
{% if message.content or not loop.first %}{{ "\n" }}{% endif %}<tool_call>
{"name": "{{ f.name }}", "arguments": {{ f.arguments if f.arguments is string else f.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""


def chatml(role: str, content: str) -> str:
    """One turn as the template renders it (for tokenizer corpora, before a tokenizer exists)."""
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"
