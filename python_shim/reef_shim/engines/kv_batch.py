"""The running batch's KV cache: one left-padded HF `DynamicCache` for every row, through the model's
own forward (any HF causal LM whose layers are all full attention: Llama, Qwen2, Qwen3...).

Layout: each layer's keys and values are `[B, H_kv, L, D]`, a row's tokens right-aligned and the
columns before them padding; `mask` (`[B, L]`, 1 = a token) is the 2-D attention mask HF turns into
its 4-D one, and `next_pos` the position id of each row's next token (its own token count, so
padding shifts nothing). A newcomer is prefilled alone (only its last position's logits are
computed), then merged in: whichever of it and the batch is shorter is padded on the left to the
common length. A step decodes one token for every row in one forward. Rows that leave are cut
out, and columns that became padding in every row are dropped.

Appending a step writes one column into buffers kept with spare columns, where `DynamicLayer`
concatenates (a copy of the whole cache per layer and step: about a fifth of a 32-row step at 300
tokens on SmolLM2-135M).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Columns allocated beyond what the batch holds; grown by at least as many when used up.
SPARE_COLUMNS = 64


class _BufferedLayer(DynamicLayer):
    """A `DynamicLayer` whose `keys`/`values` are views of `[B, H, capacity, D]` buffers."""

    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, length: int) -> None:
        super().__init__()
        self.k_buf, self.v_buf = k_buf, v_buf
        self.dtype, self.device = k_buf.dtype, k_buf.device
        self.is_initialized = True
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self.k_buf[:, :, :length]
        self.values = self.v_buf[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if self.length + n > self.k_buf.shape[-2]:
            grow = max(SPARE_COLUMNS, self.k_buf.shape[-2] // 2, n)
            self.k_buf = _widen(self.k_buf, self.length, grow)
            self.v_buf = _widen(self.v_buf, self.length, grow)
        self.k_buf[:, :, self.length:self.length + n] = key_states
        self.v_buf[:, :, self.length:self.length + n] = value_states
        self._set_length(self.length + n)
        return self.keys, self.values


def _widen(buf: torch.Tensor, used: int, extra: int) -> torch.Tensor:
    b, h, cap, d = buf.shape
    out = buf.new_zeros((b, h, cap + extra, d))
    out[:, :, :used] = buf[:, :, :used]
    return out


def check_full_attention(config: Any) -> None:
    """Refuse a model with sliding-window (or other non-plain) layers: their caches keep a window,
    which the left-padded merge here does not handle."""
    kinds = {type(layer).__name__ for layer in DynamicCache(config=config).layers}
    if kinds - {"DynamicLayer"}:
        raise ValueError(f"the hf engine batches full-attention models only; this one has {sorted(kinds)} layers")


def cache_argument(model: torch.nn.Module) -> str:
    """The name the model's forward takes its KV cache by: `cache` from transformers 5.23 on,
    `past_key_values` before (SGLang 0.5.23 pins transformers 5.19, so the GPU venv has the old one).
    The output carries it under the same name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class KVBatch:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._cache_arg = cache_argument(model)
        self._reset()

    def _reset(self) -> None:
        self.cache = DynamicCache()
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.next_pos = torch.zeros(0, dtype=torch.long)

    @property
    def layers(self) -> list[Any]:
        return self.cache.layers

    def _set_layers(self, layers: list[_BufferedLayer]) -> None:
        self.cache.layers = layers

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def prefill(self, prompt: list[int]) -> tuple[torch.Tensor, DynamicCache]:
        """The prompt alone through the model: the logits `[V]` of its last position, and its cache."""
        out = self.model(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        return out.logits[0, -1], getattr(out, self._cache_arg)

    def merge(self, caches: list[DynamicCache]) -> None:
        """Append prefilled rows (`prefill`'s caches) after the running ones, left-padding to the
        longest."""
        if not caches:
            return
        old_b, old_l = self.size, self.length
        lengths = [c.get_seq_length() for c in caches]
        length = max([old_l, *lengths])
        rows = old_b + len(caches)
        mask = torch.zeros((rows, length), dtype=torch.long)
        mask[:old_b, length - old_l:] = self.mask
        for r, n in enumerate(lengths, start=old_b):
            mask[r, length - n:] = 1
        layers = []
        for i, first in enumerate(caches[0].layers):
            _, h, _, d = first.keys.shape
            k_buf = first.keys.new_zeros((rows, h, length + SPARE_COLUMNS, d))
            v_buf = first.values.new_zeros((rows, h, length + SPARE_COLUMNS, d))
            if old_b:
                k_buf[:old_b, :, length - old_l:length] = self.layers[i].keys
                v_buf[:old_b, :, length - old_l:length] = self.layers[i].values
            for r, (cache, n) in enumerate(zip(caches, lengths), start=old_b):
                k_buf[r, :, length - n:length] = cache.layers[i].keys[0]
                v_buf[r, :, length - n:length] = cache.layers[i].values[0]
            layers.append(_BufferedLayer(k_buf, v_buf, length))
        self._set_layers(layers)
        self.mask = mask
        self.next_pos = torch.cat([self.next_pos, torch.tensor(lengths, dtype=torch.long)])

    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feed each row its next token (in row order); the logits `[B, V]` of the position after it."""
        mask = torch.cat([self.mask, torch.ones((self.size, 1), dtype=torch.long)], dim=1)
        out = self.model(input_ids=torch.tensor(tokens).unsqueeze(1), attention_mask=mask,
                         position_ids=self.next_pos.unsqueeze(1), use_cache=True,
                         **{self._cache_arg: self.cache})
        self.mask = mask
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1]

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (ascending), dropping the columns that are padding in all of them."""
        if len(rows) == self.size:
            return
        if not rows:
            self._reset()
            return
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.mask[index]
        first = int(mask.any(dim=0).nonzero()[0])
        length = self.length - first
        layers = []
        for layer in self.layers:
            k = layer.keys[index, :, first:]
            v = layer.values[index, :, first:]
            k_buf = k.new_zeros((len(rows), k.shape[1], length + SPARE_COLUMNS, k.shape[3]))
            v_buf = v.new_zeros(k_buf.shape)
            k_buf[:, :, :length] = k
            v_buf[:, :, :length] = v
            layers.append(_BufferedLayer(k_buf, v_buf, length))
        self._set_layers(layers)
        self.mask = mask[:, first:].contiguous()
        self.next_pos = self.next_pos[index]
