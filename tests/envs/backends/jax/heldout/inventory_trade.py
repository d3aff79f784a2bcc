import random
import re


class InventoryTraderEnv:
    """Trade resources at fixed rates to collect a target amount of gold."""

    RATES = {"wood": 3, "stone": 2, "iron": 1}

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.inventory = {"wood": 0, "stone": 0, "iron": 0, "gold": 0}
        self.target = 1

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.inventory = {"wood": rng.randint(3, 9), "stone": rng.randint(2, 6), "iron": rng.randint(0, 3), "gold": 0}
        total = self.inventory["wood"] // 3 + self.inventory["stone"] // 2 + self.inventory["iron"]
        self.target = rng.randint(1, total)
        self.turn_count = 0
        return self._describe() + " Trade with \\boxed{wood}, \\boxed{stone} or \\boxed{iron}.", {}

    def _describe(self):
        parts = [f"{name}={count}" for name, count in self.inventory.items()]
        return f"Inventory: {', '.join(parts)}. Rates: 3 wood, 2 stone or 1 iron buy 1 gold. Goal: {self.target} gold."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]+)\}", action)
        if not match:
            return "Please answer with \\boxed{resource}. " + self._describe(), -0.1, False, truncated, {}
        item = match.group(1).strip().lower()
        if item not in self.RATES:
            return f"'{item}' cannot be traded. " + self._describe(), -0.1, False, truncated, {}
        cost = self.RATES[item]
        if self.inventory.get(item, 0) < cost:
            return f"Not enough {item}. " + self._describe(), 0.0, False, truncated, {}
        self.inventory[item] -= cost
        self.inventory["gold"] += 1
        if self.inventory["gold"] >= self.target:
            return f"You have {self.inventory['gold']} gold. Goal reached!", 1.0, True, False, {}
        return f"Traded {cost} {item}. " + self._describe(), 0.0, False, truncated, {}

    def solution(self):
        plan = []
        inv = dict(self.inventory)
        for name in ["iron", "stone", "wood"]:
            while inv[name] >= self.RATES[name] and len(plan) < self.target:
                inv[name] -= self.RATES[name]
                plan.append("\\boxed{" + name + "}")
        return plan
