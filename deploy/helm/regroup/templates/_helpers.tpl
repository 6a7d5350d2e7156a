{{/* SPDX-License-Identifier: Apache-2.0 */}}
{{- define "regroup.labels" -}}
app.kubernetes.io/name: regroup
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "regroup.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Volcano's scheduler configuration: files/volcano-scheduler.conf, and with
coordinator.requireManagerCertificates the coordinator's client CA (regroup.tlsClientCaFile, the
ca.crt of its TLS Secret) on the line after its key. */}}
{{- define "regroup.schedulerConf" -}}
{{- $conf := .Files.Get "files/volcano-scheduler.conf" -}}
{{- if .Values.coordinator.requireManagerCertificates -}}
{{- $key := "regroup.tlsKeyFile: /etc/regroup/tls/tls.key" -}}
{{- if not (contains $key $conf) -}}
{{- fail (printf "coordinator.requireManagerCertificates: files/volcano-scheduler.conf has no line %q to add the client CA after" $key) -}}
{{- end -}}
{{- $conf = replace $key (printf "%s\n      regroup.tlsClientCaFile: /etc/regroup/tls/ca.crt" $key) $conf -}}
{{- end -}}
{{- $conf -}}
{{- end -}}
