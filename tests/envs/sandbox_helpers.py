"""Shared helpers of the sandbox tests (not a test module): corpus access and host probes."""

from __future__ import annotations

import os
import re
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"


def corpus_files(kind: str) -> list[Path]:
    return sorted(p for p in (CORPUS / kind).iterdir() if p.suffix in (".py", ".md"))


def expectation(path: Path) -> list[str]:
    """Words after '# expect:' on the file's first line (e.g. ['invalid', 'step'])."""
    first = path.read_text().splitlines()[0]
    match = re.match(r"#\s*expect:\s*(.*)", first)
    assert match, f"{path} has no '# expect:' header"
    return match.group(1).split()


def processes_with_uid_in(low: int, high: int) -> list[int]:
    """Host pids whose real uid lies in [low, high): the sandbox workers' uids."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        uid = int(line.split()[1])
                        if low <= uid < high:
                            found.append(int(entry))
                        break
        except OSError:
            continue
    return found


def wait_until_gone(uid: int, timeout: float = 10.0) -> list[int]:
    """Processes of `uid` still present after up to `timeout` seconds (killing is
    asynchronous once an environment is closed: the kernel tears the namespace down)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = processes_with_uid_in(uid, uid + 1)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
