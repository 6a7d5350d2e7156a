// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// mountPointRegistry lists the mount points that containers of every kubelet on this machine had
// to create on the host, so that they can be removed once nothing is mounted on them. Writers
// hold an exclusive flock on it: an init for its whole mount phase, a cleanup while it removes.
const mountPointRegistry = "/run/regroup-kubelet/created-mountpoints"

// initSpec is what a container's init does before it execs the container's command.
type initSpec struct {
	Argv   []string `json:"argv"`
	Env    []string `json:"env"`
	Dir    string   `json:"dir"`
	Mounts []mount  `json:"mounts"`
	// Isolated says the init runs in its own mount and UTS namespaces (the kubelet runs as root);
	// without them there are no mounts and the machine's hostname stays.
	Isolated bool   `json:"isolated"`
	Hostname string `json:"hostname"`
}

// mount is a bind mount of a host path (a volume, a subPath of one, the hosts file).
type mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// containerInit runs as argv[1] == initArg, already in the container's new mount and UTS
// namespaces (spec.Isolated): it sets the hostname, makes the mounts private, bind-mounts the
// volumes and the hosts file, changes directory and execs the command. Any failure is written to
// fd 3 for the kubelet and ends the process.
func containerInit(args []string) {
	status := os.NewFile(3, "init-status")
	fail := func(format string, a ...any) {
		msg := fmt.Sprintf(format, a...)
		fmt.Fprintln(os.Stderr, "regroup-kubelet: container init:", msg)
		if status != nil {
			_, _ = status.WriteString(msg)
		}
		os.Exit(127)
	}
	if len(args) != 1 {
		fail("usage: %s SPEC.json", initArg)
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		fail("reading the init spec: %v", err)
	}
	var spec initSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		fail("parsing the init spec %s: %v", args[0], err)
	}
	if spec.Isolated {
		// The pod's hostname, which its hosts file maps to its IP (what gloo, for one, resolves).
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			fail("setting the hostname %q: %v", spec.Hostname, err)
		}
		// Nothing mounted here may propagate back to the host (systemd makes / shared).
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fail("making / a private mount: %v", err)
		}
		reg, err := openRegistry()
		if err != nil {
			fail("%v", err)
		}
		for _, m := range spec.Mounts {
			if err := reg.bindMount(m); err != nil {
				fail("mounting %s on %s: %v", m.Source, m.Target, err)
			}
		}
		err = os.Chdir(spec.Dir)
		if os.IsNotExist(err) {
			if err = reg.ensure(spec.Dir, true); err == nil {
				err = os.Chdir(spec.Dir)
			}
		}
		if err != nil {
			fail("working directory %s: %v", spec.Dir, err)
		}
		reg.file.Close() // and its lock
	} else {
		if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
			fail("working directory %s: %v", spec.Dir, err)
		}
		if err := os.Chdir(spec.Dir); err != nil {
			fail("working directory %s: %v", spec.Dir, err)
		}
	}
	path, err := lookPath(spec.Argv[0], envValue(spec.Env, "PATH"))
	if err != nil {
		fail("%v", err)
	}
	syscall.CloseOnExec(3)
	err = syscall.Exec(path, spec.Argv, spec.Env)
	fail("exec %s: %v", path, err)
}

// registry is the locked mountPointRegistry of one init.
type registry struct {
	file    *os.File
	mounted []string // targets mounted so far: what is created under them is in a volume, not on the host
}

func openRegistry() (*registry, error) {
	if err := os.MkdirAll(filepath.Dir(mountPointRegistry), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(mountPointRegistry, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %v", mountPointRegistry, err)
	}
	return &registry{file: f}, nil
}

// bindMount binds m.Source onto m.Target, creating the target if missing.
func (r *registry) bindMount(m mount) error {
	fi, err := os.Stat(m.Source)
	if err != nil {
		return err
	}
	if err := r.ensure(m.Target, fi.IsDir()); err != nil {
		return err
	}
	if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	r.mounted = append(r.mounted, m.Target)
	if !m.ReadOnly {
		return nil
	}
	// A read-only bind is a remount of the bind; it must keep the flags the kernel locks (nosuid,
	// nodev, noexec, atime).
	var st unix.Statfs_t
	if err := unix.Statfs(m.Target, &st); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for stFlag, msFlag := range map[int64]uintptr{unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV,
		unix.ST_NOEXEC: unix.MS_NOEXEC, unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME,
		unix.ST_RELATIME: unix.MS_RELATIME} {
		if st.Flags&stFlag != 0 {
			flags |= msFlag
		}
	}
	return unix.Mount("", m.Target, "", flags, "")
}

// ensure creates target (a directory, or an empty file) and its missing parents, registering
// each it creates on the host.
func (r *registry) ensure(target string, dir bool) error {
	var missing []string
	for p := target; ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		} else if !os.IsNotExist(err) {
			return err
		}
		missing = append(missing, p)
		if p == "/" {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		p := missing[i]
		var err error
		if i == 0 && !dir {
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o644); err == nil {
				f.Close()
			}
		} else {
			err = os.Mkdir(p, 0o755)
		}
		if os.IsExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !r.inVolume(p) {
			if _, err := r.file.WriteString(p + "\n"); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *registry) inVolume(p string) bool {
	for _, m := range r.mounted {
		if p == m || strings.HasPrefix(p, strings.TrimSuffix(m, "/")+"/") {
			return true
		}
	}
	return false
}

// lookPath finds name on the container's PATH (not the kubelet's), as a runtime does.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in the container's PATH %q", name, path)
}

func envValue(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v
		}
	}
	return ""
}

// removeCreatedMountPoints removes the registered mount points that are empty and not a mount
// point in any mount namespace on this machine, deepest first: removing a directory on which
// another container (of this node or another) has mounted would detach that mount, and the
// service account's directory is shared by every pod of every node here.
func removeCreatedMountPoints() {
	if os.Geteuid() != 0 {
		return // nothing was mounted, nothing created
	}
	reg, err := openRegistry()
	if err != nil {
		klog.ErrorS(err, "Cannot clean up the created mount points")
		return
	}
	defer reg.file.Close()
	data, err := io.ReadAll(reg.file)
	if err != nil {
		return
	}
	var paths []string
	seen := map[string]bool{}
	for _, p := range strings.Split(string(data), "\n") {
		if p != "" && !seen[p] {
			seen[p] = true
			paths = append(paths, p)
		}
	}
	sort.SliceStable(paths, func(i, j int) bool { return strings.Count(paths[i], "/") > strings.Count(paths[j], "/") })
	mounted := mountPoints()
	var keep []string
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue // gone
		}
		fi, err := os.Stat(real)
		if err != nil {
			continue
		}
		if mounted[real] || !(fi.IsDir() || fi.Size() == 0) || os.Remove(real) != nil {
			keep = append(keep, p) // in use, or someone filled it: maybe later
		}
	}
	text := strings.Join(keep, "\n")
	if text != "" {
		text += "\n"
	}
	if err := reg.file.Truncate(0); err == nil {
		_, _ = reg.file.WriteString(text) // O_APPEND: at the new end
	}
}

// mountPoints is every mount point of every mount namespace on the machine.
func mountPoints() map[string]bool {
	out := map[string]bool{}
	seenNS := map[string]bool{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		ns, err := os.Readlink(proc + "/ns/mnt")
		if err != nil || seenNS[ns] {
			continue
		}
		seenNS[ns] = true
		data, err := os.ReadFile(proc + "/mountinfo")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if fields := strings.Fields(line); len(fields) > 4 {
				out[unescapeMountPath(fields[4])] = true
			}
		}
	}
	return out
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
