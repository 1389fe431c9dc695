package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/client"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/store"
)

// annRemote marks the commands that work through --remote.
const annRemote = "alkblobfs.remote"

var (
	remoteOK     = map[string]string{annRemote: "true"}
	writesRemote = map[string]string{annWrites: "true", annRemote: "true"}
)

// client connects to the --remote server, with the --auth-token-file
// token if one is given.
func (a *app) client(cmd *cobra.Command) (*client.Client, error) {
	tok := ""
	if a.tokenFile != "" {
		t, err := ops.ReadAuthToken(a.tokenFile)
		if err != nil {
			return nil, usage(cmd, err)
		}
		tok = t
	}
	c, err := client.New(a.remote, tok)
	if err != nil {
		return nil, usagef(cmd, "--remote: %v", err)
	}
	return c, nil
}

// remoteBlob is a remote blob's body, verified as it is read.
type remoteBlob struct {
	io.ReadCloser
	d    store.Digest
	size int64
}

func openRemote(cmd *cobra.Command, c *client.Client, d store.Digest) (blobReader, error) {
	rc, size, err := c.Get(cmd.Context(), d, "")
	if err != nil {
		return nil, err
	}
	return &remoteBlob{ReadCloser: rc, d: d, size: size}, nil
}

func (r *remoteBlob) Len() int64           { return r.size }
func (r *remoteBlob) Digest() store.Digest { return r.d }
func (r *remoteBlob) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(w, struct{ io.Reader }{r.ReadCloser}, make([]byte, 1<<20))
}

// remotePut sends each file to the --remote server into namespace ns and
// prints its digest. The put's pin token is released at once: the
// namespace's reference keeps the blob, as with a local put --ns.
func (a *app) remotePut(cmd *cobra.Command, args []string, ns string) error {
	if ns == "" {
		return usagef(cmd, "put --remote needs --ns NAME: the server links what it stores into a namespace")
	}
	c, err := a.client(cmd)
	if err != nil {
		return err
	}
	for _, name := range args {
		d, err := a.remotePutOne(cmd, c, name, ns)
		if err != nil {
			return err
		}
		fmt.Fprintln(a.stdout, d)
	}
	return nil
}

// remotePutOne sends one file (or standard input) and releases the put's
// pin token.
func (a *app) remotePutOne(cmd *cobra.Command, c *client.Client, name, ns string) (store.Digest, error) {
	label, in, size, closeIn, err := a.input(name)
	if err != nil {
		return store.Digest{}, err
	}
	defer closeIn()
	t := newTransfer(cmd.Context(), a.stderr, a.stderrTerm, size, "put "+filepath.Base(label))
	d, tok, err := c.Put(cmd.Context(), ns, t.reader(in), size, nil)
	t.done(err)
	if err != nil {
		return d, fmt.Errorf("%s: %w", label, err)
	}
	if err := c.Release(cmd.Context(), tok); err != nil {
		a.log.Warn("could not release the put's pin token (it lapses by itself)", "digest", d, "err", err)
	}
	return d, nil
}

func newHaveCmd(a *app) *cobra.Command {
	var ns string
	cmd := &cobra.Command{
		Use:         "have --ns NAME DIGEST...",
		Annotations: remoteOK,
		Short:       "Tell which digests a namespace holds",
		Long: `have prints each DIGEST with "present" or "absent": whether namespace NAME
holds it. It changes nothing. A digest the namespace links whose content the
store has lost (a file removed by hand) is "lost", not present: put it again
to repair it (alkblobfs verify reports it MISSING). With --remote it asks the
server, in calls of up to 10000 digests; the server answers such a digest
absent.`,
		Example: `  alkblobfs have --ns builds 3f0a…e91c
  alkblobfs --remote http://blobs:8437 have --ns builds $(cat digests.txt)`,
		Args: argsRange(1, -1, "at least one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkName(cmd, ns); err != nil {
				return err
			}
			ds, err := parseDigests(cmd, args)
			if err != nil {
				return err
			}
			var present, lost []bool
			if a.remote != "" {
				c, err := a.client(cmd)
				if err != nil {
					return err
				}
				if present, err = c.Have(cmd.Context(), ns, ds); err != nil {
					return err
				}
			} else {
				st, svc, err := a.openNamespaces(cmd)
				if err != nil {
					return err
				}
				defer st.Close()
				if err := mustExist(cmd.Context(), svc, ns); err != nil {
					return err
				}
				if present, lost, err = svc.Have(cmd.Context(), ns, ds); err != nil {
					return err
				}
			}
			for i, d := range ds {
				verdict := "absent"
				switch {
				case present[i]:
					verdict = "present"
				case lost != nil && lost[i]:
					verdict = "lost"
				}
				fmt.Fprintf(a.stdout, "%s %s\n", d, verdict)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&ns, "ns", "", "the namespace `NAME` to look in (required)")
	cmd.MarkFlagRequired("ns")
	return cmd
}
