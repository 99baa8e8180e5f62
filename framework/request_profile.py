"""How heavy a request is, for admission: what a stage plugin's ``profile`` and the server's
limit checks measure cheaply, and what the complexity breaker weighs."""

from __future__ import annotations

from dataclasses import dataclass

from hetero.framework.policy.schema import ComplexityBreaker as ComplexityConfig

__all__ = ["RequestProfile"]


@dataclass(frozen=True, slots=True)
class RequestProfile:
    """How heavy a request is."""

    text_tokens: int = 0
    image_pixels: int = 0
    audio_seconds: float = 0.0

    @classmethod
    def of_image(cls, width: int, height: int) -> RequestProfile:
        """An image's profile from its header's size (plugins and routes alike)."""
        return cls(image_pixels=width * height)

    @classmethod
    def of_audio(cls, seconds: float) -> RequestProfile:
        """An audio input's profile from its header's length (plugins and routes alike)."""
        return cls(audio_seconds=seconds)

    def score(self, config: ComplexityConfig) -> float:
        """The weighted sum, in the policy's units."""
        weights = config.weights
        return (
            weights.text_tokens * self.text_tokens / 1000.0
            + weights.image_pixels * self.image_pixels / 1e6
            + weights.audio_seconds * self.audio_seconds / 30.0
        )
