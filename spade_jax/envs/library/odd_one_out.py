"""Pattern recognition: find the number that breaks a hidden property, over rounds that share that property."""

import random
import re


class OddOneOutEnv:
    MAX_TURNS = 10  # hard cap on steps, invalid ones included (then truncated)
    ROUNDS = 4
    CHOICES = 5  # numbers per round; exactly one lacks the hidden property
    LIVES = 2  # the LIVES-th wrong pick loses
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of rounds answered right (a win scores 1)
    PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]

    def reset(self, seed=None):
        rng = random.Random(seed)
        # Properties: 0 multiple of param, 1 perfect square, 2 last digit is param, 3 power of two, 4 prime.
        self.kind = rng.randrange(5)
        self.param = rng.randint(3, 9) if self.kind == 0 else rng.randint(0, 9)
        self.numbers = [[0] * self.CHOICES for _ in range(self.ROUNDS)]
        self.odd = [0] * self.ROUNDS
        for r in range(self.ROUNDS):
            bases = rng.sample(range(1, 11), self.CHOICES - 1)
            base = rng.randint(2, 9)
            extra = rng.randint(0, 99)
            self.odd[r] = rng.randrange(self.CHOICES)
            for i in range(self.CHOICES):
                if i == self.odd[r]:
                    self.numbers[r][i] = self._outlier(base, extra)
                else:
                    self.numbers[r][i] = self._member(bases[i if i < self.odd[r] else i - 1])
        self.round = 0
        self.lives = self.LIVES
        self.turn = 0
        self.done = False
        intro = (
            f"Each round shows {self.CHOICES} numbers. All but one share a hidden property, the same in every "
            f"round. Pick the odd one out by its position 1..{self.CHOICES}. Survive {self.ROUNDS} rounds; "
            f"{self.LIVES} wrong picks lose."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        if cmd is not None and cmd.isdecimal() and len(cmd) <= 2 and 1 <= int(cmd) <= self.CHOICES:
            odd = self.odd[self.round]
            if int(cmd) - 1 == odd:
                message = f"Correct: {self.numbers[self.round][odd]} is the odd one out."
            else:
                self.lives -= 1
                message = f"Wrong: the odd one out was {self.numbers[self.round][odd]} at position {odd + 1}."
            self.round += 1
            if self.lives == 0:
                self.done = True
                message += f" No lives left; the property was: {self._rule()}. You lose."
                right = self.round - (self.LIVES - self.lives)
                return self._observe(message), self.PARTIAL * right / self.ROUNDS, True, False, {}
            if self.round == self.ROUNDS:
                self.done = True
                return self._observe(message + f" The property was: {self._rule()}. You win!"), 1.0, True, False, {}
        else:
            message = f"Invalid action (turn lost): pick a position, e.g. \\boxed{{1}} (positions 1..{self.CHOICES})."
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{self.odd[r] + 1}}}" for r in range(self.ROUNDS)]

    def close(self):
        pass

    def _member(self, base):
        if self.kind == 0:
            return self.param * base
        if self.kind == 1:
            return base * base
        if self.kind == 2:
            return 10 * base + self.param
        if self.kind == 3:
            return 2**base
        return self.PRIMES[base]

    def _outlier(self, base, extra):
        # Each value lies strictly between two members, or is a product, so it lacks the property.
        if self.kind == 0:
            return self.param * base + 1 + extra % (self.param - 1)
        if self.kind == 1:
            return base * base + 1 + extra % (2 * base)
        if self.kind == 2:
            return 10 * base + (self.param + 1 + extra % 9) % 10
        if self.kind == 3:
            return 2**base + 1 + extra % (2**base - 1)
        return base * (2 + extra % 8)

    def _rule(self):
        if self.kind == 0:
            return f"multiples of {self.param}"
        if self.kind == 1:
            return "perfect squares"
        if self.kind == 2:
            return f"last digit {self.param}"
        if self.kind == 3:
            return "powers of two"
        return "prime numbers"

    def _observe(self, message):
        current = min(self.round, self.ROUNDS - 1)
        shown = "  ".join(f"{i + 1}) {self.numbers[current][i]}" for i in range(self.CHOICES))
        return (
            f"{message}\nRound {current + 1}/{self.ROUNDS}: {shown}\n"
            f"Lives: {self.lives}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            f"Actions: \\boxed{{p}} picks the number at position p, a number 1..{self.CHOICES}; "
            f"for example \\boxed{{{1 + self.turn % self.CHOICES}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
