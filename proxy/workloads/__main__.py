"""`python -m proxy.workloads write|check|list`: maintain the committed traces under `workloads/`.

- `write` regenerates every committed workload's trace (byte-stable: unchanged files keep their
  bytes);
- `check` regenerates in memory and exits 1 naming every committed file that differs or is
  missing;
- `list` prints name, requests, size and description of each workload.
"""

from __future__ import annotations

import sys

from proxy.workloads.suite import COMMITTED_DIR, SUITE, generate
from proxy.workloads.trace import dumps_trace


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "list"
    if command not in ("write", "check", "list"):
        print(__doc__, file=sys.stderr)
        return 2
    bad: list[str] = []
    for workload in SUITE:
        data = dumps_trace(generate(workload))
        path = COMMITTED_DIR / f"{workload.name}.jsonl"
        if command == "list":
            where = "committed" if workload.committed else "generated at run time"
            requests = data.count(b"\n") - 1
            print(f"{workload.name:<26} {requests:>3} requests {len(data) / 1e6:6.2f} MB  {where}")
            print(f"    {workload.description}")
        elif not workload.committed:
            continue
        elif command == "write":
            if not path.exists() or path.read_bytes() != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                print(f"wrote {path}")
        elif not path.exists() or path.read_bytes() != data:
            bad.append(str(path))
    for name in bad:
        print(f"differs from its generator: {name}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
