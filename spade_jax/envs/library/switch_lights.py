"""Causal inference: find which switch drives which light, with few experiments and hidden inverted wiring."""

import random
import re


class SwitchLightsEnv:
    MAX_TURNS = 8  # hard cap on steps, invalid ones included (then truncated)
    COUNT = 4  # switches and lights
    EXPERIMENTS = 2  # switch settings you may try before answering
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of lights matched to their switch (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.control = [i for i in range(self.COUNT)]
        rng.shuffle(self.control)  # light j follows switch control[j]
        self.inverted = [rng.random() < 0.5 for _ in range(self.COUNT)]  # inverted lights are on when off
        self.tried = [[0] * self.COUNT for _ in range(self.EXPERIMENTS + 1)]
        self.seen = [[0] * self.COUNT for _ in range(self.EXPERIMENTS + 1)]
        for j in range(self.COUNT):
            self.seen[0][j] = 1 if self.inverted[j] else 0
        self.used = 0
        self.turn = 0
        self.done = False
        intro = (
            f"{self.COUNT} switches each drive exactly one of {self.COUNT} lights, and some lights are wired "
            f"inverted. All switches are off now. You may set the switches {self.EXPERIMENTS} times and look at "
            "the lights, then say which switch drives each light."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        size = len(cmd) if cmd is not None and cmd.isdecimal() else 0
        number = int(cmd) if size == self.COUNT else 0
        digits = [(number // 10 ** (self.COUNT - 1 - i)) % 10 for i in range(self.COUNT)]
        is_setting = size == self.COUNT and all(d <= 1 for d in digits)
        is_answer = size == self.COUNT and all(sum(1 for d in digits if d == s + 1) == 1 for s in range(self.COUNT))
        if is_setting and self.used < self.EXPERIMENTS:
            self.used += 1
            for j in range(self.COUNT):
                on = (digits[self.control[j]] == 1) != self.inverted[j]
                self.tried[self.used][j] = digits[j]
                self.seen[self.used][j] = 1 if on else 0
            message = (
                f"Experiment {self.used}: switches {self._bits(self.tried[self.used])} "
                f"-> lights {self._bits(self.seen[self.used])}."
            )
        elif is_answer:
            self.done = True
            if all(digits[j] == self.control[j] + 1 for j in range(self.COUNT)):
                return self._observe("That is the wiring, you win!"), 1.0, True, False, {}
            right = sum(1 for j in range(self.COUNT) if digits[j] == self.control[j] + 1)
            reward = self.PARTIAL * right / self.COUNT
            return self._observe(f"Wrong; the wiring was {self._answer()}. You lose."), reward, True, False, {}
        else:
            message = (
                f"Invalid action (turn lost): write digits, not letters: for example "
                f"\\boxed{{{''.join(str((s + 1) % 2) for s in range(self.COUNT))}}} sets the switches "
                f"(experiments left: {self.EXPERIMENTS - self.used}) and "
                f"\\boxed{{{''.join(str(self.COUNT - j) for j in range(self.COUNT))}}} answers."
            )
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        # Binary-coded experiments: switch s is on in experiment e when bit e of s is set, so the two
        # readings (against the all-off baseline) spell out each light's switch number.
        bits = [[(s // 2**e) % 2 for s in range(self.COUNT)] for e in range(self.EXPERIMENTS)]
        settings = ["\\boxed{" + self._bits(row) + "}" for row in bits]
        return settings + ["\\boxed{" + self._answer() + "}"]

    def close(self):
        pass

    def _answer(self):
        return "".join(str(self.control[j] + 1) for j in range(self.COUNT))

    def _bits(self, values):
        return "".join(str(v) for v in values)

    def _observe(self, message):
        log = " ".join(
            f"[switches {self._bits(self.tried[e])} -> lights {self._bits(self.seen[e])}]"
            for e in range(self.EXPERIMENTS + 1)
            if e <= self.used
        )
        return (
            f"{message}\nObservations: {log}\nExperiments left: {self.EXPERIMENTS - self.used}. "
            f"Turn {self.turn}/{self.MAX_TURNS}.\n"
            f"Actions: \\boxed{{s}} with s {self.COUNT} binary digits sets switches 1..{self.COUNT} (1 = on) "
            f"and shows the lights; \\boxed{{a}} with a the digits 1..{self.COUNT}, each once, answers: the "
            "k-th digit is the switch driving light k. For example "
            f"\\boxed{{{''.join(str((s + self.turn) % 2) for s in range(self.COUNT))}}} or "
            f"\\boxed{{{''.join(str(1 + (j + self.turn) % self.COUNT) for j in range(self.COUNT))}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
