// SPDX-License-Identifier: Apache-2.0

// Command regroup-kubelet stands in for a kubelet in Regroup's local test clusters: it registers a
// Node, heartbeats it, and runs the pods bound to it as plain processes that share the node's
// network (each test node is a network namespace the harness starts this process in). Each
// container gets its own mount namespace, where the pod's volumes and /etc/hosts are bind-mounted.
//
//	regroup-kubelet --kubeconfig K --node-name N --node-ip IP [--capacity cpu=8,pods=4] [--labels k=v]
//	    [--root DIR] [--images FILE] [--heartbeat 2s] [--sync 1s] [--static-pod FILE]...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// initArg as argv[1] makes this binary a container's init (init.go) instead of the kubelet.
const initArg = "__container-init"

// Image says how an image reference runs on this machine (an entry of the --images file).
type Image struct {
	Env        map[string]string `json:"env"`
	WorkingDir string            `json:"workingDir"`
	Entrypoint []string          `json:"entrypoint"`
}

// Config is everything the kubelet is told on its command line.
type Config struct {
	NodeName   string
	NodeIP     string
	Capacity   v1.ResourceList
	Labels     map[string]string
	Root       string
	Images     map[string]Image
	ImagesFile string
	Heartbeat  time.Duration
	Sync       time.Duration
	StaticPods []*v1.Pod
	// APIHost and APIPort are what pods get as KUBERNETES_SERVICE_HOST and _PORT.
	APIHost, APIPort string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == initArg {
		containerInit(os.Args[2:]) // never returns
	}
	cfg, kubeconfig, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "regroup-kubelet: %v\n", err)
		os.Exit(2)
	}
	rest, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "regroup-kubelet: --kubeconfig %s: %v\n", kubeconfig, err)
		os.Exit(2)
	}
	if cfg.APIHost, cfg.APIPort, err = serviceAddress(rest.Host); err != nil {
		fmt.Fprintf(os.Stderr, "regroup-kubelet: --kubeconfig %s: %v\n", kubeconfig, err)
		os.Exit(2)
	}
	rest.QPS, rest.Burst = 50, 100
	rest.UserAgent = "regroup-kubelet/" + cfg.NodeName
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		fmt.Fprintf(os.Stderr, "regroup-kubelet: --kubeconfig %s: %v\n", kubeconfig, err)
		os.Exit(2)
	}
	// SIGTERM and SIGINT stop every pod's processes and exit 0; SIGKILL is a node fault.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := NewKubelet(client, cfg).Run(ctx); err != nil {
		klog.ErrorS(err, "regroup-kubelet failed", "node", cfg.NodeName)
		klog.Flush()
		os.Exit(1)
	}
	klog.InfoS("regroup-kubelet stopped", "node", cfg.NodeName)
	klog.Flush()
}

// parseFlags reads the command line; every error names the flag it is about.
func parseFlags(args []string) (Config, string, error) {
	fs := flag.NewFlagSet("regroup-kubelet", flag.ContinueOnError)
	klog.InitFlags(fs)
	var (
		cfg                    = Config{Capacity: defaultCapacity(), Labels: map[string]string{}}
		kubeconfig, imagesFile string
		staticFiles            stringList
	)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server (required)")
	fs.StringVar(&cfg.NodeName, "node-name", "", "name of the Node to register (required)")
	fs.StringVar(&cfg.NodeIP, "node-ip", "", "the node's IP, also every pod's IP (required)")
	fs.Var((*resourceListFlag)(&cfg.Capacity), "capacity", "resources, e.g. cpu=8,memory=32Gi,pods=4,huawei.com/Ascend910=8 (default: this machine's CPUs and memory, 110 pods)")
	fs.Var((*labelsFlag)(&cfg.Labels), "labels", "node labels k=v,k2=v2 (kubernetes.io/hostname and kubernetes.io/os are always set)")
	fs.StringVar(&cfg.Root, "root", "", "directory for pod directories, volumes and logs (default $TMPDIR/regroup-kubelet/<node-name>)")
	fs.StringVar(&imagesFile, "images", "", `JSON file mapping image references to {"env", "workingDir", "entrypoint"}; "*" matches any other image`)
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", 2*time.Second, "node status and Lease renew period")
	fs.DurationVar(&cfg.Sync, "sync", time.Second, "how often to re-check processes and retry failed API calls")
	fs.Var(&staticFiles, "static-pod", "a Pod manifest (YAML or JSON) to run as a static pod (repeatable)")
	fs.SetOutput(io.Discard) // errors are returned, naming the flag
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stderr)
			fs.PrintDefaults()
		}
		return cfg, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", fmt.Errorf("unexpected argument %q: every option is a --flag", fs.Arg(0))
	}
	for _, f := range []struct{ name, value string }{{"kubeconfig", kubeconfig}, {"node-name", cfg.NodeName}, {"node-ip", cfg.NodeIP}} {
		if f.value == "" {
			return cfg, "", fmt.Errorf("--%s is required", f.name)
		}
	}
	if errs := validation.IsDNS1123Subdomain(cfg.NodeName); len(errs) > 0 {
		return cfg, "", fmt.Errorf("--node-name %q is not a valid node name: %s", cfg.NodeName, strings.Join(errs, "; "))
	}
	if net.ParseIP(cfg.NodeIP) == nil {
		return cfg, "", fmt.Errorf("--node-ip %q is not an IP address", cfg.NodeIP)
	}
	if cfg.Heartbeat <= 0 {
		return cfg, "", fmt.Errorf("--heartbeat %v must be positive", cfg.Heartbeat)
	}
	if cfg.Sync <= 0 {
		return cfg, "", fmt.Errorf("--sync %v must be positive", cfg.Sync)
	}
	if cfg.Root == "" {
		cfg.Root = filepath.Join(os.TempDir(), "regroup-kubelet", cfg.NodeName)
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return cfg, "", fmt.Errorf("--root %q: %v", cfg.Root, err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return cfg, "", fmt.Errorf("--root %q cannot be created: %v", cfg.Root, err)
	}
	cfg.Root = root
	cfg.Images, cfg.ImagesFile = map[string]Image{}, imagesFile
	if imagesFile != "" {
		if cfg.Images, err = readImages(imagesFile); err != nil {
			return cfg, "", fmt.Errorf("--images %s: %v", imagesFile, err)
		}
	}
	for _, f := range staticFiles {
		pod, err := readStaticPod(f, cfg.NodeName)
		if err != nil {
			return cfg, "", fmt.Errorf("--static-pod %s: %v", f, err)
		}
		cfg.StaticPods = append(cfg.StaticPods, pod)
	}
	return cfg, kubeconfig, nil
}

func readImages(path string) (map[string]Image, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	images := map[string]Image{}
	if err := dec.Decode(&images); err != nil {
		return nil, fmt.Errorf(`not a JSON object of image -> {"env": {...}, "workingDir": "...", "entrypoint": [...]}: %v`, err)
	}
	return images, nil
}

// serviceAddress turns the API server's URL into the host and port in-pod clients dial.
func serviceAddress(server string) (string, string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Hostname() == "" {
		return "", "", fmt.Errorf("the server URL %q has no host", server)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80"}[u.Scheme]
		if port == "" {
			port = "443"
		}
	}
	return u.Hostname(), port, nil
}

func defaultCapacity() v1.ResourceList {
	list := v1.ResourceList{
		v1.ResourceCPU:  *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		v1.ResourcePods: *resource.NewQuantity(110, resource.DecimalSI),
	}
	var info syscall.Sysinfo_t
	if syscall.Sysinfo(&info) == nil {
		list[v1.ResourceMemory] = *resource.NewQuantity(int64(info.Totalram)*int64(info.Unit), resource.BinarySI)
	}
	return list
}

// resourceListFlag parses cpu=8,memory=32Gi,...; the names given replace the defaults.
type resourceListFlag v1.ResourceList

func (f *resourceListFlag) String() string { return "" }
func (f *resourceListFlag) Set(s string) error {
	list := v1.ResourceList(*f)
	for _, kv := range splitList(s) {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return fmt.Errorf("%q is not name=quantity", kv)
		}
		if errs := validation.IsQualifiedName(name); len(errs) > 0 {
			return fmt.Errorf("resource name %q: %s", name, strings.Join(errs, "; "))
		}
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return fmt.Errorf("resource %s: quantity %q: %v", name, value, err)
		}
		list[v1.ResourceName(name)] = q
	}
	return nil
}

type labelsFlag map[string]string

func (f *labelsFlag) String() string { return "" }
func (f *labelsFlag) Set(s string) error {
	for _, kv := range splitList(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", kv)
		}
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("label %s value %q: %s", k, v, strings.Join(errs, "; "))
		}
		(*f)[k] = v
	}
	return nil
}

type stringList []string

func (f *stringList) String() string     { return strings.Join(*f, ",") }
func (f *stringList) Set(s string) error { *f = append(*f, s); return nil }

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// errorString is the message of err, or "" for nil.
func errorString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
