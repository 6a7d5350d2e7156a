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

{{/* Volcano's scheduler configuration: files/volcano-scheduler.conf; with
coordinator.requireManagerCertificates the coordinator's client CA (regroup.tlsClientCaFile, the
ca.crt of its TLS Secret) on the line after its key, and with coordinator.leaseMs the managers'
lease (regroup.leaseMs) after that. */}}
{{- define "regroup.schedulerConf" -}}
{{- $conf := .Files.Get "files/volcano-scheduler.conf" -}}
{{- $key := "regroup.tlsKeyFile: /etc/regroup/tls/tls.key" -}}
{{- if not (contains $key $conf) -}}
{{- fail (printf "files/volcano-scheduler.conf has no line %q to add the coordinator's options after" $key) -}}
{{- end -}}
{{- $more := "" -}}
{{- if .Values.coordinator.requireManagerCertificates -}}
{{- $more = printf "%s\n      regroup.tlsClientCaFile: /etc/regroup/tls/ca.crt" $more -}}
{{- end -}}
{{- $given := .Values.coordinator.leaseMs -}}
{{- if not (kindIs "invalid" $given) -}}
{{- $lease := int64 $given -}}
{{- if or (not (regexMatch "^[0-9]+$" (toString $given))) (lt $lease 1) (gt $lease 600000) -}}
{{- fail (printf "coordinator.leaseMs: %v is not a lease: give whole milliseconds from 1 to 600000" $given) -}}
{{- end -}}
{{- $more = printf "%s\n      regroup.leaseMs: %d" $more $lease -}}
{{- end -}}
{{- $conf = replace $key (printf "%s%s" $key $more) $conf -}}
{{- $conf -}}
{{- end -}}
