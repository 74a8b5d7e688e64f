"""A ChatML chat template for a reasoning model, written as DeepSeek-R1's and Qwen3.5's are: the answer's ``<think>``
is written into the prompt, and ``enable_thinking: false`` writes an empty think block instead (the model then
answers at once); an earlier assistant turn sent back with its reasoning keeps it in its think block.
stories260K ships no template and writes no reasoning of its own."""

THINKING_TEMPLATE = """{%- for message in messages %}
    {%- if message.role == "assistant" and message.reasoning_content is defined %}
        {{- '<|im_start|>assistant\\n<think>' + message.reasoning_content + '</think>' + message.content
            + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""
