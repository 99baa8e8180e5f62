"""Which model version of a stage answers each request: the engine's choice, made once when a
request starts, for all of its steps of that stage (a large embeddings request's parts all run
on one version).

A stage's name, as requests name it, maps to the engine stage serving it: itself, or the
version swapped in (``<stage>@<model_version>``, an engine stage of its own). During a canary
(:class:`Canary`), every 1/``share``-th request of the stage goes to the new version (counted,
not drawn). A request that fails on a canary's version for a reason of the model (not its
input, not a shed) is counted against the canary and, when its graph allows
(``RequestGraph.falls_back``), answered again on the version serving the stage: its caller sees
no failure. Failures beyond the canary's error budget end it (rolled back); a canary that ran
its time and count is promoted. Requests are counted per engine stage while they run, so a
version that stops serving can be drained (:meth:`VersionRouter.wait_drained`) before it is
unloaded.

The swap itself (loading the new version, probing it, the policy reload that asks for it,
draining and unloading) is the server's (``server/rollout.py``); it learns of a canary's end
from :attr:`VersionRouter.on_end`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hetero.framework.errors import InvalidInputError, ShedError
from hetero.framework.policy.schema import RolloutConfig

__all__ = ["Canary", "Ticket", "VersionRouter", "with_fallback"]

logger = logging.getLogger(__name__)


@dataclass
class Canary:
    """A new version of ``stage`` (engine stage ``new``) taking every 1/share-th request from
    ``old``; ``state``: ``canary``, then ``promoted`` or ``rolled_back`` (``reason`` says
    why)."""

    stage: str
    old: str
    new: str
    config: RolloutConfig
    started_at: float = field(default_factory=time.monotonic)
    routed: Counter[str] = field(default_factory=Counter)  # requests routed: old / new
    answered: int = 0  # canary requests the new version answered
    failed: int = 0  # canary requests it failed
    state: str = "canary"
    reason: str = ""

    def over(self, now: float) -> bool:
        """Whether the canary has run its time and its count of answered requests."""
        config = self.config
        return (
            self.answered >= config.canary_min_requests and now - self.started_at >= config.canary_s
        )


@dataclass
class Ticket:
    """The engine stage one request's steps of ``stage`` run on, and the canary it serves
    (None: the version serving the stage); closed once when the request ends."""

    stage: str
    engine_stage: str
    canary: Canary | None
    open: bool = True


class VersionRouter:
    """The engine stage serving each stage, canaries, and requests in flight per version."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._serving: dict[str, str] = {}  # stage -> engine stage; absent: itself
        self._canaries: dict[str, Canary] = {}
        self._inflight: Counter[str] = Counter()  # requests per engine stage
        # Told (outside the lock) when a canary ends: promoted, or rolled back.
        self.on_end: Callable[[Canary], None] | None = None

    def serving(self, stage: str) -> str:
        """The engine stage serving ``stage`` now (a canary's aside)."""
        return self._serving.get(stage, stage)

    def pick(self, stages: Iterable[str]) -> dict[str, Ticket]:
        """A ticket per distinct stage for a request starting now."""
        tickets: dict[str, Ticket] = {}
        with self.cond:
            for stage in stages:
                if stage in tickets:
                    continue
                chosen, canary = self._serving.get(stage, stage), None
                trial = self._canaries.get(stage)
                if trial is not None:
                    share = trial.config.canary_share
                    seen = trial.routed["old"] + trial.routed["new"]
                    if math.floor((seen + 1) * share) > math.floor(seen * share):
                        chosen, canary = trial.new, trial
                    trial.routed["new" if canary else "old"] += 1
                self._inflight[chosen] += 1
                tickets[stage] = Ticket(stage, chosen, canary)
        return tickets

    def close(self, tickets: Mapping[str, Ticket], answered: bool = True) -> None:
        """The request that held ``tickets`` ended. Only a canary request ``answered`` (it
        ran and returned a result) counts towards the canary's promotion: one shed,
        cancelled or refused for its input says nothing of the new version."""
        ended: list[Canary] = []
        with self.cond:
            for ticket in tickets.values():
                if not ticket.open:
                    continue
                ticket.open = False
                self._inflight[ticket.engine_stage] -= 1
                canary = ticket.canary
                if answered and canary is not None and canary.state == "canary":
                    canary.answered += 1
                    if canary.over(time.monotonic()):
                        self._promote(canary)
                        ended.append(canary)
            self.cond.notify_all()
        self._tell(ended)

    def failed(
        self, tickets: Mapping[str, Ticket], error: BaseException
    ) -> dict[str, Ticket] | None:
        """The request failed with ``error``. Where it ran on a canary and the model is to
        blame, the failure is counted (past the error budget the canary is rolled back) and
        tickets to answer it again on the serving versions are given (the old ones closed);
        otherwise None."""
        if isinstance(error, InvalidInputError | ShedError) or getattr(error, "status", 500) < 500:
            return None  # the request's own fault, or a shed: no version would do better
        if not any(t.canary is not None and t.open for t in tickets.values()):
            return None
        ended: list[Canary] = []
        again: dict[str, Ticket] = {}
        with self.cond:
            for stage, ticket in tickets.items():
                canary = ticket.canary
                if canary is None or not ticket.open:
                    continue
                ticket.open = False
                self._inflight[ticket.engine_stage] -= 1
                canary.failed += 1
                logger.warning(
                    "stage %s: canary request failed on %s: %s", stage, canary.new, error
                )
                budget = canary.config.max_error_rate * max(
                    canary.answered + canary.failed, canary.config.canary_min_requests
                )
                if canary.state == "canary" and canary.failed > budget:
                    self._canaries.pop(stage, None)
                    canary.state = "rolled_back"
                    canary.reason = (
                        f"{canary.failed} of {canary.answered + canary.failed} canary requests "
                        f"failed (last: {type(error).__name__}: {error})"
                    )
                    ended.append(canary)
                primary = self._serving.get(stage, stage)
                self._inflight[primary] += 1
                again[stage] = Ticket(stage, primary, None)
            self.cond.notify_all()
        self._tell(ended)
        return {**tickets, **again}

    def switch(self, stage: str, engine_stage: str) -> None:
        """Serve ``stage`` by ``engine_stage`` from now on (a swap all at once)."""
        with self.cond:
            self._canaries.pop(stage, None)
            self._serving[stage] = engine_stage
            self.cond.notify_all()

    def start_canary(self, canary: Canary) -> None:
        """Send ``canary.new`` its share of ``canary.stage``'s requests from now on."""
        with self.cond:
            canary.started_at = time.monotonic()
            self._canaries[canary.stage] = canary
            self.cond.notify_all()

    def settle_canary(self, canary: Canary) -> None:
        """Wait until ``canary`` ends: promoted once over (its time run, and its count of
        answered requests reached: it waits for them, however long; a shed or cancelled
        request is not one), or rolled back by its failures."""
        ended: list[Canary] = []
        with self.cond:
            while canary.state == "canary":
                if canary.over(time.monotonic()):
                    self._promote(canary)
                    ended.append(canary)
                    break
                remaining = canary.config.canary_s - (time.monotonic() - canary.started_at)
                self.cond.wait(timeout=remaining if remaining > 0 else None)
        self._tell(ended)

    def wait_drained(self, engine_stage: str) -> None:
        """Wait until no request that chose ``engine_stage`` is running."""
        with self.cond:
            self.cond.wait_for(lambda: self._inflight[engine_stage] <= 0)

    def _promote(self, canary: Canary) -> None:
        """Make the canary's version the stage's (lock held)."""
        self._canaries.pop(canary.stage, None)
        self._serving[canary.stage] = canary.new
        canary.state = "promoted"

    def _tell(self, ended: list[Canary]) -> None:
        for canary in ended:
            logger.info("stage %s: canary of %s %s", canary.stage, canary.new, canary.state)
            if self.on_end is not None:
                try:
                    self.on_end(canary)
                except Exception:  # the request that ended it must still be answered
                    logger.exception("stage %s: the end of the canary not taken up", canary.stage)


def with_fallback(
    router: VersionRouter,
    tickets: dict[str, Ticket],
    first: Future[Any],
    again: Callable[[dict[str, Ticket]], Future[Any]] | None,
) -> Future[Any]:
    """The future of a request started on ``tickets`` (``first``): closes them when it ends;
    when it failed on a canary and ``again`` is given, it is answered by ``again`` on the
    serving versions' tickets instead (its caller sees that answer). Cancelling the returned
    future cancels the request under way."""
    if again is None or not any(t.canary is not None for t in tickets.values()):
        first.add_done_callback(lambda done: _closed(router, tickets, done))
        return first
    outer: Future[Any] = Future()
    current = [first]

    def cancelled(done: Future[Any]) -> None:
        if done.cancelled():
            current[0].cancel()

    def first_done(done: Future[Any]) -> None:
        error = None if done.cancelled() else done.exception()
        retry = router.failed(tickets, error) if error is not None else None
        if retry is None:
            router.close(tickets, _answered(done))
            _copy(done, outer)
            return
        try:
            second = again(retry)
        except BaseException as err:  # shed, or shutting down: that is its answer
            router.close(retry, answered=False)
            _settle(outer, error=err)
            return
        current[0] = second
        if outer.cancelled():  # its caller left while it was being started again
            second.cancel()

        def second_done(end: Future[Any]) -> None:
            router.close(retry, _answered(end))
            _copy(end, outer)

        second.add_done_callback(second_done)

    outer.add_done_callback(cancelled)
    first.add_done_callback(first_done)
    return outer


def _closed(router: VersionRouter, tickets: dict[str, Ticket], done: Future[Any]) -> None:
    """A request without a fallback ended: a canary's failure is counted all the same."""
    error = None if done.cancelled() else done.exception()
    retry = router.failed(tickets, error) if error is not None else None
    router.close(retry if retry is not None else tickets, _answered(done))


def _answered(done: Future[Any]) -> bool:
    """The request ran and returned a result (not cancelled, not failed, not shed)."""
    return not done.cancelled() and done.exception() is None


def _copy(source: Future[Any], target: Future[Any]) -> None:
    if source.cancelled():
        target.cancel()
        return
    error = source.exception()
    if error is not None:
        _settle(target, error=error)
    else:
        _settle(target, result=source.result())


def _settle(target: Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if target.done():
        return  # its caller cancelled it
    try:
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(result)
    except Exception:  # cancelled meanwhile
        pass
