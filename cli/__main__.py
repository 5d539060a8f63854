"""The process entry point: ``agentr1 ...`` (the console script) and ``python -m cli ...`` (e.g.
under ``accelerate launch``) both run :func:`run`.

A command that trained or served holds about a million Python objects (torch, transformers,
Prefect, MLflow, pydantic): the interpreter's own teardown then spends 6 s idle and 20-35 s on a
busy machine in full garbage collections after the last line was printed, freeing memory the
operating system takes back anyway. So the first exit handler, which runs last, after every
other one (logging's flush, the file locks' release, MLflow's queues, Prefect's server stop),
ends the process with the command's exit status. Only the teardown is skipped; threads have been
joined and every handler has run by then. :func:`cli.main.main` called in-process (the tests)
is untouched: the handler is registered here only, when this module is the program."""
import atexit
import os
import sys

_status = 1  # an exception that escapes run() exits 1, as the interpreter would


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe, a closed or replaced stream
            pass
    os._exit(_status)


atexit.register(_exit_now)  # before anything else is imported: the first handler runs last


def _exit_status(code) -> int:
    """The status the interpreter gives ``SystemExit(code)``: None 0, an int itself, else 1."""
    return 0 if code is None else code if isinstance(code, int) else 1


def run() -> None:
    global _status
    try:
        from cli.main import main

        _status = main()
    except SystemExit as e:
        _status = _exit_status(e.code)
        raise
    except KeyboardInterrupt:  # only under --traceback: the interpreter's own status for it
        _status = 130
        raise
    sys.exit(_status)


if __name__ == "__main__":
    run()
