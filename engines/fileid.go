package engines

import "golang.org/x/sys/unix"

// FileID identifies one version of a backing file's content: a write to
// the file changes its ctime (which no program can set back), a
// replacement its inode. Equal FileIDs taken at two times mean the bytes
// read in between are the bytes on disk, barring the medium itself
// changing them (bit rot), which only reading the bytes again can show.
type FileID struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime unix.Timespec
}

// FileIDOf reads f's identity.
func FileIDOf(f FileHandle) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return FileID{}, err
	}
	return FileID{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim, Ctime: st.Ctim}, nil
}

// CursorFileID is the identity of c's backing file; ok is false for a
// cursor that is not a FileCursor or a file that cannot be stat'ed.
func CursorFileID(c Cursor) (id FileID, ok bool) {
	fc, isFile := c.(FileCursor)
	if !isFile {
		return FileID{}, false
	}
	id, err := FileIDOf(fc.File())
	return id, err == nil
}
