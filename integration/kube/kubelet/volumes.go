// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// defaultFileMode is the mode of secret, configMap, downwardAPI and projected files without one.
const defaultFileMode = 0o644

// podDir is where the pod's volumes, hosts file, container logs and init specs live.
func (k *Kubelet) podDir(pod *v1.Pod) string {
	return filepath.Join(k.cfg.Root, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID))
}

// volumeFile is one file of a secret, configMap, downwardAPI or projected volume.
type volumeFile struct {
	data []byte
	mode os.FileMode
}

// materializeVolumes writes every volume of pod under dir/volumes/<name> (hostPath volumes are
// checked or created in place). It returns when the soonest service account token should be
// renewed (80% of its lifetime, as the kubelet does), zero when there is none. A *specError is a
// volume this kubelet can never provide; other errors (a missing Secret) are worth a retry.
func (k *Kubelet) materializeVolumes(ctx context.Context, pod *v1.Pod, dir string) (time.Time, error) {
	objs := newObjectCache(k, pod.Namespace)
	var refresh time.Time
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		path := filepath.Join(dir, "volumes", v.Name)
		files := map[string]volumeFile{}
		var err error
		switch {
		case v.EmptyDir != nil:
			// medium Memory is a plain directory too; sizeLimit is not enforced.
			if _, err = os.Stat(path); os.IsNotExist(err) {
				if err = os.MkdirAll(path, 0o777); err == nil {
					err = os.Chmod(path, 0o777) // past the umask
				}
			}
			if err != nil {
				return refresh, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			continue
		case v.HostPath != nil:
			if err := prepareHostPath(v.HostPath); err != nil {
				return refresh, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			continue
		case v.Secret != nil:
			err = k.secretFiles(ctx, objs, v.Secret.SecretName, v.Secret.Items, fileMode(v.Secret.DefaultMode), ptrTrue(v.Secret.Optional), files)
		case v.ConfigMap != nil:
			err = k.configMapFiles(ctx, objs, v.ConfigMap.Name, v.ConfigMap.Items, fileMode(v.ConfigMap.DefaultMode), ptrTrue(v.ConfigMap.Optional), files)
		case v.DownwardAPI != nil:
			err = k.downwardAPIFiles(pod, v.DownwardAPI.Items, fileMode(v.DownwardAPI.DefaultMode), files)
		case v.Projected != nil:
			var expires time.Time
			expires, err = k.projectedFiles(ctx, pod, objs, v.Projected, files)
			if !expires.IsZero() && (refresh.IsZero() || expires.Before(refresh)) {
				refresh = expires
			}
		default:
			return refresh, specErrorf("volume %q is a %s volume, which regroup-kubelet does not support (it supports secret, configMap, emptyDir, downwardAPI, projected and hostPath)", v.Name, volumeKind(v))
		}
		if err != nil {
			return refresh, fmt.Errorf("volume %q: %w", v.Name, err)
		}
		if err := writeVolume(path, files); err != nil {
			return refresh, fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	return refresh, nil
}

// volumeSource is the host path a volume mount binds: the volume's directory, or a hostPath.
func (k *Kubelet) volumeSource(pod *v1.Pod, dir, name string) (string, *v1.Volume, bool) {
	for i := range pod.Spec.Volumes {
		if v := &pod.Spec.Volumes[i]; v.Name == name {
			if v.HostPath != nil {
				return v.HostPath.Path, v, true
			}
			return filepath.Join(dir, "volumes", name), v, true
		}
	}
	return "", nil, false
}

func (k *Kubelet) secretFiles(ctx context.Context, objs *objectCache, name string, items []v1.KeyToPath, mode os.FileMode, optional bool, out map[string]volumeFile) error {
	s, err := objs.secret(ctx, name, optional)
	if err != nil || s == nil {
		return err
	}
	return project("secret "+objs.ns+"/"+name, s.Data, items, mode, optional, out)
}

func (k *Kubelet) configMapFiles(ctx context.Context, objs *objectCache, name string, items []v1.KeyToPath, mode os.FileMode, optional bool, out map[string]volumeFile) error {
	cm, err := objs.configMap(ctx, name, optional)
	if err != nil || cm == nil {
		return err
	}
	data := map[string][]byte{}
	for key, v := range cm.Data {
		data[key] = []byte(v)
	}
	for key, v := range cm.BinaryData {
		data[key] = v
	}
	return project("configmap "+objs.ns+"/"+name, data, items, mode, optional, out)
}

// project lays keys out as files: every key under its own name, or only the items given.
func project(what string, data map[string][]byte, items []v1.KeyToPath, mode os.FileMode, optional bool, out map[string]volumeFile) error {
	if len(items) == 0 {
		for key, v := range data {
			out[key] = volumeFile{v, mode}
		}
		return nil
	}
	for _, item := range items {
		v, ok := data[item.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("%s has no key %q", what, item.Key)
		}
		out[item.Path] = volumeFile{v, fileModeOr(item.Mode, mode)}
	}
	return nil
}

func (k *Kubelet) downwardAPIFiles(pod *v1.Pod, items []v1.DownwardAPIVolumeFile, mode os.FileMode, out map[string]volumeFile) error {
	for _, item := range items {
		var v string
		var err error
		switch {
		case item.FieldRef != nil:
			v, err = podFieldValue(pod, item.FieldRef.FieldPath, k.cfg.NodeIP)
		case item.ResourceFieldRef != nil:
			v, err = resourceFieldValue(item.ResourceFieldRef, pod, "", k.cfg.Capacity)
		default:
			err = specErrorf("downwardAPI item %q has neither a fieldRef nor a resourceFieldRef", item.Path)
		}
		if err != nil {
			return err
		}
		out[item.Path] = volumeFile{[]byte(v), fileModeOr(item.Mode, mode)}
	}
	return nil
}

// projectedFiles lays out a projected volume; it returns when its soonest token should be renewed.
func (k *Kubelet) projectedFiles(ctx context.Context, pod *v1.Pod, objs *objectCache, p *v1.ProjectedVolumeSource, out map[string]volumeFile) (time.Time, error) {
	var refresh time.Time
	mode := fileMode(p.DefaultMode)
	for _, src := range p.Sources {
		var err error
		switch {
		case src.Secret != nil:
			err = k.secretFiles(ctx, objs, src.Secret.Name, src.Secret.Items, mode, ptrTrue(src.Secret.Optional), out)
		case src.ConfigMap != nil:
			err = k.configMapFiles(ctx, objs, src.ConfigMap.Name, src.ConfigMap.Items, mode, ptrTrue(src.ConfigMap.Optional), out)
		case src.DownwardAPI != nil:
			err = k.downwardAPIFiles(pod, src.DownwardAPI.Items, mode, out)
		case src.ServiceAccountToken != nil:
			var token []byte
			var renew time.Time
			token, renew, err = k.serviceAccountToken(ctx, pod, src.ServiceAccountToken)
			if err == nil {
				out[src.ServiceAccountToken.Path] = volumeFile{token, mode}
				if refresh.IsZero() || renew.Before(refresh) {
					refresh = renew
				}
			}
		default:
			err = specErrorf("a projected source other than secret, configMap, downwardAPI and serviceAccountToken (%s) is not supported by regroup-kubelet", projectedKind(&src))
		}
		if err != nil {
			return refresh, err
		}
	}
	return refresh, nil
}

// serviceAccountToken asks the TokenRequest API for a token bound to the pod, as the kubelet
// does for a projected serviceAccountToken source (the API server's default audience when the
// source names none). It returns the token and when to renew it.
func (k *Kubelet) serviceAccountToken(ctx context.Context, pod *v1.Pod, src *v1.ServiceAccountTokenProjection) ([]byte, time.Time, error) {
	expiration := int64(3600)
	if src.ExpirationSeconds != nil {
		expiration = *src.ExpirationSeconds
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(expiration),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	start := time.Now()
	tr, err := k.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("requesting a token for service account %s/%s: %w", pod.Namespace, sa, err)
	}
	lifetime := time.Duration(expiration) * time.Second
	if !tr.Status.ExpirationTimestamp.IsZero() {
		lifetime = tr.Status.ExpirationTimestamp.Sub(start)
	}
	return []byte(tr.Status.Token), start.Add(lifetime * 8 / 10), nil
}

// prepareHostPath checks a hostPath volume's type, creating the path for the *OrCreate types.
func prepareHostPath(h *v1.HostPathVolumeSource) error {
	typ := v1.HostPathUnset
	if h.Type != nil {
		typ = *h.Type
	}
	switch typ {
	case v1.HostPathDirectoryOrCreate:
		return os.MkdirAll(h.Path, 0o755)
	case v1.HostPathFileOrCreate:
		if err := os.MkdirAll(filepath.Dir(h.Path), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(h.Path, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	case v1.HostPathUnset:
		return nil
	}
	fi, err := os.Stat(h.Path)
	if err != nil {
		return fmt.Errorf("hostPath %s (type %s): %w", h.Path, typ, err)
	}
	if typ == v1.HostPathDirectory && !fi.IsDir() || typ == v1.HostPathFile && !fi.Mode().IsRegular() {
		return fmt.Errorf("hostPath %s is not a %s", h.Path, typ)
	}
	return nil
}

// writeVolume writes files under dir. Each file is written beside its final name and renamed
// into place, so a reader (the container sees the directory bind-mounted) never sees half a file.
func writeVolume(dir string, files map[string]volumeFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for rel, f := range files {
		if err := checkRelative(rel); err != nil {
			return specErrorf("file path %q: %v", rel, err)
		}
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		tmp := filepath.Join(filepath.Dir(path), ".tmp."+filepath.Base(path))
		if err := os.WriteFile(tmp, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(tmp, f.mode); err != nil { // past the umask
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return nil
}

// checkRelative rejects absolute paths and paths with a ".." element (as API validation does).
func checkRelative(rel string) error {
	if rel == "" || filepath.IsAbs(rel) {
		return fmt.Errorf("must be a non-empty relative path")
	}
	for _, part := range strings.Split(rel, "/") {
		if part == ".." {
			return fmt.Errorf("must not contain '..'")
		}
	}
	return nil
}

// fileMode is a volume's defaultMode, 0644 when unset.
func fileMode(m *int32) os.FileMode { return fileModeOr(m, defaultFileMode) }

// fileModeOr is an item's mode, else the volume's.
func fileModeOr(m *int32, def os.FileMode) os.FileMode {
	if m != nil {
		return os.FileMode(*m)
	}
	return def
}

// volumeKind is the JSON name of the volume's source (hostPath, nfs, persistentVolumeClaim, ...).
func volumeKind(v *v1.Volume) string { return setField(reflect.ValueOf(v.VolumeSource)) }

func projectedKind(p *v1.VolumeProjection) string { return setField(reflect.ValueOf(*p)) }

func setField(s reflect.Value) string {
	for i := 0; i < s.NumField(); i++ {
		if f := s.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(s.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return "unknown"
}
