"""spade_jax.run.archive: envs/ programs and index, updates, resume, and its section of summary.md."""

from __future__ import annotations

import pytest

from spade_jax.run.archive import EnvArchive
from spade_jax.run.metrics import RunLogger


def test_env_archive_add_update_and_summary(tmp_path):
    archive = EnvArchive(tmp_path)
    a = archive.add("class AEnv: pass\n", {"verdict": "valid", "backend": "jax", "iteration": 0,
                                           "skill": "spatial reasoning", "hint": "go left"})
    b = archive.add("class BEnv: pass\n", {"verdict": "invalid", "backend": None,
                                           "errors": ["no reset"], "iteration": 1})
    archive.update(a, regret=0.3, win_rate=0.5)
    archive.update(a, win_rate=0.75)
    assert a != b and (tmp_path / "envs" / f"{a}.py").read_text() == "class AEnv: pass\n"
    entries = archive.read_index()
    assert [e["env_id"] for e in entries] == [a, b]
    assert entries[0]["regret"] == 0.3 and entries[0]["win_rate"] == 0.75
    assert entries[1]["errors"] == ["no reset"] and entries[1]["regret"] is None
    with pytest.raises(ValueError, match="at least one field"):
        archive.update(a)

    # Callers may name the id (self-play updates by its own ids); `valid` sets the verdict.
    named = archive.add("class DEnv: pass\n", {"env_id": "env00007", "valid": False, "iteration": 0})
    assert named == "env00007"
    archive.update("env00007", regret=0.5)
    entry = next(e for e in archive.read_index() if e["env_id"] == "env00007")
    assert entry["verdict"] == "invalid" and entry["regret"] == 0.5
    with pytest.raises(ValueError, match="already in the archive"):
        archive.add("x", {"env_id": "env00007"})
    with pytest.raises(ValueError, match="must be letters"):
        archive.add("x", {"env_id": "../escape"})

    run = RunLogger(tmp_path, {}, tensorboard=False, progress=False)
    run.log(0, {"loss": 1.0})
    run.close()
    summary = (tmp_path / "summary.md").read_text()
    assert "- programs: 3" in summary
    assert "- verdicts: invalid: 2, valid: 1" in summary
    assert "- mean regret: 0.4" in summary

    # Resuming at iteration 1 forgets the program of iteration 1 (it is generated again).
    resumed = EnvArchive(tmp_path, start_iteration=1)
    assert [e["env_id"] for e in resumed.read_index()] == [a, "env00007"]
    assert not (tmp_path / "envs" / f"{b}.py").exists()
    c = resumed.add("class CEnv: pass\n", {"iteration": 1})
    assert [e["env_id"] for e in resumed.read_index()] == [a, "env00007", c]
    assert resumed.source(c) == "class CEnv: pass\n" and resumed.source(a) == "class AEnv: pass\n"
