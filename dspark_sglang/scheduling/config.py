"""Per-SLA scheduler configuration shared by the SGLang worker and the Helm chart.

One deployment serves one latency target (SLA); the chart renders this struct
into a YAML/JSON file the worker loads with ``SchedulerConfig.load``. Keeping the
schema in one typed, frozen struct means a typo in a values file fails at load
time with a message naming the key, instead of silently falling back to a
default policy in production.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self, get_args

import msgspec
import yaml

__all__ = [
    "DEFAULT_COPY_CONFIDENCE",
    "DEFAULT_PROBE_EVERY",
    "NEEDS_COST_TABLE",
    "POLICIES",
    "RAGGED_VERIFY_MODES",
    "ConfigError",
    "DraftDecision",
    "Policy",
    "RaggedVerifyMode",
    "SchedulerConfig",
    "check_ngram",
    "num_draft_tokens",
]

Policy = Literal["prefix", "lagged", "static", "mtp1", "verify_all", "none"]
RaggedVerifyMode = Literal["static", "cap-accept", "compact"]
DraftDecision = Literal["always", "priced"]
DEFAULT_PROBE_EVERY = 8
"""``probe_every`` when unset: plain steps in a row before a step drafts again."""
RAGGED_VERIFY_MODES: tuple[str, ...] = get_args(RaggedVerifyMode)
POLICIES: tuple[str, ...] = get_args(Policy)
MAX_BLOCK_SIZE = 16
NEEDS_COST_TABLE: tuple[str, ...] = ("prefix", "lagged")
"""Policies that rank drafts against an SPS cost table (``cost_table_path`` required)."""
DEFAULT_COPY_CONFIDENCE = 0.65
"""Confidence of a context-copied draft when ``copy_confidence`` is unset: about the
share of 2-gram copies SmolLM2 accepts at temperature 0 on the three eval sets;
``bench acceptance --context-copy`` prints that share for any target."""
_SLA_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def num_draft_tokens(block_size: int) -> int:
    """SGLang's ``--speculative-num-draft-tokens`` for a drafter block: block plus anchor."""
    return block_size + 1


class ConfigError(ValueError):
    """A scheduler configuration is malformed."""


class _DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(
            f"duplicate key {key!r} on line {line} (first on line {first}); YAML would keep "
            "the last silently, so keep only the value you mean"
        )


class _UniqueKeyLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a mapping key given twice (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<`` merges are meant to be overridden
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKeyError(key, line, seen[key])
            except TypeError:
                continue  # unhashable: SafeLoader's own error follows
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_ngram(ngram: object, where: str) -> int:
    """A context-copy n-gram (``context_copy_ngram``) as an int >= 0 (0 = no copies), or a
    ValueError naming ``where``: the one check of the setting (this config, the reference
    generator, the ``--context-copy`` flags)."""
    if not _is_int(ngram) or ngram < 0:  # type: ignore[operator]
        raise ValueError(
            f"{where} must be an integer >= 0 (0 turns context copies off; 2 or 3 match "
            f"that many trailing tokens), got {ngram!r}"
        )
    return int(ngram)  # type: ignore[call-overload]


def _opt_path(name: str, v: Any) -> None:
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise ConfigError(f"{name} must be a non-empty path string or omitted, got {v!r}")


class SchedulerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How many draft tokens per request the target verifies each step, for one SLA.

    Fields (YAML/JSON keys are the field names):

    ``sla_name`` (str, default ``"default"``)
        Name of the latency target this config serves; an RFC 1123 label
        (lowercase alphanumerics and ``-``, at most 63 characters) because the
        Helm chart uses it in resource names.
    ``policy`` (str, default ``"lagged"``)
        ``prefix``: Algorithm 1, greedy admission by survival with early stop,
        on current confidences. ``lagged``: production variant; the total verify
        budget comes from confidences ``lag_steps`` steps old (global argmax over
        the cost staircase), current confidences only rank candidates.
        ``static``: every request verifies ``static_k`` drafts. ``mtp1``: every
        request verifies 1 draft (the MTP-1 baseline). ``verify_all``: every
        request verifies the whole block. ``none``: no speculation (0 drafts).
    ``block_size`` (int, 1..16, required)
        Draft tokens proposed per request per step (``B``); upper bound on any
        per-request verify length.
    ``static_k`` (int, 1..block_size)
        Drafts verified per request; required by and only allowed with ``static``.
    ``lag_steps`` (int >= 1, default 2)
        Age in steps of the confidences that set the ``lagged`` budget. The lag
        is the causal barrier that keeps the choice non-anticipating (lossless);
        0 is rejected for that reason.
    ``max_verify_tokens`` (int >= 1, optional)
        Per-step cap on total verify tokens (anchors plus drafts) over the
        batch, e.g. the largest CUDA-graph bucket. Unset: the cost table's limit.
    ``cost_table_path`` (str, optional)
        SGLang SPS cost-table JSON (``SpsCostTable`` or ``SpsAdditiveCostTable``)
        for ``prefix`` and ``lagged``. Used as given (a path in the serving
        container), not resolved against the config file. Production tables come
        from the fleet profiler (``dspark_sglang/profiling``).
    ``startup_profile`` (bool, optional)
        Without ``cost_table_path``: measure a small SPS staircase of the target
        when the SGLang worker starts and schedule with it
        (``sglang_integration/startup_profile.py``). Unset means on exactly when
        the policy needs a table (``prefix``, ``lagged``) and none is named;
        ``false`` keeps the requirement that such a policy names a table;
        ``true`` also profiles for policies that need none (the table is then
        only logged and written out). Not allowed together with ``cost_table_path``.
    ``sts_path`` (str, optional)
        SGLang STS calibration JSON (``DSparkStsCalibration``); without it raw
        confidences ``sigmoid(z)`` are used.
    ``greedy_only`` (bool, default false)
        Serve only greedy requests (temperature 0, or top_k 1): the server
        refuses sampled requests with HTTP 400 naming this setting
        (``sglang_integration.requests``), so such a tier never runs rejection
        sampling. It also turns on SGLang's argmax draft
        (``SGLANG_DSPARK_USE_GREEDY_DRAFT``, see ``greedy_draft``).
    ``ragged_mode`` (``compact`` or ``cap-accept``, optional; not with ``verify_all``)
        How SGLang runs a verify of per-request lengths
        (``SGLANG_RAGGED_VERIFY_MODE``, :attr:`ragged_verify_mode`). ``compact``
        (unset) verifies only the chosen drafts, so a shorter verify is a cheaper
        one, which is what a policy that picks per-request lengths is for: on a CPU
        engine the verify is laid out as exactly those lengths; with CUDA graphs they
        are trimmed to the token tier SGLang captured for the step
        (``sglang_integration.verify_tier``). ``cap-accept`` is an opt-in that
        verifies every request's whole block and only caps acceptance at the chosen
        length: the verify costs the same whatever the policy chose, and the worker
        logs a warning saying so at start-up (``launch.ragged_mode_note``).
        ``verify_all`` always runs SGLang's ``static`` mode.
    ``draft_step_seconds`` (float >= 0, seconds, optional; ``prefix`` and ``lagged`` only)
        Time of one speculative step outside the target's forward (the draft
        pass), added to the cost table's step time at every batch size
        (``cost_table.with_fixed_step_cost``): the table profiles the target
        alone, but every speculative step pays the draft too, whatever the
        policy then verifies. A number is used as is; ``0`` keeps the
        target-only model, and nothing is timed. Unset: on a CPU worker the SGLang
        worker times each decode round and the target's verify in it
        (``scheduler_bridge.VerifyDecider.observe_round``) and, once a round shape
        is measured, prices rounds as the measured verify plus the rest of the
        round over the table (``round_costs.RoundCosts``); on a GPU worker
        nothing is timed (that would synchronise the device every step) and the
        target-only table is used, so set it from a profile there. Refused for
        policies that use no cost table (nothing would read it).
    ``context_copy_ngram`` (int >= 0, default 0)
        Context copies (``model/context_copy.py``): where the last ``n`` tokens of a
        request (its text, the anchor and the earlier drafts) occurred before in its
        text, the draft is the token that followed them then instead of the
        drafter's. Lossless (a copy's draft distribution is one-hot on it); it pays
        where replies repeat their prompt or themselves (code, arithmetic). 0 turns
        it off; 2 or 3 are the useful values. Refused with policy ``none`` (no draft is verified).
    ``draft_decision`` (``always`` or ``priced``, default ``always``; ``prefix`` and
    ``lagged`` only)
        ``always`` runs the draft pass every step. ``priced`` decides per step, before
        drafting, whether a drafting round is worth more tokens per second than a plain
        decode step (``scheduling/draft_decision.py``): each request's confidences from
        its last drafting round, priced by the policy's cost model, against the plain
        step's measured cost. A step that does not draft runs no draft pass and verifies
        only the anchors. Lossless: decided from earlier rounds only.
    ``probe_every`` (int >= 1, optional; with ``draft_decision: priced`` only)
        After this many plain steps in a row the next step drafts (a probe) to refresh
        the evidence; a probe that leaves the batch plain doubles the gap (up to 8 times
        this). Unset: :data:`DEFAULT_PROBE_EVERY`.
    ``copy_confidence`` (float in (0, 1), optional; with ``context_copy_ngram`` and
    policies ``prefix`` / ``lagged`` only)
        The confidence the policy sees for a copied draft (the drafter's head scored
        the token the copy replaced). Unset: :data:`DEFAULT_COPY_CONFIDENCE`; ``bench
        acceptance --context-copy N`` prints the share of copies your target accepts.

    Admission (``--max-running-requests``) and the per-user speed target are
    SGLang server arguments and alert thresholds, not scheduler settings; the
    chart renders them from the same tier values.
    """

    block_size: int
    policy: Policy = "lagged"
    sla_name: str = "default"
    static_k: int | None = None
    lag_steps: int = 2
    max_verify_tokens: int | None = None
    cost_table_path: str | None = None
    sts_path: str | None = None
    greedy_only: bool = False
    startup_profile: bool | None = None
    draft_step_seconds: float | None = None
    ragged_mode: RaggedVerifyMode | None = None
    context_copy_ngram: int = 0
    copy_confidence: float | None = None
    draft_decision: DraftDecision = "always"
    probe_every: int | None = None

    def __post_init__(self) -> None:
        # Types are re-checked here because direct construction bypasses msgspec's decoder.
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {list(POLICIES)}, got {self.policy!r}")
        if not isinstance(self.sla_name, str) or not _SLA_NAME.match(self.sla_name):
            raise ConfigError(
                f"sla_name must be an RFC 1123 label (lowercase letters, digits and '-', "
                f"starting and ending alphanumeric, <= 63 chars), got {self.sla_name!r}"
            )
        if not _is_int(self.block_size) or not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ConfigError(
                f"block_size must be an integer in 1..{MAX_BLOCK_SIZE}, got {self.block_size!r}"
            )
        if self.policy == "static":
            if self.static_k is None:
                raise ConfigError("policy 'static' needs static_k (drafts verified per request)")
            if not _is_int(self.static_k) or self.static_k < 1:
                raise ConfigError(f"static_k must be an integer >= 1, got {self.static_k!r}")
            if self.static_k > self.block_size:
                raise ConfigError(
                    f"static_k must be <= block_size ({self.static_k} > {self.block_size}); "
                    "lower static_k or raise block_size"
                )
        elif self.static_k is not None:
            raise ConfigError(
                f"static_k is only used by policy 'static' (policy is {self.policy!r}); "
                "remove static_k or set policy: static"
            )
        if not _is_int(self.lag_steps) or self.lag_steps < 1:
            raise ConfigError(
                f"lag_steps must be an integer >= 1, got {self.lag_steps!r} (the lag keeps the "
                "lagged budget non-anticipating; 0 would bias the output distribution)"
            )
        v = self.max_verify_tokens
        if v is not None and (not _is_int(v) or v < 1):
            raise ConfigError(f"max_verify_tokens must be an integer >= 1 or omitted, got {v!r}")
        _opt_path("cost_table_path", self.cost_table_path)
        _opt_path("sts_path", self.sts_path)
        sp = self.startup_profile
        if sp is not None and not isinstance(sp, bool):
            raise ConfigError(f"startup_profile must be true, false or omitted, got {sp!r}")
        if sp is True and self.cost_table_path is not None:
            raise ConfigError(
                "startup_profile: true measures a cost table at engine start, but "
                f"cost_table_path={self.cost_table_path!r} names one: remove one of the two"
            )
        if self.policy in NEEDS_COST_TABLE and self.cost_table_path is None and sp is False:
            others = "/".join(p for p in POLICIES if p not in NEEDS_COST_TABLE)
            raise ConfigError(
                f"policy {self.policy!r} needs cost_table_path (an SGLang SPS cost-table JSON) "
                "when startup_profile is false; profile one, drop startup_profile: false to "
                f"measure one at engine start, or choose policy {others}"
            )
        if not isinstance(self.greedy_only, bool):
            raise ConfigError(f"greedy_only must be true or false, got {self.greedy_only!r}")
        self._check_draft_step_seconds()
        self._check_ragged_mode()
        self._check_context_copy()
        self._check_draft_decision()

    def _check_draft_decision(self) -> None:
        d, p = self.draft_decision, self.probe_every
        if d not in get_args(DraftDecision):
            raise ConfigError(
                f"draft_decision must be one of {list(get_args(DraftDecision))}, got {d!r}"
            )
        if d == "priced" and self.policy not in NEEDS_COST_TABLE:
            raise ConfigError(
                f"draft_decision: priced prices drafting rounds with a cost table, which only "
                f"policies {list(NEEDS_COST_TABLE)} use (policy is {self.policy!r}); choose "
                "one of them or draft_decision: always"
            )
        if p is not None and d != "priced":
            raise ConfigError(
                "probe_every is read only with draft_decision: priced; remove probe_every or "
                "set draft_decision: priced"
            )
        if p is not None and (not _is_int(p) or p < 1):
            raise ConfigError(
                f"probe_every must be an integer >= 1 (plain steps in a row), got {p!r}"
            )

    @property
    def probe_every_value(self) -> int:
        """``probe_every``, or :data:`DEFAULT_PROBE_EVERY` when unset."""
        return DEFAULT_PROBE_EVERY if self.probe_every is None else int(self.probe_every)

    def _check_context_copy(self) -> None:
        try:
            n = check_ngram(self.context_copy_ngram, "context_copy_ngram")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if n and self.policy == "none":
            raise ConfigError(
                "context_copy_ngram with policy 'none': no draft is verified, so no copy "
                "would be; remove context_copy_ngram or choose another policy"
            )
        c = self.copy_confidence
        if c is None:
            return
        if not n:
            raise ConfigError(
                "copy_confidence is the confidence of context-copied drafts, and "
                "context_copy_ngram is 0 (no copies); set context_copy_ngram or remove "
                "copy_confidence"
            )
        if self.policy not in NEEDS_COST_TABLE:
            raise ConfigError(
                f"copy_confidence is only read by policies {list(NEEDS_COST_TABLE)}, which "
                f"rank drafts by confidence (policy is {self.policy!r}); remove copy_confidence"
            )
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not 0.0 < float(c) < 1.0:
            raise ConfigError(
                f"copy_confidence must be a probability strictly between 0 and 1 (the share "
                f"of copied drafts the target accepts), got {c!r}"
            )
        msgspec.structs.force_setattr(self, "copy_confidence", float(c))

    @property
    def copy_confidence_value(self) -> float:
        """``copy_confidence``, or :data:`DEFAULT_COPY_CONFIDENCE` when unset."""
        return DEFAULT_COPY_CONFIDENCE if self.copy_confidence is None else self.copy_confidence

    def _check_ragged_mode(self) -> None:
        mode = self.ragged_mode
        if mode is None:
            return
        if mode not in ("cap-accept", "compact"):
            raise ConfigError(
                f"ragged_mode must be 'cap-accept', 'compact' or omitted, got {mode!r} "
                "('static' is what policy verify_all runs, set by the policy itself)"
            )
        if self.policy == "verify_all":
            raise ConfigError(
                f"ragged_mode={mode!r} with policy 'verify_all': verify_all verifies the whole "
                "block in SGLang's static mode; remove ragged_mode or choose a policy that "
                "picks per-request lengths"
            )

    def _check_draft_step_seconds(self) -> None:
        d = self.draft_step_seconds
        if d is None:
            return
        if isinstance(d, bool) or not isinstance(d, numbers.Real):
            raise ConfigError(
                f"draft_step_seconds must be a number of seconds (e.g. 0.012) or omitted, got {d!r}"
            )
        if not math.isfinite(float(d)) or float(d) < 0.0:
            raise ConfigError(
                f"draft_step_seconds must be finite and >= 0 (seconds per speculative step "
                f"spent outside the target's forward; 0 for none), got {d!r}"
            )
        if self.policy not in NEEDS_COST_TABLE:
            raise ConfigError(
                f"draft_step_seconds is only used by policies {list(NEEDS_COST_TABLE)}, which "
                f"rank drafts against a cost table (policy is {self.policy!r}); remove "
                "draft_step_seconds or choose one of those policies"
            )
        msgspec.structs.force_setattr(self, "draft_step_seconds", float(d))

    @property
    def profiles_at_startup(self) -> bool:
        """Whether the SGLang worker measures this tier's cost table when it starts."""
        if self.cost_table_path is not None:
            return False
        # false with a policy that needs a table was refused at validation.
        return self.startup_profile is True or (
            self.startup_profile is None and self.policy in NEEDS_COST_TABLE
        )

    @property
    def num_draft_tokens(self) -> int:
        """SGLang's ``--speculative-num-draft-tokens``: the block plus the anchor."""
        return num_draft_tokens(self.block_size)

    @property
    def ragged_verify_mode(self) -> RaggedVerifyMode:
        """The ``SGLANG_RAGGED_VERIFY_MODE`` this policy needs.

        ``verify_all`` verifies the whole block, which is SGLang's ``static`` path;
        every other policy picks per-request lengths, which needs a ragged mode:
        the config's ``ragged_mode``, unset ``compact`` (verifies only the chosen
        tokens, so a shorter verify is a cheaper one); ``cap-accept`` verifies the
        whole block and caps acceptance at the chosen length. The Helm chart renders
        the same rule (``dspark.raggedVerifyMode``, from ``slaTiers[].scheduler.raggedMode``)
        and writes the mode into each tier's config.
        """
        if self.policy == "verify_all":
            return "static"
        return self.ragged_mode or "compact"

    @property
    def greedy_draft(self) -> bool:
        """Whether SGLang drafts by argmax (``SGLANG_DSPARK_USE_GREEDY_DRAFT``): ``greedy_only``.

        An argmax draft skips the drafter's sampling (no per-step noise, no kept
        ``[batch, block, vocab]`` step logits), which makes every round cheaper,
        and it stays lossless: greedy verify compares tokens only, and rejection
        sampling against a one-hot draft accepts at the target's probability of
        the drafted token. For sampled requests that is usually lower acceptance
        than a sampled draft, so it is on exactly for tiers that refuse them. The
        Helm chart renders the same rule (``dspark.greedyDraft``).
        """
        return self.greedy_only

    @property
    def max_verify_len(self) -> int:
        """Largest per-request draft count this policy can verify in one step."""
        return {"static": self.static_k or 0, "mtp1": 1, "none": 0}.get(
            self.policy, self.block_size
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "scheduler config") -> Self:
        """Validate a parsed mapping (e.g. Helm values) into a config."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
        allowed = cls.__struct_fields__
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise ConfigError(
                f"{source}: unknown key(s) {unknown}; allowed keys: {sorted(allowed)}"
            )
        policy = data.get("policy", "lagged")
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ConfigError(f"{source}: policy must be one of {list(POLICIES)}, got {policy!r}")
        try:
            return msgspec.convert(dict(data), type=cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read a YAML (or ``.json``) file; JSON strictly, YAML safely and without repeated keys."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read scheduler config {p}: {exc}") from exc
        try:
            if p.suffix == ".json":
                data = msgspec.json.decode(text)
            else:
                data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
        except _DuplicateKeyError as exc:
            raise ConfigError(f"{p}: {exc}") from exc
        except (msgspec.DecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{p}: cannot parse ({exc})") from exc
        if data is None:
            raise ConfigError(f"{p}: file is empty; it needs at least block_size")
        return cls.from_dict(data, source=str(p))

    def to_dict(self) -> dict[str, Any]:
        """Fields in declaration order; unset optional fields are left out."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def to_json(self) -> str:
        return msgspec.json.encode(self.to_dict()).decode("utf-8")

    def save(self, path: str | Path) -> None:
        """Write YAML, or JSON when ``path`` ends in ``.json`` (what ``load`` reads back)."""
        p = Path(path)
        p.write_text(self.to_json() if p.suffix == ".json" else self.to_yaml(), encoding="utf-8")
