"""Where a prompt's prefix was sent last: the instance most likely to hold its KV blocks.

An instance reuses the KV blocks of a prefix it computed a moment ago (the engine's
prefix cache), so the chat turns of one conversation and the requests that share a
system prompt are cheapest where their prefix went before. The scheduler cannot see an
instance's cache; it remembers where it sent each prefix, which is where the blocks
are unless they were evicted since.

A prompt is known by keys of its leading text at doubling lengths (256, 512, 1024, …
characters, each shorter than the prompt, so the part that must still be computed is
never a key): two prompts sharing their first n characters share every key up to n,
and the longest key on record names the instance with the most of the prompt. Keys are
Python hashes, meaningful only inside the scheduler's process.
"""

from __future__ import annotations

from collections import OrderedDict

SHORTEST_PREFIX_CHARS = 256
REMEMBERED_PREFIXES = 4096


def prefix_keys(text: str) -> tuple[int, ...]:
    """Keys of ``text``'s leading 256, 512, 1024, … characters, shortest first."""
    keys = []
    length = SHORTEST_PREFIX_CHARS
    while length < len(text):
        keys.append(hash(text[:length]))
        length *= 2
    return tuple(keys)


class PrefixHolders:
    """The instances each prefix key was sent to, most recent last; the least recently
    used key goes first when more than ``capacity`` are on record.

    Every instance a prefix went to is kept, not only the last: a prompt that spilled to
    another instance while the first was busy left its blocks on both, and when the last
    holder is busy too, an earlier one may still have them, which beats an instance that
    never computed them."""

    def __init__(self, capacity: int = REMEMBERED_PREFIXES) -> None:
        self._holders: OrderedDict[int, list[str]] = OrderedDict()
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._holders)

    def holders(self, keys: tuple[int, ...]) -> tuple[str, ...]:
        """The instances the longest of ``keys`` on record went to, most recent last."""
        for key in reversed(keys):
            names = self._holders.get(key)
            if names:
                return tuple(names)
        return ()

    def sent(self, keys: tuple[int, ...], name: str) -> None:
        """A prompt with ``keys`` starts on instance ``name``."""
        for key in keys:
            names = self._holders.setdefault(key, [])
            if name in names:
                names.remove(name)
            names.append(name)
            self._holders.move_to_end(key)
        while len(self._holders) > self._capacity:
            self._holders.popitem(last=False)

    def forget(self, name: str) -> None:
        """An instance left (its cache with it)."""
        for key in list(self._holders):
            names = self._holders[key]
            if name in names:
                names.remove(name)
                if not names:
                    del self._holders[key]
