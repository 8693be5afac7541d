"""The ``data`` section of a training config: prompt sources and generation settings.

``DataConfig`` says where prompts come from (``BuiltinSource``, ``JsonlSource``), how
the target regenerates their responses (HF, SGLang's ``Engine`` or running SGLang
servers) and whether the target's hidden states are cached or computed online.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from dspark_sglang.training.config_checks import COMPUTE_DTYPES, check_int

HiddenStatesMode = Literal["cache", "online", "sglang"]


def check_data_temperature(value: object) -> None:
    """``data.temperature``: a number >= 0 (bools and NaN refused). Checked by the config
    and again by ``datagen.GenerationSettings``, which can be built without one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(
            f"data.temperature must be >= 0 (1: sample the target's distribution, as in "
            f"the paper; 0: its greedy continuation), got {value!r}"
        )


#: Who regenerates the responses: HF ``generate`` in this process, SGLang's ``Engine`` in
#: this process, or already-running SGLang servers over their HTTP API.
GENERATORS = ("hf", "sglang", "openai")
#: SGLang ``Engine`` arguments the data stage sets itself (from run.device, data.gen_dtype,
#: the target and data.seed): refused in data.sglang_args.
RESERVED_SGLANG_ARGS = frozenset(
    {"model_path", "tokenizer_path", "device", "base_gpu_id", "dtype", "random_seed"}
)
#: What ``data.hidden_states: sglang`` sets on the engine itself (``hidden_capture``).
CAPTURE_SGLANG_ARGS = frozenset(
    {
        "enable_return_aux_hidden_states",
        "speculative_algorithm",
        "return_aux_hidden_state_layer_ids",
        "disable_radix_cache",
    }
)
_URL_RE = re.compile(r"https?://[^\s/]+(/[^\s]*)?")

PROMPT_DOMAINS = ("math", "code", "chat")

# apply_chat_template arguments the data stage sets itself (or that would change what it
# returns): refused in data.chat_template_kwargs.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


@dataclass(frozen=True)
class BuiltinSource:
    """The built-in prompt mix (GSM8K train, standard-library code and prose, instructions).

    A count left at None takes the section's ``data.num_math`` / ``num_code`` / ``num_chat``,
    so ``sources: [{kind: builtin}]`` (the default) is exactly the mix those three set.
    """

    kind: Literal["builtin"] = "builtin"
    num_math: int | None = None
    num_code: int | None = None
    num_chat: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_math", "num_code", "num_chat"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(
                    f"builtin source: {name} must be an integer >= 0, or null to take "
                    f"data.{name}; got {value!r}"
                )

    def counts(self, data: DataConfig) -> tuple[int, int, int]:
        """(math, code, chat) prompt counts, the section's where this source sets none."""
        return (
            data.num_math if self.num_math is None else self.num_math,
            data.num_code if self.num_code is None else self.num_code,
            data.num_chat if self.num_chat is None else self.num_chat,
        )


@dataclass(frozen=True)
class JsonlSource:
    """A chat-data file: JSONL (or ``.jsonl.gz``) of OpenAI ``messages`` or ShareGPT
    ``conversations`` rows (``dspark_sglang/data/chat_jsonl.py``). ``limit``: keep at most
    that many prompts from it (file order); ``domain`` tags its prompts for the logs."""

    kind: Literal["jsonl"] = "jsonl"
    path: str = ""
    limit: int | None = None
    domain: str = "chat"

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.endswith((".jsonl", ".jsonl.gz")):
            raise ValueError(
                "jsonl source: path must name a .jsonl or .jsonl.gz file (relative to the "
                f"repository root or absolute), got {self.path!r}"
            )
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1
        ):
            raise ValueError(
                "jsonl source: limit must be an integer >= 1 (prompts kept from the file), "
                f"or null for all; got {self.limit!r}"
            )
        if self.domain not in PROMPT_DOMAINS:
            raise ValueError(
                f"jsonl source: domain must be one of {PROMPT_DOMAINS}, got {self.domain!r}"
            )

    @property
    def stem(self) -> str:
        """The file name without ``.jsonl``/``.jsonl.gz``: the prefix of its prompt ids."""
        name = Path(self.path).name
        return name[: -len(".jsonl.gz")] if name.endswith(".gz") else name[: -len(".jsonl")]


DataSource = BuiltinSource | JsonlSource
_SOURCE_KINDS: dict[str, type] = {"builtin": BuiltinSource, "jsonl": JsonlSource}


def _source(i: int, entry: object) -> BuiltinSource | JsonlSource:
    """``data.sources[i]`` as its struct; unknown kinds and keys are refused by name."""
    where = f"data.sources[{i}]"
    if isinstance(entry, BuiltinSource | JsonlSource):
        return entry
    if not isinstance(entry, Mapping) or entry.get("kind") not in _SOURCE_KINDS:
        raise ValueError(
            f"{where} must be a mapping with kind one of {sorted(_SOURCE_KINDS)} "
            f"(e.g. {{kind: jsonl, path: data/chats.jsonl}}), got {entry!r}"
        )
    klass = _SOURCE_KINDS[entry["kind"]]
    known = {f.name for f in dataclasses.fields(klass)}
    bad = sorted(set(entry) - known)
    if bad:
        raise ValueError(
            f"unknown keys {[f'{where}.{b}' for b in bad]}; allowed for kind "
            f"{entry['kind']!r}: {sorted(known)}"
        )
    try:
        return klass(**entry)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


@dataclass(frozen=True)
class DataConfig:
    """Prompt sources and generation settings; ``dir`` is shared by drafters on the same data.

    ``sources`` lists where prompts come from, in order (their prompts are interleaved):
    the built-in mix (default, sized by ``num_math`` / ``num_code`` / ``num_chat``) and/or
    chat JSONL files. ``chat_template_kwargs`` go to the tokenizer's ``apply_chat_template``
    (e.g. ``{enable_thinking: false}`` for Qwen3); ``mask_token_id`` overrides the detected
    drafter mask token (None: the tokenizer's mask token or a known unused special token).
    ``hidden_states``: ``cache`` (the data stage writes a bfloat16 hidden-state cache that
    the train stage reads, from a Hugging Face forward of the target), ``sglang`` (the
    same cache, captured by SGLang's engine in the regeneration pass itself, sharded as
    ``data.sglang_args.tp_size`` says; ``training/capture_sglang.py``) or ``online`` (no
    cache: the train stage runs the frozen target on every batch; ``training/online.py``).
    """

    dir: str = "runs/data/smollm2"
    num_math: int = 512
    num_code: int = 256
    num_chat: int = 256
    sources: tuple[DataSource, ...] = (BuiltinSource(),)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    mask_token_id: int | None = None
    max_prompt_tokens: int = 256
    max_new_tokens: int = 256
    gen_batch_size: int = 16
    hidden_batch_size: int = 8
    seed: int = 0
    # Precision of the *sampling* pass only. bfloat16 (AMX on these Xeons) sampled 1.6x
    # faster (benchmarks/training_precision.py); hidden states are always cached from the
    # float32 target, which is what the drafter is conditioned on at serve time.
    gen_dtype: str = "float32"
    # The sampling temperature of the regenerated responses: 1 (the method's default)
    # teaches the target's whole distribution; 0 regenerates the target's greedy
    # continuations, for a drafter that serves greedy requests only.
    temperature: float = 1.0
    hidden_states: HiddenStatesMode = "cache"
    # Who samples the responses (GENERATORS): "hf" (HF generate here), "sglang" (SGLang's
    # Engine in this process, on run.device) or "openai" (running SGLang servers at
    # generator_urls). The on-disk data is the same for all three.
    generator: str = "hf"
    # Base URLs of running SGLang servers (generator "openai"), e.g. http://10.0.0.5:30000;
    # requests are spread over them.
    generator_urls: tuple[str, ...] = ()
    # Requests in flight at once (generators "sglang" and "openai"), over all servers.
    max_in_flight: int = 64
    # Extra sglang.Engine arguments (generator "sglang"), e.g. {mem_fraction_static: 0.5,
    # enable_deterministic_inference: true} on a GPU.
    sglang_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.dir, str) or not self.dir:
            raise ValueError(f"data.dir must be a non-empty path, got {self.dir!r}")
        if self.hidden_states not in get_args(HiddenStatesMode):
            raise ValueError(
                f"data.hidden_states must be 'cache' (the data stage caches the target's "
                "hidden states, the train stage reads them), 'sglang' (the same cache, "
                "captured by SGLang in the regeneration pass) or 'online' (the train stage "
                f"runs the target on every batch, nothing cached), got {self.hidden_states!r}"
            )
        for name in ("num_math", "num_code", "num_chat"):
            check_int("data", name, getattr(self, name), lo=0)
        self._check_sources()
        kwargs = self.chat_template_kwargs
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(
                "data.chat_template_kwargs must be a mapping of template variables "
                f"(e.g. {{enable_thinking: false}}), got {kwargs!r}"
            )
        reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(
                f"data.chat_template_kwargs sets {reserved}: the data stage sets these itself; "
                "keep only template variables (e.g. enable_thinking)"
            )
        object.__setattr__(self, "chat_template_kwargs", dict(kwargs))
        if self.mask_token_id is not None:
            check_int("data", "mask_token_id", self.mask_token_id, lo=0)
        for name in ("max_prompt_tokens", "max_new_tokens", "gen_batch_size", "hidden_batch_size"):
            check_int("data", name, getattr(self, name))
        check_int("data", "seed", self.seed, lo=0)
        if self.gen_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"data.gen_dtype must be one of {COMPUTE_DTYPES}, got {self.gen_dtype!r}"
            )
        check_data_temperature(self.temperature)
        self._check_generator()

    def _check_generator(self) -> None:
        if self.generator not in GENERATORS:
            raise ValueError(
                f"data.generator must be one of {GENERATORS} (hf: HF generate here, sglang: "
                f"SGLang's Engine here, openai: running SGLang servers), got {self.generator!r}"
            )
        check_int("data", "max_in_flight", self.max_in_flight)
        urls = self.generator_urls
        if isinstance(urls, str) or not isinstance(urls, list | tuple):
            raise ValueError(
                "data.generator_urls must be a list of server base URLs "
                f"(e.g. [http://127.0.0.1:30000]), got {urls!r}"
            )
        bad = [u for u in urls if not isinstance(u, str) or not _URL_RE.fullmatch(u)]
        if bad:
            raise ValueError(
                f"data.generator_urls has entries that are not http(s) base URLs: {bad}; "
                "write each as http://HOST:PORT"
            )
        urls = tuple(u.rstrip("/") for u in urls)
        if len(set(urls)) != len(urls):
            raise ValueError(f"data.generator_urls lists a server twice: {list(urls)}")
        object.__setattr__(self, "generator_urls", urls)
        if self.generator == "openai" and not urls:
            raise ValueError(
                "data.generator 'openai' needs data.generator_urls: the base URLs of running "
                "SGLang servers (e.g. [http://127.0.0.1:30000])"
            )
        if self.generator != "openai" and urls:
            raise ValueError(
                f"data.generator_urls is set but data.generator is {self.generator!r}; "
                "set data.generator: openai to use the servers, or drop generator_urls"
            )
        args = self.sglang_args
        if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
            raise ValueError(
                "data.sglang_args must be a mapping of sglang.Engine arguments "
                f"(e.g. {{mem_fraction_static: 0.5}}), got {args!r}"
            )
        reserved = sorted(set(args) & RESERVED_SGLANG_ARGS)
        if reserved:
            raise ValueError(
                f"data.sglang_args sets {reserved}: the data stage sets these from the "
                "target, run.device, data.gen_dtype and data.seed; change those instead"
            )
        if args and self.generator != "sglang":
            raise ValueError(
                f"data.sglang_args is set but data.generator is {self.generator!r}; it "
                "configures the in-process engine: set data.generator: sglang, or drop it"
            )
        object.__setattr__(self, "sglang_args", dict(args))
        if self.hidden_states == "sglang":
            if self.generator != "sglang":
                raise ValueError(
                    "data.hidden_states 'sglang' captures the hidden states in SGLang's "
                    f"regeneration pass, but data.generator is {self.generator!r}: set "
                    "data.generator: sglang (shard a big target with data.sglang_args.tp_size)"
                )
            clash = sorted(set(args) & CAPTURE_SGLANG_ARGS)
            if clash:
                raise ValueError(
                    f"data.sglang_args sets {clash}: data.hidden_states 'sglang' sets these "
                    "itself (a capture engine at target.layer_ids); drop them"
                )

    def _check_sources(self) -> None:
        raw = self.sources
        if isinstance(raw, str | Mapping) or not isinstance(raw, list | tuple) or not raw:
            raise ValueError(
                "data.sources must be a non-empty list of {kind: builtin} and "
                f"{{kind: jsonl, path: ...}} entries, got {raw!r}"
            )
        sources = tuple(_source(i, s) for i, s in enumerate(raw))
        object.__setattr__(self, "sources", sources)
        builtins = [i for i, s in enumerate(sources) if isinstance(s, BuiltinSource)]
        if len(builtins) > 1:
            raise ValueError(
                f"data.sources{builtins} are all kind builtin: list the built-in mix once "
                "(its num_math / num_code / num_chat set its size)"
            )
        for i in builtins:
            src = sources[i]
            assert isinstance(src, BuiltinSource)
            if sum(src.counts(self)) == 0:
                raise ValueError(
                    f"data.sources[{i}] (builtin) has no prompts: num_math + num_code + "
                    "num_chat must be > 0, or drop the builtin entry to use only your files"
                )
        stems: dict[str, int] = {}
        for i, s in enumerate(sources):
            if isinstance(s, JsonlSource):
                if s.stem in stems:
                    raise ValueError(
                        f"data.sources[{stems[s.stem]}] and data.sources[{i}] have the same "
                        f"file name {s.stem!r}: prompt ids start with it, so rename one file"
                    )
                stems[s.stem] = i

    def builtin_source(self) -> BuiltinSource | None:
        return next((s for s in self.sources if isinstance(s, BuiltinSource)), None)

    def resolve_paths(self, res: Any) -> DataConfig:
        """A copy with ``dir`` and every file source's ``path`` passed through ``res``."""
        sources = tuple(
            dataclasses.replace(s, path=res(s.path)) if isinstance(s, JsonlSource) else s
            for s in self.sources
        )
        return dataclasses.replace(self, dir=res(self.dir), sources=sources)
