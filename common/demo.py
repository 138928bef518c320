"""``epu demo`` — placeholder until the embedded demo lands (issue 2, item 6)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the embedded demo (all services in one process)")
    p.set_defaults(func=lambda args: print("demo: not yet") or 0)
