"""The HTTP script of the compatibility matrix for Python's requests and urllib.

compat/http_test.go runs it with HTTP_PROXY and HTTPS_PROXY pointing at
governor-proxy, which both libraries read by themselves. COMPAT_HTTP_BASE and
COMPAT_HTTPS_BASE are the origins, COMPAT_CA the certificate to trust. It
prints one JSON object per cell:
{"cell": ..., "result": "ok" | "fail" | "unsupported" | "skip", "detail": ...}.

Usage: python3 http_clients.py requests|urllib
"""

import json
import os
import ssl
import sys
import traceback
import urllib.error
import urllib.request

CLIENT = sys.argv[1]
HTTP = os.environ["COMPAT_HTTP_BASE"]
HTTPS = os.environ["COMPAT_HTTPS_BASE"]
CA = os.environ["COMPAT_CA"]
TIMEOUT = 30
UPLOAD = 1 << 20

if CLIENT == "requests":
    import requests

    VERSION = "requests " + requests.__version__
    session = requests.Session()  # reads HTTP(S)_PROXY, as requests.get does
else:
    VERSION = "urllib (Python %d.%d)" % sys.version_info[:2]
    TLS = ssl.create_default_context(cafile=CA)


def report(cell, result, detail=""):
    print(json.dumps({"cell": cell, "result": result, "detail": detail}), flush=True)


class Response:
    """What a cell needs of a response, from either library."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body


def get(url):
    if CLIENT == "requests":
        r = session.get(url, verify=CA, timeout=TIMEOUT)
        return Response(r.status_code, r.headers, r.text)
    try:
        with urllib.request.urlopen(url, context=TLS if url.startswith("https") else None, timeout=TIMEOUT) as r:
            return Response(r.status, r.headers, r.read().decode())
    except urllib.error.HTTPError as e:  # urllib raises on 4xx and 5xx
        return Response(e.code, e.headers, e.read().decode())


def chunks():
    for _ in range(16):
        yield b"x" * (UPLOAD // 16)


def cell_http():
    r = get(HTTP + "/hello")
    return ("ok", "") if (r.status, r.body) == (200, "hello") else ("fail", "%d %s" % (r.status, r.body))


def cell_https():
    r = get(HTTPS + "/secure")
    return ("ok", "") if (r.status, r.body) == (200, "hello") else ("fail", "%d %s" % (r.status, r.body))


def cell_upload():
    want = "received %d" % UPLOAD
    if CLIENT == "requests":
        r = session.post(HTTP + "/upload", data=chunks(), timeout=TIMEOUT)  # a generator: chunked
        status, body, how = r.status_code, r.text, r.headers.get("Compat-Received-As")
    else:
        req = urllib.request.Request(HTTP + "/upload", data=chunks(), method="POST")  # an iterable: chunked
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            status, body, how = r.status, r.read().decode(), r.headers.get("Compat-Received-As")
    if (status, body) != (200, want):
        return "fail", "%d %s" % (status, body)
    return "ok", "the origin got it %s" % how


def cell_sse():
    """Reads the first event, asks for the second, reads it."""
    url = HTTP + "/sse?id=" + CLIENT
    if CLIENT == "requests":
        r = session.get(url, stream=True, timeout=TIMEOUT)
        lines = r.iter_lines(decode_unicode=True)
        close = r.close
    else:
        r = urllib.request.urlopen(url, timeout=TIMEOUT)
        lines = (line.decode().rstrip("\n") for line in r)
        close = r.close
    events = []
    for line in lines:
        if line.startswith("data: "):
            events.append(line[len("data: "):])
            if len(events) == 1:
                get(HTTP + "/sse-ack?id=" + CLIENT)
            if len(events) == 2:
                break
    close()
    return ("ok", "") if events == ["one", "two"] else ("fail", "events %r" % events)


def denial(url, status, cause):
    r = get(url)
    got = (r.status, r.headers.get("Governor-Denied"))
    if got != (status, cause):
        return "fail", "%r" % (got,)
    detail = "%d %s" % got
    if r.headers.get("x-should-retry"):
        detail += ", x-should-retry: " + r.headers["x-should-retry"]
    if r.headers.get("Retry-After"):
        detail += ", Retry-After"
    return "ok", detail + "; " + ("raised HTTPError" if CLIENT == "urllib" else "returned the response")


def tunnel_denial(url):
    try:
        r = get(url)
    except Exception as e:  # the raw message: the test keeps what it shows
        return "error", str(e)
    return "ok", "returned %d %s" % (r.status, r.headers.get("Governor-Denied"))


CELLS = [
    ("http", cell_http),
    ("https", cell_https),
    ("chunked upload", cell_upload),
    ("sse", cell_sse),
    ("429", lambda: denial(os.environ["COMPAT_QUOTA_URL"], 429, "quota")),
    ("503", lambda: denial(os.environ["COMPAT_SLOW_URL"], 503, "wait-timeout")),
    ("429 on CONNECT", lambda: tunnel_denial(os.environ["COMPAT_TUNNEL_URL"])),
]

if __name__ == "__main__":
    report("version", "ok", VERSION)
    for name, fn in CELLS:
        try:
            result, detail = fn()
        except Exception as e:
            result, detail = "fail", "".join(traceback.format_exception_only(type(e), e)).strip()
        report(name, result, detail)
