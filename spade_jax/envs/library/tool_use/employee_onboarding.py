"""Multi-step workflow: onboard a hire by the department's policy: account, laptop model and every group."""


class EmployeeOnboardingEnv(ToolEnv):
    MAX_TURNS = 12
    DEPARTMENTS = ["engineering", "design", "finance", "legal"]
    LAPTOPS = ["ThinkPad X1", "MacBook Pro", "Dell XPS", "Surface Laptop"]
    GROUPS = ["vpn", "wiki", "git", "payroll", "crm", "figma", "contracts"]

    TOOLS = [
        {"name": "get_policy", "description": "Onboarding policy of a department: laptop model and groups.",
         "parameters": {"type": "object", "properties": {"department": {"type": "string"}},
                        "required": ["department"]}},
        {"name": "create_account", "description": "Create a user account; returns the user id.",
         "parameters": {"type": "object", "properties": {"full_name": {"type": "string"},
                                                         "department": {"type": "string"}},
                        "required": ["full_name", "department"]}},
        {"name": "assign_laptop", "description": "Assign a laptop model to a user.",
         "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}, "model": {"type": "string"}},
                        "required": ["user_id", "model"]}},
        {"name": "add_to_group", "description": "Add a user to an access group.",
         "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}, "group": {"type": "string"}},
                        "required": ["user_id", "group"]}},
    ]

    def setup(self, rng):
        self.policies = {d: (rng.choice(self.LAPTOPS), sorted(rng.sample(self.GROUPS, rng.randint(2, 3))))
                         for d in self.DEPARTMENTS}
        self.hire = rng.choice(["Ines Duarte", "Tomas Berg", "Yara Haddad", "Kofi Mensah"])
        self.department = rng.choice(self.DEPARTMENTS)
        self.user_base = rng.randint(100, 999)
        self.accounts, self.laptops, self.groups = {}, {}, {}
        return (f"Onboard {self.hire}, who joins {self.department}: create their account, then follow the "
                "department's onboarding policy exactly. Answer done when finished.")

    def _user(self, user_id):
        if user_id not in self.accounts:
            raise ToolError(f"no user {user_id}; create the account first")
        return user_id

    def tool_get_policy(self, department):
        department = department.strip().lower()
        if department not in self.policies:
            raise ToolError(f"no department {department}; departments: {', '.join(self.DEPARTMENTS)}")
        laptop, groups = self.policies[department]
        return {"department": department, "laptop": laptop, "groups": groups}

    def tool_create_account(self, full_name, department):
        user_id = f"u{self.user_base + len(self.accounts)}"
        self.accounts[user_id] = (full_name.strip(), department.strip().lower())
        return {"user_id": user_id}

    def tool_assign_laptop(self, user_id, model):
        if model not in self.LAPTOPS:
            raise ToolError(f"unknown model {model}; models: {', '.join(self.LAPTOPS)}")
        self.laptops[self._user(user_id)] = model
        return {"user_id": user_id, "laptop": model}

    def tool_add_to_group(self, user_id, group):
        if group not in self.GROUPS:
            raise ToolError(f"unknown group {group}")
        self.groups.setdefault(self._user(user_id), set()).add(group)
        return {"user_id": user_id, "groups": sorted(self.groups[user_id])}

    def subgoals(self):
        laptop, groups = self.policies[self.department]
        ok = [u for u, a in self.accounts.items() if a == (self.hire, self.department)]
        user = ok[0] if len(self.accounts) == 1 and ok else None
        if user is None:
            return [False] * (2 + len(groups))
        exact = self.groups.get(user, set()) <= set(groups)  # an extra group voids the group goals
        return [True, self.laptops.get(user) == laptop] + [g in self.groups.get(user, set()) and exact for g in groups]

    def solution(self):
        laptop, groups = self.policies[self.department]
        user = f"u{self.user_base}"
        return [
            self.call("get_policy", department=self.department)
            + self.call("create_account", full_name=self.hire, department=self.department),
            self.call("assign_laptop", user_id=user, model=laptop)
            + "".join(self.call("add_to_group", user_id=user, group=g) for g in groups),
            self.final("done"),
        ]
