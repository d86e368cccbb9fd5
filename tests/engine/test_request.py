"""Request's token views (livemeet/engine/request.py)."""

from __future__ import annotations

import numpy as np
import pytest

from livemeet.engine.request import Request
from livemeet.errors import InvalidRequest


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


def test_audio_positions_are_checked_and_kept_read_only() -> None:
    """Any int sequence is taken; the request keeps its own read-only int64 array, so a
    caller's later write can't move an embedding, and bad positions are refused."""
    mine = np.array([1, 3, 4], dtype=np.int64)
    request = Request("r", list(range(6)), audio_positions=mine)
    mine[0] = 5
    assert request.audio_positions.tolist() == [1, 3, 4]
    assert not request.audio_positions.flags.writeable
    frozen = np.array([0, 2], dtype=np.int64)
    frozen.flags.writeable = False
    assert Request("s", [1, 2, 3], audio_positions=frozen).audio_positions is frozen  # no copy
    for bad in ((-1, 2), (0, 0), (2, 1), (0, 6), [[0, 1]]):
        with pytest.raises(InvalidRequest, match="strictly increasing"):
            Request("t", list(range(6)), audio_positions=bad)
    assert Request("u", [1]).audio_positions.size == 0
    # (lo, hi) of the positions in [start, end): the chunk [3, 6) splices embeddings 1 and 2
    assert request.audio_span_in(3, 6) == (1, 3)
    assert request.audio_span_in(0, 1) == (0, 0)
    assert request.audio_span_in(5, 6) == (3, 3)
