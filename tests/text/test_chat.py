"""Chat formats (llminfer/text/chat.py).

Renderings are checked against an independent reference: the same template
rendered by a plain jinja2.Environment with the variables transformers gives it.
The real templates are SmolLM2's (read from its GGUF) and the official Gemma 3
and Llama 3 instruct templates (below, as data); the built-in formats are
checked against those official templates.
"""

import datetime
import json
import warnings

import jinja2
import pytest

from llminfer.text.chat import BUILTIN_FORMATS, ChatFormat, ChatFormatWarning, chat_format_for
from llminfer.errors import ChatTemplateError, InvalidArgumentError
from llminfer.core.gguf_file import GGUFFile

# google/gemma-3-4b-it (the same in gemma-3-1b-it and gemma-3-270m-it): tokenizer_config.json, "chat_template",
# kept as the JSON string it is stored as. The text was found through the search tool in several public
# repositories that quote it verbatim (a Gemma 3 test-model generator "from google/gemma-3-4b-it,
# tokenizer_config.json", microsoft/onnxruntime-extensions' GEMMA3_CHAT_TEMPLATE, the Berkeley function-calling
# leaderboard's Gemma handler), which agree character for character.
GEMMA3_IT_TEMPLATE = json.loads(
    r'''"{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"''')

# meta-llama/Meta-Llama-3-8B-Instruct: tokenizer_config.json, "chat_template", as a JSON string; quoted verbatim
# in public repositories found through the search tool (one prints it from the unsloth/llama-3-8b-instruct mirror).
LLAMA3_INSTRUCT_TEMPLATE = json.loads(
    r'''"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"''')

SYSTEM = {"role": "system", "content": "You answer in one short sentence."}
USER1 = {"role": "user", "content": "What is the capital of France?"}
BOT1 = {"role": "assistant", "content": "Paris."}
USER2 = {"role": "user", "content": "And of Italy?"}
BOT2 = {"role": "assistant", "content": "Rome."}
USER3 = {"role": "user", "content": "  Spaces around,\nand a newline inside.  \n"}
BOT3 = {"role": "assistant", "content": "naïve — 日本語 <b>&amp;</b> {{ not a tag }}"}

CONVERSATIONS = {
    "one user turn": [USER1],
    "system and user": [SYSTEM, USER1],
    "multi-turn": [USER1, BOT1, USER2],
    "system and multi-turn": [SYSTEM, USER1, BOT1, USER2, BOT2, USER3],
    "ends with the model": [USER1, BOT1],
    "whitespace and unicode": [SYSTEM, USER3, BOT3, USER2],
}
WITH_SYSTEM = [k for k, v in CONVERSATIONS.items() if v[0]["role"] == "system"]


# ------------------------------------------------------------------ helpers

def piece(metadata, which):
    return metadata["tokenizer.ggml.tokens"][metadata[f"tokenizer.ggml.{which}_token_id"]]


def reference(template, messages, add_generation_prompt, bos_token, eos_token, **extra):
    """The template rendered by plain jinja2, as transformers sets it up (trim_blocks, lstrip_blocks)."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos_token, eos_token=eos_token, **extra)


def reference_for(metadata, template, messages, add_generation_prompt):
    return reference(template, messages, add_generation_prompt, piece(metadata, "bos"), piece(metadata, "eos"))


def quietly(fn, *args, **kwargs):
    """fn(...), failing the test if it warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


def tiny_metadata(arch, tokens, bos=0, eos=1, **more):
    md = {"general.architecture": arch, "tokenizer.ggml.tokens": list(tokens),
          "tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.eos_token_id": eos}
    md.update(more)
    return md


LLAMA3_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "Hello", "Ġworld"]


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_path):
    with GGUFFile(smollm2_path) as f:
        return dict(f.metadata)


@pytest.fixture(scope="module")
def gemma3_meta(gemma3_path):
    with GGUFFile(gemma3_path) as f:
        return dict(f.metadata)


def chatml():
    return ChatFormat("test", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                              "{% endfor %}")


def custom(template, **kwargs):
    return ChatFormat("test", template, **kwargs)


# ------------------------------------------------------------------ SmolLM2's own template

def test_smollm2_uses_its_own_template_without_warning(smollm2_meta):
    fmt = quietly(chat_format_for, smollm2_meta)
    assert fmt.name == "gguf"
    assert fmt.template == smollm2_meta["tokenizer.chat_template"]
    assert fmt.bos_token == piece(smollm2_meta, "bos")
    assert fmt.eos_token == piece(smollm2_meta, "eos")
    assert "<|im_end|>" in fmt.stop_texts
    assert len(set(fmt.stop_texts)) == len(fmt.stop_texts) and all(fmt.stop_texts)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_smollm2_template_matches_plain_jinja(smollm2_meta, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    fmt = chat_format_for(smollm2_meta)
    got = fmt.render(messages, add_generation_prompt=add_generation_prompt)
    want = reference_for(smollm2_meta, smollm2_meta["tokenizer.chat_template"], messages, add_generation_prompt)
    assert got == want
    assert got.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_smollm2_adds_bos_matches_the_text(smollm2_meta):
    # SmolLM2's BOS piece is <|im_start|>, which every ChatML turn opens with
    fmt = chat_format_for(smollm2_meta)
    assert fmt.adds_bos == fmt.render([USER1]).startswith(fmt.bos_token)
    assert fmt.adds_bos is True


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", WITH_SYSTEM)
def test_builtin_chatml_matches_smollm2_template(smollm2_meta, conversation, add_generation_prompt):
    # SmolLM2's template is plain ChatML once a system message is given (without one it inserts its own)
    messages = CONVERSATIONS[conversation]
    fmt = quietly(chat_format_for, smollm2_meta, chat_format="chatml")
    assert fmt.name == "chatml"
    want = reference_for(smollm2_meta, smollm2_meta["tokenizer.chat_template"], messages, add_generation_prompt)
    assert fmt.render(messages, add_generation_prompt=add_generation_prompt) == want


# ------------------------------------------------------------------ Gemma 3

@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_gemma3_official_template_matches_plain_jinja(gemma3_meta, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    fmt = quietly(chat_format_for, gemma3_meta, chat_template=GEMMA3_IT_TEMPLATE)
    assert fmt.name == "custom"
    got = fmt.render(messages, add_generation_prompt=add_generation_prompt)
    assert got == reference_for(gemma3_meta, GEMMA3_IT_TEMPLATE, messages, add_generation_prompt)
    assert got.startswith("<bos><start_of_turn>user\n")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_builtin_gemma_matches_official_template(gemma3_meta, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    with pytest.warns(ChatFormatWarning):
        fmt = chat_format_for(gemma3_meta)
    got = fmt.render(messages, add_generation_prompt=add_generation_prompt)
    assert got == reference_for(gemma3_meta, GEMMA3_IT_TEMPLATE, messages, add_generation_prompt)


def test_gemma_system_message_is_folded_into_first_user_turn(gemma3_meta):
    fmt = chat_format_for(gemma3_meta, chat_format="gemma")
    text = fmt.render([SYSTEM, USER1])
    assert "<start_of_turn>system" not in text
    assert f"<start_of_turn>user\n{SYSTEM['content']}\n\n{USER1['content']}<end_of_turn>" in text
    assert text.count("<bos>") == 1 and text.startswith("<bos>")


def test_gemma_rejects_roles_out_of_turn(gemma3_meta):
    bad = [USER1, USER2]
    official = chat_format_for(gemma3_meta, chat_template=GEMMA3_IT_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        official.render(bad)
    builtin = chat_format_for(gemma3_meta, chat_format="gemma")
    with pytest.raises(ChatTemplateError, match="alternate") as e:
        builtin.render(bad)
    assert "turn 2 is user" in str(e.value)


def test_gemma_stop_texts_and_bos(gemma3_meta):
    fmt = chat_format_for(gemma3_meta, chat_format="gemma")
    assert fmt.stop_texts[0] == "<end_of_turn>"
    assert piece(gemma3_meta, "eos") in fmt.stop_texts
    assert fmt.bos_token == "<bos>"
    assert fmt.adds_bos is True
    # the official template, given as chat_template, gets its stop text from its own text
    assert "<end_of_turn>" in chat_format_for(gemma3_meta, chat_template=GEMMA3_IT_TEMPLATE).stop_texts


# ------------------------------------------------------------------ Llama 3

@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_builtin_llama3_matches_official_template(conversation, add_generation_prompt):
    md = tiny_metadata("llama", LLAMA3_TOKENS, bos=0, eos=4)
    messages = CONVERSATIONS[conversation]
    fmt = chat_format_for(md, chat_format="llama3")
    got = fmt.render(messages, add_generation_prompt=add_generation_prompt)
    assert got == reference_for(md, LLAMA3_INSTRUCT_TEMPLATE, messages, add_generation_prompt)
    assert fmt.stop_texts == ("<|eot_id|>",)  # EOS is <|eot_id|> here too: listed once
    assert fmt.adds_bos is True


# ------------------------------------------------------------------ choosing a format

def test_gemma3_without_template_falls_back_to_gemma_with_warning(gemma3_meta):
    assert "tokenizer.chat_template" not in gemma3_meta  # the base model ships none
    with pytest.warns(ChatFormatWarning) as record:
        fmt = chat_format_for(gemma3_meta)
    assert fmt.name == "gemma"
    message = str(record[0].message)
    assert "'gemma'" in message and "gemma3" in message and "no chat template" in message


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "gemma3"])
def test_gemma_architectures_fall_back_to_gemma(arch):
    md = tiny_metadata(arch, ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], bos=2, eos=1)
    with pytest.warns(ChatFormatWarning, match=arch):
        assert chat_format_for(md).name == "gemma"


def test_llama_with_llama3_vocabulary_falls_back_to_llama3():
    md = tiny_metadata("llama", LLAMA3_TOKENS)
    with pytest.warns(ChatFormatWarning, match="llama3"):
        assert chat_format_for(md).name == "llama3"


def test_llama_without_llama3_vocabulary_falls_back_to_chatml(smollm2_meta):
    md = {k: v for k, v in smollm2_meta.items() if k != "tokenizer.chat_template"}
    with pytest.warns(ChatFormatWarning, match="chatml") as record:
        fmt = chat_format_for(md)
    assert fmt.name == "chatml"
    assert "may not follow" not in str(record[0].message)  # SmolLM2 has the ChatML tokens


def test_unknown_architecture_falls_back_to_chatml_with_warning():
    md = tiny_metadata("rwkv6", ["<s>", "</s>", "a"])
    with pytest.warns(ChatFormatWarning) as record:
        fmt = chat_format_for(md)
    assert fmt.name == "chatml"
    message = str(record[0].message)
    assert "'chatml'" in message and "rwkv6" in message
    assert "<|im_start|>" in message  # tells the user the vocabulary lacks the markers
    assert fmt.render([USER1]).startswith("<|im_start|>user\n")
    assert fmt.stop_texts == ("<|im_end|>", "</s>")


def test_no_architecture_falls_back_to_chatml():
    with pytest.warns(ChatFormatWarning, match="general.architecture"):
        fmt = chat_format_for({})
    assert fmt.name == "chatml"
    assert fmt.bos_token == "" and fmt.adds_bos is False


def test_chat_format_overrides_the_file(smollm2_meta, gemma3_meta):
    fmt = quietly(chat_format_for, gemma3_meta, chat_format="chatml")
    assert fmt.name == "chatml"
    assert fmt.adds_bos is False  # ChatML writes no <bos>
    assert quietly(chat_format_for, smollm2_meta, chat_format="gemma").name == "gemma"
    assert quietly(chat_format_for, smollm2_meta, chat_format="gguf").name == "gguf"


def test_chat_template_overrides_everything(smollm2_meta):
    messages = CONVERSATIONS["system and multi-turn"]
    fmt = quietly(chat_format_for, smollm2_meta, chat_template=GEMMA3_IT_TEMPLATE)
    assert fmt.name == "custom"
    assert fmt.render(messages) == reference_for(smollm2_meta, GEMMA3_IT_TEMPLATE, messages, True)
    with pytest.warns(ChatFormatWarning, match="chat_format='llama3' is ignored"):
        fmt = chat_format_for(smollm2_meta, chat_format="llama3", chat_template=GEMMA3_IT_TEMPLATE)
    assert fmt.name == "custom"


def test_builtin_formats_are_listed():
    assert set(BUILTIN_FORMATS) == {"chatml", "gemma", "llama3"}
    md = tiny_metadata("llama", LLAMA3_TOKENS)
    for name in BUILTIN_FORMATS:
        fmt = quietly(chat_format_for, md, chat_format=name)
        assert fmt.name == name and fmt.stop_texts
        assert fmt.render([SYSTEM, USER1]).endswith("\n")


def test_unknown_chat_format_is_an_invalid_argument():
    with pytest.raises(InvalidArgumentError, match="unknown chat_format 'vicuna'") as e:
        chat_format_for({}, chat_format="vicuna")
    assert all(name in str(e.value) for name in BUILTIN_FORMATS)


def test_gguf_format_needs_a_template_in_the_file(gemma3_meta):
    with pytest.raises(ChatTemplateError, match="tokenizer.chat_template"):
        chat_format_for(gemma3_meta, chat_format="gguf")


@pytest.mark.parametrize("bad", [123, "", "   ", ["{{ x }}"]])
def test_chat_template_must_be_a_nonempty_string(bad):
    with pytest.raises(InvalidArgumentError, match="chat_template"):
        chat_format_for({}, chat_template=bad)


def test_stop_texts_include_the_vocabulary_end_of_turn():
    md = tiny_metadata("llama", ["<s>", "</s>", "<|end|>", "<|turn_end|>"], eos=1,
                       **{"tokenizer.ggml.eot_token_id": 3})
    fmt = chat_format_for(md, chat_template="{% for m in messages %}<|user|>{{ m.content }}<|end|>{% endfor %}")
    assert fmt.stop_texts == ("<|end|>", "<|turn_end|>", "</s>")


# ------------------------------------------------------------------ errors

@pytest.mark.parametrize("template", [
    "{% for m in messages %}\n{{ m.content }}\n",        # unclosed for
    "line one\nline two\n{{ messages[0] content }}",     # bad expression on line 3
    "{% if add_generation_prompt %}x{% endfor %}",       # mismatched tag
    "{{ messages | no_such_filter }}",                   # unknown filter, found at compile time
])
def test_template_that_does_not_parse(template):
    with pytest.raises(jinja2.TemplateSyntaxError) as ref:
        jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    with pytest.raises(ChatTemplateError) as e:
        chat_format_for({}, chat_template=template)
    assert ref.value.message in str(e.value)
    assert f"line {ref.value.lineno}" in str(e.value)
    assert isinstance(e.value.__cause__, jinja2.TemplateSyntaxError)


def test_template_that_fails_to_render_names_the_line():
    template = "{% for m in messages %}\n{{ m.content }}\n{{ m.content - 1 }}\n{% endfor %}"
    with pytest.raises(ChatTemplateError) as e:
        custom(template).render([USER1])
    assert "line 3" in str(e.value) and "TypeError" in str(e.value)


def test_undefined_attribute_of_undefined_is_a_template_error():
    with pytest.raises(ChatTemplateError, match="line 2.*UndefinedError"):
        custom("ok\n{{ nothing.at.all }}").render([USER1])


def test_raise_exception_gives_the_templates_message():
    with pytest.raises(ChatTemplateError) as e:
        custom("{% if messages[0].role != 'system' %}{{ raise_exception('a system message comes first') }}"
               "{% endif %}").render([USER1])
    assert str(e.value) == "a system message comes first"


MALICIOUS = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",
    "{{ ''['__class__'] }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ messages[0].__class__ }}",
]


@pytest.mark.parametrize("template", MALICIOUS)
def test_sandbox_blocks_attribute_abuse(template):
    with pytest.raises(ChatTemplateError, match="unsafe") as e:
        custom(template).render([USER1])
    assert isinstance(e.value.__cause__, jinja2.exceptions.SecurityError)


def test_plain_jinja_would_leak_what_the_sandbox_blocks():
    # the check above means something: unsandboxed, the first template reaches `object`
    leaked = reference(MALICIOUS[0], [USER1], True, "", "")
    assert "object" in leaked


@pytest.mark.parametrize("template", [
    "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",
    "{{ messages[0].update({'content': 'changed'}) }}",
    "{% set _ = messages.pop() %}",
])
def test_sandbox_keeps_messages_immutable(template):
    messages = [dict(USER1), dict(BOT1)]
    before = [dict(m) for m in messages]
    with pytest.raises(ChatTemplateError):
        custom(template).render(messages)
    assert messages == before


def test_sandbox_bounds_range():
    with pytest.raises(ChatTemplateError, match=r"stopped: safe_range\(\) was given 1000000000"):
        custom("{% for i in range(10**9) %}x{% endfor %}").render([USER1])


@pytest.mark.parametrize("messages, fragment", [
    ("hello", "got str"),
    ({"role": "user", "content": "hi"}, "got dict"),
    (None, "got NoneType"),
    ([], "empty"),
    ([USER1, "oops"], "messages[1] must be a dict"),
    ([USER1, ("user", "hi")], "messages[1] must be a dict with 'role' and 'content', got tuple"),
    ([{"content": "hi"}], "messages[0] has no 'role'"),
    ([USER1, BOT1, {"role": "user"}], "messages[2] has no 'content'"),
    ([USER1, {"role": "assistant", "content": None}], "messages[1]['content'] must be a str, got NoneType"),
    ([{"role": 1, "content": "hi"}], "messages[0]['role'] must be a str, got int"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "messages[0]['content'] must be a str"),
])
def test_bad_messages_are_invalid_arguments(messages, fragment):
    with pytest.raises(InvalidArgumentError) as e:
        chatml().render(messages)
    assert fragment in str(e.value)


# ------------------------------------------------------------------ what templates see

def test_tools_and_documents_default_to_none():
    fmt = custom("{{ tools is none }} {{ documents is none }}")
    assert fmt.render([USER1]) == "True True"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert custom("{{ tools | tojson }}").render([USER1], tools=tools) == json.dumps(tools)


def test_extra_variables_pass_through_and_override():
    fmt = custom("{{ bos_token }}|{{ greeting }}|{{ add_generation_prompt }}", bos_token="<s>")
    assert fmt.render([USER1], greeting="hi") == "<s>|hi|True"
    assert fmt.render([USER1], add_generation_prompt=0, bos_token="", greeting="yo") == "|yo|False"


def test_undefined_variables_render_empty_as_in_transformers():
    template = "[{{ date_string }}]{% if custom_tools is defined %}tools{% endif %}"
    assert custom(template).render([USER1]) == reference(template, [USER1], True, "", "")


def test_strftime_now_is_todays_date():
    before = datetime.date.today()
    text = custom("{{ strftime_now('%Y-%m-%d') }}").render([USER1])
    after = datetime.date.today()
    assert datetime.date.fromisoformat(text) in (before, after)


def test_strftime_now_can_be_replaced_for_reproducible_prompts():
    fmt = custom("Today Date: {{ strftime_now('%d %b %Y') }}")
    assert fmt.render([USER1], strftime_now=lambda fmt: "26 Jul 2024") == "Today Date: 26 Jul 2024"


def test_tojson_does_not_escape_html_or_unicode():
    content = "<b>naïve & 'quoted'</b>"
    fmt = custom("{{ messages[0].content | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=true) }}")
    got = fmt.render([{"role": "user", "content": content}])
    assert got == json.dumps(content, ensure_ascii=False) + "|" + json.dumps({"b": 1, "a": [1, 2]}, indent=2,
                                                                                 sort_keys=True)


def test_loop_controls_and_generation_tag():
    messages = [USER1, BOT1, USER2]
    brk = "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.content }};{% endfor %}"
    assert custom(brk).render(messages) == f"{USER1['content']};{BOT1['content']};"
    gen = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
           "{% else %}{{ m.content }}{% endif %}{% endfor %}")
    assert custom(gen).render(messages) == "".join(m["content"] for m in messages)


def test_adds_bos_follows_the_rendered_text():
    assert custom("{{ bos_token }}{{ messages[0].content }}", bos_token="<s>").adds_bos is True
    assert custom("{{ messages[0].content }}{{ bos_token }}", bos_token="<s>").adds_bos is False
    assert custom("{{ bos_token }}x", bos_token="").adds_bos is False
    # a template that demands a system message is probed with one
    needs_system = ("{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
                    "{{ bos_token }}{{ messages[0].content }}")
    assert custom(needs_system, bos_token="<s>").adds_bos is True


def test_format_constructed_directly():
    fmt = ChatFormat("mine", "{{ messages[0].content }}", stop_texts=("<end>", "", "<end>", "<stop>"))
    assert fmt.stop_texts == ("<end>", "<stop>")
    assert fmt.render([USER1]) == USER1["content"]
    with pytest.raises(InvalidArgumentError):
        ChatFormat("mine", None)
    with pytest.raises(ChatTemplateError, match="'mine' does not parse"):
        ChatFormat("mine", "{{ ")


def test_block_tags_on_their_own_lines_leave_no_blank_lines():
    # Many templates put {% %} tags on indented lines of their own and rely on trim_blocks and lstrip_blocks,
    # as transformers sets them, to drop those lines.
    template = ("{% for message in messages %}\n"
                "    {% if message.role == 'user' %}\n"
                "<|user|>\n{{ message.content }}{{ eos_token }}\n"
                "    {% else %}\n"
                "<|assistant|>\n{{ message.content }}{{ eos_token }}\n"
                "    {% endif %}\n"
                "{% endfor %}\n"
                "{% if add_generation_prompt %}\n"
                "<|assistant|>\n"
                "{% endif %}\n")
    messages = CONVERSATIONS["multi-turn"]
    got = custom(template, eos_token="</s>").render(messages)
    assert got == reference(template, messages, True, "", "</s>")
    assert "\n\n" not in got and "    " not in got


# ------------------------------------------------------------------ bounds on a render

from llminfer.text.chat_sandbox import TemplateLimits  # noqa: E402


@pytest.mark.parametrize("template, what", [
    ("{{ 'ab' * 400000000 }}", r"a repetition \(\*\) would build 800000000 characters, more than max_chars="),
    ("{{ ['ab'] * 400000000 }}", r"a repetition \(\*\) would build \d+ characters"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     r"a concatenation \(~\) would build"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
     r"a concatenation \(\+\) would build"),
    ("{% set ns = namespace(x=['a']) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
     "{{ ns.x|tojson }}", "a list would build more than max_chars"),
    ("{% set ns = namespace(x=['a']) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
     "{{ ns.x }}", "a list would build more than max_chars"),
    ("{% set ns = namespace(x=['a']) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
     "{{ 'x' ~ ns.x }}", "a list would build more than max_chars"),
    ("{{ 'x'.center(10**9) }}", r"center\(\) was given 1000000000"),
    ("{{ 'x'|center(10**9) }}", "the center filter was given 1000000000"),
    ("{{ '{:>999999999}'.format(1) }}", "a format field '>999999999' asks for a width"),
    ("{{ '%0999999999d' % 1 }}", "a %-format field width or precision '999999999'"),
    ("{{ '%*d' % (999999999, 1) }}", r"a %-format field width or precision '\*'"),
    ("{{ '%d'|format(1) ~ '%0999999999d'|format(1) }}", "a %-format field width"),
    ("{% set s = 'a' * 100000 %}{{ s|replace('', 'b' * 100000) }}", "the replace filter would build"),
    ("{% set s = 'a' * 100000 %}{{ s.replace('', 'b' * 100000) }}", r"replace\(\) would build"),
    ("{% set s = ['a' * 1000] * 1000 %}{{ s|join('b' * 10000) }}", "the join filter would build"),
    ("{% set s = ['a' * 1000] * 1000 %}{{ ('b' * 10000).join(s) }}", r"join\(\) would build"),
    ("{{ 2 ** 100000000 }}", r"a power \(2 \*\* 100000000\) is too large"),
    ("{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n }}",
     "a multiplication gave an integer too large"),
])
def test_sandbox_bounds_what_a_template_builds(template, what):
    """Each of these used to build gigabytes (or hang on huge integers)
    before any check could see it; now it stops before the operation."""
    with pytest.raises(ChatTemplateError, match=rf"chat template 'test' stopped: {what}"):
        custom(template).render([USER1])


def test_a_template_from_the_file_or_the_caller_is_bounded():
    fmt = chat_format_for({}, chat_template="{{ 'ab' * 400000000 }}")
    with pytest.raises(ChatTemplateError, match="stopped"):
        fmt.render([USER1])
    fmt = chat_format_for({"tokenizer.chat_template": "{{ 'ab' * 400000000 }}"})
    with pytest.raises(ChatTemplateError, match="stopped"):
        fmt.render([USER1])


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",     # empty body
    "{% for i in range(100000) %}{% for j in range(100000) %}{% if j < 0 %}x{% endif %}{% endfor %}{% endfor %}",
    "{% set s = 'a' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",  # not range()
    "{% macro f(n) %}{% for i in range(100000) %}{% endfor %}{{ f(n) if n < 10**6 }}{% endmacro %}{{ f(0) }}",
])
def test_sandbox_bounds_the_total_work(template):
    fmt = custom(template, limits=TemplateLimits(max_steps=20_000))
    with pytest.raises(ChatTemplateError, match="stopped: it ran more than 20000 steps"):
        fmt.render([USER1])


def test_sandbox_has_a_wall_clock_timeout():
    fmt = custom("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 limits=TemplateLimits(max_steps=10**12, timeout=0.05))
    with pytest.raises(ChatTemplateError, match="stopped: it ran longer than 0.05 s"):
        fmt.render([USER1])


def test_default_limits_stop_nested_loops():
    with pytest.raises(ChatTemplateError, match="stopped"):
        custom("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").render([USER1])


def test_runaway_recursion_and_nesting():
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        custom("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").render([USER1])
    with pytest.raises(ChatTemplateError, match="cannot be compiled: RecursionError"):
        custom("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}")
    with pytest.raises(ChatTemplateError, match="more than 1048576"):
        custom("x" * (1 << 20 | 1))


def test_a_long_conversation_is_not_refused():
    """The output bound grows with the caller's own text."""
    messages = [{"role": ("user", "assistant")[i % 2], "content": "word " * 200} for i in range(5000)]
    text = chat_format_for({}, chat_format="chatml").render(messages)
    assert len(text) > TemplateLimits().max_chars  # 5 MB of prompt
    assert text.count("<|im_start|>") == 5001


def test_render_leaves_the_trace_function_as_it_found_it():
    """Steps are counted by a trace function; a debugger's or coverage's
    own stays installed and still sees the template run."""
    import sys
    import threading

    seen = []

    def tracer(frame, event, arg):
        seen.append(frame.f_code.co_filename)
        return None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        assert custom("{% for m in messages %}{{ m.content }}{% endfor %}").render([USER1, BOT1]) \
            == USER1["content"] + BOT1["content"]
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(old)
    assert "<template>" in seen

    # and a render on another thread is bounded too
    errors = []
    t = threading.Thread(target=lambda: errors.append(_render_error("{{ 'ab' * 400000000 }}")))
    t.start()
    t.join()
    assert errors and "stopped" in errors[0]


def _render_error(template):
    try:
        custom(template).render([USER1])
    except ChatTemplateError as e:
        return str(e)
    return None


def test_chat_arguments_checked_up_front():
    from llminfer.text.chat import check_chat_args

    check_chat_args()
    check_chat_args("chatml")
    check_chat_args("gguf", "{{ messages[0].content }}")
    for bad in ("nope", 3, ["chatml"]):
        with pytest.raises(InvalidArgumentError, match="unknown chat_format"):
            check_chat_args(chat_format=bad)
    for bad in ("", "  ", b"{{ x }}", 5):
        with pytest.raises(InvalidArgumentError, match="chat_template must be a non-empty jinja string"):
            check_chat_args(chat_template=bad)
    with pytest.raises(ChatTemplateError, match="does not parse"):
        check_chat_args(chat_template="{% for %}")
