"""How cached hidden states are stored: their 16-bit dtypes on disk and the cache's size.

New caches are **bfloat16**: float16 overflows above 65504, which the residual stream of
real targets exceeds (massive activations of several thousand to 1e5 and more at a few
dimensions), while bfloat16 keeps float32's exponent range. numpy has no bfloat16, so a
bfloat16 array is stored as the ``uint16`` array of its bit patterns: ``encode`` rounds to
bfloat16 once (torch's round-to-nearest-even) and copies the 16 bits, ``decode`` copies
them back into a ``torch.bfloat16`` tensor; the round trip after that first rounding is
bit-exact. bfloat16 shards name their arrays ``aux.bf16.npy`` / ``last.bf16.npy``, so a
reader that ignores the manifest's ``dtype`` (an older version of this package) stops at a
missing file instead of reading bit patterns as integers.

**float16** caches (every cache written before bfloat16: ``aux.npy`` / ``last.npy`` of
numpy float16, manifest ``"dtype": "float16"``) still load, and a data stage that resumes
one keeps writing float16 so a directory never mixes the two.

Both dtypes take 2 bytes per value: a token costs ``(len(layer_ids) + 1) * hidden_size * 2``
bytes (the context layers plus the final-normed state), ``HiddenCacheSize``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

#: The dtype new caches are written in.
DEFAULT_CACHE_DTYPE = "bfloat16"


@dataclass(frozen=True)
class StoredDtype:
    """One on-disk dtype: its manifest name, torch dtype, the numpy dtype its ``.npy``
    files hold and the suffix of their names (``aux{suffix}.npy``)."""

    name: str
    torch_dtype: torch.dtype
    numpy_dtype: np.dtype
    suffix: str

    def file(self, array: str) -> str:
        """The file name of ``array`` (``aux`` or ``last``) in a shard of this dtype."""
        return f"{array}{self.suffix}.npy"


STORED_DTYPES: dict[str, StoredDtype] = {
    "bfloat16": StoredDtype("bfloat16", torch.bfloat16, np.dtype(np.uint16), ".bf16"),
    "float16": StoredDtype("float16", torch.float16, np.dtype(np.float16), ""),
}


def stored_dtype(name: object, where: str) -> StoredDtype:
    """The stored dtype a manifest names; anything else is refused, naming ``where``
    (the manifest) and the fix."""
    if not isinstance(name, str) or name not in STORED_DTYPES:
        raise ValueError(
            f"{where} records hidden-state dtype {name!r}; this version reads "
            f"{sorted(STORED_DTYPES)}. Delete that hidden/ folder and rerun "
            "`dspark-sglang train --config ... --stage data` to rewrite the cache in "
            f"{DEFAULT_CACHE_DTYPE}"
        )
    return STORED_DTYPES[name]


def encode(values: torch.Tensor, dtype: StoredDtype) -> np.ndarray:
    """``values`` rounded once to ``dtype`` as the numpy array a shard stores (on the CPU).

    Invariant: ``decode(encode(x, d), d)`` equals ``x.to(d.torch_dtype)`` bit for bit.
    """
    x = values.detach().to(dtype.torch_dtype).cpu().contiguous()
    if dtype.torch_dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(np.uint16)
    return x.numpy()


def decode(stored: np.ndarray, dtype: StoredDtype) -> torch.Tensor:
    """A copy of a stored array (a memory-mapped slice, say) as a ``dtype.torch_dtype``
    tensor. Raises ``ValueError`` when the array does not hold ``dtype.numpy_dtype``."""
    if stored.dtype != dtype.numpy_dtype:
        raise ValueError(
            f"a {dtype.name} hidden shard holds a {stored.dtype} array (expected "
            f"{dtype.numpy_dtype}); the cache is damaged: delete its hidden/ folder and "
            "rerun the data stage"
        )
    copy = np.array(stored, copy=True)
    if dtype.torch_dtype == torch.bfloat16:
        return torch.from_numpy(copy.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(copy)


def human_bytes(n: float) -> str:
    """``n`` bytes in binary units with three significant digits (``1.02 GiB``)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value)} B"
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{digits}f} {units[unit]}"


@dataclass(frozen=True)
class HiddenCacheSize:
    """The bytes of hidden states the hidden pass writes for ``tokens`` tokens.

    ``bytes_per_token = (num_layers + 1) * hidden_size * 2``: the ``num_layers`` context
    layers and the final-normed state, 2 bytes a value. ``tokens`` counts prompt and
    response tokens of the sequences still to cache; ``tokens_cached`` those already in
    the directory. Token ids, offsets and the npy headers (4 bytes a token plus a few
    hundred bytes a shard) come on top and are not counted.
    """

    dtype: str
    num_layers: int
    hidden_size: int
    tokens: int
    tokens_cached: int = 0

    @property
    def bytes_per_token(self) -> int:
        return (self.num_layers * self.hidden_size + self.hidden_size) * 2

    @property
    def bytes(self) -> int:
        return self.bytes_per_token * self.tokens

    def line(self) -> str:
        """``hidden cache: 12.0 KiB/token x 87,040 tokens = 1.00 GiB (bfloat16)``."""
        out = (
            f"hidden cache: {human_bytes(self.bytes_per_token)}/token x {self.tokens:,} "
            f"tokens = {human_bytes(self.bytes)} ({self.dtype})"
        )
        if self.tokens_cached:
            out += f"; {self.tokens_cached:,} tokens already cached"
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "dtype": self.dtype,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "bytes_per_token": self.bytes_per_token,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "tokens_cached": self.tokens_cached,
            "bytes_cached": self.bytes_per_token * self.tokens_cached,
        }
