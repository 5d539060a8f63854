"""The errors a person can act on, and the exit status of each: one error surface.

Every refusal the project makes on purpose (bad data or config, a damaged checkpoint, a full
disk, training that diverged) is a :class:`UserError`: its message is one line that names the
file, row or field and says what to do, and its ``exit_status`` is what the ``agentr1`` command
returns for it, whichever command or flow raised it. Anything else is a bug, shown with its
traceback. ``agentr1 -v`` shows the traceback of a :class:`UserError` too.

Exit statuses:

- 0: done;
- 1: failed in a way this table does not name (a bug, or a flow that failed for another reason);
- 2: bad input: data, config, a damaged or foreign checkpoint, a tool that cannot start;
- 3: training stopped: it diverged, or made a rollout batch that broke a rule (the last good
  checkpoint is on disk);
- 4: no space left on the device that holds an output;
- 130 / 143: stopped by Ctrl-C / SIGTERM (the run can be resumed by the same command).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_TRAINING_FAILED = 3
EXIT_NO_SPACE = 4


class UserError(Exception):
    """A refusal with a one-line message a person can act on, and its exit status."""

    exit_status: int = EXIT_BAD_INPUT


class TrainingStopped(UserError):
    """Training cannot go on from this point; the last good checkpoint is on disk."""

    exit_status = EXIT_TRAINING_FAILED


class NotFound(UserError, FileNotFoundError):
    """A file the user named (a preset, a model directory) that is not there; the message says
    what there is instead."""


class NotRegistered(UserError, LookupError):
    """A registered model (a version, an alias) that the tracking store does not have; the
    message names the store and how to get one."""


class DamagedError(UserError, ValueError):
    """A directory whose files do not match its manifest, or a checkpoint that cannot be loaded
    safely; the message names the file and the fix."""


class NoSpaceError(UserError, OSError):
    """The device holding an output is full: the message names the path, the bytes needed and
    the bytes free. Nothing half-written is left under the output's name."""

    exit_status = EXIT_NO_SPACE


def message(exc: BaseException) -> str:
    """The one line a person reads for ``exc`` (after ``agentr1: error: ``)."""
    return f"training stopped: {exc}" if isinstance(exc, TrainingStopped) else str(exc)


def interruption(exc: BaseException | None) -> BaseException | None:
    """The interrupt behind ``exc`` (a KeyboardInterrupt or SystemExit: Ctrl-C, SIGTERM): ``exc``
    itself, or one it was raised while handling. A library that fails while unwinding a signal
    must not turn a stop into a bug: Prefect's task engine raises ``ValueError('Task run is not
    set')`` when SIGTERM lands just as a task starts."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if not isinstance(exc, Exception):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def exit_status(exc: BaseException) -> int | None:
    """The exit status for ``exc`` when it is a :class:`UserError`, else None (a bug)."""
    return exc.exit_status if isinstance(exc, UserError) else None
