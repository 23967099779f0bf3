""""corpus too small" names max_source_chars when it is what left the functions out."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.targets import corpus as c

DOC = "Return the sum of the two numbers, as an ordinary addition would."


def function(name: str, body_lines: int) -> str:
    body = "".join(f"    x{k} = {k}\n" for k in range(body_lines))
    return f'def {name}(a, b):\n    """{DOC}"""\n{body}    return a + b\n'


UNDOCUMENTED = "def g(a):\n" + "".join(f"    y{k} = {k}\n" for k in range(20)) + "    return a\n"
FILES = [c.SourceFile(f"mod{m}.py", "\n".join([*(function(f"f{n}", 1 + 10 * (n % 2)) for n in range(6)), UNDOCUMENTED,
                                                function("h", 20).replace(DOC, "Short.")]).encode())
         for m in range(2)]
"""12 functions with a docstring that make a conversation: the 6 with one line besides it under 150 characters,
the 6 with eleven over. And in each file two long ones left out for their docstring (none, too short)."""


def build(max_source_chars: int, heldout: int):
    return c.build_corpus(FILES, seed=0, shifted_share=0.35, heldout_per_slice=heldout,
                          max_source_chars=max_source_chars)


def test_functions_left_out_for_length_are_named_in_the_message():
    """Before, the message said only the slice's size, not that max_source_chars had left 6 of the 12 out."""
    whole = build(10_000, heldout=0)
    assert len(whole.base) + len(whole.shifted) == 12
    with pytest.raises(LabError) as info:
        build(150, heldout=len(whole.base) - 1)
    message = str(info.value)
    assert message.startswith("corpus too small: the base slice has") and "\n" not in message
    assert message.endswith("(from 2 files); 6 functions longer than max_source_chars=150 were left out")


def test_a_corpus_too_small_with_nothing_left_out_does_not_blame_max_source_chars():
    whole = build(10_000, heldout=0)
    with pytest.raises(LabError) as info:
        build(10_000, heldout=len(whole.base))
    assert str(info.value).endswith("(from 2 files)") and "max_source_chars" not in str(info.value)
