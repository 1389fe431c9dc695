package ops

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/alkblobfs/alkblobfs/store"
)

// TestPutResponseJSON: the put's hand-built answer is byte for byte what
// json.Encoder writes for the same PutResponse, for tokens as mint makes
// them.
func TestPutResponseJSON(t *testing.T) {
	tk := newTokens(DefaultTokenTTL, store.RealClock, 1)
	for _, tok := range []string{tk.newID(), tk.newID(), "", "a-b_c"} {
		hex := "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
		var want bytes.Buffer
		json.NewEncoder(&want).Encode(PutResponse{Token: tok, Digest: hex})
		if got := appendPutResponse(nil, tok, hex); string(got) != want.String() {
			t.Errorf("token %q: got %q, want %q", tok, got, want.String())
		}
	}
}

// TestQueryValue: queryValue agrees with URL.Query().Get.
func TestQueryValue(t *testing.T) {
	for _, q := range []string{
		"", "namespace=a", "x=1&namespace=b", "namespace=a&namespace=b", "namespace", "namespace=",
		"namespacex=a", "xnamespace=a&namespace=c", "namespace=a%2Eb", "name%73pace=d", "namespace=a+b",
		"a=1;namespace=e", "namespace=f;g", "&&namespace=h&", "namespace==i",
	} {
		r := &http.Request{URL: &url.URL{RawQuery: q}}
		if got, want := queryValue(r, "namespace"), r.URL.Query().Get("namespace"); got != want {
			t.Errorf("query %q: got %q, want %q", q, got, want)
		}
	}
}
