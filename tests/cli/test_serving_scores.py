"""bench/serving_scores.py's windows: every token of the text but the first is
scored once, each window within the room a request has (context - 1)."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scores():
    # compare_pytorch (imported by the script) would start the process again
    # for OpenBLAS's kernels unless told to keep the environment.
    argv = sys.argv
    sys.argv = ["serving_scores.py", "--keep-openblas-coretype"]
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import serving_scores
    finally:
        sys.argv = argv
        sys.path.remove(str(ROOT / "bench"))
    return serving_scores


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
