// SPDX-License-Identifier: Apache-2.0

package regroup

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestJobHasKeys(t *testing.T) {
	for _, tc := range []struct {
		name                string
		labels, annotations map[string]string
		want                bool
	}{
		{"none", nil, nil, false},
		{"plain keys", map[string]string{"app": "x"}, map[string]string{"team": "y"}, false},
		{"a MindCluster label", map[string]string{"app": "x", "fault-scheduling": "force"}, nil, true},
		{"a MindCluster annotation", nil, map[string]string{"recover-strategy": "recover"}, true},
		{"an annotation key as a label", map[string]string{"recover-strategy": "recover"}, nil, false},
		{"a label key as an annotation", nil, map[string]string{"fault-scheduling": "force"}, false},
		{"a Regroup annotation", nil, map[string]string{"regroup.io/prefer-elastic": "true"}, true},
		{"an unknown Regroup label", map[string]string{"regroup.io/x": ""}, nil, true},
		{"the env key", map[string]string{"MINDIO_WAIT_MINDX_TIME": "5"}, map[string]string{"MINDIO_WAIT_MINDX_TIME": "5"}, false},
		{"the plugin's own state", nil, map[string]string{"scheduler.regroup.io/state": "{}"}, false},
	} {
		got, err := JobHasKeys(tc.labels, tc.annotations)
		if err != nil || got != tc.want {
			t.Errorf("%s: JobHasKeys(%v, %v) = %v, %v; want %v", tc.name, tc.labels, tc.annotations, got, err, tc.want)
		}
	}
	_, err := JobHasKeys(nil, map[string]string{"a\x00b": ""})
	if StatusOf(err) != StatusInvalidArgument || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("a name with a NUL byte: %v; want StatusInvalidArgument naming the NUL byte", err)
	}
}

const volcanoJobJSON = `{"apiVersion":"batch.volcano.sh/v1alpha1","kind":"Job",
  "metadata":{"name":"train","namespace":"ml","uid":"u7","labels":{"fault-scheduling":"force"},
    "annotations":{"recover-strategy":"recover,elastic-training","regroup.io/tensor-parallel":"2"}},
  "spec":{"minAvailable":2,"tasks":[
    {"name":"manager","replicas":1,"template":{"spec":{"containers":[{"command":["regroup-manager"]}]}}},
    {"name":"worker","replicas":2,"template":{"spec":{"containers":[{
      "resources":{"limits":{"nvidia.com/gpu":"4"}},
      "env":[{"name":"MINDIO_WAIT_MINDX_TIME","value":"60"},{"name":"HOME","value":"/root"}]}]}}}]}}`

func TestReadVolcanoJob(t *testing.T) {
	j, err := ReadVolcanoJob([]byte(volcanoJobJSON))
	if err != nil {
		t.Fatalf("ReadVolcanoJob: %v", err)
	}
	if j.Pods != 2 || j.ManagerPods != 1 || len(j.ManagerTasks) != 1 || j.ManagerTasks[0] != 0 {
		t.Errorf("read %+v; want 2 training pods, 1 manager pod, manager task [0]", j)
	}
	// min-data-parallel 1, two replicas of tp 2 in a pod of 4: one pod, and the manager's.
	if j.ElasticMinAvailable != 2 {
		t.Errorf("ElasticMinAvailable %d; want 2", j.ElasticMinAvailable)
	}
	var spec map[string]any
	if err := json.Unmarshal(j.Spec, &spec); err != nil {
		t.Fatalf("the spec is not JSON: %v", err)
	}
	if spec["id"] != "ml/train" || spec["uid"] != "u7" || spec["processes_per_pod"] != float64(4) {
		t.Errorf("spec %s; want id ml/train, uid u7, 4 processes per pod", j.Spec)
	}
	if env := spec["env"].(map[string]any); len(env) != 1 || env["MINDIO_WAIT_MINDX_TIME"] != "60" {
		t.Errorf("env %v; want only MINDIO_WAIT_MINDX_TIME", env)
	}
	// The spec is the engine's: it validates (tp 2 divides 4 processes per pod) and upserts.
	if _, err := ValidateJob(j.Spec); err != nil {
		t.Errorf("ValidateJob(the spec read): %v", err)
	}
	e := newEngine(t, Options{})
	if _, err := e.UpsertJob(j.Spec, 0); err != nil {
		t.Errorf("UpsertJob(the spec read): %v", err)
	}
}

func TestReadVolcanoJobWithoutTrainingPods(t *testing.T) {
	j, err := ReadVolcanoJob([]byte(`{"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"name":"manager"}]}}`))
	if err != nil {
		t.Fatalf("ReadVolcanoJob: %v", err)
	}
	if j.Pods != 0 || j.ManagerPods != 1 {
		t.Errorf("read %+v; want 0 training pods and 1 manager pod", j)
	}
}

func TestReadVolcanoJobRefusesWhatIsNotAVolcanoJob(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{``, "not a YAML map"},
		{`{"kind":"Pod"}`, `kind is "Pod"`},
		{`{"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"replicas":"two"}]}}`, "spec.tasks[0].replicas"},
		{`{"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"replicas":1}],"minAvailable":-2}}`, "spec.minAvailable"},
		{`{"kind": [}`, "not valid YAML"},
		{"{\"kind\":\"Job\xff\"}", "UTF-8"},
	} {
		j, err := ReadVolcanoJob([]byte(tc.doc))
		if j != nil || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadVolcanoJob(%q) = %v, %v; want StatusInvalidArgument naming %q", tc.doc, j, err, tc.want)
		}
	}
	_, err := ReadVolcanoJob(make([]byte, 4<<20+1))
	if StatusOf(err) != StatusResourceExhausted {
		t.Errorf("a 4 MiB + 1 document: %v; want StatusResourceExhausted", err)
	}
}

// The token a scheduler plugin writes for a job is the one `regroupctl token` prints (the same
// HMAC in the library), and input that could never match is refused by name.
func TestJobToken(t *testing.T) {
	a, err := JobToken("cluster-key", "team-a/llama", "uid-1")
	if err != nil || len(a) != 64 || strings.Trim(a, "0123456789abcdef") != "" {
		t.Fatalf("JobToken = %q, %v; want 64 lowercase hex digits", a, err)
	}
	if b, _ := JobToken("cluster-key", "team-a/llama", "uid-2"); b == a {
		t.Fatalf("a job created again (a new uid) must get a new token")
	}
	if c, _ := JobToken("cluster-key", "team-a/llama", "uid-1"); c != a {
		t.Fatalf("JobToken is not deterministic: %q then %q", a, c)
	}
	for _, tc := range []struct{ key, job, uid, want string }{
		{"", "a/b", "u", "the cluster key is NULL or empty"},
		{"k", "llama", "u", "job_id must be the job's NAMESPACE/NAME"},
		{"k", "a/b", "", "job_uid must be the job's metadata.uid"},
		{"k", "a/b\x00c", "u", "the job id contains a NUL byte"},
	} {
		_, err := JobToken(tc.key, tc.job, tc.uid)
		var e *Error
		if !errors.As(err, &e) || e.Status != StatusInvalidArgument || !strings.Contains(e.Message, tc.want) {
			t.Errorf("JobToken(%q, %q, %q) = %v; want InvalidArgument naming %q", tc.key, tc.job, tc.uid, err, tc.want)
		}
	}
}
