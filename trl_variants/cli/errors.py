"""One-line errors: a user error before training starts prints ``trl-variants: error: <message>`` (exit code 2)
instead of a traceback (:data:`USER_ERRORS`, :func:`run_command`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

USER_ERRORS = (ValueError, FileNotFoundError, TypeError)
"""What ``trl-variants`` prints as one line, ``trl-variants: error: <message>`` (exit code 2), when raised before
training starts: the parser's refusals (a mistyped flag, a value of the wrong type) and the checks of the options,
the data, the checkpoint and the results files, each message naming the option and the fix. ``train``: until
``trainer.train()`` is called (:func:`training_started`; the trainer, its model and offline pass are built and the
checkpoint to resume checked by then); from then on an error is a crash and keeps its traceback. ``presample`` /
``evaluate`` / ``cache`` / ``recipes``: the whole command. ``--traceback`` (anywhere on the command line) or
``TRL_VARIANTS_TRACEBACK=1`` shows the traceback of every error; ``main(argv)`` called from Python raises them."""
TRACEBACK_ENV = "TRL_VARIANTS_TRACEBACK"


class UsageError(SystemExit):
    """A command line that names nothing usable (``--config`` naming no recipe or file): one line and exit code 2
    from ``trl-variants``; from Python (``main(argv)``), a ``SystemExit`` whose text is the message."""
_training_started = False


def training_started() -> None:
    """The training loop of ``trl-variants train`` starts: later errors are crashes, shown with their traceback."""
    global _training_started
    _training_started = True


def traceback_wanted(argv: list[str]) -> tuple[list[str], bool]:
    """``(argv without --traceback, whether tracebacks are shown)``: ``--traceback`` anywhere on the command line, or
    :data:`TRACEBACK_ENV` set to 1 / true / yes / on."""
    show = os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    if "--traceback" in argv:
        return [a for a in argv if a != "--traceback"], True
    return argv, show


def run_command(command: Callable[[list[str]], None], argv: list[str], one_line: bool) -> None:
    """Run ``command(argv)``. With ``one_line``, a :data:`USER_ERRORS` error raised before training starts prints
    ``trl-variants: error: <message>`` and exits with code 2; otherwise (and after :func:`training_started`) it is
    raised with its traceback."""
    global _training_started
    _training_started = False
    try:
        command(argv)
    except (*USER_ERRORS, UsageError) as e:  # see USER_ERRORS for the boundary
        if not one_line or _training_started:
            raise
        print(f"trl-variants: error: {str(e).strip() or type(e).__name__}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
