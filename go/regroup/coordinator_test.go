// SPDX-License-Identifier: Apache-2.0

package regroup

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// listening reports whether something accepts TCP connections on 127.0.0.1:port.
func listening(port int) bool {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func startCoordinator(t *testing.T, e *Engine) *Coordinator {
	t.Helper()
	c, err := StartCoordinator(e, CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "token"})
	if err != nil {
		t.Fatalf("StartCoordinator: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCoordinatorListensPublishesAndCloses(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	c := startCoordinator(t, e)
	port := c.Port()
	if port <= 0 || port > 65535 {
		t.Fatalf("Port() = %d; want the port the OS chose", port)
	}
	if !listening(port) {
		t.Fatalf("nothing listens on port %d", port)
	}
	failNode3(t, e)
	if err := c.Publish(); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Publish(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "coordinator is closed") {
		t.Errorf("Publish after Close = %v; want ErrClosed", err)
	}
	if c.Port() != 0 {
		t.Errorf("Port() after Close = %d; want 0", c.Port())
	}
	if listening(port) {
		t.Errorf("port %d still accepts connections after Close", port)
	}
}

// The coordinator's export is the engine's, with the mark of the manager's facts it holds (none
// attached here: the zero mark); StateSaved takes it back, and an unknown job is NotFound.
func TestCoordinatorExportsTheStateWithItsFactMark(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	c := startCoordinator(t, e)
	state, mark, err := c.ExportJobState(demoJob)
	if err != nil {
		t.Fatalf("ExportJobState: %v", err)
	}
	want, err := e.ExportJobState(demoJob)
	if err != nil {
		t.Fatalf("Engine.ExportJobState: %v", err)
	}
	if string(state) != string(want) {
		t.Errorf("the coordinator's export differs from the engine's:\n%s\n%s", state, want)
	}
	if mark != (FactMark{}) {
		t.Errorf("mark = %+v; want none before a manager attached", mark)
	}
	if err := c.StateSaved(demoJob, mark); err != nil {
		t.Errorf("StateSaved: %v", err)
	}
	// No manager asked for a lease: no holder waits to be stored.
	if c.SaveWanted(demoJob) || c.SaveWanted("default/nope") || (*Coordinator)(nil).SaveWanted(demoJob) {
		t.Error("SaveWanted with no lease holder chosen; want false")
	}
	if _, _, err := c.ExportJobState("default/nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ExportJobState(unknown job) = %v; want ErrNotFound", err)
	}
	c.Close()
	if _, _, err := c.ExportJobState(demoJob); !errors.Is(err, ErrClosed) {
		t.Errorf("ExportJobState after Close = %v; want ErrClosed", err)
	}
}

func TestCoordinatorRefusesWhatItCannotServe(t *testing.T) {
	e := newEngine(t, Options{})
	c := startCoordinator(t, e)
	taken := fmt.Sprintf("127.0.0.1:%d", c.Port())
	cases := []struct {
		name string
		opts CoordinatorOptions
		want string
	}{
		{"port in use", CoordinatorOptions{Listen: taken, Credential: "t"}, taken},
		{"not an address", CoordinatorOptions{Listen: "no such host:x", Credential: "t"}, "cannot listen"},
		{"certificate without key", CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "t",
			TLSCertFile: "/nonexistent/c.pem"}, "TLS"},
		{"unreadable certificate", CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "t",
			TLSCertFile: "/nonexistent/c.pem", TLSKeyFile: "/nonexistent/k.pem"}, "/nonexistent/c.pem"},
		{"NUL byte", CoordinatorOptions{Listen: "127.0.0.1:0\x00x"}, "listen address contains a NUL"},
		// named, never echoed: it is the cluster key
		{"NUL byte in the credential", CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "se\x00cret"},
			"credential contains a NUL"},
		// Open mode is asked for, never the default.
		{"no credential", CoordinatorOptions{Listen: "127.0.0.1:0"}, "no credential"},
		// A client CA alone would serve plaintext and check no manager.
		{"client CA without a certificate", CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "t",
			TLSClientCAFile: "/nonexistent/ca.pem"}, "tls_client_ca_file /nonexistent/ca.pem"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StartCoordinator(e, tc.opts)
			if got != nil {
				got.Close()
			}
			wantStatus(t, err, StatusInvalidArgument)
			if err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "cret") {
				t.Errorf("error %q echoes the credential", err)
			}
		})
	}
	open, err := StartCoordinator(e, CoordinatorOptions{Listen: "127.0.0.1:0", Insecure: true})
	if err != nil {
		t.Fatalf("an insecure coordinator asked for must start: %v", err)
	}
	open.Close()
	var nilEngine *Engine
	_, err = StartCoordinator(nilEngine, CoordinatorOptions{})
	wantStatus(t, err, StatusInvalidArgument)
	var nilCoordinator *Coordinator
	wantStatus(t, nilCoordinator.Publish(), StatusInvalidArgument)
	if nilCoordinator.Port() != 0 || nilCoordinator.Close() != nil {
		t.Error("a nil coordinator: Port() must be 0 and Close() nil")
	}
}

func TestEngineCloseClosesItsCoordinators(t *testing.T) {
	e, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := StartCoordinator(e, CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "token"})
	if err != nil {
		t.Fatal(err)
	}
	port := c.Port()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after the engine's Close = %v; want ErrClosed", err)
	}
	if listening(port) {
		t.Errorf("port %d still accepts connections after the engine's Close", port)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close after the engine's Close: %v", err)
	}
	if _, err := StartCoordinator(e, CoordinatorOptions{Listen: "127.0.0.1:0", Credential: "token"}); !errors.Is(err, ErrClosed) {
		t.Errorf("StartCoordinator on a closed engine = %v; want ErrClosed", err)
	}
}

func TestCoordinatorConcurrentPublishAndClose(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	c := startCoordinator(t, e)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 200 {
				if err := c.Publish(); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("Publish: %v", err)
					return
				}
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		<-done
	}
}
