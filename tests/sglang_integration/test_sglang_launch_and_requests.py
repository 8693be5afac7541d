"""Launch facts and front-door request checks, without an engine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dspark_sglang.scheduling.config import POLICIES, SchedulerConfig
from dspark_sglang.sglang_integration import launch, requests

DRAFTER = Path(launch.__file__).resolve().parents[1] / "assets" / "drafters" / "smollm2"


def _config(tmp_path: Path, **kw: object) -> str:
    path = tmp_path / f"scheduler-{len(list(tmp_path.iterdir()))}.yaml"
    SchedulerConfig(**{"block_size": 7, "policy": "mtp1", **kw}).save(path)  # type: ignore[arg-type]
    return str(path)


def test_draft_tokens_must_be_the_drafters_block_plus_one(tmp_path: Path) -> None:
    assert launch.drafter_block_size(DRAFTER) == 7
    launch.check_server_args(8, str(DRAFTER), {})
    launch.check_server_args(None, str(DRAFTER), {})  # SGLang derives it from the drafter
    with pytest.raises(launch.LaunchError, match=r"SGLang needs 8 .*blockSize: 7"):
        launch.check_server_args(7, str(DRAFTER), {})
    # A draft in SGLang's own dense format is SGLang's to check.
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(
        '{"architectures": ["DSparkDraftModel"], "model_type": "llama", "block_size": 4, '
        '"dspark_config": {"markov_rank": 8}}'
    )
    assert not launch.is_dspark_moe_drafter(dense) and launch.is_dspark_moe_drafter(DRAFTER)
    launch.check_server_args(7, str(dense), {})


def test_scheduler_config_must_fit_the_drafter_and_the_mode(tmp_path: Path) -> None:
    env = {launch.CONFIG_ENV: _config(tmp_path), launch.RAGGED_MODE_ENV: "compact"}
    launch.check_server_args(8, str(DRAFTER), env)
    with pytest.raises(launch.LaunchError, match="SGLANG_RAGGED_VERIFY_MODE is 'static'"):
        launch.check_server_args(8, str(DRAFTER), {**env, launch.RAGGED_MODE_ENV: "static"})
    with pytest.raises(launch.LaunchError, match="not one of"):
        launch.check_server_args(8, str(DRAFTER), {**env, launch.RAGGED_MODE_ENV: "ragged"})
    wrong = {**env, launch.CONFIG_ENV: _config(tmp_path, block_size=5)}
    with pytest.raises(launch.LaunchError, match=r"block_size=5 but the drafter proposes 7"):
        launch.check_server_args(8, str(DRAFTER), wrong)
    # verify_all runs under SGLang's static path; so does a server without our config.
    all_env = {launch.CONFIG_ENV: _config(tmp_path, policy="verify_all")}
    launch.check_server_args(8, str(DRAFTER), all_env)
    assert launch.scheduler_env(None) == {
        launch.RAGGED_MODE_ENV: "static",
        launch.GREEDY_DRAFT_ENV: "0",
    }
    assert launch.scheduler_env(env[launch.CONFIG_ENV])[launch.RAGGED_MODE_ENV] == "compact"
    # A config that names its ragged mode gets exactly that mode.
    for mode, other in (("compact", "cap-accept"), ("cap-accept", "compact")):
        named = _config(tmp_path, ragged_mode=mode)
        assert launch.scheduler_env(named)[launch.RAGGED_MODE_ENV] == mode
        launch.check_server_args(8, str(DRAFTER), launch.scheduler_env(named))
        with pytest.raises(launch.LaunchError, match=f"asks for ragged_mode='{mode}'"):
            launch.check_server_args(
                8, str(DRAFTER), {launch.CONFIG_ENV: named, launch.RAGGED_MODE_ENV: other}
            )


@pytest.mark.parametrize("policy", POLICIES)
def test_cap_accept_is_logged_as_saving_no_verify_compute(
    caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    """The check a worker runs on its config at start-up (``check_config``, from
    ``scheduler_bridge.load_decider``) logs one WARNING for a cap-accept verify of
    per-request lengths, asked for or not, saying a shorter verify saves nothing there and
    how to switch; a compact verify, and verify_all's static one, log nothing."""
    if policy == "verify_all":
        cases = [(None, "static", False)]
    else:
        cases = [
            ("cap-accept", "cap-accept", True),
            (None, "cap-accept", True),
            ("compact", "compact", False),
            (None, "compact", False),
        ]
    for ragged_mode, mode, warns in cases:
        cfg = SchedulerConfig(
            block_size=7,
            policy=policy,  # type: ignore[arg-type]
            static_k=3 if policy == "static" else None,
            ragged_mode=ragged_mode,  # type: ignore[arg-type]
        )
        caplog.clear()
        with caplog.at_level("WARNING", logger=launch.__name__):
            launch.check_config(cfg, "tier.yaml", 7, {launch.RAGGED_MODE_ENV: mode})
        records = [r for r in caplog.records if r.name == launch.__name__]
        if not warns:
            assert records == [], (ragged_mode, mode)
            continue
        (record,) = records
        line = record.getMessage()
        assert record.levelname == "WARNING"
        assert "cap-accept verifies every request's whole block and only caps acceptance" in line
        assert "a shorter verify saves no verify compute" in line
        assert "ragged_mode: compact" in line and "slaTiers[].scheduler.raggedMode: compact" in line


def test_argmax_draft_is_on_exactly_for_greedy_only_configs(tmp_path: Path) -> None:
    assert launch.GREEDY_DRAFT_ENV == "SGLANG_DSPARK_USE_GREEDY_DRAFT"
    sampled, greedy = _config(tmp_path), _config(tmp_path, greedy_only=True)
    assert launch.scheduler_env(sampled) == {
        launch.RAGGED_MODE_ENV: "compact",
        launch.GREEDY_DRAFT_ENV: "0",
        launch.CONFIG_ENV: sampled,
    }
    assert launch.scheduler_env(greedy)[launch.GREEDY_DRAFT_ENV] == "1"
    assert launch.scheduler_env(greedy, greedy_draft=True)[launch.GREEDY_DRAFT_ENV] == "1"
    # Without a config only the caller knows its requests are all greedy.
    assert launch.scheduler_env(None, greedy_draft=True)[launch.GREEDY_DRAFT_ENV] == "1"
    with pytest.raises(launch.LaunchError, match="has greedy_only: false"):
        launch.scheduler_env(sampled, greedy_draft=True)


@pytest.mark.parametrize(
    ("greedy_only", "value", "says"),
    [
        (False, None, None),
        (False, "0", None),
        (True, "1", None),
        (True, "true", None),
        (False, "1", "sampled requests usually accept fewer drafts"),
        (True, None, "the drafter samples drafts it does not need"),
        (True, "no", "the drafter samples drafts it does not need"),
    ],
)
def test_a_draft_switch_unlike_the_config_is_logged_not_refused(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    greedy_only: bool,
    value: str | None,
    says: str | None,
) -> None:
    env = {
        launch.CONFIG_ENV: _config(tmp_path, greedy_only=greedy_only),
        launch.RAGGED_MODE_ENV: "compact",
    }
    if value is not None:
        env[launch.GREEDY_DRAFT_ENV] = value
    with caplog.at_level("WARNING", logger=launch.__name__):
        launch.check_server_args(8, str(DRAFTER), env)  # lossless either way: no refusal
    logged = [r.getMessage() for r in caplog.records if r.name == launch.__name__]
    if says is None:
        assert logged == []
    else:
        assert len(logged) == 1 and says in logged[0] and launch.GREEDY_DRAFT_ENV in logged[0]


def test_a_draft_switch_sglang_cannot_read_is_refused_by_name(tmp_path: Path) -> None:
    env = {
        launch.CONFIG_ENV: _config(tmp_path),
        launch.RAGGED_MODE_ENV: "compact",
        launch.GREEDY_DRAFT_ENV: "maybe",
    }
    with pytest.raises(launch.LaunchError, match="SGLANG_DSPARK_USE_GREEDY_DRAFT='maybe'"):
        launch.check_server_args(8, str(DRAFTER), env)


def test_token_ids_outside_the_vocabulary_are_refused() -> None:
    requests.check_token_ids([0, 5, 99], vocab_size=100)
    requests.check_token_ids([], vocab_size=100)
    for bad in ([100, 1], [3, -1]):
        with pytest.raises(requests.RequestRefusedError, match=r"valid ids are 0\.\.99"):
            requests.check_token_ids(bad, vocab_size=100)


@pytest.mark.parametrize(
    ("params", "greedy"),
    [
        ({"temperature": 0.0}, True),
        ({"temperature": 1e-9}, True),
        ({"temperature": 0.7, "top_k": 1}, True),
        ({"temperature": 0.7}, False),
        ({}, False),  # SGLang's default temperature is 1
        (None, False),
    ],
)
def test_greedy_means_what_sglang_decodes_greedily(params: dict | None, greedy: bool) -> None:
    assert requests.is_greedy(params) is greedy


def test_hook_refuses_sampled_requests_only_on_greedy_only_tiers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=100))
    sampled = SimpleNamespace(sampling_params={"temperature": 1.0})
    greedy = SimpleNamespace(sampling_params={"temperature": 0.0})
    for greedy_only, refused in ((False, False), (True, True)):
        requests._greedy_only_tier.cache_clear()
        monkeypatch.setenv(
            launch.CONFIG_ENV, _config(tmp_path, greedy_only=greedy_only, sla_name="eval")
        )
        assert requests.validate_request_hook("r", manager, greedy, [1, 2]) == "r"
        if refused:
            with pytest.raises(requests.RequestRefusedError, match="tier 'eval' serves greedy"):
                requests.validate_request_hook(None, manager, sampled, [1, 2])
        else:
            requests.validate_request_hook(None, manager, sampled, [1, 2])
    with pytest.raises(requests.RequestRefusedError, match="outside the model's vocabulary"):
        requests.validate_request_hook(None, manager, greedy, [100])
    requests._greedy_only_tier.cache_clear()


def test_validation_errors_carry_no_server_paths() -> None:
    """The REPLACE target exists in this FastAPI, and the replacement adds no context.

    (The end-to-end check, a malformed body's 400 through the chart's server, is in
    tests/deploy; in-process engines of other tests may have applied the hook already.)
    """
    from fastapi.exceptions import RequestValidationError, ValidationException

    module, _, attr = requests.ENDPOINT_CONTEXT.rpartition(".")
    assert module.endswith(".ValidationException") and hasattr(ValidationException, attr)
    exc = RequestValidationError(
        [{"type": "missing", "loc": ("body", "prompt"), "msg": "Field required"}],
        endpoint_ctx={"function": "f", "path": "POST /x", "file": "/srv/app.py", "line": 3},
    )
    assert requests.no_endpoint_context(exc) == ""
