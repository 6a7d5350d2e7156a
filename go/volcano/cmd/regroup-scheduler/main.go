// SPDX-License-Identifier: Apache-2.0

// Command regroup-scheduler is Volcano's scheduler (vc-scheduler, the same release as
// go/volcano's go.mod) with Regroup's plugin registered as "regroup". It takes vc-scheduler's
// flags; name the plugin in the --scheduler-conf file (deploy/helm/regroup/files/volcano-scheduler.conf).
//
// It is built with cgo and links libregroup.so (the engine and the coordinator): stock Volcano
// images are built without cgo, so a Go-plugin .so cannot be loaded into them, hence this build.
// The coordinator starts with the first scheduling session, which Volcano runs only in the
// elected leader, and ends with the process (Volcano exits when it loses the lease).
package main

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/spf13/pflag"
	_ "go.uber.org/automaxprocs"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	cliflag "k8s.io/component-base/cli/flag"
	componentbaseoptions "k8s.io/component-base/config/options"
	"k8s.io/klog/v2"

	"volcano.sh/volcano/cmd/scheduler/app"
	"volcano.sh/volcano/cmd/scheduler/app/options"
	"volcano.sh/volcano/pkg/scheduler/framework"
	commonutil "volcano.sh/volcano/pkg/util"
	"volcano.sh/volcano/pkg/version"

	// Volcano's actions and plugins, as vc-scheduler registers them.
	_ "volcano.sh/volcano/pkg/scheduler/actions"
	_ "volcano.sh/volcano/pkg/scheduler/plugins"
	_ "volcano.sh/volcano/pkg/scheduler/util/assert"

	"github.com/regroup-dev/regroup/go/regroup"
	regroupplugin "github.com/regroup-dev/regroup/go/volcano"
)

var logFlushFreq = pflag.Duration("log-flush-frequency", 5*time.Second, "Maximum number of seconds between log flushes")

func main() {
	runtime.GOMAXPROCS(runtime.NumCPU())
	klog.InitFlags(nil)

	fs := pflag.CommandLine
	s := options.NewServerOption()
	s.AddFlags(fs)
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	commonutil.LeaderElectionDefault(&s.LeaderElection)
	s.LeaderElection.ResourceName = commonutil.GenerateComponentName(s.SchedulerNames)
	componentbaseoptions.BindLeaderElectionFlags(&s.LeaderElection, fs)
	s.RegisterOptions()
	pflag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: %s [flags]\n\nVolcano's scheduler with Regroup's %q plugin "+
			"(name it in --scheduler-conf, beside gang).\n\nFlags:\n%s", os.Args[0],
			regroupplugin.PluginName, fs.FlagUsages())
	}
	for _, a := range os.Args[1:] {
		if a == "-h" || a == "--help" || a == "-help" {
			pflag.Usage() // and exit 0 (pflag's own --help exits 2)
			os.Exit(0)
		}
		if a == "--" {
			break
		}
	}
	cliflag.InitFlags()

	if s.PrintVersion {
		lib, err := regroup.LibraryVersion()
		if err != nil {
			lib = err.Error()
		}
		fmt.Printf("libregroup: %s\n", lib)
		version.PrintVersionAndExit()
		return
	}
	// Refuse a library of the wrong ABI before taking the lease, not at the first session.
	if _, err := regroup.LibraryVersion(); err != nil {
		fmt.Fprintf(os.Stderr, "regroup-scheduler: %v\n", err)
		os.Exit(1)
	}
	framework.RegisterPluginBuilder(regroupplugin.PluginName, regroupplugin.New)

	if err := s.CheckOptionOrDie(); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
	if s.CaCertFile != "" && s.CertFile != "" && s.KeyFile != "" {
		if err := s.ParseCAFiles(nil); err != nil {
			klog.Fatalf("Failed to parse CA file: %v", err)
		}
	}

	klog.StartFlushDaemon(*logFlushFreq)
	defer klog.Flush()

	if err := app.Run(s); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
}
