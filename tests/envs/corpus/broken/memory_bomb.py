# expect: invalid step
import random


class DigitEnv:
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target = self.rng.randint(1, 9)
        self.turn = 0
        return "Guess a digit 1-9 as \\boxed{N}.", {}

    def step(self, action):
        self.turn += 1
        hog = []
        while True:
            hog.append(bytearray(64 << 20))
        won = "\\boxed{%d}" % self.target in action
        return ("Right." if won else "Wrong."), float(won), won, self.turn >= 5, {}
