package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Config says where an engine keeps its blobs and how it talks to the
// server. ParseURL fills the first five fields from an s3:// URL; the rest
// are knobs for tests and tools (zero: the default).
type Config struct {
	Bucket   string
	Prefix   string // without leading or trailing slash; "" is the bucket's root
	Endpoint string // HOST:PORT
	Region   string // "" lets the client ask the server
	TLS      bool

	// Creds overrides the credential chain (the AWS_* variables, then the
	// AWS credentials file).
	Creds *credentials.Credentials
	// StaleAfter is the age past which Open removes staging objects and
	// aborts incomplete multipart uploads under the prefix (default 24h).
	StaleAfter time.Duration
	// MaxRetries bounds the attempts of one request (default 5): the
	// client retries 5xx, throttling and connection errors with jittered
	// exponential backoff of 200 ms doubling to a 1 s cap.
	MaxRetries int
	// PartSize is the multipart upload part size, and the largest blob put
	// in one request (default 8 MiB; at least 5 MiB).
	PartSize int
}

const (
	defaultStaleAfter = 24 * time.Hour
	defaultRetries    = 5
	defaultPartSize   = 8 << 20
	minPartSize       = 5 << 20
	// maxCopyPart is S3's largest single copy (CopyObject) and part.
	maxCopyPart = 5 << 30

	// Timeouts of one request (its retries included).
	metaTimeout = time.Minute      // HEAD, DELETE, one list page
	dataTimeout = 10 * time.Minute // one part or window
	copyTimeout = 2 * time.Hour    // the server-side copy at Commit

	// maxSidecar bounds what Sidecar reads: the store's sums are a few
	// bytes per chunk, far under this for any blob S3 can hold.
	maxSidecar = 64 << 20
)

// ParseURL parses s3://BUCKET[/PREFIX]?endpoint=HOST:PORT[&region=R][&tls=true|false].
// tls defaults to true. Credentials in the URL are refused: they come from
// the environment or the credentials file.
func ParseURL(raw string) (Config, error) {
	var c Config
	u, err := url.Parse(raw)
	if err != nil {
		return c, fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "s3" {
		return c, errors.New("want s3://BUCKET/PREFIX?endpoint=HOST:PORT")
	}
	if u.User != nil {
		return c, errors.New("credentials do not go in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or use an AWS credentials file")
	}
	if u.Host == "" {
		return c, errors.New("no bucket: want s3://BUCKET/PREFIX?endpoint=HOST:PORT")
	}
	c.Bucket = u.Host
	c.Prefix = strings.Trim(u.Path, "/")
	if strings.Contains(c.Prefix, "//") {
		return c, fmt.Errorf("prefix %q has an empty path segment", c.Prefix)
	}
	c.TLS = true
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "endpoint":
			c.Endpoint = v
		case "region":
			c.Region = v
		case "tls":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return c, fmt.Errorf("tls=%q: want true or false", v)
			}
			c.TLS = b
		default:
			return c, fmt.Errorf("unknown parameter %q: want endpoint, region or tls", k)
		}
	}
	if c.Endpoint == "" {
		return c, errors.New("no endpoint: want ?endpoint=HOST:PORT")
	}
	if _, _, err := net.SplitHostPort(c.Endpoint); err != nil && strings.Contains(c.Endpoint, "/") {
		return c, fmt.Errorf("endpoint %q: want HOST:PORT, without a scheme or path", c.Endpoint)
	}
	return c, nil
}

// Redact returns raw with any userinfo (credentials someone put in the URL
// by mistake) replaced by "REDACTED", for messages.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if i, j := strings.Index(raw, "://"), strings.LastIndex(raw, "@"); i >= 0 && j > i {
			return raw[:i+3] + "REDACTED" + raw[j:]
		}
		return raw
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	return u.String()
}

// Engine is a large engine over an S3 bucket.
type Engine struct {
	cfg    Config
	name   string
	client *minio.Client
	core   minio.Core
	tr     *http.Transport
	log    *slog.Logger

	// blobs is "PREFIX/" (or ""): blob keys are blobs+"ab/abcdef…".
	blobs string
	// staging is "PREFIX/stage/": staged puts' objects; sums holds the
	// sidecars, "PREFIX/sums/ab/abcdef…". Both sort after every shard
	// ("s" > "f"), so a listing of blobs stops before them.
	staging, sums string

	mu     sync.Mutex
	stages map[*stage]struct{} // live stages, for StageResidue and Close
	closed bool

	// noCond is set once the server refused a conditional put
	// (If-None-Match): puts then rely on the HEAD before them alone.
	noCond atomic.Bool
}

var (
	_ engines.Large          = (*Engine)(nil)
	_ engines.ResidueCounter = (*Engine)(nil)
	_ engines.SidecarReader  = (*Engine)(nil)
)

// OpenURL is Open of ParseURL(raw).
func OpenURL(ctx context.Context, raw string, log *slog.Logger) (*Engine, error) {
	cfg, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	return Open(ctx, cfg, log)
}

// Open connects to the bucket cfg names, checks that it exists and that
// credentials were found, and removes staging objects and incomplete
// multipart uploads under the prefix older than cfg.StaleAfter, logging
// what it removed. log may be nil.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (*Engine, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = defaultStaleAfter
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = defaultRetries
	}
	if cfg.PartSize == 0 {
		cfg.PartSize = defaultPartSize
	}
	if cfg.PartSize < minPartSize {
		return nil, fmt.Errorf("s3: part size %d is under S3's minimum of %d", cfg.PartSize, minPartSize)
	}
	cfg.Prefix = strings.Trim(cfg.Prefix, "/")
	e := &Engine{cfg: cfg, log: log, stages: map[*stage]struct{}{}}
	e.name = "s3://" + cfg.Bucket + "/" + cfg.Prefix
	if cfg.Prefix != "" {
		e.blobs = cfg.Prefix + "/"
	}
	e.staging = e.blobs + "stage/"
	e.sums = e.blobs + "sums/"

	creds := cfg.Creds
	if creds == nil {
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.FileAWSCredentials{},
		})
	}
	if v, err := creds.GetWithContext(nil); err != nil || v.AccessKeyID == "" {
		return nil, e.wrap("open", blob.Digest{}, errors.New("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with an AWS credentials file"))
	}
	tr, err := minio.DefaultTransport(cfg.TLS)
	if err != nil {
		return nil, e.wrap("open", blob.Digest{}, err)
	}
	tr.MaxIdleConnsPerHost = 64
	tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:      creds,
		Secure:     cfg.TLS,
		Region:     cfg.Region,
		Transport:  tr,
		MaxRetries: cfg.MaxRetries,
	})
	if err != nil {
		return nil, e.wrap("open", blob.Digest{}, err)
	}
	e.client, e.tr = client, tr
	e.core = minio.Core{Client: client}

	octx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	ok, err := client.BucketExists(octx, cfg.Bucket)
	if err != nil {
		return nil, e.wrap("open", blob.Digest{}, e.reqErr("HEAD bucket", cfg.Bucket, err))
	}
	if !ok {
		return nil, e.wrap("open", blob.Digest{}, fmt.Errorf("bucket %q does not exist at %s", cfg.Bucket, cfg.Endpoint))
	}
	if err := e.removeStale(ctx); err != nil {
		return nil, e.wrap("open", blob.Digest{}, fmt.Errorf("removing stale staging objects: %w", err))
	}
	return e, nil
}

// removeStale deletes staging objects and aborts incomplete multipart
// uploads (under the whole prefix: the copy of a blob over 5 GiB is one
// too) older than StaleAfter. Younger ones may be another process's live
// stages.
func (e *Engine) removeStale(ctx context.Context) error {
	cutoff := time.Now().Add(-e.cfg.StaleAfter)
	var objects, uploads int
	defer func() {
		if objects > 0 || uploads > 0 {
			e.log.Info("removed stale S3 staging objects and incomplete multipart uploads",
				"objects", objects, "uploads", uploads, "engine", e.name, "older_than", e.cfg.StaleAfter)
		}
	}()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for obj := range e.client.ListObjectsIter(lctx, e.cfg.Bucket, minio.ListObjectsOptions{Prefix: e.staging, Recursive: true}) {
		if obj.Err != nil {
			return e.reqErr("LIST", e.staging, obj.Err)
		}
		if obj.LastModified.After(cutoff) {
			continue
		}
		if err := e.remove(ctx, obj.Key); err != nil {
			return err
		}
		objects++
	}
	ups, err := e.uploads(ctx)
	if err != nil {
		return err
	}
	for _, u := range ups {
		if u.Initiated.After(cutoff) {
			continue
		}
		if err := e.abortUpload(ctx, u.Key, u.UploadID); err != nil {
			return err
		}
		uploads++
	}
	return nil
}

// uploads lists the incomplete multipart uploads under the prefix.
func (e *Engine) uploads(ctx context.Context) ([]minio.ObjectMultipartInfo, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ups []minio.ObjectMultipartInfo
	for u := range e.client.ListIncompleteUploads(lctx, e.cfg.Bucket, e.blobs, true) {
		if u.Err != nil {
			return nil, e.reqErr("LIST uploads", e.blobs, u.Err)
		}
		ups = append(ups, u)
	}
	return ups, nil
}

// Name implements engines.Engine: s3://BUCKET/PREFIX.
func (e *Engine) Name() string { return e.name }

// Config is the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Client is the engine's S3 client (tests use it to look behind the
// engine).
func (e *Engine) Client() *minio.Client { return e.client }

// SharedMedium reports that every host that opens the same URL sees the
// same blobs: an S3 bucket is fleet shared media by nature, no
// --shared-media declaration needed.
func (e *Engine) SharedMedium() bool { return true }

// Close discards the stages still open (aborting their uploads). The
// client holds nothing else but idle connections.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	live := make([]*stage, 0, len(e.stages))
	for s := range e.stages {
		live = append(live, s)
	}
	e.mu.Unlock()
	for _, s := range live {
		s.Discard()
	}
	e.tr.CloseIdleConnections()
	return nil
}

// Key is d's object key: PREFIX/ab/abcdef….
func (e *Engine) Key(d blob.Digest) string {
	h := d.String()
	return e.blobs + h[:2] + "/" + h
}

func (e *Engine) sumsKey(d blob.Digest) string {
	h := d.String()
	return e.sums + h[:2] + "/" + h
}

func (e *Engine) wrap(op string, d blob.Digest, err error) error {
	return blob.Wrap(op, e.name, d, err)
}

// reqErr names the request and key of a failed request, maps a missing
// key to blob.ErrMissing, and says when the client's retries ran out.
func (e *Engine) reqErr(req, key string, err error) error {
	if err == nil {
		return nil
	}
	if isMissing(err) {
		return fmt.Errorf("%s %s: %w", req, key, blob.ErrMissing)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: %w", req, key, err)
	}
	if r := minio.ToErrorResponse(err); r.StatusCode != 0 && r.StatusCode < 500 && r.StatusCode != 429 {
		return fmt.Errorf("%s %s: %w", req, key, err)
	}
	return fmt.Errorf("%s %s at %s (gave up after %d attempts): %w", req, key, e.cfg.Endpoint, e.cfg.MaxRetries, err)
}

func isMissing(err error) bool {
	r := minio.ToErrorResponse(err)
	switch r.Code {
	case "NoSuchKey", "NotFound", "NoSuchUpload":
		return true
	}
	return r.StatusCode == http.StatusNotFound && r.Code != "NoSuchBucket"
}

// stat is a HEAD of key.
func (e *Engine) stat(ctx context.Context, key string) (minio.ObjectInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	oi, err := e.client.StatObject(ctx, e.cfg.Bucket, key, minio.StatObjectOptions{})
	return oi, e.reqErr("HEAD", key, err)
}

// present is a HEAD that reports a missing key as false.
func (e *Engine) present(ctx context.Context, key string) (bool, error) {
	_, err := e.stat(ctx, key)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, blob.ErrMissing):
		return false, nil
	}
	return false, err
}

// remove deletes key; S3 does not tell whether it was there.
func (e *Engine) remove(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	err := e.client.RemoveObject(ctx, e.cfg.Bucket, key, minio.RemoveObjectOptions{})
	if isMissing(err) {
		return nil
	}
	return e.reqErr("DELETE", key, err)
}

func (e *Engine) abortUpload(ctx context.Context, key, id string) error {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	err := e.core.AbortMultipartUpload(ctx, e.cfg.Bucket, key, id)
	if isMissing(err) {
		return nil
	}
	return e.reqErr("ABORT upload", key, err)
}

// Has implements engines.Engine with a HEAD.
func (e *Engine) Has(ctx context.Context, d blob.Digest) (bool, error) {
	ok, err := e.present(ctx, e.Key(d))
	return ok, e.wrap("has", d, err)
}

// Size implements engines.Engine with a HEAD.
func (e *Engine) Size(ctx context.Context, d blob.Digest) (int64, error) {
	oi, err := e.stat(ctx, e.Key(d))
	if err != nil {
		return 0, e.wrap("size", d, err)
	}
	return oi.Size, nil
}

// Open implements engines.Engine: a HEAD for the length, then a cursor of
// ranged GETs.
func (e *Engine) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	key := e.Key(d)
	oi, err := e.stat(ctx, key)
	if err != nil {
		return nil, e.wrap("open", d, err)
	}
	return newCursor(e, d, key, oi.Size), nil
}

// Delete implements engines.Engine: a HEAD (S3's DELETE does not say
// whether the key was there), the DELETE, then the sidecar's. A cursor
// open on d fails from its next GET on, with an error wrapping
// blob.ErrMissing: this engine is not engines.DeleteSafe.
func (e *Engine) Delete(ctx context.Context, d blob.Digest) error {
	key := e.Key(d)
	if _, err := e.stat(ctx, key); err != nil {
		return e.wrap("delete", d, err)
	}
	if err := e.remove(ctx, key); err != nil {
		return e.wrap("delete", d, err)
	}
	if err := e.remove(ctx, e.sumsKey(d)); err != nil {
		// The blob is gone; a sidecar left behind is still right if the
		// same content comes back, so this is no failure of Delete.
		e.log.Warn("could not remove an S3 sidecar", "key", e.sumsKey(d), "err", err)
	}
	return nil
}

// Sidecar implements engines.SidecarReader: the object PREFIX/sums/ab/….
func (e *Engine) Sidecar(ctx context.Context, d blob.Digest) ([]byte, error) {
	key := e.sumsKey(d)
	ctx, cancel := context.WithTimeout(ctx, dataTimeout)
	defer cancel()
	body, _, _, err := e.core.GetObject(ctx, e.cfg.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, e.wrap("sidecar", d, e.reqErr("GET", key, err))
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, maxSidecar+1))
	if err != nil {
		return nil, e.wrap("sidecar", d, e.reqErr("GET", key, err))
	}
	if len(b) > maxSidecar {
		return nil, e.wrap("sidecar", d, fmt.Errorf("GET %s: over %d bytes", key, maxSidecar))
	}
	return b, nil
}

// StageResidue implements engines.ResidueCounter: the stages live in this
// process, plus the staging objects and incomplete multipart uploads under
// the prefix that none of them owns (other processes' live stages count
// too, as do leftovers that Open has not yet found stale).
func (e *Engine) StageResidue(ctx context.Context) (int, error) {
	e.mu.Lock()
	owned := map[string]bool{}
	live := len(e.stages)
	for s := range e.stages {
		for _, k := range s.keys() {
			owned[k] = true
		}
	}
	e.mu.Unlock()
	n := live
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for obj := range e.client.ListObjectsIter(lctx, e.cfg.Bucket, minio.ListObjectsOptions{Prefix: e.staging, Recursive: true}) {
		if obj.Err != nil {
			return 0, e.wrap("stage residue", blob.Digest{}, e.reqErr("LIST", e.staging, obj.Err))
		}
		if !owned[obj.Key] {
			n++
		}
	}
	ups, err := e.uploads(ctx)
	if err != nil {
		return 0, e.wrap("stage residue", blob.Digest{}, err)
	}
	for _, u := range ups {
		if !owned[u.Key] {
			n++
		}
	}
	return n, nil
}
