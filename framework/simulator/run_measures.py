"""What a simulated request weighs in each stage: the measures its stage's plugin would take
of it (its items, the tokens its KV cache holds, its input's profile), as the engine's request
walk and admission read them, and its work relative to the hint's nominal item."""

from __future__ import annotations

from hetero.framework.engine.requests import RequestState
from hetero.framework.request_profile import RequestProfile
from hetero.framework.scheduler import Dispatch
from hetero.framework.simulator.run_state import SimulationState
from hetero.framework.simulator.workload import SimRequest

__all__ = ["MeasuresMixin"]


class _SimMeasures:
    """A stage's measures of a simulated request, as its plugin measures a real input: the
    images it holds (one input each: a task of an image stage carries that many items, as
    the engine's does), and for a stage with a KV cache the tokens a generation holds (its
    prompt plus those it generates; 0 elsewhere)."""

    __slots__ = ("image", "kv")

    def __init__(self, modality: str, kv: bool) -> None:
        self.image = modality == "image"
        self.kv = kv

    def items(self, payload: SimRequest) -> int:
        return max(1, payload.images) if self.image else 1

    def kv_tokens(self, payload: SimRequest, output_tokens: int) -> int:
        return payload.text_tokens + output_tokens if self.kv else 0


def _request_of(state: RequestState, step: str) -> SimRequest:
    """Every step of a simulated request measures the request itself."""
    request: SimRequest = state.payload
    return request


class MeasuresMixin(SimulationState):
    """A simulated request's profile and work per stage."""

    def _scale(self, dispatch: Dispatch) -> float:
        """Work of this request's stage relative to the hint's nominal item."""
        run = self.runs.get(int(dispatch.task.request_id))
        return 1.0 if run is None else self._request_scale(dispatch.task.stage, run.request)

    def _profile(self, stage: str, request: SimRequest) -> RequestProfile:
        """What the stage's plugin would measure of ``request``'s input (its profile): the
        pixels of its images, its audio's seconds, or its prompt's tokens plus those it
        generates (as the LLM plugin counts)."""
        modality = self.modality[stage]
        if modality == "image":
            spec = self.workload.spec
            pixels = (
                request.image_pixels or spec.stage_nominal.get(stage, spec.nominal).image_pixels
            )
            return RequestProfile(image_pixels=int(max(1, request.images) * pixels))
        if modality == "audio":
            return RequestProfile(audio_seconds=request.audio_seconds)
        return RequestProfile(text_tokens=request.text_tokens + request.output_tokens)

    def _request_scale(self, stage: str, request: SimRequest) -> float:
        """Work of ``request`` in ``stage`` relative to the hint's nominal item."""
        spec = self.workload.spec
        nominal = spec.stage_nominal.get(stage, spec.nominal)
        modality = self.modality[stage]
        if modality == "image" and request.images:
            pixels = request.image_pixels or nominal.image_pixels
            return request.images * pixels / nominal.image_pixels
        if modality == "audio" and request.audio_seconds:
            return request.audio_seconds / nominal.audio_seconds
        tokens = request.text_tokens + request.output_tokens
        if modality in {"text", "embedding"} and tokens:
            return tokens / nominal.text_tokens
        return 1.0
