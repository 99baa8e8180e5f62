"""The engine's choice of model version per request (``framework/engine/version_routing.py``):
a canary's share counted, not drawn; a request failed on the canary answered again on the
serving version and counted; the error budget rolling it back; requests counted per version
so the leaving one can be drained."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from hetero.framework.engine.version_routing import Canary, Ticket, VersionRouter, with_fallback
from hetero.framework.errors import BackendError, InvalidInputError, ShedError
from hetero.framework.policy.schema import RolloutConfig


def _canary(router: VersionRouter, **config: Any) -> Canary:
    canary = Canary("embed", "embed", "embed@2", RolloutConfig(strategy="canary", **config))
    router.start_canary(canary)
    return canary


def test_every_fourth_request_goes_to_a_quarter_canary_until_it_is_over() -> None:
    router = VersionRouter()
    ended: list[str] = []
    router.on_end = lambda canary: ended.append(canary.state)
    _canary(router, canary_share=0.25, canary_s=0, canary_min_requests=3)
    chosen = []
    for _ in range(16):
        tickets = router.pick(["embed", "embed"])  # one ticket per stage, however many steps
        assert len(tickets) == 1
        chosen.append(tickets["embed"].engine_stage)
        router.close(tickets)
    # the 4th, 8th and 12th went to the canary; its third answer promoted it
    assert [i for i, c in enumerate(chosen, 1) if c == "embed@2"][:3] == [4, 8, 12]
    assert ended == ["promoted"]
    assert chosen[12:] == ["embed@2"] * 4
    assert router.serving("embed") == "embed@2"


def test_without_a_canary_every_request_runs_on_the_serving_version() -> None:
    router = VersionRouter()
    assert {router.pick(["embed"])["embed"].engine_stage for _ in range(10)} == {"embed"}
    router.switch("embed", "embed@2")
    assert router.pick(["embed"])["embed"].engine_stage == "embed@2"


def _failing(error: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(error)
    return future


def test_a_request_failed_on_the_canary_is_answered_by_the_serving_version() -> None:
    router = VersionRouter()
    canary = _canary(router, canary_share=1.0, canary_min_requests=100, max_error_rate=0.5)
    tickets = router.pick(["embed"])
    assert tickets["embed"].engine_stage == "embed@2"
    ran_again: list[str] = []

    def again(retry: dict[str, Ticket]) -> Future[Any]:
        ran_again.append(retry["embed"].engine_stage)
        done: Future[Any] = Future()
        done.set_result("answer")
        return done

    outcome = with_fallback(router, tickets, _failing(BackendError("device lost")), again)
    assert outcome.result(timeout=0) == "answer"
    assert ran_again == ["embed"]
    assert (canary.failed, canary.state) == (1, "canary")  # within its budget (50 % of 100)
    router.wait_drained("embed@2")  # nothing left on either version: returns at once
    router.wait_drained("embed")


def test_the_control_a_bad_input_is_its_own_answer_and_not_counted() -> None:
    router = VersionRouter()
    canary = _canary(router, canary_share=1.0, canary_min_requests=100)
    tickets = router.pick(["embed"])
    ran_again: list[str] = []

    def again(retry: dict[str, Ticket]) -> Future[Any]:
        ran_again.append("again")
        raise AssertionError("a bad input is not run again")

    outcome = with_fallback(router, tickets, _failing(InvalidInputError("bad")), again)
    assert isinstance(outcome.exception(timeout=0), InvalidInputError)
    assert (ran_again, canary.failed) == ([], 0)


def test_failures_past_the_budget_roll_the_canary_back() -> None:
    router = VersionRouter()
    ended: list[Canary] = []
    router.on_end = ended.append
    canary = _canary(router, canary_share=1.0, canary_min_requests=2, max_error_rate=0.0)
    tickets = router.pick(["embed"])
    assert router.failed(tickets, BackendError("oom")) is not None
    assert canary.state == "rolled_back" and "1 of 1 canary requests failed" in canary.reason
    assert ended == [canary]
    assert router.pick(["embed"])["embed"].engine_stage == "embed"  # the old one serves


def test_a_caller_gone_while_the_request_is_started_again_cancels_the_second_run() -> None:
    router = VersionRouter()
    _canary(router, canary_share=1.0, canary_min_requests=100, max_error_rate=1.0)
    tickets = router.pick(["embed"])
    first: Future[Any] = Future()
    second: Future[Any] = Future()
    outcome: list[Future[Any]] = []

    def again(retry: dict[str, Ticket]) -> Future[Any]:
        outcome[0].cancel()  # the caller leaves just as the second run starts
        return second

    outcome.append(with_fallback(router, tickets, first, again))
    first.set_exception(BackendError("device lost"))
    assert second.cancelled()
    router.wait_drained("embed")  # its ticket was closed with it


def test_a_shed_or_cancelled_canary_request_does_not_count_towards_promotion() -> None:
    router = VersionRouter()
    canary = _canary(router, canary_share=1.0, canary_s=0, canary_min_requests=1)
    shed = router.pick(["embed"])
    with_fallback(router, shed, _failing(ShedError("queue full", status=429)), None)
    cancelled: Future[Any] = Future()
    with_fallback(router, router.pick(["embed"]), cancelled, None)
    cancelled.cancel()
    assert (canary.answered, canary.state) == (0, "canary")  # neither ran on the new version
    answered: Future[Any] = Future()
    with_fallback(router, router.pick(["embed"]), answered, None)
    answered.set_result("ok")  # the control: an answer counts, and this one promotes it
    assert (canary.answered, canary.state) == (1, "promoted")
