package s3

// SetCopyPartSize sets the part size of the server-side copy, so that a
// test reaches the multipart copy (UploadPartCopy) with small blobs. It
// returns a function that restores it.
func SetCopyPartSize(n int64) (restore func()) {
	old := copyPartSize
	copyPartSize = n
	return func() { copyPartSize = old }
}
