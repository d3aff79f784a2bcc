"""Data retrieval: find the longest-serving employee of a department by listing it and reading each record."""


class EmployeeDirectoryEnv(ToolEnv):
    MAX_TURNS = 10
    DEPARTMENTS = ["sales", "research", "finance", "support"]
    NAMES = ["Ada", "Bram", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kira", "Luis"]
    PER_DEPARTMENT = 3

    TOOLS = [
        {"name": "list_department", "description": "Employee ids of a department.",
         "parameters": {"type": "object", "properties": {"department": {"type": "string"}},
                        "required": ["department"]}},
        {"name": "get_employee", "description": "Name, title and start year of an employee.",
         "parameters": {"type": "object", "properties": {"employee_id": {"type": "integer"}},
                        "required": ["employee_id"]}},
    ]

    def setup(self, rng):
        names = rng.sample(self.NAMES, self.PER_DEPARTMENT * len(self.DEPARTMENTS))
        years = rng.sample(range(1995, 2024), len(names))
        ids = rng.sample(range(100, 999), len(names))
        self.people = {}
        for k, (name, year, eid) in enumerate(zip(names, years, ids)):
            self.people[eid] = {"name": name, "start_year": year,
                                "department": self.DEPARTMENTS[k // self.PER_DEPARTMENT]}
        self.department = rng.choice(self.DEPARTMENTS)
        members = [e for e, p in self.people.items() if p["department"] == self.department]
        self.veteran = min(members, key=lambda e: self.people[e]["start_year"])
        self.read = set()
        return f"Who has worked longest in the {self.department} department? Answer with their name."

    def tool_list_department(self, department):
        return [e for e, p in self.people.items() if p["department"] == department.strip().lower()]

    def tool_get_employee(self, employee_id):
        if employee_id not in self.people:
            raise ToolError(f"no employee {employee_id}")
        self.read.add(employee_id)
        person = self.people[employee_id]
        return {"employee_id": employee_id, "name": person["name"], "start_year": person["start_year"]}

    def subgoals(self):
        members = {e for e, p in self.people.items() if p["department"] == self.department}
        return [members <= self.read, self.answer_matches(self.people[self.veteran]["name"])]

    def solution(self):
        members = [e for e, p in self.people.items() if p["department"] == self.department]
        return [
            self.call("list_department", department=self.department),
            "".join(self.call("get_employee", employee_id=e) for e in members),
            self.final(self.people[self.veteran]["name"]),
        ]
