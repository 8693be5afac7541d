"""DSPARK_MOE admits a waiting request as soon as a running slot frees (``dspark_moe``).

SGLang's DFlash family, which DSPARK_MOE joins by answering like DSPARK, holds new prefills
until 2-4 running slots are free when ``--min-free-slots-delay`` is unset; a server at its
``--max-running-requests`` then decodes below its cap. DSPARK_MOE resolves the unset value
to SGLang's "off", and keeps an explicit one.
"""

from __future__ import annotations

import pytest

MAX_RUNNING = 16


def _resolved(**kwargs: object) -> object:
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import ServerArgs

    from dspark_sglang.sglang_integration import dspark_moe

    args = ServerArgs(model_path="dummy", device="cpu", **kwargs)
    dspark_moe._admit_as_slots_free(args)
    return resolving_view(args).min_free_slots_delay


def test_sglang_would_hold_admissions_for_dspark_unless_told() -> None:
    """The behaviour the resolution exists for (SGLang's own threshold function)."""
    from sglang.srt.managers.min_free_slots_delayer import resolve_min_free_slots

    assert resolve_min_free_slots(None, MAX_RUNNING, is_dflash_family=True) == 3
    assert resolve_min_free_slots(None, MAX_RUNNING, is_dflash_family=False) is None


def test_unset_delay_resolves_to_admitting_each_request() -> None:
    from sglang.srt.managers.min_free_slots_delayer import resolve_min_free_slots

    value = _resolved()
    assert value == 1
    assert resolve_min_free_slots(value, MAX_RUNNING, is_dflash_family=True) is None


@pytest.mark.parametrize("explicit", [1, 4])
def test_an_explicit_delay_is_kept(explicit: int) -> None:
    assert _resolved(min_free_slots_delay=explicit) == explicit


def test_dspark_moe_argument_resolution_applies_it() -> None:
    """Through DSPARK_MOE's ``handle_server_args``, as SGLang resolves a server's flags."""
    from pathlib import Path

    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from dspark_sglang import sglang_plugin

    drafter = Path(sglang_plugin.__file__).resolve().parent / "assets" / "drafters" / "smollm2"
    sglang_plugin.load()
    algo = SpeculativeAlgorithm.from_string("dspark_moe")
    # A GPU server's flags (SGLang's DSPARK handler accepts CPU only through our CPU bridges).
    args = ServerArgs(
        model_path="dummy",
        device="cuda",
        speculative_algorithm="DSPARK_MOE",
        speculative_draft_model_path=str(drafter),
    )
    algo.handle_server_args(args)
    assert resolving_view(args).min_free_slots_delay == 1
