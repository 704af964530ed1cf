"""The command line: ``bitfault`` (``main``, the commands in ``COMMANDS``) and its argument
types (``args``)."""

from bitfault.cli.main import COMMANDS, main

__all__ = ["COMMANDS", "main"]
