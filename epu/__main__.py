"""``python -m epu``: the same as the ``epu`` command."""

from epu.cli import main

raise SystemExit(main())
