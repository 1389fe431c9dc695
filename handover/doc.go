// Package handover passes a live FUSE connection from one process to
// another: the /dev/fuse file descriptor by SCM_RIGHTS, with the state
// the new process needs to serve it (the INIT parameters and the node
// table of the patched go-fuse in third_party/go-fuse, see its
// PATCHES.md) in the same exchange. It is the transport of issue 37's
// upgrade without unmounting: `alkblobfs upgrade` (cmd/alkblobfs/upgrade.go)
// sends the mount's descriptor with fusefs's state (fusefs/handover.go).
//
// The contract: Send writes one message and Receive reads it whole or
// fails; a Receive that fails closes any descriptor it got, so a failed
// exchange leaks nothing. Receive accepts only a descriptor of
// /dev/fuse (character device 10:229), one, with control data the
// kernel did not truncate; and the sender keeps serving (its own
// descriptor is untouched). The state is opaque bytes here: its format
// and version are the caller's.
package handover
