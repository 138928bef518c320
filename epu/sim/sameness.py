"""Is a sequence made of the very same objects as one seen before? Asked on every steady poll.

The simulated driver (``SimNodeDriver.listing_unchanged``) asks whether the list it is handed
holds, in order, the objects of its last listing; the same tuple usually comes back poll after
poll, so the answer for it is remembered and the
element-wise walk is made once. Identity, not equality: the objects are immutable, so the same
object is the same value, and the check stays in C.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence


class SameObjects:
    """Remembers the last (reference, answer) pair found element-wise identical."""

    __slots__ = ("_vouched",)

    def __init__(self) -> None:
        self._vouched: tuple[object, tuple[object, ...]] | None = None

    def check(self, reference: object, kept: Sequence[object], answer: Sequence[object]) -> bool:
        """Does ``answer`` hold the very objects of ``kept`` in order? ``reference`` stands for
        ``kept`` (what it came from): a tuple ``answer`` found so is remembered with it, and the
        same pair is then answered without the walk."""
        vouched = self._vouched
        if vouched is not None and vouched[0] is reference and vouched[1] is answer:
            return True
        if len(kept) != len(answer) or not all(map(operator.is_, kept, answer)):
            return False
        if type(answer) is tuple:  # immutable: the same object holds the same objects next time
            self._vouched = (reference, answer)
        return True
