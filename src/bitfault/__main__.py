"""``python -m bitfault``: the ``bitfault`` command line."""

from bitfault.cli import main

raise SystemExit(main())
