module github.com/hanwen/go-fuse/v2

go 1.26.0

require (
	github.com/kylelemons/godebug v1.1.0
	golang.org/x/sys v0.50.0
)
