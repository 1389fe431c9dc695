// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

import (
	"os"
	"strings"
	"testing"
	"unsafe"
)

// lookupInput is the raw input of a LOOKUP of name in node, made by
// pid.
func lookupInput(node uint64, name string, pid uint32) []byte {
	buf := make([]byte, int(unsafe.Sizeof(InHeader{}))+len(name)+1)
	h := (*InHeader)(unsafe.Pointer(&buf[0]))
	h.Opcode = _OP_LOOKUP
	h.NodeId = node
	h.Caller.Pid = pid
	h.Length = uint32(len(buf))
	copy(buf[unsafe.Sizeof(InHeader{}):], name)
	return buf
}

// TestHandoverWakeRecognition: only this process's LOOKUP of the
// reserved name in the root is a wake-up, and telling costs no
// allocation for the lookups of other names.
func TestHandoverWakeRecognition(t *testing.T) {
	own := uint32(os.Getpid())
	// Pid 1 is never this test (nor a thread of it).
	for _, c := range []struct {
		what string
		in   []byte
		want bool
	}{
		{"own wake-up", lookupInput(FUSE_ROOT_ID, handoverWakeName, own), true},
		{"another process's", lookupInput(FUSE_ROOT_ID, handoverWakeName, 1), false},
		{"not in the root", lookupInput(5, handoverWakeName, own), false},
		{"a longer name", lookupInput(FUSE_ROOT_ID, handoverWakeName+"x", own), false},
		{"a prefix", lookupInput(FUSE_ROOT_ID, handoverWakeName[:10], own), false},
	} {
		if got := isHandoverWakeInput(c.in); got != c.want {
			t.Errorf("%s: isHandoverWakeInput = %v, want %v", c.what, got, c.want)
		}
	}
	for _, n := range []int{8, 22, 40, 200} {
		in := lookupInput(FUSE_ROOT_ID, strings.Repeat("x", n), own)
		if a := testing.AllocsPerRun(100, func() { isHandoverWakeInput(in) }); a != 0 {
			t.Errorf("root LOOKUP of a %d-byte name: %v allocations", n, a)
		}
	}
	var g readerGate
	if g.inProgress() {
		t.Errorf("a gate that never stopped is in progress")
	}
}
