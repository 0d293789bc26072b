"""The paged KV cache's bookkeeping: pools of blocks, and each sequence's
block tables.

The C core holds the keys and values (csrc/model.c: one pool per group of
layers, blocks of `block_size` positions); this module decides which block
holds what. A sequence's table maps its logical block i (positions
[i * block_size, (i + 1) * block_size)) to a block of the pool, or to -1 when
those positions are not there (out of a sliding window, or dropped by a
context shift: the C core masks them out of attention).

Blocks are reference-counted: a fork shares its parent's blocks, and a
sequence about to write into a block it shares first copies it
(copy-on-write), so the other sequence never sees the write.

Two groups: layers that attend to the whole context (FULL) and
sliding-window layers (SWA). A sliding-window group gives back the blocks
that fall out of the window as the sequence grows, so its memory stays
bounded by the window whatever the length of the text.

Hybrid models' recurrent layers keep no keys and values: each sequence
holds one slot of the state pool (StatePool) instead, a fixed-size state
updated in place by every token. A state cannot be cut back, so a sequence
also keeps a few checkpoints (copies of its state after its first n tokens,
in slots of the same pool); going back to n tokens restores the latest
checkpoint at or before n and runs the tokens from there to n again
(llminfer.runtime.engine), which gives the same bits as the first time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from llminfer.errors import InvalidArgumentError, KVCacheFullError

FULL, SWA = 0, 1
GROUP_NAMES = ("full-attention", "sliding-window")


class StatePool:
    """The slots of the C core's state pool (a hybrid model's recurrent
    layers): which are free. A slot belongs to one sequence, as its live
    state or one of its checkpoints; slots are never shared."""

    name = "recurrent-state"

    def __init__(self, n_slots: int, slot_bytes: int):
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        self._free = list(range(n_slots))
        heapq.heapify(self._free)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return self.n_slots - len(self._free)

    def alloc(self) -> int | None:
        return heapq.heappop(self._free) if self._free else None

    def release(self, slot: int):
        heapq.heappush(self._free, slot)


class BlockPool:
    """The blocks of one group: reference counts and a free list that hands
    out the lowest free block first (so the pages touched stay compact)."""

    def __init__(self, n_blocks: int, block_size: int, name: str):
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.name = name
        self.refs = np.zeros(n_blocks, dtype=np.int32)
        self._free = list(range(n_blocks))  # a heap

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.n_blocks - len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise KVCacheFullError(
                f"the {self.name} KV pool is out of blocks: all {self.n_blocks} blocks of {self.block_size} "
                f"positions are in use; free sequences, or create the engine with a larger kv_pool_tokens")
        b = heapq.heappop(self._free)
        self.refs[b] = 1
        return b

    def share(self, b: int):
        self.refs[b] += 1

    def release(self, b: int):
        self.refs[b] -= 1
        if self.refs[b] == 0:
            heapq.heappush(self._free, b)


@dataclass(eq=False)
class Sequence:
    """One sequence in the cache: its tokens, the position each sits at, and
    its block table per group. `next_pos` is where the next token goes."""

    seq_id: int
    tokens: list = field(default_factory=list)
    positions: list = field(default_factory=list)
    tables: list = field(default_factory=lambda: [[], []])
    next_pos: int = 0
    # the earliest position still held by the sliding-window group: positions
    # before it were given back, so the sequence cannot go back before it
    swa_floor: int = 0
    # hybrid models: the state slot, how many of the tokens the state has
    # taken in (len(tokens) when it is current; less after a truncate or a
    # failed pass, until the engine brings it back), and checkpoints
    # [(tokens taken in, slot)], oldest first
    slot: int = -1
    state_len: int = 0
    checkpoints: list = field(default_factory=list)
    # [(start, end)]: tokens whose positions were decoded from embedding
    # rows (an image's), not from their ids: a hybrid model's state cannot
    # be brought back by running them again
    rows: list = field(default_factory=list)
    # LoRA: the scale of each of the engine's adapters for this sequence's
    # next tokens (float32 [n_lora]), or None: none on (Engine.set_lora)
    lora: object = None
    # M-RoPE models (qwen2vl): [(place, shift)] in place order: from cache
    # place `place` on, a text token's rope position is its place + shift (an
    # image takes more places than rope positions: mtmd's layout)
    rope_marks: list = field(default_factory=list)

    def rope_shift(self, place: int) -> int:
        """The rope position of a text token at `place`, less the place."""
        shift = 0
        for at, sh in self.rope_marks:
            if at > place:
                break
            shift = sh
        return shift

    def __len__(self):
        return len(self.tokens)


class KVCache:
    """Tables and pools of the paged cache. `copy_block(group, src, dst)` is
    the C core's block copy (llminfer._core.Context.copy_block)."""

    def __init__(self, n_blocks, block_size: int, groups_used, window: int, copy_block, states=None,
                 state_ops=None):
        """states: a StatePool for a hybrid model (None otherwise), whose
        slots the C core's state_ops (llminfer._core.Context) copy and clear."""
        self.states = states
        self._state_ops = state_ops
        self.block_size = block_size
        self.pools = [BlockPool(n, block_size, GROUP_NAMES[g]) for g, n in enumerate(n_blocks)]
        self.groups = [g for g in (FULL, SWA) if groups_used[g]]
        self.window = window  # the largest sliding window (SWA group)
        self._copy_block = copy_block
        self._next_id = 0
        self.sequences: dict[int, Sequence] = {}

    # ---- sequences ----

    def new_sequence(self) -> Sequence:
        s = Sequence(self._next_id)
        if self.states is not None:
            s.slot = self._take_slot(s)
            self._state_ops.clear_state(s.slot)
        self._next_id += 1
        self.sequences[s.seq_id] = s
        return s

    # ---- recurrent state (hybrid models) ----

    def _take_slot(self, s: Sequence) -> int:
        """A free slot, else one of the checkpoints of the sequences (the
        oldest of the one holding most); KVCacheFullError when none is left."""
        slot = self.states.alloc()
        if slot is None:
            holders = [q for q in self.sequences.values() if q.checkpoints]
            if not holders:
                pool = self.states
                raise KVCacheFullError(
                    f"the {pool.name} pool is out of slots: all {pool.n_slots} hold live sequences; free "
                    f"sequences, or create the engine with a larger n_seq_max")
            q = max(holders, key=lambda q: len(q.checkpoints))
            slot = q.checkpoints.pop(0)[1]
        return slot

    def checkpoint(self, s: Sequence):
        """Keep a copy of s's state as it is now (after s.state_len tokens),
        in a free slot or in place of s's oldest checkpoint; nothing when
        neither is there. At most `max_checkpoints` per sequence."""
        if self.states is None or s.state_len != len(s.tokens) or not s.tokens:
            return
        n = s.state_len
        if s.checkpoints and s.checkpoints[-1][0] == n:
            return
        if len(s.checkpoints) >= self.max_checkpoints:
            slot = s.checkpoints.pop(0)[1]
        else:
            slot = self.states.alloc()
            if slot is None:
                if not s.checkpoints:
                    return
                slot = s.checkpoints.pop(0)[1]
        self._state_ops.copy_state(s.slot, slot)
        s.checkpoints.append((n, slot))

    max_checkpoints = 3

    def restore_point(self, s: Sequence) -> int:
        """Bring s's live state back to its latest checkpoint at or before
        its length (or to the empty state), and return how many tokens that
        state has taken in: the engine runs the rest again."""
        n = len(s.tokens)
        best = None
        for k, slot in s.checkpoints:
            if k <= n and (best is None or k > best[0]):
                best = (k, slot)
        if best is None:
            self._state_ops.clear_state(s.slot)
            s.state_len = 0
        else:
            self._state_ops.copy_state(best[1], s.slot)
            s.state_len = best[0]
        return s.state_len

    def replay_start(self, s: Sequence, n: int) -> int:
        """The tokens taken in by the checkpoint restore_point would bring s
        back to after a truncate to n (0: the empty state)."""
        return max((k for k, _ in s.checkpoints if k <= n), default=0)

    def keepable(self, s: Sequence, n: int) -> int:
        """The most of s's first n tokens it can go back to without running
        embedding rows again: for a hybrid model, a truncate to n is followed
        by the tokens after its checkpoint, and none of those may have come
        from rows (an image's, whose ids are placeholders); n otherwise, and
        when n is all of s with its state after every token (nothing to run
        again: a state just loaded has no checkpoints)."""
        if self.states is None or n == len(s.tokens) == s.state_len:
            return n
        while True:
            k = self.replay_start(s, n)
            crossed = [a for a, b in s.rows if a < n and b > k]
            if not crossed:
                return n
            n = min(crossed)

    def _drop_checkpoints(self, s: Sequence, keep_upto: int | None = None):
        kept = []
        for k, slot in s.checkpoints:
            if keep_upto is not None and k <= keep_upto:
                kept.append((k, slot))
            else:
                self.states.release(slot)
        s.checkpoints = kept

    def free(self, s: Sequence):
        """Give back every block of s, committed or only reserved (a pass that
        failed after reserve() leaves blocks that hold no token); s is empty
        afterwards (and may be reused)."""
        for g in self.groups:
            for b in s.tables[g]:
                if b >= 0:
                    self.pools[g].release(b)
            s.tables[g] = []
        s.tokens, s.positions, s.rows, s.rope_marks = [], [], [], []
        s.next_pos = s.swa_floor = 0
        if self.states is not None and s.seq_id in self.sequences:
            self._drop_checkpoints(s)
            if s.slot >= 0:
                self.states.release(s.slot)
            s.slot, s.state_len = -1, 0
        self.sequences.pop(s.seq_id, None)

    def fork(self, s: Sequence) -> Sequence:
        """A new sequence holding what s holds, sharing its blocks; whichever
        of the two writes first into a shared block copies it first."""
        child = self.new_sequence()
        if self.states is not None:  # the state copied: it is the parent's after the same tokens
            self._state_ops.copy_state(s.slot, child.slot)
            child.state_len = s.state_len
        child.tokens = list(s.tokens)
        child.positions = list(s.positions)
        child.next_pos = s.next_pos
        child.swa_floor = s.swa_floor
        child.lora = s.lora
        child.rows = list(s.rows)
        child.rope_marks = list(s.rope_marks)
        for g in self.groups:
            child.tables[g] = list(s.tables[g])
            for b in child.tables[g]:
                if b >= 0:
                    self.pools[g].share(b)
        return child

    def can_truncate(self, s: Sequence, n: int) -> bool:
        """Whether s can go back to its first n tokens and go on from there
        (the sliding-window layers may have given back what it would see)."""
        if n <= 0 or SWA not in self.groups:
            return True
        # the next token, at positions[n - 1] + 1, sees back to the window's
        # start, which is never before position 0
        return max(0, s.positions[n - 1] + 1 - self.window + 1) >= s.swa_floor

    def truncate(self, s: Sequence, n: int):
        """Keep the first n tokens of s; blocks past them are given back, also
        those reserved for tokens that were never committed (a failed pass)."""
        if n < 0 or n > len(s.tokens):
            raise InvalidArgumentError(f"cannot truncate a sequence of {len(s.tokens)} tokens to {n}")
        next_pos = s.positions[n - 1] + 1 if n else 0
        if not self.can_truncate(s, n):
            raise InvalidArgumentError(
                f"cannot go back to {n} tokens: the sliding-window layers gave back the positions before "
                f"{s.swa_floor}, which the next token would see")
        if self.states is not None and n < len(s.tokens):
            # the state holds every token: it is brought back to n by the engine
            self._drop_checkpoints(s, keep_upto=n)
            s.state_len = min(s.state_len, -1)
        del s.tokens[n:]
        del s.positions[n:]
        s.rows = [(a, min(b, n)) for a, b in s.rows if a < n]
        s.next_pos = next_pos
        s.rope_marks = [m for m in s.rope_marks if m[0] <= next_pos]  # an image cut short leaves no mark
        keep = -(-next_pos // self.block_size)  # blocks holding positions < next_pos
        for g in self.groups:
            for b in s.tables[g][keep:]:
                if b >= 0:
                    self.pools[g].release(b)
            del s.tables[g][keep:]
        if n == 0:
            s.swa_floor = 0

    def drop(self, s: Sequence, first: int, last: int):
        """Drop tokens [first, last) of s (a context shift): the blocks that
        hold only those tokens are given back and masked; the tokens around
        them keep their positions, so their keys stay valid. Returns how many
        tokens were dropped (whole blocks only)."""
        if self.states is not None:
            return 0  # a recurrent state holds every token: the caller recomputes what it keeps
        bs = self.block_size
        p0, p1 = s.positions[first], s.positions[last - 1] + 1
        b0, b1 = -(-p0 // bs), p1 // bs  # blocks wholly inside [p0, p1)
        if b1 <= b0:
            return 0
        for g in self.groups:
            t = s.tables[g]
            for i in range(b0, min(b1, len(t))):
                if t[i] >= 0:
                    self.pools[g].release(t[i])
                    t[i] = -1
        lo, hi = b0 * bs, b1 * bs
        keep = [i for i, p in enumerate(s.positions) if not lo <= p < hi]
        dropped = len(s.positions) - len(keep)
        s.tokens = [s.tokens[i] for i in keep]
        s.positions = [s.positions[i] for i in keep]
        return dropped

    def adopt(self, s: Sequence, tokens, blocks):
        """Give an empty sequence the first len(blocks) full blocks of a text
        already in the pool (a prefix cache's hit): s shares them, holding
        `tokens` (len(blocks) * block_size of them) at positions 0.. . Only
        for caches without a sliding-window group, whose blocks a sequence
        gives back as it moves on."""
        if SWA in self.groups:
            raise InvalidArgumentError("cannot adopt shared blocks into a cache with sliding-window layers")
        if self.states is not None:
            raise InvalidArgumentError("a hybrid model's sequence adopts blocks with its state (adopt_with_state)")
        if s.tokens or any(s.tables[g] for g in self.groups):
            raise InvalidArgumentError(f"sequence {s.seq_id} is not empty: only an empty sequence adopts blocks")
        n = len(blocks) * self.block_size
        if len(tokens) != n:
            raise InvalidArgumentError(f"{len(blocks)} blocks hold {n} tokens, got {len(tokens)}")
        pool = self.pools[FULL]
        for b in blocks:
            if not 0 <= b < pool.n_blocks or pool.refs[b] <= 0:
                raise InvalidArgumentError(f"block {b} is not a live block of the {pool.name} pool")
        for b in blocks:
            pool.share(b)
        s.tables[FULL] = [int(b) for b in blocks]
        s.tokens = [int(t) for t in tokens]
        s.positions = list(range(n))
        s.next_pos = n

    def adopt_with_state(self, s: Sequence, tokens, blocks, state: bytes):
        """adopt() for a hybrid model: the blocks, and the recurrent state
        after their tokens (what the prefix cache kept), written into s's slot."""
        states, self.states = self.states, None
        try:
            self.adopt(s, tokens, blocks)
        finally:
            self.states = states
        self._state_ops.write_state(s.slot, np.frombuffer(state, dtype=np.uint8))
        s.state_len = len(s.tokens)

    def blocks_needed(self, s: Sequence, n: int) -> list:
        """Blocks that reserve(s, n) would take from each pool (a list indexed
        by group): new blocks, and copies of shared blocks it would write."""
        bs = self.block_size
        need = [0, 0]
        if n <= 0:
            return need
        first, last = s.next_pos, s.next_pos + n - 1
        for g in self.groups:
            t, refs = s.tables[g], self.pools[g].refs
            for i in range(first // bs, last // bs + 1):
                if i >= len(t) or t[i] < 0 or refs[t[i]] > 1:
                    need[g] += 1
        return need

    # ---- writing ----

    def reserve(self, s: Sequence, n: int):
        """Make blocks ready for the positions next_pos .. next_pos + n - 1:
        new blocks from the pools, shared blocks copied before they are written.
        All or nothing: a pool without room for all of them raises before any
        block is taken."""
        bs = self.block_size
        need = self.blocks_needed(s, n)
        for g in self.groups:
            if need[g] > self.pools[g].free_blocks:
                pool = self.pools[g]
                raise KVCacheFullError(
                    f"the {pool.name} KV pool is out of blocks: {n} more positions of sequence {s.seq_id} need "
                    f"{need[g]} blocks of {pool.block_size} positions and {pool.free_blocks} are free; free "
                    f"sequences, or create the engine with a larger kv_pool_tokens")
        first, last = s.next_pos, s.next_pos + n - 1
        for g in self.groups:
            t, pool = s.tables[g], self.pools[g]
            for i in range(first // bs, last // bs + 1):
                while len(t) <= i:
                    t.append(-1)
                b = t[i]
                if b < 0:
                    t[i] = pool.alloc()
                elif pool.refs[b] > 1:  # copy-on-write
                    nb = pool.alloc()
                    self._copy_block(g, b, nb)
                    pool.release(b)
                    t[i] = nb

    def commit(self, s: Sequence, tokens):
        """Record tokens written at next_pos onwards; the sliding-window group
        gives back the blocks its next token can no longer see."""
        n = len(tokens)
        # an array's tolist gives Python ints in one call (a generator of int()
        # per numpy scalar cost a decode step ~10 us on cold caches)
        s.tokens.extend(tokens.tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens])
        s.positions.extend(range(s.next_pos, s.next_pos + n))
        s.next_pos += n
        s.state_len = len(s.tokens)  # the pass that wrote them moved the state on too
        if self.states is not None and s.state_len % self.block_size == 0:
            self.checkpoint(s)  # at block boundaries: going back a few tokens runs at most a block again
        if SWA in self.groups:
            self._release_behind(s)

    def commit_one(self, s: Sequence, token: int):
        """commit(s, [token]) for a generation step, whose token is already
        an int: ~5 us less on caches a pass has left cold."""
        s.tokens.append(token)
        s.positions.append(s.next_pos)
        s.next_pos += 1
        s.state_len = len(s.tokens)
        if self.states is not None and s.state_len % self.block_size == 0:
            self.checkpoint(s)
        if SWA in self.groups:
            self._release_behind(s)

    def _release_behind(self, s: Sequence):
        """The sliding-window group's blocks that s's next token can no longer see, given back."""
        bs = self.block_size
        # the next token sees [next_pos - window + 1, next_pos]; a block of
        # slack is kept so that a short step back (a rejected draft) works
        floor = max(0, s.next_pos - self.window + 1 - bs)
        t = s.tables[SWA]
        for i in range(s.swa_floor // bs, min(floor // bs, len(t))):
            if t[i] >= 0:
                self.pools[SWA].release(t[i])
                t[i] = -1
        s.swa_floor = max(s.swa_floor, floor // bs * bs)

    def table_arrays(self, s: Sequence):
        """(full table, sliding-window table) as int32 arrays, for the C core,
        a hybrid model's state slot, and the sequence's LoRA scales when it has any."""
        tables = tuple(np.asarray(s.tables[g], dtype=np.int32) if g in self.groups else None for g in (FULL, SWA))
        if s.lora is not None:
            return tables + (s.slot if self.states is not None else None, s.lora)
        return tables if self.states is None else tables + (s.slot,)

    # ---- accounting ----

    def usage(self) -> dict:
        """Blocks used and free per group, and positions held."""
        out = {"block_size": self.block_size}
        for g in self.groups:
            p = self.pools[g]
            out[GROUP_NAMES[g]] = {"blocks": p.n_blocks, "used": p.used_blocks, "free": p.free_blocks}
        if self.states is not None:
            p = self.states
            out[p.name] = {"slots": p.n_slots, "used": p.used_slots, "free": p.free_slots,
                           "slot_bytes": p.slot_bytes}
        return out
