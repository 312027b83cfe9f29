"""Paged KV caches for the CUDA kernel tests (the engine's layout, csrc/model.h KvPages).

A test builds the cache it reasons about contiguously, [max_batch, max_seq, Hkv, hd], and
PagedCaches scatters it into a pool of blocks in a shuffled order, with spare blocks and every
position past max_seq poisoned (NaN): a kernel that ignores the table, or reads a row the table
does not give it, meets NaN. gather() turns the pools back into the contiguous layout, so tests of
kernels that write the cache compare exactly what they compared before.
"""

import torch


class PagedCaches:
    def __init__(self, k_cache, v_cache, block_size=16, seed=0, spare=3):
        max_batch, max_seq, n_kv_heads, head_dim = k_cache.shape
        self.block_size, self.max_seq = block_size, max_seq
        self.blocks_per_seq = -(-max_seq // block_size)
        used = max_batch * self.blocks_per_seq
        self.n_blocks = used + spare
        order = torch.randperm(self.n_blocks, generator=torch.Generator().manual_seed(seed))[:used]
        self.table = order.view(max_batch, self.blocks_per_seq).to(torch.int32).cuda()
        self._block_shape = (block_size, n_kv_heads, head_dim)
        self.k, self.v = (torch.full((self.n_blocks * block_size, n_kv_heads, head_dim), float("nan"),
                                     dtype=k_cache.dtype, device="cuda") for _ in range(2))
        for pool, cache in ((self.k, k_cache), (self.v, v_cache)):
            padded = torch.full((max_batch, self.blocks_per_seq * block_size, n_kv_heads, head_dim),
                                float("nan"), dtype=cache.dtype, device="cuda")
            padded[:, :max_seq] = cache
            pool.view(self.n_blocks, *self._block_shape)[self.table.long().flatten()] = \
                padded.view(used, *self._block_shape)

    def to_fp8(self):
        """The pools as e4m3 bytes, the fp8 KV cache (values round to nearest even, NaN stays NaN);
        gather() widens them back to bf16, exactly."""
        self.k, self.v = self.k.to(torch.float8_e4m3fn), self.v.to(torch.float8_e4m3fn)
        return self

    def kwargs(self):
        """The block-table arguments of the testing ops."""
        return dict(block_table=self.table.data_ptr(), block_size=self.block_size, n_blocks=self.n_blocks,
                    kv_fp8=self.k.dtype == torch.float8_e4m3fn)

    def gather(self):
        """(k, v) as contiguous caches [max_batch, max_seq, Hkv, hd]."""
        max_batch = self.table.shape[0]
        out = []
        for pool in (self.k, self.v):
            pool = pool.to(torch.bfloat16) if pool.dtype == torch.float8_e4m3fn else pool
            blocks = pool.view(self.n_blocks, *self._block_shape)[self.table.long().flatten()]
            out.append(blocks.view(max_batch, -1, *self._block_shape[1:])[:, :self.max_seq])
        return out
