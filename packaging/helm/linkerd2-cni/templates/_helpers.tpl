{{/*
Named templates of the linkerd2-cni chart. Each one renders exactly what Linkerd's chart
renders for the same values (docs/helm.md lists where the chart as a whole differs).
*/}}

{{/*
"80,8080" -> "80","8080": a comma-separated port list as JSON strings, items kept verbatim
(as Linkerd's chart does; the plugin parses and validates them).
*/}}
{{- define "cnibox.quotedPorts" -}}
{{- range $i, $port := splitList "," (toString .) -}}
{{- if $i }},{{ end }}"{{ $port }}"
{{- end -}}
{{- end -}}

{{/*
The image every container runs: the installer image, tag defaulting to appVersion. A values
file copied from Linkerd's chart pins Linkerd's image (`cr.l5d.io/linkerd/cni-plugin`, any
registry) and its tag (`v1.7.0-alpha.1`): that image has none of cnibox's commands (the
preStop and the repair controller would fail silently), and cnibox's image has no such tag.
Both are translated to cnibox's image and version, so the file works unchanged; NOTES.txt
says so (`cnibox.linkerdImage`).
*/}}
{{- define "cnibox.linkerdImage" -}}
{{- if or (regexMatch "(^|/)linkerd/cni-plugin$" (toString .Values.image.name)) (regexMatch `^v1\.[0-9]+\.[0-9]+` (toString (.Values.image.version | default ""))) -}}
{{ .Values.image.name }}:{{ .Values.image.version }}
{{- end -}}
{{- end -}}

{{- define "cnibox.image" -}}
{{- if include "cnibox.linkerdImage" . -}}
ghcr.io/cnibox/cnibox-installer:{{ .Chart.AppVersion }}
{{- else -}}
{{ .Values.image.name }}:{{ .Values.image.version | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
"true" when the chart runs the node agent as its DaemonSet `linkerd-cni-agent`: the agent is
on (`agent.enabled`, the default) and the node does not run it already. With the Talos
extension (`talos.extension`) the extension's service `ext-cnibox-agent` is the node's agent
(packaging/talos/cnibox-agent.yaml): a DaemonSet beside it would take over its socket and
fail on its admin port, so none is rendered. Everything else of the agent (the install-time
unpack, the gate's socket mount) stays with `agent.enabled`: it serves either agent.
*/}}
{{- define "cnibox.agentDaemonSet" -}}
{{- if and .Values.agent.enabled (not (include "cnibox.true" .Values.talos.extension)) -}}
true
{{- end -}}
{{- end -}}

{{/* The `linkerd.io/created-by` annotation (Linkerd's `cliVersion` value still wins). */}}
{{- define "cnibox.createdBy" -}}
linkerd.io/created-by: {{ .Values.cliVersion | default (printf "cnibox/helm %s" (.Values.image.version | default .Chart.AppVersion)) }}
{{- end -}}

{{/* commonLabels, appended to an object's labels (4 spaces deep). */}}
{{- define "cnibox.commonLabels" -}}
{{- with .Values.commonLabels }}{{ toYaml . | trim | nindent 4 }}{{ end -}}
{{- end -}}

{{/*
A container's `resources` from the chart's {cpu,memory,ephemeral-storage}.{limit,request}
shape; nothing at all when every entry is empty.
*/}}
{{- define "cnibox.resources" -}}
{{- $given := . | default dict -}}{{/* `resources: null` renders nothing, as Linkerd's chart */}}
{{- $kinds := list "cpu" "memory" "ephemeral-storage" -}}
{{- $limits := dict -}}
{{- $requests := dict -}}
{{- range $kind := $kinds -}}
{{- with (index $given $kind | default dict) -}}
{{- with .limit }}{{ $_ := set $limits $kind (toString .) }}{{ end -}}
{{- with .request }}{{ $_ := set $requests $kind (toString .) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if or $limits $requests -}}
resources:
  {{- if $limits }}
  limits:
    {{- range $kind := $kinds }}{{ with index $limits $kind }}
    {{ $kind }}: {{ . | quote }}
    {{- end }}{{ end }}
  {{- end }}
  {{- if $requests }}
  requests:
    {{- range $kind := $kinds }}{{ with index $requests $kind }}
    {{ $kind }}: {{ . | quote }}
    {{- end }}{{ end }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* The admin listen address: all IPv4 addresses, or all addresses when IPv6 is on. */}}
{{- define "cnibox.adminAddr" -}}
{{ if include "cnibox.true" .root.Values.disableIPv6 }}0.0.0.0{{ else }}[::]{{ end }}:{{ .port }}
{{- end -}}

{{/*
"true" for a boolean value given as true or "true" (Linkerd's chart accepts the quoted form:
a values file with `privileged: "true"` renders there), "" otherwise. Unlike Go templates'
`if`, the string "false" is false here (Linkerd's chart would take it as true: docs/helm.md).
*/}}
{{- define "cnibox.true" -}}
{{- if eq (toString .) "true" }}true{{ end -}}
{{- end -}}
