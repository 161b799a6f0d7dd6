"""One measurement at a time on a gate server: the steps that measure there (quality, tune, gate) take its lease
first, and wait while another release's measurement holds it.

Two models retrained at the same hour share the gate server. Measured at once, each one's perf_analyzers load
the server while the other measures: each verdict would then carry the other's noise. The gate lease
(components/repository/leases.py) is taken with an S3 conditional write, renewed while the step measures, and
given back when it ends, whatever happened; a run that dies leaves it to expire after `DEFAULT_GATE_LEASE_S`.
The seconds a step waited are in its result and its reports."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from components import log
from components.clock import Clock, SystemClock
from components.errors import TritonshipError
from components.release.results import StageResult
from components.repository import ModelRepository
from components.repository.leases import LeaseHeld
from components.repository.store import CANDIDATE_SUFFIX
from components.serving.replicas import Replica, resolve
from components.serving.triton_admin import TritonAdmin
from components.settings import DEFAULT_GATE_LEASE_S, DEFAULT_GATE_POLL_S, DEFAULT_GATE_WAIT_S

LOG = log.get("gate")


class GateBusy(TritonshipError):
    """The gate server stayed busy with other releases' measurements for the whole wait."""

    exit_code = 3


@contextmanager
def gate_turn(
    repo: ModelRepository,
    gate_url: str,
    owner: str,
    wait_s: float = DEFAULT_GATE_WAIT_S,
    progress: Callable[[str], None] | None = None,
    clock: Clock | None = None,
) -> Iterator[float]:
    """Wait until no other measurement holds the gate server, hold it while the body runs (renewed every third of
    the lease), give it back after. Yields the seconds waited. GateBusy when `wait_s` passes first."""
    clock = clock or SystemClock()
    started = clock.now()
    while True:
        try:
            repo.acquire_gate(gate_url, owner, DEFAULT_GATE_LEASE_S)
            break
        except LeaseHeld as held:
            waited = clock.now() - started
            holder = (held.holder or {}).get("owner", "another run")
            if waited + DEFAULT_GATE_POLL_S > wait_s:
                raise GateBusy(
                    f"the gate server {gate_url} was measuring for {holder} for the whole {wait_s:.0f} s wait; "
                    "run the release again when it is free."
                ) from None
            if progress:
                progress(f"waiting for the gate server {gate_url}: measuring for {holder} ({waited:.0f} s)")
            clock.sleep(DEFAULT_GATE_POLL_S)
    waited = clock.now() - started
    log.event(LOG, "gate server taken", gate=gate_url, owner=owner, waited_s=round(waited, 1))
    done = threading.Event()

    def renew() -> None:
        while not done.wait(DEFAULT_GATE_LEASE_S / 3):
            try:
                repo.acquire_gate(gate_url, owner, DEFAULT_GATE_LEASE_S)
            except TritonshipError as exc:  # the step goes on; its lease may expire, which the log says
                log.event(LOG, "gate lease not renewed", gate=gate_url, owner=owner, error=str(exc))

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        yield waited
    finally:
        done.set()
        renewer.join()
        try:
            repo.release_gate(gate_url, owner)
        except TritonshipError as exc:  # it expires by itself
            log.event(LOG, "gate lease not given back", gate=gate_url, owner=owner, error=str(exc))


def free_gate(repo: ModelRepository, servers: list[Replica]) -> Replica:
    """Of several gate servers (the chart's gate replicas), the one a release stages on and measures on to the end:
    the first that no measurement holds and that has the fewest candidates of other releases loaded dark (each one
    a release that will measure there). One server is itself; one that cannot be asked counts as busiest."""
    if len(servers) == 1:
        return servers[0]

    def load(server: Replica) -> tuple[bool, int]:
        try:
            with TritonAdmin(server.url, timeout=10, retries=1) as admin:
                dark = sum(name.endswith(CANDIDATE_SUFFIX) for name in admin.ready_models())
        except TritonshipError:
            return True, 1 << 30
        holder = repo.gate_holder(server.url)
        return holder is not None and holder["expires"] > time.time(), dark

    chosen = min(servers, key=load)
    log.event(LOG, "gate server chosen", gate=chosen.url, of=len(servers))
    return chosen


def staged_server(gate: str, staged: StageResult) -> Replica:
    """The gate server a release staged on (free_gate's choice), with its metrics endpoint where `gate` names it."""
    return next((s for s in resolve(gate) if s.url == staged.gate_url), Replica(staged.gate_url, staged.gate_url))
