import pytest
from warren_blockd.manifest import Extent, Manifest


def test_lookup_and_holes() -> None:
    m = Manifest(100, (Extent(10, 5, "a"), Extent(20, 10, "b", 3)))
    assert m.lookup(0) is None
    assert m.lookup(10) == ("a", 0)
    assert m.lookup(14) == ("a", 4)
    assert m.lookup(15) is None
    assert m.lookup(25) == ("b", 8)


def test_overlay_splits_and_wins() -> None:
    base = Manifest(100, (Extent(0, 50, "base"),))
    new = base.overlay([Extent(10, 5, "w1"), Extent(12, 10, "w2")], log_seq=7)
    assert new.lookup(9) == ("base", 9)
    assert new.lookup(10) == ("w1", 0)
    assert new.lookup(12) == ("w2", 0)
    assert new.lookup(21) == ("w2", 9)
    assert new.lookup(22) == ("base", 22)
    assert new.log_seq == 7
    assert base.lookup(12) == ("base", 12)  # the old manifest is untouched


def test_round_trip_bytes() -> None:
    m = Manifest(64, (Extent(1, 2, "x", 3),), log_seq=5)
    assert Manifest.from_bytes(m.to_bytes()) == m


def test_invalid_extents_refused() -> None:
    with pytest.raises(ValueError, match="overlap"):
        Manifest(10, (Extent(0, 5, "a"), Extent(4, 2, "b")))
    with pytest.raises(ValueError, match="end of the device"):
        Manifest(10, (Extent(8, 5, "a"),))
