// Package client talks to an alkblobfs HTTP surface (alkblobfs serve, or
// mount --listen): put with pin tokens, have and renewal, verified reads.
//
// Every read is checked: Get hashes the blob as it streams and fails at
// EOF unless it hashes to its digest; GetRange checks the slice against the
// digest the server sent for it. Errors from the server keep its message
// and match the blob sentinels with errors.Is (a 404 is blob.ErrMissing, a
// 422 blob.ErrVerification, a 413 blob.ErrTooLarge: wire.Sentinel). The
// bodies and the digest fields are package wire's, which the server uses
// too.
package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/wire"
)

// Digest is a blob's sha256.
type Digest = blob.Digest

// MaxHave is the most digests the server answers in one have; Have splits
// longer lists.
const MaxHave = wire.MaxHave

// Client is a connection to one server. It is safe for concurrent use.
type Client struct {
	base  *url.URL
	hc    *http.Client
	token string
}

// New returns a client of the server at baseURL: http://HOST:PORT, or
// unix:PATH for the server's Unix socket (where the server knows the
// caller by its uid and needs no token). authToken, if not empty, is sent
// as a bearer token.
func New(baseURL, authToken string) (*Client, error) {
	if path, ok := strings.CutPrefix(baseURL, "unix:"); ok {
		if path == "" {
			return nil, fmt.Errorf("remote URL %q: want unix:PATH, the server's socket", baseURL)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.ResponseHeaderTimeout = 5 * time.Minute
		tr.Proxy = nil
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		return &Client{base: &url.URL{Scheme: "http", Host: "alkblobfs"}, hc: &http.Client{Transport: tr}, token: authToken}, nil
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("remote URL %q: %w", baseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("remote URL %q: want http://HOST:PORT, https://HOST:PORT or unix:PATH", baseURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("remote URL %q: no credentials in the URL; use an auth token file", u.Redacted())
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	// No overall timeout (a blob may take long to stream); a server that
	// does not answer at all is given up on.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 5 * time.Minute
	return &Client{base: u, hc: &http.Client{Transport: tr}, token: authToken}, nil
}

// Error is an error answer of the server.
type Error struct {
	Status int
	Code   string // wire.Code*; empty from a server older than codes
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("server: %s (%d)", e.Msg, e.Status) }

// Is maps statuses and codes to the sentinels (wire.SentinelOf): a 403
// for permission matches fs.ErrPermission.
func (e *Error) Is(target error) bool {
	s := wire.SentinelOf(e.Status, e.Code)
	return s != nil && (target == s || errors.Is(s, target))
}

func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	return u.String()
}

func (c *Client) do(req *http.Request) (*http.Response, error) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		var e wire.ErrorResponse
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
			if e.Error == "" {
				e.Error = resp.Status
			}
		}
		return nil, &Error{Status: resp.StatusCode, Code: e.Code, Msg: e.Error}
	}
	return resp, nil
}

func (c *Client) postJSON(ctx context.Context, path string, in, out any) error {
	return c.doJSON(ctx, http.MethodPost, path, in, out)
}

// Put stores the content of r in namespace ns and returns its digest and
// the token of the pin that holds it. size is the content length, or -1
// if unknown (then the body is sent chunked). want, if not nil, is the
// digest the content must hash to: on mismatch nothing is stored and the
// error matches blob.ErrVerification.
func (c *Client) Put(ctx context.Context, ns string, r io.Reader, size int64, want *Digest) (Digest, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/blobs", url.Values{"namespace": {ns}}), r)
	if err != nil {
		return Digest{}, "", err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if want != nil {
		req.Header.Set("Content-Digest", wire.DigestField(*want))
	}
	resp, err := c.do(req)
	if err != nil {
		return Digest{}, "", err
	}
	defer resp.Body.Close()
	var out wire.PutResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return Digest{}, "", fmt.Errorf("put: the server's answer: %w", err)
	}
	d, err := blob.Parse(out.Digest)
	if err != nil {
		return Digest{}, "", fmt.Errorf("put: the server answered digest %q: %w", out.Digest, err)
	}
	return d, out.Token, nil
}

// Have reports which of ds namespace ns holds, in the order of ds.
func (c *Client) Have(ctx context.Context, ns string, ds []Digest) ([]bool, error) {
	present := make([]bool, 0, len(ds))
	for len(ds) > 0 {
		n := min(len(ds), MaxHave)
		req := wire.HaveRequest{Namespace: ns, Digests: make([]string, n)}
		for i, d := range ds[:n] {
			req.Digests[i] = d.String()
		}
		var out wire.HaveResponse
		if err := c.postJSON(ctx, "/v1/blobs/have", req, &out); err != nil {
			return nil, err
		}
		if len(out.Present) != n {
			return nil, fmt.Errorf("have: the server answered %d verdicts for %d digests", len(out.Present), n)
		}
		present = append(present, out.Present...)
		ds = ds[n:]
	}
	return present, nil
}

// Renew renews the pin token names on d, and reports whether it was still
// live. false means the pin lapsed: put the content again.
func (c *Client) Renew(ctx context.Context, ns, token string, d Digest) (bool, error) {
	var out wire.HaveResponse
	err := c.postJSON(ctx, "/v1/blobs/have", wire.HaveRequest{Namespace: ns, Digests: []string{d.String()}, Token: token}, &out)
	if err != nil {
		return false, err
	}
	if len(out.Present) != 1 {
		return false, fmt.Errorf("renew: the server answered %d verdicts for 1 digest", len(out.Present))
	}
	return out.Present[0], nil
}

// Release releases the pin token names. An unknown or lapsed token
// matches blob.ErrMissing.
func (c *Client) Release(ctx context.Context, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.url("/v1/pins/"+url.PathEscape(token), nil), nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Get opens blob d for reading; ns, if not empty, must hold it. The
// returned reader verifies: at EOF it returns an error matching
// blob.ErrVerification instead of io.EOF if the content does not hash to
// d. size is the blob's length.
func (c *Client) Get(ctx context.Context, d Digest, ns string) (rc io.ReadCloser, size int64, err error) {
	resp, err := c.get(ctx, d, ns, "")
	if err != nil {
		return nil, 0, err
	}
	return &verifying{body: resp.Body, h: sha256.New(), want: d, left: resp.ContentLength}, resp.ContentLength, nil
}

// GetRange reads n bytes of d from off (fewer at the end of the blob),
// each slice the server sends checked against the digest it sent with it.
// A server answers at most 64 MiB per request: longer ranges take several.
func (c *Client) GetRange(ctx context.Context, d Digest, off, n int64) ([]byte, error) {
	if off < 0 || n <= 0 {
		return nil, fmt.Errorf("range %d+%d: want off >= 0 and n > 0", off, n)
	}
	var out []byte
	for n > 0 {
		b, size, err := c.getSlice(ctx, d, off, n)
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		off += int64(len(b))
		n -= int64(len(b))
		if off >= size {
			break
		}
	}
	return out, nil
}

// getSlice asks for bytes [off, off+n) of d and returns what the server
// sent (a prefix of them), checked, and the blob's size.
func (c *Client) getSlice(ctx context.Context, d Digest, off, n int64) ([]byte, int64, error) {
	resp, err := c.get(ctx, d, "", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent {
		return nil, 0, fmt.Errorf("range %d+%d of %s: the server answered %s, not 206", off, n, d, resp.Status)
	}
	var first, last, size int64
	if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes %d-%d/%d", &first, &last, &size); err != nil || first != off || last < first || last >= off+n {
		return nil, 0, fmt.Errorf("range %d+%d of %s: the server sent Content-Range %q", off, n, d, resp.Header.Get("Content-Range"))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, last-first+1))
	if err != nil {
		return nil, 0, err
	}
	field := strings.Join(resp.Header.Values("Repr-Digest"), ",")
	want, ok, err := wire.ParseDigestField(field)
	if err != nil || !ok {
		return nil, 0, fmt.Errorf("range %d+%d of %s: the server sent no usable Repr-Digest (%q)", off, n, d, field)
	}
	if int64(len(b)) != last-first+1 || sha256.Sum256(b) != want {
		return nil, 0, fmt.Errorf("range %d+%d of %s: %w", off, n, d, blob.ErrVerification)
	}
	return b, size, nil
}

func (c *Client) get(ctx context.Context, d Digest, ns, rng string) (*http.Response, error) {
	q := url.Values{}
	if ns != "" {
		q.Set("namespace", ns)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/v1/blobs/"+d.String(), q), nil)
	if err != nil {
		return nil, err
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	return c.do(req)
}

// verifying hashes a blob's body as it is read.
type verifying struct {
	body io.ReadCloser
	h    hash.Hash
	want Digest
	left int64
}

func (v *verifying) Read(p []byte) (int, error) {
	n, err := v.body.Read(p)
	v.h.Write(p[:n])
	v.left -= int64(n)
	if err == io.EOF {
		if v.left > 0 {
			return n, fmt.Errorf("%s: the body ended %d bytes early: %w", v.want, v.left, io.ErrUnexpectedEOF)
		}
		if Digest(v.h.Sum(nil)) != v.want {
			return n, fmt.Errorf("%s: %w", v.want, blob.ErrVerification)
		}
	}
	return n, err
}

func (v *verifying) Close() error { return v.body.Close() }

// Usage is what namespace ns links and its quota (GET
// /v1/namespaces/NS/usage): for a caller who may search it.
func (c *Client) Usage(ctx context.Context, ns string) (wire.Usage, error) {
	var out wire.Usage
	err := c.doJSON(ctx, http.MethodGet, "/v1/namespaces/"+url.PathEscape(ns)+"/usage", nil, &out)
	return out, err
}

// SetQuota sets namespace ns's limits, 0 for none, and returns its usage
// under them (PUT /v1/namespaces/NS/quota): root and the server's own
// user only; anyone else's call matches fs.ErrPermission.
func (c *Client) SetQuota(ctx context.Context, ns string, bytes, blobs int64) (wire.Usage, error) {
	var out wire.Usage
	err := c.doJSON(ctx, http.MethodPut, "/v1/namespaces/"+url.PathEscape(ns)+"/quota", wire.Quota{Bytes: bytes, Blobs: blobs}, &out)
	return out, err
}

// doJSON sends in (nil: no body) and decodes the answer into out.
func (c *Client) doJSON(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, nil), body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: the server's answer: %w", method, path, err)
	}
	return nil
}
