"""A detached embedded stack for `tritonship stack up|down`: it outlives the command, and its processes
and credentials are described in a state file that `stack down` reads."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.processes import ManagedProcess, StackError, group_members, kill_group, wait_group_gone
from pipelines.stack import EmbeddedStack

STATE_FILE = "state.json"


def stack_up(state_dir: Path, replicas: int, gate: bool) -> dict[str, object]:
    """Start a detached stack that outlives this process; its description goes to state_dir."""
    state_path = state_dir / STATE_FILE
    if state_dir.exists() and not state_dir.is_dir():
        raise StackError(f"the state folder {state_dir} is a file; give a folder (or a path that does not exist).")
    if state_path.exists():
        raise StackError(f"a stack is already up (see {state_path}); run `tritonship stack down` first.")
    stack = EmbeddedStack(replicas=replicas, gate=gate, workdir=state_dir, detach=True)
    try:
        stack.start()
    except BaseException:
        stack.stop()
        raise
    description = stack.describe()
    description["pgids"] = [p.pid for p in _processes(stack)]
    state_path.write_text(json.dumps({**description, "env": stack.env()}, indent=2))
    state_path.chmod(0o600)  # holds the S3 credentials and the admin key
    return description


def stack_down(state_dir: Path) -> list[int]:
    """Stop every process of the stack described in state_dir; returns the process groups stopped."""
    state_path = state_dir / STATE_FILE
    if not state_path.exists():
        raise StackError(f"no stack is up (no {state_path}).")
    pgids = [int(p) for p in json.loads(state_path.read_text())["pgids"]]
    for pgid in pgids:
        kill_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while any(group_members(p) for p in pgids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid in pgids:
        kill_group(pgid, signal.SIGKILL)
        wait_group_gone(pgid, 5)
    state_path.unlink()
    return pgids


def _processes(stack: EmbeddedStack) -> Iterator[ManagedProcess]:
    if stack.s3_server:
        yield stack.s3_server.process
    for server in stack.servers.values():
        yield server.process
