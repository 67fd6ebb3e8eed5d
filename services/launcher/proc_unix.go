//go:build unix

package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// parentDir is the directory above d.
func parentDir(d string) string { return filepath.Dir(d) }

// detach puts a rank in a process group of its own: the agent signals the
// whole group (a shell's children too), and a Ctrl-C or SIGTERM meant for
// the agent does not reach the ranks, which outlive it.
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// setCredential makes cmd run as u: its uid, gid and supplementary
// groups, set by the child before it enters cmd.Dir and execs.
func setCredential(cmd *exec.Cmd, u *Credential) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	return nil
}

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// signalOwnGroup sends sig to this process's group if this process leads
// it, as the shim does (the agent starts it with Setpgid): the rank and
// whatever it started get it, the shim too. It reports whether it was sent;
// a process that leads no group of its own signals no one else's.
func signalOwnGroup(sig syscall.Signal) bool {
	pid := os.Getpid()
	if syscall.Getpgrp() != pid {
		return false
	}
	return signalGroup(pid, sig) == nil
}

// killOwnGroup kills this process's group, itself included, if it leads it.
func killOwnGroup() { signalOwnGroup(sigKill) }

// alive reports whether the process pid still runs and is the one started
// at start (its start time in clock ticks since boot; 0: not checked), so
// a pid reused after a reboot or wrap-around is not taken for a rank.
func alive(pid int, start uint64) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if start == 0 {
		return true
	}
	got, err := procStart(pid)
	if err != nil {
		return false
	}
	if got != start {
		return false
	}
	// A zombie has exited; only its parent (a previous agent, gone) could
	// reap it.
	return !zombie(pid)
}

// procStart is the start time of pid from /proc (field 22 of stat), 0
// where there is no /proc.
func procStart(pid int) (uint64, error) {
	fields, err := statFields(pid)
	if errors.Is(err, os.ErrNotExist) && !procMounted() {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(fields) < 20 {
		return 0, errors.New("short /proc stat")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func zombie(pid int) bool {
	fields, err := statFields(pid)
	return err == nil && len(fields) > 0 && fields[0] == "Z"
}

// statFields are the fields of /proc/PID/stat after the command name
// (which may hold spaces and parentheses): state first.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, errors.New("malformed /proc stat")
	}
	return strings.Fields(s[i+1:]), nil
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// exitOf is how a waited-for process ended: its exit code, or -1 and the
// signal that killed it.
func exitOf(state *os.ProcessState) (int, string) {
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal().String()
	}
	return state.ExitCode(), ""
}

var (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// checkOwnDir refuses a state directory that someone else could swap or
// fill: the directory and every directory above it must be owned by root
// or by the agent's user, and one that others may write must be sticky
// (as /tmp is), so that no one else can rename what the agent made there.
// Otherwise a local user who made, say, /tmp/toposched-agent before the
// agent could put a link where the agent, perhaps running as root, writes
// its files.
func checkOwnDir(dir string) error {
	uid := uint32(os.Geteuid())
	for d := dir; ; d = parentDir(d) {
		st, err := os.Lstat(d)
		if err != nil {
			return err
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		switch {
		case !ok:
			return nil
		case st.Mode()&os.ModeSymlink != 0 && d == dir:
			return fmt.Errorf("%s is a symbolic link: give the agent a directory of its own", d)
		case sys.Uid != 0 && sys.Uid != uid:
			return fmt.Errorf("%s belongs to user %d, not to the agent's user (%d) or root: another user could replace what the agent writes under it", d, sys.Uid, uid)
		case st.Mode().Perm()&0o022 != 0 && st.Mode()&os.ModeSticky == 0 && st.IsDir():
			return fmt.Errorf("%s is writable by others and not sticky: another user could replace what the agent writes under it", d)
		}
		if parentDir(d) == d {
			return nil
		}
	}
}
