"""State modification: bring warehouse stock to what a delivery note says, with stock that never goes negative."""


class InventoryUpdateEnv(ToolEnv):
    MAX_TURNS = 10
    SKUS = ["bolt", "nut", "washer", "hinge", "bracket", "spring", "clamp"]
    SITES = ["A", "B"]
    CHANGES = 3  # lines on the delivery note

    TOOLS = [
        {"name": "get_stock", "description": "Units of an item at a site.",
         "parameters": {"type": "object", "properties": {"sku": {"type": "string"},
                                                         "site": {"type": "string", "enum": SITES}},
                        "required": ["sku", "site"]}},
        {"name": "adjust_stock", "description": "Add (positive delta) or remove (negative delta) units of an item "
                                                "at a site; stock cannot go below zero.",
         "parameters": {"type": "object", "properties": {"sku": {"type": "string"},
                                                         "site": {"type": "string", "enum": SITES},
                                                         "delta": {"type": "integer"}},
                        "required": ["sku", "site", "delta"]}},
        {"name": "transfer", "description": "Move units of an item from one site to the other.",
         "parameters": {"type": "object", "properties": {"sku": {"type": "string"},
                                                         "from_site": {"type": "string", "enum": SITES},
                                                         "units": {"type": "integer"}},
                        "required": ["sku", "from_site", "units"]}},
    ]

    def setup(self, rng):
        self.stock = {(s, site): rng.randint(5, 40) for s in self.SKUS for site in self.SITES}
        self.start = dict(self.stock)
        self.target = dict(self.stock)
        self.note = []
        for sku in rng.sample(self.SKUS, self.CHANGES):
            kind = rng.choice(["receive", "ship", "move"])
            site = rng.choice(self.SITES)
            units = rng.randint(1, self.stock[(sku, site)])
            other = "B" if site == "A" else "A"
            if kind == "receive":
                self.target[(sku, site)] += units
                self.note.append(f"received {units} {sku} at site {site}")
            elif kind == "ship":
                self.target[(sku, site)] -= units
                self.note.append(f"shipped {units} {sku} from site {site}")
            else:
                self.target[(sku, site)] -= units
                self.target[(sku, other)] += units
                self.note.append(f"moved {units} {sku} from site {site} to site {other}")
        self.changed = sorted({k for k in self.stock if self.target[k] != self.start[k]})
        return ("Update the inventory for today's delivery note: " + "; ".join(self.note)
                + ". Change nothing else; answer done when finished.")

    def _key(self, sku, site):
        if (sku, site) not in self.stock:
            raise ToolError(f"unknown item {sku!r} at site {site!r}; items: {', '.join(self.SKUS)}")
        return (sku, site)

    def tool_get_stock(self, sku, site):
        return {"sku": sku, "site": site, "units": self.stock[self._key(sku, site)]}

    def tool_adjust_stock(self, sku, site, delta):
        key = self._key(sku, site)
        if self.stock[key] + delta < 0:
            raise ToolError(f"only {self.stock[key]} {sku} at site {site}")
        self.stock[key] += delta
        return {"sku": sku, "site": site, "units": self.stock[key]}

    def tool_transfer(self, sku, from_site, units):
        key = self._key(sku, from_site)
        other = self._key(sku, "B" if from_site == "A" else "A")
        if units < 1 or units > self.stock[key]:
            raise ToolError(f"cannot move {units}: site {from_site} holds {self.stock[key]} {sku}")
        self.stock[key] -= units
        self.stock[other] += units
        return {"sku": sku, "A": self.stock[(sku, "A")], "B": self.stock[(sku, "B")]}

    def subgoals(self):
        untouched = all(self.stock[k] == self.start[k] for k in self.stock if k not in self.changed)
        return [self.stock[k] == self.target[k] and untouched for k in self.changed]  # a stray change voids all

    def solution(self):
        calls = [self.call("adjust_stock", sku=sku, site=site, delta=self.target[(sku, site)] - self.start[(sku, site)])
                 for sku, site in self.changed]
        return ["".join(calls[:2]), "".join(calls[2:]) or self.call("get_stock", sku=self.SKUS[0], site="A"),
                self.final("done")]
