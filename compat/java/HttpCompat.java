// The HTTP script of the compatibility matrix for Java's HttpClient:
// `java -Dhttp.proxyHost=... -Dhttp.proxyPort=... -Dhttps.proxyHost=...
// -Dhttps.proxyPort=... HttpCompat.java` (the source launcher).
//
// compat/http_test.go runs it with the proxy given as system properties,
// which HttpClient's default ProxySelector reads. COMPAT_HTTP_BASE and
// COMPAT_HTTPS_BASE are the origins, COMPAT_CA the certificate to trust. It
// prints one JSON object per cell:
// {"cell", "result": "ok" | "fail" | "unsupported" | "skip", "detail"}.

import java.io.ByteArrayInputStream;
import java.io.FileInputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.stream.Stream;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

public class HttpCompat {
    static final String HTTP = System.getenv("COMPAT_HTTP_BASE");
    static final String HTTPS = System.getenv("COMPAT_HTTPS_BASE");
    static final Duration TIMEOUT = Duration.ofSeconds(30);
    static final int UPLOAD = 1 << 20;
    static HttpClient client;

    interface Cell {
        String[] run() throws Exception;
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

    static String[] ok(String detail) { return new String[] {"ok", detail}; }

    static String[] fail(String detail) { return new String[] {"fail", detail}; }

    // trusting is an SSLContext that trusts the test origin's certificate,
    // as a truststore would.
    static SSLContext trusting(String pemFile) throws Exception {
        KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
        ks.load(null, null);
        try (FileInputStream in = new FileInputStream(pemFile)) {
            ks.setCertificateEntry("origin", CertificateFactory.getInstance("X.509").generateCertificate(in));
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(ks);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, tmf.getTrustManagers(), null);
        return ctx;
    }

    static HttpResponse<String> get(String url) throws Exception {
        return client.send(HttpRequest.newBuilder(URI.create(url)).timeout(TIMEOUT).build(), HttpResponse.BodyHandlers.ofString());
    }

    static String[] http() throws Exception {
        HttpResponse<String> r = get(HTTP + "/hello");
        return r.statusCode() == 200 && r.body().equals("hello") ? ok("") : fail(r.statusCode() + " " + r.body());
    }

    static String[] https() throws Exception {
        HttpResponse<String> r = get(HTTPS + "/secure");
        return r.statusCode() == 200 && r.body().equals("hello") ? ok("") : fail(r.statusCode() + " " + r.body());
    }

    static String[] upload() throws Exception {
        byte[] body = new byte[UPLOAD];
        // An InputStream publisher has no length: the body goes chunked.
        HttpRequest req = HttpRequest.newBuilder(URI.create(HTTP + "/upload")).timeout(TIMEOUT)
            .POST(HttpRequest.BodyPublishers.ofInputStream(() -> new ByteArrayInputStream(body))).build();
        HttpResponse<String> r = client.send(req, HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() != 200 || !r.body().equals("received " + UPLOAD)) return fail(r.statusCode() + " " + r.body());
        return ok("the origin got it " + r.headers().firstValue("Compat-Received-As").orElse("?"));
    }

    static String[] sse() throws Exception {
        HttpResponse<Stream<String>> r = client.send(HttpRequest.newBuilder(URI.create(HTTP + "/sse?id=java")).timeout(TIMEOUT).build(),
            HttpResponse.BodyHandlers.ofLines());
        List<String> events = new ArrayList<>();
        try (Stream<String> lines = r.body()) {
            Iterator<String> it = lines.iterator();
            while (events.size() < 2 && it.hasNext()) {
                String line = it.next();
                if (!line.startsWith("data: ")) continue;
                events.add(line.substring(6));
                if (events.size() == 1) get(HTTP + "/sse-ack?id=java");
            }
        }
        return events.equals(List.of("one", "two")) ? ok("") : fail("events " + events);
    }

    static String[] denial(String url, int status, String cause) throws Exception {
        HttpResponse<String> r = get(url);
        String got = r.headers().firstValue("Governor-Denied").orElse("");
        if (r.statusCode() != status || !got.equals(cause)) return fail(r.statusCode() + " " + got);
        String detail = status + " " + cause;
        if (r.headers().firstValue("x-should-retry").isPresent()) detail += ", x-should-retry: " + r.headers().firstValue("x-should-retry").get();
        if (r.headers().firstValue("Retry-After").isPresent()) detail += ", Retry-After";
        return ok(detail + "; returned the response");
    }

    static String[] tunnelDenial(String url) {
        try {
            HttpResponse<String> r = get(url);
            return ok("returned " + r.statusCode() + " " + r.headers().firstValue("Governor-Denied").orElse(""));
        } catch (Exception e) {
            return new String[] {"error", e.toString()}; // the raw message: the test keeps what it shows
        }
    }

    public static void main(String[] args) throws Exception {
        report("version", "ok", "java.net.http.HttpClient (Java " + Runtime.version().feature() + ")");
        client = HttpClient.newBuilder().sslContext(trusting(System.getenv("COMPAT_CA"))).connectTimeout(TIMEOUT).build();
        Object[][] cells = {
            {"http", (Cell) HttpCompat::http},
            {"https", (Cell) HttpCompat::https},
            {"chunked upload", (Cell) HttpCompat::upload},
            {"sse", (Cell) HttpCompat::sse},
            {"429", (Cell) () -> denial(System.getenv("COMPAT_QUOTA_URL"), 429, "quota")},
            {"503", (Cell) () -> denial(System.getenv("COMPAT_SLOW_URL"), 503, "wait-timeout")},
            {"429 on CONNECT", (Cell) () -> tunnelDenial(System.getenv("COMPAT_TUNNEL_URL"))},
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
