# expect: invalid step
import signal
import random


class DigitEnv:
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target = self.rng.randint(1, 9)
        self.turn = 0
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGXCPU, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        return "Guess a digit 1-9 as \\boxed{N}.", {}

    def step(self, action):
        self.turn += 1
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        while True:
            pass
        won = "\\boxed{%d}" % self.target in action
        return ("Right." if won else "Wrong."), float(won), won, self.turn >= 5, {}
