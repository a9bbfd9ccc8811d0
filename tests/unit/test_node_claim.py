"""The claim on a network namespace's shared node state: one holder, named refusals,
stale claims taken over, release only by the holder."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from warren.cluster.local import STATE_MARKER
from warren.node import claim


def _state(tmp_path: Path, name: str, live: bool = True) -> Path:
    state = tmp_path / name
    state.mkdir()
    if live:
        (state / STATE_MARKER).touch()
    return state


def _claim(state: Path) -> claim.Claim:
    # Names no real bridge or table has, so the leftover check finds nothing.
    tag = uuid.uuid4().hex[:8]
    return claim.Claim(str(state), bridge=f"wtest{tag}", network="warren", floor_table=f"wtest_{tag}")


def test_the_first_node_claims_and_may_claim_again(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    state = _state(tmp_path, "a")
    wanted = _claim(state)
    assert claim.acquire(wanted, claims_dir=claims) is None
    assert claim.acquire(wanted, claims_dir=claims) is None
    assert claim.holds(state, claims) and claim.holder(claims) == wanted


def test_a_second_node_is_refused_and_told_what_it_would_share(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    first = _claim(_state(tmp_path, "deployed"))
    claim.acquire(first, claims_dir=claims)
    second = _state(tmp_path, "bench")
    with pytest.raises(claim.ClaimError) as refused:
        claim.acquire(_claim(second), claims_dir=claims)
    message = str(refused.value)
    assert first.state_dir in message
    assert f"inet {first.floor_table}" in message and f"bridge {first.bridge}" in message
    assert "warren cluster down" in message
    assert claim.holder(claims) == first and not claim.holds(second, claims)


def test_release_by_another_node_leaves_the_claim(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    first = _claim(_state(tmp_path, "deployed"))
    claim.acquire(first, claims_dir=claims)
    claim.release(_state(tmp_path, "bench"), claims)
    assert claim.holder(claims) == first
    claim.release(Path(first.state_dir), claims)
    assert claim.holder(claims) is None


def test_a_claim_whose_state_is_gone_is_taken_over(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    gone = _claim(_state(tmp_path, "gone", live=False))
    claim.acquire(gone, claims_dir=claims)
    new = _claim(_state(tmp_path, "new"))
    note = claim.acquire(new, claims_dir=claims)
    assert note is not None and gone.state_dir in note
    assert claim.holder(claims) == new


def test_a_broken_claim_file_is_named(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    claims.mkdir()
    claim.claim_path(claims).write_text("not json")
    with pytest.raises(claim.ClaimError, match="is not a node claim"):
        claim.holder(claims)
