"""The arguments of `llminfer serve` (no dependency beyond the core, so the
CLI can check them before the server's packages are imported)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llminfer import hub
from llminfer.errors import InvalidArgumentError


@dataclass
class ServeArgs:
    """What `llminfer serve` takes: the engine's arguments and the server's limits.

    kv_pool_tokens: positions the KV pool holds for all requests (default
    4 * n_ctx). max_batch_tokens: most tokens per engine step (prompt chunks
    and generated tokens together). max_running: most requests generating at
    once; max_waiting: most queued before 429. api_key: when set, every
    endpoint but /health and /metrics wants `Authorization: Bearer KEY`.

    Many models in one server (llminfer.server.router): models_dir (each GGUF
    under it served under its file stem) and/or models_config (a JSON or
    TOML file: name -> path and per-model options); each loads on the first
    request naming it, unloads after models_idle_timeout idle seconds, and
    least recently used first to keep at most models_max_loaded loaded and
    their estimated memory (file + KV pool) within models_memory_gib."""

    model: str = hub.DEFAULT_MODEL
    n_ctx: int = 4096
    n_threads: int | None = None
    kv_pool_tokens: int | None = None
    kv_type: str = "f16"
    n_gpu_layers: int = 0  # layers on the GPU (a GPU build; docs/gpu.md)
    max_batch_tokens: int = 512
    max_running: int = 64
    max_waiting: int = 256
    prefix_caching: bool = True
    api_key: str | None = None
    chat_template: str | None = None
    chat_format: str | None = None
    served_model_name: str | None = None
    max_body_bytes: int = 4 << 20
    max_tokens_limit: int | None = None  # default: n_ctx
    # a thinking model's reasoning: "deepseek" apart in reasoning_content,
    # "none" left in content; the budget in tokens (-1 unlimited, 0 no thinking)
    reasoning_format: str = "deepseek"
    reasoning_budget: int = -1
    models_dir: str | None = None
    models_config: str | None = None
    models_idle_timeout: float | None = None  # seconds; None: never
    models_max_loaded: int | None = 4
    models_memory_gib: float | None = None
    mmproj: str | None = None  # the model's vision tower (llminfer.vision): chat takes image_url data: URLs
    # LoRA adapters (llminfer.runtime.lora): (path, scale) each, ids in this order; the scales are the
    # global ones (GET/POST /lora-adapters), which a request's "lora" list replaces for it
    lora: list = field(default_factory=list)

    @staticmethod
    def parse_lora(text: str) -> tuple:
        """--lora's FILE[:SCALE] as (path, scale); a path with a colon
        whose tail is no number is the path alone (scale 1.0)."""
        import math

        path, sep, tail = text.rpartition(":")
        if sep and path:
            try:
                scale = float(tail)
            except ValueError:
                return text, 1.0
            if not math.isfinite(scale):
                raise InvalidArgumentError(f"--lora {text}: the scale must be finite")
            return path, scale
        return text, 1.0

    @property
    def multi_model(self) -> bool:
        return bool(self.models_dir or self.models_config)
