// Package faultctl is the test side of a fault server: a throw-away copy
// of a server (PostgreSQL, S3) that the test scripts start beside the main
// one, so that a test may stop and restart it without disturbing the rest
// of the suite. The scripts give its control command ("CTL
// stop|start|restart") and a lock file; tests in every test binary
// serialize on that lock.
package faultctl

import (
	"os/exec"
	"testing"
)

// Server controls a fault server for one test.
type Server struct {
	ctl       string
	stopped   bool
	restartAt bool // a cleanup starts the server again if t left it stopped
}

// Take locks the fault server for t, waiting for other processes, and
// releases it when t ends. Cleanups t registers after Take run before the
// release.
func Take(t testing.TB, ctl, lock string) *Server {
	t.Helper()
	t.Cleanup(lockFile(t, lock))
	return &Server{ctl: ctl}
}

// Stop stops the server. When t ends the server is started again if it is
// still stopped, before the cleanups registered so far (which may need it
// running) and before the lock is released.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.run(t, "stop")
	s.stopped = true
	if !s.restartAt {
		s.restartAt = true
		t.Cleanup(func() {
			if s.stopped {
				s.run(t, "start")
			}
		})
	}
}

// Start starts a stopped server and returns once it answers.
func (s *Server) Start(t testing.TB) { t.Helper(); s.run(t, "start"); s.stopped = false }

// Restart is Stop then Start, in one command.
func (s *Server) Restart(t testing.TB) { t.Helper(); s.run(t, "restart"); s.stopped = false }

func (s *Server) run(t testing.TB, action string) {
	t.Helper()
	out, err := exec.Command(s.ctl, action).CombinedOutput()
	if err != nil {
		t.Fatalf("fault server %s %s: %v\n%s", s.ctl, action, err, out)
	}
}
