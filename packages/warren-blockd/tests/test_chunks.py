import pytest
from warren_blockd import chunks
from warren_blockd.errors import CorruptError


def test_round_trip_and_content_address() -> None:
    raw = b"int main() { return 0; }\n" * 200
    digest, stored = chunks.encode(raw)
    assert digest == chunks.digest_of(raw)
    assert len(stored) < len(raw)  # compressed
    assert chunks.decode(digest, stored) == raw
    assert chunks.encode(raw)[1] == stored  # same content, same bytes, same key


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "other"])
def test_damaged_chunk_is_refused_whole(damage: str) -> None:
    raw = bytes(range(256)) * 64
    digest, stored = chunks.encode(raw)
    if damage == "flip":
        bad = stored[:-5] + bytes([stored[-5] ^ 0xFF]) + stored[-4:]
    elif damage == "truncate":
        bad = stored[: len(stored) // 2]
    elif damage == "header":
        bad = b"XXXX" + stored[4:]
    else:
        bad = chunks.encode(b"other content")[1]
    with pytest.raises(CorruptError):
        chunks.decode(digest, bad)


def test_key_is_spread_by_prefix() -> None:
    digest = chunks.digest_of(b"x")
    assert chunks.key_for(digest) == f"chunks/{digest[:2]}/{digest}"
