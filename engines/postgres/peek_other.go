//go:build !unix

package postgres

import "github.com/jackc/pgx/v5"

// peerSpoke cannot peek without unix sockets; pgxpool's idle-time ping
// still applies.
func peerSpoke(*pgx.Conn) bool { return false }
