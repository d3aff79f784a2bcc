"""Role prompts and parsing: designer (write/edit/repair), hint writer, agent."""

import dataclasses

import numpy as np
import pytest

from spade_jax.curriculum import SKILLS, EnvMemory, EnvRecord
from spade_jax.curriculum.corpus import Document, ListCorpus
from spade_jax.envs.program import find_env_class
from spade_jax.roles import (
    ENV_CONTRACT,
    MEMORY_NEGATIVES_HEADER,
    MEMORY_POSITIVES_HEADER,
    RolesConfig,
    agent_messages,
    agent_turn,
    design_request,
    designer_prompt,
    hint_prompt,
    parse_designer_output,
    parse_hint,
    repair_prompt,
    with_hint,
)

PROGRAM = '''import random

class CountEnv:
    def reset(self, seed=None):
        self.n = random.Random(seed).randint(1, 9)
        return f"Say {self.n}. Actions: \\\\boxed{{<number>}}", {}
'''


@dataclasses.dataclass
class Item:
    name: str
    skill: str
    source: str


def _library():
    return [Item(f"lib_{i}", skill, f"class Lib{i}Env:\n    pass  # {skill}\n") for i, skill in enumerate(SKILLS)]


def _memory():
    memory = EnvMemory()
    memory.add(EnvRecord("hi_regret", "class PosAEnv:\n    pass\n", "optimization", regret=0.5, win_rate=0.5))
    memory.add(EnvRecord("mid_regret", "class PosBEnv:\n    pass\n", "optimization", regret=0.3, win_rate=0.3))
    memory.add(EnvRecord("too_easy", "class EasyEnv:\n    pass\n", "optimization", regret=0.0, win_rate=0.97))
    return memory


def test_contract_states_the_interface_precisely():
    for phrase in ("reset(self, seed=None) -> (observation: str, info: dict)", "terminated: bool, truncated: bool",
                   "\\boxed{...}", "returns 1.0 with terminated=True", "truncated=True", "25 turns", "solution(self)",
                   "close(self)", "random.Random(seed)", "ends in `Env`"):
        assert phrase in ENV_CONTRACT, phrase


def test_jax_subset_advice_is_ours_and_can_be_switched_off():
    from spade_jax.roles import RolesConfig, designer_system

    assert "instead of while loops" in designer_system(RolesConfig())
    assert "instead of while loops" not in designer_system(RolesConfig(jax_subset_advice=False))
    assert ENV_CONTRACT in designer_system(RolesConfig(jax_subset_advice=False))


def test_contract_states_what_spade_asks_of_a_game():
    # spade-rl/spade spare/core/prompts/corpus_template.py: hidden state, partial progress rewards in
    # [0, 1], robustness to malformed actions, self-verification, standard library, several steps.
    for phrase in ("Hidden state", "Rewards lie in [0, 1]", "partial credit", "partial progress",
                   "Robust to malformed actions", "never raises", "checks every answer itself",
                   "only the Python standard library", "at least 3 actions", "trace your program",
                   "solution() from reset(seed=0) must reach the goal"):
        assert phrase in ENV_CONTRACT, phrase


def test_write_prompt_holds_skill_document_examples_and_negative():
    doc = Document("Tides", "The moon pulls the sea twice a day.")
    memory = _memory()
    pos, neg = memory.sample_for_designer(np.random.default_rng(0), 2, 1, "optimization")
    messages = designer_prompt("optimization", doc, pos, neg, "class LibEnv:\n    pass\n")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert ENV_CONTRACT in messages[0]["content"]
    user = messages[1]["content"]
    for piece in ("Skill to train: optimization", "Grounding document: Tides", "moon pulls the sea",
                  "class LibEnv", MEMORY_POSITIVES_HEADER, "class PosAEnv", "class PosBEnv", MEMORY_NEGATIVES_HEADER,
                  "- too easy (agent win rate 0.97): class EasyEnv", "```python"):
        assert piece in user, piece
    assert user.index("PosAEnv") < user.index("PosBEnv")  # highest regret first
    assert "class EasyEnv:" not in user  # a negative is one line, without its code


def test_memory_positives_are_cut_and_negatives_name_their_class():
    long_source = "class LongEnv:\n" + "    X = 1\n" * 1000
    positive = EnvRecord("long", long_source, "optimization", regret=0.4, win_rate=0.5)
    hard = EnvRecord("hard", "import random\n\nclass HelperBase:\n    pass\n\nclass WallEnv(HelperBase):\n    pass\n",
                     "optimization", regret=0.0, win_rate=0.02)
    broken = EnvRecord("broken_id", "class (:", "optimization", regret=0.0, win_rate=1.0)
    user = designer_prompt("optimization", None, [positive], [hard, broken],
                           cfg=RolesConfig(memory_example_max_chars=2_000))[1]["content"]
    block = user.split("Past environment 1")[1].split("```python\n")[1].split("```")[0]
    assert 1_900 <= len(block) <= 2_030 and "(rest omitted)" in block
    assert "- too hard (agent win rate 0.02): class WallEnv" in user
    assert "- too easy (agent win rate 1.00): class broken_id" in user


def test_edit_prompt_asks_for_a_variant_toward_the_band():
    harder = designer_prompt("logical deduction", None, mode="edit", base_program="class BaseEnv:\n    pass\n",
                             base_win_rate=0.95)[1]["content"]
    assert "class BaseEnv" in harder and "HARDER" in harder and "Grounding document" not in harder
    easier = designer_prompt("logical deduction", None, mode="edit", base_program="class BaseEnv: pass",
                             base_win_rate=0.05)[1]["content"]
    assert "EASIER" in easier
    with pytest.raises(ValueError, match="base_program"):
        designer_prompt("logical deduction", None, mode="edit")
    with pytest.raises(ValueError, match="mode"):
        designer_prompt("logical deduction", None, mode="mutate")


def test_document_fills_the_prompt_budget_but_no_more():
    doc = Document("Long", "word " * 20_000)
    cfg = RolesConfig(max_prompt_chars=9_000, doc_max_chars=8_000, doc_min_chars=500)
    messages = designer_prompt("optimization", doc, library_example="class LibEnv: pass", cfg=cfg)
    total = sum(len(m["content"]) for m in messages)
    assert 8_000 <= total <= 9_000
    big_example = "class LibEnv:\n" + "    x = 1\n" * 600
    tight = dataclasses.replace(cfg, max_prompt_chars=7_000)
    squeezed = designer_prompt("optimization", doc, library_example=big_example, cfg=tight)[1]["content"]
    document_part = squeezed.split('"""')[1]
    assert 400 <= len(document_part) <= 510  # cut to doc_min_chars even over the budget


def test_design_request_modes_and_determinism():
    corpus = ListCorpus([Document(f"d{i}", f"text {i} " * 50) for i in range(5)])
    library, memory = _library(), _memory()
    requests = [design_request(np.random.default_rng(s), "optimization", corpus, memory, library) for s in range(40)]
    modes = [r.mode for r in requests]
    assert 20 <= modes.count("edit") <= 40 and "write" in modes  # default edit_prob 0.8
    edit_bases = {r.base_name for r in requests if r.mode == "edit"}
    assert edit_bases <= {"hi_regret", "mid_regret", "lib_4"} and len(edit_bases) >= 2
    for r in requests:  # memory and document in every prompt, whatever the mode (SPADE)
        user = r.messages[-1]["content"]
        assert r.negative_ids == ("too_easy",) and "class EasyEnv" in user and MEMORY_NEGATIVES_HEADER in user
        assert r.document_title is not None and f"Grounding document: {r.document_title}" in user
        if r.mode == "write" or r.base_name == "lib_4":
            assert set(r.positive_ids) == {"hi_regret", "mid_regret"}
        else:  # the memory base is in the prompt once, as the base; the other positive is shown
            assert r.positive_ids == tuple({"hi_regret", "mid_regret"} - {r.base_name})
            assert user.count(memory[r.base_name].source.strip()) == 1
        assert MEMORY_POSITIVES_HEADER in user
        for env_id in r.positive_ids:
            assert memory[env_id].source.strip() in user
    again = design_request(np.random.default_rng(3), "optimization", corpus, memory, library)
    assert again == requests[3]
    only_write = design_request(
        np.random.default_rng(0), "optimization", corpus, None, library, RolesConfig(edit_prob=0.0)
    )
    assert only_write.mode == "write" and "class Lib4Env" in only_write.messages[1]["content"]
    assert only_write.positive_ids == only_write.negative_ids == ()
    assert MEMORY_POSITIVES_HEADER not in only_write.messages[1]["content"]
    no_corpus = design_request(np.random.default_rng(0), "optimization", None, None, library)
    assert no_corpus.document_title is None and "Grounding document" not in no_corpus.messages[1]["content"]


def test_design_request_shows_only_memory_of_the_requested_skill():
    library, memory = _library(), _memory()
    requests = [design_request(np.random.default_rng(s), "causal inference", None, memory, library) for s in range(20)]
    for r in requests:
        assert r.positive_ids == r.negative_ids == () and MEMORY_POSITIVES_HEADER not in r.messages[-1]["content"]
        assert r.base_name in (None, "lib_5")


def test_design_request_ablations_change_only_what_they_remove():
    corpus = ListCorpus([Document(f"d{i}", f"text {i} " * 50) for i in range(5)])
    library, memory = _library(), _memory()
    cfg = RolesConfig(edit_from_memory_prob=0.0)  # library bases, so the no-memory runs can pick the same
    for seed in range(20):
        full = design_request(np.random.default_rng(seed), "optimization", corpus, memory, library, cfg)
        no_memory = design_request(np.random.default_rng(seed), "optimization", corpus, None, library, cfg)
        no_corpus = design_request(np.random.default_rng(seed), "optimization", None, memory, library, cfg)
        assert full.mode == no_memory.mode == no_corpus.mode
        assert full.base_name == no_memory.base_name == no_corpus.base_name
        assert full.document_title == no_memory.document_title and no_corpus.document_title is None
        assert (full.positive_ids, full.negative_ids) == (no_corpus.positive_ids, no_corpus.negative_ids)


def test_design_request_uses_the_real_library_by_default():
    request = design_request(np.random.default_rng(0), "spatial reasoning", cfg=RolesConfig(edit_prob=1.0))
    assert request.mode == "edit" and request.base_name in ("grid_maze", "sliding_puzzle")


def test_parse_designer_output():
    reply = "Here is my game.\n```python\n" + PROGRAM + "```\nUsage:\n```python\nenv = CountEnv()\n```\n"
    source = parse_designer_output(reply)
    assert source.startswith("import random") and find_env_class(source) == "CountEnv"
    assert parse_designer_output("<think>```python\nclass WrongEnv: pass\n```</think>" + reply) == source
    assert parse_designer_output("I cannot write code today.") == ""


def test_repair_prompt_lists_errors_and_the_program():
    messages = repair_prompt(PROGRAM, ["reset returned 1 value, expected 2", "no step method"])
    user = messages[1]["content"]
    assert "- reset returned 1 value, expected 2" in user and "- no step method" in user and "class CountEnv" in user


def test_hint_prompt_and_parse_hint():
    messages = hint_prompt(PROGRAM)
    user = messages[1]["content"]
    assert "class CountEnv" in user and "Never give the answer" in user
    # SPADE's hint writer: the puzzle, how the answer is derived, the answer format, under 100 words.
    for phrase in ("the puzzle as the player sees it", "how the winning answer is derived", "the form an action takes",
                   "under 100 words", "names the action format in words"):
        assert phrase in user, phrase
    reply = ("Hint: Work backwards from the target. The answer is 42. Use \\boxed{mul} first. "
             "Multiplying early grows the value fastest! Keep count of the moves left. Extra sentence.")
    assert parse_hint(reply) == ("Work backwards from the target. Multiplying early grows the value fastest! "
                                 "Keep count of the moves left.")
    assert parse_hint(reply, max_sentences=1) == "Work backwards from the target."
    leak = "Press mul, then add, then add. Prefer the operation that grows fastest."
    solution = ["\\boxed{mul}", "\\boxed{add}", "\\boxed{add}"]
    assert parse_hint(leak, solution=solution) == "Prefer the operation that grows fastest."
    assert parse_hint("The secret word is apple. Think about fruit.", solution="\\boxed{apple}") == "Think about fruit."
    assert parse_hint("<think>the answer is 3</think>Count the odd ones.") == "Count the odd ones."
    assert parse_hint("```python\nprint(1)\n```") == ""
    # Naming the format is not a leak; giving the value is.
    fmt = "Add the two clues. The answer is a single integer. The final answer is 17. Answer: 17."
    assert parse_hint(fmt) == "Add the two clues. The answer is a single integer."


def test_parse_hint_keeps_under_the_word_limit():
    sentence = " ".join(["word"] * 40) + "."
    assert parse_hint(" ".join([sentence] * 3)) == " ".join([sentence] * 2)  # 80 words; a third would pass 100
    assert parse_hint(" ".join(["long"] * 150) + ".") == " ".join(["long"] * 100)
    assert parse_hint(sentence + " Short one.", max_words=41) == sentence


def test_agent_messages_and_turns():
    plain = agent_messages("Value 3. Actions: \\boxed{add}")
    hinted = agent_messages("Value 3. Actions: \\boxed{add}", hint="Grow it fast.")
    assert plain[0]["role"] == "system" and "inside \\boxed{}" in plain[0]["content"]
    assert plain[1]["content"] == "Value 3. Actions: \\boxed{add}"
    assert hinted[1]["content"] == "Value 3. Actions: \\boxed{add}\n\nHint: Grow it fast."
    assert with_hint("obs", None) == with_hint("obs", "") == "obs"
    turn = agent_turn(plain, "I add. \\boxed{add}", "Value 5.")
    assert [m["role"] for m in turn] == ["system", "user", "assistant", "user"] and len(plain) == 2


def test_roles_config_validation():
    with pytest.raises(ValueError, match="edit_prob"):
        RolesConfig(edit_prob=1.5)
    with pytest.raises(ValueError, match="max_hint_sentences"):
        RolesConfig(max_hint_sentences=0)
