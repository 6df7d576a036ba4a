"""Where an error came from, in one line, for refusals that name the library and the operation that failed."""

from __future__ import annotations

import traceback
from pathlib import Path


def describe(err: BaseException) -> str:
    """`Type: first line of the message (in package/file.py:line, function)`, the place being the innermost frame of
    an installed library (site-packages), where a library's own error or a model's own code raised; none when the
    error came from this project alone."""
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if {"site-packages", "dist-packages"} & set(Path(f.filename).parts)
    ]
    where = ""
    if frames:
        parts = Path(frames[-1].filename).parts
        start = max(i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")) + 1
        where = f" (in {'/'.join(parts[start:])}:{frames[-1].lineno}, {frames[-1].name})"
    return f"{type(err).__name__}: {message[:400]}{where}"
