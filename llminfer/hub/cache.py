"""Where llminfer keeps what it fetches: $LLMINFER_CACHE, or ~/.cache/llminfer
(known models under models/, joined Hub files under hf-joined/). Below both
fetchers (hub.py for known names, hf.py for the Hugging Face Hub)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("LLMINFER_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "llminfer"
