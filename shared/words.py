"""Counted nouns in messages: "1 step", "2 steps"."""

from __future__ import annotations


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`count` and `noun`, in the plural unless the count is 1: plural(1, "step") == "1 step"."""
    return f"{count} {noun if count == 1 else plural_form or noun + 's'}"
