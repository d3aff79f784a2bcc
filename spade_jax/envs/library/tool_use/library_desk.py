"""Tool selection: reserve the one available copy of a book, choosing among search, availability and loan tools."""


class LibraryDeskEnv(ToolEnv):
    MAX_TURNS = 8
    TITLES = ["Dune", "Emma", "Ulysses", "Beloved", "Solaris", "Middlemarch", "Kindred"]
    COPIES = 3  # copies of each title

    TOOLS = [
        {"name": "search_by_title", "description": "Copy ids of a title.",
         "parameters": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}},
        {"name": "search_by_author", "description": "Titles by an author.",
         "parameters": {"type": "object", "properties": {"author": {"type": "string"}}, "required": ["author"]}},
        {"name": "check_availability", "description": "Whether a copy is on the shelf or on loan.",
         "parameters": {"type": "object", "properties": {"copy_id": {"type": "string"}}, "required": ["copy_id"]}},
        {"name": "reserve", "description": "Reserve a copy for a member; only a copy on the shelf can be reserved.",
         "parameters": {"type": "object", "properties": {"copy_id": {"type": "string"},
                                                         "member_id": {"type": "string"}},
                        "required": ["copy_id", "member_id"]}},
        {"name": "renew_loan", "description": "Renew a member's loan of a copy.",
         "parameters": {"type": "object", "properties": {"copy_id": {"type": "string"},
                                                         "member_id": {"type": "string"}},
                        "required": ["copy_id", "member_id"]}},
        {"name": "list_loans", "description": "Copies a member has on loan.",
         "parameters": {"type": "object", "properties": {"member_id": {"type": "string"}}, "required": ["member_id"]}},
    ]

    def setup(self, rng):
        self.title = rng.choice(self.TITLES)
        self.member = f"M{rng.randint(1000, 9999)}"
        self.copies = {t: [f"{t[:3].upper()}-{rng.randint(10, 99)}{k}" for k in range(self.COPIES)]
                       for t in self.TITLES}
        self.free = {t: rng.choice(self.copies[t]) for t in self.TITLES}  # the one copy on the shelf
        self.reserved = []
        self.renewed = []
        return (f"Member {self.member} wants to borrow '{self.title}'. Reserve the copy that is on the shelf for "
                "them and answer with its copy id.")

    def _copy(self, copy_id):
        for title, ids in self.copies.items():
            if copy_id in ids:
                return title
        raise ToolError(f"no copy {copy_id}")

    def tool_search_by_title(self, title):
        for t in self.TITLES:
            if t.lower() == title.strip().lower():
                return {"title": t, "copies": self.copies[t]}
        return {"title": title, "copies": []}

    def tool_search_by_author(self, author):
        return {"author": author, "titles": []}

    def tool_check_availability(self, copy_id):
        title = self._copy(copy_id)
        return {"copy_id": copy_id, "status": "on shelf" if self.free[title] == copy_id else "on loan"}

    def tool_reserve(self, copy_id, member_id):
        title = self._copy(copy_id)
        if self.free[title] != copy_id:
            raise ToolError(f"copy {copy_id} is on loan and cannot be reserved")
        self.reserved.append((copy_id, member_id))
        return {"copy_id": copy_id, "member_id": member_id, "status": "reserved"}

    def tool_renew_loan(self, copy_id, member_id):
        self._copy(copy_id)
        self.renewed.append(copy_id)
        return {"copy_id": copy_id, "status": "renewed"}

    def tool_list_loans(self, member_id):
        return {"member_id": member_id, "copies": []}

    def subgoals(self):
        return [self.reserved == [(self.free[self.title], self.member)] and not self.renewed,
                self.answer_matches(self.free[self.title])]

    def solution(self):
        return [
            self.call("search_by_title", title=self.title),
            "".join(self.call("check_availability", copy_id=c) for c in self.copies[self.title]),
            self.call("reserve", copy_id=self.free[self.title], member_id=self.member),
            self.final(self.free[self.title]),
        ]
