import random
import re

WORDS = ["banana", "cabbage", "balloon", "letter", "mississippi", "committee", "pepper", "bookkeeper"]


class LetterCountEnv:
    """How many times does a letter occur in a word? The player answers with a number."""

    def __init__(self, max_turns=4):
        self.max_turns = max_turns
        self.word = WORDS[0]
        self.letter = "a"
        self.turns = 0

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.word = rng.choice(WORDS)
        self.letter = rng.choice(self.word)
        self._answer = 0
        for ch in self.word:
            if ch == self.letter:
                self._answer += 1
        self.turns = 0
        return f"How many times does '{self.letter}' occur in '{self.word}'? Answer with \\boxed{{n}}.", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{(\d+)\}", action)
        if not m:
            return f"Give a number in \\boxed{{}}. Word: {self.word}", -0.1, False, self.turns >= self.max_turns, {}
        guess = int(m[-1])
        if guess == self._answer:
            return "Correct!", 1.0, True, False, {}
        hint = "more" if guess < self._answer else "fewer"
        if self.turns >= self.max_turns:
            return f"Out of turns. The answer was {self._answer}.", 0.0, False, True, {}
        return f"Wrong, there are {hint}. Word: {self.word} ({len(self.word)} letters)", 0.0, False, False, {}

    def solution(self):
        return "\\boxed{" + str(self.word.count(self.letter)) + "}"
