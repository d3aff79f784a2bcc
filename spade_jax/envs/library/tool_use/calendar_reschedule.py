"""State modification: cancel a meeting and book a new one in the first free hour of a given day."""


class CalendarRescheduleEnv(ToolEnv):
    MAX_TURNS = 10
    DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday"]
    TITLES = ["standup", "design review", "budget sync", "1:1 with Mia", "vendor call", "retro", "hiring panel"]
    EVENTS = 6

    TOOLS = [
        {"name": "list_events", "description": "Events of a day: id, title, start hour and end hour (9 to 17).",
         "parameters": {"type": "object", "properties": {"day": {"type": "string", "enum": DAYS}},
                        "required": ["day"]}},
        {"name": "delete_event", "description": "Delete an event by id.",
         "parameters": {"type": "object", "properties": {"event_id": {"type": "integer"}}, "required": ["event_id"]}},
        {"name": "create_event", "description": "Create an event; start and end are whole hours between 9 and 17.",
         "parameters": {"type": "object", "properties": {"day": {"type": "string", "enum": DAYS},
                                                         "title": {"type": "string"},
                                                         "start": {"type": "integer"}, "end": {"type": "integer"}},
                        "required": ["day", "title", "start", "end"]}},
    ]

    def setup(self, rng):
        self.events = {}
        taken = set()
        for title in rng.sample(self.TITLES, self.EVENTS):
            day, hour = rng.choice(self.DAYS), rng.randint(9, 16)
            if (day, hour) in taken:
                continue
            taken.add((day, hour))
            self.events[rng.randint(100, 999) * 10 + len(self.events)] = (day, title, hour, hour + 1)
        self.start_events = dict(self.events)
        self.cancel = rng.choice(sorted(self.events))
        self.new_day = rng.choice(self.DAYS)
        self.new_title = rng.choice(["offsite planning", "client demo", "security audit"])
        busy = {e[2] for k, e in self.events.items() if e[0] == self.new_day and k != self.cancel}
        self.new_start = next(h for h in range(9, 17) if h not in busy)
        day, title, _, _ = self.events[self.cancel]
        return (f"Cancel the '{title}' meeting on {day.title()} and book '{self.new_title}' for one hour on "
                f"{self.new_day.title()} in the earliest free hour (the cancelled slot counts as free). "
                "Answer done when finished.")

    def tool_list_events(self, day):
        return [{"event_id": k, "title": e[1], "start": e[2], "end": e[3]}
                for k, e in sorted(self.events.items(), key=lambda kv: kv[1][2]) if e[0] == day]

    def tool_delete_event(self, event_id):
        if event_id not in self.events:
            raise ToolError(f"no event {event_id}")
        del self.events[event_id]
        return {"deleted": event_id}

    def tool_create_event(self, day, title, start, end):
        if not 9 <= start < end <= 17:
            raise ToolError("start and end must satisfy 9 <= start < end <= 17")
        clash = [k for k, e in self.events.items() if e[0] == day and e[2] < end and start < e[3]]
        if clash:
            raise ToolError(f"the slot overlaps event {clash[0]}")
        key = 10000 + len(self.events) + len(self.start_events)  # never a key the day started with
        while key in self.events:
            key += 1
        self.events[key] = (day, title, start, end)
        return {"event_id": key, "day": day, "start": start, "end": end}

    def subgoals(self):
        others = {k: e for k, e in self.start_events.items() if k != self.cancel}
        created = [e for k, e in self.events.items() if k not in self.start_events]
        wanted = (self.new_day, self.new_title, self.new_start, self.new_start + 1)
        untouched = all(self.events.get(k) == e for k, e in others.items())  # a constraint, not a goal
        return [self.cancel not in self.events and untouched,
                len(created) == 1 and created[0][0] == wanted[0] and created[0][2:] == wanted[2:]
                and created[0][1].strip().lower() == self.new_title and untouched]

    def solution(self):
        day = self.start_events[self.cancel][0]
        return [
            self.call("list_events", day=day) + self.call("list_events", day=self.new_day),
            self.call("delete_event", event_id=self.cancel),
            self.call("create_event", day=self.new_day, title=self.new_title, start=self.new_start,
                      end=self.new_start + 1),
            self.final("done"),
        ]
