"""Error recovery: charge an order through a gateway that rate-limits and a card on file that has expired."""


class FlakyPaymentEnv(ToolEnv):
    MAX_TURNS = 12
    CARDS = 3  # cards on file

    TOOLS = [
        {"name": "get_order", "description": "Total (in cents) and customer of an order.",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
        {"name": "list_cards", "description": "Cards on file of a customer: id, last digits, expiry year.",
         "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}},
                        "required": ["customer_id"]}},
        {"name": "charge", "description": "Charge a card; amount in cents.",
         "parameters": {"type": "object", "properties": {"card_id": {"type": "string"},
                                                         "amount_cents": {"type": "integer"},
                                                         "order_id": {"type": "string"}},
                        "required": ["card_id", "amount_cents", "order_id"]}},
    ]

    def setup(self, rng):
        self.year = 2026
        self.order_id = f"ORD{rng.randint(10000, 99999)}"
        self.customer = f"C{rng.randint(100, 999)}"
        self.total = rng.randint(500, 50000)
        self.cards = {}
        for k in range(self.CARDS):
            self.cards[f"card_{rng.randint(10, 99)}{k}"] = self.year - 2 + k  # one expired, then valid ones
        self.expired = min(self.cards, key=self.cards.get)
        self.valid_cards = [c for c in self.cards if self.cards[c] >= self.year]
        self.busy = rng.randint(1, 2)  # charges refused with 'rate limited' before the gateway accepts
        self.charges = []  # (card, amount) accepted
        return (f"Customer {self.customer} asks you to charge order {self.order_id} to the card they used "
                f"last time ({self.expired}); if that fails, use another valid card of theirs. The payment "
                "gateway is flaky. Answer with the transaction id.")

    def tool_get_order(self, order_id):
        if order_id != self.order_id:
            raise ToolError(f"no order {order_id}")
        return {"order_id": order_id, "customer_id": self.customer, "total_cents": self.total}

    def tool_list_cards(self, customer_id):
        if customer_id != self.customer:
            raise ToolError(f"no customer {customer_id}")
        return [{"card_id": c, "expiry_year": y} for c, y in self.cards.items()]

    def tool_charge(self, card_id, amount_cents, order_id):
        if card_id not in self.cards:
            raise ToolError(f"no card {card_id}")
        if order_id != self.order_id:
            raise ToolError(f"no order {order_id}")
        if self.cards[card_id] < self.year:
            raise ToolError(f"card {card_id} expired in {self.cards[card_id]}; use another card on file")
        if self.busy > 0:
            self.busy -= 1
            raise ToolError("gateway busy: rate limited, retry the same charge")
        self.charges.append((card_id, amount_cents))
        return {"transaction_id": f"TX{len(self.charges)}{self.order_id[-3:]}", "status": "captured"}

    def subgoals(self):
        right = [c for c in self.charges if c[0] in self.valid_cards and c[1] == self.total]
        return [len(self.charges) == 1 and len(right) == 1, self.answer_matches(f"TX1{self.order_id[-3:]}")]

    def solution(self):
        card = self.valid_cards[0]
        charge = self.call("charge", card_id=card, amount_cents=self.total, order_id=self.order_id)
        return [
            self.call("get_order", order_id=self.order_id) + self.call("list_cards", customer_id=self.customer),
            self.call("charge", card_id=self.expired, amount_cents=self.total, order_id=self.order_id),
            *[charge] * (self.busy + 1),  # the refusals the gateway has left, then the one that goes through
            self.final(f"TX1{self.order_id[-3:]}"),
        ]
