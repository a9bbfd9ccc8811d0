"""API keys: format, randomness, parsing, and the hash-only check."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from warren_control import keys
from warren_control.keys import KeyFormatError, new_key, parse


def test_new_key_has_the_documented_shape() -> None:
    key = new_key()
    assert re.fullmatch(r"wk_[a-z2-7]{12}_[A-Za-z0-9_-]{43}", key.token)
    assert key.token.startswith(f"wk_{key.key_id}_")
    # 43 base64url characters carry the 256 random bits.
    secret = key.token[len("wk_") + 12 + 1 :]
    assert len(base64.urlsafe_b64decode(secret + "=")) == 32


def test_only_the_hash_of_the_secret_is_returned_for_storage() -> None:
    key = new_key()
    secret = parse(key.token).secret
    assert key.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in key.secret_sha256


def test_keys_do_not_repeat() -> None:
    minted = [new_key() for _ in range(200)]
    assert len({k.token for k in minted}) == 200
    assert len({k.key_id for k in minted}) == 200


def test_parse_splits_by_position_even_when_the_secret_has_underscores() -> None:
    token = "wk_abcdefgh2345_" + "_" * 10 + "A" * 33
    parsed = parse(token)
    assert parsed.key_id == "abcdefgh2345"
    assert parsed.secret == "_" * 10 + "A" * 33


@pytest.mark.parametrize(
    "token",
    [
        "",
        "wk_",
        "xk_abcdefgh2345_" + "A" * 43,
        "wk_ABCDEFGH2345_" + "A" * 43,  # key ids are lower-case base32
        "wk_abcdefgh2341_" + "A" * 43,  # 1 is not base32
        "wk_abcdefgh234_" + "A" * 44,
        "wk_abcdefgh2345_" + "A" * 42,
        "wk_abcdefgh2345_" + "A" * 44,
        "wk_abcdefgh2345-" + "A" * 43,
        "wk_abcdefgh2345_" + "A" * 42 + "=",
        "wk_abcdefgh2345_" + "A" * 42 + "\n",
        " wk_abcdefgh2345_" + "A" * 43,
    ],
)
def test_parse_refuses_anything_else(token: str) -> None:
    with pytest.raises(KeyFormatError):
        parse(token)


def test_check_accepts_the_key_and_nothing_near_it() -> None:
    key = new_key()
    assert keys.check(key.token, key.secret_sha256)
    other = new_key()
    assert not keys.check(other.token, key.secret_sha256)
    # The right key id with another secret: refused.
    assert not keys.check(f"wk_{key.key_id}_{parse(other.token).secret}", key.secret_sha256)
    last = key.token[-1]
    assert not keys.check(key.token[:-1] + ("B" if last != "B" else "C"), key.secret_sha256)
    assert not keys.check("not a key", key.secret_sha256)
    assert not keys.check(key.token, "")
    assert not keys.check(key.token, "é" * 64)


def test_e2b_keys_have_e2b_s_shape_and_their_own_ids() -> None:
    key = new_key("e2b")
    assert re.fullmatch(r"e2b_[0-9a-f]{64}", key.token)
    assert key.token.startswith(f"e2b_{key.key_id}")
    parsed = parse(key.token)
    assert (parsed.key_id, len(parsed.secret)) == (key.key_id, 48)
    assert keys.check(key.token, key.secret_sha256)
    assert keys.looks_like_key(key.token)
    # A Warren key id is 12 characters and an E2B one 16: one never names the other's record.
    assert len(new_key().key_id) != len(key.key_id)
    assert len({new_key("e2b").key_id for _ in range(200)}) == 200


@pytest.mark.parametrize(
    "token",
    ["e2b_", "e2b_" + "a" * 63, "e2b_" + "a" * 65, "e2b_" + "A" * 64, "e2b_" + "g" * 64, "E2B_" + "a" * 64],
)
def test_parse_refuses_malformed_e2b_keys(token: str) -> None:
    with pytest.raises(KeyFormatError):
        parse(token)
