"""API orchestration: pay a foreign-currency invoice in euros, chaining invoice, exchange rate and payment."""


class InvoicePaymentEnv(ToolEnv):
    MAX_TURNS = 10
    CURRENCIES = ["USD", "GBP", "JPY", "CHF", "SEK"]
    INVOICES = 4  # invoices on file

    TOOLS = [
        {"name": "list_invoices", "description": "List the open invoices of a supplier: ids and due dates.",
         "parameters": {"type": "object", "properties": {"supplier": {"type": "string"}}, "required": ["supplier"]}},
        {"name": "get_invoice", "description": "Amount and currency of an invoice.",
         "parameters": {"type": "object", "properties": {"invoice_id": {"type": "string"}},
                        "required": ["invoice_id"]}},
        {"name": "get_rate", "description": "Euros per one unit of a currency today.",
         "parameters": {"type": "object", "properties": {"currency": {"type": "string"}}, "required": ["currency"]}},
        {"name": "create_payment", "description": "Pay an invoice; amount_eur must be the invoice amount in euros, "
                                                  "rounded to cents.",
         "parameters": {"type": "object", "properties": {"invoice_id": {"type": "string"},
                                                         "amount_eur": {"type": "number"}},
                        "required": ["invoice_id", "amount_eur"]}},
    ]

    def setup(self, rng):
        self.supplier = rng.choice(["Acme", "Borealis", "Cobalt", "Delta Labs"])
        days = rng.sample(range(1, 28), self.INVOICES)
        self.invoices = {}
        for i, day in enumerate(days):
            amount, currency = rng.randint(100, 5000), rng.choice(self.CURRENCIES)
            self.invoices[f"INV-{rng.randint(1000, 9999)}{i}"] = (day, amount, currency)
        self.rates = {c: rng.randint(5, 200) / 100 for c in self.CURRENCIES}
        self.target = min(self.invoices, key=lambda k: self.invoices[k][0])
        self.payments = []  # (invoice id, amount)
        return (f"Pay the open invoice of supplier {self.supplier} that is due first, in euros at today's rate. "
                "Answer with the payment id.")

    def _due(self):
        _, amount, currency = self.invoices[self.target]
        return round(amount * self.rates[currency], 2)

    def tool_list_invoices(self, supplier):
        if supplier.strip().lower() != self.supplier.lower():
            return []
        return [{"invoice_id": k, "due_day": v[0]} for k, v in self.invoices.items()]

    def tool_get_invoice(self, invoice_id):
        if invoice_id not in self.invoices:
            raise ToolError(f"no invoice {invoice_id}")
        _, amount, currency = self.invoices[invoice_id]
        return {"invoice_id": invoice_id, "amount": amount, "currency": currency}

    def tool_get_rate(self, currency):
        if currency.upper() not in self.rates:
            raise ToolError(f"unknown currency {currency}; known: {', '.join(self.rates)}")
        return {"currency": currency.upper(), "eur_per_unit": self.rates[currency.upper()]}

    def tool_create_payment(self, invoice_id, amount_eur):
        if invoice_id not in self.invoices:
            raise ToolError(f"no invoice {invoice_id}")
        self.payments.append((invoice_id, round(float(amount_eur), 2)))
        return {"payment_id": f"PAY{len(self.payments)}", "status": "sent"}

    def subgoals(self):
        right = [p for p in self.payments if p[0] == self.target and abs(p[1] - self._due()) < 0.005]
        return [len(self.payments) == 1 and len(right) == 1, self.answer_matches("PAY1")]

    def solution(self):
        _, _, currency = self.invoices[self.target]
        return [
            self.call("list_invoices", supplier=self.supplier),
            self.call("get_invoice", invoice_id=self.target) + self.call("get_rate", currency=currency),
            self.call("create_payment", invoice_id=self.target, amount_eur=self._due()),
            self.final("PAY1"),
        ]
