"""The ``simgraph`` command: one entry point dispatching to the pipelines.

Available now:

* ``simgraph validate CONFIG [key=value ...]`` — load a config file with dotted overrides,
  check every key, type and range, and print the resolved config (exit 2 on an error).

Preprocess, pretrain, evaluate and sweep join as their pipelines land (see README).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import yaml

from components.config import ConfigError, LossSection, load_config, to_dict


def validate(config: str, overrides: Sequence[str]) -> int:
    try:
        cfg = load_config(config, LossSection, overrides)
    except (ConfigError, OSError) as e:
        print(f"simgraph: invalid config: {e}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simgraph", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("validate", help="check a config file and print it resolved")
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. loss.tau_s=0.2")
    args = parser.parse_args(argv)
    if args.command == "validate":
        return validate(args.config, args.overrides)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
