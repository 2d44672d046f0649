"""The driver script of the compatibility matrix for psycopg2 and psycopg 3.

compat/drivers_test.go runs it twice per driver, against PostgreSQL directly
and through governor-proxy's pgwire listener, with libpq's variables (PGHOST,
PGPORT, PGUSER, PGPASSWORD, PGDATABASE) naming the target and COMPAT_MODE
"direct" or "proxy". It prints one JSON object per cell:
{"cell": ..., "result": "ok" | "fail" | "unsupported" | "skip", "detail": ...}.

Usage: python3 drivers.py psycopg2|psycopg
"""

import json
import os
import sys
import threading
import time
import traceback

DRIVER = sys.argv[1]
MODE = os.environ["COMPAT_MODE"]
WAIT = 20  # seconds: the bound of every wait, never a pause

if DRIVER == "psycopg2":
    import psycopg2 as db
    import psycopg2.extensions

    VERSION = "psycopg2 " + db.__version__.split(" ")[0]
else:
    import psycopg as db

    VERSION = "psycopg " + db.__version__


def report(cell, result, detail=""):
    print(json.dumps({"cell": cell, "result": result, "detail": detail}), flush=True)


def connect():
    # libpq reads PGHOST, PGPORT, PGUSER, PGPASSWORD and PGDATABASE.
    conn = db.connect("application_name=compat-" + DRIVER)
    return conn


def sqlstate(err):
    if DRIVER == "psycopg2":
        return err.pgcode
    return err.sqlstate


def one(conn, sql, params=None):
    cur = conn.cursor()
    cur.execute(sql, params)
    row = cur.fetchone()
    cur.close()
    return row


def autocommit(conn):
    conn.autocommit = True
    return conn


def cell_connect():
    conn = connect()
    user = one(conn, "SELECT current_user")[0]
    conn.close()
    if user != os.environ["PGUSER"]:
        return "fail", "connected as %s" % user
    return "ok", "SCRAM-SHA-256 as %s" % user


def cell_simple():
    conn = autocommit(connect())
    cur = conn.cursor()
    cur.execute("SELECT 1; SELECT 2")  # two statements: the simple protocol only
    if DRIVER == "psycopg":
        cur.nextset()  # psycopg 3 keeps every result; psycopg2 only the last
    row = cur.fetchone()
    conn.close()
    return ("ok", "") if row == (2,) else ("fail", repr(row))


def cell_prepared():
    conn = autocommit(connect())
    if DRIVER == "psycopg2":
        # psycopg2 binds parameters on the client; a prepared statement is SQL's.
        cur = conn.cursor()
        cur.execute("PREPARE q(int) AS SELECT $1 + 1")
        cur.execute("EXECUTE q(%s)", (41,))
        row = cur.fetchone()
        conn.close()
        return ("ok", "SQL PREPARE/EXECUTE (parameters bound by the client)") if row == (42,) else ("fail", repr(row))
    cur = conn.cursor()
    for _ in range(2):
        cur.execute("SELECT %s::int + 1", (41,), prepare=True)  # a named statement, Parse once
        row = cur.fetchone()
    conn.close()
    return ("ok", "extended protocol, named statement") if row == (42,) else ("fail", repr(row))


def count(conn, where):
    return one(conn, "SELECT count(*) FROM compat_items WHERE " + where)[0]


def cell_transactions():
    conn = connect()  # not autocommit: the driver opens the transaction
    cur = conn.cursor()
    cur.execute("INSERT INTO compat_items VALUES (1, 'committed')")
    conn.commit()
    cur.execute("INSERT INTO compat_items VALUES (2, 'rolled back')")
    conn.rollback()
    got = count(conn, "id IN (1, 2)"), count(conn, "id = 1")
    conn.rollback()
    conn.close()
    return ("ok", "") if got == (1, 1) else ("fail", "rows %r" % (got,))


def cell_denial():
    if MODE == "direct":
        return "skip", "not governed"
    conn = connect()
    cur = conn.cursor()
    cur.execute("INSERT INTO compat_items VALUES (3, 'before the denial')")
    try:
        cur.execute("INSERT INTO compat_denied VALUES (1)")
        return "fail", "the denied INSERT raised no error"
    except db.Error as e:
        state = sqlstate(e)
    conn.commit()  # must not commit the first INSERT
    got = count(conn, "id = 3"), one(conn, "SELECT count(*) FROM compat_denied")[0]
    conn.rollback()
    conn.close()
    if state != "53400" or got != (0, 0):
        return "fail", "SQLSTATE %s, rows %r" % (state, got)
    return "ok", "53400; COMMIT committed nothing; the connection went on"


def cell_copy():
    conn = autocommit(connect())
    cur = conn.cursor()
    rows = "10\tten\n11\televen\n12\ttwelve\n"
    if DRIVER == "psycopg2":
        import io

        cur.copy_expert("COPY compat_items FROM STDIN", io.StringIO(rows))
        out = io.StringIO()
        cur.copy_expert("COPY (SELECT id FROM compat_items WHERE id >= 10 ORDER BY id) TO STDOUT", out)
        got = out.getvalue()
    else:
        with cur.copy("COPY compat_items FROM STDIN") as cp:
            cp.write(rows)
        got = ""
        with cur.copy("COPY (SELECT id FROM compat_items WHERE id >= 10 ORDER BY id) TO STDOUT") as cp:
            for chunk in cp:
                got += bytes(chunk).decode()
    conn.close()
    return ("ok", "FROM STDIN and TO STDOUT") if got == "10\n11\n12\n" else ("fail", repr(got))


def cell_listen():
    listener = autocommit(connect())
    listener.cursor().execute("LISTEN compat_channel")
    sender = autocommit(connect())
    sender.cursor().execute("NOTIFY compat_channel, 'hello'")
    sender.close()
    payload = None
    if DRIVER == "psycopg2":
        import select

        deadline = time.monotonic() + WAIT
        while payload is None and time.monotonic() < deadline:
            select.select([listener], [], [], deadline - time.monotonic())
            listener.poll()
            if listener.notifies:
                payload = listener.notifies.pop(0).payload
    else:
        # psycopg 3.1's notifies() has no timeout (3.2 added one): a timer
        # wakes it with a notification of its own if the test's never came.
        def wake():
            waker = autocommit(connect())
            waker.cursor().execute("NOTIFY compat_channel, 'timeout'")
            waker.close()

        timer = threading.Timer(WAIT, wake)
        timer.start()
        for n in listener.notifies():
            payload = n.payload
            break
        timer.cancel()
    listener.close()
    return ("ok", "") if payload == "hello" else ("fail", "got %r" % payload)


def wait_active(watcher, pid):
    """Waits until backend pid runs pg_sleep, so that a cancel meets it."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if one(watcher, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND state = 'active' AND query LIKE 'SELECT pg_sleep%%'", (pid,))[0]:
            return True
        time.sleep(0.01)  # polling another session's state; no signal exists
    return False


def cell_cancel():
    conn = autocommit(connect())
    pid = one(conn, "SELECT pg_backend_pid()")[0]
    watcher = autocommit(connect())
    result = {}

    def run():
        try:
            one(conn, "SELECT pg_sleep(60)")
            result["state"] = "finished"
        except db.Error as e:
            result["state"] = sqlstate(e)

    t = threading.Thread(target=run)
    t.start()
    if not wait_active(watcher, pid):
        return "fail", "the query never showed as active"
    conn.cancel()
    t.join(WAIT)
    watcher.close()
    if result.get("state") != "57014":
        return "fail", "the query ended with %r" % result.get("state")
    after = one(conn, "SELECT 1")
    conn.close()
    return ("ok", "57014; the connection went on") if after == (1,) else ("fail", repr(after))


def cell_disconnect():
    conn = autocommit(connect())
    pid = one(conn, "SELECT pg_backend_pid()")[0]
    other = autocommit(connect())
    one(other, "SELECT pg_terminate_backend(%s)", (pid,))
    other.close()
    try:
        one(conn, "SELECT 1")
        return "fail", "the terminated connection still answered"
    except db.Error as e:
        err = e
    closed = conn.closed
    again = autocommit(connect())
    ok = one(again, "SELECT 1") == (1,)
    again.close()
    if not closed or not ok:
        return "fail", "closed=%r, reconnect=%r (%s)" % (closed, ok, err)
    return "ok", "the next query raises; the driver marks the connection closed"


CELLS = [
    ("connect", cell_connect),
    ("simple", cell_simple),
    ("prepared", cell_prepared),
    ("transactions", cell_transactions),
    ("denial", cell_denial),
    ("copy", cell_copy),
    ("listen", cell_listen),
    ("cancel", cell_cancel),
    ("disconnect", cell_disconnect),
]

if __name__ == "__main__":
    report("version", "ok", VERSION)
    for name, fn in CELLS:
        try:
            result, detail = fn()
        except Exception as e:  # a cell that raised failed; the next one runs
            result, detail = "fail", "".join(traceback.format_exception_only(type(e), e)).strip()
        report(name, result, detail)
