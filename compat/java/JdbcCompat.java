// The driver script of the compatibility matrix for the PostgreSQL JDBC
// driver: `java -cp postgresql.jar JdbcCompat.java` (the source launcher).
//
// compat/drivers_test.go runs it against PostgreSQL directly and through
// governor-proxy's pgwire listener, named by libpq's variables (PGHOST,
// PGPORT, PGUSER, PGPASSWORD, PGDATABASE), which JDBC does not read itself;
// COMPAT_MODE is "direct" or "proxy". It prints one JSON object per cell:
// {"cell", "result": "ok" | "fail" | "unsupported" | "skip", "detail"}.

import java.io.StringReader;
import java.io.StringWriter;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.copy.CopyManager;

public class JdbcCompat {
    static final String MODE = System.getenv("COMPAT_MODE");
    static final long WAIT_MS = 20_000; // the bound of every wait, never a pause

    interface Cell {
        String[] run() throws Exception;
    }

    static Connection connect(String... props) throws SQLException {
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/" + System.getenv("PGDATABASE");
        Properties p = new Properties();
        p.setProperty("user", System.getenv("PGUSER"));
        p.setProperty("password", System.getenv("PGPASSWORD"));
        p.setProperty("sslmode", "disable");
        p.setProperty("ApplicationName", "compat-jdbc");
        p.setProperty("prepareThreshold", "1"); // a named server-side statement from the first use
        for (int i = 0; i + 1 < props.length; i += 2) p.setProperty(props[i], props[i + 1]);
        return DriverManager.getConnection(url, p);
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static void report(String cell, String result, String detail) {
        System.out.println("{\"cell\":" + quote(cell) + ",\"result\":" + quote(result) + ",\"detail\":" + quote(detail) + "}");
        System.out.flush();
    }

    static long one(Connection c, String sql) throws SQLException {
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery(sql)) {
            rs.next();
            return rs.getLong(1);
        }
    }

    static String[] ok(String detail) { return new String[] {"ok", detail}; }

    static String[] fail(String detail) { return new String[] {"fail", detail}; }

    static String[] connectCell() throws Exception {
        try (Connection c = connect(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT current_user")) {
            rs.next();
            String user = rs.getString(1);
            return user.equals(System.getenv("PGUSER")) ? ok("SCRAM-SHA-256 as " + user) : fail("connected as " + user);
        }
    }

    static String[] simple() throws Exception {
        // The driver speaks the extended protocol unless told otherwise.
        try (Connection c = connect("preferQueryMode", "simple"); Statement s = c.createStatement()) {
            boolean rs = s.execute("SELECT 1; SELECT 2");
            s.getMoreResults();
            try (ResultSet r = s.getResultSet()) {
                r.next();
                return rs && r.getInt(1) == 2 ? ok("preferQueryMode=simple") : fail("second result " + r.getInt(1));
            }
        }
    }

    static String[] prepared() throws Exception {
        try (Connection c = connect(); PreparedStatement ps = c.prepareStatement("SELECT ?::int + 1")) {
            int n = 0;
            for (int i = 0; i < 2; i++) {
                ps.setInt(1, 41);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    n = rs.getInt(1);
                }
            }
            return n == 42 ? ok("extended protocol, named statement (prepareThreshold=1)") : fail("got " + n);
        }
    }

    static String[] transactions() throws Exception {
        try (Connection c = connect(); Statement s = c.createStatement()) {
            c.setAutoCommit(false);
            s.executeUpdate("INSERT INTO compat_items VALUES (1, 'committed')");
            c.commit();
            s.executeUpdate("INSERT INTO compat_items VALUES (2, 'rolled back')");
            c.rollback();
            long both = one(c, "SELECT count(*) FROM compat_items WHERE id IN (1, 2)");
            long first = one(c, "SELECT count(*) FROM compat_items WHERE id = 1");
            c.rollback();
            return both == 1 && first == 1 ? ok("") : fail("rows " + both + " " + first);
        }
    }

    static String[] denial() throws Exception {
        if (MODE.equals("direct")) return new String[] {"skip", "not governed"};
        try (Connection c = connect(); Statement s = c.createStatement()) {
            c.setAutoCommit(false);
            s.executeUpdate("INSERT INTO compat_items VALUES (3, 'before the denial')");
            String state;
            try {
                s.executeUpdate("INSERT INTO compat_denied VALUES (1)");
                return fail("the denied INSERT raised no error");
            } catch (SQLException e) {
                state = e.getSQLState();
            }
            String commit = "COMMIT returned";
            try {
                c.commit(); // must not commit the first INSERT
            } catch (SQLException e) {
                commit = "COMMIT raised " + e.getSQLState();
            }
            long items = one(c, "SELECT count(*) FROM compat_items WHERE id = 3");
            long denied = one(c, "SELECT count(*) FROM compat_denied");
            c.rollback();
            if (!"53400".equals(state) || items != 0 || denied != 0) return fail("SQLSTATE " + state + ", rows " + items + " " + denied);
            return ok("53400; " + commit + " and committed nothing; the connection went on");
        }
    }

    static String[] copy() throws Exception {
        try (Connection c = connect()) {
            CopyManager cm = c.unwrap(PGConnection.class).getCopyAPI();
            cm.copyIn("COPY compat_items FROM STDIN", new StringReader("10\tten\n11\televen\n12\ttwelve\n"));
            StringWriter out = new StringWriter();
            cm.copyOut("COPY (SELECT id FROM compat_items WHERE id >= 10 ORDER BY id) TO STDOUT", out);
            return out.toString().equals("10\n11\n12\n") ? ok("FROM STDIN and TO STDOUT (CopyManager)") : fail(out.toString());
        }
    }

    static String[] listen() throws Exception {
        try (Connection listener = connect(); Connection sender = connect()) {
            try (Statement s = listener.createStatement()) {
                s.execute("LISTEN compat_channel");
            }
            try (Statement s = sender.createStatement()) {
                s.execute("NOTIFY compat_channel, 'hello'");
            }
            PGNotification[] ns = listener.unwrap(PGConnection.class).getNotifications((int) WAIT_MS);
            if (ns == null || ns.length == 0) return fail("no notification");
            return ns[0].getParameter().equals("hello") ? ok("getNotifications(timeout)") : fail("got " + ns[0].getParameter());
        }
    }

    static boolean waitActive(Connection watcher, long pid) throws Exception {
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (System.currentTimeMillis() < deadline) {
            if (one(watcher, "SELECT count(*) FROM pg_stat_activity WHERE pid = " + pid + " AND state = 'active' AND query LIKE 'SELECT pg_sleep%'") > 0) return true;
            Thread.sleep(10); // another session's state gives no signal: poll it
        }
        return false;
    }

    static String[] cancel() throws Exception {
        try (Connection c = connect(); Connection watcher = connect(); Statement s = c.createStatement()) {
            long pid = one(c, "SELECT pg_backend_pid()");
            CompletableFuture<String> ended = CompletableFuture.supplyAsync(() -> {
                try {
                    s.execute("SELECT pg_sleep(60)");
                    return "finished";
                } catch (SQLException e) {
                    return e.getSQLState();
                }
            });
            if (!waitActive(watcher, pid)) return fail("the query never showed as active");
            s.cancel();
            String state = ended.get(WAIT_MS, TimeUnit.MILLISECONDS);
            if (!"57014".equals(state)) return fail("the query ended with " + state);
            return one(c, "SELECT 1") == 1 ? ok("57014 (Statement.cancel); the connection went on") : fail("SELECT 1");
        }
    }

    static String[] disconnect() throws Exception {
        try (Connection c = connect()) {
            long pid = one(c, "SELECT pg_backend_pid()");
            try (Connection other = connect()) {
                one(other, "SELECT count(*) FROM (SELECT pg_terminate_backend(" + pid + ")) t");
            }
            String state;
            try {
                one(c, "SELECT 1");
                return fail("the terminated connection still answered");
            } catch (SQLException e) {
                state = e.getSQLState();
            }
            boolean closed = c.isClosed() || !c.isValid(5);
            try (Connection again = connect()) {
                if (one(again, "SELECT 1") != 1) return fail("no new connection");
            }
            return closed ? ok("the next query raises; the Connection is closed") : fail("the Connection is not closed after " + state);
        }
    }

    public static void main(String[] args) {
        report("version", "ok", "PostgreSQL JDBC " + org.postgresql.util.DriverInfo.DRIVER_VERSION + " (Java " + Runtime.version().feature() + ")");
        Object[][] cells = {
            {"connect", (Cell) JdbcCompat::connectCell},
            {"simple", (Cell) JdbcCompat::simple},
            {"prepared", (Cell) JdbcCompat::prepared},
            {"transactions", (Cell) JdbcCompat::transactions},
            {"denial", (Cell) JdbcCompat::denial},
            {"copy", (Cell) JdbcCompat::copy},
            {"listen", (Cell) JdbcCompat::listen},
            {"cancel", (Cell) JdbcCompat::cancel},
            {"disconnect", (Cell) JdbcCompat::disconnect},
        };
        for (Object[] cell : cells) {
            String[] r;
            try {
                r = ((Cell) cell[1]).run();
            } catch (Exception e) {
                r = fail(e.toString());
            }
            report((String) cell[0], r[0], r[1]);
        }
        System.exit(0);
    }
}
