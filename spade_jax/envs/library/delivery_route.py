"""Optimization: plan the shortest round trip from the depot through every town (a tiny travelling salesman)."""

import random
import re


class DeliveryRouteEnv:
    MAX_TURNS = 12  # hard cap on steps, invalid ones included (then truncated)
    TOWNS = 5  # towns 1..TOWNS besides the depot, town 0
    FAR = 1000  # longer than any route
    PARTIAL = 0.5  # a loss scores PARTIAL x the share of the shortest length over the trip's length (a win scores 1)

    def reset(self, seed=None):
        rng = random.Random(seed)
        n = self.TOWNS + 1
        self.dist = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                if j > i:
                    self.dist[i][j] = rng.randint(1, 20)
                    self.dist[j][i] = self.dist[i][j]
        self._plan()
        self.at = 0
        self.visited = [False] * n
        self.visited[0] = True
        self.length = 0
        self.turn = 0
        self.done = False
        intro = (
            f"You start at the depot (town 0). Visit towns 1..{self.TOWNS} once each, then return to the depot. "
            "You win if your round trip is as short as the shortest possible one."
        )
        return self._observe(intro), {}

    def step(self, action):
        if self.done:
            return self._observe("The episode is over; call reset()."), 0.0, True, False, {}
        self.turn += 1
        cmd = self._parse(action)
        town = int(cmd) if cmd is not None and cmd.isdecimal() and len(cmd) <= 2 else -1
        all_seen = all(self.visited)
        if (1 <= town <= self.TOWNS and not self.visited[town]) or (town == 0 and all_seen):
            self.length += self.dist[self.at][town]
            message = f"You drive from town {self.at} to town {town} ({self.dist[self.at][town]} km)."
            self.at = town
            self.visited[town] = True
            if town == 0:
                self.done = True
                if self.length <= self.best:
                    message += f" Round trip {self.length} km is optimal, you win!"
                    return self._observe(message), 1.0, True, False, {}
                message += f" Round trip {self.length} km; {self.best} km was possible. You lose."
                return self._observe(message), self.PARTIAL * self.best / self.length, True, False, {}
        else:
            message = (
                "Invalid action (turn lost): drive to an unvisited town, e.g. \\boxed{1} for town 1; \\boxed{0} "
                "only at the end."
            )
        if self.turn >= self.MAX_TURNS:
            self.done = True
            return self._observe(message + " Out of turns."), 0.0, False, True, {}
        return self._observe(message), 0.0, False, False, {}

    def solution(self):
        return [f"\\boxed{{{town}}}" for town in self.route] + ["\\boxed{0}"]

    def close(self):
        pass

    def _plan(self):
        # Held-Karp: cost[mask][t] is the shortest depot -> ... -> t path through exactly the towns in mask.
        full = 2**self.TOWNS
        cost = [[self.FAR] * self.TOWNS for _ in range(full)]
        prev = [[0] * self.TOWNS for _ in range(full)]
        for t in range(self.TOWNS):
            cost[2**t][t] = self.dist[0][t + 1]
        for mask in range(full):
            for t in range(self.TOWNS):
                for u in range(self.TOWNS):
                    grow = (mask // 2**t) % 2 == 1 and (mask // 2**u) % 2 == 0
                    if grow and cost[mask][t] + self.dist[t + 1][u + 1] < cost[mask + 2**u][u]:
                        cost[mask + 2**u][u] = cost[mask][t] + self.dist[t + 1][u + 1]
                        prev[mask + 2**u][u] = t
        last = 0
        for t in range(self.TOWNS):
            if cost[full - 1][t] + self.dist[t + 1][0] < cost[full - 1][last] + self.dist[last + 1][0]:
                last = t
        self.best = cost[full - 1][last] + self.dist[last + 1][0]
        self.route = [0] * self.TOWNS
        mask = full - 1
        for k in range(self.TOWNS):
            self.route[self.TOWNS - 1 - k] = last + 1
            before = prev[mask][last]
            mask = mask - 2**last
            last = before

    def _observe(self, message):
        towns = range(self.TOWNS + 1)
        table = "\n".join(f"  from {i}: " + " ".join(str(self.dist[i][j]) for j in towns) for i in towns)
        left = " ".join(str(t) for t in range(1, self.TOWNS + 1) if not self.visited[t])
        return (
            f"{message}\nDistances in km to towns 0..{self.TOWNS}:\n{table}\n"
            f"You are at town {self.at}. Driven: {self.length} km. "
            f"Towns left: {'none, return to 0' if all(self.visited) else left}. Turn {self.turn}/{self.MAX_TURNS}.\n"
            "Actions: \\boxed{t} drives to town t (a town not yet visited); \\boxed{0} returns to the depot at the "
            f"end. For example \\boxed{{{1 + self.turn % self.TOWNS}}}."
            "\nWrite your action inside \\boxed{...}."
        )

    def _parse(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found:
            return None
        return found[-1].strip().lower()
