"""Training run configuration: one YAML file -> one validated, frozen ``TrainConfig``.

Why a strict schema: a typo in a config key (``warmup_step``) that is silently
ignored costs a 2-hour CPU run. Every section is a frozen dataclass that
validates its own fields; unknown keys anywhere are refused with the allowed
names listed. Relative paths in the file are resolved against the repository
root (the parent of ``configs/``) so a run behaves the same from any cwd.

Why ``base:``: an ablation or scale-up is only readable as "the recipe, with
this changed". A config may name another config file (``base: x.yaml``,
relative to its own folder); its mappings are merged key by key over the
base's, so the file holds exactly the knobs it changes. It must still set its
own ``name`` and ``run.out_dir``, or two runs would share one checkpoint folder.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from dspark_sglang.training.anchors import AnchorConfig
from dspark_sglang.training.losses import LossConfig

DrafterKind = Literal["dspark", "dflash", "eagle3"]
HiddenStatesMode = Literal["cache", "online"]


def _positive_int(section: str, name: str, value: object, lo: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{section}.{name} must be an integer >= {lo}, got {value!r}")


def _number(section: str, name: str, value: object, lo: float = 0.0, hi: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ValueError(f"{section}.{name} must be a number in [{lo}, {hi}], got {value!r}")


def check_data_temperature(value: object) -> None:
    """``data.temperature``: a number >= 0 (bools and NaN refused). Checked by the config
    and again by ``datagen.GenerationSettings``, which can be built without one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(
            f"data.temperature must be >= 0 (1: sample the target's distribution, as in "
            f"the paper; 0: its greedy continuation), got {value!r}"
        )


COMPUTE_DTYPES = ("float32", "bfloat16")
TARGET_DTYPES = ("float32", "bfloat16", "float16")
#: Who regenerates the responses: HF ``generate`` in this process, SGLang's ``Engine`` in
#: this process, or already-running SGLang servers over their HTTP API.
GENERATORS = ("hf", "sglang", "openai")
#: How several training processes (torchrun) share the drafter: ``ddp`` replicates it on
#: every rank, ``fsdp`` shards its trainable weights, gradients and optimizer state.
PARALLEL_MODES = ("ddp", "fsdp")
#: SGLang ``Engine`` arguments the data stage sets itself (from run.device, data.gen_dtype,
#: the target and data.seed): refused in data.sglang_args.
RESERVED_SGLANG_ARGS = frozenset(
    {"model_path", "tokenizer_path", "device", "base_gpu_id", "dtype", "random_seed"}
)
_URL_RE = re.compile(r"https?://[^\s/]+(/[^\s]*)?")
_DEVICE_RE = re.compile(r"cpu|cuda(:[0-9]+)?")


@dataclass(frozen=True)
class TargetConfig:
    """Which target, and which of its layers feed the drafter (None: the drafter default)."""

    name: str = "smollm2"
    layer_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"target.name must be 'smollm2' or a path to an HF model folder, got {self.name!r}"
            )
        if self.layer_ids is not None:
            ids = tuple(self.layer_ids)
            if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"target.layer_ids must be a list of ints >= 0, got {ids!r}")
            object.__setattr__(self, "layer_ids", ids)


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
    the train stage reads) or ``online`` (no cache: the train stage runs the frozen target
    on every batch; ``training/online.py``).
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
                "hidden states, the train stage reads them) or 'online' (the train stage "
                f"runs the target on every batch, nothing cached), got {self.hidden_states!r}"
            )
        for name in ("num_math", "num_code", "num_chat"):
            _positive_int("data", name, getattr(self, name), lo=0)
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
            _positive_int("data", "mask_token_id", self.mask_token_id, lo=0)
        for name in ("max_prompt_tokens", "max_new_tokens", "gen_batch_size", "hidden_batch_size"):
            _positive_int("data", name, getattr(self, name))
        _positive_int("data", "seed", self.seed, lo=0)
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
        _positive_int("data", "max_in_flight", self.max_in_flight)
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


@dataclass(frozen=True)
class DrafterSection:
    """Drafter kind, block size, and architecture overrides for its config class."""

    kind: DrafterKind = "dspark"
    block_size: int = 7
    model: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in get_args(DrafterKind):
            raise ValueError(
                f"drafter.kind must be one of {get_args(DrafterKind)}, got {self.kind!r}"
            )
        _positive_int("drafter", "block_size", self.block_size)
        if not isinstance(self.model, Mapping):
            raise ValueError(f"drafter.model must be a mapping of overrides, got {self.model!r}")
        for banned in ("block_size", "target_layer_ids"):
            if banned in self.model:
                raise ValueError(
                    f"drafter.model.{banned} is set elsewhere: use drafter.block_size / "
                    "target.layer_ids so all drafters and the data cache agree"
                )
        if "greedy_draft_vocab_size" in self.model:
            raise ValueError(
                "drafter.model.greedy_draft_vocab_size is not a training setting: the greedy "
                "map is added when shipping, with export-drafter --greedy-draft-vocab-size K "
                "--draft-vocab-data DIR; drop it from drafter.model"
            )
        if self.kind == "dflash" and self.model.get("markov_head_type", "none") != "none":
            raise ValueError(
                "drafter.kind 'dflash' is the parallel drafter without a sequential head; "
                "drop drafter.model.markov_head_type or use kind 'dspark'"
            )


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 50
    max_steps: int = 2000
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    aux_loss_weight: float = 0.01
    # The Markov head is a low-rank token-transition table: each row only learns when
    # its token occurs, so it lags the backbone at the backbone's rate.
    markov_lr_scale: float = 1.0

    def __post_init__(self) -> None:
        _number("optim", "lr", self.lr, lo=1e-12, hi=1.0)
        _number("optim", "markov_lr_scale", self.markov_lr_scale, lo=1e-6, hi=1000.0)
        _number("optim", "weight_decay", self.weight_decay)
        _number("optim", "beta1", self.beta1, hi=0.99999)
        _number("optim", "beta2", self.beta2, hi=0.99999)
        _positive_int("optim", "warmup_steps", self.warmup_steps, lo=0)
        _positive_int("optim", "max_steps", self.max_steps)
        _number("optim", "min_lr_ratio", self.min_lr_ratio, hi=1.0)
        _number("optim", "grad_clip", self.grad_clip, lo=1e-9)
        _number("optim", "aux_loss_weight", self.aux_loss_weight)


@dataclass(frozen=True)
class RunConfig:
    """Where outputs go and how often; ``threads`` is explicit (shared CPUs)."""

    out_dir: str = "runs/train/dspark_smollm2"
    checkpoint_every: int = 250
    keep_checkpoints: int = 2
    log_every: int = 10
    threads: int = 2
    seed: int = 0
    # Continue another run (its out_dir, or one of its checkpoints/step-N): weights, optimizer
    # moments and step count carry over, the LR schedule and the data are this config's.
    init_from: str | None = None
    # Mixed precision for the drafter's forward: bfloat16 runs its matmuls (most of all the
    # full-vocabulary LM head) on AMX; weights, optimizer state and the loss stay float32.
    # It applies on run.device's type (CPU autocast or CUDA autocast).
    autocast: str = "float32"
    # Where the target, the drafter and every training tensor live: cpu, cuda or cuda:N.
    # Under torchrun with several processes, "cuda" means each process's cuda:LOCAL_RANK.
    device: str = "cpu"
    # Precision the target is loaded in (its frozen embedding / LM head are shared with the
    # drafter; the trainer keeps a float32 copy of them unless run.autocast is set).
    target_dtype: str = "float32"
    # Batches prepared ahead of the training step by a background thread (0: none). The
    # batches and their order do not depend on it.
    prefetch: int = 2
    # Several processes (torchrun): "ddp" keeps a full drafter, its gradients and AdamW
    # state on every rank; "fsdp" (FSDP2) shards them over the ranks (a drafter too big to
    # replicate). Same loss, same checkpoints; one process ignores it.
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError(f"run.out_dir must be a non-empty path, got {self.out_dir!r}")
        if self.init_from is not None and (
            not isinstance(self.init_from, str) or not self.init_from
        ):
            raise ValueError(
                "run.init_from must be a run directory or checkpoint path, got "
                f"{self.init_from!r}; omit it to start from random weights"
            )
        for name in ("checkpoint_every", "keep_checkpoints", "log_every", "threads"):
            _positive_int("run", name, getattr(self, name))
        _positive_int("run", "seed", self.seed, lo=0)
        if self.autocast not in COMPUTE_DTYPES:
            raise ValueError(
                f"run.autocast must be one of {COMPUTE_DTYPES} (float32 = no autocast), "
                f"got {self.autocast!r}"
            )
        if not isinstance(self.device, str) or not _DEVICE_RE.fullmatch(self.device):
            raise ValueError(
                f"run.device must be 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got {self.device!r}"
            )
        if self.target_dtype not in TARGET_DTYPES:
            raise ValueError(
                f"run.target_dtype must be one of {TARGET_DTYPES}, got {self.target_dtype!r}"
            )
        _positive_int("run", "prefetch", self.prefetch, lo=0)
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(
                f"run.parallel must be one of {PARALLEL_MODES} (ddp: a full drafter per "
                f"process, fsdp: the drafter sharded over the processes), got {self.parallel!r}"
            )


_SECTIONS: dict[str, type] = {
    "target": TargetConfig,
    "data": DataConfig,
    "drafter": DrafterSection,
    "anchors": AnchorConfig,
    "loss": LossConfig,
    "optim": OptimConfig,
    "run": RunConfig,
}


@dataclass(frozen=True)
class TrainConfig:
    name: str
    target: TargetConfig
    data: DataConfig
    drafter: DrafterSection
    anchors: AnchorConfig
    loss: LossConfig
    optim: OptimConfig
    run: RunConfig

    def __post_init__(self) -> None:
        if self.anchors.block_size != self.drafter.block_size:
            raise ValueError(
                f"anchors.block_size ({self.anchors.block_size}) must equal drafter.block_size "
                f"({self.drafter.block_size}); set only drafter.block_size"
            )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], base_dir: Path | None = None) -> TrainConfig:
        """Validate a parsed YAML mapping; relative paths resolve against ``base_dir``."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a training config must be a YAML mapping, got {type(raw).__name__}")
        allowed = {"name", *_SECTIONS}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ValueError(f"unknown top-level config keys {unknown}; allowed: {sorted(allowed)}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("config needs a non-empty 'name' (used in logs and plots)")
        sections: dict[str, Any] = {}
        for key, klass in _SECTIONS.items():
            body = raw.get(key) or {}
            if not isinstance(body, Mapping):
                raise ValueError(f"config section '{key}' must be a mapping, got {body!r}")
            body = dict(body)
            if key == "anchors":
                if "block_size" in body:
                    raise ValueError("anchors.block_size is derived; set drafter.block_size")
                body["block_size"] = (raw.get("drafter") or {}).get("block_size", 7)
            known = {f.name for f in dataclasses.fields(klass)}
            bad = sorted(set(body) - known)
            if bad:
                raise ValueError(
                    f"unknown keys {[f'{key}.{b}' for b in bad]}; allowed in '{key}': "
                    f"{sorted(known - {'block_size'} if key == 'anchors' else known)}"
                )
            if key == "target" and body.get("layer_ids") is not None:
                body["layer_ids"] = tuple(body["layer_ids"])
            sections[key] = klass(**body)
        cfg = cls(name=name, **sections)
        if base_dir is not None:
            cfg = cfg.resolve_paths(base_dir)
        return cfg

    def resolve_paths(self, base_dir: Path) -> TrainConfig:
        def res(p: str) -> str:
            return str(p if Path(p).is_absolute() else (base_dir / p).resolve())

        return dataclasses.replace(
            self,
            data=self.data.resolve_paths(res),
            run=dataclasses.replace(
                self.run,
                out_dir=res(self.run.out_dir),
                init_from=None if self.run.init_from is None else res(self.run.init_from),
            ),
        )

    def with_overrides(self, **sections: Mapping[str, Any]) -> TrainConfig:
        """A copy with some fields of some sections replaced (CLI flags, tests)."""
        out = self
        for key, values in sections.items():
            out = dataclasses.replace(
                out, **{key: dataclasses.replace(getattr(out, key), **values)}
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["drafter"]["model"] = dict(self.drafter.model)
        return d


BASE_KEY = "base"
"""Top-level key naming the config file this one changes (see the module docstring)."""


def merge_config(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` over ``base``: mappings merge key by key, anything else replaces.

    Invariant: every key of either input is in the result, and a value from
    ``changes`` wins wherever both hold a non-mapping (lists replace whole).
    """
    out = dict(base)
    for key, value in changes.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            out[key] = merge_config(old, value)
        else:
            out[key] = value
    return out


def _read_raw(path: Path, seen: tuple[Path, ...] = ()) -> Any:
    """The YAML mapping of ``path`` with its ``base`` chain merged in (base first)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, Mapping) or BASE_KEY not in raw:
        return raw
    raw = dict(raw)
    parent = raw.pop(BASE_KEY)
    if not isinstance(parent, str) or not parent.strip():
        raise ValueError(
            f"{path}: '{BASE_KEY}' must be the path of another config YAML, relative to "
            f"{path.parent}; got {parent!r}"
        )
    parent_path = (path.parent / parent).resolve()
    chain = (*seen, path.resolve())
    if parent_path in chain:
        loop = " -> ".join(p.name for p in (*chain, parent_path))
        raise ValueError(f"{path}: '{BASE_KEY}' chain loops ({loop}); point it at the recipe")
    if not parent_path.is_file():
        raise ValueError(
            f"{path}: '{BASE_KEY}: {parent}' not found (looked for {parent_path}); "
            f"give a path relative to {path.parent}"
        )
    run = raw.get("run")
    out_dir = run.get("out_dir") if isinstance(run, Mapping) else None
    if not raw.get("name") or not out_dir:
        raise ValueError(
            f"{path}: a config with '{BASE_KEY}' must set its own 'name' and 'run.out_dir' "
            "(inherited ones would make two runs share one checkpoint folder)"
        )
    base_raw = _read_raw(parent_path, chain)
    if not isinstance(base_raw, Mapping):
        raise ValueError(f"{parent_path} (the '{BASE_KEY}' of {path}) is not a YAML mapping")
    return merge_config(base_raw, raw)


def load_config(path: str | Path) -> TrainConfig:
    """Parse and validate a YAML training config (paths relative to the repo root)."""
    path = Path(path)
    raw = _read_raw(path)
    base = path.resolve().parent
    # Configs may live in subfolders (configs/ablations/): the root is above ``configs/``.
    configs_dir = next((d for d in (base, *base.parents) if d.name == "configs"), None)
    if configs_dir is not None:
        base = configs_dir.parent
    try:
        return TrainConfig.from_dict(raw, base_dir=base)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
