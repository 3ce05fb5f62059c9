"""A verifiers task as a row (entrypoints/inputs/verifiers_tasks.py): its chat as messages of text, and its index."""

from types import SimpleNamespace

from posttrain.entrypoints.inputs.verifiers_tasks import KEY_COLUMN, row


def test_a_task_s_row_is_its_system_prompt_then_its_prompt_as_text_and_its_index() -> None:
    said = row(SimpleNamespace(idx=3, system_prompt="Be brief.", prompt="Say 7."))
    assert said == {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say 7."}],
        KEY_COLUMN: 3,
    }
    parts = [
        {"type": "text", "text": "Say "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "8."},
    ]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": None}]
    assert row(SimpleNamespace(idx=0, system_prompt=None, prompt=messages))["prompt"] == [
        {"role": "user", "content": "Say 8."},
        {"role": "assistant", "content": ""},
    ]
