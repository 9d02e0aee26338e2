"""The application layer: what `so` does, without a user interface.

Each operation takes a :class:`~sono.app.context.Context` (environment, home, the settings
given on the command line, where notices go), frozen option objects and a
:class:`~sono.config.Config`; it returns data and raises :class:`~sono.errors.SoError`.
``sono.cli`` / ``sono.commands`` turn argv into those calls and print; ``sono.ui`` calls
them from the review TUI. Nothing here reads ``argparse`` or prints.
"""
