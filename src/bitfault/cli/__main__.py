"""``python -m bitfault.cli``: the ``bitfault`` command line."""

from bitfault.cli.main import main

raise SystemExit(main())
