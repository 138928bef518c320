"""Slurm hostlists, parsed and written as ``scontrol show hostnames`` and ``scontrol show
hostlist`` do.

Why here and strict: slurmctld hands ``epu slurm resume|suspend|resume-fail`` one argument, a
hostlist such as ``cloud-c5-[001-003,010],gpu-a100-7``, and each name becomes a node EPU acts
on. A name is matched to an instance by identity later, but before that it travels in a message
and into log lines and batch commands, so every name is validated here (host-name characters
only: no shell metacharacters, no spaces, no path separators) and a bad one is a clear error that
names it, never a partial list.

The grammar, as Slurm's ``hostlist_create``: items separated by commas (or whitespace) outside
brackets; an item is text with any number of bracketed range lists ``[a-b,c,...]``, expanded as a
cartesian product from left to right (``r[1-2]n[1-2]`` → r1n1, r1n2, r2n1, r2n2); a range keeps
its lower bound's zero padding (``[08-11]`` → 08, 09, 10, 11); duplicates and order are kept.
Stricter than Slurm where Slurm is lax: an unclosed bracket (Slurm reads ``n[1-2`` as ``n]``),
blanks inside brackets (Slurm pads ``n[ 1-2]`` to n01, n02) and any character a host name may
not hold are refused.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_NAMES = 100_000
"""More names than any CLOUD partition declares: a hostlist that expands past it is refused (a
typo such as ``n[1-1000000000]`` must not eat the head node's memory)."""

_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,62})$")
"""A Slurm node name EPU accepts: a host-name label (with ``_`` and ``.``, which slurm.conf
allows), 1 to 63 characters, starting with a letter or a digit."""

_SEPARATORS = ", \t\n"


class HostlistError(ValueError):
    """A hostlist that is malformed or makes a name EPU refuses; the message names the culprit."""


def check_name(name: str) -> str:
    """``name`` if it is a node name EPU accepts, else ``HostlistError``."""
    if not _NAME.match(name):
        raise HostlistError(f"invalid node name {name!r}: a node name is 1-63 letters, digits, '-', '_' or '.', "
                            "starting with a letter or digit")
    return name


def _split_items(expr: str) -> list[str]:
    """The top-level items of ``expr``: split at separators outside brackets."""
    items: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr:
        if ch == "[":
            if depth:
                raise HostlistError(f"hostlist {expr!r}: nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"hostlist {expr!r}: ']' without '['")
            depth = 0
        elif ch in _SEPARATORS and not depth:
            if cur:
                items.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth:
        raise HostlistError(f"hostlist {expr!r}: '[' without ']'")
    if cur:
        items.append("".join(cur))
    return items


def _ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or not lo.isascii() or not hi.isascii():
            raise HostlistError(f"hostlist {expr!r}: bad range {item!r} (want N or N-M)")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise HostlistError(f"hostlist {expr!r}: range {item!r} runs backwards")
        if b - a >= MAX_NAMES:
            raise HostlistError(f"hostlist {expr!r}: range {item!r} is longer than {MAX_NAMES}")
        width = len(lo)
        out += [str(i).zfill(width) for i in range(a, b + 1)]
    return out


def expand(expr: str) -> list[str]:
    """Every name of hostlist ``expr``, in order, duplicates kept (``scontrol show hostnames``).

    Raises ``HostlistError`` for an empty or malformed hostlist and for any name that is not a
    valid node name."""
    items = _split_items(expr)
    if not items:
        raise HostlistError("empty hostlist")
    names: list[str] = []
    for item in items:
        parts: list[list[str]] = []
        pos = 0
        for m in re.finditer(r"\[([^\[\]]*)\]", item):
            parts.append([item[pos:m.start()]])
            parts.append(_ranges(m.group(1), expr))
            pos = m.end()
        parts.append([item[pos:]])
        count = 1
        for p in parts:
            count *= len(p)
        if len(names) + count > MAX_NAMES:
            raise HostlistError(f"hostlist {expr!r} makes more than {MAX_NAMES} names")
        names += ["".join(p) for p in itertools.product(*parts)]
    for n in names:
        check_name(n)
    return names


_TAIL = re.compile(r"^(.*?)(\d+)$")


@dataclass
class _Range:
    """One of Slurm's hostranges: ``prefix`` + numbers ``lo``..``hi`` zero-filled to ``width``
    (``lo`` is None for a name without a trailing number)."""

    prefix: str
    lo: int | None
    hi: int
    width: int

    def numbers(self) -> str:
        assert self.lo is not None
        lo, hi = str(self.lo).zfill(self.width), str(self.hi).zfill(self.width)
        return lo if self.lo == self.hi else f"{lo}-{hi}"


def _zero_padded(num: int, width: int) -> int:
    return max(0, width - len(str(num)))


def _width_equiv(a: _Range, b: _Range) -> bool:
    """Slurm's ``_width_equiv``: whether ``a.lo`` and ``b.lo`` can be written with one width,
    adjusting the one that is flexible (an unpadded number) to the other."""
    assert a.lo is not None and b.lo is not None
    if a.width == b.width:
        return True
    npad, nmpad = _zero_padded(a.lo, a.width), _zero_padded(a.lo, b.width)
    mpad, mnpad = _zero_padded(b.lo, b.width), _zero_padded(b.lo, a.width)
    if npad != nmpad and mpad != mnpad:
        return False
    if npad != nmpad:
        b.width = a.width
    else:
        a.width = b.width
    return True


def compress(names: Iterable[str]) -> str:
    """``names`` as one hostlist, exactly as ``scontrol show hostlist`` writes it: order and
    duplicates kept; a name whose trailing number follows the previous one's (same prefix, a
    width both can be written in) extends its range; neighbouring ranges of one prefix share a
    bracket (``n1,n2,n4,m1`` → ``n[1-2,4],m1``). ``expand(compress(x)) == x``."""
    ranges: list[_Range] = []
    for name in names:
        check_name(name)
        m = _TAIL.match(name)
        if m is None:
            ranges.append(_Range(name, None, 0, 0))
            continue
        new = _Range(m.group(1), int(m.group(2)), int(m.group(2)), len(m.group(2)))
        tail = ranges[-1] if ranges else None
        if (tail is not None and tail.lo is not None and tail.prefix == new.prefix and tail.hi + 1 == new.lo
                and _width_equiv(tail, new)):
            tail.hi = new.hi
        else:
            ranges.append(new)
    out: list[str] = []
    i = 0
    while i < len(ranges):
        r = ranges[i]
        if r.lo is None:
            out.append(r.prefix)
            i += 1
            continue
        group = [r]
        while i + len(group) < len(ranges):
            nxt = ranges[i + len(group)]
            if nxt.lo is None or nxt.prefix != r.prefix:
                break
            group.append(nxt)
        if len(group) == 1 and r.lo == r.hi:
            out.append(f"{r.prefix}{r.numbers()}")
        else:
            out.append(f"{r.prefix}[{','.join(g.numbers() for g in group)}]")
        i += len(group)
    return ",".join(out)


__all__ = ["MAX_NAMES", "HostlistError", "check_name", "compress", "expand"]
