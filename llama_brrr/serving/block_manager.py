"""The paged KV cache's block manager: which pool blocks each running sequence's positions live in.

The engine keeps every layer's KV cache as one pool of `kv_blocks` blocks of `kv_block_size` (B)
positions; slot s reads and writes position p in block table[s][p // B]. This class owns the tables
and the pool (the scheduler's allocator: admit / reserve / free / usage):

  * admit(request) gives the request a free slot and looks its tokens up in the prefix cache;
  * reserve(request, n) allocates blocks so its next n positions (a prefill chunk or a decode burst)
    are covered, and refuses when the pool has too few free blocks (the scheduler then preempts);
  * free(request) drops its references; a block nobody references goes to the free list.

Prefix caching. A block whose B positions are all written is registered under a chained digest
(blake2b of the previous block's digest and the block's tokens), so a block stands for its whole
prefix. Lookup walks a new sequence's full blocks from the start and stops at the first miss; a hit
also compares the stored tokens and parent digest with the sequence's, so a digest alone never
decides. Only blocks wholly before the sequence's last token are shared (prefill covers tokens[:-1],
the first decode step writes the last position): a sequence never writes into a shared block, and
copy-on-write is never needed. The engine records the skipped tokens for the repetition penalty
(set_history), as a prefill would have.

LRU. A freed block keeps its digest and goes to the tail of the free list (blocks that hold no
cached prefix go to the head); allocation takes the head and forgets that block's digest then, so
the least recently used cached prefixes are evicted first and a later request can still hit a
block freed a while ago.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

_EMPTY_TABLE = np.zeros(0, dtype=np.int32)


def _digest(parent: bytes, tokens: bytes) -> bytes:
    return hashlib.blake2b(parent + tokens, digest_size=16).digest()


class _BlockTokens:
    """Blocks first .. stop - 1 of a token sequence as int32 bytes, block i at [i]: converted
    once, so hashing and comparing a request's blocks costs no per-block array conversion."""

    def __init__(self, ids: list[int], block_size: int, first: int, stop: int):
        self._data = np.asarray(ids[first * block_size:stop * block_size], dtype=np.int32).tobytes()
        self._first, self._step = first, 4 * block_size

    def __getitem__(self, i: int) -> bytes:
        at = (i - self._first) * self._step
        return self._data[at:at + self._step]


def first_chunk_end(prefilled: int, target: int, chunk: int) -> int:
    """Where the prefill chunk starting at `prefilled` ends: at the next multiple of `chunk` (so
    chunk boundaries sit at fixed offsets of the sequence, wherever a cached prefix left off) or at
    `target`; target + 1 when nothing is left to prefill (the first decode row's position)."""
    if prefilled >= target:
        return target + 1
    return min((prefilled // chunk + 1) * chunk, target)


def sequence_ids(request) -> list[int]:
    """The token at every position of `request`'s sequence: its prompt, then what it generated."""
    return request.prompt_ids + request.token_ids if request.token_ids else request.prompt_ids


def written_positions(request) -> int:
    """KV positions of `request` known to be in its blocks: what prefill wrote, then (once it
    decodes) every position before the one the next decode step feeds."""
    if request.token_ids and request.prefilled == request.prefill_target:
        return request.position
    return request.prefilled


class BlockManager:
    """Slots and KV blocks of one engine (see the module docstring). Single-threaded, like the
    scheduler that drives it; one per engine, since the engine's pool is one."""

    def __init__(self, engine, n_slots: int, max_seq_len: int, enable_prefix_caching: bool = True):
        config = engine.config
        self.engine = engine
        self.n_slots = int(n_slots)
        self.max_seq_len = int(max_seq_len)
        self.block_size = int(config["kv_block_size"])
        self.n_blocks = int(config["kv_blocks"])
        self.blocks_per_seq = -(-self.max_seq_len // self.block_size)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._ref = [0] * self.n_blocks
        # A registered block's digest, tokens (int32 bytes) and parent digest; None while it holds
        # no cached prefix.
        self._digest: list[bytes | None] = [None] * self.n_blocks
        self._tokens: list[bytes | None] = [None] * self.n_blocks
        self._parent: list[bytes | None] = [None] * self.n_blocks
        self._cached: dict[bytes, int] = {}  # digest -> block
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self.n_blocks))
        self._free_slots = list(range(self.n_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._owners: dict[int, object] = {}  # slot -> request
        self._tables: dict[int, list[int]] = {}  # slot -> its blocks in position order
        self._chains: dict[int, list[bytes]] = {}  # slot -> digests of its full blocks so far
        self._uploaded: dict[int, int] = {}  # slot -> table length the engine has
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of them, tokens whose KV came from cached blocks
        self._identity = False  # the engine's tables are the identity layout, no cache kept

    # ---- sizes ---------------------------------------------------------------------------------

    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    def check_fits(self, n_prompt: int, max_tokens: int) -> None:
        """ValueError when a sequence of n_prompt tokens generating max_tokens could not fit the
        pool even alone (the last sampled token is never fed, so it needs no KV position)."""
        positions = min(n_prompt + max_tokens - 1, self.max_seq_len)
        need = self.blocks_for(positions)
        if need > self.n_blocks:
            raise ValueError(
                f"the request needs {positions} KV positions ({n_prompt} prompt tokens + max_tokens="
                f"{max_tokens} - 1) = {need} blocks of {self.block_size}, but the whole KV pool has "
                f"{self.n_blocks} blocks ({self.n_blocks * self.block_size} positions); lower "
                f"max_tokens, shorten the prompt, or load the model with more KV blocks "
                f"(kv_blocks=, gpu_memory_utilization=)")

    # ---- the allocator interface ---------------------------------------------------------------

    def admit(self, request, chunk: int = 1) -> bool:
        """A free slot for `request`, the cached blocks of its prefix (request.prefilled is then
        the cached length) and blocks for its first prefill chunk (chunks end at multiples of
        `chunk`; see first_chunk_end) or, when all but its last token is cached, for its first
        decode row. False, changing nothing, when no slot or too few blocks are free."""
        if not self._free_slots:
            return False
        ids = sequence_ids(request)
        target = len(ids) - 1  # the position the first decode step writes
        hits, chain = self._lookup(ids, target) if self.enable_prefix_caching else ([], [])
        cached = len(hits) * self.block_size
        end = first_chunk_end(cached, target, chunk)
        revived = sum(1 for block in hits if self._ref[block] == 0)  # hits now in the free list
        if self.blocks_for(end) - len(hits) > len(self._free) - revived:
            return False
        slot = self._free_slots.pop()
        request.slot = slot
        self._owners[slot] = request
        self._identity = False
        for block in hits:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
        table = hits + [self._allocate() for _ in range(self.blocks_for(end) - len(hits))]
        self._tables[slot] = table
        self._chains[slot] = chain
        request.prefilled = cached
        if self.enable_prefix_caching:
            self.prefix_queries += len(ids)
            self.prefix_hits += cached
        if cached:
            self.engine.set_history(slot, 0, np.asarray(ids[:cached], dtype=np.int32))
        self._upload(slot)
        return True

    def _lookup(self, ids: list[int], target: int) -> tuple[list[int], list[bytes]]:
        """The cached blocks of ids' prefix, wholly before position `target`, and their digests."""
        hits, chain, parent = [], [], b""
        blocks = _BlockTokens(ids, self.block_size, 0, target // self.block_size)
        for i in range(target // self.block_size):
            tokens = blocks[i]
            digest = _digest(parent, tokens)
            block = self._cached.get(digest)
            if block is None or self._tokens[block] != tokens or self._parent[block] != parent:
                break
            hits.append(block)
            chain.append(digest)
            parent = digest
        return hits, chain

    def extend_prefix(self, request) -> None:
        """Before a prefill chunk: more of `request`'s prefix from the cache, if blocks it lacked
        at admission have been registered since (requests admitted together with one that is
        prefilling the same system prompt find its blocks this way). Only block-aligned, not yet
        written positions are replaced, so nothing written is ever thrown away."""
        slot = request.slot
        if (not self.enable_prefix_caching or slot is None or request.prefilled % self.block_size
                or len(self._chains[slot]) != request.prefilled // self.block_size):
            return
        ids = sequence_ids(request)
        table, chain = self._tables[slot], self._chains[slot]
        parent = chain[-1] if chain else b""
        start = len(chain)
        stop = (len(ids) - 1) // self.block_size
        blocks = _BlockTokens(ids, self.block_size, start, stop)
        for i in range(start, stop):
            tokens = blocks[i]
            digest = _digest(parent, tokens)
            block = self._cached.get(digest)
            if block is None or self._tokens[block] != tokens or self._parent[block] != parent:
                break
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
            if i < len(table):  # a private block for positions not yet written goes back
                self._release(table[i])
                table[i] = block
            else:
                table.append(block)
            chain.append(digest)
            parent = digest
        if len(chain) > start:
            first, end = start * self.block_size, len(chain) * self.block_size
            self.engine.set_history(slot, first, np.asarray(ids[first:end], dtype=np.int32))
            request.prefilled = end
            self.prefix_hits += end - first
            self._uploaded.pop(slot, None)  # blocks were replaced, not only appended
            self._upload(slot)

    def reserve(self, request, n_positions: int) -> bool:
        """Blocks for the next n_positions positions of `request` (from what it has written: its
        next prefill chunk, or its next decode burst); False, allocating nothing, when the pool
        has too few free blocks."""
        slot = request.slot
        if slot is None or self._owners.get(slot) is not request:
            return False
        table = self._tables[slot]
        end = min(written_positions(request) + n_positions, self.max_seq_len)
        missing = self.blocks_for(end) - len(table)
        if missing > len(self._free):
            return False
        for _ in range(missing):
            table.append(self._allocate())
        if missing > 0:
            self._upload(slot)
        return True

    def written(self, request) -> None:
        """Registers the blocks of `request` that are now wholly written (after a prefill chunk or
        a decode step), so later sequences with the same prefix can share them."""
        if not self.enable_prefix_caching or request.slot is None:
            return
        chain = self._chains.get(request.slot)
        if chain is None or self._owners.get(request.slot) is not request:
            return
        full = min(written_positions(request) // self.block_size, len(self._tables[request.slot]))
        if full <= len(chain):
            return
        ids = sequence_ids(request)
        table = self._tables[request.slot]
        parent = chain[-1] if chain else b""
        blocks = _BlockTokens(ids, self.block_size, len(chain), full)
        for i in range(len(chain), full):
            tokens = blocks[i]
            digest = _digest(parent, tokens)
            block = table[i]
            # The same prefix computed twice (two requests at once) stays cached once; the
            # other copy is private and freed as such.
            if digest not in self._cached and self._digest[block] is None:
                self._cached[digest] = block
                self._digest[block] = digest
                self._tokens[block] = tokens
                self._parent[block] = parent
            chain.append(digest)
            parent = digest

    def free(self, request) -> None:
        """Gives back `request`'s slot and block references (twice is harmless)."""
        slot = request.slot
        if slot is None or self._owners.get(slot) is not request:
            request.slot = None
            return
        self.written(request)
        request.slot = None
        request.kv_end = 0
        # Reversed: a sequence's first blocks (the prefix most others share) are evicted last.
        for block in reversed(self._tables.pop(slot)):
            self._release(block)
        del self._chains[slot], self._owners[slot]
        self._tables[slot] = []
        self._upload(slot)
        del self._tables[slot]
        self._free_slots.append(slot)

    def usage(self) -> dict:
        used_blocks = self.n_blocks - len(self._free)
        return {"slots_used": len(self._owners), "slots_total": self.n_slots,
                "kv_blocks_used": used_blocks, "kv_blocks_total": self.n_blocks,
                "kv_blocks_free": len(self._free),
                "kv_blocks_cached": len(self._cached),
                "kv_positions_used": sum(written_positions(r) for r in self._owners.values()),
                "kv_positions_total": self.n_blocks * self.block_size,
                "prefix_cache_queries": self.prefix_queries, "prefix_cache_hits": self.prefix_hits}

    # ---- direct slot use -----------------------------------------------------------------------

    def reset_identity(self) -> None:
        """Puts every slot's table back to the engine's initial identity layout (slot s -> blocks
        s * blocks_per_seq, ... while the pool lasts) and drops the prefix cache, for callers that
        write KV slots directly (Llama.forward, the static-wave loop). Needs no sequence running."""
        if self._owners:
            raise RuntimeError(f"{len(self._owners)} sequence(s) still hold KV blocks; the identity "
                               f"layout would let direct slot writes overwrite them")
        if self._identity:  # nothing admitted since the last reset: tables and cache are as left
            return
        self._identity = True
        for slot in range(self.n_slots):
            first = slot * self.blocks_per_seq
            last = min(first + self.blocks_per_seq, self.n_blocks)
            self.engine.set_block_table(slot, np.arange(first, max(first, last), dtype=np.int32))
            self._uploaded.pop(slot, None)
        self.clear_prefix_cache()

    def clear_prefix_cache(self) -> None:
        """Forgets every cached prefix (blocks in use stay as they are, no longer shareable)."""
        self._cached.clear()
        for block in range(self.n_blocks):
            self._digest[block] = self._tokens[block] = self._parent[block] = None

    # ---- internals -----------------------------------------------------------------------------

    def _allocate(self) -> int:
        block, _ = self._free.popitem(last=False)
        digest = self._digest[block]
        if digest is not None:  # evicts the least recently freed cached prefix block
            if self._cached.get(digest) == block:
                del self._cached[digest]
            self._digest[block] = self._tokens[block] = self._parent[block] = None
        self._ref[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            self._free[block] = None
            if self._digest[block] is None:  # holds no cached prefix: the first to reuse
                self._free.move_to_end(block, last=False)

    def _upload(self, slot: int) -> None:
        table = self._tables[slot]
        owner = self._owners.get(slot)
        if owner is not None:
            owner.kv_end = min(len(table) * self.block_size, self.max_seq_len)
        if self._uploaded.get(slot) == len(table):  # a slot's table only grows while it is owned
            return
        self.engine.set_block_table(slot, np.asarray(table, dtype=np.int32) if table else _EMPTY_TABLE)
        self._uploaded[slot] = len(table)
