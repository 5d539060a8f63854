"""Print shell ``export`` lines that give uv the package sources pip is configured with.

The Makefile installs the project with uv (about 5x faster than pip from nothing: parallel
downloads and installs), but uv reads none of pip's configuration. On machines whose pip points
at local wheels, file indexes or a constraints file (the CPU torch wheel on disk, a torch cap), a
bare ``uv pip install`` would resolve somewhere else: a multi-GB CUDA torch, say. This reads
``pip config list`` (every scope; a ``PIP_*`` variable wins over user/site/global files, as in
pip) and translates what decides where packages come from:

    find-links -> UV_FIND_LINKS     index-url -> UV_INDEX_URL    extra-index-url -> UV_EXTRA_INDEX_URL
    constraint -> UV_CONSTRAINT     cert -> SSL_CERT_FILE

and sets ``UV_INDEX_STRATEGY=unsafe-best-match``: pip takes the best version across all its
indexes, uv by default the first index that has a package at all. A variable already set in the
environment is left alone. Usage: ``eval "$(python scripts/uv_env.py)"``.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

# pip's scopes, lowest precedence first (pip config list prints ":env:" for PIP_* variables).
SCOPES = ("global", "user", "site", ":env:")
# pip key -> (uv variable, separator uv expects between several values)
KEYS = {
    "find-links": ("UV_FIND_LINKS", ","),
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
}
LINE = re.compile(r"^(?P<scope>[^.]+|:env:)\.(?P<key>[\w-]+)='(?P<value>.*)'$")


def pip_settings(listing: str) -> dict[str, str]:
    """``pip config list`` output -> {key: value}, the highest-precedence scope winning."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        m = LINE.match(line.strip())
        if not m or m["key"] not in KEYS:
            continue
        rank = SCOPES.index(m["scope"]) if m["scope"] in SCOPES else 0
        if m["key"] not in found or rank >= found[m["key"]][0]:
            found[m["key"]] = (rank, m["value"])
    return {key: value for key, (_, value) in found.items()}


def uv_exports(settings: dict[str, str], environ: dict[str, str]) -> list[str]:
    """``export`` lines for the uv variables that pip's settings imply and the environment lacks."""
    lines = []
    for key, value in settings.items():
        var, sep = KEYS[key]
        if var not in environ and value.split():
            lines.append(f"export {var}={shlex.quote(sep.join(value.split()))}")
    if "UV_INDEX_STRATEGY" not in environ:
        lines.append("export UV_INDEX_STRATEGY=unsafe-best-match")
    return lines


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, check=False).stdout
    print("\n".join(uv_exports(pip_settings(listing), dict(os.environ))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
