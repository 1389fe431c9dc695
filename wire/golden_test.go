package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"reflect"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
)

// The bytes each body encodes to, as servers and clients in the field
// send them. A change here breaks one side talking to an older other: the
// server refuses unknown fields in a HaveRequest, and a client reads the
// fields by these names. Change a golden string only with a new route
// version.
var golden = []struct {
	name string
	v    any // a pointer to the value
	json string
}{
	{"put", &PutResponse{Token: "mW3tok", Digest: emptyHex},
		`{"token":"mW3tok","digest":"` + emptyHex + `"}`},
	{"put-empty", &PutResponse{},
		`{"token":"","digest":""}`},
	{"have", &HaveRequest{Namespace: "builds", Digests: []string{emptyHex, "9b1c"}},
		`{"namespace":"builds","digests":["` + emptyHex + `","9b1c"]}`},
	{"have-renew", &HaveRequest{Namespace: "builds", Digests: []string{emptyHex}, Token: "mW3tok"},
		`{"namespace":"builds","digests":["` + emptyHex + `"],"token":"mW3tok"}`},
	{"have-answer", &HaveResponse{Present: []bool{true, false}},
		`{"present":[true,false]}`},
	{"error", &ErrorResponse{Error: "no such blob"},
		`{"error":"no such blob"}`},
	{"error-code", &ErrorResponse{Error: "no such blob", Code: CodeNotFound},
		`{"error":"no such blob","code":"not_found"}`},
	{"quota", &Quota{Bytes: 10 << 30, Blobs: 1000000},
		`{"bytes":10737418240,"blobs":1000000}`},
	{"usage", &Usage{Namespace: "builds", Blobs: 3, Bytes: 300, Unique: &Unique{Blobs: 1, Bytes: 100}, Quota: Quota{Bytes: 1000}},
		`{"namespace":"builds","blobs":3,"bytes":300,"unique":{"blobs":1,"bytes":100},"quota":{"bytes":1000,"blobs":0}}`},
	// The answer to a quota change: the counters, without the unique
	// figures, which only GET .../usage computes.
	{"usage-counters", &Usage{Namespace: "builds", Blobs: 3, Bytes: 300, Quota: Quota{Blobs: 5}},
		`{"namespace":"builds","blobs":3,"bytes":300,"quota":{"bytes":0,"blobs":5}}`},
}

const emptyHex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

func TestGoldenJSON(t *testing.T) {
	for _, g := range golden {
		t.Run(g.name, func(t *testing.T) {
			got, err := json.Marshal(g.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != g.json {
				t.Errorf("encodes to\n %s\nwant (golden)\n %s", got, g.json)
			}
			// And the golden bytes decode, strictly (as the server decodes
			// a have), to the same value.
			back := reflect.New(reflect.TypeOf(g.v).Elem()).Interface()
			dec := json.NewDecoder(bytes.NewReader([]byte(g.json)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(back); err != nil {
				t.Fatalf("golden %s does not decode: %v", g.json, err)
			}
			if !reflect.DeepEqual(back, g.v) {
				t.Errorf("golden decodes to %+v, want %+v", back, g.v)
			}
		})
	}
}

func TestDigestFieldGolden(t *testing.T) {
	d := blob.Digest(sha256.Sum256(nil))
	const want = "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"
	if got := DigestField(d); got != want {
		t.Fatalf("DigestField(sha256 of nothing) = %q, want %q", got, want)
	}
	got, ok, err := ParseDigestField(want)
	if err != nil || !ok || got != d {
		t.Fatalf("ParseDigestField(%q) = %s, %v, %v; want %s", want, got, ok, err, d)
	}
}

func TestDigestMembers(t *testing.T) {
	a := blob.Digest(sha256.Sum256([]byte("a")))
	b := blob.Digest(sha256.Sum256([]byte("b")))
	fa, fb := DigestField(a), DigestField(b)
	rfc3230 := "SHA-256=" + base64.StdEncoding.EncodeToString(a[:])
	for _, tc := range []struct {
		name, field string
		want        []blob.Digest
		bad         bool
	}{
		{"none", "", nil, false},
		{"rfc9530", fa, []blob.Digest{a}, false},
		{"rfc3230", rfc3230, []blob.Digest{a}, false},
		{"other algorithms skipped", "sha-512=:AAAA:, " + fa + ", md5=xyz", []blob.Digest{a}, false},
		{"only others", "sha-512=:AAAA:", nil, false},
		{"several, in order", fa + "," + fb, []blob.Digest{a, b}, false},
		{"malformed base64", "sha-256=:!!!:", nil, true},
		{"short digest", "sha-256=:AAAA:", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DigestMembers(tc.field)
			if (err != nil) != tc.bad {
				t.Fatalf("DigestMembers(%q) error %v, want error: %v", tc.field, err, tc.bad)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("DigestMembers(%q) = %v, want %v", tc.field, got, tc.want)
			}
		})
	}
	if _, _, err := ParseDigestField(fa + "," + fb); err == nil {
		t.Error("ParseDigestField of two disagreeing members: no error")
	}
	if _, ok, err := ParseDigestField(fa + "," + rfc3230); err != nil || !ok {
		t.Errorf("ParseDigestField of two agreeing members: %v, %v", ok, err)
	}
}

// TestSentinel holds the package doc's status table.
func TestSentinel(t *testing.T) {
	for status, want := range map[int]error{
		http.StatusBadRequest:                   nil,
		http.StatusUnauthorized:                 nil,
		http.StatusForbidden:                    blob.ErrReadOnly,
		http.StatusNotFound:                     blob.ErrMissing,
		http.StatusConflict:                     blob.ErrGcRefuse,
		http.StatusRequestEntityTooLarge:        blob.ErrTooLarge,
		http.StatusRequestedRangeNotSatisfiable: nil,
		http.StatusUnprocessableEntity:          blob.ErrVerification,
		http.StatusServiceUnavailable:           nil,
		http.StatusInsufficientStorage:          blob.ErrNoSpace,
	} {
		if got := Sentinel(status); !errors.Is(got, want) || (want == nil) != (got == nil) {
			t.Errorf("Sentinel(%d) = %v, want %v", status, got, want)
		}
	}
}

// TestSentinelOf: a 403 is a permission refusal unless its code says the
// server is read-only (an older server sends no code: read-only, as
// Sentinel says); a 429 is too many tokens; a 507 is a full namespace
// when its code says quota, else a full store.
func TestSentinelOf(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		want   error
	}{
		{http.StatusForbidden, CodeForbidden, ErrDenied},
		{http.StatusForbidden, CodeReadOnly, blob.ErrReadOnly},
		{http.StatusForbidden, "", blob.ErrReadOnly},
		{http.StatusTooManyRequests, CodeTooMany, ErrTooMany},
		{http.StatusNotFound, CodeNotFound, blob.ErrMissing},
		{http.StatusInsufficientStorage, CodeNoSpace, blob.ErrNoSpace},
		{http.StatusInsufficientStorage, CodeQuota, blob.ErrQuota},
		{http.StatusInsufficientStorage, "", blob.ErrNoSpace},
	} {
		if got := SentinelOf(tc.status, tc.code); got != tc.want {
			t.Errorf("SentinelOf(%d, %q) = %v, want %v", tc.status, tc.code, got, tc.want)
		}
	}
	if !errors.Is(ErrDenied, fs.ErrPermission) {
		t.Error("ErrDenied does not match fs.ErrPermission")
	}
}
