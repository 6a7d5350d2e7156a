// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
)

// startProbe starts the readiness probe of a container that just started. Liveness and startup
// probes are ignored: a container without a readiness probe is ready while it runs.
func (w *podWorker) startProbe(c *container) {
	p := c.spec.ReadinessProbe
	c.probe = new(atomic.Bool) // this run's result; a previous run's prober may still write its own
	if p == nil {
		return
	}
	if p.GRPC != nil {
		klog.InfoS("gRPC readiness probes are not supported; the container counts as ready", "pod", w.ref, "container", c.spec.Name)
		c.probe.Store(true)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.probeStop = cancel
	go w.probeLoop(ctx, c.spec, *p, c.proc.pid, c.env, c.probe)
}

// probeLoop probes every periodSeconds after initialDelaySeconds; successThreshold passes in a
// row make the container ready, failureThreshold failures in a row unready.
func (w *podWorker) probeLoop(ctx context.Context, c v1.Container, p v1.Probe, pid int, env []string, ready *atomic.Bool) {
	period := seconds(p.PeriodSeconds, 10)
	timeout := seconds(p.TimeoutSeconds, 1)
	successes, failures := int32(0), int32(0)
	timer := time.NewTimer(seconds(p.InitialDelaySeconds, 0))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		err := w.probeOnce(ctx, &c, &p, pid, env, timeout)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			successes, failures = successes+1, 0
		} else {
			successes, failures = 0, failures+1
			klog.V(2).InfoS("Readiness probe failed", "pod", w.ref, "container", c.Name, "err", err)
		}
		switch {
		case !ready.Load() && successes >= max(p.SuccessThreshold, 1):
			ready.Store(true)
			w.poke()
		case ready.Load() && failures >= max(p.FailureThreshold, 1):
			ready.Store(false)
			w.poke()
		}
		timer.Reset(period)
	}
}

func (w *podWorker) probeOnce(ctx context.Context, c *v1.Container, p *v1.Probe, pid int, env []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	host := w.k.cfg.NodeIP // the pod's IP
	switch {
	case p.Exec != nil:
		if len(p.Exec.Command) == 0 {
			return fmt.Errorf("exec probe without a command")
		}
		argv := p.Exec.Command
		// In the container's mount namespace when possible (it needs root), else on the host.
		if nsenter, err := exec.LookPath("nsenter"); err == nil && os.Geteuid() == 0 {
			argv = append([]string{nsenter, "--target", strconv.Itoa(pid), "--mount", "--"}, argv...)
		} else if path, err := lookPath(argv[0], envValue(env, "PATH")); err == nil {
			argv = append([]string{path}, argv[1:]...)
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = env
		cmd.WaitDelay = time.Second
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	case p.TCPSocket != nil:
		if p.TCPSocket.Host != "" {
			host = p.TCPSocket.Host
		}
		port, err := probePort(p.TCPSocket.Port, c)
		if err != nil {
			return err
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case p.HTTPGet != nil:
		g := p.HTTPGet
		if g.Host != "" {
			host = g.Host
		}
		port, err := probePort(g.Port, c)
		if err != nil {
			return err
		}
		scheme := "http"
		if g.Scheme == v1.URISchemeHTTPS {
			scheme = "https"
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), g.Path), nil)
		if err != nil {
			return err
		}
		for _, h := range g.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		// As the kubelet: HTTPS probes do not verify the certificate.
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe returned %d", resp.StatusCode)
		}
		return nil
	}
	return fmt.Errorf("the probe has no handler")
}

// probePort resolves a probe's port, a number or the name of one of the container's ports.
func probePort(port intstr.IntOrString, c *v1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("container %q has no port named %q", c.Name, port.StrVal)
}

func seconds(s int32, def int) time.Duration {
	if s <= 0 {
		return time.Duration(def) * time.Second
	}
	return time.Duration(s) * time.Second
}
