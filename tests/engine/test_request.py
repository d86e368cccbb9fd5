"""Request's token views (livemeet/engine/request.py)."""

from __future__ import annotations

from livemeet.engine.request import Request


def test_token_ids_slices_prompt_and_outputs_as_one_sequence() -> None:
    """Every [start, end) of prompt + outputs, on either side of the joint and across it."""
    request = Request("r", [10, 11, 12, 13], audio_positions=(1, 2))
    for token_id in (20, 21, 22):
        request.append_token(token_id)
    whole = request.all_token_ids
    assert whole == [10, 11, 12, 13, 20, 21, 22]
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 1):
            assert request.token_ids(start, end) == whole[start:end], (start, end)
