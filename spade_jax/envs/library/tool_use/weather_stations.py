"""Data retrieval: the warmest station of a region on a given day, from station lists and daily readings."""


class WeatherStationsEnv(ToolEnv):
    MAX_TURNS = 10
    REGIONS = ["north", "south", "coast", "highlands"]
    STATIONS = 3  # stations per region
    DAYS = 5

    TOOLS = [
        {"name": "list_stations", "description": "Stations of a region: ids and names.",
         "parameters": {"type": "object", "properties": {"region": {"type": "string", "enum": REGIONS}},
                        "required": ["region"]}},
        {"name": "get_readings", "description": "Daily maximum temperatures (deg C) of a station, day 1 first.",
         "parameters": {"type": "object", "properties": {"station_id": {"type": "string"}},
                        "required": ["station_id"]}},
    ]

    def setup(self, rng):
        self.stations = {}
        for region in self.REGIONS:
            for k in range(self.STATIONS):
                sid = f"{region[:2].upper()}{rng.randint(10, 99)}{k}"
                self.stations[sid] = {"region": region, "name": f"{region.title()} {rng.choice('ABCDEFGH')}{k}",
                                      "temps": [rng.randint(-5, 35) for _ in range(self.DAYS)]}
        self.region = rng.choice(self.REGIONS)
        self.day = rng.randint(1, self.DAYS)
        local = [s for s, v in self.stations.items() if v["region"] == self.region]
        for s in local:  # break ties so one station is warmest
            self.stations[s]["temps"][self.day - 1] += local.index(s) * 0.1
        self.warmest = max(local, key=lambda s: self.stations[s]["temps"][self.day - 1])
        self.read = set()
        return (f"Which station in the {self.region} region was warmest on day {self.day}? "
                "Answer with the station's name.")

    def tool_list_stations(self, region):
        return [{"station_id": s, "name": v["name"]} for s, v in self.stations.items() if v["region"] == region]

    def tool_get_readings(self, station_id):
        if station_id not in self.stations:
            raise ToolError(f"no station {station_id}")
        self.read.add(station_id)
        return {"station_id": station_id, "daily_max": [round(t, 1) for t in self.stations[station_id]["temps"]]}

    def subgoals(self):
        local = {s for s, v in self.stations.items() if v["region"] == self.region}
        return [local <= self.read, self.answer_matches(self.stations[self.warmest]["name"])]

    def solution(self):
        local = [s for s, v in self.stations.items() if v["region"] == self.region]
        return [
            self.call("list_stations", region=self.region),
            "".join(self.call("get_readings", station_id=s) for s in local),
            self.final(self.stations[self.warmest]["name"]),
        ]
