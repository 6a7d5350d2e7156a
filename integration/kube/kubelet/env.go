// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// defaultPath is the PATH of an image entry that sets none (containerd's default).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// specError is a pod spec this kubelet can never run: the pod fails with its message. Every other
// error while starting a container is retried on the next sync.
type specError struct{ msg string }

func (e *specError) Error() string { return e.msg }

func specErrorf(format string, args ...any) error { return &specError{fmt.Sprintf(format, args...)} }

// envList is an ordered environment: setting a name again replaces its value in place.
type envList struct {
	names  []string
	values map[string]string
}

func (e *envList) set(name, value string) {
	if e.values == nil {
		e.values = map[string]string{}
	}
	if _, ok := e.values[name]; !ok {
		e.names = append(e.names, name)
	}
	e.values[name] = value
}

func (e *envList) strings() []string {
	out := make([]string, len(e.names))
	for i, n := range e.names {
		out[i] = n + "=" + e.values[n]
	}
	return out
}

// containerEnv returns the container's environment and the variables its command and args may
// reference. The environment is, later entries winning: the image entry's env, HOSTNAME, the API
// server's service variables, envFrom, env. As in Kubernetes, $(VAR) in env values and in
// command/args sees only envFrom, earlier env entries and the service variables, not the image's.
func (k *Kubelet) containerEnv(ctx context.Context, pod *v1.Pod, c *v1.Container, img Image, objs *objectCache) (*envList, map[string]string, error) {
	env := &envList{}
	imageNames := make([]string, 0, len(img.Env))
	for n := range img.Env {
		imageNames = append(imageNames, n)
	}
	sort.Strings(imageNames)
	for _, n := range imageNames {
		env.set(n, img.Env[n])
	}
	if _, ok := img.Env["PATH"]; !ok {
		env.set("PATH", defaultPath)
	}
	env.set("HOSTNAME", podHostname(pod))

	service := map[string]string{}
	if k.cfg.APIHost != "" {
		service = map[string]string{
			"KUBERNETES_SERVICE_HOST":       k.cfg.APIHost,
			"KUBERNETES_SERVICE_PORT":       k.cfg.APIPort,
			"KUBERNETES_SERVICE_PORT_HTTPS": k.cfg.APIPort,
			"KUBERNETES_PORT":               "tcp://" + net.JoinHostPort(k.cfg.APIHost, k.cfg.APIPort),
		}
	}
	spec := &envList{} // envFrom and env, in order
	for _, from := range c.EnvFrom {
		data, err := envFromData(ctx, c, &from, objs)
		if err != nil {
			return nil, nil, err
		}
		keys := make([]string, 0, len(data))
		for key := range data {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			spec.set(from.Prefix+key, data[key])
		}
	}
	for _, e := range c.Env {
		value := e.Value
		switch {
		case e.Value != "":
			value = expansion.Expand(e.Value, expansion.MappingFuncFor(spec.values, service))
		case e.ValueFrom != nil:
			v, ok, err := k.envValueFrom(ctx, pod, c, e.ValueFrom, objs)
			if err != nil {
				return nil, nil, fmt.Errorf("container %q env %s: %w", c.Name, e.Name, err)
			}
			if !ok {
				continue // an optional source that does not exist: the variable is not set
			}
			value = v
		}
		spec.set(e.Name, value)
	}

	vars := map[string]string{}
	for n, v := range service {
		env.set(n, v)
		vars[n] = v
	}
	for _, n := range spec.names {
		env.set(n, spec.values[n])
		vars[n] = spec.values[n]
	}
	return env, vars, nil
}

// envFromData is the keys of an envFrom source; none when it is optional and missing.
func envFromData(ctx context.Context, c *v1.Container, from *v1.EnvFromSource, objs *objectCache) (map[string]string, error) {
	switch {
	case from.ConfigMapRef != nil:
		cm, err := objs.configMap(ctx, from.ConfigMapRef.Name, ptrTrue(from.ConfigMapRef.Optional))
		if err != nil || cm == nil {
			return nil, err
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		s, err := objs.secret(ctx, from.SecretRef.Name, ptrTrue(from.SecretRef.Optional))
		if err != nil || s == nil {
			return nil, err
		}
		data := map[string]string{}
		for key, v := range s.Data {
			data[key] = string(v)
		}
		return data, nil
	}
	return nil, specErrorf("container %q: an envFrom entry names neither a configMapRef nor a secretRef", c.Name)
}

// envValueFrom resolves one valueFrom; ok is false for an optional key or object that is missing.
func (k *Kubelet) envValueFrom(ctx context.Context, pod *v1.Pod, c *v1.Container, from *v1.EnvVarSource, objs *objectCache) (string, bool, error) {
	switch {
	case from.FieldRef != nil:
		v, err := podFieldValue(pod, from.FieldRef.FieldPath, k.cfg.NodeIP)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := resourceFieldValue(from.ResourceFieldRef, pod, c.Name, k.cfg.Capacity)
		return v, err == nil, err
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := objs.secret(ctx, ref.Name, ptrTrue(ref.Optional))
		if err != nil || s == nil {
			return "", false, err
		}
		v, ok := s.Data[ref.Key]
		if !ok && !ptrTrue(ref.Optional) {
			return "", false, fmt.Errorf("secret %s/%s has no key %q", pod.Namespace, ref.Name, ref.Key)
		}
		return string(v), ok, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := objs.configMap(ctx, ref.Name, ptrTrue(ref.Optional))
		if err != nil || cm == nil {
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !ptrTrue(ref.Optional) {
			return "", false, fmt.Errorf("configmap %s/%s has no key %q", pod.Namespace, ref.Name, ref.Key)
		}
		return v, ok, nil
	}
	return "", false, specErrorf("container %q: a valueFrom names no source regroup-kubelet supports (fieldRef, resourceFieldRef, secretKeyRef, configMapKeyRef)", c.Name)
}

// expandCommand applies Kubernetes' $(VAR) expansion to the container's command and args and
// returns the argv to run; an empty command takes the image entry's entrypoint.
func expandCommand(c *v1.Container, img Image, imageName string, vars map[string]string) ([]string, error) {
	mapping := expansion.MappingFuncFor(vars)
	var argv []string
	if len(c.Command) > 0 {
		for _, s := range c.Command {
			argv = append(argv, expansion.Expand(s, mapping))
		}
	} else {
		argv = append(argv, img.Entrypoint...)
	}
	for _, s := range c.Args {
		argv = append(argv, expansion.Expand(s, mapping))
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, specErrorf("container %q has no command and the --images entry for %q has no entrypoint", c.Name, imageName)
	}
	return argv, nil
}

// podFieldValue is a downward API field of the pod; podIP is the node's IP (pods share it).
func podFieldValue(pod *v1.Pod, path, podIP string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.hostIP", "status.podIPs", "status.hostIPs":
		return podIP, nil // one IP: the list form is the comma-joined list
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if key, ok := subscript(path, prefix); ok {
			return m[key], nil
		}
	}
	return "", specErrorf("fieldRef %q is not a field regroup-kubelet supports", path)
}

// subscript returns key for path "prefix['key']" (the downward API's map subscript syntax).
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"[")
	if !ok || !strings.HasSuffix(rest, "]") {
		return "", false
	}
	rest = strings.TrimSuffix(rest, "]")
	if len(rest) >= 2 && (rest[0] == '\'' || rest[0] == '"') && rest[len(rest)-1] == rest[0] {
		return rest[1 : len(rest)-1], true
	}
	return "", false
}

// formatMap renders labels or annotations as a downward API file does: key="value" lines, sorted.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, key := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%s", key, strconv.Quote(m[key]))
	}
	return b.String()
}

// resourceFieldValue is a container's limit or request in units of the divisor, rounded up as the
// kubelet does. An unset limit is the node's allocatable amount, as in Kubernetes.
func resourceFieldValue(ref *v1.ResourceFieldSelector, pod *v1.Pod, defaultContainer string, allocatable v1.ResourceList) (string, error) {
	name := ref.ContainerName
	if name == "" {
		name = defaultContainer
	}
	var c *v1.Container
	for _, list := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				c = &list[i]
			}
		}
	}
	if c == nil {
		return "", specErrorf("resourceFieldRef %s names container %q, which the pod does not have", ref.Resource, name)
	}
	kind, res, _ := strings.Cut(ref.Resource, ".")
	var q resource.Quantity
	switch kind {
	case "limits":
		var ok bool
		if q, ok = c.Resources.Limits[v1.ResourceName(res)]; !ok {
			q = allocatable[v1.ResourceName(res)]
		}
	case "requests":
		q = c.Resources.Requests[v1.ResourceName(res)]
	default:
		return "", specErrorf("resourceFieldRef %q is not limits.<resource> or requests.<resource>", ref.Resource)
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	switch v1.ResourceName(res) {
	case v1.ResourceCPU:
		return strconv.FormatInt(ceilDiv(q.MilliValue(), divisor.MilliValue()), 10), nil
	case v1.ResourceMemory, v1.ResourceEphemeralStorage:
		return strconv.FormatInt(ceilDiv(q.Value(), divisor.Value()), 10), nil
	}
	return "", specErrorf("resourceFieldRef %q: only cpu, memory and ephemeral-storage are supported", ref.Resource)
}

func ceilDiv(a, b int64) int64 {
	if b <= 0 {
		return a
	}
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

// objectCache reads the Secrets and ConfigMaps of one pod's namespace, each at most once per use.
type objectCache struct {
	k          *Kubelet
	ns         string
	secrets    map[string]*v1.Secret
	configMaps map[string]*v1.ConfigMap
}

func newObjectCache(k *Kubelet, ns string) *objectCache {
	return &objectCache{k: k, ns: ns, secrets: map[string]*v1.Secret{}, configMaps: map[string]*v1.ConfigMap{}}
}

// secret returns the named Secret; nil without error when it is missing and optional.
func (o *objectCache) secret(ctx context.Context, name string, optional bool) (*v1.Secret, error) {
	if s, ok := o.secrets[name]; ok {
		return s, nil
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	s, err := o.k.client.CoreV1().Secrets(o.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional {
			s, err = nil, nil
		} else if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("secret %q not found in namespace %s", name, o.ns)
		} else {
			return nil, fmt.Errorf("reading secret %s/%s: %w", o.ns, name, err)
		}
	}
	o.secrets[name] = s
	return s, nil
}

// configMap returns the named ConfigMap; nil without error when it is missing and optional.
func (o *objectCache) configMap(ctx context.Context, name string, optional bool) (*v1.ConfigMap, error) {
	if cm, ok := o.configMaps[name]; ok {
		return cm, nil
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	cm, err := o.k.client.CoreV1().ConfigMaps(o.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional {
			cm, err = nil, nil
		} else if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("configmap %q not found in namespace %s", name, o.ns)
		} else {
			return nil, fmt.Errorf("reading configmap %s/%s: %w", o.ns, name, err)
		}
	}
	o.configMaps[name] = cm
	return cm, nil
}

func ptrTrue(b *bool) bool { return b != nil && *b }

func podHostname(pod *v1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	return pod.Name
}
