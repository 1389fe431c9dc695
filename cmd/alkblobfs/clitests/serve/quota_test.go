//go:build linux

package serve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/client"
	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	_ "modernc.org/sqlite" // the "sqlite" driver, to age a store as an older version left it
)

// The quota rule through every surface side by side, like the access
// matrix: each surface puts into namespaces of its own, under, at and over
// a byte limit and a blob limit, and dedups into a limited namespace; a
// refused put links nothing, and unlinking frees at once. Then every
// surface must show the same usage.

// quotaFixture is one store with two mounts and a serve process on it.
type quotaFixture struct {
	c          *clitest.CLI
	mntA, mntB string
	url        string
	toks       map[string]string // by who: root, other (uid 4242), bound (root, namespaces=shared)
	hc         *client.Client    // root's
	src        string            // where source files are written
	seq        atomic.Int64      // numbers the names written on the mounts
}

// name is a name for a file in incoming/ that no earlier put used: a
// name whose close failed goes only at the kernel's RELEASE after it.
func (f *quotaFixture) name(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, f.seq.Add(1))
}

func newQuotaFixture(t *testing.T) *quotaFixture {
	clitest.RequireFUSE(t)
	f := &quotaFixture{c: clitest.NewCLI(t), mntA: t.TempDir(), mntB: t.TempDir(), src: t.TempDir(), toks: map[string]string{}}
	clitest.StartDaemon(t, f.c.Data, f.mntA)
	clitest.StartDaemon(t, f.c.Data, f.mntB)
	var lines strings.Builder
	for _, tk := range []struct{ who, line string }{
		{"root", "0"}, {"other", "4242"}, {"bound", "0 namespaces=shared"},
	} {
		f.toks[tk.who] = fmt.Sprintf("%x", sha256.Sum256([]byte(tk.who+f.mntA)))[:32]
		fmt.Fprintf(&lines, "%s %s\n", f.toks[tk.who], tk.line)
	}
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	f.url = clitest.StartServe(t, f.c, "--listen", "127.0.0.1:0", "--auth-token-file", file, "--perm-cache", "-1s").URL
	hc, err := client.New(f.url, f.toks["root"])
	if err != nil {
		t.Fatal(err)
	}
	f.hc = hc
	return f
}

// file writes content to a source file of its own and returns its path:
// a new one per call, since surfaces in parallel put the same content.
func (f *quotaFixture) file(t *testing.T, content []byte) string {
	t.Helper()
	p := filepath.Join(f.src, f.name(clitest.Sum(content)[:16]))
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// quotaSurface puts content into namespace ns one way; it returns
// whether the put succeeded and what the user saw.
type quotaSurface struct {
	name string
	put  func(t *testing.T, f *quotaFixture, ns string, content []byte) (ok bool, out string)
	// refusal is what a refusal for quota shows the user.
	refusal string
}

// shell runs a command and returns whether it exited 0 and its output.
func shell(t *testing.T, name string, args ...string) (bool, string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%s: %v", name, err)
	}
	return err == nil, string(out)
}

const edquotText = "Disk quota exceeded"

var quotaSurfaces = []quotaSurface{
	{"cp", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		return shell(t, "cp", f.file(t, b), filepath.Join(f.mntA, ns, "incoming", f.name("cp")))
	}, edquotText},
	{"dd", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		return shell(t, "dd", "if="+f.file(t, b), "of="+filepath.Join(f.mntA, ns, "incoming", f.name("dd")), "bs=64k", "status=none")
	}, edquotText},
	{"rsync", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		return shell(t, "rsync", f.file(t, b), filepath.Join(f.mntA, ns, "incoming")+"/")
	}, edquotText},
	{"python", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		// The errno as a program sees it from close(2).
		const script = `
import errno, sys
f = open(sys.argv[1], "wb")
f.write(open(sys.argv[2], "rb").read())
try:
    f.close()
except OSError as e:
    print(errno.errorcode[e.errno], e.strerror)
    sys.exit(1)
`
		return shell(t, "python3", "-c", script, filepath.Join(f.mntA, ns, "incoming", f.name("py")), f.file(t, b))
	}, "EDQUOT " + edquotText},
	{"second mount", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		return shell(t, "cp", f.file(t, b), filepath.Join(f.mntB, ns, "incoming", f.name("cp")))
	}, edquotText},
	{"put --ns", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		r := f.c.Run(nil, "put", "--ns", ns, f.file(t, b))
		return r.Code == 0, r.Stderr
	}, "is at its quota"},
	{"link", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		d := strings.TrimSpace(f.c.OK("put", f.file(t, b)))
		r := f.c.Run(nil, "link", ns, d)
		return r.Code == 0, r.Stderr
	}, "is at its quota"},
	{"http", func(t *testing.T, f *quotaFixture, ns string, b []byte) (bool, string) {
		d, tok, err := f.hc.Put(t.Context(), ns, bytes.NewReader(b), int64(len(b)), nil)
		if err == nil {
			if err := f.hc.Release(t.Context(), tok); err != nil {
				t.Errorf("release %s: %v", d, err)
			}
			return true, ""
		}
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusInsufficientStorage || ce.Code != "quota" || !errors.Is(err, blob.ErrQuota) {
			return false, fmt.Sprintf("not a 507 quota answer: %v", err)
		}
		return false, "507 " + err.Error()
	}, "507 server: namespace"},
}

// content is n bytes, unique to key (but for a few bytes: the hex digits
// of key's sha256, repeated).
func content(key string, n int) []byte {
	h := fmt.Sprintf("%x", sha256.Sum256([]byte(key)))
	return bytes.Repeat([]byte(h), n/len(h)+1)[:n]
}

// usageRow is one namespace's figures as ns usage prints them.
type usageRow struct {
	blobs, bytes, unique   int64
	quotaBytes, quotaBlobs string
}

// cliUsage parses ns usage's table.
func cliUsage(t *testing.T, c *clitest.CLI, names ...string) map[string]usageRow {
	t.Helper()
	out := clitest.Lines(c.OK(append([]string{"ns", "usage"}, names...)...))
	if len(out) == 0 || !strings.HasPrefix(out[0], "NAMESPACE") {
		t.Fatalf("ns usage: no header: %q", out)
	}
	rows := map[string]usageRow{}
	for _, l := range out[1:] {
		f := strings.Fields(l)
		if len(f) != 6 {
			t.Fatalf("ns usage: row %q", l)
		}
		var r usageRow
		for i, p := range []*int64{&r.blobs, &r.bytes, &r.unique} {
			n, err := strconv.ParseInt(f[i+1], 10, 64)
			if err != nil {
				t.Fatalf("ns usage: row %q: %v", l, err)
			}
			*p = n
		}
		r.quotaBytes, r.quotaBlobs = f[4], f[5]
		rows[f[0]] = r
	}
	return rows
}

// TestQuotaEverySurface: the table of surfaces × cases, each in
// namespaces of its own on one store, the surfaces in parallel.
func TestQuotaEverySurface(t *testing.T) {
	t.Parallel()
	f := newQuotaFixture(t)
	// What the dedup cases put: already in the store, linked by "shared".
	x, z := content("shared x", 60), content("shared z", 50)
	f.c.OK("ns", "create", "shared")
	f.c.OK("put", "--ns", "shared", f.file(t, x), f.file(t, z))

	type step struct {
		item string
		b    []byte
		ok   bool
	}
	cases := []struct {
		name  string
		quota []string
		limit string // how a refusal states the limit
		steps func(key string) []step
		// after the steps: the blobs the namespace lists, its bytes
		want func(key string) ([][]byte, int64)
	}{
		{"bytes", []string{"--bytes", "100"}, "of 100 bytes", func(k string) []step {
			return []step{
				{"under", content(k+" a", 60), true},
				{"at", content(k+" b", 40), true},
				{"over", content(k+" c", 1), false},
			}
		}, func(k string) ([][]byte, int64) { return [][]byte{content(k+" a", 60), content(k+" b", 40)}, 100 }},
		{"blobs", []string{"--blobs", "2"}, "of 2 blobs", func(k string) []step {
			return []step{
				{"under", content(k+" a", 10), true},
				{"at", content(k+" b", 10), true},
				{"over", content(k+" c", 10), false},
			}
		}, func(k string) ([][]byte, int64) { return [][]byte{content(k+" a", 10), content(k+" b", 10)}, 20 }},
		// A dedup counts like any other link; one the namespace already
		// links costs nothing.
		{"dedup", []string{"--bytes", "100"}, "of 100 bytes", func(k string) []step {
			return []step{
				{"dedup under", x, true},
				{"dedup of its own", x, true},
				{"dedup over", z, false},
			}
		}, func(k string) ([][]byte, int64) { return [][]byte{x}, 60 }},
	}

	t.Run("surfaces", func(t *testing.T) {
		for _, s := range quotaSurfaces {
			t.Run(s.name, func(t *testing.T) {
				t.Parallel()
				for _, tc := range cases {
					ns := strings.ReplaceAll(s.name, " ", "-") + "-" + tc.name
					f.c.OK("ns", "create", ns)
					f.c.OK(append([]string{"ns", "quota", ns}, tc.quota...)...)
					for _, st := range tc.steps(ns) {
						ok, out := s.put(t, f, ns, st.b)
						switch {
						case ok != st.ok:
							t.Errorf("%s, %s %s: succeeded %v, want %v: %s", s.name, tc.name, st.item, ok, st.ok, out)
						case !ok && !strings.Contains(out, s.refusal):
							t.Errorf("%s, %s %s: refused with %q, want it to say %q", s.name, tc.name, st.item, out, s.refusal)
						case !ok && !strings.Contains(s.refusal, edquotText) && !(strings.Contains(out, ns) && strings.Contains(out, tc.limit)):
							t.Errorf("%s, %s %s: the refusal %q does not name the namespace and its limit (%q)", s.name, tc.name, st.item, out, tc.limit)
						}
					}
					blobs, bytesWant := tc.want(ns)
					var want []string
					for _, b := range blobs {
						want = append(want, clitest.Sum(b))
					}
					slices.Sort(want)
					if got := clitest.Lines(f.c.OK("ls", ns)); !slices.Equal(got, want) {
						t.Errorf("%s, %s: the namespace lists %q, want %q (nothing of a refused put)", s.name, tc.name, got, want)
					}
					u := cliUsage(t, f.c, ns)[ns]
					if u.blobs != int64(len(want)) || u.bytes != bytesWant {
						t.Errorf("%s, %s: ns usage says %d blobs, %d bytes; want %d, %d", s.name, tc.name, u.blobs, u.bytes, len(want), bytesWant)
					}
				}
				// Unlinking frees at once: through the mount, the blob
				// that took the bytes case to its limit; then what was
				// refused fits.
				ns := strings.ReplaceAll(s.name, " ", "-") + "-bytes"
				if err := os.Remove(filepath.Join(f.mntA, ns, clitest.Sum(content(ns+" b", 40)))); err != nil {
					t.Fatalf("rm through the mount: %v", err)
				}
				if ok, out := s.put(t, f, ns, content(ns+" c", 1)); !ok {
					t.Errorf("%s: after an unlink, the put refused before still fails: %s", s.name, out)
				}
			})
		}
	})
	quotaSameEverywhere(t, f)
}

// quotaSameEverywhere checks that every namespace's usage is the same
// through ns usage, HTTP, /metrics, and statfs on both mounts.
func quotaSameEverywhere(t *testing.T, f *quotaFixture) {
	t.Helper()
	rows := cliUsage(t, f.c)
	var fams map[string]*dto.MetricFamily
	series := func(name, ns string) (float64, bool) {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "namespace" && l.GetValue() == ns {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	limit := func(s string) int64 {
		if s == "-" {
			return 0
		}
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	// The server counts the namespaces' usage in the background, from
	// the first scrape on: the count after these changes.
	clitest.Eventually(t, 20*time.Second, "every namespace in /metrics", func() bool {
		fams = scrapeMetricsAs(t, f.url, f.toks["root"])
		for ns := range rows {
			if _, ok := series("alkblobfs_namespace_bytes", ns); !ok {
				return false
			}
		}
		return true
	})
	for ns, r := range rows {
		u, err := f.hc.Usage(t.Context(), ns)
		if err != nil {
			t.Fatalf("HTTP usage of %s: %v", ns, err)
		}
		if u.Blobs != r.blobs || u.Bytes != r.bytes || u.Unique == nil || u.Unique.Bytes != r.unique || u.Quota.Bytes != limit(r.quotaBytes) || u.Quota.Blobs != limit(r.quotaBlobs) {
			t.Errorf("%s: HTTP says %+v, ns usage %+v", ns, u, r)
		}
		for _, m := range []struct {
			name string
			want int64
		}{
			{"alkblobfs_namespace_blobs", r.blobs},
			{"alkblobfs_namespace_bytes", r.bytes},
			{"alkblobfs_namespace_quota_bytes", limit(r.quotaBytes)},
			{"alkblobfs_namespace_quota_blobs", limit(r.quotaBlobs)},
		} {
			v, ok := series(m.name, ns)
			switch {
			case m.want == 0 && strings.Contains(m.name, "quota") && ok:
				t.Errorf("%s: /metrics has %s for a namespace without that limit", ns, m.name)
			case (m.want != 0 || !strings.Contains(m.name, "quota")) && (!ok || int64(v) != m.want):
				t.Errorf("%s: /metrics %s = %v (present %v), ns usage %d", ns, m.name, v, ok, m.want)
			}
		}
		for _, mnt := range []string{f.mntA, f.mntB} {
			var st syscall.Statfs_t
			if err := syscall.Statfs(filepath.Join(mnt, ns), &st); err != nil {
				t.Fatalf("statfs %s: %v", ns, err)
			}
			bs := uint64(st.Frsize)
			if q := limit(r.quotaBytes); q > 0 {
				if st.Blocks != (uint64(q)+bs-1)/bs || st.Blocks-st.Bfree != (uint64(r.bytes)+bs-1)/bs {
					t.Errorf("%s: statfs on %s: %d blocks, %d free of %d bytes; ns usage %d of %d bytes", ns, mnt, st.Blocks, st.Bfree, bs, r.bytes, q)
				}
			}
			if q := limit(r.quotaBlobs); q > 0 && (st.Files != uint64(q) || st.Files-st.Ffree != uint64(r.blobs)) {
				t.Errorf("%s: statfs on %s: %d files, %d free; ns usage %d of %d blobs", ns, mnt, st.Files, st.Ffree, r.blobs, q)
			}
		}
	}
}

// scrapeMetricsAs is scrapeMetrics with a bearer token.
func scrapeMetricsAs(t *testing.T, url, tok string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return fams
}

// TestQuotaDf: df on a namespace directory (and in its incoming/) shows
// its quota as the size and its usage as the used part, bytes and blobs;
// the mount's root and a namespace without a quota show the store's
// figures.
func TestQuotaDf(t *testing.T) {
	t.Parallel()
	f := newQuotaFixture(t)
	f.c.OK("ns", "create", "q", "free")
	f.c.OK("ns", "quota", "q", "--bytes", "1MiB", "--blobs", "10")
	for i := range 3 {
		if ok, out := shell(t, "cp", f.file(t, content(fmt.Sprint("df ", i), 8192)), filepath.Join(f.mntA, "q", "incoming", fmt.Sprint(i))); !ok {
			t.Fatalf("cp: %s", out)
		}
	}
	df := func(path string, fields string) string {
		t.Helper()
		ok, out := shell(t, "df", "-B1", "--output="+fields, path)
		if !ok {
			t.Fatalf("df %s: %s", path, out)
		}
		l := clitest.Lines(out)
		return strings.Join(strings.Fields(l[len(l)-1]), " ")
	}
	for _, p := range []string{filepath.Join(f.mntA, "q"), filepath.Join(f.mntA, "q", "incoming"), filepath.Join(f.mntB, "q")} {
		if got, want := df(p, "size,used,itotal,iused"), "1048576 24576 10 3"; got != want {
			t.Errorf("df %s = %q, want %q (size, used, inodes, inodes used)", p, got, want)
		}
	}
	// The store's size and inode count (what is used changes as other
	// tests write beside this one).
	root := df(f.mntA, "size,itotal")
	if strings.HasPrefix(root, "1048576 ") {
		t.Errorf("df on the mount's root shows the namespace's quota: %q", root)
	}
	if got := df(filepath.Join(f.mntA, "free"), "size,itotal"); got != root {
		t.Errorf("df on a namespace without a quota = %q, want the store's figures, as on the root: %q", got, root)
	}
	// The quota cleared, the namespace shows the store's figures too.
	f.c.OK("ns", "quota", "q", "--clear")
	if got := df(filepath.Join(f.mntA, "q"), "size,itotal"); got != root {
		t.Errorf("df after ns quota --clear = %q, want the store's %q", got, root)
	}
}

// TestQuotaSetByOwnerOnly: root and the store's owner set quotas; anyone
// else is refused by the CLI (exit 1) and by HTTP (403), and so is a token
// bound to namespaces, whoever it acts as. Nothing changes then.
func TestQuotaSetByOwnerOnly(t *testing.T) {
	t.Parallel()
	f := newQuotaFixture(t)
	f.c.OK("ns", "create", "shared")
	f.c.OK("ns", "quota", "shared", "--bytes", "1000")

	// The CLI as a user who owns neither the store nor anything else:
	// one who cannot look into the data directory, and one who can.
	fusetest.Reachable(t, clitest.Bin)
	for _, mode := range []os.FileMode{0o700, 0o711} {
		if err := os.Chmod(f.c.Data, mode); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "--",
			"env", "HOME=/", clitest.Bin, "--data", f.c.Data, "ns", "quota", "shared", "--bytes", "1GiB").CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "only root and the store's owner set quotas") {
			t.Errorf("ns quota as uid 4242, data directory %04o: %v %q; want exit 1 saying only root and the store's owner set quotas", mode, err, out)
		}
	}
	if err := os.Chmod(f.c.Data, 0o700); err != nil {
		t.Fatal(err)
	}

	for _, who := range []string{"other", "bound"} {
		hc, err := client.New(f.url, f.toks[who])
		if err != nil {
			t.Fatal(err)
		}
		_, err = hc.SetQuota(t.Context(), "shared", 1<<30, 0)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusForbidden || !errors.Is(err, os.ErrPermission) {
			t.Errorf("PUT quota with the %s token: %v, want 403", who, err)
		}
		// The CLI's --remote says so too.
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte(f.toks[who]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		f.c.Fail(1, "only root and the server's own user set quotas", "--remote", f.url, "--auth-token-file", file, "ns", "quota", "shared", "--blobs", "5")
	}
	if u := cliUsage(t, f.c, "shared")["shared"]; u.quotaBytes != "1000" || u.quotaBlobs != "-" {
		t.Errorf("after the refusals the quota is %s bytes, %s blobs; want 1000, -", u.quotaBytes, u.quotaBlobs)
	}

	// Root, over HTTP: set, read back, clear.
	u, err := f.hc.SetQuota(t.Context(), "shared", 2000, 7)
	if err != nil || u.Quota.Bytes != 2000 || u.Quota.Blobs != 7 {
		t.Fatalf("PUT quota as root: %+v, %v", u, err)
	}
	if r := cliUsage(t, f.c, "shared")["shared"]; r.quotaBytes != "2000" || r.quotaBlobs != "7" {
		t.Errorf("ns usage after HTTP's PUT: %+v", r)
	}
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte(f.toks["root"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.c.OK("--remote", f.url, "--auth-token-file", tf, "ns", "quota", "shared", "--clear")
	if got := clitest.Lines(f.c.OK("--remote", f.url, "--auth-token-file", tf, "ns", "usage", "shared")); len(got) != 2 || !slices.Equal(strings.Fields(got[1])[4:], []string{"-", "-"}) {
		t.Errorf("ns usage --remote after --clear: %q; want the row of shared with no limits", got)
	}
	if r := cliUsage(t, f.c, "shared")["shared"]; r.quotaBytes != "-" || r.quotaBlobs != "-" {
		t.Errorf("ns usage after --remote --clear: %+v", r)
	}
	// Mistakes are usage errors, before anything is opened.
	f.c.Fail(2, "give --bytes SIZE, --blobs N or --clear", "ns", "quota", "shared")
	f.c.Fail(2, "--clear removes both limits", "ns", "quota", "shared", "--clear", "--bytes", "1")
	f.c.Fail(2, "unknown unit", "ns", "quota", "shared", "--bytes", "10XB")
	f.c.Fail(2, "want a count of blobs", "ns", "quota", "shared", "--blobs", "-1")
	f.c.Fail(1, "does not exist", "ns", "quota", "absent", "--bytes", "1")
}

// TestQuotaFleet: two fleet mounts and a serve process on one PostgreSQL
// database share a namespace's limit. Writers on all three race for its
// last blobs: no more than the limit are linked, the rest see EDQUOT at
// close (507 over HTTP), and usage is what the namespace lists. An unlink
// on one host frees the quota for the other at once.
func TestQuotaFleet(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	dsn := pgtest.DSN(t)
	flags := []string{"--kv", dsn, "--large", "pglo", "--fleet", "--pin-ttl", "3s"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "p")
	const limit = 4
	c.OK("ns", "quota", "p", "--blobs", fmt.Sprint(limit))
	mnts := []string{t.TempDir(), t.TempDir()}
	clitest.StartDaemon(t, c.Data, mnts[0], flags...)
	clitest.StartDaemon(t, t.TempDir(), mnts[1], flags...)
	hc, err := client.New(clitest.StartServe(t, c, "--listen", "127.0.0.1:0", "--insecure-loopback").URL, "")
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()

	const writers = 10
	type result struct {
		ok  bool
		out string
	}
	results := make(chan result, writers)
	for i := range writers {
		p := filepath.Join(src, fmt.Sprint(i))
		if err := os.WriteFile(p, content(fmt.Sprint("fleet ", i), 1000), 0o644); err != nil {
			t.Fatal(err)
		}
		go func() {
			if i%3 == 2 {
				b := content(fmt.Sprint("fleet ", i), 1000)
				_, _, err := hc.Put(context.Background(), "p", bytes.NewReader(b), int64(len(b)), nil)
				if errors.Is(err, blob.ErrQuota) {
					results <- result{false, edquotText + " (HTTP: " + err.Error() + ")"}
					return
				}
				results <- result{err == nil, fmt.Sprint(err)}
				return
			}
			out, err := exec.Command("cp", p, filepath.Join(mnts[i%3], "p", "incoming", fmt.Sprint(i))).CombinedOutput()
			results <- result{err == nil, string(out)}
		}()
	}
	linked := 0
	for range writers {
		r := <-results
		switch {
		case r.ok:
			linked++
		case !strings.Contains(r.out, edquotText):
			t.Errorf("a writer failed otherwise than for quota: %s", r.out)
		}
	}
	if linked != limit {
		t.Errorf("%d of %d racing writers on two hosts were linked, want the limit, %d", linked, writers, limit)
	}
	listed := clitest.Lines(c.OK("ls", "p"))
	u := cliUsage(t, c, "p")["p"]
	if len(listed) != limit || u.blobs != int64(len(listed)) || u.bytes != int64(1000*len(listed)) {
		t.Errorf("the namespace lists %d blobs; ns usage says %d blobs, %d bytes", len(listed), u.blobs, u.bytes)
	}
	// Freed on one host, usable on the other at once.
	if err := os.Remove(filepath.Join(mnts[1], "p", listed[0])); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(src, "after")
	if err := os.WriteFile(p, content("fleet after", 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, out := shell(t, "cp", p, filepath.Join(mnts[0], "p", "incoming", "after")); !ok {
		t.Errorf("after an unlink on the other host: %s", out)
	}
}

// TestQuotaCLI: what the CLI alone promises: link of several digests is
// all or nothing against the quota; a limit lowered below what the
// namespace holds keeps its blobs and refuses more until it is under;
// unlink frees at once; ns ls -l shows blobs and bytes.
func TestQuotaCLI(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "n")
	dir := t.TempDir()
	put := func(ns string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, clitest.Sum(b))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"put", p}
		if ns != "" {
			args = []string{"put", "--ns", ns, p}
		}
		return strings.TrimSpace(c.OK(args...))
	}
	a, b := put("", content("cli a", 60)), put("", content("cli b", 60))
	c.OK("ns", "quota", "n", "--bytes", "100")
	c.Fail(1, "namespace n is at its quota (it holds 0 of 100 bytes and 0 blobs)", "link", "n", a, b)
	if got := c.OK("ls", "n"); got != "" {
		t.Errorf("a link refused for quota linked %q", got)
	}
	c.OK("link", "n", a)
	c.Fail(1, "holds 60 of 100 bytes and 1 blob", "link", "n", b)

	// Lowered below what it holds: nothing goes, nothing more comes.
	c.OK("ns", "quota", "n", "--bytes", "10", "--blobs", "5")
	if got := clitest.Lines(c.OK("ls", "n")); !slices.Equal(got, []string{a}) {
		t.Errorf("after a lower quota the namespace lists %q, want %s", got, a)
	}
	c.Fail(1, "is at its quota (it holds 60 of 10 bytes and 1 of 5 blobs)", "put", "--ns", "n", filepath.Join(dir, clitest.Sum(content("cli b", 60))))
	// --bytes 0 lifts the byte limit and keeps the blob limit.
	c.OK("ns", "quota", "n", "--bytes", "0")
	if u := cliUsage(t, c, "n")["n"]; u.quotaBytes != "-" || u.quotaBlobs != "5" {
		t.Errorf("after --bytes 0: %+v, want no byte limit and 5 blobs", u)
	}
	c.OK("ns", "quota", "n", "--bytes", "100")
	// Unlink frees at once.
	c.OK("unlink", "n", a)
	c.OK("link", "n", b)
	if got := clitest.Lines(c.OK("ns", "ls", "-l")); !slices.Equal(got, []string{"n 1 60"}) {
		t.Errorf("ns ls -l = %q", got)
	}
	c.Fail(2, "needs the NAMEs", "--remote", "unix:/nonexistent", "ns", "usage")
}

// TestQuotaOlderStoreSized: references an older version made carry no
// size; the first process that writes the store sizes them from the pool,
// so that usage counts their bytes. A read command changes nothing.
func TestQuotaOlderStoreSized(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	c.OK("ns", "create", "old")
	p, _, _ := clitest.WriteFile(t, t.TempDir(), clitest.SmallSize, 23)
	c.OK("put", "--ns", "old", p)
	db, err := sql.Open("sqlite", filepath.Join(c.Data, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// As an older version left it, after the open that added the
	// columns recounted it: a reference of unknown size, counted 0 bytes.
	if _, err := db.ExecContext(t.Context(), `UPDATE ns_refs SET size = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `UPDATE ns SET bytes = 0`); err != nil {
		t.Fatal(err)
	}
	if u := cliUsage(t, c, "old")["old"]; u.blobs != 1 || u.bytes != 0 {
		t.Fatalf("the older store's usage before a writer: %+v", u)
	}
	c.OK("ns", "create", "new") // a command that writes
	if u := cliUsage(t, c, "old")["old"]; u.blobs != 1 || u.bytes != clitest.SmallSize {
		t.Errorf("after a writer opened the store: %+v, want 1 blob of %d bytes", u, clitest.SmallSize)
	}
}
