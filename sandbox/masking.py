"""Field-level masking of outputs by role: Chinese resident ID numbers (GB 11643 check digit
validated), mainland mobile numbers, bank card numbers (Luhn validated) and e-mail addresses.

Only values that validate are masked (an 18-digit order number whose check digit fails is left
alone), and a role listed as cleared for a kind of field sees it in full.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

__all__ = [
    "KINDS",
    "mask_for_roles",
    "mask_text",
    "mask_value",
    "valid_bank_card",
    "valid_resident_id",
]

KINDS = ("id_number", "mobile", "bank_card", "email")

_ID = re.compile(r"(?<![0-9A-Za-z])(\d{17}[0-9Xx])(?![0-9A-Za-z])")
_MOBILE = re.compile(r"(?<!\d)(1[3-9]\d{9})(?!\d)")
_CARD = re.compile(r"(?<!\d)(\d{13,19})(?!\d)")
_EMAIL = re.compile(r"\b([A-Za-z0-9._%+-]+)@([A-Za-z0-9.-]+\.[A-Za-z]{2,})\b")
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"


def valid_resident_id(number: str) -> bool:
    """GB 11643-1999: the 18th character is the ISO 7064 MOD 11-2 check of the first 17."""
    if len(number) != 18 or not number[:17].isdigit():
        return False
    total = sum(int(digit) * weight for digit, weight in zip(number[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == number[17].upper()


def valid_bank_card(number: str) -> bool:
    """The Luhn check."""
    digits = [int(d) for d in reversed(number)]
    total = sum(digits[0::2]) + sum(sum(divmod(2 * d, 10)) for d in digits[1::2])
    return total % 10 == 0


def mask_text(text: str, cleared: Collection[str]) -> str:
    """``text`` with every valid field of a kind not in ``cleared`` masked."""
    if "id_number" not in cleared:
        text = _ID.sub(
            lambda m: (
                m.group(1)[:6] + "*" * 8 + m.group(1)[-4:]
                if valid_resident_id(m.group(1))
                else m.group(1)
            ),
            text,
        )
    if "bank_card" not in cleared:
        text = _CARD.sub(
            lambda m: (
                "*" * (len(m.group(1)) - 4) + m.group(1)[-4:]
                if valid_bank_card(m.group(1))
                else m.group(1)
            ),
            text,
        )
    if "mobile" not in cleared:
        text = _MOBILE.sub(lambda m: m.group(1)[:3] + "****" + m.group(1)[-4:], text)
    if "email" not in cleared:
        text = _EMAIL.sub(lambda m: m.group(1)[:1] + "***@" + m.group(2), text)
    return text


def mask_value(value: Any, role: str, clearances: Mapping[str, Collection[str]]) -> Any:
    """Mask every string inside ``value`` (dicts and lists walked) for ``role``;
    ``clearances`` maps a field kind to the roles that see it in full."""
    cleared = {kind for kind, roles in clearances.items() if role in roles}
    if cleared >= set(KINDS):
        return value
    return _walk(value, cleared)


def mask_for_roles(
    value: Any, roles: Collection[str], clearances: Mapping[str, Collection[str]]
) -> Any:
    """As :func:`mask_value` for a caller holding several ``roles``: a field kind is shown in
    full when any of them is cleared for it."""
    cleared = {kind for kind, allowed in clearances.items() if set(roles) & set(allowed)}
    if cleared >= set(KINDS):
        return value
    return _walk(value, cleared)


def _walk(value: Any, cleared: set[str]) -> Any:
    if isinstance(value, str):
        return mask_text(value, cleared)
    if isinstance(value, Mapping):
        return {key: _walk(item, cleared) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(item, cleared) for item in value]
    return value
