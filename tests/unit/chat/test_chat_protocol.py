"""ChatFormat (libra/chat/protocol.py) on the fixture tokenizers: template choice, the
end-of-turn token, prompts, tool turns appended after sampled turns, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from libra.chat import ChatFormat, ToolCall, get_parser
from tests.fixtures.hf_models import CHATML_TEMPLATE, QWEN_TEMPLATE
from tests.unit.chat.builders import (
    FAMILIES,
    TOOLS,
    chat_format,
    fresh_tokenizer,
    tokenizer,
)

ROOT = Path(__file__).resolve().parents[3]
HERMES = get_parser("hermes")
USER = [{"role": "user", "content": "What is 37+58*2?"}]
CALL = ToolCall("calculator", {"expression": "37+58*2"})
TOOL_TURN_TEXT = ("\n<|im_start|>user\n<tool_response>\n153\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n")


def test_package_imports_neither_torch_nor_transformers():
    code = ("import sys, libra.chat; "
            "print(','.join(m for m in ('torch', 'transformers', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(("family", "renders", "name"), [
    ("llama", False, "the shipped Hermes template (hermes.jinja)"),
    ("qwen2", True, "the model's chat template"),
    ("qwen3", True, "the model's chat template"),
])
def test_auto_uses_the_model_template_only_when_it_renders_tools(family, renders, name):
    fmt = chat_format(family)
    assert fmt.template_renders_tools is renders
    assert fmt.template_name == name


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_lists_every_tool_schema_in_the_system_turn(family):
    fmt = chat_format(family, system_prompt="Be brief.")
    text = tokenizer(family).decode(fmt.prompt_ids(USER))
    system_turn = text[:text.index("<|im_end|>")]
    assert system_turn.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    for tool in TOOLS:
        assert json.dumps(tool) in system_turn
    assert "<tool_call>" in system_turn  # the instructions show the call format
    assert text.endswith("<|im_start|>user\nWhat is 37+58*2?<|im_end|>\n<|im_start|>assistant\n")
    assert text == fmt.render_text(USER, add_generation_prompt=True)


def test_conversation_system_message_wins_over_system_prompt():
    fmt = chat_format("qwen2", system_prompt="Be brief.")
    text = fmt.render_text([{"role": "system", "content": "Be long."}, *USER])
    assert "Be long." in text and "Be brief." not in text


def test_model_mode_with_tools_and_a_template_ignoring_them_is_refused():
    with pytest.raises(ValueError, match="ignores tools=.*use tool_template='auto' or 'hermes'"):
        chat_format("llama", tool_template="model")


def test_model_mode_without_tools_keeps_the_model_template_and_its_default_system():
    fmt = chat_format("llama", tools=[], tool_template="model")
    assert fmt.template_name == "the model's chat template"
    assert fmt.render_text(USER).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")


def test_hermes_mode_uses_the_shipped_template_even_when_the_model_renders_tools():
    fmt = chat_format("qwen2", tool_template="hermes")
    assert fmt.template_renders_tools and fmt.template_name.startswith("the shipped Hermes")
    assert "For each function call, return a json object" in fmt.render_text(USER)


def test_unknown_tool_template_is_refused():
    with pytest.raises(ValueError, match=r"tool_template='qwen': use one of \('auto'"):
        chat_format("qwen2", tool_template="qwen")


def test_tool_that_is_not_an_openai_function_schema_is_refused():
    with pytest.raises(ValueError, match=r"tools\[0\] is not an OpenAI function schema"):
        chat_format("qwen2", tools=[{"name": "calculator"}])


def test_tokenizer_without_chat_template_needs_the_hermes_template():
    tok = fresh_tokenizer("qwen2")
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*tool_template='hermes'"):
        ChatFormat(tok, tools=TOOLS, parser=HERMES)
    fmt = ChatFormat(tok, tools=TOOLS, parser=HERMES, tool_template="hermes")
    assert not fmt.template_renders_tools and fmt.end_of_turn_text == "<|im_end|>"


def test_named_templates_take_tool_use_when_tools_are_given():
    tok = fresh_tokenizer("llama")
    tok.chat_template = {"default": CHATML_TEMPLATE, "tool_use": QWEN_TEMPLATE}
    assert ChatFormat(tok, tools=TOOLS, parser=HERMES).template_name == "the model's chat template"


@pytest.mark.parametrize("family", FAMILIES)
def test_end_of_turn_is_im_end_and_a_stop_token(family):
    fmt = chat_format(family)
    im_end = tokenizer(family).convert_tokens_to_ids("<|im_end|>")
    assert (fmt.end_of_turn_id, fmt.end_of_turn_text) == (im_end, "<|im_end|>")
    assert fmt.stop_token_ids == [im_end]  # the fixtures' eos is <|im_end|> itself


def test_stop_tokens_hold_eos_and_end_of_turn_when_they_differ():
    tok = fresh_tokenizer("qwen2")
    tok.eos_token = "<|endoftext|>"
    fmt = ChatFormat(tok, tools=TOOLS, parser=HERMES)
    eos, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert fmt.end_of_turn_id == im_end
    assert fmt.stop_token_ids == [eos, im_end]


def plain_tokenizer(template: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with Llama-2 style <s>/</s> and no ChatML tokens."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(["[INST] hello [/INST] hi"] * 4, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    tok.chat_template = template
    return tok


INST_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ '<s>[INST] ' + "
                 "m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + '</s>' }}"
                 "{% endif %}{% endfor %}")
PLAIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


def test_end_of_turn_is_read_from_a_non_chatml_template():
    tok = plain_tokenizer(INST_TEMPLATE)
    fmt = ChatFormat(tok, parser=HERMES, tool_template="model")
    assert fmt.end_of_turn_text == "</s>"
    assert tok.decode(fmt.assistant_ids("hi", [])) == "hi</s>"


def test_end_of_turn_falls_back_to_eos_when_the_template_ends_turns_with_text():
    tok = plain_tokenizer(PLAIN_TEMPLATE)
    fmt = ChatFormat(tok, parser=HERMES, tool_template="model")
    assert fmt.end_of_turn_id == tok.eos_token_id
    assert fmt.stop_token_ids == [tok.eos_token_id]
    # The sampled turn ends with eos, which the template never writes: the tool turn
    # starts right after the assistant content.
    ids = fmt.tool_turn_ids([{"role": "tool", "content": "153"}], turn_closed=True)
    assert tok.decode(ids) == "\n\ntool: 153\n\nassistant: "
    messages = [*USER, {"role": "assistant", "content": "calc"},
                {"role": "tool", "content": "153"}, {"role": "assistant", "content": "153"}]
    ids, _ = fmt.demonstration(messages)
    assert tok.decode(ids).replace("</s>", "") + "\n\n" == fmt.render_text(messages)


def test_shipped_template_is_refused_for_a_tokenizer_without_chatml_tokens():
    with pytest.raises(ValueError, match="no single <|im_start|> token"):
        ChatFormat(plain_tokenizer(INST_TEMPLATE), parser=HERMES, tool_template="hermes")


@pytest.mark.parametrize("family", FAMILIES)
def test_assistant_ids_render_content_then_calls_and_end_the_turn(family):
    fmt = chat_format(family)
    ids = fmt.assistant_ids("Let me compute.", [CALL, CALL])
    call_text = HERMES.render_call(CALL)
    assert ids[-1] == fmt.end_of_turn_id and fmt.end_of_turn_id not in ids[:-1]
    assert tokenizer(family).decode(ids) == f"Let me compute.\n{call_text}\n{call_text}<|im_end|>"
    assert tokenizer(family).decode(fmt.assistant_ids("", [CALL])) == f"{call_text}<|im_end|>"


@pytest.mark.parametrize("family", FAMILIES)
def test_tool_turn_after_a_stop_terminated_turn_runs_to_the_next_header(family):
    fmt = chat_format(family)
    sampled = fmt.assistant_ids("", [CALL])  # what the engine returned, stop token included
    ids = fmt.tool_turn_ids([{"role": "tool", "content": "153"}], turn_closed=True)
    assert tokenizer(family).decode(ids) == TOOL_TURN_TEXT
    trajectory = fmt.prompt_ids(USER) + sampled + ids
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [CALL.to_openai()]},
                {"role": "tool", "content": "153"}]
    assert trajectory == fmt.render_ids(messages, add_generation_prompt=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_tool_turn_after_a_length_cut_turn_first_closes_it(family):
    fmt = chat_format(family)
    closed = fmt.tool_turn_ids([{"role": "tool", "content": "153"}], turn_closed=True)
    cut = fmt.tool_turn_ids([{"role": "tool", "content": "153"}], turn_closed=False)
    assert cut == [fmt.end_of_turn_id, *closed]
    # A cut mid-call: the model-facing error goes back like a tool output.
    sampled_text = '<tool_call>\n{"name": "calculator", "argu'
    turn = HERMES.parse(sampled_text)
    error_ids = fmt.tool_turn_ids([{"role": "tool", "content": turn.errors[0]}],
                                  turn_closed=False)
    assert tokenizer(family).decode(error_ids).startswith(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\ntool call 1 is not closed")


@pytest.mark.parametrize("family", FAMILIES)
def test_several_tool_results_share_one_user_turn(family):
    fmt = chat_format(family)
    ids = fmt.tool_turn_ids([{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}],
                            turn_closed=True)
    assert tokenizer(family).decode(ids) == (
        "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_user_follow_up_is_appended_like_a_tool_turn():
    fmt = chat_format("qwen3")
    ids = fmt.tool_turn_ids([{"role": "user", "content": "And times 2?"}], turn_closed=True)
    assert tokenizer("qwen3").decode(ids) == (
        "\n<|im_start|>user\nAnd times 2?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("messages", [[], [{"role": "assistant", "content": "x"}]])
def test_tool_turn_takes_only_non_assistant_messages(messages):
    with pytest.raises(ValueError, match="one or more non-assistant messages"):
        chat_format("qwen2").tool_turn_ids(messages, turn_closed=True)


def test_template_that_rewrites_earlier_text_is_refused_by_name():
    tok = fresh_tokenizer("qwen2")
    # Renders the message count up front: appending a message changes earlier text.
    tok.chat_template = "{{ messages | length }}" + QWEN_TEMPLATE
    fmt = ChatFormat(tok, tools=TOOLS, parser=HERMES)
    with pytest.raises(ValueError, match="the model's chat template re-renders earlier text"):
        fmt.tool_turn_ids([{"role": "tool", "content": "153"}], turn_closed=True)


def test_prompt_needs_a_message():
    with pytest.raises(ValueError, match="at least one message"):
        chat_format("qwen2").prompt_ids([])


@pytest.mark.parametrize("messages", [
    USER,
    [{"role": "assistant", "content": "hi"}],
    [*USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}],
])
def test_demonstration_is_a_prompt_then_turns_ending_with_the_assistant(messages):
    with pytest.raises(ValueError, match="ending with an assistant"):
        chat_format("qwen2").demonstration(messages)


def test_demonstration_masks_exactly_the_assistant_turns():
    fmt = chat_format("qwen2")
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [CALL.to_openai()]},
                {"role": "tool", "content": "153"}, {"role": "assistant", "content": "153"}]
    ids, mask = fmt.demonstration(messages)
    prompt, first = fmt.prompt_ids(USER), fmt.assistant_ids("", [CALL])
    tool, last = fmt.tool_turn_ids(messages[2:3], turn_closed=True), fmt.assistant_ids("153", [])
    assert ids == prompt + first + tool + last
    assert mask == [0] * len(prompt) + [1] * len(first) + [0] * len(tool) + [1] * len(last)


def test_arith_format_demonstrations_use_the_calc_tags():
    fmt = chat_format("llama", tools=[], parser="arith")
    messages = [*USER, {"role": "assistant", "content": "",
                        "tool_calls": [CALL.to_openai()]},
                {"role": "tool", "content": "153"},
                {"role": "assistant", "content": "<ans>153</ans>"}]
    ids, mask = fmt.demonstration(messages)
    trained = tokenizer("llama").decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained == "<calc>37+58*2</calc><|im_end|><ans>153</ans><|im_end|>"


def test_shipped_template_renders_turns_like_the_qwen_template_after_the_system_turn():
    messages = [*USER, {"role": "assistant", "content": "Let me see.",
                        "tool_calls": [CALL.to_openai(), CALL.to_openai()]},
                {"role": "tool", "content": "153"}, {"role": "tool", "content": "153"},
                {"role": "assistant", "content": "153"}]
    shipped = chat_format("qwen2", tool_template="hermes").render_text(messages)
    qwen = chat_format("qwen2", tool_template="model").render_text(messages)
    system_end = "</tool_call><|im_end|>\n"
    assert shipped.split(system_end, 1)[1] == qwen.split(system_end, 1)[1]
