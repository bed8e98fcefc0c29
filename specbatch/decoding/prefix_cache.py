"""Prefix reuse: full KV blocks named by a hash chain over their tokens, shared read-only.

Why: a chat request with a system prompt, or the next turn of a conversation, starts
with tokens the instance computed a moment ago. A full block's keys and values depend
only on the tokens up to its end (the weights and dtype are the engine's, positions
follow from the chain), so the block is named by a digest of its own tokens and its
parent's name, and a row whose prompt starts with the same blocks holds them instead
of computing them again (vLLM's automatic prefix caching is the reference design).

Rules that keep a hit exact and the accounting right:

- A row shares only whole blocks that lie within its first ``seq_len - 1`` tokens:
  the pending last token is always fed by the row's own step (that is where its first
  logits come from), and a prompt ending mid-block owns its last, partial block.
- The target and the draft hold one block table, but each model's KV in a block is
  written separately (the draft is prefilled lazily and may never be). A block is
  named once the model that decodes its row has written it whole, and records which
  models' KV it holds; a row shares the run of blocks valid for its decoding model and
  starts each model's cached count at that model's own valid run.
- The other model (the draft of a speculative row) may then have to write blocks that
  are shared. One row at a time may do so per block: the first to write it claims it,
  the others wait at its start until it is marked written (then they skip it) or the
  claimant leaves. Nothing a row has read is ever rewritten.
- A row that leaves drops its holds; named blocks nobody holds stay, evictable
  (:class:`~specbatch.decoding.kv_blocks.BlockPool`), until a hit or the pool's need.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field

from specbatch.decoding.kv_blocks import BlockPool
from specbatch.decoding.rows import Row

MODELS = ("target", "draft")
ROOT_DIGEST = b""


def chain_digest(parent: bytes, tokens: list[int]) -> bytes:
    """The name of a block holding ``tokens`` after the block named ``parent``."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


def reachable_hits(served: list[tuple[list[int], list[int]]], block_size: int) -> list[int]:
    """The prompt tokens each of ``served`` could find cached if one instance with an
    endless pool had run them all, in order: the most any placement over any number of
    instances can find, since a block is only ever found where it was computed.

    ``served`` holds, per request in the order sent, its prompt's tokens and the tokens
    its row left named (the prompt and its answer). A prompt finds the leading run of
    its full blocks within its first ``len - 1`` tokens (the rule of
    :meth:`PrefixCache.match`) that an earlier request named."""
    named: set[bytes] = set()
    hits = []
    for prompt, left in served:
        parent, found = ROOT_DIGEST, 0
        for index in range((len(prompt) - 1) // block_size):
            parent = chain_digest(parent, prompt[index * block_size : (index + 1) * block_size])
            if parent not in named:
                break
            found += block_size
        hits.append(found)
        parent = ROOT_DIGEST
        for index in range(len(left) // block_size):
            parent = chain_digest(parent, left[index * block_size : (index + 1) * block_size])
            named.add(parent)
    return hits


@dataclass(frozen=True)
class PrefixHit:
    """What the cache holds of a row's leading tokens: the blocks it shares, and the
    tokens each model finds cached in them."""

    blocks: tuple[int, ...] = ()
    cached: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODELS, 0))


@dataclass(frozen=True)
class PrefixStats:
    """Counters of an engine's prefix cache: prompt tokens found cached (hits) and
    computed (misses) at admission; named blocks (held or evictable), evictable blocks,
    and evictions so far."""

    hit_tokens: int = 0
    miss_tokens: int = 0
    cached_blocks: int = 0
    evictable_blocks: int = 0
    evictions: int = 0


class PrefixCache:
    """Names the pool's full blocks and finds them again; ``enabled=False`` names
    nothing, so every row computes its whole prompt and no block is ever shared."""

    def __init__(self, pool: BlockPool, enabled: bool = True) -> None:
        self.pool = pool
        self.enabled = enabled
        self._by_digest: dict[bytes, int] = {}
        self._digest_of: dict[int, bytes] = {}
        self._valid: dict[int, set[str]] = {}
        self._claims: dict[tuple[int, str], int] = {}  # (block, model) -> row id writing it
        self._hit_tokens = 0
        self._miss_tokens = 0
        pool.on_evict = self._forget

    def stats(self) -> PrefixStats:
        return PrefixStats(
            hit_tokens=self._hit_tokens,
            miss_tokens=self._miss_tokens,
            cached_blocks=len(self._digest_of),
            evictable_blocks=self.pool.num_evictable,
            evictions=self.pool.evictions,
        )

    # ---- admission --------------------------------------------------------------------

    def match(self, row: Row) -> PrefixHit:
        """The named blocks ``row`` may share (nothing is taken yet)."""
        if not self.enabled:
            return PrefixHit()
        shareable = (row.seq_len - 1) // self.pool.block_size
        blocks = []
        for digest in self._digests(row)[:shareable]:
            block = self._by_digest.get(digest)
            if block is None or row.primary not in self._valid[block]:
                break
            blocks.append(block)
        cached = {model: self._valid_run(blocks, model) * self.pool.block_size for model in MODELS}
        return PrefixHit(tuple(blocks), cached)

    def revived(self, hit: PrefixHit) -> int:
        """Blocks of ``hit`` that are evictable now: sharing them takes them from the free count."""
        return sum(1 for block in hit.blocks if self.pool.holders(block) == 0)

    def admit(self, row: Row, hit: PrefixHit) -> None:
        """``row`` (holding no blocks) takes the blocks of ``hit`` and starts its models'
        cached counts where the hit leaves them."""
        self.pool.share(row.blocks, hit.blocks)
        row.target_cached = hit.cached["target"]
        row.draft_cached = hit.cached["draft"]
        size = self.pool.block_size
        row.reported_blocks = {model: hit.cached[model] // size for model in MODELS}
        found = row.cached(row.primary)
        self._hit_tokens += found
        self._miss_tokens += row.seq_len - found

    # ---- as models write --------------------------------------------------------------

    def record(self, row: Row) -> None:
        """Name the blocks ``row``'s decoding model has now written whole, and mark the
        blocks each model has written as holding its KV."""
        if not self.enabled:
            return
        size = self.pool.block_size
        digests = self._digests(row)
        for model in MODELS:
            whole = min(row.cached(model), row.seq_len) // size
            for index in range(row.reported_blocks[model], whole):
                self._written(row.blocks[index], digests[index], model, naming=model == row.primary)
            row.reported_blocks[model] = max(row.reported_blocks[model], whole)

    def skip_written(self, row: Row, model: str) -> None:
        """Advance ``row``'s cached count for ``model`` over blocks another row has
        written for that model since (it waited for them, or they were named later)."""
        if not self.enabled:
            return
        size = self.pool.block_size
        while row.cached(model) % size == 0:
            index = row.cached(model) // size
            if index >= len(row.blocks) or model not in self._valid.get(row.blocks[index], ()):
                return
            row.set_cached(model, (index + 1) * size)

    def writable_end(self, row: Row, model: str, start: int, end: int) -> int:
        """How far (at most ``end``) ``row`` may write ``model``'s KV from ``start``: up to
        the first block another row is writing for that model, or that already holds
        it. Every block up to there is claimed for ``row``."""
        if not self.enabled:
            return end
        size = self.pool.block_size
        for index in range(start // size, self.pool.blocks_for(end)):
            block = row.blocks[index]
            if model in self._valid.get(block, ()) or (
                self._claims.setdefault((block, model), row.handle.row_id) != row.handle.row_id
            ):
                return max(start, index * size)
        return end

    def release(self, row: Row) -> None:
        """``row`` leaves (finished, cancelled or preempted): its claims end and its
        blocks go back to the pool (named ones become evictable once nobody holds them)."""
        for block in row.blocks:
            for model in MODELS:
                if self._claims.get((block, model)) == row.handle.row_id:
                    del self._claims[block, model]
        self.pool.release(row.blocks)
        row.reported_blocks = dict.fromkeys(MODELS, 0)

    # ---- naming -----------------------------------------------------------------------

    def _digests(self, row: Row) -> list[bytes]:
        """The names of ``row``'s full blocks of committed tokens, extended as it grows."""
        size = self.pool.block_size
        digests = row.block_digests
        for index in range(len(digests), row.seq_len // size):
            parent = digests[-1] if digests else ROOT_DIGEST
            digests.append(chain_digest(parent, row.tokens[index * size : (index + 1) * size]))
        return digests

    def _valid_run(self, blocks: list[int], model: str) -> int:
        run = 0
        for block in blocks:
            if model not in self._valid[block]:
                break
            run += 1
        return run

    def _written(self, block: int, digest: bytes, model: str, naming: bool) -> None:
        if block in self._digest_of:
            self._valid[block].add(model)
            self._claims.pop((block, model), None)
        elif naming and digest not in self._by_digest:  # a copy of a named block stays unnamed
            self._by_digest[digest] = block
            self._digest_of[block] = digest
            self._valid[block] = {model}
            self.pool.keep(block)

    def _forget(self, block: int) -> None:
        del self._by_digest[self._digest_of.pop(block)]
        del self._valid[block]
