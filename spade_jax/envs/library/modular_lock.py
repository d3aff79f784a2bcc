"""Mathematical reasoning: open a lock whose dials turn modulo 7 by pressing buttons with fixed effects."""

import random
import re


class ModularLockEnv:
    MAX_TURNS = 20  # hard cap on steps, invalid ones included (then truncated)
    MAX_PRESSES = 15  # button presses allowed before the lock jams (a loss)
    MOD = 7  # every dial shows a digit 0..MOD-1 and wraps around
    DIALS = 3
    BUTTONS = 3
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of dials showing their target (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.effects = [[rng.randrange(self.MOD) for _ in range(self.DIALS)] for _ in range(self.BUTTONS)]
        for b in range(self.BUTTONS):
            self.effects[b][b] = rng.randint(1, self.MOD - 1)
        self.dials = [rng.randrange(self.MOD) for _ in range(self.DIALS)]
        # The target is what a hidden number of presses per button produces, so it is reachable.
        self.presses = [rng.randint(0, 4) for _ in range(self.BUTTONS)]
        self.target = self._after(self.presses)
        if all(self.target[d] == self.dials[d] for d in range(self.DIALS)):
            # Button 1 moves dial 1, so one more press makes the target differ from the start.
            self.presses[0] += 1
            self.target = self._after(self.presses)
        self.used = 0
        self.turn = 0
        self.done = False
        intro = (
            f"A lock has {self.DIALS} dials showing digits 0..{self.MOD - 1}. Button k adds its effect to each "
            f"dial, modulo {self.MOD}. Make the dials show the target within {self.MAX_PRESSES} presses."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        if cmd is not None and cmd.isdecimal() and len(cmd) <= 2 and 1 <= int(cmd) <= self.BUTTONS:
            b = int(cmd) - 1
            self.dials = [(self.dials[d] + self.effects[b][d]) % self.MOD for d in range(self.DIALS)]
            self.used += 1
            message = f"You pressed button {b + 1}."
            if all(self.dials[d] == self.target[d] for d in range(self.DIALS)):
                self.done = True
                return self._observe(message + " Click: the lock opens, you win!"), 1.0, True, False, {}
            if self.used >= self.MAX_PRESSES:
                self.done = True
                right = sum(1 for d in range(self.DIALS) if self.dials[d] == self.target[d])
                reward = self.PARTIAL * right / self.DIALS
                return self._observe(message + " The lock jams; you lose."), reward, True, False, {}
        else:
            message = f"Invalid action (turn lost): press a button, e.g. \\boxed{{1}} (buttons 1..{self.BUTTONS})."
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        # At most 5 presses per button (4, plus one when the first draw was a no-op).
        return [f"\\boxed{{{b + 1}}}" for b in range(self.BUTTONS) for k in range(5) if k < self.presses[b]]

    def close(self):
        pass

    def _after(self, presses):
        return [
            (self.dials[d] + sum(presses[b] * self.effects[b][d] for b in range(self.BUTTONS))) % self.MOD
            for d in range(self.DIALS)
        ]

    def _observe(self, message):
        buttons = " ".join(
            f"[{b + 1}: +(" + ",".join(str(e) for e in self.effects[b]) + ")]" for b in range(self.BUTTONS)
        )
        return (
            f"{message}\nDials: {' '.join(str(v) for v in self.dials)}. "
            f"Target: {' '.join(str(v) for v in self.target)}. "
            f"Presses used: {self.used}/{self.MAX_PRESSES}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            f"Buttons: {buttons}\nActions: \\boxed{{b}} presses button b, a number 1..{self.BUTTONS}; "
            f"for example \\boxed{{{1 + self.turn % self.BUTTONS}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
