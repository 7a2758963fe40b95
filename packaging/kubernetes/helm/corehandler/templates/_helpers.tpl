{{- define "corehandler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "corehandler.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "corehandler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "corehandler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "corehandler.labels" -}}
{{ include "corehandler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: corehandler
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "corehandler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "corehandler.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "corehandler.secretName" -}}
{{- default (printf "%s-s3" (include "corehandler.fullname" .)) .Values.credentials.secretName -}}
{{- end -}}

{{- define "corehandler.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- /*
corehandler.toml from the values: `config` by section, the named values laid over it, then what the pod's
probes and Service rely on. Rendered in key order (Go templates range over maps sorted), so the same values
give the same file and the same checksum annotation. Every value is written as JSON, which for strings,
numbers, booleans and flat lists is also TOML.
*/ -}}
{{- define "corehandler.config" -}}
{{- $config := deepCopy (.Values.config | default (dict)) -}}
{{- /* The agent's own installation (corehandler/host/agent.py STATE_DIR): `kubectl exec ... corehandler list`
     in the pod reads it too. */ -}}
{{- $_ := set $config "state_dir" "/var/lib/corehandler-agent/state" -}}
{{- $metrics := get $config "metrics" | default (dict) -}}
{{- $_ := set $metrics "enabled" true -}}
{{- $_ := set $metrics "listen" "0.0.0.0" -}}
{{- $_ := set $metrics "port" .Values.metrics.port -}}
{{- $_ := set $config "metrics" $metrics -}}
{{- if .Values.retention -}}
{{- $_ := set $config "retention" (mergeOverwrite (get $config "retention" | default (dict)) (deepCopy .Values.retention)) -}}
{{- end -}}
{{- if .Values.bucket -}}
{{- $upload := get $config "upload" | default (dict) -}}
{{- $prefix := trimAll "/" .Values.prefix -}}
{{- $_ := set $upload "url" (printf "s3://%s%s" .Values.bucket (ternary (printf "/%s" $prefix) "" (ne $prefix ""))) -}}
{{- if .Values.endpoint -}}{{- $_ := set $upload "endpoint" .Values.endpoint -}}{{- end -}}
{{- if .Values.region -}}{{- $_ := set $upload "region" .Values.region -}}{{- end -}}
{{- if .Values.recipients -}}{{- $_ := set $upload "recipients" .Values.recipients -}}{{- end -}}
{{- if .Values.fleetBudget -}}{{- $_ := set $upload "fleet_budget" (int .Values.fleetBudget) -}}{{- end -}}
{{- $_ := set $config "upload" $upload -}}
{{- end -}}
{{- /* What a crash in a pod keeps: [kubernetes], its namespaces as one list per outcome (sorted: a range over
     a map is). */ -}}
{{- $kube := get $config "kubernetes" | default (dict) -}}
{{- $_ := set $kube "core" .Values.corePolicy.default -}}
{{- $_ := set $kube "pod_annotation" .Values.corePolicy.podAnnotation -}}
{{- if .Values.corePolicy.podLabels -}}{{- $_ := set $kube "pod_labels" .Values.corePolicy.podLabels -}}{{- end -}}
{{- $_ := set $kube "api" .Values.podLookup -}}
{{- $lists := dict "full" (list) "metadata" (list) "none" (list) -}}
{{- range $ns, $keep := .Values.corePolicy.namespaces -}}
{{- $_ := set $lists $keep (append (get $lists $keep) $ns) -}}
{{- end -}}
{{- range $keep, $names := $lists -}}
{{- if $names -}}{{- $_ := set $kube (printf "%s_namespaces" $keep) $names -}}{{- end -}}
{{- end -}}
{{- $_ := set $config "kubernetes" $kube -}}
# corehandler.toml of the node agent, made by the Helm chart from its values (docs/kubernetes.md)
{{- range $key, $value := $config }}
{{- if not (kindIs "map" $value) }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- range $section, $table := $config }}
{{- if kindIs "map" $table }}

[{{ $section }}]
{{- range $key, $value := $table }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- end }}
{{ end -}}
