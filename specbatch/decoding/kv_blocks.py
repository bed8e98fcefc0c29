"""KV memory in fixed-size blocks, shared out to rows as their tokens need them.

Why blocks: a continuous engine admits and retires rows at every step. With one
rectangular cache per batch a leaving row either keeps its memory until the batch ends
or forces a copy of everyone else's cache; with blocks it hands its blocks back and
the next admission takes them, nobody moves. One block id indexes the same slots in
the target's and the draft's store, so a row holds one block table for both models
and the pool is sized on their summed bytes per token.

Each model's store is, per layer, a flat tensor of slots ``[num_slots, kv_heads,
head_dim]``; slot ``block * block_size + offset`` holds one token. One extra block past
the budget is scratch: padding tokens write there and positions a row does not own
read from there, always masked out by position, so they never reach a result.

Blocks are reference-counted so that rows whose prompts start alike can hold the same
block (the prefix cache, :mod:`specbatch.decoding.prefix_cache`, names them). A block
whose contents are named keeps them after its last holder leaves: it waits in an
evictable set, least recently released first, until a hit revives it or the pool needs
room. Evictable blocks count as free, because taking one costs nothing but the hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


class OutOfBlocksError(RuntimeError):
    """The pool cannot supply the blocks asked for (the caller preempts or waits)."""


class BlockPool:
    """Allocation of block ids; one instance per engine, sized from the memory budget.

    Every block is free, held (by one row or more: its reference count), or evictable
    (held by nobody, contents kept because :meth:`keep` named them). ``on_evict`` hears
    of each evictable block taken for new contents, so whoever named it forgets it."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks  # one past the budget: never handed out
        self._free = list(range(num_blocks - 1, -1, -1))
        self._holders = [0] * num_blocks
        self._kept: set[int] = set()
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently released first
        self.evictions = 0
        self.on_evict: Callable[[int], None] = lambda block: None

    @property
    def num_slots(self) -> int:
        """Slots a model's store needs: every block plus the scratch block."""
        return (self.num_blocks + 1) * self.block_size

    @property
    def num_free(self) -> int:
        """Blocks a row can be given: the free ones and the evictable ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    @property
    def num_held(self) -> int:
        """Blocks some row holds (a block shared by several rows counts once)."""
        return self.num_blocks - self.num_free

    def holders(self, block: int) -> int:
        """How many rows hold ``block`` now."""
        return self._holders[block]

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def grow(self, table: list[int], tokens: int) -> None:
        """Extend ``table`` in place until it holds ``tokens`` tokens, or raise without
        taking anything. Free blocks go first; then the least recently released
        evictable ones, whose contents are lost."""
        missing = self.blocks_for(tokens) - len(table)
        if missing <= 0:
            return
        if missing > self.num_free:
            raise OutOfBlocksError(f"need {missing} more KV blocks, {self.num_free} free")
        for _ in range(missing):
            table.append(self._take())

    def _take(self) -> int:
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._evictable.popitem(last=False)
            self._kept.discard(block)
            self.evictions += 1
            self.on_evict(block)
        self._holders[block] = 1
        return block

    def share(self, table: list[int], blocks: Sequence[int]) -> None:
        """Append ``blocks`` (held or evictable, contents kept) to ``table`` as one more holder."""
        for block in blocks:
            if self._holders[block] == 0:
                del self._evictable[block]
            self._holders[block] += 1
            table.append(block)

    def keep(self, block: int) -> None:
        """``block``'s contents are named: when its last holder leaves it becomes evictable
        instead of free."""
        self._kept.add(block)

    def release(self, table: list[int]) -> None:
        """Drop this table's hold on each of its blocks and empty it. Blocks nobody holds
        any more are freed, or made evictable if kept; the table's last blocks go in
        first, so they are evicted before the blocks a prefix hit starts with."""
        for block in reversed(table):
            self._holders[block] -= 1
            if self._holders[block] == 0:
                if block in self._kept:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        table.clear()


def blocks_in_budget(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """KV blocks of ``block_size`` tokens that ``budget_bytes`` holds at ``bytes_per_token``
    (target + draft): the one sizing rule, used by the engine for its pool and by the
    benchmarks for what a budget would give on hardware not at hand."""
    return budget_bytes // (block_size * bytes_per_token)


@dataclass
class KVStore:
    """One model's keys and values for every slot of the pool (plus the scratch block)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVStore:
        shape = (num_slots, num_kv_heads, head_dim)
        return cls(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
        )


@dataclass(frozen=True)
class KVLayout:
    """Where one forward pass writes and reads, per row.

    ``write_slots`` [B, T]: the slot each fed token's key/value goes to (scratch for
    padding). ``read_slots`` [B, S]: the slot of logical position 0..S-1 of each row;
    attention masks every position beyond the query's own."""

    write_slots: torch.Tensor
    read_slots: torch.Tensor


def slot_table(
    tables: Sequence[Sequence[int]], span: int, pool: BlockPool, device: torch.device
) -> torch.Tensor:
    """[B, span] slot index of each row's logical positions 0..span-1 (scratch where the
    row holds no block)."""
    size = pool.block_size
    width = pool.blocks_for(max(span, 1))
    padded = [list(t[:width]) + [pool.scratch_block] * (width - min(len(t), width)) for t in tables]
    blocks = torch.tensor(padded, dtype=torch.long, device=device)
    offsets = torch.arange(size, device=device)
    slots = (blocks.unsqueeze(-1) * size + offsets).reshape(len(tables), width * size)
    return slots[:, :span]


def write_slots(
    read_slots: torch.Tensor, positions: torch.Tensor, real: torch.Tensor, pool: BlockPool
) -> torch.Tensor:
    """Slots for tokens fed at ``positions`` [B, T]; padding (``real`` False) goes to scratch."""
    scratch = pool.scratch_block * pool.block_size
    clamped = positions.clamp(0, read_slots.shape[1] - 1)
    return torch.where(real, read_slots.gather(1, clamped), torch.full_like(clamped, scratch))


def layout_for(
    tables: Sequence[Sequence[int]],
    positions: torch.Tensor,
    real: torch.Tensor,
    pool: BlockPool,
    span: int | None = None,
) -> KVLayout:
    """The layout of a pass feeding ``positions`` [B, T] (``real`` marks non-padding)
    for rows holding ``tables``; reads span the furthest position unless ``span`` says."""
    span = int(positions.max()) + 1 if span is None else span
    read = slot_table(tables, span, pool, positions.device)
    return KVLayout(write_slots=write_slots(read, positions, real, pool), read_slots=read)


def dense_pool(rows: int, width: int, block_size: int = 64) -> tuple[BlockPool, list[list[int]]]:
    """A fresh pool with ``rows`` block tables of ``width`` tokens each: for one-off
    passes (choice scoring, tests, cost measurements) outside the engine's pool."""
    pool = BlockPool(max(1, rows * -(-width // block_size)), block_size)
    tables: list[list[int]] = [[] for _ in range(rows)]
    for table in tables:
        pool.grow(table, width)
    return pool, tables
