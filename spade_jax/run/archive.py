"""`run_dir/envs/`: every program the designer generated, stored as a file, with an index of its
verdict and what was learned later (regret, win rate); resumes forget programs that will be redone."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spade_jax.run.records import json_line, number, read_jsonl

_ENV_ID = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


class EnvArchive:
    """`run_dir/envs/`: every generated program as `<env_id>.py` and `index.jsonl`, one
    `add` line per program and `update` lines for fields learned later (regret, win rate)."""

    # Fields every add record carries (None when unknown), so readers can rely on the keys.
    FIELDS = ("verdict", "backend", "errors", "regret", "win_rate", "skill", "iteration", "hint")

    def __init__(self, run_dir: str | os.PathLike, *, start_iteration: int | None = None):
        self.dir = Path(run_dir) / "envs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index_path = self.dir / "index.jsonl"
        lines = read_jsonl(self.index_path)
        if start_iteration is not None:
            lines = self._drop_from(lines, start_iteration)
        self._ids = {line["env_id"] for line in lines
                     if line.get("event", "add") == "add" and "env_id" in line}
        self._count = len(self._ids)

    def _drop_from(self, lines: list[dict], start_iteration: int) -> list[dict]:
        """On resume, forget programs added at iterations >= start_iteration (they are redone)."""
        dropped = {
            line["env_id"]
            for line in lines
            if line.get("event", "add") == "add"
            and isinstance(line.get("iteration"), int)
            and line["iteration"] >= start_iteration
        }
        if not dropped:
            return lines
        kept = [line for line in lines if line.get("env_id") not in dropped]
        self._rewrite(kept)
        for env_id in dropped:
            (self.dir / f"{env_id}.py").unlink(missing_ok=True)
        return kept

    def _rewrite(self, lines: list[dict]) -> None:
        tmp = self.index_path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(json_line(line) for line in lines)
        os.replace(tmp, self.index_path)

    def _append(self, line: Mapping[str, Any]) -> None:
        with self.index_path.open("a", encoding="utf-8") as f:
            f.write(json_line(line))
            f.flush()

    def add(self, program_source: str, record: Mapping[str, Any]) -> str:
        """Store one program and its record; returns its env id: `record["env_id"]` when the
        caller names it (so later `update` calls can use the caller's id), else a new one
        (`it00012-00345`). A boolean `valid` without `verdict` sets verdict valid/invalid."""
        if not isinstance(program_source, str):
            raise ValueError(f"program_source must be a str, got {type(program_source).__name__}")
        env_id = record.get("env_id")
        if env_id is None:
            iteration = record.get("iteration")
            prefix = f"it{int(iteration):05d}-" if isinstance(iteration, int) else "env-"
            env_id = f"{prefix}{self._count:05d}"
        elif not isinstance(env_id, str) or not _ENV_ID.fullmatch(env_id):
            raise ValueError(f"env_id {env_id!r} must be letters, digits, '_', '-' or '.'")
        if env_id in self._ids:
            raise ValueError(f"env_id {env_id!r} is already in the archive; ids must be unique")
        self._ids.add(env_id)
        self._count += 1
        (self.dir / f"{env_id}.py").write_text(program_source, encoding="utf-8")
        line = {"event": "add", "env_id": env_id, "path": f"envs/{env_id}.py"}
        line.update({field: None for field in self.FIELDS})
        line.update({k: v for k, v in record.items() if k not in ("event", "env_id", "path")})
        if line["verdict"] is None and isinstance(line.get("valid"), bool):
            line["verdict"] = "valid" if line["valid"] else "invalid"
        self._append(line)
        return env_id

    def update(self, env_id: str, **fields: Any) -> None:
        """Record fields learned after the program was added; `read_index` folds them in."""
        if not fields:
            raise ValueError("update needs at least one field, e.g. update(env_id, regret=0.2)")
        reserved = {"event", "env_id", "path"} & set(fields)
        if reserved:
            raise ValueError(f"fields {sorted(reserved)} are managed by the archive; rename them")
        self._append({"event": "update", "env_id": env_id, **fields})

    def read_index(self) -> list[dict]:
        """One dict per stored program, in the order added, with all updates folded in."""
        by_id: dict[str, dict] = {}
        for line in read_jsonl(self.index_path):
            env_id = line.get("env_id")
            if env_id is None:
                continue
            fields = {k: v for k, v in line.items() if k != "event"}
            if line.get("event", "add") == "add":
                by_id[env_id] = fields
            elif env_id in by_id:
                by_id[env_id].update(fields)
        return list(by_id.values())

    def source(self, env_id: str) -> str:
        return (self.dir / f"{env_id}.py").read_text(encoding="utf-8")

    def __len__(self) -> int:
        return self._count


def archive_stats(entries: list[dict]) -> dict[str, Any]:
    """Counts and means over archived environments for summary.md."""

    def mean(key: str) -> float | None:
        values = [number(e.get(key)) for e in entries]
        values = [v for v in values if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    verdicts: dict[str, int] = {}
    backends: dict[str, int] = {}
    skills: dict[str, int] = {}
    for e in entries:
        verdicts[str(e.get("verdict"))] = verdicts.get(str(e.get("verdict")), 0) + 1
        if e.get("backend") is not None:
            backends[str(e["backend"])] = backends.get(str(e["backend"]), 0) + 1
        if e.get("skill") is not None:
            skills[str(e["skill"])] = skills.get(str(e["skill"]), 0) + 1
    return {
        "count": len(entries),
        "verdicts": verdicts,
        "backends": backends,
        "skills": skills,
        "regret_mean": mean("regret"),
        "win_rate_mean": mean("win_rate"),
    }


class NullArchive:
    """The environment archive of a process that is not the leader: accepts every call, writes nothing."""

    def __init__(self) -> None:
        self._count = 0

    def add(self, program_source: str, record: Mapping[str, Any]) -> str:
        self._count += 1
        return record.get("env_id") or f"env-{self._count - 1:05d}"

    def update(self, env_id: str, **fields: Any) -> None:
        pass

    def __len__(self) -> int:
        return self._count
