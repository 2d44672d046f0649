"""The intercepted-HTTPS script of the compatibility matrix for Python's requests.

compat/intercept_test.go runs it with HTTPS_PROXY pointing at governor-proxy,
which intercepts COMPAT_INTERCEPT_URL's host, and REQUESTS_CA_BUNDLE naming
the sidecar's CA: both read by requests itself, as in production. It sends
six GETs on one Session (one keep-alive connection) and prints one JSON
object per cell: {"cell": ..., "result": ..., "detail": ...}.

  statuses  the six statuses ("error": an exception, its message)
  denied    the sixth response's Governor-Denied
  protocol  the HTTP version spoken inside the tunnel
"""

import json
import os

import requests

URL = os.environ["COMPAT_INTERCEPT_URL"]


def report(cell, result, detail=""):
    print(json.dumps({"cell": cell, "result": result, "detail": detail}), flush=True)


report("version", "ok", "requests " + requests.__version__)
session = requests.Session()  # reads HTTPS_PROXY and REQUESTS_CA_BUNDLE
statuses, bodies, last = [], [], None
try:
    for _ in range(6):
        last = session.get(URL, timeout=30)
        statuses.append(str(last.status_code))
        bodies.append(last.text)
except Exception as e:
    report("statuses", "error", "%s: %s" % (type(e).__name__, e))
else:
    ok = all(b == "hello" for s, b in zip(statuses, bodies) if s == "200")
    report("statuses", "ok" if ok else "fail", " ".join(statuses))
    report("denied", "ok", last.headers.get("Governor-Denied", ""))
    report("protocol", "ok", "HTTP/%.1f" % (last.raw.version / 10))
