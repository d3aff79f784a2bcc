import random
import re

COLORS = ["R", "G", "B", "Y"]


class ColorCodeEnv:
    """Mastermind with three pegs of four colours; feedback gives exact and colour matches."""

    def __init__(self, max_turns=8):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.code = [rng.choice(COLORS) for _ in range(3)]
        while self.code[0] == self.code[1] == self.code[2]:
            self.code[2] = rng.choice(COLORS)
        self.turns = 0
        return "Guess a code of 3 colours from R, G, B, Y, e.g. \\boxed{RGB}.", {}

    def step(self, action):
        self.turns += 1
        m = re.findall(r"\\boxed\{([RGBYrgby]{3})\}", action)
        if not m:
            return "Answer with three letters from R, G, B, Y in \\boxed{}.", -0.1, False, \
                self.turns >= self.max_turns, {}
        guess = m[-1].upper()
        exact = sum(1 for i in range(3) if guess[i] == self.code[i])
        common = 0
        for c in COLORS:
            common += min(guess.count(c), self.code.count(c))
        if exact == 3:
            return "You cracked the code!", 1.0, True, False, {}
        msg = f"{guess}: {exact} exact, {common - exact} colour only."
        return msg, 0.0, False, self.turns >= self.max_turns, {}

    def solution(self):
        return "\\boxed{" + "".join(self.code) + "}"
