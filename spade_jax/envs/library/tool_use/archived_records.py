"""Error recovery: read patient records whose errors say where they went (archived, merged) and follow them."""


class ArchivedRecordsEnv(ToolEnv):
    MAX_TURNS = 10
    RECORDS = 3  # records the task asks about

    TOOLS = [
        {"name": "get_record", "description": "A record by id: its owner and balance.",
         "parameters": {"type": "object", "properties": {"record_id": {"type": "string"}}, "required": ["record_id"]}},
        {"name": "get_archived", "description": "A record from the archive by archive key.",
         "parameters": {"type": "object", "properties": {"archive_key": {"type": "string"}},
                        "required": ["archive_key"]}},
    ]

    def setup(self, rng):
        self.live, self.archive, self.redirect, self.archived_as = {}, {}, {}, {}
        self.asked = []
        for k in range(self.RECORDS):
            rid = f"R{rng.randint(100, 999)}{k}"
            balance = rng.randint(10, 900)
            fate = rng.choice(["live", "archived", "merged"]) if k else rng.choice(["archived", "merged"])
            if fate == "live":
                self.live[rid] = balance
            elif fate == "archived":
                key = f"AR-{rng.randint(1000, 9999)}{k}"
                self.archive[key] = balance
                self.archived_as[rid] = key
            else:
                new = f"R{rng.randint(100, 999)}{k}m"
                self.live[new] = balance
                self.redirect[rid] = new
            self.asked.append(rid)
        self.seen = set()
        return ("Sum the balances of records " + ", ".join(self.asked)
                + ". Some records have moved; follow what the errors tell you. Answer with the sum.")

    def _balance(self, rid):
        if rid in self.live:
            return self.live[rid]
        if rid in self.redirect:
            return self.live[self.redirect[rid]]
        return self.archive[self.archived_as[rid]]

    def tool_get_record(self, record_id):
        if record_id in self.archived_as:
            key = self.archived_as[record_id]
            raise ToolError(f"record {record_id} was archived; read it with get_archived('{key}')")
        if record_id in self.redirect:
            raise ToolError(f"record {record_id} was merged into {self.redirect[record_id]}")
        if record_id not in self.live:
            raise ToolError(f"no record {record_id}")
        self.seen.add(record_id)
        return {"record_id": record_id, "balance": self.live[record_id]}

    def tool_get_archived(self, archive_key):
        if archive_key not in self.archive:
            raise ToolError(f"no archive entry {archive_key}")
        self.seen.add(archive_key)
        return {"archive_key": archive_key, "balance": self.archive[archive_key]}

    def _final_id(self, rid):
        return self.archived_as.get(rid) or self.redirect.get(rid) or rid

    def subgoals(self):
        return [self._final_id(r) in self.seen for r in self.asked] + [
            self.answer_matches(sum(self._balance(r) for r in self.asked))]

    def solution(self):
        first = "".join(self.call("get_record", record_id=r) for r in self.asked)
        follow = "".join(self.call("get_archived", archive_key=self.archived_as[r]) if r in self.archived_as
                         else self.call("get_record", record_id=self._final_id(r))
                         for r in self.asked if r not in self.live)
        return [first, follow, self.final(sum(self._balance(r) for r in self.asked))]
