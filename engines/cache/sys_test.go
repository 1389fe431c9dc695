package cache_test

import "syscall"

func mountTmpfs(dir, opts string) error { return syscall.Mount("tmpfs", dir, "tmpfs", 0, opts) }
func unmount(dir string)                { syscall.Unmount(dir, syscall.MNT_DETACH) }
