"""``python -m epu.services.decision -c FILE``: run the engine alone (same as ``epu run decision``)."""

from __future__ import annotations

import argparse

from epu.common.config import load_config
from epu.common.logs import setup_logging
from epu.services.decision.app import build_service


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epu.services.decision")
    parser.add_argument("-c", "--config", help="TOML config file")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    setup_logging(config.logging.level, config.logging.json_format)
    service = build_service(config)
    service.install_signal_handlers()
    service.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
