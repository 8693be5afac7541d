"""A HuggingFace causal LM as a DSpark target, with hidden-state capture.

Why a wrapper: the drafter is conditioned on the *outputs of selected target
decoder layers* (``target_layer_ids``, HF ``hidden_states[l + 1]``) and shares the
target's frozen embedding and LM head. ``HFTarget`` exposes exactly those pieces
plus an incremental forward that returns logits, the concatenated captured
layers and the updated KV cache, so the reference generator and the trainer
never touch transformers internals.

Capture is done with forward hooks on the selected decoder layers only (no
``output_hidden_states``, which would materialise every layer).
Invariant: ``captured[..., j*H:(j+1)*H]`` equals HF ``hidden_states[ids[j] + 1]``
for the same input, and cropping the cache to ``n`` tokens then re-feeding
positions ``n..`` reproduces an uncropped run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerBase

from dspark_sglang.model.config import TargetSpec
from dspark_sglang.targets.heads import heads_only_model

# Special tokens that never occur in chat text, in order of preference. SmolLM2's
# vocabulary reserves 17 special tokens (ids 0-16) for its pre-training formats;
# ``<empty_output>`` (id 16) marks empty Jupyter cell outputs and is never produced
# or consumed by the chat template, so it is safe as the drafter's mask token.
# ``<|fim_pad|>`` plays the same role in Qwen tokenizers.
_MASK_CANDIDATES: tuple[str, ...] = ("<empty_output>", "<|fim_pad|>")


def default_mask_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Token id the drafter feeds in the B-1 masked block slots.

    The tokenizer's own ``mask_token`` if it has one, else the first of
    ``_MASK_CANDIDATES`` in the vocabulary (SmolLM2: ``<empty_output>`` = 16).
    """
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    vocab = tokenizer.get_vocab()
    for tok in _MASK_CANDIDATES:
        if tok in vocab:
            return int(vocab[tok])
    raise ValueError(
        f"no mask token for tokenizer {type(tokenizer).__name__}: it has no mask_token and "
        f"none of {_MASK_CANDIDATES}; pass mask_token_id explicitly (an unused special token)"
    )


def target_name_of(path: Path) -> str:
    """A stable target name: SmolLM2's converted folder reports the upstream name."""
    from dspark_sglang.targets.smollm2 import RECORD_FILENAME, SMOLLM2_NAME

    return SMOLLM2_NAME if (path / RECORD_FILENAME).is_file() else path.name


class HFTarget:
    """Frozen causal LM + tokenizer with incremental, hidden-capturing forwards.

    ``forward`` works on one sequence (batch 1) with its own ``DynamicCache``:
    ragged speculative rounds keep one cache per request. ``weights="heads"`` loads only
    the embedding and LM head (``targets.heads``): enough to train from a hidden-state
    cache or export a drafter, for a target too big for one device; a forward raises.
    """

    def __init__(
        self,
        path: str | Path,
        dtype: torch.dtype = torch.float32,
        num_threads: int | None = None,
        *,
        name: str | None = None,
        device: str | torch.device = "cpu",
        weights: str = "full",
    ) -> None:
        if num_threads is not None:
            if num_threads < 1:
                raise ValueError(f"num_threads must be >= 1, got {num_threads}")
            torch.set_num_threads(num_threads)
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"HFTarget: {folder} has no config.json; pass a HuggingFace model folder "
                "(for SmolLM2 use dspark_sglang.targets.smollm2.ensure_smollm2())"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if weights == "heads":
            model = heads_only_model(folder, dtype, device)
        elif weights == "full":
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device)
        else:
            raise ValueError(f"HFTarget weights must be 'full' or 'heads', got {weights!r}")
        self._setup(model, tokenizer, name or target_name_of(folder), folder)

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        name: str = "in-memory",
    ) -> HFTarget:
        """Wrap an already-built causal LM (e.g. a tiny random Llama in tests)."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, name, None)
        return self

    def _setup(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase | None,
        name: str,
        path: Path | None,
    ) -> None:
        self.path = path
        self.tokenizer = tokenizer
        self.model = model
        self.model.eval()
        self.model.requires_grad_(False)
        self.dtype = next(model.parameters()).dtype
        self.spec: TargetSpec = TargetSpec.from_hf_config(model.config, name=name)
        self._layers: nn.ModuleList = model.get_decoder().layers

    # ------------------------------------------------------------------ pieces

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def embed_tokens(self) -> nn.Embedding:
        """The target's (frozen) input embedding, shared by the drafter."""
        emb = self.model.get_input_embeddings()
        assert isinstance(emb, nn.Embedding)
        return emb

    @property
    def lm_head(self) -> nn.Linear:
        """The target's (frozen) LM head, shared by the drafter."""
        head = self.model.get_output_embeddings()
        assert isinstance(head, nn.Linear)
        return head

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Stop tokens: the generation config's EOS id(s), else the tokenizer's."""
        gen = getattr(self.model, "generation_config", None)
        eos: Any = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return ()
        return tuple(int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]))

    def _require_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise ValueError(f"target {self.spec.name!r} was built without a tokenizer")
        return self.tokenizer

    def default_mask_token_id(self) -> int:
        return default_mask_token_id(self._require_tokenizer())

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of ``messages`` through the tokenizer's chat template.

        ``chat_template_kwargs`` are variables for the template (e.g. Qwen3's
        ``enable_thinking``), the training config's ``data.chat_template_kwargs``.
        """
        extra = dict(chat_template_kwargs or {})
        fixed = {"conversation", "add_generation_prompt", "tokenize", "return_dict"} & set(extra)
        if fixed:
            raise ValueError(
                f"chat_template_kwargs may not set {sorted(fixed)}: encode_chat sets them"
            )
        ids = self._require_tokenizer().apply_chat_template(
            [dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
            **extra,
        )
        if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    # ------------------------------------------------------------------ forward

    def _check_layer_ids(self, ids: Sequence[int]) -> None:
        last = self.spec.num_layers - 1
        for lid in ids:
            if not 0 <= lid < last:
                raise ValueError(
                    f"capture_layer_ids contains {lid}: ids must be in [0, {last - 1}] "
                    f"(the target has {self.spec.num_layers} layers; its last layer's output "
                    "is never captured)"
                )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        past_key_values: DynamicCache | None = None,
        position_offset: int | None = None,
        capture_layer_ids: Sequence[int] = (),
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
        """Run ``input_ids`` ``[1, T]`` after the cached prefix.

        Returns ``(logits [1, T, V] float32, captured [1, T, n*H], cache)``, where
        ``captured`` concatenates the outputs of ``capture_layer_ids`` in order
        (``[1, T, 0]`` when none). ``position_offset`` defaults to the cache length
        and must equal it (positions are absolute token indices).
        ``logits_to_keep > 0`` computes logits for the last that many positions only
        (a prefill needs one row; the LM head over a long prompt is costly).
        """
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, T], got {tuple(input_ids.shape)}")
        self._check_layer_ids(capture_layer_ids)
        cache = past_key_values if past_key_values is not None else self.new_cache()
        cached = cache.get_seq_length()
        offset = cached if position_offset is None else int(position_offset)
        if offset != cached:
            raise ValueError(
                f"position_offset={offset} but the KV cache holds {cached} tokens; crop the "
                "cache (crop_cache) to the offset first"
            )
        t = input_ids.shape[1]
        positions = torch.arange(offset, offset + t, device=input_ids.device).unsqueeze(0)

        grabbed: dict[int, torch.Tensor] = {}
        handles = []
        for lid in capture_layer_ids:

            def hook(_m: nn.Module, _a: Any, out: Any, lid: int = lid) -> None:
                grabbed[lid] = out[0] if isinstance(out, tuple) else out

            handles.append(self._layers[lid].register_forward_hook(hook))
        try:
            out = self.model(
                input_ids=input_ids.to(self.device),
                past_key_values=cache,
                position_ids=positions.to(self.device),
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        finally:
            for h in handles:
                h.remove()
        if capture_layer_ids:
            captured = torch.cat([grabbed[lid] for lid in capture_layer_ids], dim=-1)
        else:
            captured = out.logits.new_zeros((1, t, 0))
        return out.logits.float(), captured, cache

    @staticmethod
    def crop_cache(cache: DynamicCache, length: int) -> None:
        """Keep the first ``length`` cached tokens (drops rejected draft positions)."""
        cached = cache.get_seq_length()
        if not 0 <= length <= cached:
            raise ValueError(f"cannot crop a cache of {cached} tokens to {length}")
        if length < cached:
            # transformers 5 deprecates crop(positive length); a negative count drops the tail.
            cache.crop(length - cached)
