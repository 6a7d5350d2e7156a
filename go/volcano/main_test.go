// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"flag"
	"io"
	"os"
	"testing"

	"k8s.io/klog/v2"
)

// TestMain keeps the scheduler's logs out of the test output; -v=N with REGROUP_TEST_LOGS=1
// shows them.
func TestMain(m *testing.M) {
	if os.Getenv("REGROUP_TEST_LOGS") == "" {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("alsologtostderr", "false")
		_ = fs.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	}
	os.Exit(m.Run())
}
