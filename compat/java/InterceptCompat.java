// The intercepted-HTTPS script of the compatibility matrix for Java's
// HttpClient: `java -Dhttps.proxyHost=... -Dhttps.proxyPort=...
// -Djavax.net.ssl.trustStore=... -Djavax.net.ssl.trustStorePassword=...
// InterceptCompat.java` (the source launcher).
//
// compat/intercept_test.go runs it with the proxy as system properties,
// which HttpClient's default ProxySelector reads, and a truststore made by
// keytool holding the sidecar's CA, which the default SSLContext reads: no
// code of its own for either, as in production. It sends six GETs to
// COMPAT_INTERCEPT_URL with one client and prints one JSON object per cell,
// {"cell", "result", "detail"}: statuses (the six; "error": the
// exception), denied (the sixth's Governor-Denied) and protocol.

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

public class InterceptCompat {
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

    public static void main(String[] args) {
        report("version", "ok", "java.net.http.HttpClient (Java " + Runtime.version().feature() + ")");
        HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(30)).build();
        HttpRequest req = HttpRequest.newBuilder(URI.create(System.getenv("COMPAT_INTERCEPT_URL"))).timeout(Duration.ofSeconds(30)).build();
        List<String> statuses = new ArrayList<>();
        boolean ok = true;
        HttpResponse<String> last = null;
        try {
            for (int i = 0; i < 6; i++) {
                last = client.send(req, HttpResponse.BodyHandlers.ofString());
                statuses.add(String.valueOf(last.statusCode()));
                if (last.statusCode() == 200 && !last.body().equals("hello")) ok = false;
            }
        } catch (Exception e) {
            report("statuses", "error", e.toString());
            System.exit(0);
        }
        report("statuses", ok ? "ok" : "fail", String.join(" ", statuses));
        report("denied", "ok", last.headers().firstValue("Governor-Denied").orElse(""));
        report("protocol", "ok", last.version() == HttpClient.Version.HTTP_2 ? "HTTP/2" : "HTTP/1.1");
        System.exit(0);
    }
}
