"""Market: how an instance is bought, spot or on-demand.

A `str` underneath, so that every file cloudtrain writes (the state store, job.json, --json
output) keeps the same two words, and a value read back from one compares equal to its
member. Imports nothing: the bottom layer, beside errors.
"""

from __future__ import annotations

import enum


class Market(str, enum.Enum):
    SPOT = "spot"  # one-time request, terminated on interruption
    ON_DEMAND = "on-demand"

    # What is printed or formatted is the word, as before (not "Market.SPOT").
    __str__ = str.__str__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)
