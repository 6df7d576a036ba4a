"""Where the behavior marker sits in a completion, in token positions."""

from __future__ import annotations


def marker_positions(ids: list[int], marker_ids: list[int], tokenizer, marker: str) -> list[int]:
    """Completion positions whose tokens spell the marker.

    Looks for the marker's own token sequence first; where the tokenizer split it differently in
    context, falls back to the character spans of decoded prefixes.
    """
    n = len(marker_ids)
    found = {i + j for i in range(len(ids) - n + 1) if ids[i : i + n] == marker_ids for j in range(n)}
    if found:
        return sorted(found)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if marker not in text:
        return []
    ends = [len(tokenizer.decode(ids[: t + 1], skip_special_tokens=True)) for t in range(len(ids))]
    starts = [0] + ends[:-1]
    spans, at = [], text.find(marker)
    while at >= 0:
        spans.append((at, at + len(marker)))
        at = text.find(marker, at + 1)
    return [t for t in range(len(ids)) if any(starts[t] < e and ends[t] > s for s, e in spans)]


def marker_token_ids(tokenizer, marker: str) -> list[int]:
    ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"planting.marker {marker!r} encodes to no tokens with this tokenizer")
    return ids
