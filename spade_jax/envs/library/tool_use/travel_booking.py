"""API orchestration: book the cheapest flight, then a hotel tied to that flight's booking reference."""


class TravelBookingEnv(ToolEnv):
    MAX_TURNS = 10
    CITIES = ["Lisbon", "Oslo", "Prague", "Vienna", "Dublin", "Madrid"]
    FLIGHTS = 4  # flights offered on the route
    HOTELS = 3  # hotels offered in the destination

    TOOLS = [
        {"name": "search_flights", "description": "List flights between two cities with their ids and prices.",
         "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                                                         "destination": {"type": "string"}},
                        "required": ["origin", "destination"]}},
        {"name": "book_flight", "description": "Book a flight by id; returns a booking reference.",
         "parameters": {"type": "object", "properties": {"flight_id": {"type": "string"}}, "required": ["flight_id"]}},
        {"name": "search_hotels", "description": "List hotels in a city with their ids and nightly prices.",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        {"name": "book_hotel", "description": "Book a hotel for a trip, linked to a flight booking reference.",
         "parameters": {"type": "object", "properties": {"hotel_id": {"type": "string"},
                                                         "booking_ref": {"type": "string"}},
                        "required": ["hotel_id", "booking_ref"]}},
    ]

    def setup(self, rng):
        self.origin, self.destination = rng.sample(self.CITIES, 2)
        prices = rng.sample(range(80, 400), self.FLIGHTS)
        self.flights = {f"FL{rng.randint(100, 999)}{i}": p for i, p in enumerate(prices)}
        self.hotels = {f"H{rng.randint(10, 99)}{i}": rng.randint(60, 200) for i in range(self.HOTELS)}
        self.cheapest = min(self.flights, key=self.flights.get)
        self.best_hotel = min(self.hotels, key=self.hotels.get)
        self.flight_refs = {}  # booking ref -> flight id
        self.hotel_bookings = []  # (hotel id, booking ref)
        return (f"Book the cheapest flight from {self.origin} to {self.destination} and the cheapest hotel "
                "there, linking the hotel to the flight's booking reference. Answer with the total of the "
                "flight price and one hotel night.")

    def tool_search_flights(self, origin, destination):
        if (origin.strip().title(), destination.strip().title()) != (self.origin, self.destination):
            return []
        return [{"flight_id": f, "price": p} for f, p in self.flights.items()]

    def tool_book_flight(self, flight_id):
        if flight_id not in self.flights:
            raise ToolError(f"no flight {flight_id}")
        ref = f"BK{len(self.flight_refs) + 1}{flight_id[-2:]}"
        self.flight_refs[ref] = flight_id
        return {"booking_ref": ref, "flight_id": flight_id}

    def tool_search_hotels(self, city):
        if city.strip().title() != self.destination:
            return []
        return [{"hotel_id": h, "price_per_night": p} for h, p in self.hotels.items()]

    def tool_book_hotel(self, hotel_id, booking_ref):
        if hotel_id not in self.hotels:
            raise ToolError(f"no hotel {hotel_id}")
        if booking_ref not in self.flight_refs:
            raise ToolError(f"unknown booking reference {booking_ref}")
        self.hotel_bookings.append((hotel_id, booking_ref))
        return {"status": "confirmed", "hotel_id": hotel_id, "booking_ref": booking_ref}

    def subgoals(self):
        booked = list(self.flight_refs.values())
        linked = [(h, self.flight_refs[r]) for h, r in self.hotel_bookings]
        return [
            booked == [self.cheapest],
            linked == [(self.best_hotel, self.cheapest)],
            self.answer_matches(self.flights[self.cheapest] + self.hotels[self.best_hotel]),
        ]

    def solution(self):
        ref = f"BK1{self.cheapest[-2:]}"
        return [
            self.call("search_flights", origin=self.origin, destination=self.destination),
            self.call("book_flight", flight_id=self.cheapest) + self.call("search_hotels", city=self.destination),
            self.call("book_hotel", hotel_id=self.best_hotel, booking_ref=ref),
            self.final(self.flights[self.cheapest] + self.hotels[self.best_hotel]),
        ]
