"""Logical deduction: break a hidden 4-digit code (digits 1-6) from exact/misplaced feedback."""

import random
import re


class CodeBreakerEnv:
    MAX_TURNS = 12  # hard cap on steps, invalid ones included (then truncated)
    MAX_GUESSES = 8  # valid guesses before the game is lost
    LENGTH = 4
    DIGITS = 6  # code digits are 1..DIGITS, repeats allowed
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of digits the last guess placed right (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = [rng.randint(1, self.DIGITS) for _ in range(self.LENGTH)]
        self.last_guess = [0] * self.LENGTH
        self.last_exact = 0
        self.last_near = 0
        self.guesses = 0
        self.turn = 0
        self.done = False
        intro = (
            f"A secret code has {self.LENGTH} digits, each 1..{self.DIGITS} (repeats allowed). After each guess you "
            "learn how many digits are right and in the right place (exact) and how many more are right but "
            f"misplaced (near). Find the code within {self.MAX_GUESSES} guesses."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        guess = self._digits(cmd)
        if guess[0] > 0:
            self.guesses += 1
            self.last_guess = guess
            self.last_exact = sum(1 for i in range(self.LENGTH) if guess[i] == self.secret[i])
            common = 0
            for d in range(1, self.DIGITS + 1):
                in_guess = sum(1 for i in range(self.LENGTH) if guess[i] == d)
                in_secret = sum(1 for i in range(self.LENGTH) if self.secret[i] == d)
                common += min(in_guess, in_secret)
            self.last_near = common - self.last_exact
            message = f"Guess {self.guesses}: exact {self.last_exact}, near {self.last_near}."
            if self.last_exact == self.LENGTH:
                self.done = True
                return self._observe(message + " You cracked the code, you win!"), 1.0, True, False, {}
            if self.guesses >= self.MAX_GUESSES:
                self.done = True
                reward = self.PARTIAL * self.last_exact / self.LENGTH
                return self._observe(message + " No guesses left; you lose."), reward, True, False, {}
        else:
            message = (
                f"Invalid action (turn lost): guess {self.LENGTH} digits 1..{self.DIGITS}, e.g. "
                f"\\boxed{{{''.join(str(1 + i % self.DIGITS) for i in range(self.LENGTH))}}}."
            )
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{" + "".join(str(d) for d in self.secret) + "}"]

    def close(self):
        pass

    def _digits(self, cmd):
        # Returns the guessed digits, or all zeros when cmd is not a valid guess.
        if cmd is None or not cmd.isdecimal() or len(cmd) != self.LENGTH:
            return [0] * self.LENGTH
        number = int(cmd)
        digits = [(number // 10 ** (self.LENGTH - 1 - i)) % 10 for i in range(self.LENGTH)]
        if all(1 <= d <= self.DIGITS for d in digits):
            return digits
        return [0] * self.LENGTH

    def _observe(self, message):
        last = "".join(str(d) for d in self.last_guess) if self.guesses > 0 else "none"
        return (
            f"{message}\nLast guess: {last} (exact {self.last_exact}, near {self.last_near}). "
            f"Guesses used: {self.guesses}/{self.MAX_GUESSES}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            f"Actions: \\boxed{{g}} guesses the code g ({self.LENGTH} digits 1..{self.DIGITS}); "
            f"for example \\boxed{{{''.join(str(1 + (i + self.turn) % self.DIGITS) for i in range(self.LENGTH))}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
