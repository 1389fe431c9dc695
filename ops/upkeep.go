package ops

import (
	"errors"
	"io"
	"net/http"

	"github.com/alkblobfs/alkblobfs/upkeep"
	"github.com/alkblobfs/alkblobfs/wire"
)

// The upkeep routes give HTTP what the mount's control files give
// (/.alkblobfs/sweep, sweep-timer, scrub), over the same upkeep:
//
//	GET  /v1/upkeep/sweep        the last sweep's report ({} before the first)
//	POST /v1/upkeep/sweep        sweep now; answers this sweep's report
//	GET  /v1/upkeep/sweep-timer  the timer: {"timer": "off"} or {"timer": "15m0s"}
//	PUT  /v1/upkeep/sweep-timer  body off, on or a duration of at least 1s,
//	                             in upkeep's grammar (upkeep.Command): as a
//	                             control file takes it, or 400
//	GET  /v1/upkeep/scrub        the last scrub's report
//	POST /v1/upkeep/scrub        scrub now; answers this scrub's report
//
// Reading them is for any caller the server accepts, as reading a control
// file is for any user of the mount; names (the digests a scrub found bad,
// an abort's detail) are shown only to root and the server's own user,
// with a token not bound to namespaces. Driving them (POST, PUT) is for
// those callers only, with the sweep verb: the control files are the
// mounting user's, mode 0644.

// maxUpkeepBody bounds a sweep-timer command.
const maxUpkeepBody = 64

func (s *Server) upkeepRoutes(u *upkeep.Upkeep) {
	s.route("GET /v1/upkeep/sweep", "upkeep", func(w http.ResponseWriter, r *http.Request) error {
		rep, ok := u.Sweeper.LastReport()
		if !ok {
			writeJSON(w, http.StatusOK, struct{}{})
			return nil
		}
		if !s.privileged(caller(r)) {
			rep.Detail = ""
		}
		writeJSON(w, http.StatusOK, rep)
		return nil
	})
	s.route("POST /v1/upkeep/sweep", "upkeep", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.mayDrive(caller(r)); err != nil {
			return err
		}
		rep, err := u.Sweeper.Run(r.Context(), "http")
		if err != nil {
			return upkeepErr(err)
		}
		writeJSON(w, http.StatusOK, rep)
		return nil
	})
	s.route("GET /v1/upkeep/sweep-timer", "upkeep", func(w http.ResponseWriter, r *http.Request) error {
		writeJSON(w, http.StatusOK, map[string]string{"timer": u.Sweeper.String()})
		return nil
	})
	s.route("PUT /v1/upkeep/sweep-timer", "upkeep", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.mayDrive(caller(r)); err != nil {
			return err
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, maxUpkeepBody+1))
		if err != nil {
			return badRequest("reading the sweep-timer command: %v", err)
		}
		if len(b) > maxUpkeepBody {
			return badRequest("a sweep-timer command is off, on or a duration like 15m, not %d bytes", len(b))
		}
		if _, err := u.Sweeper.Set(upkeep.Command(b)); err != nil {
			return upkeepErr(err)
		}
		writeJSON(w, http.StatusOK, map[string]string{"timer": u.Sweeper.String()})
		return nil
	})
	s.route("GET /v1/upkeep/scrub", "upkeep", func(w http.ResponseWriter, r *http.Request) error {
		rep, ok := u.Scrubber.LastReport()
		if !ok {
			writeJSON(w, http.StatusOK, struct{}{})
			return nil
		}
		if !s.privileged(caller(r)) {
			rep.BadDigests, rep.Error = nil, ""
		}
		writeJSON(w, http.StatusOK, rep)
		return nil
	})
	s.route("POST /v1/upkeep/scrub", "upkeep", func(w http.ResponseWriter, r *http.Request) error {
		if err := s.mayDrive(caller(r)); err != nil {
			return err
		}
		rep, err := u.Scrubber.Run(r.Context(), "http")
		if err != nil {
			return upkeepErr(err)
		}
		writeJSON(w, http.StatusOK, rep)
		return nil
	})
}

// privileged reports whether c sees names in upkeep reports: root or the
// server's own user, not limited to some namespaces.
func (s *Server) privileged(c *Caller) bool {
	return c.Namespaces == nil && (c.UID == 0 || c.UID == s.owner.UID)
}

// mayDrive refuses a sweep, scrub or timer change to a caller who could
// not write the mount's control files.
func (s *Server) mayDrive(c *Caller) error {
	if err := c.may(VerbSweep); err != nil {
		return err
	}
	if !s.privileged(c) {
		return forbidden("only root and the server's own user start sweeps and scrubs or set the sweep timer")
	}
	if s.ro {
		return &httpError{http.StatusForbidden, wire.CodeReadOnly, "this server is read-only: it does not sweep"}
	}
	return nil
}

// upkeepErr maps upkeep's errors: bad input is the caller's, a stopped
// upkeep (the server shutting down) is 503.
func upkeepErr(err error) error {
	switch {
	case errors.Is(err, upkeep.ErrBadInput):
		return badRequest("%s", upkeep.Clip(err.Error()))
	case errors.Is(err, upkeep.ErrStopped):
		return &httpError{http.StatusServiceUnavailable, wire.CodeUnavailable, "the server is shutting down"}
	}
	return err
}
