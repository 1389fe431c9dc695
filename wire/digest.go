package wire

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
)

// DigestField is d as an RFC 9530 digest field value: sha-256=:BASE64:.
// The server sends it as Repr-Digest and Content-Digest; a client sends it
// as Content-Digest to claim a put's digest.
func DigestField(d blob.Digest) string {
	return "sha-256=:" + base64.StdEncoding.EncodeToString(d[:]) + ":"
}

// DigestMembers returns every sha-256 member of a digest field, in order:
// RFC 9530's sha-256=:BASE64: (Content-Digest, Repr-Digest) or RFC 3230's
// SHA-256=BASE64 (Digest). A field sent as several lines is one value, the
// lines joined with commas (strings.Join(h.Values(name), ",")). Other
// algorithms are skipped, as RFC 9530 lets a recipient do with those it
// does not know: a field with no sha-256 member gives none. A malformed
// sha-256 member is an error.
func DigestMembers(v string) ([]blob.Digest, error) {
	var ds []blob.Digest
	for item := range strings.SplitSeq(v, ",") {
		alg, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || !strings.EqualFold(alg, "sha-256") {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(strings.Trim(val, ":"))
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("sha-256 wants the 32-byte digest in base64 (sha-256=:…:), got %q", val)
		}
		ds = append(ds, blob.Digest(b))
	}
	return ds, nil
}

// ParseDigestField is the sha-256 digest a field states (see
// DigestMembers): found is false if it has no sha-256 member, and sha-256
// members that disagree are an error, since taking either would be a
// guess.
func ParseDigestField(v string) (d blob.Digest, found bool, err error) {
	ds, err := DigestMembers(v)
	if err != nil || len(ds) == 0 {
		return blob.Digest{}, false, err
	}
	for _, o := range ds[1:] {
		if o != ds[0] {
			return blob.Digest{}, false, fmt.Errorf("sha-256 members disagree: %s and %s", ds[0], o)
		}
	}
	return ds[0], true, nil
}
