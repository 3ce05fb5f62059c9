"""The GPU memory estimate (entrypoints/speed/gpu_memory.py) against what torch holds, and the page it writes."""

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from helpers import REPO
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.speed import gpu_memory

SMALL = gpu_memory.ModelShape("qwen2", 64, 160, 2, 512, False, 0.0, 2, kv_hidden=32)


def qwen2(shape: gpu_memory.ModelShape, device: str = "cpu") -> torch.nn.Module:
    config = Qwen2Config(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.hidden // 16,
        num_key_value_heads=shape.kv_hidden // 16,
        vocab_size=shape.vocabulary,
        tie_word_embeddings=shape.tied,
    )
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(torch.bfloat16)


@pytest.mark.parametrize("name", sorted(gpu_memory.DOCUMENTED_SHAPES))
def test_the_documented_models_parameters_are_counted(name: str) -> None:
    shape = gpu_memory.DOCUMENTED_SHAPES[name]
    model = qwen2(shape, device="meta")
    real = sum(p.numel() for p in model.parameters())
    # norms and the QKV biases are left out: under 0.1%
    assert shape.parameters <= real < 1.001 * shape.parameters


def test_the_shape_is_read_from_the_models_config(tmp_path: Path) -> None:
    qwen2(SMALL).config.save_pretrained(tmp_path)
    shape = gpu_memory.model_shape(ModelSpec(name_or_path=str(tmp_path), dtype="bfloat16"))
    assert shape == SMALL


def test_a_mixture_of_experts_has_no_shape_its_experts_would_be_left_out(tmp_path: Path) -> None:
    from transformers import MixtralConfig, Qwen3MoeConfig

    for config in (Qwen3MoeConfig(num_experts=8), MixtralConfig(num_local_experts=8)):
        path = tmp_path / config.model_type
        config.save_pretrained(path)
        assert gpu_memory.model_shape(ModelSpec(name_or_path=str(path), dtype="bfloat16")) is None


def held_bytes(tensors: object) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_full_and_lora_states_are_what_torch_holds_after_a_step() -> None:
    model = qwen2(SMALL)
    weights = held_bytes(model.parameters())
    optimizer = torch.optim.AdamW(model.parameters())
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    grads = held_bytes(p.grad for p in model.parameters())
    moments = held_bytes(v for state in optimizer.state.values() for k, v in state.items() if k != "step")
    # norms and biases uncounted: within 2% of this small model
    assert SMALL.state_bytes("full") == pytest.approx(weights + grads + moments, rel=0.02)
    assert SMALL.state_bytes("lora") == pytest.approx(weights, rel=0.02)
    assert SMALL.frozen_bytes() == SMALL.state_bytes("lora")


def test_sharding_divides_what_each_strategy_shards() -> None:
    shape = gpu_memory.DOCUMENTED_SHAPES["Qwen2.5-7B"]
    parameters = shape.parameters
    assert shape.state_bytes("full", "zero3", 8) == 16 * parameters // 8
    assert shape.state_bytes("full", "fsdp", 8) == 16 * parameters // 8
    # ZeRO-2 keeps the 16-bit weights whole, and beside it the reference
    assert shape.state_bytes("full", "zero2", 8) == 2 * parameters + 14 * parameters // 8
    assert shape.frozen_bytes("zero2", 8) == 2 * parameters
    assert shape.frozen_bytes("zero3", 8) == 2 * parameters // 8
    # 4 bits for the linear layers only: the embedding and the output layer stay whole
    four_bit = shape.state_bytes("4bit")
    assert 2 * (parameters - shape.linear_parameters) < four_bit < 0.4 * shape.state_bytes("lora")


def test_the_page_shows_the_estimators_tables() -> None:
    page = (REPO / "docs/pages/gpu-memory.md").read_text()
    assert gpu_memory.tables() in page


def test_the_kv_cache_is_what_generate_holds() -> None:
    model = qwen2(SMALL).eval()
    rows, prompt, new = 3, 7, 5
    out = model.generate(
        input_ids=torch.ones(rows, prompt, dtype=torch.long),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    held = sum(held_bytes((layer.keys, layer.values)) for layer in out.cache.layers)
    # the last token generated is never fed back
    assert held == SMALL.kv_cache_bytes(rows * (prompt + new - 1))
