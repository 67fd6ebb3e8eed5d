package e2e

import (
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size (such as "3m") on a new directory,
// read-only if ro, and unmounts it when the test ends, after the processes
// the test starts later have been killed. It skips the test where mounting
// is not allowed (it needs root or CAP_SYS_ADMIN).
func mountTmpfs(t *testing.T, size string, ro bool) string {
	t.Helper()
	dir := t.TempDir()
	flags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV)
	if ro {
		flags |= syscall.MS_RDONLY
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, "size="+size); err != nil {
		t.Skipf("mount a %s tmpfs on %s: %v (needs root or CAP_SYS_ADMIN)", size, dir, err)
	}
	t.Cleanup(func() {
		// A process killed a moment ago may still hold it (EBUSY): then
		// detach it, which unmounts it once the last file is closed.
		if err := syscall.Unmount(dir, 0); err != nil {
			if derr := syscall.Unmount(dir, syscall.MNT_DETACH); derr != nil {
				t.Errorf("unmount %s: %v; detach: %v", dir, err, derr)
			}
		}
	})
	return dir
}

// resizeTmpfs remounts the tmpfs mountTmpfs made on dir with a new size,
// as an operator enlarges a full disk under a running process.
func resizeTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT|syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size); err != nil {
		t.Fatalf("remount the tmpfs on %s with size %s: %v", dir, size, err)
	}
}
