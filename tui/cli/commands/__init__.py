"""One module per ``headscope`` command, each in the same shape:

- ``register(sub) -> None`` adds the command's subparser (``options.command_parser``: its help
  starts with what the command does) with ``set_defaults(handler=run)``;
- ``run(args) -> int`` does the work and returns the exit code.

``tui/cli/main.py`` only lists the modules; what commands share is in ``tui/cli``
(``output``, ``options``, ``args``, ``store``, ``progress``, ``cluster``, ``patching``).
"""
