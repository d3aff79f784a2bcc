"""Causal inference: recover a hidden causal chain among five variables by intervening on them one at a time."""

import random
import re


class CausalChainEnv:
    MAX_TURNS = 10  # hard cap on steps, invalid ones included (then truncated)
    VARS = 5  # variables 1..VARS; CHAIN of them form the chain, the rest are unconnected
    CHAIN = 4
    INTERVENTIONS = 4
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of chain positions named right (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.order = [v for v in range(self.VARS)]
        rng.shuffle(self.order)  # order[0] -> order[1] -> ... -> order[CHAIN-1]; the rest are bystanders
        self.pos = [0] * self.VARS
        for i in range(self.VARS):
            self.pos[self.order[i]] = i
        self.tested = [False] * self.VARS
        self.effect = [[0] * self.VARS for _ in range(self.VARS)]
        self.last = [0] * self.VARS
        self.used = 0
        self.turn = 0
        self.done = False
        intro = (
            f"Variables 1..{self.VARS} are all 0. {self.CHAIN} of them form a hidden causal chain "
            "(root -> ... -> end): "
            "setting a variable to 1 sets everything downstream of it to 1. The others affect nothing and "
            f"nothing affects them. Intervene (at most {self.INTERVENTIONS} times), then name the chain in order."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        size = len(cmd) if cmd is not None and cmd.isdecimal() else 0
        number = int(cmd) if 1 <= size <= self.CHAIN else 0
        digits = [(number // 10 ** (self.CHAIN - 1 - i)) % 10 for i in range(self.CHAIN)]
        if size == 1 and 1 <= number <= self.VARS and self.used < self.INTERVENTIONS:
            k = number - 1
            for v in range(self.VARS):
                downstream = self.pos[k] < self.CHAIN and self.pos[v] < self.CHAIN and self.pos[v] > self.pos[k]
                self.last[v] = 1 if v == k or downstream else 0
                self.effect[k][v] = self.last[v]
            self.tested[k] = True
            self.used += 1
            message = f"do(X{k + 1} = 1) -> values {self._bits(self.last)}."
        elif size == self.CHAIN and all(1 <= d <= self.VARS for d in digits):
            self.done = True
            if all(digits[i] == self.order[i] + 1 for i in range(self.CHAIN)):
                return self._observe("That is the causal chain, you win!"), 1.0, True, False, {}
            right = sum(1 for i in range(self.CHAIN) if digits[i] == self.order[i] + 1)
            reward = self.PARTIAL * right / self.CHAIN
            return self._observe(f"Wrong; the chain was {self._answer()}. You lose."), reward, True, False, {}
        else:
            message = (
                f"Invalid action (turn lost): \\boxed{{2}} intervenes on variable 2 (interventions left: "
                f"{self.INTERVENTIONS - self.used}); \\boxed{{...}} with {self.CHAIN} digits names the chain."
            )
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        # Intervening on each chain member shows how much lies downstream of it, which fixes the order.
        probes = [f"\\boxed{{{self.order[i] + 1}}}" for i in range(self.CHAIN - 1)]
        return probes + ["\\boxed{" + self._answer() + "}"]

    def close(self):
        pass

    def _answer(self):
        return "".join(str(self.order[i] + 1) for i in range(self.CHAIN))

    def _bits(self, values):
        return " ".join(f"X{v + 1}={values[v]}" for v in range(self.VARS))

    def _observe(self, message):
        log = " ".join(
            f"[do(X{k + 1}=1): {''.join(str(x) for x in self.effect[k])}]" for k in range(self.VARS) if self.tested[k]
        )
        return (
            f"{message}\nInterventions so far (values of X1..X{self.VARS}): {log if self.used > 0 else 'none'}. "
            f"Interventions left: {self.INTERVENTIONS - self.used}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            f"Actions: \\boxed{{v}} sets variable v to 1 (v a number 1..{self.VARS}); \\boxed{{c}} names a chain "
            f"c of {self.CHAIN} variable numbers from its root to its end. For example "
            f"\\boxed{{{1 + self.turn % self.VARS}}} or "
            f"\\boxed{{{''.join(str(1 + (self.VARS - 1 - i + self.turn) % self.VARS) for i in range(self.CHAIN))}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
