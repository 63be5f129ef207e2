"""bench/serving_scores.py's windows: every token of the text but the first is
scored once, each window within the room a request has (context - 1)."""
import pytest
from bench_scripts import import_bench_script


@pytest.fixture(scope="module")
def scores():
    return import_bench_script("serving_scores")


@pytest.mark.parametrize("length", [2, 3, 254, 255, 256, 509, 1000])
def test_windows_score_every_token_but_the_first_once(scores, length):
    width = 255
    ids = list(range(length))
    windows = scores.windows(ids, width)
    assert all(2 <= len(w) <= width for w in windows)
    # A window scores its tokens after its first.
    scored = [t for w in windows for t in w[1:]]
    assert scored == ids[1:]


def test_a_text_of_one_token_has_no_window(scores):
    assert scores.windows([7], 255) == []
