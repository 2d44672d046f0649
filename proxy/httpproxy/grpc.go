package httpproxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// A gRPC call (a request whose Content-Type is application/grpc, as every
// gRPC client sends) refused by the proxy is answered as gRPC answers: a
// "trailers-only" response, HTTP 200 with grpc-status and grpc-message in
// its headers and no body, so that the client raises the status the
// refusal means (RESOURCE_EXHAUSTED for a spent quota) with the proxy's
// message, rather than a transport error for an HTTP status it does not
// expect. Governor-Denied and the retry headers stay.

// gRPC status codes (google.golang.org/grpc/codes), the few the proxy
// answers with.
const (
	grpcInvalidArgument   = 3
	grpcDeadlineExceeded  = 4
	grpcPermissionDenied  = 7
	grpcResourceExhausted = 8
	grpcUnimplemented     = 12
	grpcInternal          = 13
	grpcUnavailable       = 14
	grpcUnauthenticated   = 16
)

// isGRPC reports whether r is a gRPC call.
func isGRPC(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// grpcCode is the gRPC status a local response's HTTP status stands for.
func grpcCode(status int) int {
	switch status {
	case http.StatusTooManyRequests:
		return grpcResourceExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusMisdirectedRequest:
		return grpcUnavailable
	case http.StatusGatewayTimeout:
		return grpcDeadlineExceeded
	case http.StatusForbidden:
		return grpcPermissionDenied
	case http.StatusBadRequest:
		return grpcInvalidArgument
	case http.StatusProxyAuthRequired:
		return grpcUnauthenticated
	case http.StatusMethodNotAllowed:
		return grpcUnimplemented
	}
	return grpcInternal
}

// grpcDenial turns a local response to a gRPC call into a trailers-only
// gRPC response carrying the same refusal.
func grpcDenial(resp *http.Response) *http.Response {
	msg := http.StatusText(resp.StatusCode)
	if resp.Body != nil {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var b struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &b) == nil && b.Error.Message != "" {
			msg = b.Error.Message
		} else if s := strings.TrimSpace(string(raw)); s != "" {
			msg = s
		}
	}
	h := http.Header{"Content-Type": {"application/grpc"}, "Grpc-Status": {strconv.Itoa(grpcCode(resp.StatusCode))},
		"Grpc-Message": {grpcEncode(msg)}}
	for _, k := range []string{HeaderDenied, "X-Should-Retry", "Retry-After", HeaderWarning} {
		if v := resp.Header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	resp.StatusCode, resp.Status = http.StatusOK, "200 OK"
	resp.Header = h
	resp.Body, resp.ContentLength = http.NoBody, 0
	return resp
}

// grpcEncode is grpc-message's percent-encoding: bytes outside printable
// ASCII, and '%', are escaped.
func grpcEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < ' ' || c > '~' || c == '%' {
			b.WriteString("%" + strings.ToUpper(strconv.FormatUint(uint64(c)|0x100, 16)[1:]))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
