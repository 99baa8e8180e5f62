"""One device's continuous (iteration-level) batch of one LLM model, as vLLM runs it.

The engine keeps a running batch. Between decode steps it admits waiting sequences, first come
first served, while the batch is under its cap and the paged KV cache has blocks for their
prompts: they run one prefill step together (the running ones wait for it, as vLLM's default
scheduler does), then join the decode steps. A sequence leaves at the end of the step that
generates its last token. Each decode step writes one token per running sequence; when the
blocks that step needs are not free, the sequence admitted last is preempted (vLLM's recompute
mode: its blocks go back, it returns to the head of the queue and its prompt and generated
tokens are prefilled again when it is readmitted). A lone sequence always runs.

The engine plans its work in spans: a prefill step, or a window of decode steps that lasts
until the first running sequence finishes (or the KV cache would run out). A caller that has
other work for the device (a sequence waiting to join, another model's batch) cuts the window
at the end of the step in progress (:meth:`DecodeEngine.truncate`): that is the step boundary
where a vLLM engine would take it in. Step times come from the caller (the sim backend's one
formula, :func:`hetero.backends.sim.timing.modelled_steps`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

__all__ = ["DecodeEngine", "DecodeSequence", "EngineWork"]

T = TypeVar("T")

PrefillTime = Callable[[Sequence[int]], float]
"""Seconds of one prefill step of sequences with these context lengths."""
StepTimes = Callable[[Sequence[int], Sequence[int]], np.ndarray]
"""Seconds of each decode step of sequences with these contexts and tokens left to generate."""


@dataclass(slots=True, eq=False)
class DecodeSequence(Generic[T]):
    """One request in the engine: its prompt and output length and how far it has come."""

    item: T
    prompt: int
    output: int
    generated: int = 0
    admitted_at: float | None = None
    """When its first prefill started (None while it has never been admitted)."""
    batch_steps: int = 0
    """Sum, over the decode steps it ran in, of the running batch's size."""
    preemptions: int = 0
    before_run_s: float = 0.0
    """Seconds of its prefill steps spent on a model load and its inputs' transfer (not
    running: the run time a device reports leaves them out, as a backend's load_s is apart)."""

    @property
    def context(self) -> int:
        """Tokens in its KV cache once prefilled: the prompt and what it generated."""
        return self.prompt + self.generated

    @property
    def remaining(self) -> int:
        """Tokens still to generate."""
        return self.output - self.generated

    @property
    def mean_batch(self) -> float:
        """Mean size of the running batch over the decode steps it ran in (1 before any)."""
        return self.batch_steps / self.generated if self.generated else 1.0


@dataclass(slots=True)
class EngineWork(Generic[T]):
    """What the engine runs now: a prefill step of ``joining`` sequences, or a window of
    decode steps of the running batch; ``ends`` holds each step's end time."""

    kind: str  # "prefill" or "decode"
    start: float
    ends: np.ndarray
    joining: list[DecodeSequence[T]]

    @property
    def end(self) -> float:
        """When the work is done."""
        return float(self.ends[-1])

    def steps_done(self, now: float) -> int:
        """Steps finished by ``now``."""
        return int(np.searchsorted(self.ends, now, side="right"))


class DecodeEngine(Generic[T]):
    """The waiting and running sequences of one LLM model on one device."""

    def __init__(
        self,
        *,
        max_running: int,
        block_tokens: int,
        bytes_per_token: float,
        prefill_s: PrefillTime,
        steps_s: StepTimes,
    ) -> None:
        self.max_running = max_running
        self.block_tokens = block_tokens
        self.bytes_per_token = bytes_per_token
        self._prefill_s = prefill_s
        self._steps_s = steps_s
        self.waiting: deque[DecodeSequence[T]] = deque()
        self.running: list[DecodeSequence[T]] = []  # in order of admission
        self.work: EngineWork[T] | None = None
        self.generation = 0
        """Bumped whenever the planned end of the work moves (a caller's timer is stale)."""
        self.preemptions = 0

    def add(self, sequence: DecodeSequence[T]) -> None:
        """A request was placed here: it waits for the next step boundary."""
        self.waiting.append(sequence)

    @property
    def has_work(self) -> bool:
        """Anything waiting or running."""
        return bool(self.waiting or self.running or self.work is not None)

    def wants_step_boundary(self) -> bool:
        """A waiting sequence could join the batch (it is under its cap)."""
        joining = len(self.work.joining) if self.work is not None else 0
        return bool(self.waiting) and len(self.running) + joining < self.max_running

    def blocks(self, tokens: int) -> int:
        """Blocks of the paged allocator ``tokens`` tokens take."""
        return -(-tokens // self.block_tokens)

    def held_blocks(self) -> int:
        """Blocks the running sequences hold between steps."""
        return sum(self.blocks(s.context) for s in self.running)

    def next_work(self, now: float, budget_blocks: int) -> EngineWork[T] | None:
        """Plan what runs from ``now`` with ``budget_blocks`` blocks of KV cache for this
        engine: a prefill of the sequences that may join, else a window of decode steps, else
        nothing (idle)."""
        assert self.work is None, "the engine is already running"
        held = self.held_blocks()
        joining: list[DecodeSequence[T]] = []
        while self.waiting and len(self.running) + len(joining) < self.max_running:
            need = self.blocks(self.waiting[0].context)
            if held + need > budget_blocks and (self.running or joining):
                break  # first come, first served: nothing overtakes the head of the queue
            sequence = self.waiting.popleft()
            if sequence.admitted_at is None:
                sequence.admitted_at = now
            held += need
            joining.append(sequence)
        self.generation += 1
        if joining:
            seconds = self._prefill_s([s.context for s in joining])
            self.work = EngineWork("prefill", now, np.array([now + seconds]), list(joining))
            return self.work
        while self.running:
            steps = self._window(budget_blocks)
            if steps > 0:
                contexts = [s.context for s in self.running]
                times = self._steps_s(contexts, [steps] * len(contexts))
                self.work = EngineWork("decode", now, now + np.cumsum(times), [])
                return self.work
            victim = self.running.pop()  # no block for the next step: preempt the youngest
            victim.preemptions += 1
            self.preemptions += 1
            self.waiting.appendleft(victim)
        return None

    def _window(self, budget_blocks: int) -> int:
        """Decode steps the running batch takes before its first member finishes, cut where
        the KV cache would run out (0: the next step already has no block)."""
        longest = min(s.remaining for s in self.running)
        if len(self.running) == 1:
            return longest
        contexts = np.array([s.context for s in self.running])[:, None]
        after = contexts + np.arange(1, longest + 1)[None, :]  # tokens held after each step
        needed = (-(-after // self.block_tokens)).sum(axis=0)
        return int(np.searchsorted(needed, budget_blocks, side="right"))

    def truncate(self, now: float) -> float | None:
        """Cut a decode window at the end of the step in progress at ``now`` (something else
        wants the device); the new end, or None when the work's end does not move."""
        work = self.work
        if work is None or work.kind != "decode":
            return None
        keep = work.steps_done(now) + 1
        if keep >= len(work.ends):
            return None
        work.ends = work.ends[:keep]
        self.generation += 1
        return work.end

    def finish(self) -> list[DecodeSequence[T]]:
        """The planned work is done: joining sequences join the batch, decode steps add their
        tokens; the sequences that generated their last token leave (returned)."""
        work = self.work
        assert work is not None, "nothing is running"
        self.work = None
        if work.kind == "prefill":
            self.running.extend(work.joining)
        else:
            steps = len(work.ends)
            size = len(self.running)
            for sequence in self.running:
                sequence.generated += steps
                sequence.batch_steps += steps * size
        done = [s for s in self.running if s.remaining <= 0]
        if done:
            self.running = [s for s in self.running if s.remaining > 0]
        return done

    def tokens(self, now: float) -> np.ndarray:
        """Tokens each sequence holds in the KV cache at ``now`` (for the memory figures):
        the running ones and those being prefilled."""
        work = self.work
        held = [s.context for s in self.running]
        if work is not None and work.kind == "prefill":
            held += [s.context for s in work.joining]
        tokens = np.asarray(held, dtype=float)
        if work is not None and work.kind == "decode" and self.running:
            tokens[: len(self.running)] += min(work.steps_done(now), len(work.ends))
        return tokens
