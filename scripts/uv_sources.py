"""Print the `uv pip install` flags that give uv the package sources pip is configured with here.

uv reads its own settings (UV_FIND_LINKS, ...), not pip's. `make install` installs torch with uv when TORCH_INDEX
is not set, and it must get the same build pip would: the one in pip's find-links (a machine's CPU wheel, say)
under pip's constraints. This reads `pip config list` (pip's files and its PIP_* variables) and prints one
`--find-links LOCATION` or `--constraint FILE` per value, nothing when pip has none.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

OPTIONS = ("find-links", "constraint")  # the pip options that change which files are installed, as uv spells them


def uv_flags(pip_config: str) -> list[str]:
    """`--OPTION VALUE` pairs for OPTIONS in `pip config list` output (`scope.option='v1 v2'`), first seen first."""
    pairs: list[tuple[str, str]] = []
    for line in pip_config.splitlines():
        key, sep, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        words = shlex.split(value) if sep and option in OPTIONS else []
        for item in " ".join(words).split():
            if (option, item) not in pairs:
                pairs.append((option, item))
    return [word for option, item in pairs for word in (f"--{option}", item)]


def main() -> None:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    print(shlex.join(uv_flags(listing.stdout if listing.returncode == 0 else "")))


if __name__ == "__main__":
    main()
