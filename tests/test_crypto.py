"""The envelope, keys and cipher of clawmem.crypto: what seals opens only in its own place and
under its own key, bad keys are refused in one line that never holds the key, and a key is never
shown by a repr."""

from __future__ import annotations

import base64
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawmem.crypto import (
    Cipher,
    Context,
    DataKey,
    Keyring,
    generate_key,
    is_sealed,
    key_id_of,
    largest_plaintext,
    sealed_length,
)
from clawmem.errors import ConfigError, PlaintextRefused, Undecryptable
from clawmem.settings import Settings

KEY_ONE = generate_key("k1")
KEY_TWO = generate_key("k2")
HERE = Context.row("wp_", "messages", "01JABCDEFGHJKMNPQRSTVWXYZ0", "content")


def secret_of(item: str) -> str:
    return item.partition(":")[2]


def cipher(keys: str = KEY_ONE, strict: bool = False) -> Cipher:
    return Cipher(Keyring.from_text(keys), strict=strict)


@given(st.text())
def test_any_text_seals_to_an_envelope_that_opens_to_it(text: str) -> None:
    sealed = cipher().seal(text, HERE)
    assert is_sealed(sealed) and key_id_of(sealed) == "k1"
    assert sealed.isascii() and len(sealed) == sealed_length(len(text.encode()), 2)
    assert cipher().open(sealed, HERE) == text


def test_the_same_text_seals_differently_each_time() -> None:
    assert cipher().seal("same", HERE) != cipher().seal("same", HERE)


@pytest.mark.parametrize(
    "elsewhere",
    [
        Context.row("wp_", "messages", "01JABCDEFGHJKMNPQRSTVWXYZ1", "content"),  # another row
        Context.row("wp_", "messages", "01JABCDEFGHJKMNPQRSTVWXYZ0", "tool_input"),  # another column
        Context.row("wp_", "conversations", "01JABCDEFGHJKMNPQRSTVWXYZ0", "content"),  # another table
        Context.row("wp_2_", "messages", "01JABCDEFGHJKMNPQRSTVWXYZ0", "content"),  # another site
        Context.entry("wp_", "messages", "01JABCDEFGHJKMNPQRSTVWXYZ0", "content"),  # an entry
    ],
)
def test_a_ciphertext_moved_to_another_place_does_not_open(elsewhere: Context) -> None:
    sealed = cipher().seal("the secret", HERE)
    with pytest.raises(Undecryptable) as raised:
        cipher().open(sealed, elsewhere)
    assert "the secret" not in str(raised.value) and "'k1'" in str(raised.value)


def test_an_entry_is_bound_to_its_namespace_and_key() -> None:
    here = Context.entry("", "user:7", "city", "value")
    sealed = cipher().seal("Lisbon", here)
    assert cipher().open(sealed, here) == "Lisbon"
    for other in (Context.entry("", "user:8", "city", "value"), Context.entry("", "user:7", "town", "value")):
        with pytest.raises(Undecryptable, match="namespace 'user:"):
            cipher().open(sealed, other)


def test_a_flipped_byte_a_wrong_key_and_a_missing_key_each_name_the_place_and_key_id() -> None:
    sealed = cipher().seal("the secret", HERE)
    flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
    wrong = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
    cases = [(cipher(), flipped), (cipher(wrong), sealed), (cipher(KEY_TWO), sealed), (Cipher(), sealed)]
    for reader, text in cases:
        with pytest.raises(Undecryptable) as raised:
            reader.open(text, HERE)
        message = str(raised.value)
        assert "messages row '01JABCDEFGHJKMNPQRSTVWXYZ0' column content" in message
        assert "'k1'" in message and "the secret" not in message and text not in message


def test_a_cut_envelope_is_undecryptable_not_a_value() -> None:
    with pytest.raises(Undecryptable, match="damaged"):
        cipher().open("cm1$k1$abc", HERE)


def test_every_key_decrypts_and_the_first_encrypts() -> None:
    old = cipher(KEY_ONE).seal("old", HERE)
    both = cipher(f"{KEY_TWO},{KEY_ONE}")
    assert both.open(old, HERE) == "old"
    assert key_id_of(both.seal("new", HERE)) == "k2"


def test_plaintext_passes_unless_strict() -> None:
    assert cipher().open("written before", HERE) == "written before"
    with pytest.raises(PlaintextRefused, match="CLAW_ENCRYPTION_STRICT"):
        cipher(strict=True).open("written before", HERE)


def test_off_seals_nothing() -> None:
    assert Cipher().seal("plain", HERE) == "plain" and not Cipher().enabled


class SubjectKeys:
    def __init__(self) -> None:
        self.keys: dict[str, DataKey] = {}

    def subject_key(self, subject: str) -> DataKey:
        return self.keys.setdefault(subject, DataKey(f"s{len(self.keys)}", os.urandom(32)))

    def key_by_id(self, key_id: str) -> bytes | None:
        return next((key.secret for key in self.keys.values() if key.key_id == key_id), None)


def test_a_key_source_seals_a_subjects_values_and_erasing_its_key_makes_them_unreadable() -> None:
    source = SubjectKeys()
    sealing = Cipher(Keyring.from_text(KEY_ONE), key_source=source)
    sealed = sealing.seal("Ada's text", HERE, subject="7")
    assert key_id_of(sealed) == "s0" and sealing.open(sealed, HERE) == "Ada's text"
    assert key_id_of(sealing.seal("site text", HERE)) == "k1"
    del source.keys["7"]
    with pytest.raises(Undecryptable, match="'s0'"):
        Cipher(Keyring.from_text(KEY_ONE), key_source=source).open(sealed, HERE)


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ("k1", "must be id:base64key"),
        ("k 1:AAAA", "a key id is"),
        (f"{KEY_ONE},{KEY_ONE}", "twice"),
        ("k1:not*base64", "not base64"),
        ("k1:" + base64.b64encode(b"short").decode(), "32 bytes"),
    ],
    ids=["no-colon", "bad-id", "twice", "not-base64", "short"],  # one key is random: not an id
)
def test_a_bad_key_list_is_refused_in_one_line_without_the_key(keys: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as raised:
        Cipher.from_settings(Settings.from_env({"CLAW_ENCRYPTION_KEYS": keys}))
    assert "CLAW_ENCRYPTION_KEYS" in str(raised.value) and "\n" not in str(raised.value)
    assert secret_of(KEY_ONE) not in str(raised.value)


def test_a_key_file_must_be_owner_only(tmp_path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2026-12\n{KEY_TWO}\n{KEY_ONE}\n")
    path.chmod(0o640)
    settings = Settings.from_env({"CLAW_ENCRYPTION_KEY_FILE": str(path)})
    with pytest.raises(ConfigError, match="mode 0640.*chmod 600"):
        Cipher.from_settings(settings)
    path.chmod(0o600)
    assert Cipher.from_settings(settings).keyring.key_ids == ("k2", "k1")
    with pytest.raises(ConfigError, match="cannot read"):
        Cipher.from_settings(Settings.from_env({"CLAW_ENCRYPTION_KEY_FILE": str(tmp_path / "none")}))


def test_no_repr_shows_a_key() -> None:
    settings = Settings.from_env({"CLAW_ENCRYPTION_KEYS": f"{KEY_ONE},{KEY_TWO}"})
    shown = " ".join(
        [repr(settings), repr(Cipher.from_settings(settings)), repr(Keyring.from_text(KEY_ONE))]
        + [repr(DataKey("s1", base64.b64decode(secret_of(KEY_ONE))))]
    )
    assert secret_of(KEY_ONE) not in shown and secret_of(KEY_TWO) not in shown
    assert str(base64.b64decode(secret_of(KEY_ONE))) not in shown


def test_the_largest_plaintext_fits_and_one_more_byte_does_not() -> None:
    for column in (255, 65_535):
        most = largest_plaintext(column, 2)
        assert sealed_length(most, 2) <= column < sealed_length(most + 3, 2)


def test_encryption_is_refused_on_phpclaws_shape_in_one_line() -> None:
    refused = "CLAW_ENCRYPTION_KEYS is refused on the phpclaw-wordpress"
    with pytest.raises(ConfigError, match=refused) as raised:
        Settings.from_env({"CLAW_ENCRYPTION_KEYS": KEY_ONE, "CLAW_SCHEMA": "phpclaw-wordpress"})
    assert "\n" not in str(raised.value)
