"""``epu-ctx-agent``: the agent as its own command (what deploy/cloud-init/epu-worker.yaml runs).

Same options as ``epu ctx agent``; a node needs only this, not the operator CLI.
"""

from __future__ import annotations

import argparse
import sys

from epu.services.ctxbroker.cli import AGENT_DESCRIPTION, AGENT_EPILOG, add_agent_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epu-ctx-agent", description=AGENT_DESCRIPTION, epilog=AGENT_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_agent_args(parser)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
