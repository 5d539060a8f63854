"""Every tool call runs in a sandboxed worker process, with time, memory, disk and output bounds.

Tools run model-written arguments, and users bring their own tools: one call must never stall,
exhaust or flood a run, nor write where the project keeps data. A :class:`SandboxedTool` is a
:class:`~agentr1.env.tools.Tool` whose calls go to a worker process forked from this one (it
inherits the tool, e.g. a search index, without copying it) and confined before it runs
anything:

- **time**: the parent waits at most ``wall_s`` for a request's answer, then kills the worker;
  the worker's CPU time per request is capped at ``cpu_s`` (a profiling timer, ``RLIMIT_CPU``
  behind it);
- **memory**: the worker's address space may grow by ``memory_mb`` over what it started with
  (``RLIMIT_AS``: an allocation past it fails, Python raises MemoryError);
- **disk**: files may be written only inside the worker's scratch directory (Linux Landlock),
  which is a tmpfs of ``disk_mb`` mounted in a user and mount namespace of the worker's own, so
  a write past the budget fails as it is made (``ENOSPC``), however many files it is spread over;
  none larger than ``disk_mb`` either (``RLIMIT_FSIZE``), and the directory is checked against
  ``disk_mb`` after every request (what stands where user namespaces are not allowed);
- **processes**: ``fork``, ``vfork``, ``execve`` and a ``clone`` that is not a thread are refused
  (seccomp), so a tool cannot start programs or multiply; so are signals to any process but the
  worker itself, ``ptrace`` and other processes' memory;
- **metadata and network**: changing a file's mode, owner, times or extended attributes is
  refused everywhere (seccomp; Landlock governs contents only), and so are sockets unless the
  tool is registered with ``network=True`` (an MCP server's tools run in the parent anyway);
- **output**: a call's text over ``output_chars``, or a return value that is not text, a number,
  a list or dict (JSON) or a ToolOutput, is a bad call that names the size or the type; the
  parent reads at most a bounded message; requests and answers are JSON, so nothing from the
  worker is ever unpickled;
- **descriptors**: the worker closes every file descriptor it inherited (the trainer's logs,
  MLflow's database) except its pipe, and points stdout and stderr at ``/dev/null``;
- the worker dies with its parent (``PR_SET_PDEATHSIG``).

A tool object may define ``enter_sandbox()``, called in the worker before its first call: a tool
that holds open files or connections reopens them there (the worker closed what it inherited),
as the SQL tool does; a tool registered with ``factory=True`` is built inside the worker anyway.

A call the worker could not answer (killed by a limit, crashed, a malformed answer) becomes an
error observation and a failed call (the bad-call penalty), like a tool that raised; the worker
is replaced before the next request and the run goes on. A tool with a ``batch`` method keeps its
batching: one request per turn; other tools get one request per call, so one hostile call
fails alone.

Landlock and seccomp need Linux (Landlock 5.13+); where either is missing the worker says so
once in the log and runs with the limits it has. Forking a process that runs threads is safe
here because the worker runs only the tool's Python code, never torch.
"""
from __future__ import annotations

import ctypes
import errno
import faulthandler
import json
import logging
import os
import resource
import shutil
import signal
import struct
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass, replace
from multiprocessing import Pipe
from pathlib import Path
from typing import Any, Callable

from agentr1.env.tools import Tool, ToolError, ToolOutput
from agentr1.errors import UserError

log = logging.getLogger(__name__)

START_SLACK_S = 5.0
"""Seconds a worker may take to start (confine itself, build its tool) beyond ``wall_s``."""
MAX_FAILED_RESTARTS = 3
"""Replacement workers in a row that may fail to start before the run stops. A call that killed
its worker (a limit hit) has the next call start another; that start can fail for a passing
reason (slow under load, a factory's transient error, a refused fork), which fails that call, not
the run; a tool that never comes back stops it."""
ANSWER_SLACK_BYTES = 1 << 16
"""Room in an answer message beyond its texts (JSON quoting, keys)."""
MAX_KEYS_CHARS = 10_000
"""The keys of one call's output (document ids, cell values), in characters."""


@dataclass(frozen=True)
class SandboxLimits:
    """The bounds of one worker; built from the config's ``env.sandbox`` section."""

    wall_s: float
    """Seconds the parent waits for one request's answer before it kills the worker."""
    cpu_s: float
    """CPU seconds one request may use."""
    memory_mb: int
    """Growth of the worker's address space over its start, in MiB."""
    disk_mb: int
    """Largest file, and all of the scratch directory, in MiB."""
    output_chars: int
    """Characters of one call's observation text."""

    @classmethod
    def from_config(cls, sandbox: Any) -> "SandboxLimits":
        return cls(sandbox.wall_s, sandbox.cpu_s, sandbox.memory_mb, sandbox.disk_mb, sandbox.output_chars)


class WorkerFailed(Exception):
    """The worker gave no usable answer; the message is what the agent reads."""


class SandboxError(UserError, RuntimeError):
    """A tool's worker could not start: the run stops (every call would fail)."""


# --------------------------------------------------------------------------- confinement (child side)

_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446  # the same on every architecture
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 38, 22, 2
# Landlock file-system rights that change the file system (reads and execution stay unhandled).
_LL_WRITE_V1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write, remove, make *
_LL_REFER, _LL_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
# Syscall numbers: (audit arch, {name: nr}); clone3 is answered ENOSYS so glibc falls back to clone.
_SYSCALLS = {
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone": 56, "clone3": 435,
        "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94,
        "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280,
        "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
        "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466,
        "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
        "pidfd_send_signal": 424, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "io_uring_setup": 425, "socket": 41}),
    "aarch64": (0xC00000B7, {
        "execve": 221, "execveat": 281, "clone": 220, "clone3": 435,
        "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchownat": 54, "fchown": 55, "utimensat": 88,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
        "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466,
        "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "pidfd_send_signal": 424, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "io_uring_setup": 425, "socket": 198}),
}
_DENIED = ("fork", "vfork", "execve", "execveat",  # new programs and processes
           # metadata: Landlock governs contents, not modes, owners, times or attributes
           "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
           "utime", "utimes", "futimesat", "utimensat",
           "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
           "setxattrat", "removexattrat",
           # other processes: signals by thread id or pidfd, tracing, their memory
           "tkill", "pidfd_send_signal", "ptrace", "process_vm_readv", "process_vm_writev",
           "io_uring_setup")  # io_uring would run the calls above without a syscall seccomp sees
_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # first argument: the process
_CLONE_THREAD = 0x00010000
_EPERM, _ENOSYS = 1, 38


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def death_signal(sig: int) -> Callable[[], None]:
    """A function that, called in a child process (a ``Popen`` ``preexec_fn``, a forked worker),
    has the kernel send the child ``sig`` when the thread that started it ends
    (``PR_SET_PDEATHSIG``). libc is looked up now, before the fork: the child only calls it."""
    prctl = _libc().prctl
    return lambda: prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _landlock(scratch: Path) -> str | None:
    """Allow writes beneath ``scratch`` only; why not, or None when done."""
    libc = _libc()
    abi = libc.syscall(_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return "Landlock is not available (Linux 5.13+ with Landlock enabled)"
    rights = _LL_WRITE_V1 | (_LL_REFER if abi >= 2 else 0) | (_LL_TRUNCATE if abi >= 3 else 0)
    attr = struct.pack("=Q", rights)  # handled_access_fs: the first field of every ABI's struct
    ruleset = libc.syscall(_LANDLOCK_CREATE, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"landlock_create_ruleset failed (errno {ctypes.get_errno()})"
    fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr (packed)
    if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, rule, ctypes.c_uint32(0)) < 0:
        return f"landlock_add_rule failed (errno {ctypes.get_errno()})"
    if libc.syscall(_LANDLOCK_RESTRICT, ruleset, ctypes.c_uint32(0)) < 0:
        return f"landlock_restrict_self failed (errno {ctypes.get_errno()})"
    os.close(fd)
    os.close(ruleset)
    return None


def _seccomp(pid: int, network: bool = False) -> str | None:
    """Refuse new processes and programs (threads stay allowed), metadata changes, signals to any
    process but ``pid`` (the worker itself), tracing and, unless ``network``, sockets; why not, or
    None when done."""
    import platform

    machine = platform.machine()
    if machine not in _SYSCALLS:
        return f"no seccomp filter for {machine}"
    arch, nr = _SYSCALLS[machine]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | _EPERM, 0x00050000 | _ENOSYS
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06

    def op(code, k, jt=0, jf=0):
        return struct.pack("=HBBI", code, jt, jf, k)

    denied = [nr[n] for n in (*_DENIED, *(() if network else ("socket",))) if n in nr]
    prog = [op(ld, 4), op(jeq, arch, 1, 0), op(ret, eperm), op(ld, 0),
            op(jge, 0x40000000, 0, 1), op(ret, eperm)]  # x32 syscalls on x86_64
    for n in denied:
        prog += [op(jeq, n, 0, 1), op(ret, eperm)]
    prog += [op(jeq, nr["clone3"], 0, 1), op(ret, enosys)]
    for n in _SELF_ONLY:  # its first argument (the low word: a pid_t) must be this process
        prog += [op(jeq, nr[n], 0, 4), op(ld, 16), op(jeq, pid & 0xFFFFFFFF, 0, 1), op(ret, allow), op(ret, eperm)]
    prog += [op(jeq, nr["clone"], 0, 1 + 2), op(ld, 16), op(jset, _CLONE_THREAD, 1, 0), op(ret, eperm),
             op(ret, allow)]
    code = b"".join(prog)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("@HP", len(prog), ctypes.addressof(buf))  # struct sock_fprog
    libc = _libc()
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0) != 0:
        return f"seccomp filter refused (errno {ctypes.get_errno()})"
    return None


_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8


def _capped_scratch(scratch: Path, disk_mb: int) -> str | None:
    """Mount a tmpfs of ``disk_mb`` on ``scratch``, seen by this process alone (a user namespace
    that maps its own ids, and a mount namespace whose mounts never propagate back); why not, or
    None when done. Must run single-threaded (a freshly forked worker is)."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        return f"no size-capped scratch (user namespaces refused: errno {ctypes.get_errno()})"
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as err:
        return f"no size-capped scratch (id maps refused: {err})"
    options = f"size={max(disk_mb << 20, 4096)},mode=0700".encode()  # size=0 would mean unbounded
    if libc.mount(b"tmpfs", os.fsencode(scratch), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        return f"no size-capped scratch (tmpfs mount refused: errno {ctypes.get_errno()})"
    return None


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run: held back while a worker forks, the default action in a worker."""


def _confine(limits: SandboxLimits, scratch: Path, keep_fd: int, network: bool = False) -> list[str]:
    """Everything the worker does before it runs a tool (module docstring); returns what could
    not be applied."""
    libc = _libc()
    capped = _capped_scratch(scratch, limits.disk_mb)  # first: a change of credentials would clear the next
    death_signal(signal.SIGKILL)()
    os.setsid()  # its own process group: the parent kills exactly it
    faulthandler.disable()  # a crash ends the worker at once (the parent says which signal)
    for sig in (*STOP_SIGNALS, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT):
        signal.signal(sig, signal.SIG_DFL)  # the parent's handlers are the parent's
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.chdir(scratch)
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = str(scratch)
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.disk_mb * mb, limits.disk_mb * mb))
    memory = _vm_bytes() + limits.memory_mb * mb
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))  # hard too: the tool cannot lift it
    missing = [capped] if capped else []
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        missing.append("no_new_privs refused")
    for step in (lambda: _landlock(scratch), lambda: _seccomp(os.getpid(), network)):
        problem = step()
        if problem:
            missing.append(problem)
    return missing


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _serve(conn, tool: Tool, make: Callable[[], Any] | None, limits: SandboxLimits, scratch: Path) -> None:
    """The worker's loop: confine, build the tool, answer requests until the pipe closes."""
    try:
        missing = _confine(limits, scratch, conn.fileno(), tool.network)
        if make is not None:  # the tool built inside its sandbox (it opens its own files)
            tool = replace(tool, **_callables(make()))
        enter = getattr(tool.fn, "enter_sandbox", None)
        if callable(enter):  # what a tool sets up only inside a worker (the SQL tool's heap limit)
            enter()
        tool = replace(tool, fn=_bounded(tool.fn, limits),
                       batch=_bounded(tool.batch, limits) if tool.batch is not None else None)
    except Exception as err:  # noqa: BLE001 - reported to the parent, which stops the run
        conn.send_bytes(json.dumps({"fatal": f"{type(err).__name__}: {err}"[:2000]}).encode())
        return
    conn.send_bytes(json.dumps({"ready": True, "missing": missing}).encode())
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except EOFError:
            return
        # SIGPROF (its default action ends the process) after cpu_s of CPU time; RLIMIT_CPU, whole
        # seconds only, stands behind it.
        resource.setrlimit(resource.RLIMIT_CPU, (int(_cpu_seconds() + limits.cpu_s) + 2, resource.RLIM_INFINITY))
        signal.setitimer(signal.ITIMER_PROF, limits.cpu_s)
        results = tool.run_batch(request["calls"])
        signal.setitimer(signal.ITIMER_PROF, 0)
        answer = []
        for output, failed in results:
            if len(output.text) > limits.output_chars:  # a bad call, not a silently cut answer
                output, failed = tool.failure(ToolError(f"it returned {len(output.text):,} characters, over the "
                                                        f"{limits.output_chars:,} of env.sandbox.output_chars")), True
            answer.append([output.text, _kept_keys(output.keys), failed])
        if _dir_bytes(scratch) > limits.disk_mb << 20:
            conn.send_bytes(json.dumps({"error": f"it wrote more than {limits.disk_mb} MiB"}).encode())
            return
        conn.send_bytes(json.dumps({"results": answer}).encode())


def _kept_keys(keys) -> list[str]:
    """The leading keys within MAX_KEYS_CHARS, each counted one character more than its length
    (an empty key still costs bytes on the pipe): one pass, whatever their number."""
    kept, total = [], 0
    for key in keys:
        total += len(key) + 1
        if total > MAX_KEYS_CHARS:
            break
        kept.append(key)
    return kept


def _bounded(fn: Callable, limits: SandboxLimits) -> Callable:
    """``fn`` whose failures caused by the sandbox say which bound they hit (the agent reads it)."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MemoryError:
            raise ToolError(f"it needed more than {limits.memory_mb} MiB of memory") from None
        except PermissionError:
            raise ToolError("permission denied (a tool may write only in its scratch directory; it may not change "
                            "files' modes, owners or times, start processes, signal others or open sockets)") from None
        except OSError as err:
            if err.errno == errno.EFBIG:
                raise ToolError(f"it wrote a file larger than {limits.disk_mb} MiB") from None
            if err.errno == errno.ENOSPC:  # the scratch tmpfs is full
                raise ToolError(f"it wrote more than {limits.disk_mb} MiB") from None
            raise
    return call


def _callables(obj: Any) -> dict:
    """The ``fn`` and ``batch`` of a freshly built tool object, for :func:`dataclasses.replace`."""
    batch = getattr(obj, "batch", None)
    return {"fn": obj, "batch": batch if callable(batch) else None}


# --------------------------------------------------------------------------- the worker (parent side)


def _fork_holding_stop_signals() -> tuple[int, Any, list[int]]:
    """``os.fork()``, with a stop signal that arrives meanwhile acted on after it, in the parent's
    own code. Returns the pid, the signal mask to restore in the child (where the stop signals
    stay blocked, and only noted, until the worker has reset its handlers), and the signals the
    parent must raise again (:func:`signal.raise_signal`) once it has recorded the child.

    ``fork()`` runs Python's at-fork hooks (logging's lock release); a handler that raises inside
    one has its exception printed and dropped, so the signal was lost and the run went on (seen:
    SIGTERM at the warm-up's first tool call, the process still training 15 minutes later).
    Blocking the signals in this thread is not enough: the kernel hands a process-directed signal
    to any thread that does not block it, and Python then runs the handler in the main thread at
    its next chance, which may be inside a hook. So the handlers only note a signal while the
    fork runs, and it is raised again afterwards, to the handlers that were there."""
    noted: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in STOP_SIGNALS} if main else {}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0:  # the parent, or a fork that failed
            for s, handler in previous.items():
                signal.signal(s, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return pid, blocked, list(dict.fromkeys(noted))


class ToolWorker:
    """One forked worker holding one tool; :meth:`request` sends calls and waits for the answer."""

    def __init__(self, tool: Tool, make: Callable[[], Any] | None, limits: SandboxLimits):
        self.tool, self.make, self.limits = tool, make, limits
        self.pid: int | None = None
        self.conn = None
        self.scratch: Path | None = None
        self.missing: list[str] = []
        self.started = False  # a worker has started once: later starts are replacements
        self.failed_restarts = 0

    def start(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix=f"agentr1-tool-{self.tool.name}-"))
        parent, child = Pipe(duplex=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid, blocked, noted = _fork_holding_stop_signals()
        if pid == 0:  # the worker: never returns into the caller's code
            code = 0
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # _confine resets the handlers
                parent.close()
                _serve(child, self.tool, self.make, self.limits, self.scratch)
            except BaseException:  # noqa: BLE001 - whatever happens, the worker only exits
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.pid, self.conn = pid, parent
        for signum in noted:  # a stop that came during the fork, now that the worker can be stopped too
            signal.raise_signal(signum)
        try:
            hello = self._receive(self.limits.wall_s + START_SLACK_S, 1)
        except WorkerFailed as err:
            raise SandboxError(f"tool {self.tool.name!r}: its sandboxed worker did not start: {err}") from None
        if "fatal" in hello:
            self.stop()
            raise SandboxError(f"tool {self.tool.name!r}: building it in its sandbox failed: {hello['fatal']} "
                               f"(limits: {self.limits}; raise them in env.sandbox, or set env.sandbox.enabled=false)")
        self.missing = hello.get("missing", [])
        self.started = True

    def _replace(self) -> None:
        """Start a worker for the next call: the first start failing stops the run (every call
        would fail); a replacement's fails only the call that needed it, up to
        :data:`MAX_FAILED_RESTARTS` in a row."""
        if not self.started:
            self.start()
            return
        try:
            self.start()
        except (SandboxError, OSError) as err:
            self.stop()
            self.failed_restarts += 1
            if self.failed_restarts >= MAX_FAILED_RESTARTS:
                raise SandboxError(f"tool {self.tool.name!r}: {self.failed_restarts} replacement workers in a row did "
                                   f"not start; the last: {err}") from None
            raise WorkerFailed(f"its replacement worker did not start ({err})") from None
        self.failed_restarts = 0

    def request(self, calls: list[dict]) -> list[tuple[ToolOutput, bool]]:
        """The answers to ``calls``; WorkerFailed (the worker then gone) when there is none.

        A worker that died between two calls is replaced before the call, which it never saw:
        PR_SET_PDEATHSIG ends a worker with the *thread* that forked it, so one first used from a
        thread pool's thread (Prefect's tasks) is gone once that thread ends."""
        if self.pid is not None and not self._alive():
            self.stop()
        if self.pid is None:
            self._replace()
        message = json.dumps({"calls": calls}, ensure_ascii=False).encode()
        try:
            self.conn.send_bytes(message)
        except OSError:  # it died just now, before reading the call: a new one takes it
            self.stop()
            self._replace()
            self.conn.send_bytes(message)
        answer = self._receive(self.limits.wall_s, len(calls))
        results = answer.get("results")
        if not isinstance(results, list) or len(results) != len(calls):
            self.stop()
            raise WorkerFailed("it gave a malformed answer")
        return [(ToolOutput(str(text), tuple(str(k) for k in keys)), bool(failed)) for text, keys, failed in results]

    def _receive(self, timeout: float, n_calls: int) -> dict:
        # The worker's JSON is ASCII (ensure_ascii: a lone surrogate a tool returns survives it): a
        # character takes at most 12 bytes (an astral one is two \uXXXX escapes).
        limit = n_calls * 12 * (self.limits.output_chars + MAX_KEYS_CHARS) + ANSWER_SLACK_BYTES
        try:
            if not self.conn.poll(timeout):
                self.stop()
                raise WorkerFailed(f"it ran longer than {self.limits.wall_s:g} s and was stopped")
            message = json.loads(self.conn.recv_bytes(limit))
        except (EOFError, OSError, ValueError) as err:
            status = self.stop()
            raise WorkerFailed(_death(status, self.limits) if isinstance(err, EOFError)
                               else "it gave a malformed or oversized answer") from None
        if "error" in message:
            self.stop()
            raise WorkerFailed(str(message["error"]))
        return message

    def _alive(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def stop(self) -> int | None:
        """Kill the worker (if alive), reap it and remove its scratch directory; its exit status."""
        status = None
        if self.pid is not None:
            # Its session (setsid) holds whatever it started; a worker stopped right after the fork
            # may not have made that session yet, so it is killed by its pid too.
            for kill in (os.killpg, os.kill):
                try:
                    kill(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        return status


def _death(status: int | None, limits: SandboxLimits) -> str:
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGPROF, signal.SIGXCPU):
            return f"it used more than {limits.cpu_s:g} s of CPU time and was stopped"
        if sig == signal.SIGXFSZ:
            return f"it wrote a file larger than {limits.disk_mb} MiB"
        return f"its process died ({signal.Signals(sig).name})"
    return "its process exited"


class SandboxedTool(Tool):
    """A tool whose calls run in a :class:`ToolWorker` (module docstring)."""

    def __init__(self, tool: Tool, limits: SandboxLimits, make: Callable[[], Any] | None = None):
        super().__init__(tool.name, tool.schema, tool.fn, tool.batch, tool.make)
        object.__setattr__(self, "_worker", ToolWorker(tool, make or tool.make, limits))
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_warned", False)
        weakref.finalize(self, self._worker.stop)

    def run_batch(self, calls: list[dict]) -> list[tuple[ToolOutput, bool]]:
        if not calls:
            return []
        with self._lock:
            if self.batch is not None:
                return self._request(calls)
            return [r for call in calls for r in self._request([call])]

    def _request(self, calls: list[dict]) -> list[tuple[ToolOutput, bool]]:
        try:
            out = self._worker.request(calls)
        except WorkerFailed as err:
            log.warning("tool %r: %s; a new worker takes the next call", self.name, err)
            return [(ToolOutput(f"Error: tool '{self.name}' failed: {err}"), True)] * len(calls)
        if self._worker.missing and not self._warned:
            object.__setattr__(self, "_warned", True)
            log.warning("tool %r runs with its time, memory and output limits only: %s", self.name,
                        "; ".join(self._worker.missing))
        return out

    def close(self) -> None:
        """Stop the worker now (it is stopped when the tool is collected, or with this process)."""
        self._worker.stop()


def sandboxed(tools: list[Tool], limits: SandboxLimits | None) -> list[Tool]:
    """``tools`` each in a sandbox (``limits`` None: as they are, in this process)."""
    if limits is None:
        return list(tools)
    return [t if isinstance(t, SandboxedTool) or t.isolated else SandboxedTool(t, limits) for t in tools]
