"""config.py: what is shown of a value in messages."""

from __future__ import annotations

from cloudtrain.config import shown


def test_F38_shown_cuts_an_integer_too_long_to_turn_into_text():
    """Audit F38: repr() of an integer over 4300 digits raises ValueError, which became an
    internal error wherever a message showed one (alone or inside a list)."""
    big = 7 * 10 ** 5000
    assert shown(big) == "<a number of 5001 digits>"
    assert shown(-big) == "<a number of 5001 digits>"
    assert shown([1, big]) == "[1, <a number of 5001 digits>]"
    assert shown(12345) == "12345" and shown("x" * 100).endswith("...xxxxxxxxxxxxx'")
