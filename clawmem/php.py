"""PHP's built-ins where clawmem must match them byte for byte: phpClaw's WordPress tables store
values with ``serialize()``, and phpClaw's recall scores with ``str_word_count()``, renders
arrays with ``json_encode()`` and breaks ties with PHP 8's ``<=>``.

Every function here does what PHP 8.2 does with its defaults (``serialize_precision = -1``,
``precision = 14``, no JSON flags), for the values clawmem stores: ``None``, ``bool``, ``int``,
finite ``float``, ``str``, ``list`` and ``dict`` with ``str`` keys. A PHP array is a Python list
when its keys are 0..n-1 in order, else a dict whose keys are str (PHP's int keys become
``"7"``); the other way round, a dict key that PHP would take for an int (``"7"``, not ``"07"``)
is written as one, as PHP itself would have.

No PyPI library fits: ``phpserialize`` (last released 2012) writes floats with Python's
``str()`` (``d:1.0;`` where PHP writes ``d:1;``) and has no PHP ``json_encode`` or ``<=>``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from clawmem.errors import PhpFormatError

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
SERIALIZE_PRECISION = 17  # what php_gcvt uses for serialize_precision = -1 (shortest round trip)
PRECISION = 14  # PHP's "precision" ini default: (string) of a float
_INT_KEY = re.compile(r"0|-?[1-9][0-9]*")
_NUMERIC = re.compile(
    rb"[ \t\n\r\v\f]*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t\n\r\v\f]*"
)
_WORD = re.compile(rb"[A-Za-z'\-]+")


# -- floats ------------------------------------------------------------------------------------


def _shortest_digits(number: float) -> tuple[str, int]:
    """Return the shortest digits that read back as ``abs(number)`` and the decimal point's
    position: ``abs(number) == 0.DIGITS * 10**position``."""
    exact = Decimal(repr(abs(number))).as_tuple()
    digits = "".join(map(str, exact.digits))
    significant = digits.lstrip("0")
    point = len(digits) + int(exact.exponent) - (len(digits) - len(significant))
    return significant.rstrip("0") or "0", point


def _rounded_digits(number: float, significant: int) -> tuple[str, int]:
    """Return ``abs(number)`` rounded to ``significant`` digits, trailing zeros dropped, and the
    decimal point's position (as :func:`_shortest_digits`)."""
    mantissa, _, exponent = f"{abs(number):.{significant - 1}e}".partition("e")
    digits = mantissa.replace(".", "").rstrip("0") or "0"
    return digits, int(exponent) + 1


def _gcvt(number: float, precision: int, exponent_char: str, shortest: bool) -> str:
    # PHP's php_gcvt: fixed notation unless the point is more than 3 places left of the first
    # digit or more than ``precision`` places right of it.
    if number == 0:
        return "-0" if math.copysign(1.0, number) < 0 else "0"
    digits, point = _shortest_digits(number) if shortest else _rounded_digits(number, precision)
    sign = "-" if number < 0 else ""
    if point < -3 or point > precision:
        power = point - 1
        return f"{sign}{digits[0]}.{digits[1:] or '0'}{exponent_char}{'-' if power < 0 else '+'}{abs(power)}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if len(digits) <= point:
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def float_text(number: float, exponent_char: str = "E") -> str:
    """Return a float as ``serialize()`` (``"E"``) or ``json_encode()`` (``"e"``) writes it:
    ``1.5``, ``1`` for 1.0, ``0.0001``, ``1.0E-5``, ``1.0E+25``."""
    return _gcvt(number, SERIALIZE_PRECISION, exponent_char, shortest=True)


def float_string(number: float) -> str:
    """Return ``(string) $float`` (``precision = 14``): ``1.5``, ``1.0E+15``."""
    return _gcvt(number, PRECISION, "E", shortest=False)


# -- array keys ---------------------------------------------------------------------------------


def array_key(key: str | int) -> str | int:
    """Return the key PHP stores for ``key`` in an array: a decimal int string within 64 bits
    (``"7"``, ``"-5"``; not ``"07"``, ``"-0"``, ``"+1"``) becomes that int."""
    if isinstance(key, str) and _INT_KEY.fullmatch(key):
        number = int(key)
        if INT_MIN <= number <= INT_MAX:
            return number
    return key


def php_array(value: list[Any] | tuple[Any, ...] | dict[str, Any]) -> dict[str | int, Any]:
    """Return a list or dict as the PHP array it stands for: keys as PHP keeps them, in order."""
    if isinstance(value, dict):
        return {array_key(key): item for key, item in value.items()}
    return dict(enumerate(value))


def _is_list(array: dict[str | int, Any]) -> bool:
    return all(key == position for position, key in enumerate(array))


# -- serialize ---------------------------------------------------------------------------------


def _string(text: str) -> str:
    return f's:{len(text.encode("utf-8"))}:"{text}";'


def _serialize(value: Any, parts: list[str]) -> None:
    if value is None:
        parts.append("N;")
    elif isinstance(value, bool):
        parts.append("b:1;" if value else "b:0;")
    elif isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(f"{value} does not fit in PHP's 64-bit integers")
        parts.append(f"i:{value};")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        parts.append(f"d:{float_text(value)};")
    elif isinstance(value, str):
        parts.append(_string(value))
    elif isinstance(value, (list, tuple, dict)):
        array = php_array(value)
        parts.append(f"a:{len(array)}:{{")
        for key, item in array.items():
            parts.append(f"i:{key};" if isinstance(key, int) else _string(key))
            _serialize(item, parts)
        parts.append("}")
    else:
        raise TypeError(f"PHP's serialize() cannot hold a {type(value).__name__} for clawmem")


def serialize(value: Any) -> str:
    """Return ``serialize($value)`` as PHP 8 writes it (string lengths in UTF-8 bytes).

    Raises ``ValueError`` for NaN, infinity or an int beyond 64 bits and ``TypeError`` for
    anything else PHP's arrays and scalars do not hold.
    """
    parts: list[str] = []
    _serialize(value, parts)
    return "".join(parts)


# -- unserialize ------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def fail(self, why: str) -> PhpFormatError:
        return PhpFormatError(f"{why} at byte {self.at}")

    def until(self, end: bytes) -> bytes:
        found = self.data.find(end, self.at)
        if found < 0:
            raise self.fail(f"expected {end.decode()!r}")
        text, self.at = self.data[self.at : found], found + len(end)
        return text

    def expect(self, text: bytes) -> None:
        if not self.data.startswith(text, self.at):
            raise self.fail(f"expected {text.decode()!r}")
        self.at += len(text)

    def integer(self, end: bytes) -> int:
        text = self.until(end)
        if not re.fullmatch(rb"[+-]?[0-9]+", text):
            raise self.fail("expected an integer")
        return int(text)

    def string(self) -> str:
        size = self.integer(b":")
        if size < 0:
            raise self.fail("negative string length")
        self.expect(b'"')
        raw = self.data[self.at : self.at + size]
        if len(raw) != size:
            raise self.fail("string shorter than its length")
        self.at += size
        self.expect(b'";')
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("string is not UTF-8") from None

    def value(self, depth: int = 0) -> Any:
        if depth > 512:
            raise self.fail("arrays nested too deeply")
        tag = self.data[self.at : self.at + 2]
        self.at += 2
        if tag == b"N;":
            return None
        if tag == b"b:":
            flag = self.until(b";")
            if flag not in (b"0", b"1"):
                raise self.fail("expected b:0; or b:1;")
            return flag == b"1"
        if tag == b"i:":
            number = self.integer(b";")
            if not INT_MIN <= number <= INT_MAX:
                # PHP would read a float here, and clawmem never holds an int beyond 64 bits.
                raise self.fail("integer beyond 64 bits")
            return number
        if tag == b"d:":
            text = self.until(b";")
            if not _NUMERIC.fullmatch(text) or text != text.strip():
                raise self.fail("expected a finite float")
            number = float(text)
            if not math.isfinite(number):  # 1e999 overflows to infinity: not a value clawmem holds
                raise self.fail("expected a finite float")
            return number
        if tag == b"s:":
            return self.string()
        if tag == b"a:":
            count = self.integer(b":")
            self.expect(b"{")
            array: dict[str | int, Any] = {}
            for _ in range(count):
                key_tag = self.data[self.at : self.at + 2]
                self.at += 2
                if key_tag == b"i:":
                    key: str | int = self.integer(b";")
                elif key_tag == b"s:":
                    key = array_key(self.string())
                else:
                    raise self.fail("array keys are i: or s:")
                array[key] = self.value(depth + 1)
            self.expect(b"}")
            if _is_list(array):
                return list(array.values())
            return {str(key): item for key, item in array.items()}
        self.at -= 2
        raise self.fail(f"unsupported or malformed value {tag.decode('latin-1')!r}")


def unserialize(text: str) -> Any:
    """Return the value of a ``serialize()`` string; raise :class:`PhpFormatError` for anything
    else (objects, references and non-finite floats included: clawmem cannot hold them)."""
    reader = _Reader(text.encode("utf-8"))
    value = reader.value()
    if reader.at != len(reader.data):
        raise reader.fail("unexpected data after the value")
    return value


# -- json_encode --------------------------------------------------------------------------------

_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _json_string(text: str) -> str:
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _JSON_ESCAPES:
            out.append(_JSON_ESCAPES[char])
        elif code < 0x20 or 0x80 <= code < 0x10000:
            out.append(f"\\u{code:04x}")
        elif code >= 0x10000:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def json_encode(value: Any) -> str:
    """Return ``json_encode($value)`` with no flags: ``\\/``, ``\\u00e9``, arrays with keys
    0..n-1 in order as lists, other arrays as objects in insertion order."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        return float_text(value, "e")
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, (list, tuple, dict)):
        array = php_array(value)
        if _is_list(array):
            return "[" + ",".join(json_encode(item) for item in array.values()) + "]"
        items = (f"{_json_string(str(key))}:{json_encode(item)}" for key, item in array.items())
        return "{" + ",".join(items) + "}"
    raise TypeError(f"json_encode() cannot encode a {type(value).__name__} for clawmem")


# -- PHP 8's <=> ----------------------------------------------------------------------------------


def _numeric(text: bytes) -> int | float | None:
    """Return the number a numeric string stands for (PHP 8 rules, whitespace allowed around
    it), or ``None`` for a non-numeric string."""
    if not _NUMERIC.fullmatch(text):
        return None
    body = text.strip(b" \t\n\r\v\f")
    if re.fullmatch(rb"[+-]?[0-9]+", body):
        number = int(body)
        return number if INT_MIN <= number <= INT_MAX else float(number)
    return float(body)


def _truthy(value: Any) -> bool:
    if isinstance(value, bytes):
        return value not in (b"", b"0")
    return bool(value)


def _sign(number: float) -> int:
    return (number > 0) - (number < 0)


def _php(value: Any) -> Any:
    # Strings compare as bytes; arrays as PHP keeps them.
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (list, tuple, dict)):
        return {key: _php(item) for key, item in php_array(value).items()}
    return value


def _number_to_string(number: int | float) -> bytes:
    return (str(number) if isinstance(number, int) else float_string(number)).encode("ascii")


def _compare(a: Any, b: Any) -> int:
    a_number = isinstance(a, (int, float)) and not isinstance(a, bool)
    b_number = isinstance(b, (int, float)) and not isinstance(b, bool)
    if a_number and b_number:
        return _sign(a - b) if isinstance(a, int) and isinstance(b, int) else _sign(float(a) - float(b))
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b):
            return 1 if len(a) > len(b) else -1
        for key, item in a.items():
            if key not in b:
                return 1  # uncomparable: PHP answers "greater" either way round
            found = _compare(item, b[key])
            if found:
                return found
        return 0
    if a is None and isinstance(b, bytes):
        return 0 if not b else -1
    if isinstance(a, bytes) and b is None:
        return 0 if not a else 1
    if isinstance(a, bytes) and isinstance(b, bytes):
        left, right = _numeric(a), _numeric(b)
        if left is not None and right is not None:
            return _compare(left, right)
        return _sign((a > b) - (a < b))
    if a is None or a is False:
        return -1 if _truthy(b) else 0
    if a is True:
        return 0 if _truthy(b) else 1
    if b is None or b is False:
        return 1 if _truthy(a) else 0
    if b is True:
        return 0 if _truthy(a) else -1
    if a_number and isinstance(b, bytes):
        parsed = _numeric(b)
        if parsed is not None:
            return _compare(a, parsed)
        text = _number_to_string(a)
        return (text > b) - (text < b)
    if isinstance(a, bytes) and b_number:
        return -_compare(b, a)
    return 1 if isinstance(a, dict) else -1  # an array is greater than any string or number


def compare(a: Any, b: Any) -> int:
    """Return ``$a <=> $b`` (-1, 0 or 1) as PHP 8 compares the two values."""
    return _compare(_php(a), _php(b))


# -- str_word_count ---------------------------------------------------------------------------


def words(text: str) -> list[str]:
    """Return ``str_word_count(strtolower($text), 1)``: runs of ASCII letters, ``'`` and ``-``
    (every other byte separates words, so ``café`` gives ``caf``); a ``'`` or ``-`` opening the
    whole text and a ``-`` closing it are left out."""
    data = text.encode("utf-8").lower()  # bytes.lower() is ASCII only, as strtolower in PHP 8.2
    start, end = 0, len(data)
    if end and data[:1] in (b"'", b"-"):
        start = 1
    if end and data[end - 1 : end] == b"-":
        end -= 1
    return [word.decode("ascii") for word in _WORD.findall(data, start, max(start, end))]
