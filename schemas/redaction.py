"""Keeping the Tinker API key out of every message, whatever characters the key holds.

A message can carry the key as typed, as Python shows it (`repr` of the str or of its bytes,
with `\\n`, quotes and `\\xNN`/`\\uNNNN` escapes), JSON-escaped, percent-encoded, or broken
across lines and then folded onto one. `redact` replaces every such form, and each long piece of
a key that whitespace splits, before any folding can change how the key reads.
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote

REDACTED = "<redacted>"
KEY_ENV = "TINKER_API_KEY"
MIN_PIECE = 6  # shorter pieces of a key split by whitespace are too common to blank out


def _forms(secret: str) -> set[str]:
    forms = {secret, secret.strip()}
    forms.add(repr(secret)[1:-1])
    forms.add(json.dumps(secret)[1:-1])
    forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    forms.add(quote(secret, safe=""))
    forms.add(secret.encode("unicode_escape").decode("ascii"))
    raw = secret.encode("utf-8", "surrogatepass")
    forms.add(repr(raw)[2:-1])
    forms.add(raw.decode("latin-1"))  # the bytes shown as latin-1 text (how HTTP headers read)
    forms.update(p for p in secret.split() if len(p) >= MIN_PIECE)
    forms.add(" ".join(secret.split()))  # the key folded onto one line
    return {f for f in forms if len(f) >= MIN_PIECE or f == secret}


def redact(text: str, secret: str | None) -> str:
    """`text` with every form of `secret` replaced by `<redacted>` (longest forms first)."""
    if not secret or not secret.strip():
        return text
    for form in sorted(_forms(secret), key=len, reverse=True):
        if form:
            text = text.replace(form, REDACTED)
    return text


def redact_key(text: str, api_key: str | None = None) -> str:
    """`text` with `api_key` (default: `$TINKER_API_KEY`) redacted in every form."""
    return redact(text, api_key if api_key is not None else os.environ.get(KEY_ENV))


def one_line(text: str) -> str:
    """Whitespace folded to single spaces: one terminal line. Redact first, then fold."""
    return " ".join(text.split())
