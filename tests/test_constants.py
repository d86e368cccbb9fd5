import pytest

from livemeet.audio import constants as c


@pytest.mark.parametrize(
    ("seconds", "tokens"),
    [(1, 13), (10, 125), (11, 138), (29.99, 375), (30.01, 376), (40, 500), (3600, 45_000)],
)
def test_num_audio_tokens_matches_model_contract(seconds: float, tokens: int) -> None:
    assert c.num_audio_tokens(round(seconds * c.SAMPLE_RATE)) == tokens


def test_derived_constants() -> None:
    assert c.WINDOW_SAMPLES == 480_000
    assert c.N_FRAMES == 3_000
    assert c.TOKENS_PER_WINDOW == 375
    assert c.AUDIO_TOKENS_PER_SECOND == 12.5


def test_negative_count_rejected() -> None:
    with pytest.raises(ValueError):
        c.num_audio_tokens(-1)
