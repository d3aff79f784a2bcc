# expect: invalid determinism
import random


class CounterEnv:
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target = self.rng.randint(1, 9)
        self.turn = 0
        CounterEnv.episodes = getattr(CounterEnv, "episodes", 0) + 1
        return "Episode %d: guess a digit 1-9 as \\boxed{N}." % CounterEnv.episodes, {}

    def step(self, action):
        self.turn += 1
        won = "\\boxed{%d}" % self.target in action
        return ("Right." if won else "Wrong."), float(won), won, self.turn >= 5, {}
