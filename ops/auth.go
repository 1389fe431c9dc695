package ops

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/wire"
)

// Verb is a kind of route that a bearer token may be limited to.
type Verb uint8

const (
	VerbRead   Verb = 1 << iota // GET, HEAD, have
	VerbWrite                   // put, and renewing and releasing its pin token
	VerbDelete                  // DELETE of a blob (unlink, or delete from the store)
	VerbSweep                   // sweeps, scrubs and the sweep timer (/v1/upkeep)

	AllVerbs = VerbRead | VerbWrite | VerbDelete | VerbSweep
)

var verbNames = []struct {
	v    Verb
	name string
}{{VerbRead, "read"}, {VerbWrite, "write"}, {VerbDelete, "delete"}, {VerbSweep, "sweep"}}

func (v Verb) String() string {
	var s []string
	for _, n := range verbNames {
		if v&n.v != 0 {
			s = append(s, n.name)
		}
	}
	return strings.Join(s, ",")
}

// Caller is who makes a request: the principal the namespaces' rules are
// applied to and, for a bearer token, what the token is bound to.
type Caller struct {
	namespaces.Principal
	// Namespaces, if not nil, are the only namespaces the caller may name.
	Namespaces []string
	// Verbs are the kinds of route the caller may use.
	Verbs Verb
}

// may refuses a verb the caller's token does not carry.
func (c *Caller) may(v Verb) error {
	if c.Verbs&v != v {
		return forbidden("this token may not %s (it carries verbs=%s)", v, c.Verbs)
	}
	return nil
}

// bound reports whether the caller may name namespace ns.
func (c *Caller) bound(ns string) bool {
	return c.Namespaces == nil || slices.Contains(c.Namespaces, ns)
}

type callerKey struct{}

// caller is the request's caller, which counted put in its context.
func caller(r *http.Request) *Caller { return r.Context().Value(callerKey{}).(*Caller) }

// Tokens is a server's bearer tokens, each bound to a principal and
// optionally to namespaces and verbs (ReadTokenFile). Only their sha256
// digests are kept, and a lookup compares the presented token's digest
// with every one in constant time.
//
// Tokens read from a file follow it: a server rereads the file once it
// changes (watchTokenFile), and Reload rereads it at once.
type Tokens struct {
	entries []tokenEntry // fixed: ParseTokens's, and Config.AuthToken's
	file    *tokenFile   // ReadTokenFile's; nil otherwise
}

type tokenEntry struct {
	sum   [sha256.Size]byte
	uid   uint32
	names []string // nil: any namespace
	verbs Verb
}

// tokenFile is a token file's tokens as last read.
type tokenFile struct {
	path    string
	entries atomic.Pointer[[]tokenEntry]

	mu   sync.Mutex // one reread at a time
	seen fileID     // the file as last read or tried
}

// fileID tells a file's versions apart: a replaced file has another inode,
// one written in place another ctime (which no program sets back), a
// chmod too. The zero fileID is a file that could not be looked at.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// lookup returns the entry of token tok, comparing its digest with every
// entry's whatever matches: the time taken does not tell how much of a
// token was right, nor which entry matched. TestTokenLookupConstantTime
// holds this function to that shape.
func (t *Tokens) lookup(tok string) (tokenEntry, bool) {
	got := sha256.Sum256([]byte(tok))
	var found tokenEntry
	ok := 0
	for _, set := range [2][]tokenEntry{t.entries, t.fileEntries()} {
		for _, e := range set {
			if subtle.ConstantTimeCompare(got[:], e.sum[:]) == 1 {
				found, ok = e, 1
			}
		}
	}
	return found, ok == 1
}

// fileEntries is the token file's tokens as last read (none without a file).
func (t *Tokens) fileEntries() []tokenEntry {
	if t.file == nil {
		return nil
	}
	return *t.file.entries.Load()
}

// Len is the number of tokens (0 for nil).
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries) + len(t.fileEntries())
}

// TokenFileFormat is the token file's format, for error messages.
const TokenFileFormat = "TOKEN USER [namespaces=NS,…] [verbs=read,write,delete,sweep]"

// ReadTokenFile reads a token file: one token per line,
//
//	TOKEN USER [namespaces=NS,…] [verbs=read,write,delete,sweep]
//
// where USER is a uid or a user name of the passwd database, the
// principal the token acts as; namespaces limits the namespaces it may
// name and verbs the kinds of route it may use (both default to all).
// Blank lines and lines starting with # are skipped. A token is at least
// 16 characters. The file must not be readable by group or others (0600),
// since every token in it is a user's access.
//
// The Tokens returned follow the file: see Reload.
func ReadTokenFile(file string) (*Tokens, error) {
	entries, id, err := readTokenFile(file)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("token file %s: %w", file, errNoTokens)
	}
	tf := &tokenFile{path: file, seen: id}
	tf.entries.Store(&entries)
	return &Tokens{file: tf}, nil
}

var errNoTokens = errors.New("no tokens in it: " + TokenFileFormat)

// readTokenFile parses file and says which version of it it read.
func readTokenFile(file string) ([]tokenEntry, fileID, error) {
	f, id, err := openPrivate(file, "token file")
	if err != nil {
		return nil, id, err
	}
	defer f.Close()
	entries, err := parseTokens(io.LimitReader(f, 16<<20), lookupUser)
	if err != nil {
		return nil, id, fmt.Errorf("token file %s: %w", file, err)
	}
	return entries, id, nil
}

// TokenCheckEvery is how often a server looks whether its token file
// changed (its inode, size, mtime or ctime); a changed file is reread, so
// a token removed from it is refused within this.
const TokenCheckEvery = time.Second

// Reload rereads the token file now (a SIGHUP), whether or not it changed,
// and logs what came of it on lg. A file that cannot be read or parsed,
// or that others may read, changes nothing: the tokens read before are
// kept, and the error is logged and returned. A file with no tokens left
// is taken (every request with a token is refused), with a warning. It
// does nothing for Tokens not read from a file. A nil lg logs nothing.
func (t *Tokens) Reload(lg *slog.Logger) error {
	if t == nil || t.file == nil {
		return nil
	}
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	return t.file.reload(lg, true)
}

// reload rereads the file if force or if it changed since it was last
// read or tried: a broken file is reported once, not at every check.
func (tf *tokenFile) reload(lg *slog.Logger, force bool) error {
	tf.mu.Lock()
	defer tf.mu.Unlock()
	if !force {
		var id fileID
		var st unix.Stat_t
		if unix.Stat(tf.path, &st) == nil {
			id = idOf(&st)
		}
		if id == tf.seen {
			return nil
		}
	}
	entries, id, err := readTokenFile(tf.path)
	tf.seen = id
	old := len(*tf.entries.Load())
	if err != nil {
		lg.Error("could not reread the token file; still serving the tokens read before", "tokens", old, "err", err)
		return err
	}
	tf.entries.Store(&entries)
	if len(entries) == 0 {
		lg.Warn("reread the token file: it holds no tokens, so every request with one is refused until it does", "file", tf.path)
		return nil
	}
	lg.Info("reread the token file", "file", tf.path, "tokens", len(entries), "before", old)
	return nil
}

// watchTokenFile rereads the token file, if there is one, once it
// changes, checking every TokenCheckEvery until ctx ends. The returned
// stop ends it and waits for it.
func (s *Server) watchTokenFile(ctx context.Context) (stop func()) {
	if s.tokenFile == nil || s.tokenFile.file == nil {
		return func() {}
	}
	tf := s.tokenFile.file
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(TokenCheckEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				tf.reload(s.log, false)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// openPrivate opens file and refuses it if group or others may read or
// write it. It says which version of the file it opened, refused or not.
func openPrivate(file, what string) (*os.File, fileID, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fileID{}, fmt.Errorf("%s: %w", what, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil { // the file read, not whatever the name points at later
		f.Close()
		return nil, fileID{}, fmt.Errorf("%s: %w", what, err)
	}
	if perm := os.FileMode(st.Mode).Perm(); perm&0o077 != 0 {
		f.Close()
		return nil, idOf(&st), fmt.Errorf("%s %s: mode %04o lets other users read it; chmod 600 %s", what, file, perm, file)
	}
	return f, idOf(&st), nil
}

// lookupUser is a USER field's uid: a number, or a name in the passwd
// database.
func lookupUser(name string) (uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, fmt.Errorf("no user %q: give a uid or a user name", name)
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("user %q has uid %q, not a number", name, u.Uid)
	}
	return uint32(n), nil
}

// minToken is the shortest token accepted: shorter ones can be guessed.
const minToken = 16

// ParseTokens parses a token file's content (see ReadTokenFile); user
// maps a USER field to its uid.
func ParseTokens(r io.Reader, user func(string) (uint32, error)) (*Tokens, error) {
	entries, err := parseTokens(r, user)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, errNoTokens
	}
	return &Tokens{entries: entries}, nil
}

// parseTokens is ParseTokens, which an empty file passes.
func parseTokens(r io.Reader, user func(string) (uint32, error)) ([]tokenEntry, error) {
	var entries []tokenEntry
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		// No token in a message: the line number says where.
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d: a token needs the user it acts as: %s (a token alone, the old format, named nobody; add the user it stands for)", n, TokenFileFormat)
		}
		if len(f[0]) < minToken {
			return nil, fmt.Errorf("line %d: the token is %d characters; use at least %d (openssl rand -hex 16)", n, len(f[0]), minToken)
		}
		uid, err := user(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		e := tokenEntry{sum: sha256.Sum256([]byte(f[0])), uid: uid, verbs: AllVerbs}
		if prev, dup := seen[e.sum]; dup {
			return nil, fmt.Errorf("line %d: the same token as line %d", n, prev)
		}
		seen[e.sum] = n
		for _, opt := range f[2:] {
			k, v, _ := strings.Cut(opt, "=")
			switch k {
			case "namespaces", "ns":
				e.names = []string{}
				for name := range strings.SplitSeq(v, ",") {
					if err := namespaces.ValidName(name); err != nil {
						return nil, fmt.Errorf("line %d: namespaces=%s: %q: %v", n, v, name, err)
					}
					e.names = append(e.names, name)
				}
			case "verbs":
				e.verbs = 0
				for name := range strings.SplitSeq(v, ",") {
					i := slices.IndexFunc(verbNames, func(vn struct {
						v    Verb
						name string
					}) bool {
						return vn.name == name
					})
					if i < 0 {
						return nil, fmt.Errorf("line %d: verbs=%s: %q is not read, write, delete or sweep", n, v, name)
					}
					e.verbs |= verbNames[i].v
				}
			default:
				return nil, fmt.Errorf("line %d: %q: want namespaces=NS,… or verbs=…: %s", n, k, TokenFileFormat)
			}
		}
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return entries, nil
}

// ReadAuthToken reads the token a client sends from file: the first
// field of its first line that is not blank or a comment. A token file of
// a server (ReadTokenFile) is one too: its first token. An empty token is
// an error, and so is a file others may read.
func ReadAuthToken(file string) (string, error) {
	f, _, err := openPrivate(file, "auth token file")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		return strings.Fields(line)[0], nil
	}
	return "", fmt.Errorf("auth token file %s is empty", file)
}

// identities resolves a uid's groups from the passwd and group databases,
// cached for a short while: an added group shows within identityTTL.
type identities struct {
	mu sync.Mutex
	m  map[uint32]identity
}

type identity struct {
	gids []uint32
	at   time.Time
}

// identityTTL is how long a user's groups are cached.
const identityTTL = 5 * time.Second

// principal is uid with gid (its primary group as the peer credentials
// give it, or none) and the groups the databases list for it.
func (ids *identities) principal(uid uint32, gid *uint32) namespaces.Principal {
	p := namespaces.Principal{UID: uid}
	if gid != nil {
		p.GIDs = append(p.GIDs, *gid)
	}
	now := time.Now()
	ids.mu.Lock()
	id, ok := ids.m[uid]
	ids.mu.Unlock()
	if !ok || now.Sub(id.at) > identityTTL {
		id = identity{gids: groupsOf(uid), at: now}
		ids.mu.Lock()
		if ids.m == nil {
			ids.m = map[uint32]identity{}
		}
		ids.m[uid] = id
		ids.mu.Unlock()
	}
	for _, g := range id.gids {
		if !slices.Contains(p.GIDs, g) {
			p.GIDs = append(p.GIDs, g)
		}
	}
	return p
}

// groupsOf lists uid's groups (primary and supplementary); none for a uid
// the passwd database does not know.
func groupsOf(uid uint32) []uint32 {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return nil
	}
	var gids []uint32
	if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
		gids = append(gids, uint32(g))
	}
	ids, _ := u.GroupIds()
	for _, s := range ids {
		if g, err := strconv.ParseUint(s, 10, 32); err == nil && !slices.Contains(gids, uint32(g)) {
			gids = append(gids, uint32(g))
		}
	}
	return gids
}

// peerKey carries a Unix socket connection's caller (or the error of
// finding it) in the connection's context.
type peerKey struct{}

type peer struct {
	c   *Caller
	err error
}

// identify is the request's caller: the Unix socket's peer, a bearer
// token's principal, or (InsecureLoopback, without a token) the server's
// owner. A request it cannot identify is 401.
func (s *Server) identify(r *http.Request) (*Caller, error) {
	if p, ok := r.Context().Value(peerKey{}).(peer); ok {
		if p.err != nil {
			return nil, &httpError{http.StatusUnauthorized, wire.CodeUnauthorized, "the server could not identify the socket's peer"}
		}
		return p.c, nil
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if ok && strings.EqualFold(scheme, "Bearer") && s.tokenFile != nil {
		if e, ok := s.tokenFile.lookup(strings.TrimSpace(tok)); ok {
			return &Caller{Principal: s.ids.principal(e.uid, nil), Namespaces: e.names, Verbs: e.verbs}, nil
		}
		return nil, errBadToken
	}
	if r.Header.Get("Authorization") == "" && s.insecure {
		return s.owner, nil
	}
	return nil, errBadToken
}

var errBadToken = &httpError{http.StatusUnauthorized, wire.CodeUnauthorized, "missing or unknown bearer token (Authorization: Bearer …, a token of the server's token file)"}

// connContext identifies a Unix socket connection's peer once, when it
// connects: its uid and gid by SO_PEERCRED, its groups from the
// databases. A TCP connection is left alone (its requests carry tokens).
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	uid, gid, ok, err := peerCred(c)
	if !ok {
		return ctx
	}
	if err != nil {
		s.log.Warn("could not read a Unix socket peer's credentials; refusing its requests", "err", err)
		return context.WithValue(ctx, peerKey{}, peer{err: err})
	}
	return context.WithValue(ctx, peerKey{}, peer{c: &Caller{Principal: s.ids.principal(uid, &gid), Verbs: AllVerbs}})
}
