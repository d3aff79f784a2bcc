"""Helpers the evaluation tests share: scripted policies that play held-out tasks perfectly, and a
generated-looking rewrite of Tower of Hanoi."""

from __future__ import annotations

import re

from spade_jax import evaluation as ev

# The optimal 3-disk Tower of Hanoi plan from tower A to tower C.
HANOI_PLAN = ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]



def _assistant_turns(messages):
    return sum(m["role"] == "assistant" for m in messages)



def _hanoi(messages, moves=HANOI_PLAN):
    k = _assistant_turns(messages)
    return f"Next move: \\boxed{{{moves[k]}}}" if k < len(moves) else "I give up."



def _guess_binary_search(messages, low=1, high=50):
    # Narrow the range from the game's own feedback ("... is higher than 25.").
    for m in messages:
        if m["role"] == "user":
            for word, number in re.findall(r"is (higher|lower) than (\d+)", m["content"]):
                if word == "higher":
                    low = max(low, int(number) + 1)
                else:
                    high = min(high, int(number) - 1)
    return f"\\boxed{{{(low + high) // 2}}}"



def _oracle_answers(name, seeds):
    """Reference answers straight from reasoning-gym, keyed by question text."""
    import reasoning_gym

    answers = {}
    for seed in seeds:
        entry = reasoning_gym.create_dataset(name, size=1, seed=seed)[0]
        answers[entry["question"].strip()] = entry["answer"]
    return answers



def _scripted_policy(rg_answers):
    def policy(conversations):
        replies = []
        for messages in conversations:
            first = next(m["content"] for m in messages if m["role"] == "user")
            if "Tower of Hanoi" in first:
                replies.append(_hanoi(messages))
            elif "Guess The Number" in first:
                replies.append(_guess_binary_search(messages))
            else:
                question = first.split("\n\n" + ev.RG_ANSWER_INSTRUCTION)[0].strip()
                if question in rg_answers:
                    replies.append(f"The answer is \\boxed{{{rg_answers[question]}}}")
                else:
                    replies.append("no idea")  # Sudoku: unparseable, ends the episode
        return replies

    return policy



HANOI_REWRITE = '''
import re

class HanoiEnv:
    def reset(self, seed=None):
        self.towers = {"A": [3, 2, 1], "B": [], "C": []}
        intro = ("Tower of Hanoi with 3 disks. Move every disk from tower A to tower C. "
                 "Each move takes the top disk of one tower to another tower, written like \\\\boxed{A C}. "
                 "A bigger disk can never be placed on a smaller disk.")
        return intro + "\\n" + self._board(), {}

    def _board(self):
        return "\\n".join(f"{k}: {v}" for k, v in self.towers.items()) + "\\nEnter your move."

    def step(self, action):
        return "Illegal move.", 0.0, False, False, {}
'''
