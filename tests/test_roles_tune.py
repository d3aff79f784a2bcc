"""Designer tune mode: a base program's constants, a reply's new values written over them, the mix."""

import dataclasses
import difflib
import re

import numpy as np
import pytest

from spade_jax import roles
from spade_jax.config import load_config
from spade_jax.curriculum import EnvMemory, EnvRecord
from spade_jax.curriculum.corpus import Document, ListCorpus
from spade_jax.envs.constants import apply_tuning, parse_tuning, tunable_constants
from spade_jax.envs.library import library_programs
from spade_jax.envs.validate import validate
from spade_jax.roles import (
    MEMORY_NEGATIVES_HEADER,
    MEMORY_POSITIVES_HEADER,
    NO_CHANGE_ERROR,
    RolesConfig,
    design_request,
    designer_program,
    designer_prompt,
)
from spade_jax.selfplay import SelfPlay


def _library_source(name):
    return next(p for p in library_programs() if p.name == name).source


# Read off the library file by hand (spade_jax/envs/library/odd_one_out.py); MAX_TURNS is left out
# (constants.UNTUNABLE).
ODD_ONE_OUT = {"ROUNDS": 4, "CHOICES": 5, "LIVES": 2,
               "PRIMES": [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]}


def test_tuned_library_program_validates_and_no_change_is_rejected():
    base = _library_source("code_breaker")
    request = dataclasses.replace(
        design_request(np.random.default_rng(0), "logical deduction",
                       cfg=RolesConfig(edit_prob=1.0, tune_prob=1.0)),
        base_name="code_breaker", base_source=base)
    assert request.mode == "tune"
    program, rejected = designer_program(request, "```python\nLENGTH = 5\nDIGITS = 7\n```")
    assert rejected is None and "    LENGTH = 5\n" in program and "    DIGITS = 7  #" in program
    verdict = validate(program)
    assert verdict.valid, verdict.errors
    for reply in ("```python\nLENGTH = 4\n```", "I like it as it is.", "```python\nLENGTH = 'long'\n```"):
        assert designer_program(request, reply) == ("", NO_CHANGE_ERROR)
    assert NO_CHANGE_ERROR.startswith("no change")
    with pytest.raises(ValueError, match="base_source"):
        designer_program(dataclasses.replace(request, base_source=None), "LENGTH = 5")


def test_tune_prompt_lists_constants_and_asks_for_assignments():
    base = _library_source("odd_one_out")
    messages = designer_prompt("pattern recognition", None, mode="tune", base_program=base, base_win_rate=0.9)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]  # one demonstration exchange
    demo, demo_reply, user = messages[1]["content"], messages[2]["content"], messages[3]["content"]
    assert "GuessEnv" in demo and "HARDER" in demo and demo_reply == "```python\nRANGE = 200\nTRIES = 2\n```"
    # The demonstration's names are not the base's: copying it changes nothing.
    demo_names = {name for reply in roles._TUNE_DEMO_REPLY.values() for name in parse_tuning(reply)}
    assert demo_names == {"RANGE", "TRIES"}
    for program in library_programs():
        assert not demo_names & set(tunable_constants(program.source)), program.name
    assert "class OddOneOutEnv" in user and "agent win rate 0.90" in user and "Tune it into a HARDER variant" in user
    assert "CHOICES = 5  # numbers per round; exactly one lacks the hidden property" in user
    assert "PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]" in user
    assert "`NAME = value`" in user
    easier = designer_prompt("pattern recognition", None, mode="tune", base_program=base, base_win_rate=0.1)
    assert "EASIER" in easier[1]["content"] and "EASIER" in easier[3]["content"]
    assert easier[2]["content"] == "```python\nRANGE = 20\nTRIES = 5\n```"
    short = designer_prompt("pattern recognition", None, mode="tune", base_program=base, base_win_rate=0.5,
                            cfg=RolesConfig(tune_show_program=False))[3]["content"]
    assert "def reset" not in short and "DIFFERENT" in short and "Agent win rate: 0.50." in short
    assert short.startswith("Skill to train: pattern recognition")
    assert "\n\nGame OddOneOutEnv: Pattern recognition: find" in short
    assert "LIVES = 2  # the LIVES-th wrong pick loses" in short
    with pytest.raises(ValueError, match="edit mode"):
        designer_prompt("optimization", None, mode="tune", base_program="class PlainEnv:\n    pass\n")


def test_tune_prompt_carries_the_document_and_memory_before_the_game():
    base = _library_source("odd_one_out")
    doc = Document("Primes", "A prime has exactly two divisors. " * 200)
    positive = EnvRecord("pos", "class PastEnv:\n    SIZE = 3\n", "pattern recognition", regret=0.3, win_rate=0.5)
    negative = EnvRecord("neg", "class DullEnv:\n    pass\n", "pattern recognition", regret=0.0, win_rate=0.99)
    cfg = RolesConfig(tune_show_program=False, max_prompt_chars=7_000, doc_max_chars=1_200, doc_min_chars=600)
    messages = designer_prompt("pattern recognition", doc, [positive], [negative], mode="tune", base_program=base,
                               base_win_rate=0.9, cfg=cfg)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    demo, user = messages[1]["content"], messages[3]["content"]
    assert "Grounding document" not in demo and MEMORY_POSITIVES_HEADER not in demo  # the demonstration is fixed
    pieces = ("Skill to train", "Grounding document: Primes", MEMORY_POSITIVES_HEADER, "class PastEnv:\n    SIZE = 3",
              MEMORY_NEGATIVES_HEADER, "- too easy (agent win rate 0.99): class DullEnv", "Game OddOneOutEnv",
              "Its constants", "change only its constants", "Use only these names")
    at = [user.index(piece) for piece in pieces]
    assert at == sorted(at)
    assert 600 <= len(user.split('"""')[1]) <= 1_210  # the document stays within the existing budgets
    assert "class DullEnv:" not in user
    # A reply is applied to the base's constants only: the memory example's SIZE is not one of them.
    tuned = apply_tuning(base, "```python\nSIZE = 4\nROUNDS = 5\n```")
    assert tunable_constants(tuned) == {**ODD_ONE_OUT, "ROUNDS": 5}


def test_design_request_tune_mode_records_document_and_memory():
    corpus = ListCorpus([Document(f"d{i}", f"text {i} " * 80) for i in range(3)])
    memory = EnvMemory()
    for i in range(3):
        memory.add(EnvRecord(f"m{i}", f"class Past{i}Env:\n    SIZE = {i + 2}\n", "optimization", regret=0.1 * i,
                             win_rate=0.5))
    memory.add(EnvRecord("hard", "class WallEnv:\n    pass\n", "optimization", regret=0.0, win_rate=0.0))
    cfg = RolesConfig(edit_prob=1.0, edit_from_memory_prob=0.0, tune_prob=1.0)
    request = design_request(np.random.default_rng(0), "optimization", corpus, memory, cfg=cfg)
    user = request.messages[-1]["content"]
    assert request.mode == "tune" and request.base_name in ("knapsack", "delivery_route")
    assert request.document_title in user and len(request.positive_ids) == 2 and request.negative_ids == ("hard",)
    assert all(memory[i].source.strip() in user for i in request.positive_ids)
    assert "- too hard (agent win rate 0.00): class WallEnv" in user


def test_design_request_produces_tune_requests_at_the_configured_rate():
    cfg = RolesConfig(edit_prob=0.5, tune_prob=0.8)
    requests = [design_request(np.random.default_rng(s), "optimization", cfg=cfg) for s in range(400)]
    counts = {m: sum(r.mode == m for r in requests) for m in ("write", "edit", "tune")}
    # Expected shares 0.5, 0.1, 0.4 of 400: 200, 40, 160 (binomial sd 10, 6, 10).
    assert 160 <= counts["write"] <= 240 and 20 <= counts["edit"] <= 60 and 125 <= counts["tune"] <= 195
    for r in requests:
        if r.mode == "tune":
            assert r.base_name in ("knapsack", "delivery_route") and r.document_title is None
            assert r.base_source == _library_source(r.base_name)
            assert r.messages[0]["content"] == roles.TUNER_SYSTEM
        elif r.mode == "edit":
            assert r.base_source == _library_source(r.base_name)
        else:
            assert r.base_source is None
    assert not any(design_request(np.random.default_rng(s), "optimization").mode == "tune" for s in range(50))


def test_design_request_rewrites_a_base_without_constants():
    memory = EnvMemory()
    memory.add(EnvRecord("plain", "class PlainEnv:\n    pass\n", "optimization", regret=0.5, win_rate=0.5))
    cfg = RolesConfig(edit_prob=1.0, edit_from_memory_prob=1.0, tune_prob=1.0)
    request = design_request(np.random.default_rng(0), "optimization", None, memory, cfg=cfg)
    assert request.mode == "edit" and request.base_name == "plain"


def test_roles_config_validates_tune_fields():
    with pytest.raises(ValueError, match="tune_prob"):
        RolesConfig(tune_prob=1.5)
    with pytest.raises(ValueError, match="tune_max_new_tokens"):
        RolesConfig(tune_max_new_tokens=0)


def _changed_lines(a: str, b: str) -> int:
    return sum(line.startswith(("+ ", "- ")) for line in difflib.ndiff(a.splitlines(), b.splitlines()))


class _FakePolicy:
    """Chat 'tokens' are an index into the conversations seen; replies depend on the mode."""

    def __init__(self):
        self.messages, self.calls = [], []

    def chat_tokens(self, messages):
        self.messages.append(messages)
        return [len(self.messages) - 1]

    def generate(self, prompts, config, key):
        self.calls.append((len(prompts), config.max_new_tokens))
        texts = []
        for (index,) in prompts:
            tune = self.messages[index][0]["content"] == roles.TUNER_SYSTEM
            if tune:  # one more of the first integer constant the prompt lists
                listed = self.messages[index][-1]["content"].split("Its constants")[1]
                name, value = re.search(r"^([A-Z][A-Z0-9_]*) = (\d+)\b", listed, re.MULTILINE).groups()
                texts.append(f"```python\n{name} = {int(value) + 1}\n```")
            else:
                texts.append("```python\nclass RewrittenEnv:\n    pass\n```")
        n = len(prompts)
        return type("Result", (), {"texts": texts, "prompt_lengths": [1] * n, "tokens": [[7]] * n,
                                   "logprobs": [[-1.0]] * n, "finish_reasons": ["eos"] * n})


def test_design_pool_samples_tune_requests_in_their_own_small_batch():
    cfg = load_config("default", ["pool_size=12", "roles.edit_prob=1.0", "roles.tune_prob=0.5",
                                  "roles.tune_max_new_tokens=40", "roles.repair=false"])
    play = SelfPlay.__new__(SelfPlay)
    play.cfg, play.policy, play.iteration, play.envs_made, play.timer = cfg, _FakePolicy(), 0, 0, None
    play.rng, play.corpus, play.memory = np.random.default_rng(1), None, EnvMemory()
    play.seed_programs = None  # default has no env_pool: the library's programs
    play.archive = type("Archive", (), {"add": lambda self, source, meta: None})()
    checked = []
    play.check = lambda env: (checked.append(env.env_id), dataclasses.replace(env, valid=True))[1]
    pool, _ = play.design_pool()  # (one design per slot, every attempt)
    calls = sorted(play.policy.calls, key=lambda c: c[1])
    tunes = [e for e in pool if not e.source.startswith("class RewrittenEnv")]
    assert calls == [(len(tunes), 40), (12 - len(tunes), cfg.designer_sampling.max_new_tokens)]
    assert 0 < len(tunes) < 12
    for env in pool:
        assert env.valid and env.env_id in checked
        if env in tunes:  # a library program with one constant one higher
            assert any(_changed_lines(p.source, env.source) == 2 for p in library_programs())
        assert env.designer_sample == {"prompt": [int(env.env_id[3:]) - 1], "tokens": [7], "logprobs": [-1.0]}
