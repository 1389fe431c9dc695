package ops_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/ops"
)

// Sentences of docs/http.md that had no test.

// TestStalledReaderCut: docs/http.md's bounds say each write of an answer
// gets BodyTimeout (30 s by default) with no byte taken, then the
// connection is cut: a client that stops reading a large GET gets a
// truncated body, never holds the server's goroutine for good.
func TestStalledReaderCut(t *testing.T) {
	e := newEnv(t, envOptions{})
	const timeout = 200 * time.Millisecond
	_, url := serveBounded(t, e, ops.Config{BodyTimeout: timeout})
	// Larger than what loopback's socket buffers hold, so that the
	// server's writes block while the client reads nothing.
	content := make([]byte, 48<<20)
	for i := range content {
		content[i] = byte(i * 7)
	}
	d, _ := e.put(t, "builds", content)

	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /v1/blobs/%s?namespace=builds HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", d, aliceTok)
	br := bufio.NewReaderSize(c, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET: %v %v", resp, err)
	}
	// The stall: fifteen timeouts without reading a byte.
	time.Sleep(15 * timeout)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := io.Copy(io.Discard, resp.Body)
	if n >= int64(len(content)) {
		t.Fatalf("a client that read nothing for %s still got the whole %d bytes (%v): the server never cut it", 15*timeout, n, err)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection was not cut: the client's own read deadline passed after %d bytes", n)
	}
}
