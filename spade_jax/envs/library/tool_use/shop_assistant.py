"""Tool selection: among many shop tools, pick the ones that answer a shopper's question about price and delivery."""


class ShopAssistantEnv(ToolEnv):
    MAX_TURNS = 8
    ITEMS = ["kettle", "lamp", "backpack", "blender", "headphones", "desk", "tent"]
    CITIES = ["Porto", "Bergen", "Ghent", "Turku"]

    TOOLS = [
        {"name": "get_price", "description": "Current price of an item in euros.",
         "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}},
        {"name": "get_reviews", "description": "Average star rating of an item.",
         "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}},
        {"name": "get_stock", "description": "Units of an item in the warehouse.",
         "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}},
        {"name": "get_shipping_fee", "description": "Shipping fee in euros of an item to a city.",
         "parameters": {"type": "object", "properties": {"item": {"type": "string"}, "city": {"type": "string"}},
                        "required": ["item", "city"]}},
        {"name": "get_coupon", "description": "Discount (percent) of a coupon code, applied to the item price only.",
         "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}},
        {"name": "get_store_hours", "description": "Opening hours of the shop in a city.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    ]

    def setup(self, rng):
        self.item, self.city = rng.choice(self.ITEMS), rng.choice(self.CITIES)
        self.prices = {i: rng.randint(20, 300) for i in self.ITEMS}
        self.fees = {(i, c): rng.randint(3, 30) for i in self.ITEMS for c in self.CITIES}
        self.code = f"SAVE{rng.randint(1, 9)}{rng.choice('XYZ')}"
        self.percent = rng.choice([10, 20, 25, 50])
        self.used = set()
        price = self.prices[self.item] * (100 - self.percent) / 100
        self.total = round(price + self.fees[(self.item, self.city)], 2)
        return (f"A shopper in {self.city} wants one {self.item} with coupon {self.code}. What do they pay in "
                "total, shipping included? Answer with the amount in euros.")

    def _item(self, item):
        item = item.strip().lower()
        if item not in self.prices:
            raise ToolError(f"no item {item!r}")
        return item

    def tool_get_price(self, item):
        self.used.add("get_price")
        return {"item": item, "price_eur": self.prices[self._item(item)]}

    def tool_get_reviews(self, item):
        self.used.add("get_reviews")
        return {"item": item, "stars": 3 + len(self._item(item)) % 3}

    def tool_get_stock(self, item):
        self.used.add("get_stock")
        return {"item": item, "units": 4 * len(self._item(item))}

    def tool_get_shipping_fee(self, item, city):
        self.used.add("get_shipping_fee")
        if city.strip().title() not in self.CITIES:
            raise ToolError(f"no delivery to {city}")
        return {"item": item, "city": city, "fee_eur": self.fees[(self._item(item), city.strip().title())]}

    def tool_get_coupon(self, code):
        self.used.add("get_coupon")
        if code.strip().upper() != self.code:
            raise ToolError(f"unknown coupon {code}")
        return {"code": self.code, "percent_off": self.percent}

    def tool_get_store_hours(self, city):
        self.used.add("get_store_hours")
        return {"city": city, "hours": "9-18"}

    def subgoals(self):
        needed = {"get_price", "get_shipping_fee", "get_coupon"}
        return [needed == self.used, self.answer_matches(self.total)]  # the needed tools and no other

    def solution(self):
        return [
            self.call("get_price", item=self.item) + self.call("get_coupon", code=self.code)
            + self.call("get_shipping_fee", item=self.item, city=self.city),
            self.final(self.total),
        ]
