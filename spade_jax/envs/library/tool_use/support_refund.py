"""Multi-step workflow: find a customer by email, find the order holding an item, refund it, then notify them."""


class SupportRefundEnv(ToolEnv):
    MAX_TURNS = 12
    PRODUCTS = ["scarf", "mug", "charger", "notebook", "umbrella", "speaker", "helmet"]
    ORDERS = 3  # orders of the customer

    TOOLS = [
        {"name": "find_customer", "description": "Customer id for an email address.",
         "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}},
        {"name": "list_orders", "description": "Orders of a customer: order ids and the items in each.",
         "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}},
                        "required": ["customer_id"]}},
        {"name": "refund_item", "description": "Refund one item of an order.",
         "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "item": {"type": "string"},
                                                         "reason": {"type": "string"}},
                        "required": ["order_id", "item", "reason"]}},
        {"name": "send_email", "description": "Email a customer using a template.",
         "parameters": {"type": "object", "properties": {
             "customer_id": {"type": "string"},
             "template": {"type": "string", "enum": ["refund_confirmation", "shipping_update", "survey"]}},
             "required": ["customer_id", "template"]}},
    ]

    def setup(self, rng):
        self.name = rng.choice(["lena", "omar", "pia", "raj", "sofia"])
        self.email = f"{self.name}{rng.randint(1, 99)}@example.com"
        self.customer = f"CU{rng.randint(1000, 9999)}"
        items = rng.sample(self.PRODUCTS, self.ORDERS * 2)
        self.orders = {f"O{rng.randint(100, 999)}{k}": items[2 * k:2 * k + 2] for k in range(self.ORDERS)}
        self.order = rng.choice(sorted(self.orders))
        self.item = rng.choice(self.orders[self.order])
        self.reason = rng.choice(["arrived broken", "wrong colour", "never delivered"])
        self.refunds, self.emails = [], []
        return (f"A customer writes from {self.email}: 'My {self.item} {self.reason}, please refund it.' "
                "Refund that item, send them the refund confirmation email, and answer done.")

    def tool_find_customer(self, email):
        if email.strip().lower() != self.email:
            raise ToolError(f"no customer with email {email}")
        return {"customer_id": self.customer}

    def tool_list_orders(self, customer_id):
        if customer_id != self.customer:
            raise ToolError(f"no customer {customer_id}")
        return [{"order_id": o, "items": items} for o, items in self.orders.items()]

    def tool_refund_item(self, order_id, item, reason):
        if item not in self.orders.get(order_id, []):
            raise ToolError(f"order {order_id} holds no {item}")
        self.refunds.append((order_id, item))
        return {"refund_id": f"RF{len(self.refunds)}", "order_id": order_id, "item": item}

    def tool_send_email(self, customer_id, template):
        if customer_id != self.customer:
            raise ToolError(f"no customer {customer_id}")
        self.emails.append((template, bool(self.refunds)))
        return {"sent": template}

    def subgoals(self):
        return [self.refunds == [(self.order, self.item)],
                self.emails == [("refund_confirmation", True)]]

    def solution(self):
        return [
            self.call("find_customer", email=self.email),
            self.call("list_orders", customer_id=self.customer),
            self.call("refund_item", order_id=self.order, item=self.item, reason=self.reason),
            self.call("send_email", customer_id=self.customer, template="refund_confirmation"),
            self.final("done"),
        ]
