"""Pattern recognition: discover the hidden rule of an integer sequence and predict its next terms."""

import random
import re


class SequenceRuleEnv:
    MAX_TURNS = 10  # hard cap on steps, invalid ones included (then truncated)
    SHOWN = 5  # terms visible at the start
    ROUNDS = 3  # further terms to predict, one per round
    LIVES = 2  # the LIVES-th wrong prediction loses (never more lives than ROUNDS: else a guess could not lose)
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of terms predicted right (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        # Rules: 0 arithmetic, 1 geometric, 2 quadratic, 3 Fibonacci-like, 4 two interleaved arithmetic sequences.
        self.rule = rng.randrange(5)
        a = rng.randint(1, 9)
        b = rng.randint(2, 9)
        c = rng.randint(1, 3)
        d = rng.randint(2, 9)
        total = self.SHOWN + self.ROUNDS
        self.terms = [0] * total
        for n in range(total):
            if self.rule == 0:
                self.terms[n] = a + b * n
            elif self.rule == 1:
                self.terms[n] = a * (c + 1) ** n
            elif self.rule == 2:
                self.terms[n] = a + b * n + c * n * n
            elif self.rule == 3:
                self.terms[n] = a if n == 0 else b if n == 1 else self.terms[n - 1] + self.terms[n - 2]
            else:
                self.terms[n] = a + b * (n // 2) if n % 2 == 0 else d + c * 10 + a * (n // 2)
        self.known = self.SHOWN
        self.start_lives = min(self.LIVES, self.ROUNDS)
        self.lives = self.start_lives
        self.turn = 0
        self.done = False
        intro = (
            f"These are the first {self.SHOWN} terms of an integer sequence made by a simple hidden rule. Predict "
            f"the next {self.ROUNDS} terms one at a time; {self.lives} wrong predictions lose."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        # At most one leading minus sign, and few enough digits to stay a small integer.
        if cmd is not None and cmd.lstrip("-").isdecimal() and len(cmd) - len(cmd.lstrip("-")) <= 1 and len(cmd) <= 12:
            guess = int(cmd)
            answer = self.terms[self.known]
            self.known += 1
            if guess == answer:
                message = f"Correct: the next term is {answer}."
            else:
                self.lives -= 1
                message = f"Wrong: the next term is {answer}, not {guess}."
            if self.lives == 0:
                self.done = True
                right = self.known - self.SHOWN - (self.start_lives - self.lives)
                reward = self.PARTIAL * right / self.ROUNDS
                return self._observe(message + " No lives left; you lose."), reward, True, False, {}
            if self.known == self.SHOWN + self.ROUNDS:
                self.done = True
                return self._observe(message + " Sequence complete, you win!"), 1.0, True, False, {}
        else:
            message = "Invalid action (turn lost): predict the next term as an integer, e.g. \\boxed{42}."
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{self.terms[n]}}}" for n in range(self.SHOWN, self.SHOWN + self.ROUNDS)]

    def close(self):
        pass

    def _observe(self, message):
        seen = ", ".join(str(self.terms[n]) for n in range(self.SHOWN + self.ROUNDS) if n < self.known)
        return (
            f"{message}\nSequence so far: {seen}, ?\nLives: {self.lives}. "
            f"Terms left to predict: {self.SHOWN + self.ROUNDS - self.known}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            "Actions: \\boxed{n} predicts that the next term is the integer n; for example \\boxed{42}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
