// SPDX-License-Identifier: Apache-2.0

// Package monitoring checks the chart's Prometheus alert rules and Grafana dashboard
// (deploy/helm/regroup/files) as promtool would: each rule file parses with Prometheus's own rule
// format reader and every expression with its PromQL parser; and every metric they name is one
// the manager serves, as docs/operations.md's table lists them (with a histogram's _bucket, _sum
// and _count series).
package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

var root = filepath.Join("..", "..")

// Prometheus's own series, which the rules may name beside the manager's.
var prometheusOwn = map[string]bool{"up": true}

// The metrics of docs/operations.md's table, and their types.
func documented(t *testing.T) map[string]string {
	text, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(regroup_[a-z_]+)` \\| (gauge|counter|histogram) \\|")
	names := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(text), -1) {
		names[m[1]] = m[2]
	}
	if len(names) < 10 {
		t.Fatalf("docs/operations.md: found %d metrics in its table, expected the whole table", len(names))
	}
	return names
}

// The metric names an expression selects.
func metricsOf(t *testing.T, where, expr string) []string {
	parsed, err := parser.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", where, expr, err)
		return nil
	}
	var names []string
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		if v, ok := node.(*parser.VectorSelector); ok {
			names = append(names, v.Name)
		}
		return nil
	})
	return names
}

func checkName(t *testing.T, where, name string, table map[string]string) {
	if prometheusOwn[name] {
		return
	}
	if _, ok := table[name]; ok {
		return
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base := strings.TrimSuffix(name, suffix); base != name && table[base] == "histogram" {
			return
		}
	}
	t.Errorf("%s: metric %q is not in docs/operations.md's table (not served by the manager)", where, name)
}

func TestAlertRulesParseAndNameOnlyServedMetrics(t *testing.T) {
	table := documented(t)
	file := filepath.Join(root, "deploy", "helm", "regroup", "files", "regroup-alerts.yaml")
	groups, errs := rulefmt.ParseFile(file)
	for _, err := range errs {
		t.Errorf("%s: %v", file, err)
	}
	if groups == nil {
		t.Fatalf("%s: no rule groups", file)
	}
	alerts := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert.Value] = true
			names := metricsOf(t, r.Alert.Value, r.Expr.Value)
			if len(names) == 0 {
				t.Errorf("%s: names no metric", r.Alert.Value)
			}
			for _, name := range names {
				checkName(t, r.Alert.Value, name, table)
			}
		}
	}
	for _, want := range []string{"RegroupJobStopped", "RegroupRecoveriesRepeating", "RegroupNoCommit",
		"RegroupManagerDown"} {
		if !alerts[want] {
			t.Errorf("%s: no alert %s", file, want)
		}
	}
}

func TestDashboardQueriesParseAndNameOnlyServedMetrics(t *testing.T) {
	table := documented(t)
	file := filepath.Join(root, "deploy", "helm", "regroup", "files", "regroup-dashboard.json")
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(text, &dashboard); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	// Grafana's variables are not PromQL: $job stands for a regular expression of job names.
	vars := strings.NewReplacer("$job", "a.*", "${datasource}", "x")
	seen := map[string]bool{}
	for _, p := range dashboard.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", file, p.Title)
		}
		for _, target := range p.Targets {
			for _, name := range metricsOf(t, p.Title, vars.Replace(target.Expr)) {
				checkName(t, p.Title, name, table)
				seen[strings.TrimSuffix(name, "_bucket")] = true
			}
		}
	}
	for _, histogram := range []string{"regroup_recovery_seconds", "regroup_vote_round_trip_seconds",
		"regroup_fault_detection_seconds"} {
		if !seen[histogram] {
			t.Errorf("%s: no panel shows %s", file, histogram)
		}
	}
}
