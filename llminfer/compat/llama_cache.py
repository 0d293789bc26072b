"""llama-cpp-python's prompt caches (`llama_cpp.llama_cache`), for Llama.set_cache.

    from llminfer.compat.llama_cache import LlamaRAMCache   # or LlamaDiskCache
    llm.set_cache(LlamaRAMCache(capacity_bytes=2 << 30))

A cache maps token sequences to LlamaStates (Llama.save_state()): the tokens,
their KV cache and the last logits. Before a completion, Llama looks up the
state whose tokens share the longest prefix with the prompt and, when that is
longer than what its context already shares, loads it, so only the rest of
the prompt is evaluated; after a completion it stores its state under the
tokens it holds. Lookups compare the prompt with every key (as
llama-cpp-python does): a cache is meant for tens of entries, not thousands.

LlamaDiskCache keeps each state in its own .npz file in cache_dir (no pickle,
so a cache folder never runs code when read), the least recently used ones
removed past capacity_bytes.
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Optional, Sequence, Tuple

import numpy as np

from llminfer.errors import InvalidArgumentError

__all__ = ["BaseLlamaCache", "LlamaRAMCache", "LlamaCache", "LlamaDiskCache", "LlamaState"]


class LlamaState:
    """A saved context, as llama-cpp-python's save_state() returns it:
    input_ids (np.intc [n_ctx], the first n_tokens meaningful), scores
    (float32 [rows, n_vocab]: a row per token with logits_all, else the last
    token's only), n_tokens, llama_state (llminfer's state bytes,
    llminfer.runtime.state), llama_state_size (their length) and seed."""

    def __init__(self, input_ids, scores, n_tokens: int, llama_state: bytes, llama_state_size: int, seed):
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed

    def __repr__(self):
        return f"LlamaState(n_tokens={self.n_tokens}, llama_state_size={self.llama_state_size})"


def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _check_capacity(capacity_bytes):
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
        raise InvalidArgumentError(f"capacity_bytes must be a non-negative integer, got {capacity_bytes!r}")
    return capacity_bytes


class BaseLlamaCache(ABC):
    """A map from token sequences to LlamaStates, looked up by longest prefix."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        self.capacity_bytes = _check_capacity(capacity_bytes)

    @property
    @abstractmethod
    def cache_size(self) -> int:
        """Bytes held."""

    @abstractmethod
    def _keys(self):
        """Every key, a tuple of token ids."""

    def _find_longest_prefix_key(self, key: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
        best, best_len = None, 0
        for k in self._keys():
            n = longest_token_prefix(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    @abstractmethod
    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        """The state whose key shares the longest prefix with key (KeyError: none shares any)."""

    @abstractmethod
    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None: ...


class LlamaRAMCache(BaseLlamaCache):
    """States kept in memory, the least recently used dropped past capacity_bytes."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_state: "OrderedDict[Tuple[int, ...], LlamaState]" = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(s.llama_state_size for s in self.cache_state.values())

    def _keys(self):
        return list(self.cache_state)

    def __len__(self):
        return len(self.cache_state)

    def __getitem__(self, key):
        k = self._find_longest_prefix_key(tuple(int(t) for t in key))
        if k is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        self.cache_state.move_to_end(k)
        return self.cache_state[k]

    def __setitem__(self, key, value):
        key = tuple(int(t) for t in key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_size > self.capacity_bytes and self.cache_state:
            self.cache_state.popitem(last=False)


LlamaCache = LlamaRAMCache  # llama-cpp-python's old name


class LlamaDiskCache(BaseLlamaCache):
    """States kept as files in cache_dir, the least recently used removed
    past capacity_bytes."""

    def __init__(self, cache_dir: str = ".cache/llama_cache", capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_dir = os.fspath(cache_dir)
        os.makedirs(self.cache_dir, exist_ok=True)
        self._key_of: dict = {}  # file name -> key, read once per file

    def _files(self):
        return [f for f in os.listdir(self.cache_dir) if f.endswith(".npz")]

    def _path(self, key) -> str:
        h = hashlib.sha256(np.asarray(key, dtype=np.int64).tobytes()).hexdigest()[:32]
        return os.path.join(self.cache_dir, h + ".npz")

    def _keys(self):
        keys = []
        for name in self._files():
            if name not in self._key_of:
                try:
                    with np.load(os.path.join(self.cache_dir, name), allow_pickle=False) as z:
                        self._key_of[name] = tuple(int(t) for t in z["key"])
                except (OSError, ValueError, KeyError):
                    continue  # not one of ours, or half written by another process
            keys.append(self._key_of[name])
        return keys

    @property
    def cache_size(self) -> int:
        return sum(os.path.getsize(os.path.join(self.cache_dir, f)) for f in self._files())

    def __len__(self):
        return len(self._files())

    def __getitem__(self, key):
        k = self._find_longest_prefix_key(tuple(int(t) for t in key))
        if k is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        path = self._path(k)
        with np.load(path, allow_pickle=False) as z:
            seed = int(z["seed"][0])
            state = LlamaState(input_ids=z["input_ids"].astype(np.intc), scores=z["scores"],
                               n_tokens=int(z["n_tokens"][0]), llama_state=z["llama_state"].tobytes(),
                               llama_state_size=int(z["llama_state"].size), seed=None if seed < 0 else seed)
        os.utime(path)  # recently used
        return state

    def __setitem__(self, key, value):
        key = tuple(int(t) for t in key)
        path = self._path(key)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            np.savez(f, key=np.asarray(key, dtype=np.int64), input_ids=np.asarray(value.input_ids),
                     scores=np.asarray(value.scores, dtype=np.float32),
                     n_tokens=np.array([value.n_tokens], dtype=np.int64),
                     seed=np.array([-1 if value.seed is None else value.seed], dtype=np.int64),
                     llama_state=np.frombuffer(value.llama_state, dtype=np.uint8))
        os.replace(tmp, path)
        self._key_of[os.path.basename(path)] = key
        files = sorted(self._files(), key=lambda f: os.path.getmtime(os.path.join(self.cache_dir, f)))
        while files and self.cache_size > self.capacity_bytes:
            victim = files.pop(0)
            os.remove(os.path.join(self.cache_dir, victim))
            self._key_of.pop(victim, None)
