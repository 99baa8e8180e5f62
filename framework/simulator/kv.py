"""KV-cache memory of the LLM batches running on each simulated device, as a paged allocator
(vLLM's PagedAttention) holds it: each sequence holds whole blocks of ``block_tokens`` tokens,
its prompt's blocks from the start of prefill and one more block each time generation fills
the last one, all given back when the batch ends. The scheduler reserves each request's longest
context at placement (admission); this module says what is actually allocated at an instant,
for the memory figures, and how much of it is the empty tail of last blocks (internal
fragmentation).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["KvBatch", "KvHolder", "PagedKv"]


class KvHolder(Protocol):
    """Sequences that hold KV cache on a device: a static batch (:class:`KvBatch`) or a
    continuous batch's engine (:class:`hetero.framework.simulator.decode.DecodeEngine`)."""

    @property
    def bytes_per_token(self) -> float:
        """KV bytes one token takes."""
        ...

    def tokens(self, now: float) -> np.ndarray:
        """Tokens each sequence holds at ``now``."""
        ...


@dataclass(frozen=True, slots=True)
class KvBatch:
    """One running LLM batch: when its prefill starts, how long each phase lasts, and its
    sequences' prompt and output lengths."""

    start: float
    prefill_s: float
    decode_s: float
    prompts: np.ndarray
    outputs: np.ndarray
    bytes_per_token: float

    def tokens(self, now: float) -> np.ndarray:
        """Tokens each sequence holds at ``now`` (zero before prefill starts)."""
        if now < self.start:
            return np.zeros_like(self.prompts)
        decoding = now - self.start - self.prefill_s
        if decoding <= 0 or self.decode_s <= 0:
            return self.prompts.copy()
        longest = max(int(self.outputs.max()), 1)
        steps = min(decoding / self.decode_s, 1.0) * longest
        held: np.ndarray = self.prompts + np.minimum(self.outputs, np.floor(steps))
        return held


class PagedKv:
    """Running LLM batches (or continuous batches' engines) per device and the blocks they
    hold."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.running: dict[str, list[KvHolder]] = defaultdict(list)

    def add(self, device_id: str, batch: KvHolder) -> None:
        """A batch starts on ``device_id`` (an engine: it has sequences again)."""
        self.running[device_id].append(batch)

    def remove(self, device_id: str, batch: KvHolder) -> None:
        """It finished (an engine: its last sequence left): its blocks go back."""
        self.running[device_id].remove(batch)

    def usage(self, device_id: str, now: float) -> tuple[float, float]:
        """``(allocated bytes, bytes of tokens)`` on the device at ``now``: the difference is
        the empty tail of each sequence's last block."""
        allocated = held = 0.0
        block = self.block_tokens
        for batch in self.running.get(device_id, ()):
            tokens = batch.tokens(now)
            blocks = np.ceil(tokens / block)
            allocated += float(blocks.sum()) * block * batch.bytes_per_token
            held += float(tokens.sum()) * batch.bytes_per_token
        return allocated, held
