"""The token budget (§2.1): tokens are ceil(utf8 bytes / 4)."""

from __future__ import annotations

ELLIPSIS = "…"


def nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def cut(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` UTF-8 bytes (with an ellipsis), and whether it was cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    if limit < len(ELLIPSIS.encode()):
        return "", True
    keep = data[: limit - len(ELLIPSIS.encode())].decode("utf-8", "ignore")
    return keep + ELLIPSIS, True


def share(sizes: list[int], total: int) -> list[int]:
    """Split ``total`` bytes among items wanting ``sizes``: small ones get all
    they want, the rest share what is left equally (water-filling)."""
    out = [0] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    left = max(total, 0)
    for k, i in enumerate(order):
        fair = left // (len(order) - k)
        out[i] = min(sizes[i], fair)
        left -= out[i]
    return out
