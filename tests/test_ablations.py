"""The no_memory and no_corpus ablations change every designer prompt they claim to change, and only
the part they remove: in SPADE memory examples and a grounding document go into every generation
prompt, so an ablation that misses the tune or edit prompts ablates a fraction of the designs."""

import dataclasses

import numpy as np
import pytest

from spade_jax import roles
from spade_jax.config import load_config
from spade_jax.curriculum import EnvMemory, EnvRecord, skills_for_regeneration
from spade_jax.curriculum.corpus import load_corpus
from spade_jax.roles import MEMORY_NEGATIVES_HEADER, MEMORY_POSITIVES_HEADER
from spade_jax.selfplay import SelfPlay, seed_programs

SLOTS = 120  # designer prompts per config: enough for every mode of the default mix (10% write, 13.5% edit)
MEMORY_MARK = "Remembered"  # in every memory record's class name, nowhere else


def _filled_memory(cfg) -> EnvMemory:
    """Per skill: three in-band records (positives; with constants, so a memory base can be tuned) and
    two out-of-band ones (negatives)."""
    memory = EnvMemory.from_config(cfg.curriculum)
    for s, skill in enumerate(sorted({k for r in range(6) for k in skills_for_regeneration(r, 3)})):
        for i, win_rate in enumerate((0.3, 0.5, 0.7, 0.97, 0.02)):
            source = (f'"""A remembered game for {skill}."""\n\n\nclass {MEMORY_MARK}{s}x{i}Env:\n'
                      f"    SIZE = {i + 3}  # cells\n\n    def reset(self, seed=None):\n        return 'state', {{}}\n")
            memory.add(EnvRecord(f"mem{s}_{i}", source, skill, regret=0.1 * i, win_rate=win_rate, iteration=i))
    return memory


def _design_requests(cfg, slots: int = SLOTS) -> list[roles.DesignRequest]:
    """The designer requests one seeded run of `cfg` builds, as SelfPlay.design_pool makes them."""
    corpus, memory = load_corpus(cfg.corpus), _filled_memory(cfg)
    rng = np.random.default_rng(7)
    requests = []
    for i in range(slots):
        skills = skills_for_regeneration(i // cfg.pool_size, cfg.curriculum.skills_per_regen)
        requests.append(roles.design_request(
            rng, skills[i % len(skills)], corpus, memory if cfg.use_memory else None, cfg=cfg.roles,
            positives=cfg.curriculum.positives, negatives=cfg.curriculum.negatives,
        ))
    return requests


def _text(request: roles.DesignRequest) -> str:
    return "\n".join(m["content"] for m in request.messages)


def _has_memory(text: str) -> bool:
    return MEMORY_MARK in text or MEMORY_POSITIVES_HEADER in text or MEMORY_NEGATIVES_HEADER in text


@pytest.fixture(scope="module")
def runs():
    configs = {name: load_config(name) for name in ("default", "no_memory", "no_corpus")}
    return configs, {name: _design_requests(cfg) for name, cfg in configs.items()}


def test_the_ablation_configs_differ_from_default_only_in_what_they_ablate(runs):
    configs, _ = runs
    default = configs["default"]
    assert default.use_memory and default.corpus.kind != "none"
    assert configs["no_memory"] == dataclasses.replace(default, use_memory=False)
    assert configs["no_corpus"] == dataclasses.replace(default, corpus=dataclasses.replace(default.corpus, kind="none"))


def test_default_puts_memory_and_a_document_in_every_designer_prompt(runs):
    configs, requests = runs
    modes = [r.mode for r in requests["default"]]
    assert {"write", "edit", "tune"} <= set(modes), modes
    for r in requests["default"]:
        user = r.messages[-1]["content"]
        # Positives with their code, and every negative as one line without code.
        assert MEMORY_POSITIVES_HEADER in user and r.positive_ids, (r.mode, r.base_name)
        assert MEMORY_NEGATIVES_HEADER in user and len(r.negative_ids) == 1
        base_from_memory = r.base_name is not None and r.base_name.startswith("mem")
        base_shown = base_from_memory and (r.mode == "edit" or configs["default"].roles.tune_show_program)
        assert user.count(f"class {MEMORY_MARK}") == len(r.positive_ids) + len(r.negative_ids) + base_shown
        assert r.document_title and f"Grounding document: {r.document_title}" in user, (r.mode, r.base_name)


def test_no_memory_removes_every_memory_example_and_nothing_else(runs):
    _, requests = runs
    for full, ablated in zip(requests["default"], requests["no_memory"], strict=True):
        assert not _has_memory(_text(ablated)) and ablated.positive_ids == ablated.negative_ids == ()
        # The same kind of prompt otherwise: the mode, the document and, unless memory gave it, the base.
        assert ablated.mode == full.mode and ablated.skill == full.skill
        assert ablated.document_title == full.document_title
        assert f"Grounding document: {ablated.document_title}" in ablated.messages[-1]["content"]
        if full.base_name is None or not full.base_name.startswith("mem"):
            assert ablated.base_name == full.base_name
        else:
            assert ablated.base_name is not None and not ablated.base_name.startswith("mem")


def test_no_corpus_removes_every_document_and_nothing_else(runs):
    _, requests = runs
    for full, ablated in zip(requests["default"], requests["no_corpus"], strict=True):
        assert ablated.document_title is None and "Grounding document" not in _text(ablated)
        assert full.document_title is not None and full.document_title not in _text(ablated)
        assert (ablated.mode, ablated.skill, ablated.base_name) == (full.mode, full.skill, full.base_name)
        assert (ablated.positive_ids, ablated.negative_ids) == (full.positive_ids, full.negative_ids)
        assert _has_memory(_text(ablated))


class _CapturePolicy:
    """Records the designer conversations; every reply is an empty program."""

    def __init__(self):
        self.messages = []

    def chat_tokens(self, messages):
        self.messages.append(messages)
        return [len(self.messages) - 1]

    def generate(self, prompts, config, key):
        n = len(prompts)
        return type("Result", (), {"texts": [""] * n, "prompt_lengths": [1] * n, "tokens": [[0]] * n,
                                   "logprobs": [[0.0]] * n})


@pytest.mark.parametrize("name", ["default", "no_memory", "no_corpus"])
def test_selfplay_design_pool_passes_memory_and_corpus_as_the_config_says(name):
    cfg = load_config(name, ["pool_size=24", "roles.repair=false"])
    play = SelfPlay.__new__(SelfPlay)
    play.cfg, play.policy, play.iteration, play.envs_made, play.timer = cfg, _CapturePolicy(), 0, 0, None
    play.rng, play.corpus, play.memory = np.random.default_rng(3), load_corpus(cfg.corpus), _filled_memory(cfg)
    play.seed_programs = seed_programs(cfg.env_pool, cfg.domain)
    play.archive = type("Archive", (), {"add": lambda self, source, meta: None})()
    play.check = lambda env: env
    play.design_pool()  # empty replies are invalid: slots may be designed again, each with a fresh prompt
    texts = ["\n".join(m["content"] for m in messages) for messages in play.policy.messages]
    assert len(texts) >= 24
    with_memory = [_has_memory(t) for t in texts]
    with_document = ["Grounding document" in t for t in texts]
    assert with_memory == [cfg.use_memory] * len(texts)
    assert with_document == [cfg.corpus.kind != "none"] * len(texts)
