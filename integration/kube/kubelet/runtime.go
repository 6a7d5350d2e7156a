// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// startTimeout bounds a container init's work (its mounts) before it execs the command.
const startTimeout = 10 * time.Second

// process is one run of a container: the kubelet binary re-executed as the container's init in a
// new session (and, as root, new mount and UTS namespaces), which execs the container's command under the same
// pid.
type process struct {
	pid        int
	startedAt  time.Time
	done       chan struct{} // closed once the process has exited; then exitCode and finishedAt hold
	exitCode   int32
	finishedAt time.Time
}

// startProcess runs spec as a container whose stdout and stderr append to logPath. It returns
// once the command is exec'd, or the reason it could not be (then nothing is left running).
// onExit is called, from another goroutine, after the process has exited.
func startProcess(spec *initSpec, specPath, logPath string, onExit func()) (*process, error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(specPath, data, 0o600); err != nil {
		return nil, fmt.Errorf("writing the container's init spec: %w", err)
	}
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the container's log: %w", err)
	}
	defer logFile.Close()
	// The init writes why it failed to this pipe; a successful exec closes it (close-on-exec).
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer statusR.Close()
	cmd := exec.Command("/proc/self/exe", initArg, specPath)
	cmd.Env = []string{} // the init execs the command with spec.Env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{statusW} // fd 3 in the init
	// Setsid: the container is its own session and process group, which is what gets signalled.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if spec.Isolated {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS
	}
	err = cmd.Start()
	statusW.Close()
	if err != nil {
		return nil, fmt.Errorf("starting the container's init: %w", err)
	}
	_ = statusR.SetReadDeadline(time.Now().Add(startTimeout))
	msg, readErr := io.ReadAll(statusR)
	if len(msg) > 0 || readErr != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if len(msg) == 0 {
			msg = []byte(fmt.Sprintf("the container's init did not exec its command within %v: %v", startTimeout, readErr))
		}
		return nil, errors.New(string(msg))
	}
	p := &process{pid: cmd.Process.Pid, startedAt: time.Now(), done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		p.exitCode = exitCode(cmd.ProcessState)
		p.finishedAt = time.Now()
		// What the command left behind in its process group dies with it, as a container's
		// processes die with its pid 1.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		close(p.done)
		onExit()
	}()
	return p, nil
}

// exitCode is the process's exit status; death by signal n is 128+n, as a shell reports it.
func exitCode(st *os.ProcessState) int32 {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(st.ExitCode())
}

// signal sends sig to the container's process group.
func (p *process) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = syscall.Kill(-p.pid, sig)
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitAll waits until every process has exited or the deadline passes.
func waitAll(procs []*process, deadline time.Time) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, p := range procs {
		select {
		case <-p.done:
		case <-timer.C:
			return
		}
	}
}
