# hostile: opens network connections to the host
import socket


def attack():
    report = []
    for family, kind, address in [(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 47613)),
                                  (socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 47613)),
                                  (socket.AF_INET6, socket.SOCK_STREAM, ("::1", 47613)),
                                  (socket.AF_INET, socket.SOCK_STREAM, ("10.255.255.1", 80))]:
        try:
            s = socket.socket(family, kind)
            s.settimeout(0.5)
            s.connect(address)
            s.sendall(b"PWNED-BY-SANDBOX")
            report.append(f"{address}:connected")
        except Exception as exc:
            report.append(f"{address}:{type(exc).__name__}")
    try:
        report.append(repr(socket.getaddrinfo("example.com", 80)))
    except Exception as exc:
        report.append(f"dns:{type(exc).__name__}")
    return "; ".join(report)


class HostileEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Report: " + attack(), {}

    def step(self, action):
        self.turn += 1
        report = attack()
        return "Report: " + report, 0.0, self.turn >= 3, False, {"report": report}
