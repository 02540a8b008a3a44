"""A webhook receiver that drips: it reads the request, sends its headers and then one body byte
every ``interval`` seconds, each byte well within any per-read timeout, until ``give_up_after``
seconds (then it closes: the answer is never complete). It counts the connections it holds and
records each delivery id it was sent."""

import socket
import threading
import time


class DripReceiver:
    def __init__(self, *, interval: float = 0.3, give_up_after: float = 60.0) -> None:
        self.interval, self.give_up_after = interval, give_up_after
        self.deliveries: list[str] = []
        self.open = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self.open += 1
        try:
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        return
                    request += data
                for line in request.split(b"\r\n"):
                    if line.lower().startswith(b"x-agentops-delivery:"):
                        with self._lock:
                            self.deliveries.append(line.split(b":", 1)[1].strip().decode())
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
                until = time.monotonic() + self.give_up_after
                while not self._stop.is_set() and time.monotonic() < until:
                    conn.sendall(b"x")
                    time.sleep(self.interval)
        except OSError:
            pass
        finally:
            with self._lock:
                self.open -= 1

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
