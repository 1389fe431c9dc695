package main

import (
	"fmt"
	"os"
	"time"
)

// syncEveryEnv sets how often a process that keeps the store open (a
// mount, serve) syncs the kv engine while it is written, bounding what a
// power loss takes (store.Config.SyncEvery): a Go duration, or off (0).
// Unset, the store's default of 1s. A variable, not yet a flag, so that
// it stays out of the flag set of every command; flagsFromEnv would read
// the same name for a global --sync-every.
const syncEveryEnv = "ALKBLOBFS_SYNC_EVERY"

// syncEvery is store.Config.SyncEvery from $ALKBLOBFS_SYNC_EVERY: 0 (the
// store's default) when unset, negative for off.
func syncEvery() (time.Duration, error) {
	v, ok := os.LookupEnv(syncEveryEnv)
	if !ok || v == "" {
		return 0, nil
	}
	if v == "off" || v == "0" {
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q: want a duration such as 1s or 500ms, or off", syncEveryEnv, v)
	}
	return d, nil
}
