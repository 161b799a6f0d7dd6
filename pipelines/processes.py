"""The embedded stack's server processes: each in its own process group, logged to a file, stopped with its
whole group (the server and its backend stubs), and killed by the kernel when the Python process that
started it dies."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from components import log
from components.errors import TritonshipError

LOG = log.get("stack")


class StackError(TritonshipError):
    """The embedded stack could not start or stop."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _prepare(die_with_parent_too: bool, cpus: frozenset[int] | None) -> None:
    if die_with_parent_too:
        die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)


def die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the kernel sends SIGKILL to the server if the Python process that started
    # it dies (even by SIGKILL), so no test crash or Ctrl-C leaves a server behind.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


@dataclass
class ManagedProcess:
    """A server process in its own process group, with its output in a log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    detach: bool = False
    cpus: frozenset[int] | None = None  # the CPUs it may run on (None: any)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    pid: int | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # PDEATHSIG fires when the *thread* that forked exits, so only the main thread uses it.
                preexec_fn=functools.partial(
                    _prepare,
                    not self.detach and threading.current_thread() is threading.main_thread(),
                    self.cpus,
                ),
            )
        self.pid = self.popen.pid
        log.event(LOG, "process started", name=self.name, pid=self.pid, log=self.log_path)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole process group (server and its backend stubs), SIGKILL after `timeout`."""
        if self.pid is None:
            return
        kill_group(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_group(self.pid, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()
        wait_group_gone(self.pid, 5.0)

    def kill(self) -> None:
        """SIGKILL at once, as a crash or an evicted pod would."""
        if self.pid is not None:
            kill_group(self.pid, signal.SIGKILL)
            if self.popen is not None:
                self.popen.wait()
            wait_group_gone(self.pid, 5.0)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as gone.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


def kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


def wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_until(condition: object, proc: ManagedProcess, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        if not proc.alive():
            return False
        time.sleep(0.1)
    return False
