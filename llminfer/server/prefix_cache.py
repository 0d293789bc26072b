"""Automatic prefix caching: full KV blocks kept after their request ends,
found again by the tokens they hold.

Block i of a text holds its tokens [i * bs, (i + 1) * bs), whose keys and
values depend on every token before them too, so a block is named by a hash
chain: key_i = H(key_{i-1} || tokens of block i). Two texts that share their
first k full blocks share the first k keys, and a new request adopts the
blocks of the longest prefix found (llminfer.runtime.kv_cache.KVCache.adopt).

The cache holds one reference on each block it names (BlockPool refcounts),
so a block outlives the request that wrote it. A block whose only reference
is the cache's is evictable: when the scheduler needs blocks, evict() gives
back the least recently used evictable blocks, leaves of the chain first (a
block whose child is still cached would leave that child unreachable).

Only for models without sliding-window layers: those give blocks back as a
text moves on, so a prefix's blocks are not all kept.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from llminfer.runtime.kv_cache import FULL, KVCache, Sequence

ROOT = b""  # the key before the first block


def root_key(lora) -> bytes:
    """The key before the first block of a text run with LoRA scales `lora`
    (None: none): keys and values differ with the adapters, so each set of
    scales has its own chains."""
    if lora is None:
        return ROOT
    return hashlib.blake2b(b"lora" + np.asarray(lora, dtype=np.float32).tobytes(), digest_size=16).digest()


def block_key(parent: bytes, tokens) -> bytes:
    """The chain hash of a block holding `tokens` after the block keyed `parent`."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int32).tobytes())
    return h.digest()


@dataclass
class _Entry:
    block: int
    parent: bytes
    children: int = 0


class PrefixCache:
    """Full blocks of finished and running texts, by chain hash, for one KVCache."""

    def __init__(self, kv: KVCache, max_states: int = 16):
        self.kv = kv
        self.bs = kv.block_size
        self.pool = kv.pools[FULL]
        self.entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        # a hybrid model (kv.states): a cached prefix is its blocks and the
        # recurrent state after its last block; states are kept for the
        # blocks where a text's pass ended (the scheduler ends a prompt's
        # pass at its last full block), at most max_states, least recently
        # used first out
        self.hybrid = kv.states is not None
        self.max_states = max_states
        self.states: OrderedDict[bytes, bytes] = OrderedDict()
        # running totals, for the metrics: prompt tokens looked up, and found
        self.queries = 0
        self.hits = 0

    def __len__(self):
        return len(self.entries)

    def keys(self, tokens, start_key: bytes = ROOT, start_block: int = 0) -> list:
        """Chain keys of the full blocks of `tokens` from block start_block on,
        start_key being the key of the block before it."""
        out, key = [], start_key
        for i in range(start_block, len(tokens) // self.bs):
            key = block_key(key, tokens[i * self.bs:(i + 1) * self.bs])
            out.append(key)
        return out

    def match(self, tokens, root: bytes = ROOT) -> tuple[list, list]:
        """(keys, blocks) of the longest cached prefix of `tokens` in full
        blocks, leaving at least one token after it (its logits are needed);
        for a hybrid model, the longest whose state is kept (state_for).
        The blocks found become the most recently used. root: root_key of
        the text's LoRA scales."""
        limit = (len(tokens) - 1) // self.bs
        keys, blocks, key = [], [], root
        for i in range(limit):
            key = block_key(key, tokens[i * self.bs:(i + 1) * self.bs])
            e = self.entries.get(key)
            if e is None:
                break
            keys.append(key)
            blocks.append(e.block)
        if self.hybrid:  # back to the last block whose state is kept
            while keys and keys[-1] not in self.states:
                keys.pop()
                blocks.pop()
            if keys:
                self.states.move_to_end(keys[-1])
        for k in keys:
            self.entries.move_to_end(k)
        return keys, blocks

    def state_for(self, key: bytes) -> bytes:
        """The recurrent state after the block of `key` (a hybrid model's match)."""
        return self.states[key]

    def _keep_state(self, seq: Sequence, key: bytes):
        """Keep seq's state, which is after the block of `key`."""
        if key in self.states:
            self.states.move_to_end(key)
            return
        self.states[key] = self.kv._state_ops.read_state(seq.slot)
        while len(self.states) > self.max_states:
            self.states.popitem(last=False)

    def count(self, queried: int, found: int):
        """Record a lookup that was used: tokens looked up, tokens found."""
        self.queries += queried
        self.hits += found

    def insert(self, seq: Sequence, keys: list) -> list:
        """Name the full blocks of seq that `keys` (its chain so far) does not
        cover yet; returns the keys extended. seq's tokens must sit at
        positions 0.. (no context shift)."""
        start = len(keys)
        parent = keys[-1] if keys else root_key(seq.lora)
        table = seq.tables[FULL]
        for i, key in enumerate(self.keys(seq.tokens, parent, start), start):
            keys.append(key)
            if key in self.entries:  # the same text computed twice: keep the older block
                self.entries.move_to_end(key)
            else:
                b = table[i]
                self.pool.share(b)
                self.entries[key] = _Entry(b, parent)
                if parent in self.entries:
                    self.entries[parent].children += 1
            parent = key
        n = len(seq.tokens)
        if self.hybrid and keys and n == len(keys) * self.bs and seq.state_len == n:
            self._keep_state(seq, keys[-1])  # the pass ended on a block: its state is the prefix's
        return keys

    def evictable(self) -> int:
        """Blocks that only the cache holds."""
        if not self.entries:
            return 0
        blocks = np.fromiter((e.block for e in self.entries.values()), dtype=np.int64, count=len(self.entries))
        return int(np.count_nonzero(self.pool.refs[blocks] == 1))

    def evict(self, n: int) -> int:
        """Give back up to n blocks that only the cache holds, least recently
        used leaves first; returns how many went."""
        freed = 0
        while freed < n:
            # one pass in LRU order; a parent becomes a leaf once its children
            # go, and is taken on the next pass
            victims = []
            for key, e in self.entries.items():
                if e.children == 0 and self.pool.refs[e.block] == 1:
                    victims.append(key)
                    if freed + len(victims) == n:
                        break
            if not victims:
                break  # what is left is held by requests, or parents of held blocks
            for key in victims:
                self._drop(key)
            freed += len(victims)
        return freed

    def clear(self):
        """Give back every block the cache holds a reference on."""
        for key in list(self.entries):
            self._drop(key)

    def _drop(self, key):
        self.states.pop(key, None)
        e = self.entries.pop(key)
        parent = self.entries.get(e.parent)
        if parent is not None:
            parent.children -= 1
        self.pool.release(e.block)
