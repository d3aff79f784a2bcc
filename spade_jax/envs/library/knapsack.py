"""Optimization: pack items into a bag of limited capacity so that their total value is the best possible."""

import random
import re


class KnapsackEnv:
    MAX_TURNS = 12  # hard cap on steps, invalid ones included (then truncated)
    ITEMS = 6
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of the best value it packed (a win scores 1; a torn bag 0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.weight = [rng.randint(2, 9) for _ in range(self.ITEMS)]
        self.value = [rng.randint(3, 15) for _ in range(self.ITEMS)]
        self.capacity = sum(self.weight) // 2
        # Brute force over all 2**ITEMS subsets; bit i of a mask says whether item i is packed.
        self.best_value = 0
        self.best_mask = 0
        for mask in range(2**self.ITEMS):
            weight = sum(self.weight[i] * ((mask // 2**i) % 2) for i in range(self.ITEMS))
            value = sum(self.value[i] * ((mask // 2**i) % 2) for i in range(self.ITEMS))
            if weight <= self.capacity and value > self.best_value:
                self.best_value = value
                self.best_mask = mask
        self.packed = [False] * self.ITEMS
        self.load = 0
        self.total = 0
        self.turn = 0
        self.done = False
        intro = (
            f"Pack items into a bag that holds weight {self.capacity}. Going over the capacity tears the bag (you "
            "lose). Say done when finished: you win only if no packing of these items is worth more."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        if cmd == "done":
            self.done = True
            if self.total >= self.best_value:
                message = f"Your packing is worth {self.total}, the best possible. You win!"
                return self._observe(message), 1.0, True, False, {}
            message = f"Your packing is worth {self.total}; {self.best_value} was possible. You lose."
            return self._observe(message), self.PARTIAL * self.total / max(self.best_value, 1), True, False, {}
        i = int(cmd) - 1 if cmd is not None and cmd.isdecimal() and len(cmd) <= 2 else -1
        if 0 <= i < self.ITEMS and not self.packed[i]:
            self.packed[i] = True
            self.load += self.weight[i]
            self.total += self.value[i]
            message = f"You packed item {i + 1} (weight {self.weight[i]}, value {self.value[i]})."
            if self.load > self.capacity:
                self.done = True
                return self._observe(message + " The bag tears; you lose."), 0.0, True, False, {}
        else:
            message = (
                "Invalid action (turn lost): pack an unpacked item, e.g. \\boxed{1} for item 1, or finish with "
                "\\boxed{done}."
            )
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        picks = [f"\\boxed{{{i + 1}}}" for i in range(self.ITEMS) if (self.best_mask // 2**i) % 2 == 1]
        return picks + ["\\boxed{done}"]

    def close(self):
        pass

    def _observe(self, message):
        items = "\n".join(
            f"  {i + 1}: weight {self.weight[i]}, value {self.value[i]}{' (packed)' if self.packed[i] else ''}"
            for i in range(self.ITEMS)
        )
        return (
            f"{message}\nItems:\n{items}\nBag: weight {self.load}/{self.capacity}, value {self.total}. "
            f"Turn {self.turn}/{self.MAX_TURNS}.\n"
            f"Actions: \\boxed{{i}} packs item i (a number 1..{self.ITEMS}); \\boxed{{done}} finishes. "
            f"For example \\boxed{{{1 + self.turn % self.ITEMS}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
