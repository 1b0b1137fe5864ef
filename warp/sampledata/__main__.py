"""python -m warpdata.sampledata KIND OUT [--count N] [--seed S]"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from warpdata.core.errors import WarpError
from warpdata.sampledata import GENERATORS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m warpdata.sampledata", description=__doc__)
    p.add_argument("kind", choices=sorted(GENERATORS))
    p.add_argument("out", type=Path)
    p.add_argument("--count", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    mod, _, fn = GENERATORS[a.kind].partition(":")
    gen = getattr(importlib.import_module(mod), fn)
    kwargs = {"seed": a.seed}
    if a.count is not None:
        kwargs["count"] = a.count
    try:
        info = gen(a.out, **kwargs)
    except WarpError as e:
        sys.stderr.write(f"error: {e.message}\n")
        return int(e.exit_code)
    json.dump(info, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
