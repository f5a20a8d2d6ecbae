"""Print pip's package sources on this machine as uv command-line flags, one per line.

``make setup`` installs with uv (the same pins, several times faster than pip: docs/benchmarks.md)
but uv does not read pip's configuration; a machine whose packages come from local wheel folders,
extra indexes or a constraints file (``pip config list``: config files and ``PIP_*`` variables)
must give uv the same sources, or it would resolve against other ones. Read with
``$(python .ci/pip_sources.py)``; prints nothing where pip has none of these set.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip option -> uv flag; values are whitespace-separated lists in pip's configuration
FLAGS = {"find-links": "--find-links", "index-url": "--index-url",
         "extra-index-url": "--extra-index-url", "constraint": "--constraint"}


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=False).stdout
    seen: set[tuple[str, str]] = set()
    for line in out.splitlines():  # e.g. global.find-links='/opt/wheels', :env:.cert='...'
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        for item in shlex.split(value)[0].split() if value else []:
            if option in FLAGS and (option, item) not in seen:
                seen.add((option, item))
                print(FLAGS[option])
                print(item)
    return 0


if __name__ == "__main__":
    sys.exit(main())
