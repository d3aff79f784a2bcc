"""Mathematical reasoning: reach a target number from a start value with three fixed operations."""

import random
import re


class TargetNumberEnv:
    MAX_TURNS = 12  # hard cap on steps, invalid ones included (then truncated)
    MAX_MOVES = 8  # valid operations allowed before the game is lost
    LIMIT = 999  # the value must stay within 0..LIMIT
    PLAN = 5  # operations in the hidden plan that defines the target
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of the way from the start to the target covered (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.add = rng.randint(2, 9)
        self.sub = rng.randint(2, 9)
        self.mul = rng.randint(2, 4)
        self.start = rng.randint(1, 15)
        # The target is the end of a random add/mul plan, so it is reachable and above the start.
        self.plan = [0] * self.PLAN
        forced = rng.randrange(self.PLAN)
        value = self.start
        for i in range(self.PLAN):
            if (i == forced or rng.random() < 0.4) and value * self.mul <= self.LIMIT:
                self.plan[i] = 1
                value = value * self.mul
            else:
                value = value + self.add
        self.target = value
        self.value = self.start
        self.moves = 0
        self.turn = 0
        self.done = False
        intro = (
            f"Turn the value {self.start} into exactly {self.target} in at most {self.MAX_MOVES} operations. "
            f"Leaving 0..{self.LIMIT} loses."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        if cmd == "add" or cmd == "sub" or cmd == "mul":
            old = self.value
            if cmd == "add":
                self.value = old + self.add
            elif cmd == "sub":
                self.value = old - self.sub
            else:
                self.value = old * self.mul
            self.moves += 1
            message = f"{cmd}: {old} -> {self.value}."
            if self.value == self.target:
                self.done = True
                return self._observe(message + " Target reached, you win!"), 1.0, True, False, {}
            if self.value < 0 or self.value > self.LIMIT:
                self.done = True
                reward = self.PARTIAL * self._progress()
                return self._observe(message + " The value left the allowed range; you lose."), reward, True, False, {}
            if self.moves >= self.MAX_MOVES:
                self.done = True
                reward = self.PARTIAL * self._progress()
                return self._observe(message + " No operations left; you lose."), reward, True, False, {}
        else:
            message = "Invalid action (turn lost): answer with \\boxed{add}, \\boxed{sub} or \\boxed{mul}."
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        return ["\\boxed{mul}" if op == 1 else "\\boxed{add}" for op in self.plan]

    def close(self):
        pass

    def _progress(self):
        # 1 at the target, 0 at the start distance or farther.
        return max(0.0, 1 - abs(self.target - self.value) / max(1, abs(self.target - self.start)))

    def _observe(self, message):
        return (
            f"{message}\nValue: {self.value}. Target: {self.target}. "
            f"Operations used: {self.moves}/{self.MAX_MOVES}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            f"Actions: \\boxed{{op}} with op one of add (+{self.add}), sub (-{self.sub}) or mul (x{self.mul}); "
            f"for example \\boxed{{{'add' if self.turn % 3 == 0 else ('sub' if self.turn % 3 == 1 else 'mul')}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
